//! What time drives, on tokio's paused clock: idle expiry (pause, delete), the maximum lifetime, the health
//! watch (a frozen executor, a killed container, a vanished one), the deadline grace of a silent action,
//! and the retention of ended sandboxes.

use std::time::Duration;

use mentis_proto::api::{self, SandboxState};

use crate::support::*;

fn spec(idle_secs: u32, policy: api::IdlePolicy, lifetime_secs: u32) -> api::SandboxSpec {
    api::SandboxSpec {
        idle_timeout_seconds: idle_secs,
        idle_policy: policy as i32,
        max_lifetime_seconds: lifetime_secs,
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn idle_sandboxes_are_paused_or_deleted_and_lifetimes_end() {
    let mut rt = TestRuntime::start().await;
    let pausing = rt
        .create(spec(60, api::IdlePolicy::Pause, 0))
        .await
        .unwrap()
        .sandbox_id;
    let deleting = rt
        .create(spec(60, api::IdlePolicy::Delete, 0))
        .await
        .unwrap()
        .sandbox_id;
    let short_lived = rt
        .create(spec(0, api::IdlePolicy::Pause, 100))
        .await
        .unwrap()
        .sandbox_id;
    let busy = rt
        .create(spec(60, api::IdlePolicy::Delete, 0))
        .await
        .unwrap()
        .sandbox_id;
    // Activity keeps a sandbox from its idle policy: `busy` runs something every 30 s.
    for _ in 0..3 {
        rt.sh(&busy, "true").await.unwrap();
        tokio::time::sleep(Duration::from_secs(30)).await;
    }
    // 90 s in: idle for 90 s > 60 s (the reaper looks every 10 s).
    assert_eq!(rt.state(&pausing).await, SandboxState::Paused);
    assert_eq!(rt.state(&deleting).await, SandboxState::Terminated);
    assert_eq!(rt.state(&busy).await, SandboxState::Running);
    assert_eq!(rt.state(&short_lived).await, SandboxState::Running);
    let reason = rt.get(&deleting).await.unwrap().state_reason;
    assert!(reason.contains("idle"), "{reason}");
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(rt.state(&short_lived).await, SandboxState::Terminated);
    let reason = rt.get(&short_lived).await.unwrap().state_reason;
    assert!(reason.contains("maximum lifetime"), "{reason}");
    // The idle sandbox that was paused is not deleted by its idle timeout.
    assert_eq!(rt.state(&pausing).await, SandboxState::Paused);
}

#[tokio::test(start_paused = true)]
async fn a_frozen_executor_makes_the_sandbox_unhealthy_until_it_answers_again() {
    let mut rt = TestRuntime::start_with(|c| c.ready_timeout = Duration::from_secs(30)).await;
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    rt.backend.freeze(sid(&sb));
    // The executor's health watch holds while its connection does: the connection's keepalive gives up
    // on the frozen executor within two periods (10 s each), then two checks fail (a new watch each, given
    // up after 2 s, the second 5 s after the first).
    tokio::time::sleep(Duration::from_secs(35)).await;
    assert_eq!(rt.state(&id).await, SandboxState::Unhealthy);
    let refused = rt.sh(&id, "true").await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    rt.backend.thaw(sid(&sb));
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert_eq!(rt.state(&id).await, SandboxState::Running);
    assert_eq!(stdout(&rt.sh(&id, "echo back").await.unwrap()), "back\n");
    let log = rt.log(&id, 0).await;
    assert_eq!(
        states_in(&log),
        ["RUNNING", "UNHEALTHY", "RUNNING"],
        "{log:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_killed_container_is_started_again_with_its_workspace() {
    let mut rt = TestRuntime::start().await;
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    rt.sh(&id, "echo kept > /dev/null; echo kept > kept.txt")
        .await
        .unwrap();
    rt.backend.kill(sid(&sb));
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(rt.state(&id).await, SandboxState::Running);
    assert!(rt.backend.calls("ensure_running", sid(&sb)) >= 1);
    assert_eq!(stdout(&rt.sh(&id, "cat kept.txt").await.unwrap()), "kept\n");
}

#[tokio::test(start_paused = true)]
async fn a_vanished_container_ends_the_sandbox_and_its_actions() {
    let mut rt = TestRuntime::start().await;
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    let mut running = rt.start_action(&id, shell("echo started; sleep 600"));
    running.started().await;
    rt.backend.lose(sid(&sb));
    tokio::time::sleep(Duration::from_secs(60)).await;
    let obs = running.end().await;
    assert_eq!(obs.iter().filter(|o| is_terminal(o)).count(), 1, "{obs:?}");
    assert_eq!(cmd_end(&obs).reason, api::EndReason::Lost as i32);
    assert_eq!(rt.state(&id).await, SandboxState::Terminated);
    let log = rt.log(&id, 0).await;
    assert_eq!(
        states_in(&log),
        ["RUNNING", "UNHEALTHY", "TERMINATING", "TERMINATED"],
        "{log:?}"
    );
}

/// A shell action whose executor goes silent (frozen, with keepalives too slow to notice) ends LOST once
/// its timeout and the grace after it have passed.
#[tokio::test(start_paused = true)]
async fn a_silent_action_ends_lost_after_its_deadline_grace() {
    let mut rt = TestRuntime::start_with(|c| {
        c.executor_keepalive = Duration::from_secs(3600);
        c.health_interval = Duration::from_secs(3600);
    })
    .await;
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    let mut running = rt.start_action(
        &id,
        api::Action {
            kind: Some(api::action::Kind::Shell(api::ShellAction {
                command: "echo started; sleep 600".into(),
                timeout_seconds: 10,
                ..Default::default()
            })),
        },
    );
    running.started().await;
    let started = tokio::time::Instant::now();
    rt.backend.freeze(sid(&sb));
    let obs = running.end().await;
    let waited = started.elapsed();
    assert_eq!(obs.iter().filter(|o| is_terminal(o)).count(), 1, "{obs:?}");
    let end = cmd_end(&obs);
    assert_eq!(end.reason, api::EndReason::Lost as i32, "{end:?}");
    // The 10 s timeout plus the 30 s grace, and not much more.
    assert!(
        waited >= Duration::from_secs(39) && waited <= Duration::from_secs(45),
        "{waited:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn ended_sandboxes_are_kept_for_their_retention_then_forgotten() {
    let mut rt = TestRuntime::start_with(|c| c.ended_retention = Duration::from_secs(600)).await;
    let id = rt.create_default().await.sandbox_id;
    rt.delete(&id).await.unwrap();
    tokio::time::sleep(Duration::from_secs(300)).await;
    assert_eq!(rt.state(&id).await, SandboxState::Terminated);
    tokio::time::sleep(Duration::from_secs(400)).await;
    assert_eq!(rt.get(&id).await.unwrap_err().code(), tonic::Code::NotFound);
}

/// A container whose executor never answers fails the create after the ready timeout, and is removed.
#[tokio::test(start_paused = true)]
async fn an_executor_that_never_answers_fails_the_create_after_the_ready_timeout() {
    let mut rt = TestRuntime::start_with(|c| c.ready_timeout = Duration::from_secs(60)).await;
    rt.backend.set_faults(Faults {
        create_never_ready: true,
        ..Faults::default()
    });
    let started = tokio::time::Instant::now();
    let mut sandboxes = rt.sandboxes.clone();
    let refused = sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(Default::default()),
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(59) && waited <= Duration::from_secs(65),
        "{waited:?}"
    );
    assert!(rt.backend.ids().is_empty(), "the container is removed");
    let listed = rt.list().await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].state, SandboxState::Failed as i32);
}

/// An executor that runs but never answers again (stopped with SIGSTOP, say) gets its container restarted
/// after the ready timeout: the sandbox is RUNNING again with its workspace, not UNHEALTHY for good.
#[tokio::test(start_paused = true)]
async fn an_executor_that_stays_silent_gets_its_container_restarted() {
    let mut rt = TestRuntime::start_with(|c| c.ready_timeout = Duration::from_secs(20)).await;
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    rt.sh(&id, "echo kept > kept.txt").await.unwrap();
    rt.backend.freeze(sid(&sb));
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(rt.state(&id).await, SandboxState::Unhealthy);
    // Never thawed: after the ready timeout the container is restarted.
    tokio::time::sleep(Duration::from_secs(40)).await;
    assert_eq!(rt.state(&id).await, SandboxState::Running);
    assert_eq!(rt.backend.calls("restart", sid(&sb)), 1);
    assert_eq!(stdout(&rt.sh(&id, "cat kept.txt").await.unwrap()), "kept\n");
    let log = rt.log(&id, 0).await;
    assert!(
        log.iter().any(
            |o| matches!(&o.kind, Some(Kind::AgentState(a)) if a.message.contains("restarting"))
        ),
        "{log:?}"
    );
}
