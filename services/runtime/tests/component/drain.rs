//! The drain on SIGTERM (the runtime's shutdown token): health NOT_SERVING first, open streams end with
//! UNAVAILABLE telling the client to resume, new calls are refused, the runtime stops in seconds even with a
//! Health/Watch open, and sandboxes with their running actions are left running for the next runtime.

use std::time::Duration;

use futures::StreamExt;
use mentis_proto::api::{self, SandboxState};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::*;

#[tokio::test]
async fn a_drain_says_not_serving_ends_streams_with_unavailable_and_leaves_sandboxes_running() {
    let mut rt = TestRuntime::start().await;
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    let mut watch = watch_server_health(&rt).await;
    let mut running = rt.start_action(&id, shell("echo started; sleep 5; echo done"));
    running.started().await;
    let mut follower = rt
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: id.clone(),
            after_seq: 0,
            action_id: String::new(),
        })
        .await
        .unwrap()
        .into_inner();

    let runtime = rt.runtime.take().unwrap();
    let stopping = tokio::time::Instant::now();
    runtime.shutdown_token().cancel();
    // Health says so first.
    let next = tokio::time::timeout(PATIENCE, watch.next()).await.unwrap();
    assert_eq!(
        next.unwrap().unwrap().status,
        ServingStatus::NotServing as i32
    );
    // Open streams end with UNAVAILABLE and how to resume, not with OK.
    let status = end_status(&mut follower)
        .await
        .expect("the follower's stream ends with a status, not OK");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(status.message().contains("resume"), "{status:?}");
    let obs = tokio::time::timeout(PATIENCE, running.end()).await.unwrap();
    assert!(
        !obs.iter().any(is_terminal),
        "the action did not end, its stream did: {obs:?}"
    );
    // The runtime stops in seconds though a Health/Watch stays open.
    tokio::time::timeout(Duration::from_secs(15), runtime.stop())
        .await
        .expect("the drain ends within its grace")
        .unwrap();
    assert!(stopping.elapsed() < Duration::from_secs(15));
    // New calls are refused.
    assert!(rt.get(&id).await.is_err());
    // The sandbox and its action were left running: the next runtime takes it over and the action ends
    // there.
    assert!(rt.backend.state(sid(&sb)).is_some());
    let mut rt =
        TestRuntime::start_on(rt.backend.clone(), rt.config.clone(), rt.data_dir.clone()).await;
    assert_eq!(rt.state(&id).await, SandboxState::Running);
    assert_eq!(stdout(&rt.sh(&id, "echo after").await.unwrap()), "after\n");
}

/// A port nothing listens on now (bound and let go), for a listener the test names.
fn free_port() -> std::net::SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// `stop` returns once the listeners beside the API (plaintext health, HTTP) are closed too: they are tasks
/// of the runtime, not left running behind it, so a runtime started again can take the same ports.
#[tokio::test]
async fn stopping_closes_the_listeners_beside_the_api_before_it_returns() {
    let (health, http) = (free_port(), free_port());
    let mut rt = TestRuntime::start_with(|c| {
        c.health_listen = Some(health);
        c.http_listen = Some(http);
    })
    .await;
    for at in [health, http] {
        tokio::net::TcpStream::connect(at)
            .await
            .unwrap_or_else(|e| panic!("{at} serves: {e}"));
    }
    let runtime = rt.runtime.take().unwrap();
    tokio::time::timeout(Duration::from_secs(30), runtime.stop())
        .await
        .expect("the runtime stops")
        .unwrap();
    for at in [health, http] {
        assert!(
            tokio::net::TcpStream::connect(at).await.is_err(),
            "{at} still listens after stop"
        );
        std::net::TcpListener::bind(at).unwrap_or_else(|e| panic!("{at} is free again: {e}"));
    }
}
