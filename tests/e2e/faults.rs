//! Observation guarantees under faults (docs/ARCHITECTURE.md, Invariants: one terminal observation per
//! accepted action; nothing lost on reconnect, gaps explicit; bounded everywhere): exactly one terminal
//! observation when the executor or its container dies or freezes under an action, resumable streams with
//! no loss and no duplicates, explicit gaps, keepalives, several subscribers, and a consumer that never reads.

use std::time::Duration;

use futures::StreamExt;
use mentis_e2e::*;
use mentis_proto::api;

use crate::shell;

/// Starts `command` with Execute and returns its stream once the command has printed `ready`.
pub(super) async fn start_until_ready(
    h: &mut Harness,
    sandbox: &str,
    command: &str,
) -> anyhow::Result<(
    tonic::Streaming<api::ExecuteResponse>,
    Vec<api::Observation>,
)> {
    let mut stream = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: sandbox.to_owned(),
            action: Some(shell_action(cmd(command))),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let mut seen = Vec::new();
    while !stdout(&seen).contains("ready") {
        let m = tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("stream ended early"))??;
        if let Some(api::execute_response::Kind::Observation(o)) = m.kind {
            seen.push(o);
        }
    }
    Ok((stream, seen))
}

/// Injects `fault` (a docker command on the sandbox's container) under a running command and checks that
/// the command ends with exactly one LOST terminal.
async fn lost_under(fault: &[&str], keepalive: Duration) -> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| c.executor_keepalive = keepalive).await?;
    let sb = h.create_default().await?;
    let container = container_of(&sb.sandbox_id);
    let (stream, mut seen) =
        start_until_ready(&mut h, &sb.sandbox_id, "echo ready; sleep 1000").await?;
    // `docker VERB [-OPTIONS] CONTAINER ARGS...`: the container goes after the verb and its options.
    let options = fault[1..].iter().take_while(|a| a.starts_with('-')).count();
    let mut args = fault[..=options].to_vec();
    args.push(container.as_str());
    args.extend_from_slice(&fault[options + 1..]);
    docker(&args)?;
    seen.extend(collect(stream, Duration::from_secs(120)).await?);
    let end = cmd_end(&seen)?;
    assert_eq!(end.reason, api::EndReason::Lost as i32, "{end:?}");
    assert!(!end.message.is_empty());
    if fault[0] == "pause" {
        docker(&["unpause", &container])?;
    }
    h.stop().await
}

#[tokio::test]
async fn killing_the_executor_process_ends_the_action_lost() -> anyhow::Result<()> {
    lost_under(
        // Detached: the executor's death ends tini and with it the container, which can kill pkill before
        // it reports success.
        &["exec", "-d", "pkill", "-9", "mentis-executor"],
        Duration::from_secs(10),
    )
    .await
}

#[tokio::test]
async fn killing_the_container_ends_the_action_lost() -> anyhow::Result<()> {
    lost_under(&["kill"], Duration::from_secs(10)).await
}

/// A container frozen behind the runtime's back (`docker pause`): the executor is not gone, so its action
/// is not given up. The stream to it fails on keepalives and the sandbox turns UNHEALTHY; once the
/// container is thawed the runtime attaches again and the action ends with its own end and all its output.
#[tokio::test]
async fn a_container_paused_behind_our_back_holds_its_action_until_thawed() -> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| {
        c.executor_keepalive = Duration::from_secs(2);
        c.health_interval = Duration::from_secs(1);
    })
    .await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    let container = container_of(&id);
    let (stream, mut seen) =
        start_until_ready(&mut h, &id, "echo ready; sleep 3; echo after").await?;
    docker(&["pause", &container])?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while h.get(&id).await?.state != api::SandboxState::Unhealthy as i32 {
        assert!(tokio::time::Instant::now() < deadline, "never UNHEALTHY");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Well past the keepalives and the command's own sleep.
    tokio::time::sleep(Duration::from_secs(6)).await;
    docker(&["unpause", &container])?;
    seen.extend(collect(stream, Duration::from_secs(60)).await?);
    let end = cmd_end(&seen)?;
    assert_eq!(end.reason, api::EndReason::Exited as i32, "{end:?}");
    assert_eq!(stdout(&seen), "ready\nafter\n");
    assert_eq!(h.get(&id).await?.state, api::SandboxState::Running as i32);
    h.stop().await
}

