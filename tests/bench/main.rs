//! `make bench`: what a client sees through the whole chain (client → runtime → executor → process or
//! kernel → back), measured with a real gRPC client against a runtime started in this process, each figure
//! beside a baseline measured in the same run on the same machine (Docker itself, a local Jupyter kernel).
//! 127.0.0.1 and our own containers only; every loop is bounded in count and time. Prints a table (median,
//! p95, ratio ours / baseline) and writes JSON (`BENCH_OUT`, default target/bench.json).
//!
//! Knobs: `BENCH_N` (round trips per figure, default 200), `BENCH_DENSITY` (idle sandboxes to hold, default
//! 200), `BENCH_PYTHON` (the Python with jupyter_client and ipykernel for the Jupyter baseline, default
//! .tools/venv/bin/python). `BENCH_ONLY=throughput` measures only stdout throughput, journaled, memory-only and
//! through `docker exec`: `BENCH_N` runs (default 9) on a journaled runtime, on a memory-only one and of
//! `docker exec` into the journaled one's sandbox, taken in turn so that all see the machine in the same
//! state. `BENCH_TRACES=1` runs everything with traces on, every trace sampled,
//! exported over OTLP to a receiver in this process (compare with a run without it). Snapshots of a 200 MB
//! workspace of 10,000 files are measured beside `tar | zstd` (`BENCH_SNAPSHOT_RUNS`, default 3);
//! `BENCH_ONLY=snapshots` measures only them (`BENCH_N` runs, default 3). `BENCH_ONLY=shell` measures only
//! the plain shell and session round trips (`BENCH_N`, default 300), and with `BENCH_COMPARE_IMAGE` (another executor
//! image, for example one built from a change) the same on a runtime serving that image, in blocks of 25
//! taken in turn: an A/B of an executor change with both sides seeing the machine in the same state.
//! `BENCH_ONLY=capacity` measures how far one runtime goes: its memory per sandbox and per open stream, its
//! CPU time per action and per idle sandbox (capacity.rs). `BENCH_ONLY=scale` (`make bench-scale`) measures
//! the runtime at scale: bursts of creates, a hundred clients at once, a thousand idle sandboxes (scale.rs).
#![allow(clippy::unwrap_used)]

mod capacity;
mod scale;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use mentis_e2e::*;
use mentis_proto::api;
use mentis_runtime::config::PoolConfig;
use serde_json::json;

/// One measured figure.
struct Figure {
    name: String,
    samples: Vec<Duration>,
}

impl Figure {
    /// The same samples under another name.
    fn clone_named(&self, name: &str) -> Self {
        Self {
            name: name.to_owned(),
            samples: self.samples.clone(),
        }
    }

    fn pct(&self, p: f64) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        if s.is_empty() {
            return Duration::ZERO;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((s.len() - 1) as f64 * p).round() as usize;
        s[i]
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs `f` up to `n` times or until `budget` is spent, after `warmup` unmeasured runs; `f` returns the
/// measured duration of its run (so it may do unmeasured set-up and tear-down).
async fn measure<F, Fut>(
    name: &str,
    n: usize,
    warmup: usize,
    budget: Duration,
    mut f: F,
) -> anyhow::Result<Figure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Duration>>,
{
    for _ in 0..warmup {
        f().await?;
    }
    let deadline = Instant::now() + budget;
    let mut samples = Vec::with_capacity(n);
    while samples.len() < n && Instant::now() < deadline {
        samples.push(f().await?);
    }
    Ok(Figure {
        name: name.to_owned(),
        samples,
    })
}

/// Times a command (its stdout discarded); fails when it fails.
fn timed(program: &str, args: &[&str]) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let status = Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("run {program}"))?;
    let elapsed = t.elapsed();
    if !status.success() {
        bail!("{program} {} failed: {status}", args.join(" "));
    }
    Ok(elapsed)
}

/// A comparison row: ours beside a baseline.
struct Row {
    ours: Figure,
    baseline: Option<Figure>,
    /// For throughput rows: bytes moved per run (the table then shows MB/s too).
    bytes: Option<u64>,
}

const THROUGHPUT_BYTES: u64 = 256 * 1024 * 1024;

/// The Jupyter baseline: `1+1` on a local ipykernel through jupyter_client, `n` timed runs after a warm-up.
const JUPYTER_BASELINE: &str = r#"
import json, sys, time
from jupyter_client.manager import start_new_kernel
km, kc = start_new_kernel(kernel_name="python3")
def run():
    msg_id = kc.execute("1+1")
    while True:
        m = kc.get_iopub_msg(timeout=30)
        if (m["parent_header"].get("msg_id") == msg_id and m["msg_type"] == "status"
                and m["content"]["execution_state"] == "idle"):
            break
    while kc.get_shell_msg(timeout=30)["parent_header"].get("msg_id") != msg_id:
        pass
for _ in range(10):
    run()
samples = []
for _ in range(int(sys.argv[1])):
    t = time.perf_counter(); run(); samples.append(time.perf_counter() - t)
print(json.dumps(samples))
kc.stop_channels(); km.shutdown_kernel(now=True)
"#;

