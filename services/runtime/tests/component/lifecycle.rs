//! The sandbox lifecycle through the API: create, run, pause, resume, delete, and the moves each state refuses.

use mentis_proto::api::SandboxState;

use crate::support::*;

#[tokio::test]
async fn create_run_pause_resume_delete() {
    let mut rt = TestRuntime::start().await;
    let sb = rt.create_default().await;
    assert_eq!(sb.state, SandboxState::Running as i32);
    let id = sb.sandbox_id.clone();

    let obs = rt.sh(&id, "echo hello; exit 3").await.unwrap();
    assert_eq!(stdout(&obs), "hello\n");
    assert_eq!(cmd_end(&obs).exit_code, 3);

    let paused = rt.pause(&id).await.unwrap();
    assert_eq!(paused.state, SandboxState::Paused as i32);
    assert!(rt.backend.is_frozen(sid(&sb)));
    let resumed = rt.resume(&id).await.unwrap();
    assert_eq!(resumed.state, SandboxState::Running as i32);
    assert!(!rt.backend.is_frozen(sid(&sb)));
    assert_eq!(stdout(&rt.sh(&id, "echo again").await.unwrap()), "again\n");

    rt.delete(&id).await.unwrap();
    assert_eq!(rt.state(&id).await, SandboxState::Terminated);
    assert_eq!(rt.backend.state(sid(&sb)), None);
    let log = rt.log(&id, 0).await;
    assert_eq!(
        states_in(&log),
        [
            "RUNNING",
            "PAUSING",
            "PAUSED",
            "RESUMING",
            "RUNNING",
            "TERMINATING",
            "TERMINATED"
        ],
        "{log:?}"
    );
}
