//! Races between lifecycle calls and actions, repeated many times on a real clock with real concurrency.

use std::time::Duration;

use futures::StreamExt;
use mentis_proto::api::{self, SandboxState};

use crate::support::*;

/// Rounds of the pause/submit race.
const ROUNDS: u64 = 120;

/// What one racing Execute saw.
#[derive(Debug)]
struct Raced {
    accepted: bool,
    refused: Option<tonic::Status>,
    observations: Vec<api::Observation>,
}

/// Pause and a submission race: the submission lands at a different moment of the pause in each round. An
/// accepted action must never run in a frozen sandbox (so PAUSED must not be reached while it runs), and
/// every accepted action ends with exactly one terminal observation, its own (EXITED), not LOST.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_racing_submit_never_freezes_a_running_action() {
    // A frozen executor's connection is declared dead after about two keepalive periods: keep a bad
    // round short.
    let mut rt = TestRuntime::start_with(|c| c.executor_keepalive = Duration::from_secs(1)).await;
    // A real engine takes some milliseconds to freeze a container: the window a submission can fall in.
    rt.backend.set_faults(Faults {
        pause_delay: Duration::from_millis(15),
        ..Faults::default()
    });
    let sb = rt.create_default().await;
    let id = sb.sandbox_id.clone();
    let mut frozen_while_running = 0;
    // Accepted actions that did not end with their own EXITED, and refusals other than
    // FailedPrecondition (a submission that hung on the frozen executor until its connection died).
    let mut bad_ends = Vec::new();
    let mut bad_refusals = Vec::new();
    let (mut paused, mut refused, mut ran) = (0, 0, 0);
    for round in 0..ROUNDS {
        // From the submission 10 ms ahead of the pause to 25 ms after it (the pause takes 15 ms).
        let offset_us = (round * 7919) % 35_000;
        let (pause_after, submit_after) = if offset_us < 10_000 {
            (Duration::from_micros(10_000 - offset_us), Duration::ZERO)
        } else {
            (Duration::ZERO, Duration::from_micros(offset_us - 10_000))
        };
        let mut sandboxes = rt.sandboxes.clone();
        let pause_id = id.clone();
        let pause = tokio::spawn(async move {
            tokio::time::sleep(pause_after).await;
            sandboxes
                .pause_sandbox(api::PauseSandboxRequest {
                    sandbox_id: pause_id,
                })
                .await
        });
        let (accepted_tx, accepted_rx) = tokio::sync::oneshot::channel();
        let mut actions = rt.actions.clone();
        let exec_id = id.clone();
        let exec = tokio::spawn(async move {
            tokio::time::sleep(submit_after).await;
            let r = actions
                .execute(api::ExecuteRequest {
                    sandbox_id: exec_id,
                    action: Some(shell("sleep 0.03; echo ok")),
                    action_id: String::new(),
                })
                .await;
            let mut stream = match r {
                Ok(s) => s.into_inner(),
                Err(s) => {
                    let _ = accepted_tx.send(false);
                    return Raced {
                        accepted: false,
                        refused: Some(s),
                        observations: Vec::new(),
                    };
                }
            };
            let _ = accepted_tx.send(true);
            let mut observations = Vec::new();
            while let Some(Ok(r)) = stream.next().await {
                if let Some(api::execute_response::Kind::Observation(o)) = r.kind {
                    observations.push(o);
                }
            }
            Raced {
                accepted: true,
                refused: None,
                observations,
            }
        });
        let pause = tokio::time::timeout(PATIENCE, pause)
            .await
            .unwrap()
            .unwrap();
        let accepted = tokio::time::timeout(PATIENCE, accepted_rx)
            .await
            .unwrap()
            .unwrap();
        if let Err(status) = &pause {
            assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
        } else {
            paused += 1;
            // PAUSED now. An accepted action must have ended already (it cannot run in a frozen sandbox).
            if accepted && !exec.is_finished() {
                tokio::time::sleep(Duration::from_millis(200)).await;
                if !exec.is_finished() {
                    frozen_while_running += 1;
                }
            }
            rt.resume(&id).await.unwrap();
        }
        let raced = tokio::time::timeout(PATIENCE, exec).await.unwrap().unwrap();
        if raced.accepted {
            ran += 1;
            let ends = raced.observations.iter().filter(|o| is_terminal(o)).count();
            let end = raced.observations.last().and_then(|o| match &o.kind {
                Some(Kind::CmdEnd(e)) => Some((e.reason, e.exit_code)),
                _ => None,
            });
            if ends != 1
                || end != Some((api::EndReason::Exited as i32, 0))
                || stdout(&raced.observations) != "ok\n"
            {
                bad_ends.push(format!("round {round}: {raced:?}"));
            }
        } else {
            refused += 1;
            let status = raced.refused.unwrap();
            if status.code() != tonic::Code::FailedPrecondition {
                bad_refusals.push(format!("round {round}: {status:?}"));
            }
        }
        // Whatever happened, the sandbox serves again (a broken connection is mended by the health watch).
        rt.wait_state(&id, SandboxState::Running, PATIENCE).await;
    }
    eprintln!(
        "pause/submit race, {ROUNDS} rounds: pause won {paused}, submission refused {refused}, \
         actions run {ran}, frozen while running {frozen_while_running}, bad ends {}, bad refusals {}",
        bad_ends.len(),
        bad_refusals.len()
    );
    assert_eq!(
        (frozen_while_running, bad_ends.len(), bad_refusals.len()),
        (0, 0, 0),
        "froze the sandbox while an accepted action ran in {frozen_while_running} of {ROUNDS} rounds; \
         accepted actions without their own end: {bad_ends:#?}; other refusals: {bad_refusals:#?}"
    );
}