#[tokio::test]
async fn a_dropped_stream_resumes_with_every_observation_once() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    let action_id = "resume-me".to_owned();
    let first = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.clone(),
            action: Some(shell_action(cmd(
                "echo ran >> /workspace/runs; for i in $(seq 1 100); do echo $i; sleep 0.02; done",
            ))),
            action_id: action_id.clone(),
        })
        .await?
        .into_inner();
    // Read a few, then drop the connection mid-stream.
    let mut got: Vec<api::Observation> = first
        .take(5)
        .filter_map(|m| async move {
            match m.ok()?.kind? {
                api::execute_response::Kind::Observation(o) => Some(o),
                _ => None,
            }
        })
        .collect()
        .await;
    let last = got.last().unwrap().seq;
    // Resume from the last seq received, on a new stream filtered to the action.
    let resumed = h
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: id.clone(),
            after_seq: last,
            action_id: action_id.clone(),
        })
        .await?
        .into_inner();
    let mut rest = Vec::new();
    let mut resumed = resumed;
    while let Some(m) = tokio::time::timeout(Duration::from_secs(60), resumed.next()).await? {
        match m?.kind {
            Some(api::stream_observations_response::Kind::Observation(o)) => rest.push(o),
            Some(api::stream_observations_response::Kind::Keepalive(_)) => {}
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    got.extend(rest);
    let seqs: Vec<u64> = got.iter().map(|o| o.seq).collect();
    let first_seq = seqs[0];
    assert_eq!(
        seqs,
        (first_seq..first_seq + seqs.len() as u64).collect::<Vec<_>>(),
        "contiguous, no duplicates"
    );
    assert_eq!(
        stdout(&got),
        (1..=100).map(|i| format!("{i}\n")).collect::<String>()
    );
    cmd_end(&got)?;
    // Retrying the whole submission does not run it again: it replays the same observations.
    let retry = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.clone(),
            action: Some(shell_action(cmd(
                "echo ran >> /workspace/runs; for i in $(seq 1 100); do echo $i; sleep 0.02; done",
            ))),
            action_id,
        })
        .await?
        .into_inner();
    assert_eq!(collect(retry, Duration::from_secs(60)).await?, got);
    // The side effect happened once.
    let runs = h.sh(&id, "cat /workspace/runs").await?;
    assert_eq!(stdout(&runs), "ran\n");
    h.stop().await
}

#[tokio::test]
async fn a_trimmed_log_reports_an_explicit_gap() -> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| c.log_limits.max_entries = 20).await?;
    let sb = h.create_default().await?;
    // 50 separate output chunks (the sleeps keep them apart).
    h.sh(
        &sb.sandbox_id,
        "for i in $(seq 1 50); do echo $i; sleep 0.01; done",
    )
    .await?;
    let mut s = h
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: sb.sandbox_id.clone(),
            after_seq: 0,
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let first = tokio::time::timeout(Duration::from_secs(30), s.next())
        .await?
        .unwrap()?;
    let Some(api::stream_observations_response::Kind::Gap(g)) = first.kind else {
        anyhow::bail!("expected a gap first, got {first:?}");
    };
    assert_eq!(g.after_seq, 0);
    assert!(g.first_available_seq > 1);
    let next = tokio::time::timeout(Duration::from_secs(30), s.next())
        .await?
        .unwrap()?;
    let Some(api::stream_observations_response::Kind::Observation(o)) = next.kind else {
        anyhow::bail!("expected an observation after the gap");
    };
    assert_eq!(
        o.seq, g.first_available_seq,
        "the stream continues at the first kept seq"
    );
    h.stop().await
}

