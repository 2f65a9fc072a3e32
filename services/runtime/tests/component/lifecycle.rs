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

fn code<T>(r: Result<T, tonic::Status>) -> tonic::Code {
    match r {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

/// Pause and resume are idempotent where they already hold; every other call a state does not allow gets
/// FAILED_PRECONDITION naming the state.
#[tokio::test]
async fn calls_a_state_does_not_allow_are_refused_naming_the_state() {
    let mut rt = TestRuntime::start().await;
    let id = rt.create_default().await.sandbox_id;
    // RUNNING: resume is a no-op.
    assert_eq!(
        rt.resume(&id).await.unwrap().state,
        SandboxState::Running as i32
    );
    // A running action keeps the sandbox from pausing.
    let mut long = rt.start_action(&id, shell("echo started; sleep 1"));
    long.started().await;
    let refused = rt.pause(&id).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(refused.message().contains("running actions"), "{refused:?}");
    long.end().await;

    // PAUSED: pause is a no-op, actions are refused naming the state.
    rt.pause(&id).await.unwrap();
    assert_eq!(
        rt.pause(&id).await.unwrap().state,
        SandboxState::Paused as i32
    );
    let refused = rt.sh(&id, "true").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(refused.message().contains("PAUSED"), "{refused:?}");

    // TERMINATED: everything but Get and Delete is refused, naming the state; Delete stays idempotent.
    rt.delete(&id).await.unwrap();
    rt.delete(&id).await.unwrap();
    for refused in [
        rt.pause(&id).await.unwrap_err(),
        rt.resume(&id).await.unwrap_err(),
        rt.sh(&id, "true").await.unwrap_err(),
    ] {
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert!(refused.message().contains("TERMINATED"), "{refused:?}");
    }
}

/// A failed freeze leaves the sandbox RUNNING, a failed thaw PAUSED; both say why.
#[tokio::test]
async fn a_failed_pause_or_resume_leaves_the_sandbox_as_it_was() {
    let mut rt = TestRuntime::start().await;
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    rt.backend.set_faults(Faults {
        pause_fails: true,
        ..Faults::default()
    });
    assert_eq!(code(rt.pause(&id).await), tonic::Code::Unavailable);
    let now = rt.get(&id).await.unwrap();
    assert_eq!(now.state, SandboxState::Running as i32);
    assert!(now.state_reason.contains("pause failed"), "{now:?}");
    assert_eq!(stdout(&rt.sh(&id, "echo still").await.unwrap()), "still\n");

    rt.backend.set_faults(Faults {
        resume_fails: true,
        ..Faults::default()
    });
    rt.pause(&id).await.unwrap();
    assert_eq!(code(rt.resume(&id).await), tonic::Code::Unavailable);
    let now = rt.get(&id).await.unwrap();
    assert_eq!(now.state, SandboxState::Paused as i32);
    assert!(now.state_reason.contains("resume failed"), "{now:?}");
    rt.backend.set_faults(Faults::default());
    rt.resume(&id).await.unwrap();
    assert_eq!(stdout(&rt.sh(&id, "echo back").await.unwrap()), "back\n");
    let log = rt.log(&id, 0).await;
    assert_eq!(
        states_in(&log),
        [
            "RUNNING", "PAUSING", "RUNNING", "PAUSING", "PAUSED", "RESUMING", "PAUSED", "RESUMING",
            "RUNNING"
        ],
        "{log:?}"
    );
}

/// A create whose container fails ends FAILED with the reason, and frees its place.
#[tokio::test]
async fn a_create_that_fails_leaves_a_failed_sandbox_and_nothing_behind() {
    let mut rt = TestRuntime::start_with(|c| c.max_sandboxes = 1).await;
    rt.backend.set_faults(Faults {
        create_fails: true,
        ..Faults::default()
    });
    let refused = rt.create(Default::default()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(rt.backend.ids().is_empty());
    rt.backend.set_faults(Faults::default());
    // The failed one does not count against MENTIS_MAX_SANDBOXES.
    let sb = rt.create_default().await;
    assert_eq!(sb.state, SandboxState::Running as i32);
    let over = rt.create(Default::default()).await.unwrap_err();
    assert_eq!(over.code(), tonic::Code::ResourceExhausted, "{over:?}");
}

/// Deleting a sandbox while an action runs ends the action LOST (exactly one terminal) and removes it all.
#[tokio::test]
async fn delete_ends_a_running_action_lost() {
    let mut rt = TestRuntime::start().await;
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    let mut running = rt.start_action(&id, shell("echo started; sleep 60"));
    running.started().await;
    rt.delete(&id).await.unwrap();
    let obs = tokio::time::timeout(PATIENCE, running.end()).await.unwrap();
    assert_eq!(obs.iter().filter(|o| is_terminal(o)).count(), 1, "{obs:?}");
    assert_eq!(
        cmd_end(&obs).reason,
        mentis_proto::api::EndReason::Lost as i32
    );
    assert_eq!(rt.backend.state(sid(&sb)), None);
    assert_eq!(rt.state(&id).await, SandboxState::Terminated);
}

/// A delete whose container cannot be removed leaves the sandbox TERMINATING and says so; a retry finishes it.
#[tokio::test]
async fn a_delete_that_fails_can_be_retried() {
    let mut rt = TestRuntime::start().await;
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    rt.backend.set_faults(Faults {
        delete_fails: true,
        ..Faults::default()
    });
    assert_eq!(code(rt.delete(&id).await), tonic::Code::Unavailable);
    assert_eq!(rt.state(&id).await, SandboxState::Terminating);
    let refused = rt.sh(&id, "true").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert!(refused.message().contains("TERMINATING"), "{refused:?}");
    rt.backend.set_faults(Faults::default());
    rt.delete(&id).await.unwrap();
    assert_eq!(rt.state(&id).await, SandboxState::Terminated);
    assert_eq!(rt.backend.state(sid(&sb)), None);
}
