//! `BENCH_ONLY=capacity make bench`: how far one runtime goes on this machine (issue 35, item 6). The
//! release runtime runs as a process of its own (`target/release/mentis-runtime`, next to this binary), so
//! its memory and CPU time are its own, read from /proc: its memory per sandbox (`CAPACITY_SANDBOXES` idle
//! sandboxes, default 100), the CPU time it spends per action (`CAPACITY_ACTIONS` shell actions, default
//! 400, 8 at a time) and per idle sandbox (its health checks), and its memory per open stream
//! (`CAPACITY_STREAMS` followers of sandbox logs, default 1000). JSON in `BENCH_OUT` (default
//! target/capacity.json).

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use mentis_e2e::*;
use mentis_proto::api;
use serde_json::json;

use crate::{env_num, rss_kib};

/// The CPU time (user and system) a process has used so far.
pub(crate) fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command's name, which is in parentheses and may hold spaces.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("an unreadable /proc stat")?
        .1
        .split_whitespace()
        .collect();
    // utime and stime are the 14th and 15th fields, the 12th and 13th after the name.
    let ticks: u64 = fields[11].parse::<u64>()? + fields[12].parse::<u64>()?;
    // USER_HZ is 100 on Linux.
    Ok(Duration::from_millis(ticks * 10))
}

pub(crate) fn rss(pid: u32) -> u64 {
    rss_kib(&pid.to_string()).unwrap_or(0)
}