#[tokio::test]
async fn idle_streams_carry_keepalives_and_subscribers_see_one_sequence() -> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| c.stream.keepalive = Duration::from_secs(1)).await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    let follow =
        |mut actions: api::action_service_client::ActionServiceClient<mentis_e2e::ApiChannel>,
         id: String| async move {
            let mut s = actions
                .stream_observations(api::StreamObservationsRequest {
                    sandbox_id: id,
                    after_seq: 0,
                    action_id: String::new(),
                })
                .await?
                .into_inner();
            let (mut seqs, mut keepalives) = (Vec::new(), 0);
            while let Some(m) = tokio::time::timeout(Duration::from_secs(30), s.next()).await? {
                match m?.kind {
                    Some(api::stream_observations_response::Kind::Observation(o)) => {
                        let end = matches!(o.kind, Some(Kind::CmdEnd(_)));
                        seqs.push(o.seq);
                        if end {
                            break;
                        }
                    }
                    Some(api::stream_observations_response::Kind::Keepalive(_)) => keepalives += 1,
                    other => anyhow::bail!("unexpected {other:?}"),
                }
            }
            anyhow::Ok((seqs, keepalives))
        };
    let a = tokio::spawn(follow(h.actions.clone(), id.clone()));
    let b = tokio::spawn(follow(h.actions.clone(), id.clone()));
    // Idle for a while, then one command.
    tokio::time::sleep(Duration::from_secs(3)).await;
    h.sh(&id, "echo one; echo two").await?;
    let (sa, ka) = a.await??;
    let (sb_, kb) = b.await??;
    assert_eq!(sa, sb_, "both subscribers see the same sequence");
    assert!(
        ka >= 1 && kb >= 1,
        "keepalives on the idle stream: {ka} {kb}"
    );
    h.stop().await
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_never_reads_costs_bounded_memory_and_is_cut_off() -> anyhow::Result<()> {
    const LOG_BYTES: usize = 8 * 1024 * 1024;
    let mut h = Harness::start_with(|c| {
        c.log_limits.max_bytes = LOG_BYTES;
        c.stream.stall = Duration::from_secs(3);
    })
    .await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    // A subscriber that opens the stream and never reads.
    let mut stalled = h
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: id.clone(),
            after_seq: 0,
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let before = rss_bytes();
    // Meanwhile 128 MiB of output flows to a client that does read, in 1 MiB bursts (an eighth of the log)
    // with short pauses: the reader keeps up even on a busy machine, so what it receives measures whether
    // the stalled subscriber holds it back, not how fast this machine is.
    let mut reader = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.clone(),
            action: Some(shell_action(cmd(
                "for i in $(seq 128); do head -c 1048576 /dev/zero; sleep 0.02; done",
            ))),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let (mut received, mut end) = (0usize, None);
    while let Some(m) = tokio::time::timeout(Duration::from_secs(120), reader.next()).await? {
        // Gaps are fine here: a reader that lags behind the small log is told what it missed.
        if let Some(api::execute_response::Kind::Observation(o)) = m?.kind {
            match o.kind {
                Some(Kind::CmdOutput(c)) => received += c.data.len(),
                Some(Kind::CmdEnd(e)) => end = Some(e),
                _ => {}
            }
        }
    }
    let after = rss_bytes();
    assert_eq!(end.expect("the reading client got the end").exit_code, 0);
    assert!(
        received > 64 * 1024 * 1024,
        "the reading client kept receiving: {received} bytes"
    );
    let growth = after.saturating_sub(before);
    assert!(
        growth < 96 * 1024 * 1024,
        "RSS grew by {} MiB while 128 MiB flowed",
        growth / (1024 * 1024)
    );
    // Stay away longer than the stall timeout; the client is then told, when it finally reads, that it was
    // cut off.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut cut = None;
    let mut n = 0;
    while let Some(m) = tokio::time::timeout(Duration::from_secs(30), stalled.next())
        .await
        .map_err(|e| anyhow::anyhow!("after {n} messages: {e}"))?
    {
        n += 1;
        if let Err(status) = m {
            cut = Some(status);
            break;
        }
    }
    let cut = cut.expect("the stalled stream ends with a status");
    assert_eq!(cut.code(), tonic::Code::ResourceExhausted, "{cut:?}");
    h.stop().await
}

