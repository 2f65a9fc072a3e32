//! A sandbox's processes over the API (ActionService.ListProcesses, SignalProcess): what `ps` inside it
//! shows (pid, user, command, CPU, memory, start), with PID 1, the executor and the IPython kernel named by
//! their role; a signal to one process stops, continues or ends it without a shell; PID 1 and the executor
//! are not signalled, and an unknown pid or signal is refused with its reason.

use std::time::{Duration, SystemTime};

use anyhow::{Context, Result};
use mentis_e2e::*;
use mentis_proto::api;

async fn list(h: &mut Harness, sandbox: &str) -> Result<Vec<api::ProcessInfo>> {
    Ok(h.actions
        .list_processes(api::ListProcessesRequest {
            sandbox_id: sandbox.to_owned(),
        })
        .await?
        .into_inner()
        .processes)
}

async fn signal(
    h: &mut Harness,
    sandbox: &str,
    pid: i32,
    signal: &str,
) -> std::result::Result<(), tonic::Status> {
    h.actions
        .signal_process(api::SignalProcessRequest {
            sandbox_id: sandbox.to_owned(),
            pid,
            signal: signal.to_owned(),
        })
        .await
        .map(drop)
}

/// Polls the list until `pred` holds for the process `pid` (or its absence: None), for up to 10 s.
async fn until(
    h: &mut Harness,
    sandbox: &str,
    pid: i32,
    pred: impl Fn(Option<&api::ProcessInfo>) -> bool,
) -> Result<()> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let all = list(h, sandbox).await?;
        let p = all.iter().find(|p| p.pid == pid);
        if pred(p) {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "process {pid} never got there: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn processes_are_listed_like_ps_and_signalled_without_a_shell() -> Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?.sandbox_id;
    let pids = stdout(
        &h.sh(
            &sb,
            "nohup sleep 600 >/dev/null 2>&1 & echo $!; \
             nohup sh -c 'while :; do :; done' >/dev/null 2>&1 & echo $!; whoami",
        )
        .await?,
    );
    let mut lines = pids.lines();
    let sleeper: i32 = lines.next().context("no pid")?.parse()?;
    let spinner: i32 = lines.next().context("no pid")?.parse()?;
    let user = lines.next().context("no user")?.to_owned();
    // The kernel, started by a cell.
    h.py(&sb, "1 + 1").await?;
    tokio::time::sleep(Duration::from_secs(2)).await;

    let all = list(&mut h, &sb).await?;
    let pids: Vec<i32> = all.iter().map(|p| p.pid).collect();
    let mut sorted = pids.clone();
    sorted.sort_unstable();
    assert_eq!(pids, sorted, "listed by pid");
    let sleep = all
        .iter()
        .find(|p| p.pid == sleeper)
        .context("the sleep is not listed")?;
    assert_eq!(sleep.command, ["sleep", "600"], "{sleep:?}");
    assert_eq!(
        (sleep.name.as_str(), sleep.user.as_str()),
        ("sleep", user.as_str())
    );
    assert_eq!(sleep.role, "");
    assert!(sleep.memory_bytes > 0 && sleep.state == "S", "{sleep:?}");
    let started: SystemTime = sleep.start_time.context("no start time")?.try_into()?;
    let age = SystemTime::now()
        .duration_since(started)
        .unwrap_or_default();
    assert!(
        age < Duration::from_secs(120),
        "started {age:?} ago: {sleep:?}"
    );
    // A busy loop shows its CPU.
    let spin = all
        .iter()
        .find(|p| p.pid == spinner)
        .context("no spinner")?;
    assert!(
        spin.cpu_percent > 10.0 && spin.cpu_seconds > 0.1,
        "{spin:?}"
    );
    // PID 1, the executor and the kernel carry their roles.
    for role in ["init", "executor", "ipython-kernel"] {
        assert!(all.iter().any(|p| p.role == role), "no {role}: {all:#?}");
    }
    assert_eq!(
        all.iter().find(|p| p.pid == 1).map(|p| p.role.as_str()),
        Some("init")
    );

    // STOP and CONT, then TERM: the process stops, runs again, and is gone.
    signal(&mut h, &sb, sleeper, "STOP").await?;
    until(&mut h, &sb, sleeper, |p| p.is_some_and(|p| p.state == "T")).await?;
    signal(&mut h, &sb, sleeper, "SIGCONT").await?;
    until(&mut h, &sb, sleeper, |p| p.is_some_and(|p| p.state == "S")).await?;
    signal(&mut h, &sb, sleeper, "").await?;
    until(&mut h, &sb, sleeper, |p| p.is_none()).await?;
    signal(&mut h, &sb, spinner, "kill").await?;
    until(&mut h, &sb, spinner, |p| p.is_none()).await?;

    // What is refused, and why.
    let executor = all
        .iter()
        .find(|p| p.role == "executor")
        .context("no executor")?
        .pid;
    for (pid, name, code, reason) in [
        (
            1,
            "TERM",
            tonic::Code::FailedPrecondition,
            "FAILED_PRECONDITION",
        ),
        (
            executor,
            "KILL",
            tonic::Code::FailedPrecondition,
            "FAILED_PRECONDITION",
        ),
        (
            4_000_000,
            "TERM",
            tonic::Code::NotFound,
            "PROCESS_NOT_FOUND",
        ),
        (sleeper, "TERM", tonic::Code::NotFound, "PROCESS_NOT_FOUND"),
        (0, "TERM", tonic::Code::InvalidArgument, "INVALID_ARGUMENT"),
        (-1, "TERM", tonic::Code::InvalidArgument, "INVALID_ARGUMENT"),
        (2, "SEGV", tonic::Code::InvalidArgument, "INVALID_ARGUMENT"),
    ] {
        let (got, why, _) = refusal(signal(&mut h, &sb, pid, name).await);
        assert_eq!((got, why.as_str()), (code, reason), "pid {pid} {name}");
    }
    // The sandbox still works.
    assert_eq!(stdout(&h.sh(&sb, "echo fine").await?), "fine\n");
    Ok(())
}
