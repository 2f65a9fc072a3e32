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

/// The classic fork bomb, in the background: its command ends at once.
const BOMB: &str = "bash -c ':(){ :|:& };:' >/dev/null 2>&1 &";

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
    // The bomb's processes die and fork again all the time, so a spawn may find a pid free for a moment
    // and need no reclaim: each command must run at once, and within a few one must have met the full limit.
    let mut timeline = String::new();
    let mut reclaimed = None;
    for attempt in 1..=5 {
        let started = Instant::now();
        let next = h.sh(&id, "echo ok").await?;
        let took = started.elapsed();
        timeline += &format!("command {attempt} after {took:?}: {:?}; ", cmd_end(&next)?);
        assert_eq!(stdout(&next), "ok\n", "{timeline}");
        assert!(took < Duration::from_secs(2), "{timeline}");
        let states = agent_states(&mut h, &id).await?;
        reclaimed = states.into_iter().find(|a| a.message.contains("reclaimed"));
        if reclaimed.is_some() {
            break;
        }
    }
    let reclaimed =
        reclaimed.unwrap_or_else(|| panic!("no agent_state about reclaimed processes: {timeline}"));
    let killed: u64 = reclaimed.details["killed"].parse()?;
    assert!(killed > 10, "{reclaimed:?}");
    assert_eq!(reclaimed.details["from"], "ended actions", "{reclaimed:?}");
    assert_eq!(
        reclaimed.details["for"], "a command's shell",
        "{reclaimed:?}"
    );
    assert_eq!(reclaimed.details["pids_limit"], "64", "{reclaimed:?}");

    // Again, and this time the next action is the first cell: the kernel cannot start until the executor
    // reclaims, and the cell's stream says so.
    h.sh(&id, BOMB).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let started = Instant::now();
    let cell = h.py(&id, "print('ok')").await?;
    assert_eq!(
        cell_stdout(&cell),
        "ok\n",
        "after {:?}: {cell:?}",
        started.elapsed()
    );
    let states = agent_states(&mut h, &id).await?;
    assert!(
        states.iter().any(|a| a.message.contains("reclaimed")
            && a.details["for"] == "the kernel"
            && a.details["from"] == "ended actions"),
        "{states:?}"
    );
    assert_eq!(panics(&id)?, Vec::<String>::new());
    h.stop().await
}

