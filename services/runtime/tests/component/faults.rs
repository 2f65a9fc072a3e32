//! Faults under actions: every accepted action ends with exactly one terminal observation, and the sandbox
//! serves again afterwards.

use std::time::Duration;

use mentis_proto::api::{self, SandboxState};

use crate::support::*;

#[tokio::test(start_paused = true)]
async fn an_executor_killed_under_an_action_ends_it_lost_and_the_sandbox_comes_back() {
    let mut rt = TestRuntime::start().await;
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    let mut running = rt.start_action(&id, shell("echo started; sleep 600"));
    running.started().await;
    rt.backend.kill(sid(&sb));
    let obs = tokio::time::timeout(Duration::from_secs(120), running.end())
        .await
        .unwrap();
    assert_eq!(obs.iter().filter(|o| is_terminal(o)).count(), 1, "{obs:?}");
    assert_eq!(cmd_end(&obs).reason, api::EndReason::Lost as i32, "{obs:?}");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(rt.state(&id).await, SandboxState::Running);
    assert_eq!(stdout(&rt.sh(&id, "echo again").await.unwrap()), "again\n");
}

/// A frozen executor fails its stream within two keepalive periods; the action is not given up then (a
/// thawed executor would hand over the rest), but once the health watch replaces the silent executor, whose
/// successor does not hold it, it ends LOST: long before its own timeout (300 s).
#[tokio::test(start_paused = true)]
async fn an_executor_frozen_under_an_action_ends_it_lost_when_it_is_replaced() {
    let mut rt = TestRuntime::start_with(|c| c.executor_keepalive = Duration::from_secs(10)).await;
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    let mut running = rt.start_action(&id, shell("echo started; sleep 600"));
    running.started().await;
    rt.backend.freeze(sid(&sb));
    let started = tokio::time::Instant::now();
    let obs = tokio::time::timeout(Duration::from_secs(240), running.end())
        .await
        .unwrap();
    let end = cmd_end(&obs);
    assert_eq!(end.reason, api::EndReason::Lost as i32, "{obs:?}");
    assert!(end.message.contains("restarted"), "{end:?}");
    assert!(rt.backend.calls("restart", sid(&sb)) >= 1);
    assert!(
        started.elapsed() <= Duration::from_secs(120),
        "{:?}",
        started.elapsed()
    );
    rt.backend.thaw(sid(&sb));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(
        stdout(&rt.sh(&id, "echo thawed").await.unwrap()),
        "thawed\n"
    );
}

/// A sandbox thawed whose executor does not answer becomes UNHEALTHY (not PAUSED with a running container),
/// and the health watch brings it back.
#[tokio::test(start_paused = true)]
async fn a_resume_whose_executor_stays_silent_leaves_it_unhealthy_until_it_answers() {
    let mut rt = TestRuntime::start_with(|c| c.ready_timeout = Duration::from_secs(20)).await;
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    rt.pause(&id).await.unwrap();
    // Frozen behind the runtime's back too: the thaw will not reach it.
    let backend = rt.backend.clone();
    let id2 = sid(&sb);
    let resumed = {
        let mut sandboxes = rt.sandboxes.clone();
        let id = id.clone();
        tokio::spawn(async move {
            sandboxes
                .resume_sandbox(api::ResumeSandboxRequest { sandbox_id: id })
                .await
        })
    };
    // Once thawed by the resume, freeze it again (the executor hangs).
    while backend.is_frozen(id2) {
        tokio::task::yield_now().await;
    }
    backend.freeze(id2);
    let refused = resumed.await.unwrap().unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert_eq!(rt.state(&id).await, SandboxState::Unhealthy);
    backend.thaw(id2);
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(rt.state(&id).await, SandboxState::Running);
    let log = rt.log(&id, 0).await;
    assert_eq!(
        states_in(&log),
        [
            "RUNNING",
            "PAUSING",
            "PAUSED",
            "RESUMING",
            "UNHEALTHY",
            "RUNNING"
        ],
        "{log:?}"
    );
}