async fn create_and_echo(h: &Harness) -> anyhow::Result<(String, Duration)> {
    let (mut sandboxes, mut actions) = (h.sandboxes.clone(), h.actions.clone());
    let t = Instant::now();
    let sb = sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec::default()),
        })
        .await?
        .into_inner()
        .sandbox
        .context("no sandbox")?;
    let mut s = actions
        .execute(api::ExecuteRequest {
            sandbox_id: sb.sandbox_id.clone(),
            action: Some(shell_action(cmd("echo ok"))),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    // Until the first output arrives.
    while let Some(m) = s.next().await {
        if let Some(api::execute_response::Kind::Observation(o)) = m?.kind
            && matches!(o.kind, Some(Kind::CmdOutput(_)))
        {
            return Ok((sb.sandbox_id, t.elapsed()));
        }
    }
    bail!("no output from echo ok")
}

async fn delete(h: &Harness, ids: Vec<String>) -> anyhow::Result<()> {
    let deletes = ids.into_iter().map(|sandbox_id| {
        let mut c = h.sandboxes.clone();
        async move {
            c.delete_sandbox(api::DeleteSandboxRequest { sandbox_id })
                .await
                .map(|_| ())
        }
    });
    for r in futures::future::join_all(deletes).await {
        r?;
    }
    Ok(())
}

/// Idle members, or 0 while the pool is still making one (a refill in progress would compete for the
/// CPU with the measured claim: the figure is the pool's steady state).
async fn idle_members(h: &Harness) -> anyhow::Result<u32> {
    let pools = h.pools().await?;
    Ok(pools
        .first()
        .map_or(0, |p| if p.creating == 0 { p.idle } else { 0 }))
}

/// Resident memory (KiB) of a process of this machine.
fn rss_kib(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Resident memory (KiB) of the executor process of a sandbox's container.
fn executor_rss_kib(sandbox_id: &str) -> anyhow::Result<u64> {
    let top = docker(&["top", &container_of(sandbox_id), "-o", "pid,comm"])?;
    let pid = top
        .lines()
        .find(|l| l.contains("mentis-executor"))
        .and_then(|l| l.split_whitespace().next())
        .context("no executor process in the container")?
        .to_owned();
    rss_kib(&pid).context("cannot read the executor's memory")
}

pub(crate) fn mem_available_kib() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find(|l| l.starts_with("MemAvailable:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

/// A count from the environment, or `default`.
pub(crate) fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::var("BENCH_ONLY").as_deref() == Ok("snapshots") {
        let runs = env_num("BENCH_N", 3);
        let mut h = Harness::start().await.context("start the runtime")?;
        let (rows, sizes) = snapshot_rows(&mut h, runs).await?;
        let mut out = table(&rows);
        out.insert("snapshot_sizes".into(), sizes);
        let path =
            std::env::var("BENCH_OUT").unwrap_or_else(|_| "target/bench-snapshots.json".to_owned());
        std::fs::write(
            &path,
            serde_json::to_string_pretty(&serde_json::Value::Object(out))?,
        )?;
        println!("results written to {path}");
        return h.stop().await;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("shell") {
        return shell_only(env_num("BENCH_N", 300)).await;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("capacity") {
        return capacity::run().await;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("scale") {
        return scale::run().await;
    }
    if std::env::var("BENCH_ONLY").as_deref() == Ok("throughput") {
        return throughput_only(env_num("BENCH_N", 9)).await;
    }
    // Kept alive for the whole run: the receiver of the traces and the provider that exports them.
    let _traces = if std::env::var("BENCH_TRACES").as_deref() == Ok("1") {
        Some(traces_on().await?)
    } else {
        None
    };
    let n = env_num("BENCH_N", 200);
    let density = env_num("BENCH_DENSITY", 200);
    let python = std::env::var("BENCH_PYTHON").unwrap_or_else(|_| ".tools/venv/bin/python".into());
    let image = executor_image();
    let mut h = Harness::start_with(|c| {
        if _traces.is_some() {
            c.docker
                .executor_env
                .push("MENTIS_EXECUTOR_TRACES=1".to_owned());
        }
        c.pools = vec![PoolConfig {
            image: image.clone(),
            min_idle: 2,
            max_total: 4,
            // The claim itself is measured; kernels started ahead would only add refill load.
            kernel: false,
        }];
        c.max_sandboxes = density + 64;
        // The throughput figure reads 256 MiB through one stream: a log that holds all of it measures the
        // pipeline, not how far a reader may fall behind before the log trims.
        c.log_limits.max_bytes = 2 * THROUGHPUT_BYTES as usize;
    })
    .await
    .context("start the runtime")?;
    let mut rows: Vec<Row> = Vec::new();
    let long = Duration::from_secs(180);
    // Measured beside each create figure (warm, then cold), so both compare with Docker at that moment.
    let docker_run = || {
        measure("docker run --rm IMAGE (true)", n.min(20), 1, long, || {
            let image = image.clone();
            async move { timed("docker", &["run", "--rm", "--entrypoint", "true", &image]) }
        })
    };
    let docker_run_warm = docker_run().await?;

    // Warm: a pool member is waiting (not timed), then CreateSandbox + echo ok until the first output.
    let created = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let taken =
        |c: &std::sync::Arc<std::sync::Mutex<Vec<String>>>| std::mem::take(&mut *c.lock().unwrap());
    let warm = measure("create_to_first_output_warm", n.min(30), 0, long, || {
        let h = &h;
        let created = std::sync::Arc::clone(&created);
        async move {
            let deadline = Instant::now() + Duration::from_secs(60);
            while idle_members(h).await? == 0 {
                anyhow::ensure!(Instant::now() < deadline, "the pool did not refill");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let (id, t) = create_and_echo(h).await?;
            created.lock().unwrap().push(id);
            Ok(t)
        }
    })
    .await?;
    delete(&h, taken(&created)).await?;

    // Cold: a spec naming the image explicitly still hits the pool, so cold runs use a tag of their own
    // (same image id) that has no pool.
    let cold_image = format!(
        "{}-cold",
        image.split(':').next().unwrap_or("mentis/executor")
    );
    docker(&["tag", &image, &format!("{cold_image}:bench")])?;
    let cold_tag = format!("{cold_image}:bench");
    let cold = measure("create_to_first_output_cold", n.min(20), 1, long, || {
        let (mut sandboxes, mut actions) = (h.sandboxes.clone(), h.actions.clone());
        let created = std::sync::Arc::clone(&created);
        let cold_tag = cold_tag.clone();
        async move {
            let t = Instant::now();
            let sb = sandboxes
                .create_sandbox(api::CreateSandboxRequest {
                    spec: Some(api::SandboxSpec {
                        image: cold_tag,
                        ..Default::default()
                    }),
                })
                .await?
                .into_inner()
                .sandbox
                .context("no sandbox")?;
            let s = actions
                .execute(api::ExecuteRequest {
                    sandbox_id: sb.sandbox_id.clone(),
                    action: Some(shell_action(cmd("echo ok"))),
                    action_id: String::new(),
                })
                .await?
                .into_inner();
            let obs = collect(s, Duration::from_secs(60)).await?;
            anyhow::ensure!(stdout(&obs) == "ok\n");
            let elapsed = t.elapsed();
            created.lock().unwrap().push(sb.sandbox_id);
            Ok(elapsed)
        }
    })
    .await?;
    delete(&h, taken(&created)).await?;
    let _ = docker(&["rmi", &cold_tag]);
    rows.push(Row {
        ours: warm,
        baseline: Some(docker_run_warm),
        bytes: None,
    });
    let docker_run_cold = docker_run().await?;
    rows.push(Row {
        ours: cold,
        baseline: Some(docker_run_cold),
        bytes: None,
    });

    // Round trips in a running sandbox, once the pool has refilled the member this sandbox took: a round
    // trip measured while a container starts measures the start's load.
    let id = h.create_default().await?.sandbox_id;
    settle(&h).await?;
    let container = container_of(&id);
    let shell = shell_round_trip(&h, &id, n, "shell_round_trip_true").await?;
    let docker_exec = measure("docker exec CONTAINER true", n.min(50), 3, long, || {
        let container = container.clone();
        async move { timed("docker", &["exec", &container, "true"]) }
    })
    .await?;
    rows.push(Row {
        ours: shell.clone_named("shell_round_trip_true"),
        baseline: Some(docker_exec),
        bytes: None,
    });

    // A command in a persistent session (no bash to start), beside the floor of any shell round trip: a
    // bash on this machine fed `true` through a pipe, with no network, gRPC or container in between.
    let session = session_round_trip(&h, &id, n, "session_round_trip_true").await?;
    let local_bash = local_bash_round_trip(n).await?;
    rows.push(Row {
        ours: session,
        baseline: Some(local_bash),
        bytes: None,
    });

    let ipython = ipython_round_trip(&h, &id, n, "ipython_round_trip_1_plus_1").await?;
    let jupyter = Command::new(&python)
        .args(["-c", JUPYTER_BASELINE, &n.to_string()])
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("run {python} for the Jupyter baseline (make tools)"))?;
    anyhow::ensure!(
        jupyter.status.success(),
        "the Jupyter baseline failed: {}",
        String::from_utf8_lossy(&jupyter.stdout)
    );
    let secs: Vec<f64> = serde_json::from_slice(&jupyter.stdout)?;
    rows.push(Row {
        ours: ipython.clone_named("ipython_round_trip_1_plus_1"),
        baseline: Some(Figure {
            name: "jupyter_client + local ipykernel".into(),
            samples: secs.into_iter().map(Duration::from_secs_f64).collect(),
        }),
        bytes: None,
    });

    // Throughput: a command writing 256 MiB to stdout.
    let writer = format!("head -c {THROUGHPUT_BYTES} /dev/zero");
    let ours_tp = stdout_throughput(&h, &id, "stdout_256_mib").await?;
    let docker_tp = measure("docker exec (same command)", 3, 1, long, || {
        let container = container.clone();
        let writer = writer.clone();
        async move {
            timed(
                "docker",
                &["exec", "-u", "1000", &container, "sh", "-c", &writer],
            )
        }
    })
    .await?;
    // What the observation journal costs: the same figures on a runtime whose logs are in memory only
    // (MENTIS_LOG_JOURNAL=off): the round trips measured again on both in turn, stdout throughput beside
    // the journaled figure above.
    let mut memory_only = Harness::start_with(|c| {
        c.log_journal = false;
        c.log_limits.max_bytes = 2 * THROUGHPUT_BYTES as usize;
    })
    .await
    .context("start a runtime without journals")?;
    let plain = memory_only.create_default().await?.sandbox_id;
    settle(&h).await?;
    // The round trips on both, in blocks taken in turn, so both see the machine in the same state.
    let durability_rows = |name: &'static str| {
        [
            (&h, id.as_str(), name),
            (&memory_only, plain.as_str(), "memory-only log"),
        ]
    };
    let two = |figures: Vec<Figure>| -> anyhow::Result<[Figure; 2]> {
        figures
            .try_into()
            .map_err(|_| anyhow::anyhow!("in_turn gives a figure a side"))
    };
    let [shell_journaled, shell_memory] = two(in_turn(
        RoundTrip::Shell,
        &durability_rows("shell_round_trip_journaled"),
        n,
    )
    .await?)?;
    let [ipython_journaled, ipython_memory] = two(in_turn(
        RoundTrip::IPython,
        &durability_rows("ipython_round_trip_journaled"),
        n,
    )
    .await?)?;
    let durability = [
        (shell_journaled, shell_memory, None),
        (ipython_journaled, ipython_memory, None),
        (
            ours_tp.clone_named("stdout_256_mib_journaled"),
            stdout_throughput(&memory_only, &plain, "memory-only log").await?,
            Some(THROUGHPUT_BYTES),
        ),
    ];
    delete(&memory_only, vec![plain]).await?;
    memory_only.stop().await?;
    rows.push(Row {
        ours: ours_tp,
        baseline: Some(docker_tp),
        bytes: Some(THROUGHPUT_BYTES),
    });
    for (ours, baseline, bytes) in durability {
        rows.push(Row {
            ours,
            baseline: Some(baseline),
            bytes,
        });
    }
    delete(&h, vec![id]).await?;

    // Snapshots of a 200 MB workspace, beside tar | zstd.
    let (snapshot_figures, snapshot_sizes) =
        snapshot_rows(&mut h, env_num("BENCH_SNAPSHOT_RUNS", 3)).await?;
    rows.extend(snapshot_figures);

    // Density: hold `density` idle sandboxes (8 created at a time, bounded in time).
    let runtime_rss_before = rss_kib("self").unwrap_or(0);
    let available_before = mem_available_kib();
    let t = Instant::now();
    let budget = Duration::from_secs(600);
    let mut held: Vec<String> = Vec::new();
    let mut failures = 0usize;
    while held.len() < density && t.elapsed() < budget && failures < 10 {
        let batch = (density - held.len()).min(8);
        let creates = (0..batch).map(|_| {
            let mut c = h.sandboxes.clone();
            async move {
                c.create_sandbox(api::CreateSandboxRequest {
                    spec: Some(api::SandboxSpec {
                        idle_policy: api::IdlePolicy::Keep as i32,
                        ..Default::default()
                    }),
                })
                .await
            }
        });
        for r in futures::future::join_all(creates).await {
            match r {
                Ok(resp) => held.push(resp.into_inner().sandbox.unwrap().sandbox_id),
                Err(e) => {
                    failures += 1;
                    eprintln!("density: create failed: {e}");
                }
            }
        }
    }
    let density_secs = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let mut executor_rss: Vec<u64> = held
        .iter()
        .filter_map(|id| executor_rss_kib(id).ok())
        .collect();
    executor_rss.sort_unstable();
    let executor_rss_median = executor_rss
        .get(executor_rss.len() / 2)
        .copied()
        .unwrap_or(0);
    let runtime_rss = rss_kib("self").unwrap_or(0);
    let available_after = mem_available_kib();
    let held_count = held.len();
    let per_sandbox_kib = if held_count > 0 {
        available_before.saturating_sub(available_after) / held_count as u64
    } else {
        0
    };
    // Checks that they are alive, not merely listed.
    let probe = held.first().cloned();
    if let Some(probe) = probe {
        anyhow::ensure!(stdout(&h.sh(&probe, "echo alive").await?) == "alive\n");
    }
    delete(&h, held).await?;

    let mut out = table(&rows);
    out.insert("snapshot_sizes".into(), snapshot_sizes);
    println!(
        "density: {held_count} idle sandboxes held (asked {density}, {failures} failed creates) in {density_secs:.1} s; \
         executor RSS median {executor_rss_median} KiB; host memory per sandbox {per_sandbox_kib} KiB; \
         runtime+bench RSS {runtime_rss_before} -> {runtime_rss} KiB"
    );
    out.insert(
        "density".into(),
        json!({
            "asked": density, "held": held_count, "failed_creates": failures, "seconds": density_secs,
            "executor_rss_median_kib": executor_rss_median, "host_kib_per_sandbox": per_sandbox_kib,
            "runtime_rss_kib_before": runtime_rss_before, "runtime_rss_kib_after": runtime_rss,
        }),
    );
    let path = std::env::var("BENCH_OUT").unwrap_or_else(|_| "target/bench.json".to_owned());
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::Value::Object(out))?,
    )?;
    println!("results written to {path}");
    h.stop().await
}

/// `action` in a running sandbox through Execute, to its end, checked by `check`: a round trip.
/// Prints the table of `rows` (ours beside the baseline: median, p95, ratio; MB/s for throughput rows) and
/// returns the same as JSON entries.
fn table(rows: &[Row]) -> serde_json::Map<String, serde_json::Value> {
    println!(
        "{:<30} {:>5} {:>10} {:>9} | {:<34} {:>5} {:>10} {:>9} | {:>7}",
        "figure", "runs", "median ms", "p95 ms", "baseline", "runs", "median ms", "p95 ms", "ratio"
    );
    let mut out = serde_json::Map::new();
    for r in rows {
        let (om, op) = (ms(r.ours.pct(0.5)), ms(r.ours.pct(0.95)));
        let mut entry = json!({ "runs": r.ours.samples.len(), "median_ms": om, "p95_ms": op });
        match &r.baseline {
            Some(b) => {
                let (bm, bp) = (ms(b.pct(0.5)), ms(b.pct(0.95)));
                let ratio = if bm > 0.0 { om / bm } else { 0.0 };
                println!(
                    "{:<30} {:>5} {:>10.2} {:>9.2} | {:<34} {:>5} {:>10.2} {:>9.2} | {:>7.3}",
                    r.ours.name,
                    r.ours.samples.len(),
                    om,
                    op,
                    b.name,
                    b.samples.len(),
                    bm,
                    bp,
                    ratio
                );
                entry["baseline"] = json!({ "name": b.name, "runs": b.samples.len(), "median_ms": bm, "p95_ms": bp });
                entry["ratio_median"] = json!(ratio);
            }
            None => println!(
                "{:<30} {:>5} {:>10.2} {:>9.2}",
                r.ours.name,
                r.ours.samples.len(),
                om,
                op
            ),
        }
        if let Some(bytes) = r.bytes {
            #[allow(clippy::cast_precision_loss)]
            let mb = bytes as f64 / 1e6;
            let ours_mbs = mb / r.ours.pct(0.5).as_secs_f64();
            let base_mbs = r
                .baseline
                .as_ref()
                .map_or(0.0, |b| mb / b.pct(0.5).as_secs_f64());
            println!(
                "{:<30} {:>5} {:>10.0} MB/s       | {:<34} {:>5} {:>10.0} MB/s      | {:>7.3}",
                "  throughput",
                "",
                ours_mbs,
                "",
                "",
                base_mbs,
                if base_mbs > 0.0 {
                    ours_mbs / base_mbs
                } else {
                    0.0
                }
            );
            entry["ours_mb_per_s"] = json!(ours_mbs);
            entry["baseline_mb_per_s"] = json!(base_mbs);
        }
        out.insert(r.ours.name.clone(), entry);
    }
    out
}

async fn round_trip(
    h: &Harness,
    id: &str,
    n: usize,
    name: &str,
    action: api::Action,
    check: fn(&[api::Observation]) -> anyhow::Result<()>,
) -> anyhow::Result<Figure> {
    measure(name, n, 10, Duration::from_secs(180), || {
        let mut actions = h.actions.clone();
        let id = id.to_owned();
        let action = action.clone();
        async move {
            let t = Instant::now();
            let s = actions
                .execute(api::ExecuteRequest {
                    sandbox_id: id,
                    action: Some(action),
                    action_id: String::new(),
                })
                .await?
                .into_inner();
            let obs = collect(s, Duration::from_secs(60)).await?;
            let elapsed = t.elapsed();
            check(&obs)?;
            Ok(elapsed)
        }
    })
    .await
}

/// `true` in a running sandbox: the shell round trip.
async fn shell_round_trip(h: &Harness, id: &str, n: usize, name: &str) -> anyhow::Result<Figure> {
    round_trip(h, id, n, name, shell_action(cmd("true")), |obs| {
        anyhow::ensure!(cmd_end(obs)?.exit_code == 0);
        Ok(())
    })
    .await
}

/// `true` in the sandbox's persistent session "bench": the session round trip (no bash to start).
async fn session_round_trip(h: &Harness, id: &str, n: usize, name: &str) -> anyhow::Result<Figure> {
    let mut in_session = cmd("true");
    in_session.session = "bench".into();
    round_trip(h, id, n, name, shell_action(in_session), |obs| {
        anyhow::ensure!(cmd_end(obs)?.exit_code == 0);
        Ok(())
    })
    .await
}

/// `true` sent to a local bash through a pipe and its end read back (a marker line): the floor of a shell
/// round trip, for the session figure.
async fn local_bash_round_trip(n: usize) -> anyhow::Result<Figure> {
    use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
    let mut child = tokio::process::Command::new("bash")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .context("start a local bash")?;
    let stdin = child.stdin.take().context("bash stdin")?;
    let lines = BufReader::new(child.stdout.take().context("bash stdout")?).lines();
    let pipe = std::sync::Arc::new(tokio::sync::Mutex::new((stdin, lines)));
    let figure = measure(
        "local bash through a pipe (true)",
        n,
        10,
        Duration::from_secs(60),
        || {
            let pipe = std::sync::Arc::clone(&pipe);
            async move {
                let mut pipe = pipe.lock().await;
                let (stdin, lines) = &mut *pipe;
                let t = Instant::now();
                stdin.write_all(b"true; echo \"end $?\"\n").await?;
                loop {
                    let line = lines.next_line().await?.context("bash ended")?;
                    if line == "end 0" {
                        break;
                    }
                }
                Ok(t.elapsed())
            }
        },
    )
    .await;
    drop(pipe);
    let _ = child.wait().await;
    figure
}

/// A `1+1` cell: the IPython round trip.
async fn ipython_round_trip(h: &Harness, id: &str, n: usize, name: &str) -> anyhow::Result<Figure> {
    round_trip(h, id, n, name, cell("1+1"), |obs| {
        anyhow::ensure!(cell_value(obs).as_deref() == Some("2"), "{obs:?}");
        Ok(())
    })
    .await
}

/// Waits until the pool has its idle members and creates none (at most a minute).
async fn settle(h: &Harness) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while idle_members(h).await? < 2 {
        anyhow::ensure!(Instant::now() < deadline, "the pool did not refill");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// A round trip [`in_turn`] measures.
#[derive(Clone, Copy)]
enum RoundTrip {
    Shell,
    Session,
    IPython,
}

/// `n` round trips of `kind` on each of `sides` (a runtime, its sandbox, the figure's name), in blocks of
/// 25 taken in turn, so that every side sees the machine in the same state: the durability rows, and
/// `BENCH_ONLY=shell`'s A/B.
async fn in_turn(
    kind: RoundTrip,
    sides: &[(&Harness, &str, &str)],
    n: usize,
) -> anyhow::Result<Vec<Figure>> {
    const BLOCK: usize = 25;
    let mut figures: Vec<Figure> = sides
        .iter()
        .map(|(_, _, name)| Figure {
            name: (*name).to_owned(),
            samples: Vec::new(),
        })
        .collect();
    let mut done = 0;
    while done < n {
        let block = BLOCK.min(n - done);
        for (figure, (h, id, _)) in figures.iter_mut().zip(sides) {
            let more = match kind {
                RoundTrip::Shell => shell_round_trip(h, id, block, &figure.name).await?,
                RoundTrip::Session => session_round_trip(h, id, block, &figure.name).await?,
                RoundTrip::IPython => ipython_round_trip(h, id, block, &figure.name).await?,
            };
            figure.samples.extend(more.samples);
        }
        done += block;
    }
    Ok(figures)
}

/// `BENCH_ONLY=shell`: the plain shell and session round trips on the executor image, and on
/// `BENCH_COMPARE_IMAGE` when set, taken in turn.
async fn shell_only(n: usize) -> anyhow::Result<()> {
    let compare = std::env::var("BENCH_COMPARE_IMAGE")
        .ok()
        .filter(|s| !s.is_empty());
    let mut runtimes = vec![(executor_image(), Harness::start().await?)];
    if let Some(image) = compare {
        let tagged = image.clone();
        let h = Harness::start_with(move |c| c.executor_image = tagged)
            .await
            .with_context(|| format!("start a runtime serving {image}"))?;
        runtimes.push((image, h));
    }
    let mut ids = Vec::new();
    for (_, h) in &mut runtimes {
        ids.push(h.create_default().await?.sandbox_id);
    }
    let mut figures = Vec::new();
    for (kind, label) in [(RoundTrip::Shell, "shell"), (RoundTrip::Session, "session")] {
        let names: Vec<String> = runtimes
            .iter()
            .map(|(image, _)| format!("{label} {image}"))
            .collect();
        let sides: Vec<(&Harness, &str, &str)> = runtimes
            .iter()
            .zip(&ids)
            .zip(&names)
            .map(|(((_, h), id), name)| (h, id.as_str(), name.as_str()))
            .collect();
        // Warm-up, not kept.
        in_turn(kind, &sides, 10).await?;
        figures.extend(in_turn(kind, &sides, n).await?);
    }
    println!("true, {n} round trips each                      median ms    p95 ms");
    for f in &figures {
        println!(
            "{:<46} {:>10.2} {:>9.2}",
            f.name,
            ms(f.pct(0.5)),
            ms(f.pct(0.95))
        );
    }
    for ((_, h), id) in runtimes.iter().zip(ids) {
        delete(h, vec![id]).await?;
    }
    for (_, h) in runtimes {
        h.stop().await?;
    }
    Ok(())
}

/// `BENCH_ONLY=throughput`: stdout throughput on a journaled and a memory-only runtime, and `docker exec` of
/// the same command in the journaled runtime's sandbox, runs taken in turn (so all three see the machine in
/// the same state).
async fn throughput_only(runs: usize) -> anyhow::Result<()> {
    let start = |journal: bool| {
        Harness::start_with(move |c| {
            c.log_journal = journal;
            c.log_limits.max_bytes = 2 * THROUGHPUT_BYTES as usize;
        })
    };
    let mut journaled = start(true).await.context("start a journaled runtime")?;
    let mut memory_only = start(false).await.context("start a memory-only runtime")?;
    let a = journaled.create_default().await?.sandbox_id;
    let b = memory_only.create_default().await?.sandbox_id;
    let container = container_of(&a);
    let writer = format!("head -c {THROUGHPUT_BYTES} /dev/zero");
    let docker_exec = || {
        timed(
            "docker",
            &["exec", "-u", "1000", &container, "sh", "-c", &writer],
        )
    };
    let named = |name: &str| Figure {
        name: name.into(),
        samples: Vec::new(),
    };
    let mut ours = named("stdout_256_mib_journaled");
    let mut base = named("memory-only log");
    let mut docker = named("docker exec (same command)");
    // One warm-up each (not kept), then the runs in turn.
    stdout_throughput_runs(&journaled, &a, "warm-up", 1).await?;
    stdout_throughput_runs(&memory_only, &b, "warm-up", 1).await?;
    docker_exec()?;
    for _ in 0..runs {
        ours.samples.extend(
            stdout_throughput_runs(&journaled, &a, "journaled", 1)
                .await?
                .samples,
        );
        base.samples.extend(
            stdout_throughput_runs(&memory_only, &b, "memory-only", 1)
                .await?
                .samples,
        );
        docker.samples.push(docker_exec()?);
    }
    #[allow(clippy::cast_precision_loss)]
    let mb = THROUGHPUT_BYTES as f64 / 1e6;
    let mbs = |f: &Figure, p: f64| mb / f.pct(p).as_secs_f64();
    println!("figure                      runs  median MB/s  p95-time MB/s");
    for f in [&ours, &base, &docker] {
        println!(
            "{:<27} {:>4} {:>12.0} {:>14.0}",
            f.name,
            f.samples.len(),
            mbs(f, 0.5),
            mbs(f, 0.95)
        );
    }
    println!(
        "ratio journaled / memory-only (median throughput): {:.3}",
        mbs(&ours, 0.5) / mbs(&base, 0.5)
    );
    println!(
        "ratio journaled / docker exec (median throughput): {:.3}",
        mbs(&ours, 0.5) / mbs(&docker, 0.5)
    );
    // Run by run (each taken right after the other): how often the journaled stream kept up with Docker's.
    let wins = ours
        .samples
        .iter()
        .zip(&docker.samples)
        .filter(|(o, d)| o <= d)
        .count();
    println!(
        "runs where journaled >= docker exec: {wins} of {}",
        ours.samples.len()
    );
    delete(&journaled, vec![a]).await?;
    delete(&memory_only, vec![b]).await?;
    journaled.stop().await?;
    memory_only.stop().await
}

/// A command writing 256 MiB to stdout, read to its end through Execute.
async fn stdout_throughput(h: &Harness, id: &str, name: &str) -> anyhow::Result<Figure> {
    stdout_throughput_runs(h, id, name, 3).await
}

/// `runs` of [`stdout_throughput`]'s command (with one warm-up run when there are several).
async fn stdout_throughput_runs(
    h: &Harness,
    id: &str,
    name: &str,
    runs: usize,
) -> anyhow::Result<Figure> {
    let writer = format!("head -c {THROUGHPUT_BYTES} /dev/zero");
    let warmup = usize::from(runs > 1);
    measure(name, runs, warmup, Duration::from_secs(180), || {
        let writer = writer.clone();
        async move {
            let t = Instant::now();
            let bytes = stdout_bytes(h, id, &writer).await?;
            let elapsed = t.elapsed();
            anyhow::ensure!(bytes == THROUGHPUT_BYTES, "got {bytes} bytes");
            Ok(elapsed)
        }
    })
    .await
}

/// A command's stdout read to its end through Execute: how many bytes came (an error when no end came).
pub(crate) async fn stdout_bytes(h: &Harness, id: &str, command: &str) -> anyhow::Result<u64> {
    let mut actions = h.actions.clone();
    let mut s = actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.to_owned(),
            action: Some(shell_action(cmd(command))),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let mut bytes = 0u64;
    let mut ended = false;
    while let Some(m) = s.next().await {
        if let Some(api::execute_response::Kind::Observation(o)) = m?.kind {
            match o.kind {
                Some(Kind::CmdOutput(out)) => bytes += out.data.len() as u64,
                Some(Kind::CmdEnd(_)) => ended = true,
                _ => {}
            }
        }
    }
    anyhow::ensure!(ended, "the command did not end (after {bytes} bytes)");
    Ok(bytes)
}

/// `BENCH_TRACES=1`: traces on for this process as `mentis-runtime` turns them on (every trace sampled,
/// executor spans relayed), exported to an OTLP receiver here whose spans are read and dropped.
async fn traces_on() -> anyhow::Result<(
    mentis_runtime::telemetry::Traces,
    tokio::task::JoinHandle<()>,
)> {
    let mut collector = fake_opentelemetry_collector::FakeCollectorServer::start()
        .await
        .map_err(|e| anyhow::anyhow!("cannot start the OTLP receiver: {e}"))?;
    let traces = mentis_runtime::telemetry::Traces::start(&collector.endpoint())?;
    mentis_telemetry::install(
        tracing_subscriber::EnvFilter::new("warn"),
        mentis_telemetry::LogFormat::Text,
        Some(traces.provider()),
        "mentis-runtime",
    )?;
    let drain = tokio::spawn(async move {
        loop {
            collector.exported_spans(1, Duration::from_secs(3600)).await;
        }
    });
    eprintln!("bench: traces on, every trace sampled, exported over OTLP");
    Ok((traces, drain))
}

/// An ext4 filesystem in an image file under target/, mounted on a loop device like a workspace; unmounted
/// and removed when dropped.
struct LoopFs {
    /// Removed (with the image) once unmounted: fields drop after `Drop::drop`.
    _dir: tempfile::TempDir,
    mount: std::path::PathBuf,
}

impl LoopFs {
    fn mount(mib: u64) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir_in("target").context("a folder under target/")?;
        let image = dir.path().join("fs.img");
        let mount = dir.path().join("mnt");
        std::fs::create_dir(&mount)?;
        std::fs::File::create(&image)?.set_len(mib << 20)?;
        let image_s = image.display().to_string();
        timed(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-m",
                "0",
                "-E",
                "lazy_itable_init=1,lazy_journal_init=1",
                &image_s,
            ],
        )?;
        timed(
            "mount",
            &["-o", "loop", &image_s, &mount.display().to_string()],
        )?;
        Ok(Self { _dir: dir, mount })
    }

    fn path(&self) -> &std::path::Path {
        &self.mount
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = timed("umount", &[&self.mount.display().to_string()]);
    }
}

/// The workspace the snapshot figures use: 10,000 files of 20,000 bytes (200 MB) in 100 folders, every other
/// one random bytes (incompressible), the rest slices of a text corpus (compressible), the same bytes on
/// every run (a fixed seed). Usage: python3 - ROOT.
const WORKSPACE_GENERATOR: &str = r#"
import os, random, sys
root = sys.argv[1]
rnd = random.Random(18)
words = [''.join(rnd.choice('abcdefghijklmnopqrstuvwxyz') for _ in range(rnd.randint(2, 9))) for _ in range(2000)]
corpus = ' '.join(rnd.choice(words) for _ in range(250000)).encode()
for i in range(10000):
    folder = os.path.join(root, f'pkg{i % 100:02d}')
    os.makedirs(folder, exist_ok=True)
    if i % 2:
        data = rnd.randbytes(20000)
    else:
        at = rnd.randrange(len(corpus) - 20000)
        data = corpus[at:at + 20000]
    with open(os.path.join(folder, f'f{i:05d}.dat'), 'wb') as f:
        f.write(data)
"#;

/// Snapshot and restore of a 200 MB workspace of 10,000 files, beside `tar | zstd -3` (the level the runtime
/// uses) to a local file and back on this machine, with the same files: CreateSnapshot against tar piped into
/// zstd; CreateSandbox with `snapshot_id` against a plain CreateSandbox plus `zstd -d | tar -x` (each sample of
/// the baseline is one of each, summed), so both sides include making a sandbox.
async fn snapshot_rows(
    h: &mut Harness,
    runs: usize,
) -> anyhow::Result<(Vec<Row>, serde_json::Value)> {
    let long = Duration::from_secs(600);
    let source = h.create_default().await?.sandbox_id;
    let made = h
        .sh(
            &source,
            &format!("python3 - /workspace/tree <<'MENTIS_EOF'\n{WORKSPACE_GENERATOR}\nMENTIS_EOF\nfind /workspace/tree -type f | wc -l; du -sb /workspace/tree | cut -f1"),
        )
        .await?;
    let counted = stdout(&made);
    anyhow::ensure!(
        counted.lines().next() == Some("10000"),
        "the workspace was not made: {counted} {}",
        stderr(&made)
    );
    // The baseline works on the same kind of filesystem as a workspace: ext4 in an image on a loop device
    // (the host's own filesystem may create files at another speed altogether).
    let local = LoopFs::mount(1024)?;
    let tree = local.path().join("tree");
    let generated = Command::new("python3")
        .arg("-")
        .arg(&tree)
        .stdin(Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            use std::io::Write as _;
            child
                .stdin
                .take()
                .context("stdin")
                .map_err(std::io::Error::other)?
                .write_all(WORKSPACE_GENERATOR.as_bytes())?;
            child.wait()
        })
        .context("python3 for the local copy of the workspace")?;
    anyhow::ensure!(generated.success(), "the local workspace was not made");
    let archive = local.path().join("tree.tar.zst");
    let (tree_s, archive_s) = (tree.display().to_string(), archive.display().to_string());

    let taken = std::sync::Arc::new(std::sync::Mutex::new(Vec::<api::Snapshot>::new()));
    let mut snapshots = api::snapshot_service_client::SnapshotServiceClient::new(h.channel.clone());
    let ours_take = measure("snapshot_200mb_10k_files", runs, 1, long, || {
        let mut snapshots = snapshots.clone();
        let (source, taken) = (source.clone(), std::sync::Arc::clone(&taken));
        async move {
            let t = Instant::now();
            let s = snapshots
                .create_snapshot(api::CreateSnapshotRequest {
                    sandbox_id: source,
                    labels: Default::default(),
                })
                .await?
                .into_inner()
                .snapshot
                .context("no snapshot")?;
            let took = t.elapsed();
            taken.lock().unwrap().push(s);
            Ok(took)
        }
    })
    .await?;
    let base_take = measure("tar | zstd -3 > file", runs, 1, long, || {
        let script = format!("tar -C {tree_s} -cf - . | zstd -q -3 -f -o {archive_s}");
        async move { timed("bash", &["-c", &script]) }
    })
    .await?;
    let ours_size = taken.lock().unwrap().last().map_or(0, |s| s.size_bytes);
    let base_size = std::fs::metadata(&archive)?.len();
    let snapshot_id = taken
        .lock()
        .unwrap()
        .last()
        .map(|s| s.snapshot_id.clone())
        .context("no snapshot taken")?;

    let restored = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let client = h.sandboxes.clone();
    let ours_restore = measure("create_from_snapshot_200mb", runs, 1, long, || {
        let mut sandboxes = client.clone();
        let (snapshot_id, restored) = (snapshot_id.clone(), std::sync::Arc::clone(&restored));
        async move {
            let t = Instant::now();
            let sb = sandboxes
                .create_sandbox(api::CreateSandboxRequest {
                    spec: Some(api::SandboxSpec {
                        snapshot_id,
                        ..Default::default()
                    }),
                })
                .await?
                .into_inner()
                .sandbox
                .context("no sandbox")?;
            let took = t.elapsed();
            restored.lock().unwrap().push(sb.sandbox_id);
            Ok(took)
        }
    })
    .await?;
    // The restored workspace is the one taken: every file, every byte.
    let probe = restored
        .lock()
        .unwrap()
        .first()
        .cloned()
        .context("no restore")?;
    let sums = "cd /workspace/tree && find . -type f | sort | xargs sha256sum | sha256sum";
    let (theirs, ours) = (
        stdout(&h.sh(&source, sums).await?),
        stdout(&h.sh(&probe, sums).await?),
    );
    anyhow::ensure!(theirs == ours, "the restored workspace differs");
    let extracted = local.path().join("out");
    let out_s = extracted.display().to_string();
    // The baseline's two parts, to tell them apart in the output.
    let parts = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(Duration, Duration)>::new()));
    let base_restore = measure("CreateSandbox + zstd -d | tar -x", runs, 1, long, || {
        let parts = std::sync::Arc::clone(&parts);
        let mut sandboxes = client.clone();
        let restored = std::sync::Arc::clone(&restored);
        let script = format!(
            "rm -rf {out_s} && mkdir {out_s} && zstd -q -dc {archive_s} | tar -C {out_s} -xf -"
        );
        async move {
            let t = Instant::now();
            let sb = sandboxes
                .create_sandbox(api::CreateSandboxRequest {
                    spec: Some(api::SandboxSpec::default()),
                })
                .await?
                .into_inner()
                .sandbox
                .context("no sandbox")?;
            let create = t.elapsed();
            restored.lock().unwrap().push(sb.sandbox_id);
            let extract = timed("bash", &["-c", &script])?;
            parts.lock().unwrap().push((create, extract));
            Ok(create + extract)
        }
    })
    .await?;
    let ids = std::mem::take(&mut *restored.lock().unwrap());
    delete(h, ids).await?;
    delete(h, vec![source]).await?;
    let all = std::mem::take(&mut *taken.lock().unwrap());
    for s in all {
        snapshots
            .delete_snapshot(api::DeleteSnapshotRequest {
                snapshot_id: s.snapshot_id,
            })
            .await?;
    }
    let (mut creates, mut extracts): (Vec<Duration>, Vec<Duration>) =
        parts.lock().unwrap().iter().copied().unzip();
    creates.sort();
    extracts.sort();
    let (create_ms, extract_ms) = (
        ms(creates.get(creates.len() / 2).copied().unwrap_or_default()),
        ms(extracts
            .get(extracts.len() / 2)
            .copied()
            .unwrap_or_default()),
    );
    let sizes = json!({
        "snapshot_bytes": ours_size, "tar_zstd_bytes": base_size, "workspace_bytes": 200_000_000u64,
        "files": 10_000, "baseline_create_median_ms": create_ms, "baseline_extract_median_ms": extract_ms,
    });
    println!(
        "snapshot archive {ours_size} bytes; tar | zstd -3 {base_size} bytes (200 MB of files, half of them random); \
         the restore baseline's parts: CreateSandbox {create_ms:.0} ms, zstd -d | tar -x into {} {extract_ms:.0} ms (medians)",
        local.path().display()
    );
    Ok((
        vec![
            Row {
                ours: ours_take,
                baseline: Some(base_take),
                bytes: Some(200_000_000),
            },
            Row {
                ours: ours_restore,
                baseline: Some(base_restore),
                bytes: None,
            },
        ],
        sizes,
    ))
}
