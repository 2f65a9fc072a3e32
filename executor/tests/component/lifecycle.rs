//! Action lifecycle: cancel, bad requests, duplicate ids, the concurrency bound, a vanished reader, shutdown.

use std::collections::HashMap;

use mentis_proto::executor::{self as api, EndReason};
use mentis_proto::executor::{CancelRequest, RunRequest};
use tonic::Code;

use super::support::*;

const GATE: &str = "while [ ! -e stop ]; do sleep 0.05; done";

fn cancel(action_id: &str) -> CancelRequest {
    CancelRequest {
        action_id: action_id.to_owned(),
    }
}

#[tokio::test]
async fn cancel_kills_the_group_and_ends_with_cancelled() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let id = action_id();
    let mut stream = start(
        &mut client,
        request(&id, shell("sleep 1000 & echo $! > bg.pid; sleep 1000")),
    )
    .await;
    let pgid = expect_start(&mut stream).await.pid;
    eventually("the background job started", || {
        executor.path("bg.pid").exists()
    })
    .await;
    client.cancel(cancel(&id)).await.unwrap();

    let end = collect(stream).await.end();
    assert_eq!(reason(&end), EndReason::Cancelled);
    assert_eq!((end.exit_code, end.signal), (-1, 9));
    let background = read_pid(&executor.path("bg.pid"));
    eventually("the background sleep is gone", || !is_alive(background)).await;
    eventually("the process group is empty", || {
        live_in_group(pgid).is_empty()
    })
    .await;

    let status = client.cancel(cancel(&id)).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "not running any more");
    let status = client.cancel(cancel("never-ran")).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let status = client.cancel(cancel("")).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn malformed_requests_are_invalid_argument() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let cases = [
        request("", shell("true")),
        request(&action_id(), shell("")),
        RunRequest {
            action_id: action_id(),
            action: None,
            env: HashMap::new(),
        },
        RunRequest {
            action_id: action_id(),
            action: Some(api::Action { kind: None }),
            env: HashMap::new(),
        },
    ];
    for case in cases {
        let status = client.run(case.clone()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{case:?}");
    }
}

#[tokio::test]
async fn a_running_action_id_cannot_be_reused() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let id = action_id();
    let mut stream = start(&mut client, request(&id, shell(GATE))).await;
    expect_start(&mut stream).await;
    let status = client.run(request(&id, shell("true"))).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists);

    std::fs::write(executor.path("stop"), b"").unwrap();
    assert_eq!(collect(stream).await.end().exit_code, 0);
    // Ended: the id is free again.
    let events = collect(start(&mut client, request(&id, shell("echo again"))).await).await;
    assert_eq!(events.stdout(), b"again\n");
}

#[tokio::test]
async fn the_concurrency_bound_is_resource_exhausted() {
    let executor = TestExecutor::start_with(|config| config.max_actions = 1).await;
    let mut client = executor.client().await;
    let first = action_id();
    let mut stream = start(&mut client, request(&first, shell(GATE))).await;
    expect_start(&mut stream).await;
    let status = client
        .run(request(&action_id(), shell("true")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);

    client.cancel(cancel(&first)).await.unwrap();
    assert_eq!(reason(&collect(stream).await.end()), EndReason::Cancelled);
    let events = run(&mut client, shell("echo next")).await;
    assert_eq!(events.stdout(), b"next\n");
}

#[tokio::test]
async fn a_vanished_reader_neither_blocks_the_command_nor_leaks_its_id() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let id = action_id();
    // 16 MiB: far more than the event channel and the pipe hold, so the command only finishes if its
    // output keeps being drained after the reader is gone.
    let mut stream = start(
        &mut client,
        request(&id, shell("head -c 16777216 /dev/zero; touch finished")),
    )
    .await;
    expect_start(&mut stream).await;
    drop(stream);

    eventually("the command finished", || {
        executor.path("finished").exists()
    })
    .await;
    // The registry entry goes away once the action ends: the id becomes usable again.
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match client.run(request(&id, shell("echo reused"))).await {
            Ok(response) => {
                let events = collect(response.into_inner()).await;
                assert_eq!(events.stdout(), b"reused\n");
                break;
            }
            Err(status) if status.code() == Code::AlreadyExists => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "the id was never freed"
                );
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
            Err(status) => panic!("unexpected {status:?}"),
        }
    }
}

#[tokio::test]
async fn shutdown_kills_running_commands_and_ends_their_streams() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let mut stream = start(&mut client, request(&action_id(), shell("sleep 1000"))).await;
    let pgid = expect_start(&mut stream).await.pid;
    let collector = tokio::spawn(collect(stream));

    executor.stop().await.expect("serve returns Ok");
    let end = collector.await.unwrap().end();
    assert_eq!(reason(&end), EndReason::Cancelled);
    assert!(end.message.contains("shutting down"), "{}", end.message);
    eventually("the process group is empty", || {
        live_in_group(pgid).is_empty()
    })
    .await;
}