#[tokio::test]
async fn a_dead_executor_makes_the_sandbox_unhealthy_then_it_recovers() -> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| {
        c.health_interval = Duration::from_secs(1);
        c.executor_keepalive = Duration::from_secs(2);
    })
    .await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    h.sh(&id, "echo kept > /workspace/file").await?;
    // The executor dies; with it tini and the container stop.
    let _ = docker(&["exec", &container_of(&id), "pkill", "-9", "mentis-executor"]);
    let state = |h: &mut Harness| {
        let mut sandboxes = h.sandboxes.clone();
        let id = id.clone();
        async move {
            let s = sandboxes
                .get_sandbox(api::GetSandboxRequest { sandbox_id: id })
                .await?
                .into_inner();
            anyhow::Ok(s.sandbox.unwrap().state)
        }
    };
    let (mut saw_unhealthy, mut running_again) = (false, false);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    while tokio::time::Instant::now() < deadline {
        let s = state(&mut h).await?;
        if s == api::SandboxState::Unhealthy as i32 {
            saw_unhealthy = true;
            // Meanwhile actions are refused as unavailable, not lost silently.
            let r = h
                .actions
                .execute(api::ExecuteRequest {
                    sandbox_id: id.clone(),
                    action: Some(shell_action(cmd("true"))),
                    action_id: String::new(),
                })
                .await;
            if let Err(status) = r {
                assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
            }
        }
        if saw_unhealthy && s == api::SandboxState::Running as i32 {
            running_again = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(saw_unhealthy, "the sandbox never became UNHEALTHY");
    assert!(running_again, "the sandbox did not recover");
    // The workspace survived and the sandbox works.
    assert_eq!(stdout(&h.sh(&id, "cat /workspace/file").await?), "kept\n");
    // Both transitions are in the log as sandbox-level observations.
    let mut s = h
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: id.clone(),
            after_seq: 0,
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let mut messages = Vec::new();
    while let Ok(Some(m)) = tokio::time::timeout(Duration::from_secs(2), s.next()).await {
        if let Some(api::stream_observations_response::Kind::Observation(o)) = m?.kind
            && let Some(Kind::AgentState(a)) = o.kind
        {
            messages.push(a.message);
        }
    }
    assert!(
        messages.iter().any(|m| m.contains("unreachable")),
        "{messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|m| m.contains("recovered") || m.contains("reachable again")),
        "{messages:?}"
    );
    h.stop().await
}

#[tokio::test]
async fn a_deleted_sandbox_stays_readable_for_the_retention_time() -> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| c.ended_retention = Duration::from_secs(3)).await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    let ran = h.sh(&id, "echo before delete").await?;
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    // Still readable: the action's observations replay, then the stream ends (the log is closed).
    let s = h
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: id.clone(),
            after_seq: 0,
            action_id: ran[0].action_id.clone(),
        })
        .await?
        .into_inner();
    let replay = shell::collect_stream(s).await?;
    assert_eq!(replay, ran);
    // After the retention time it is forgotten.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = h
            .sandboxes
            .get_sandbox(api::GetSandboxRequest {
                sandbox_id: id.clone(),
            })
            .await;
        if matches!(&r, Err(s) if s.code() == tonic::Code::NotFound) {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "still there: {r:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    h.stop().await
}

/// An executor stopped with SIGSTOP (user code can do that) does not leave the sandbox UNHEALTHY for good:
/// after the ready timeout the runtime restarts its container, and the workspace is kept.
#[tokio::test]
async fn a_stopped_executor_gets_its_container_restarted() -> anyhow::Result<()> {
    // The stopped executor answers no keepalive: its connection, and with it the health watch, is given
    // up on within two keepalive periods.
    let mut h = Harness::start_with(|c| {
        c.health_interval = Duration::from_secs(1);
        c.executor_keepalive = Duration::from_secs(2);
        c.ready_timeout = Duration::from_secs(10);
    })
    .await?;
    let id = h.create_default().await?.sandbox_id;
    h.sh(&id, "echo kept > /workspace/file").await?;
    docker(&[
        "exec",
        &container_of(&id),
        "pkill",
        "-STOP",
        "-x",
        "mentis-executor",
    ])?;
    h.wait_state(&id, api::SandboxState::Unhealthy, Duration::from_secs(30))
        .await?;
    h.wait_state(&id, api::SandboxState::Running, Duration::from_secs(90))
        .await?;
    assert_eq!(stdout(&h.sh(&id, "cat /workspace/file").await?), "kept\n");
    h.stop().await
}
