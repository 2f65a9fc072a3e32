//! Sandboxes that recover from their own code (issue 13, part 5): a backgrounded fork bomb, a killed
//! executor or tini, a full `/tmp` or workspace, a kernel whose sockets were closed. Each leaves the sandbox
//! answering, and the next action runs soon after.

use std::time::{Duration, Instant};

use futures::StreamExt;
use mentis_e2e::*;
use mentis_proto::api;

/// The sandbox's `agent_state` observations so far (messages and details), read from the start.
async fn agent_states(h: &mut Harness, sandbox: &str) -> anyhow::Result<Vec<api::AgentState>> {
    let last = h.get(sandbox).await?.last_seq;
    let mut s = h
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: sandbox.to_owned(),
            after_seq: 0,
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let mut states = Vec::new();
    while let Some(m) = tokio::time::timeout(Duration::from_secs(30), s.next()).await? {
        let Some(api::stream_observations_response::Kind::Observation(o)) = m?.kind else {
            continue;
        };
        if let Some(Kind::AgentState(a)) = o.kind {
            assert!(o.action_id.is_empty(), "agent_state belongs to no action");
            states.push(a);
        }
        if o.seq >= last {
            break;
        }
    }
    Ok(states)
}

/// Forks sleepers for ever, retrying a refused fork at once (bash would wait seconds between retries).
const FILLER: &str = "python3 -c '
import os, time
while True:
    try:
        if os.fork() == 0:
            time.sleep(1000)
            os._exit(0)
    except OSError:
        pass
' >/dev/null 2>&1 &";

/// Lines of the container's log (the executor's stderr) that tell of a panic.
fn panics(sandbox: &str) -> anyhow::Result<Vec<String>> {
    let out = std::process::Command::new("docker")
        .args(["logs", &container_of(sandbox)])
        .output()?;
    let text =
        String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    Ok(text
        .lines()
        .filter(|l| l.contains("panicked"))
        .map(str::to_owned)
        .collect())
}

/// A fork bomb started in the background ends its command at once; the next command runs within 2 s
/// because the executor, refused a process by the pids limit, kills what the ended command left behind,
/// and an `agent_state` says what it reclaimed. The executor neither panics nor stops answering.
#[tokio::test]
async fn a_backgrounded_fork_bomb_is_reclaimed_and_the_next_command_runs() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let id = h
        .create(api::SandboxSpec {
            pids_limit: 64,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    let bomb = h
        .sh(&id, "bash -c ':(){ :|:& };:' >/dev/null 2>&1 &")
        .await?;
    assert_eq!(cmd_end(&bomb)?.exit_code, 0, "{bomb:?}");
    // Let it fill the pids limit.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    let next = h.sh(&id, "echo ok").await?;
    let took = started.elapsed();
    let mut timeline = format!("first command after {took:?}: {:?}", cmd_end(&next)?);
    // Before a fix, how long until a command runs again (bounded).
    if stdout(&next) != "ok\n" {
        while started.elapsed() < Duration::from_secs(120) {
            let again = h.sh(&id, "echo ok").await?;
            if stdout(&again) == "ok\n" {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        timeline += &format!("; a command ran again after {:?}", started.elapsed());
    }
    assert_eq!(stdout(&next), "ok\n", "{timeline}");
    assert!(took < Duration::from_secs(2), "{timeline}");

    let states = agent_states(&mut h, &id).await?;
    let reclaimed = states
        .iter()
        .find(|a| a.message.contains("reclaimed"))
        .unwrap_or_else(|| panic!("no agent_state about reclaimed processes: {states:?}"));
    let killed: u64 = reclaimed.details["killed"].parse()?;
    assert!(killed > 10, "{reclaimed:?}");
    assert_eq!(reclaimed.details["from"], "ended actions", "{reclaimed:?}");
    assert_eq!(panics(&id)?, Vec::<String>::new());
    h.stop().await
}

/// Leftovers that keep the pids limit full for longer than an idle thread of the executor lives (tokio
/// lets an idle blocking thread go after 10 s): the executor must not need a new thread or process to keep
/// serving. It stays RUNNING and answering throughout, never panics, and the next command and cell run.
#[tokio::test]
async fn a_pids_limit_kept_full_neither_panics_nor_wedges_the_executor() -> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| c.health_interval = Duration::from_secs(1)).await?;
    let id = h
        .create(api::SandboxSpec {
            pids_limit: 48,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    // Sleepers forked as fast as the limit allows, for ever: a slot that frees up is taken again at once.
    let filler = h.sh(&id, FILLER).await?;
    assert_eq!(cmd_end(&filler)?.exit_code, 0, "{filler:?}");
    let quiet_until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < quiet_until {
        let sb = h.get(&id).await?;
        assert_eq!(sb.state, api::SandboxState::Running as i32, "{sb:?}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let started = Instant::now();
    let next = h.sh(&id, "echo ok").await?;
    let took = started.elapsed();
    assert_eq!(stdout(&next), "ok\n", "after {took:?}: {next:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    let cell = h.py(&id, "print(6 * 7)").await?;
    assert_eq!(cell_stdout(&cell), "42\n", "{cell:?}");
    assert_eq!(panics(&id)?, Vec::<String>::new());
    assert_eq!(h.get(&id).await?.state, api::SandboxState::Running as i32);
    h.stop().await
}