pub async fn run() -> anyhow::Result<()> {
    let sandboxes = env_num("CAPACITY_SANDBOXES", 100);
    let actions = env_num("CAPACITY_ACTIONS", 400);
    let streams = env_num("CAPACITY_STREAMS", 1000);
    let bin = std::env::current_exe()?
        .parent()
        .context("the bench's folder")?
        .join("mentis-runtime");
    if !bin.exists() {
        bail!(
            "{} is missing: `make bench` builds it (make tools)",
            bin.display()
        );
    }
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let max = (sandboxes + 16).to_string();
    let runtime = RuntimeProcess::start_with_env(
        &bin.display().to_string(),
        &instance,
        data_dir.path(),
        &[
            ("MENTIS_MAX_SANDBOXES", max.as_str()),
            // The default interval: what an operator's runtime spends on idle sandboxes.
            ("MENTIS_HEALTH_INTERVAL_SECS", "5"),
            ("MENTIS_STREAM_KEEPALIVE_SECS", "600"),
        ],
    )
    .await?;
    let pid = runtime.pid();
    let mut h = runtime.harness(data_dir, guard).await?;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_empty = rss(pid);

    // Memory per idle sandbox.
    let started = Instant::now();
    let mut held: Vec<String> = Vec::new();
    while held.len() < sandboxes {
        let batch = (sandboxes - held.len()).min(8);
        let made = futures::future::join_all((0..batch).map(|_| {
            let mut client = h.sandboxes.clone();
            async move {
                client
                    .create_sandbox(api::CreateSandboxRequest {
                        spec: Some(api::SandboxSpec::default()),
                    })
                    .await
                    .map(|r| r.into_inner().sandbox.unwrap_or_default().sandbox_id)
            }
        }))
        .await;
        for m in made {
            held.push(m.context("a create failed")?);
        }
        if started.elapsed() > Duration::from_secs(900) {
            bail!("{} sandboxes took more than 15 minutes", held.len());
        }
    }
    let create_secs = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_sandboxes = rss(pid);
    // CPU while they idle: health checks every 5 s.
    let idle_window = Duration::from_secs(30);
    let cpu0 = cpu_time(pid)?;
    tokio::time::sleep(idle_window).await;
    let idle_cpu = cpu_time(pid)? - cpu0;

    // CPU per action: `echo` round trips, 8 at a time over the sandboxes.
    let cpu0 = cpu_time(pid)?;
    let t = Instant::now();
    let mut done = 0usize;
    while done < actions {
        let batch = (actions - done).min(8);
        let ran = futures::future::join_all((0..batch).map(|i| {
            let sandbox = held[(done + i) % held.len()].clone();
            let mut client = h.actions.clone();
            async move {
                let stream = client
                    .execute(api::ExecuteRequest {
                        sandbox_id: sandbox,
                        action: Some(shell_action(cmd("echo capacity"))),
                        action_id: String::new(),
                    })
                    .await?
                    .into_inner();
                let seen = collect(stream, Duration::from_secs(60)).await?;
                anyhow::ensure!(stdout(&seen) == "capacity\n", "{seen:?}");
                Ok::<_, anyhow::Error>(())
            }
        }))
        .await;
        for r in ran {
            r?;
        }
        done += batch;
    }
    let action_wall = t.elapsed();
    let action_cpu = cpu_time(pid)? - cpu0;

    // Memory per open stream: followers of the sandboxes' logs, idle.
    let rss_before_streams = rss(pid);
    let mut open = Vec::with_capacity(streams);
    for i in 0..streams {
        let mut client = h.actions.clone();
        let s = client
            .stream_observations(api::StreamObservationsRequest {
                sandbox_id: held[i % held.len()].clone(),
                after_seq: 0,
                action_id: String::new(),
            })
            .await?
            .into_inner();
        open.push(s);
    }
    tokio::time::sleep(Duration::from_secs(5)).await;
    let rss_streams = rss(pid);
    let cpu0 = cpu_time(pid)?;
    tokio::time::sleep(idle_window).await;
    let streams_idle_cpu = cpu_time(pid)? - cpu0;
    // Every stream still open.
    for s in &mut open {
        if let Ok(Some(item)) = tokio::time::timeout(Duration::from_millis(1), s.next()).await {
            item.context("a follower's stream failed")?;
        }
    }
    drop(open);

    #[allow(clippy::cast_precision_loss)]
    let per = |delta: u64, n: usize| delta as f64 / n.max(1) as f64;
    let per_sandbox_kib = per(rss_sandboxes.saturating_sub(rss_empty), sandboxes);
    let per_stream_kib = per(rss_streams.saturating_sub(rss_before_streams), streams);
    #[allow(clippy::cast_precision_loss)]
    let cpu_ms_per_action = action_cpu.as_secs_f64() * 1000.0 / actions.max(1) as f64;
    #[allow(clippy::cast_precision_loss)]
    let idle_cpu_pct = idle_cpu.as_secs_f64() / idle_window.as_secs_f64() * 100.0;
    #[allow(clippy::cast_precision_loss)]
    let streams_cpu_pct = streams_idle_cpu.as_secs_f64() / idle_window.as_secs_f64() * 100.0;
    #[allow(clippy::cast_precision_loss)]
    let actions_per_sec = actions as f64 / action_wall.as_secs_f64();
    println!(
        "capacity: runtime RSS empty {rss_empty} KiB; {sandboxes} idle sandboxes (made in {create_secs:.1} s) \
         {rss_sandboxes} KiB, {per_sandbox_kib:.0} KiB per sandbox; idle CPU with them {idle_cpu_pct:.2} % of a \
         core ({:.3} % per sandbox); {actions} actions, 8 at a time, {actions_per_sec:.0}/s, {cpu_ms_per_action:.2} \
         ms of runtime CPU each; {streams} open streams {rss_streams} KiB ({per_stream_kib:.1} KiB each), idle \
         CPU with them {streams_cpu_pct:.2} % of a core",
        idle_cpu_pct / sandboxes.max(1) as f64
    );
    let out = json!({
        "runtime_rss_kib_empty": rss_empty,
        "sandboxes": sandboxes,
        "create_seconds": create_secs,
        "runtime_rss_kib_with_sandboxes": rss_sandboxes,
        "runtime_kib_per_sandbox": per_sandbox_kib,
        "idle_cpu_percent_of_a_core": idle_cpu_pct,
        "actions": actions,
        "actions_per_second": actions_per_sec,
        "runtime_cpu_ms_per_action": cpu_ms_per_action,
        "streams": streams,
        "runtime_rss_kib_with_streams": rss_streams,
        "runtime_kib_per_stream": per_stream_kib,
        "idle_cpu_percent_with_streams": streams_cpu_pct,
    });
    let path = std::env::var("BENCH_OUT").unwrap_or_else(|_| "target/capacity.json".to_owned());
    std::fs::write(&path, serde_json::to_string_pretty(&out)?)?;
    println!("results written to {path}");
    for id in &held {
        let _ = h
            .sandboxes
            .delete_sandbox(api::DeleteSandboxRequest {
                sandbox_id: id.clone(),
            })
            .await;
    }
    drop(runtime);
    Ok(())
}
