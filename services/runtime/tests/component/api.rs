//! What the API promises around the lifecycle: get-or-create by key, spaces deleted with their sandboxes,
//! bounded actions, idempotent retries after the end, and slow readers cut off instead of piling up.

use std::time::Duration;

use mentis_proto::api;

use crate::support::*;

#[tokio::test]
async fn the_same_key_in_a_space_gets_the_same_live_sandbox() {
    let mut rt = TestRuntime::start().await;
    let keyed = || api::SandboxSpec {
        external_key: "chat-1".into(),
        ..Default::default()
    };
    let first = rt.create(keyed()).await.unwrap();
    let again = rt.create(keyed()).await.unwrap();
    assert_eq!(first.sandbox_id, again.sandbox_id);
    assert_eq!(rt.backend.ids().len(), 1);
    rt.delete(&first.sandbox_id).await.unwrap();
    // An ended sandbox no longer answers to the key.
    let fresh = rt.create(keyed()).await.unwrap();
    assert_ne!(fresh.sandbox_id, first.sandbox_id);
}

#[tokio::test]
async fn a_space_deleted_with_force_ends_its_sandboxes() {
    let mut rt = TestRuntime::start().await;
    let _busy = Busy::hold();
    rt.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "team".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    drop(_busy);
    let sb = rt
        .create(api::SandboxSpec {
            space_id: "team".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    let _busy = Busy::hold();
    let refused = rt
        .spaces
        .delete_space(api::DeleteSpaceRequest {
            space_id: "team".into(),
            force: false,
        })
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    rt.spaces
        .delete_space(api::DeleteSpaceRequest {
            space_id: "team".into(),
            force: true,
        })
        .await
        .unwrap();
    drop(_busy);
    // Its sandboxes went with it, records included: nothing of a deleted space stays readable.
    assert_eq!(
        rt.get(&sb.sandbox_id).await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    assert_eq!(rt.backend.state(sid(&sb)), None);
}

#[tokio::test]
async fn actions_beyond_the_limit_are_refused_and_a_retry_after_the_end_replays() {
    let mut rt = TestRuntime::start_with(|c| c.max_actions_per_sandbox = 1).await;
    let id = rt.create_default().await.sandbox_id;
    let mut long = rt.start_action(&id, shell("echo started; sleep 1"));
    long.started().await;
    let refused = rt.sh(&id, "true").await.unwrap_err();
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    long.end().await;

    let action_id = uuid::Uuid::new_v4().to_string();
    let first = rt
        .exec(&id, shell("echo once >> count; cat count"), &action_id)
        .await
        .unwrap();
    let retry = rt
        .exec(&id, shell("echo once >> count; cat count"), &action_id)
        .await
        .unwrap();
    assert_eq!(first, retry, "a retry replays, it does not run again");
    let other = rt.exec(&id, shell("true"), &action_id).await.unwrap_err();
    assert_eq!(other.code(), tonic::Code::AlreadyExists, "{other:?}");
    // The retry is answered from the log even after the sandbox has ended.
    rt.delete(&id).await.unwrap();
    let after_end = rt
        .exec(&id, shell("echo once >> count; cat count"), &action_id)
        .await
        .unwrap();
    assert_eq!(after_end, first);
}

/// A reader that stops reading while output floods is cut off with RESOURCE_EXHAUSTED after the stall
/// time; the action and the sandbox are not held up by it.
#[tokio::test(start_paused = true)]
async fn a_reader_that_stops_reading_is_cut_off_after_the_stall_time() {
    let mut rt = TestRuntime::start_with(|c| {
        c.stream.stall = Duration::from_secs(20);
        c.stream.buffer = 4;
    })
    .await;
    let id = rt.create_default().await.sandbox_id;
    let mut stalled = {
        let _busy = Busy::hold();
        rt.actions
            .stream_observations(api::StreamObservationsRequest {
                sandbox_id: id.clone(),
                after_seq: 0,
                action_id: String::new(),
            })
            .await
            .unwrap()
            .into_inner()
    };
    // 64 MiB of output, far more than the stream's buffers hold.
    let obs = rt
        .sh(&id, "head -c 67108864 /dev/zero | tr '\\0' x; echo")
        .await
        .unwrap();
    assert_eq!(cmd_end(&obs).exit_code, 0);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let _busy = Busy::hold();
    let status = end_status(&mut stalled)
        .await
        .expect("the stalled reader was cut off");
    assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
    assert_eq!(stdout(&rt.sh(&id, "echo fine").await.unwrap()), "fine\n");
}