/// A bomb (the filler: forks for ever) that left its command's process group (setsid), or that a cell
/// started (in the kernel's group), is not among what ended actions left: the executor then kills every other process of the sandbox but
/// the kernel, whose state survives.
#[tokio::test]
async fn a_bomb_outside_ended_groups_is_reclaimed_and_the_kernel_is_spared() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let id = h
        .create(api::SandboxSpec {
            pids_limit: 64,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    assert_eq!(
        ipython_result(&h.py(&id, "x = 41").await?)?.status,
        api::IpythonStatus::Ok as i32
    );
    // The filler rather than the classic bomb: at a limit this low bash's bomb may die out by itself within
    // the two seconds (a local run once saw the second case need no reclaim at all), the filler keeps it full.
    let from_a_cell = format!(
        "import subprocess\nsubprocess.Popen(['bash', '-c', {FILLER:?}], \
         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    );
    for how in ["setsid", "a cell"] {
        let start = match how {
            "setsid" => h.sh(&id, &format!("setsid {FILLER}")).await?,
            _ => h.py(&id, &from_a_cell).await?,
        };
        assert_eq!(terminals(&start).len(), 1, "{how}: {start:?}");
        tokio::time::sleep(Duration::from_secs(2)).await;
        let started = Instant::now();
        let next = h.sh(&id, "echo ok").await?;
        let took = started.elapsed();
        assert_eq!(stdout(&next), "ok\n", "{how}: after {took:?}: {next:?}");
        assert!(took < Duration::from_secs(2), "{how}: {took:?}");
        let cell = h.py(&id, "x += 1\nprint(x)").await?;
        assert!(
            cell_stdout(&cell).starts_with("4"),
            "{how}: the kernel lost its state: {cell:?}"
        );
    }
    let states = agent_states(&mut h, &id).await?;
    let reclaims: Vec<_> = states
        .iter()
        .filter(|a| a.message.contains("reclaimed"))
        .collect();
    assert_eq!(reclaims.len(), 2, "{states:?}");
    for reclaimed in reclaims {
        assert_eq!(
            reclaimed.details["from"], "all other user processes",
            "{reclaimed:?}"
        );
        assert!(
            reclaimed.details["killed"].parse::<u64>()? > 10,
            "{reclaimed:?}"
        );
    }
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

/// Runs `echo ok` until it prints `ok` (an executor that went away comes back with its container), for at
/// most `within`; how long that took.
async fn until_answering(
    h: &mut Harness,
    sandbox: &str,
    within: Duration,
) -> anyhow::Result<Duration> {
    let started = Instant::now();
    loop {
        if let Ok(obs) = h.sh(sandbox, "echo ok").await
            && stdout(&obs) == "ok\n"
        {
            return Ok(started.elapsed());
        }
        if started.elapsed() > within {
            anyhow::bail!(
                "the sandbox did not answer within {within:?}: {:?}",
                h.get(sandbox).await?
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// User code can neither kill the executor nor signal tini (PID 1): both keep root as their real uid (see
/// isolation.rs), so the attempts are EPERM and the sandbox serves on. When they die anyway (killed from
/// outside: `docker exec` as the container's root, what a crash or an operator does), the running action
/// ends LOST, or cancelled by the drain tini forwards, but the sandbox comes back: the runtime restarts the
/// container, and the workspace is kept.
#[tokio::test]
async fn the_executor_and_tini_are_out_of_user_codes_reach_and_come_back_when_killed()
-> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| c.health_interval = Duration::from_secs(1)).await?;
    let id = h.create_default().await?.sandbox_id;
    h.sh(&id, "echo kept > /workspace/file").await?;
    let refused = h
        .sh(
            &id,
            "kill -9 $PPID; kill -TERM 1; kill -INT 1; kill -9 1; echo alive",
        )
        .await?;
    assert_eq!(stdout(&refused), "alive\n", "{refused:?}");
    assert_eq!(
        stderr(&refused).matches("Operation not permitted").count(),
        4,
        "{refused:?}"
    );
    let container = container_of(&id);
    for (outside, reason) in [
        // The executor is the command's parent.
        ("pkill -9 -x mentis-executor", api::EndReason::Lost),
        // tini forwards it to the executor, which drains and stops; tini follows, and so does the container.
        ("kill -TERM 1", api::EndReason::Cancelled),
        ("kill -INT 1", api::EndReason::Cancelled),
    ] {
        // Lands while the action below runs.
        docker(&[
            "exec",
            "-d",
            &container,
            "sh",
            "-c",
            &format!("sleep 1; {outside}"),
        ])?;
        let killed = h.sh(&id, "sleep 10").await?;
        assert_eq!(
            cmd_end(&killed)?.reason,
            reason as i32,
            "{outside}: {killed:?}"
        );
        let took = until_answering(&mut h, &id, Duration::from_secs(60)).await?;
        assert_eq!(
            stdout(&h.sh(&id, "cat /workspace/file").await?),
            "kept\n",
            "{outside}: back after {took:?}"
        );
        assert_eq!(h.get(&id).await?.state, api::SandboxState::Running as i32);
    }
    h.stop().await
}

/// With a read-only root, /tmp is a tmpfs whose pages count in the memory limit. Filling it ends the
/// command with ENOSPC (not the OOM killer), and the executor and the kernel, with its state, carry on.
#[tokio::test]
async fn filling_tmp_gets_enospc_and_the_sandbox_keeps_answering() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let id = h
        .create(api::SandboxSpec {
            memory_limit_mb: 256,
            root_filesystem: api::RootFilesystem::ReadOnly as i32,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    assert_eq!(
        ipython_result(&h.py(&id, "x = 41").await?)?.status,
        api::IpythonStatus::Ok as i32
    );
    let fill = h.sh(&id, "head -c 400M /dev/zero > /tmp/fill").await?;
    let end = cmd_end(&fill)?;
    assert_eq!(end.reason, api::EndReason::Exited as i32, "{end:?}");
    assert_ne!(end.exit_code, 0, "{end:?}");
    let stderr = String::from_utf8_lossy(&output(&fill, api::OutputStream::Stderr)).into_owned();
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert_eq!(stdout(&h.sh(&id, "echo ok").await?), "ok\n");
    let cell = h.py(&id, "x += 1\nprint(x)").await?;
    assert_eq!(
        cell_stdout(&cell),
        "42\n",
        "the kernel kept its state: {cell:?}"
    );
    // The file is still there, and removing it gives the room back.
    assert_eq!(
        stdout(&h.sh(&id, "rm /tmp/fill && echo removed").await?),
        "removed\n"
    );
    assert_eq!(h.get(&id).await?.state, api::SandboxState::Running as i32);
    h.stop().await
}

/// A cell that closes the kernel's shell socket ends within seconds, and the next cell gets a fresh kernel
/// (before, the kernel was kept and the next cell failed; with iopub closed, a cell ran to its timeout).
#[tokio::test]
async fn closing_the_kernels_sockets_gives_the_next_cell_a_fresh_kernel() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let id = h.create_default().await?.sandbox_id;
    for socket in ["shell_stream", "iopub_socket"] {
        h.py(&id, "x = 1").await?;
        let started = Instant::now();
        let closing = h
            .py(&id, &format!("get_ipython().kernel.{socket}.close()"))
            .await?;
        let took = started.elapsed();
        // Far below the cell's timeout (300 s). With Debian's ipykernel 6.17 a closed iopub can also make
        // the kernel wait out its own stdout flush timeouts (10 s each, "IOStream.flush timed out" on its
        // stderr) before it replies; seen at about 32 s since actions run over Attach (not understood yet:
        // see the closing note of issue 13).
        assert!(
            took < Duration::from_secs(60),
            "{socket}: {took:?}: {closing:?}"
        );
        ipython_result(&closing)?;
        let next = h.py(&id, "print('x' in globals())").await?;
        assert_eq!(cell_stdout(&next), "False\n", "{socket}: {next:?}");
        assert_eq!(ipython_result(&next)?.status, api::IpythonStatus::Ok as i32);
    }
    let states = agent_states(&mut h, &id).await?;
    let unreachable = states
        .iter()
        .filter(|a| a.message == "kernel restarted" && a.details["reason"] == "unreachable")
        .count();
    assert_eq!(unreachable, 2, "{states:?}");
    h.stop().await
}
