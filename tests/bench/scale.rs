//! `make bench-scale` (`BENCH_ONLY=scale`): the runtime at scale (issue 36), each figure beside its baseline
//! measured in the same run. The release runtime runs as a process of its own (`target/release/
//! mentis-runtime`, next to this binary), a new one per part, so its memory and CPU time are read from /proc.
//! `SCALE_PARTS` (comma-separated, default `bursts,concurrency,density,output`) picks the parts:
//!
//! - **bursts**: `SCALE_BURST` (50) CreateSandbox at once with no pool, against as many `docker run -d` at
//!   once of the same image (on the default bridge network, as a user types it; with `--network none`; and
//!   on `mentis-net`, the sandboxes' network, where Docker sets up its embedded DNS in each container),
//!   taken in turn `SCALE_BURST_ROUNDS` (2) times; then the same burst on a runtime whose pool holds
//!   `SCALE_BURST_POOL` (10) warm members (the first ones warm, the rest cold). Time until all returned,
//!   p50 and p99 of each, and where each create went by the engine's events: from the request to the
//!   container's create, from its create to its start, from its start to the answer.
//! - **concurrency**: `SCALE_CLIENTS` (100) clients, each on a sandbox of its own, running a shell command
//!   and an IPython cell in turn for `SCALE_SECONDS` (60): actions per second, p50/p99/p99.9 of each kind,
//!   errors of any kind; one more client's shell round trip while they run against the same when idle; and
//!   as many concurrent loops of `docker exec CONTAINER echo` into the same containers for the same time.
//!   The runtime's CPU time per action, and with `SCALE_PERF=1` a `perf record` of it during the load
//!   (`target/scale-perf.data`; the release runtime is stripped: build it with
//!   `CARGO_PROFILE_RELEASE_STRIP=false CARGO_PROFILE_RELEASE_DEBUG=line-tables-only` for symbols and
//!   stacks). Then the same clients paced at `SCALE_PACED_FRACTION` (0.5) of the rate they reached, each on
//!   a fixed schedule, and the one more client's round trip under that load.
//! - **density**: `SCALE_SANDBOXES` (1000) idle sandboxes held (no pool): creates per second while filling
//!   (`SCALE_CREATE_CONCURRENCY`, 8, at once), host memory (MemAvailable) and runtime memory per sandbox,
//!   the runtime's CPU while they sit idle (health watches, reapers), and the shell round trip on
//!   one of them with all the others there, against the same with it alone before they came and after they
//!   went (the machine drifts over a run this long); beside it the same for an
//!   IPython cell (no process started) and for a health check straight to its executor (no runtime). `SCALE_DISK_LIMITS=off` runs
//!   every part with workspaces that have no disk of their own (no loop device each).
//! - **output**: the runtime's CPU time per observation byte of a command's stdout (`SCALE_OUTPUT_MIB`,
//!   256, journaled, read to its end), against the engine's (dockerd, containerd and the shims) per byte of
//!   `docker exec` of the same command into the same container, `SCALE_OUTPUT_RUNS` (3) runs in turn
//!   (`SCALE_PERF=1`: a `perf record` of the runtime in `target/scale-output-perf.data`).
//!
//! JSON in `BENCH_OUT` (default target/scale.json).

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use mentis_e2e::*;
use mentis_proto::api;
use serde_json::{Value, json};

use crate::capacity::{cpu_time, rss};
use crate::{env_num, mem_available_kib, stdout_bytes};

/// A runtime process of its own and a client of it.
struct Scaled {
    runtime: RuntimeProcess,
    h: Harness,
}

impl Scaled {
    /// `env` over the runtime's defaults (health checks every 5 s, as an operator's; warnings only in its
    /// log).
    async fn start(env: &[(&str, &str)]) -> anyhow::Result<Self> {
        let mut env = env.to_vec();
        env.extend([("MENTIS_HEALTH_INTERVAL_SECS", "5"), ("RUST_LOG", "warn")]);
        // `SCALE_DISK_LIMITS=off`: workspaces without a disk of their own (no loop device each).
        let disk_limits = std::env::var("SCALE_DISK_LIMITS").unwrap_or_else(|_| "loop".to_owned());
        env.push(("MENTIS_DISK_LIMITS", disk_limits.as_str()));
        let bin = std::env::current_exe()?
            .parent()
            .context("the bench's folder")?
            .join("mentis-runtime");
        if !bin.exists() {
            bail!("{} is missing: `make bench-scale` builds it", bin.display());
        }
        let guard = Harness::new_instance();
        let instance = guard.instance.clone();
        let data_dir = tempfile::tempdir()?;
        let runtime = RuntimeProcess::start_with_env(
            &bin.display().to_string(),
            &instance,
            data_dir.path(),
            &env,
        )
        .await?;
        let h = runtime.harness(data_dir, guard).await?;
        Ok(Self { runtime, h })
    }

    fn pid(&self) -> u32 {
        self.runtime.pid()
    }
}

/// Durations in ms, sorted, with percentiles.
struct Latencies(Vec<f64>);

impl Latencies {
    fn new(mut v: Vec<Duration>) -> Self {
        let mut ms: Vec<f64> = v.drain(..).map(|d| d.as_secs_f64() * 1000.0).collect();
        ms.sort_by(f64::total_cmp);
        Self(ms)
    }

    fn pct(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((self.0.len() - 1) as f64 * p).round() as usize;
        self.0[i]
    }

    fn max(&self) -> f64 {
        self.0.last().copied().unwrap_or(f64::NAN)
    }

    fn json(&self) -> Value {
        json!({
            "n": self.0.len(),
            "p50_ms": self.pct(0.5),
            "p99_ms": self.pct(0.99),
            "p999_ms": self.pct(0.999),
            "max_ms": self.max(),
        })
    }

    fn line(&self) -> String {
        format!(
            "n {:>6}  p50 {:>8.2} ms  p99 {:>8.2} ms  p99.9 {:>8.2} ms  max {:>8.2} ms",
            self.0.len(),
            self.pct(0.5),
            self.pct(0.99),
            self.pct(0.999),
            self.max()
        )
    }
}

/// Makes `n` sandboxes, `at_once` at a time; their ids and each create's time.
async fn fill(
    h: &Harness,
    n: usize,
    at_once: usize,
    spec: &api::SandboxSpec,
) -> anyhow::Result<(Vec<String>, Vec<Duration>)> {
    let mut ids = Vec::with_capacity(n);
    let mut times = Vec::with_capacity(n);
    while ids.len() < n {
        let batch = (n - ids.len()).min(at_once.max(1));
        let made = futures::future::join_all((0..batch).map(|_| create_one(h, spec.clone()))).await;
        for m in made {
            let (id, t) = m?;
            ids.push(id);
            times.push(t);
        }
    }
    Ok((ids, times))
}

async fn create_one(h: &Harness, spec: api::SandboxSpec) -> anyhow::Result<(String, Duration)> {
    let mut client = h.sandboxes.clone();
    let t = Instant::now();
    let sb = client
        .create_sandbox(api::CreateSandboxRequest { spec: Some(spec) })
        .await
        .context("a create failed")?
        .into_inner()
        .sandbox
        .context("no sandbox")?;
    Ok((sb.sandbox_id, t.elapsed()))
}

/// Deletes `ids`, 16 at a time.
async fn remove(h: &Harness, ids: &[String]) -> anyhow::Result<()> {
    for chunk in ids.chunks(16) {
        let done = futures::future::join_all(chunk.iter().map(|id| {
            let mut client = h.sandboxes.clone();
            let id = id.clone();
            async move {
                client
                    .delete_sandbox(api::DeleteSandboxRequest { sandbox_id: id })
                    .await
            }
        }))
        .await;
        for d in done {
            d.context("a delete failed")?;
        }
    }
    Ok(())
}

/// One shell `echo` round trip.
async fn shell_once(h: &Harness, id: &str) -> anyhow::Result<Duration> {
    let mut actions = h.actions.clone();
    let t = Instant::now();
    let s = actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.to_owned(),
            action: Some(shell_action(cmd("echo scale"))),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let obs = collect(s, Duration::from_secs(60)).await?;
    let elapsed = t.elapsed();
    anyhow::ensure!(stdout(&obs) == "scale\n", "{obs:?}");
    anyhow::ensure!(cmd_end(&obs)?.exit_code == 0, "{obs:?}");
    Ok(elapsed)
}

/// One `1+1` cell round trip.
async fn cell_once(h: &Harness, id: &str) -> anyhow::Result<Duration> {
    let mut actions = h.actions.clone();
    let t = Instant::now();
    let s = actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.to_owned(),
            action: Some(cell("1+1")),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let obs = collect(s, Duration::from_secs(120)).await?;
    let elapsed = t.elapsed();
    anyhow::ensure!(cell_value(&obs).as_deref() == Some("2"), "{obs:?}");
    Ok(elapsed)
}

/// `n` round trips of `once` on one sandbox, one after the other (after 10 unmeasured; for cells the first
/// of them starts the kernel).
async fn round_trips<F: std::future::Future<Output = anyhow::Result<Duration>>>(
    n: usize,
    once: impl Fn() -> F,
) -> anyhow::Result<Latencies> {
    for _ in 0..10 {
        once().await?;
    }
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(once().await?);
    }
    Ok(Latencies::new(v))
}

/// `n` shell round trips on one sandbox.
async fn shell_round_trips(h: &Harness, id: &str, n: usize) -> anyhow::Result<Latencies> {
    round_trips(n, || shell_once(h, id)).await
}

/// `n` `1+1` cell round trips on one sandbox.
async fn cell_round_trips(h: &Harness, id: &str, n: usize) -> anyhow::Result<Latencies> {
    round_trips(n, || cell_once(h, id)).await
}

/// `n` `grpc.health.v1` checks straight from here to the sandbox's executor over the engine's bridge (no
/// runtime in the way, no process started): the network path's own share of a round trip.
async fn direct_round_trips(id: &str, n: usize) -> anyhow::Result<Latencies> {
    let ip = docker(&[
        "inspect",
        "-f",
        "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}",
        &format!("mentis-{id}"),
    ])?;
    let ip = ip
        .split_whitespace()
        .next()
        .context("the sandbox's container has no address")?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{ip}:50052"))?
        .tcp_nodelay(true)
        .connect()
        .await?;
    let health = tonic_health::pb::health_client::HealthClient::new(channel);
    round_trips(n, || {
        let mut health = health.clone();
        async move {
            let t = Instant::now();
            health
                .check(tonic_health::pb::HealthCheckRequest::default())
                .await?;
            Ok(t.elapsed())
        }
    })
    .await
}

/// Runs `docker` with `args` `n` times at once (each from a thread of its own), labelled containers made
/// for `instance` (its guard removes them if the bench stops early); each run's container id (what
/// `docker run -d` prints) and time.
fn docker_at_once(n: usize, args: &[String]) -> anyhow::Result<Vec<(String, Duration)>> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            let args = args.to_vec();
            std::thread::spawn(move || {
                let t = Instant::now();
                let out = std::process::Command::new("docker").args(&args).output()?;
                anyhow::ensure!(
                    out.status.success(),
                    "docker {}: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr)
                );
                Ok((
                    String::from_utf8_lossy(&out.stdout).trim().to_owned(),
                    t.elapsed(),
                ))
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| {
            h.join()
                .map_err(|_| anyhow::anyhow!("a docker thread panicked"))?
        })
        .collect()
}

/// Removes every container labelled `io.mentis.scale=<run>`.
fn remove_labelled(run: &str) {
    if let Ok(ids) = docker(&[
        "ps",
        "-aq",
        "--filter",
        &format!("label=io.mentis.scale={run}"),
    ]) {
        let ids: Vec<&str> = ids.split_whitespace().collect();
        for chunk in ids.chunks(50) {
            let mut args = vec!["rm", "-f"];
            args.extend(chunk);
            let _ = docker(&args);
        }
    }
}

/// Nanoseconds since the epoch.
fn epoch_nanos(t: SystemTime) -> u128 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos()
}

/// When the engine created and started a container (nanoseconds since the epoch), from its events.
type Made = (Option<u128>, Option<u128>);

/// When the engine created and started each container labelled `label` between `since` and `until`
/// (its events), under both its id and its name.
fn container_events(
    since: SystemTime,
    until: SystemTime,
    label: &str,
) -> anyhow::Result<BTreeMap<String, Made>> {
    let stamp = |t: SystemTime| {
        let n = epoch_nanos(t);
        format!("{}.{:09}", n / 1_000_000_000, n % 1_000_000_000)
    };
    let out = docker(&[
        "events",
        "--since",
        &stamp(since),
        "--until",
        &stamp(until + Duration::from_secs(1)),
        "--filter",
        "type=container",
        "--filter",
        &format!("label={label}"),
        "--format",
        "{{.TimeNano}} {{.Action}} {{.Actor.ID}} {{.Actor.Attributes.name}}",
    ])?;
    let mut seen: BTreeMap<String, Made> = BTreeMap::new();
    for line in out.lines() {
        let mut f = line.split_whitespace();
        let (Some(at), Some(action), Some(id), name) = (f.next(), f.next(), f.next(), f.next())
        else {
            continue;
        };
        let Ok(at) = at.parse::<u128>() else { continue };
        for key in std::iter::once(id).chain(name) {
            let e = seen.entry(key.to_owned()).or_default();
            match action {
                "create" => e.0 = e.0.or(Some(at)),
                "start" => e.1 = e.1.or(Some(at)),
                _ => {}
            }
        }
    }
    Ok(seen)
}

/// Where a burst's creates spent their time, from the engine's events: from the request to the engine's
/// create of the container, from its create to its start, from its start to the answer.
#[derive(Default)]
struct Phases {
    to_create: Vec<Duration>,
    to_start: Vec<Duration>,
    to_answer: Vec<Duration>,
}

impl Phases {
    /// One create asked at `asked` that answered after `took`; `events` are its container's.
    fn add(&mut self, asked: SystemTime, took: Duration, events: Option<&Made>) {
        let Some(&(Some(created), Some(started))) = events else {
            return;
        };
        let asked = epoch_nanos(asked);
        let answered = asked + took.as_nanos();
        let span = |a: u128, b: u128| {
            Duration::from_nanos(u64::try_from(b.saturating_sub(a)).unwrap_or(u64::MAX))
        };
        self.to_create.push(span(asked, created));
        self.to_start.push(span(created, started));
        self.to_answer.push(span(started, answered));
    }

    fn line(self) -> String {
        let n = self.to_create.len();
        format!(
            "{n} seen; request to create {}; create to start {}; start to answer {}",
            Latencies::new(self.to_create).line(),
            Latencies::new(self.to_start).line(),
            Latencies::new(self.to_answer).line()
        )
    }
}

/// One burst of `n` `docker run -d` with `args` at once: its time to all done, each run's time, and where
/// they went.
async fn docker_burst(
    n: usize,
    args: &[String],
    label: &str,
    run: &str,
    phases: &mut Phases,
) -> anyhow::Result<(Duration, Vec<Duration>)> {
    let cpu = cpu_by_command(true);
    let asked = SystemTime::now();
    let t = Instant::now();
    let runs = tokio::task::spawn_blocking({
        let args = args.to_vec();
        move || docker_at_once(n, &args)
    })
    .await??;
    let all = t.elapsed();
    println!(
        "bursts: docker {}: {}",
        args[..3].join(" "),
        cpu_line(&cpu_grown(&cpu))
    );
    let events = container_events(asked, SystemTime::now(), label)?;
    for (id, took) in &runs {
        phases.add(asked, *took, events.get(id));
    }
    remove_labelled(run);
    Ok((all, runs.into_iter().map(|(_, d)| d).collect()))
}

/// The median of `v` (0 when empty).
fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let mid = v.len() / 2;
    if v.is_empty() {
        0.0
    } else if v.len().is_multiple_of(2) {
        (v[mid - 1] + v[mid]) / 2.0
    } else {
        v[mid]
    }
}

/// The median of `v`, in seconds.
fn median_secs(v: &[Duration]) -> f64 {
    median(v.iter().map(Duration::as_secs_f64).collect())
}

async fn bursts() -> anyhow::Result<Value> {
    let n = env_num("SCALE_BURST", 50);
    let rounds = env_num("SCALE_BURST_ROUNDS", 2);
    let pool = env_num("SCALE_BURST_POOL", 10);
    let max = (n + pool + 16).to_string();
    let cold = Scaled::start(&[("MENTIS_MAX_SANDBOXES", max.as_str())]).await?;
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    let label = format!("io.mentis.instance={}", cold.h.guard.instance);
    // `docker run -d` as a user types it (the default bridge network), and with no network at all.
    let docker_args = |network: Option<&str>| -> Vec<String> {
        let mut args = vec!["run".to_owned(), "-d".to_owned()];
        if let Some(network) = network {
            args.extend(["--network".to_owned(), network.to_owned()]);
        }
        args.extend(
            [
                "--label",
                &format!("io.mentis.scale={run}"),
                "--label",
                &label,
                "--entrypoint",
                "sleep",
                &executor_image(),
                "infinity",
            ]
            .iter()
            .map(|s| (*s).to_owned()),
        );
        args
    };
    // And on the network a sandbox is on (a network of its own, with Docker's embedded DNS set up in each
    // container), the same engine work as ours.
    let (bridged, unnetworked, ours_net) = (
        docker_args(None),
        docker_args(Some("none")),
        docker_args(Some("mentis-net")),
    );
    let mut ours = Vec::new();
    let mut ours_all = Vec::new();
    let mut ours_phases = Phases::default();
    let mut theirs = Vec::new();
    let mut theirs_all = Vec::new();
    let mut theirs_phases = Phases::default();
    let mut bare_all = Vec::new();
    let mut bare_phases = Phases::default();
    let mut net_all = Vec::new();
    let mut net_phases = Phases::default();
    for round in 0..rounds {
        let cpu = cpu_by_command(true);
        let asked = SystemTime::now();
        let t = Instant::now();
        let made = futures::future::join_all(
            (0..n).map(|_| create_one(&cold.h, api::SandboxSpec::default())),
        )
        .await;
        let all = t.elapsed();
        println!("bursts: ours: {}", cpu_line(&cpu_grown(&cpu)));
        let events = container_events(asked, SystemTime::now(), &label)?;
        let mut ids = Vec::new();
        for m in made {
            let (id, d) = m?;
            ours_phases.add(asked, d, events.get(&format!("mentis-{id}")));
            ids.push(id);
            ours.push(d);
        }
        ours_all.push(all);
        remove(&cold.h, &ids).await?;
        let (all, runs) = docker_burst(n, &bridged, &label, &run, &mut theirs_phases).await?;
        theirs_all.push(all);
        theirs.extend(runs);
        let (all, _) = docker_burst(n, &unnetworked, &label, &run, &mut bare_phases).await?;
        bare_all.push(all);
        let (all, _) = docker_burst(n, &ours_net, &label, &run, &mut net_phases).await?;
        net_all.push(all);
        println!(
            "bursts: round {}: {n} creates at once {:.2} s, {n} docker run -d at once {:.2} s (--network none \
             {:.2} s, --network mentis-net {:.2} s)",
            round + 1,
            ours_all[round].as_secs_f64(),
            theirs_all[round].as_secs_f64(),
            bare_all[round].as_secs_f64(),
            net_all[round].as_secs_f64()
        );
    }
    drop(cold);

    // With a pool: the first `pool` claims are warm, the rest cold.
    let pool_setting = format!("default={pool}:{pool}");
    let warm = Scaled::start(&[
        ("MENTIS_MAX_SANDBOXES", max.as_str()),
        ("MENTIS_POOL", pool_setting.as_str()),
    ])
    .await?;
    warm.h
        .wait_pool_idle("", u32::try_from(pool)?, Duration::from_secs(300))
        .await?;
    let t = Instant::now();
    let made =
        futures::future::join_all((0..n).map(|_| create_one(&warm.h, api::SandboxSpec::default())))
            .await;
    let pooled_all = t.elapsed();
    let mut pooled = Vec::new();
    let mut ids = Vec::new();
    for m in made {
        let (id, d) = m?;
        ids.push(id);
        pooled.push(d);
    }
    remove(&warm.h, &ids).await?;
    drop(warm);

    let ours = Latencies::new(ours);
    let theirs = Latencies::new(theirs);
    let pooled = Latencies::new(pooled);
    let (ours_med, theirs_med, bare_med, net_med) = (
        median_secs(&ours_all),
        median_secs(&theirs_all),
        median_secs(&bare_all),
        median_secs(&net_all),
    );
    println!(
        "bursts: {n} at once, no pool: all done {ours_med:.2} s (median of {rounds}), each {}",
        ours.line()
    );
    println!(
        "bursts: {n} docker run -d at once: all done {theirs_med:.2} s, each {}",
        theirs.line()
    );
    println!("bursts: {n} docker run -d --network none at once: all done {bare_med:.2} s");
    println!(
        "bursts: {n} docker run -d --network mentis-net at once: all done {net_med:.2} s (ratio ours / it: {:.3}; \
         goal on the sandboxes' own network, the same engine work: at most 1.2)",
        ours_med / net_med
    );
    println!(
        "bursts: ratio ours / docker run -d (all done): {:.3} (the issue's goal: at most 1.2; Docker's \
         embedded DNS on a network of our own is the gap, docs/PERFORMANCE.md); ours / docker run -d \
         --network none: {:.3}",
        ours_med / theirs_med,
        ours_med / bare_med
    );
    println!("bursts: where ours went: {}", ours_phases.line());
    println!("bursts: where docker run -d went: {}", theirs_phases.line());
    println!(
        "bursts: where docker run -d --network none went: {}",
        bare_phases.line()
    );
    println!(
        "bursts: where docker run -d --network mentis-net went: {}",
        net_phases.line()
    );
    println!(
        "bursts: {n} at once, pool of {pool}: all done {:.2} s, each {}",
        pooled_all.as_secs_f64(),
        pooled.line()
    );
    let secs = |v: &[Duration]| v.iter().map(Duration::as_secs_f64).collect::<Vec<_>>();
    Ok(json!({
        "burst": n,
        "rounds": rounds,
        "cold_all_done_s": secs(&ours_all),
        "cold_each": ours.json(),
        "docker_run_all_done_s": secs(&theirs_all),
        "docker_run_each": theirs.json(),
        "docker_run_no_network_all_done_s": secs(&bare_all),
        "ratio_all_done_median": ours_med / theirs_med,
        "ratio_all_done_median_no_network": ours_med / bare_med,
        "docker_run_mentis_net_all_done_s": secs(&net_all),
        "ratio_all_done_median_mentis_net": ours_med / net_med,
        "pool": pool,
        "pooled_all_done_s": pooled_all.as_secs_f64(),
        "pooled_each": pooled.json(),
    }))
}

/// With `SCALE_PERF=1`, a `perf record` of a process from its start to its stop (DWARF stacks: a release
/// build keeps no frame pointers).
struct Perf(Option<std::process::Child>);

impl Perf {
    fn start(pid: u32, out: &str) -> anyhow::Result<Self> {
        if std::env::var("SCALE_PERF").as_deref() != Ok("1") {
            return Ok(Self(None));
        }
        let child = std::process::Command::new("perf")
            .args(["record", "-F", "199", "--call-graph", "dwarf,16384", "-p"])
            .arg(pid.to_string())
            .args(["-o", out])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .context("start perf")?;
        println!("perf: recording process {pid} into {out}");
        Ok(Self(Some(child)))
    }

    /// Ends the recording as Ctrl-C would, and waits for perf to write it out.
    fn stop(mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = std::process::Command::new("kill")
                .args(["-INT", &child.id().to_string()])
                .status();
            let _ = child.wait();
        }
    }
}

/// Each worker's shell commands and cells in turn until `deadline` (one every `pace` when given, else
/// back to back), beside a probe's shell round trip every 100 ms: each worker's shell and cell times and
/// errors, and the probe's times and errors.
#[allow(clippy::type_complexity)]
async fn load_window(
    h: &Harness,
    workers: &[String],
    probe: &str,
    deadline: Instant,
    pace: Option<Duration>,
) -> (
    Vec<(Vec<Duration>, Vec<Duration>, Vec<String>)>,
    (Vec<Duration>, Vec<String>),
) {
    let load = futures::future::join_all(workers.iter().enumerate().map(|(i, id)| async move {
        let mut shells = Vec::new();
        let mut cells = Vec::new();
        let mut errors = Vec::new();
        let mut turn = 0u64;
        // Paced workers start spread over one period, so their actions do not come in waves.
        let mut next = tokio::time::Instant::now();
        if let Some(pace) = pace {
            #[allow(clippy::cast_possible_truncation)]
            let offset = pace * (i as u32) / (workers.len().max(1) as u32);
            next += offset;
            tokio::time::sleep_until(next).await;
        }
        while Instant::now() < deadline {
            turn += 1;
            let r = if turn % 2 == 1 {
                shell_once(h, id).await.map(|d| shells.push(d))
            } else {
                cell_once(h, id).await.map(|d| cells.push(d))
            };
            if let Err(e) = r {
                errors.push(format!("{e:#}"));
            }
            if let Some(pace) = pace {
                // A fixed schedule: a late action is not made up for by a burst.
                next += pace;
                let now = tokio::time::Instant::now();
                while next < now {
                    next += pace;
                }
                tokio::time::sleep_until(next).await;
            }
        }
        (shells, cells, errors)
    }));
    let probing = async {
        let mut v = Vec::new();
        let mut errors = Vec::new();
        while Instant::now() < deadline {
            match shell_once(h, probe).await {
                Ok(d) => v.push(d),
                Err(e) => errors.push(format!("{e:#}")),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        (v, errors)
    };
    tokio::join!(load, probing)
}

async fn concurrency() -> anyhow::Result<Value> {
    let clients = env_num("SCALE_CLIENTS", 100);
    let secs = env_num("SCALE_SECONDS", 60);
    let window = Duration::from_secs(secs as u64);
    let max = (clients + 16).to_string();
    let s = Scaled::start(&[("MENTIS_MAX_SANDBOXES", max.as_str())]).await?;
    let pid = s.pid();
    let h = &s.h;
    let (ids, _) = fill(h, clients + 1, 8, &api::SandboxSpec::default()).await?;
    let probe = ids[clients].clone();
    let workers = &ids[..clients];
    // Every kernel started before the window (the first cell starts it).
    for chunk in workers.chunks(8) {
        for r in futures::future::join_all(chunk.iter().map(|id| cell_once(h, id))).await {
            r?;
        }
    }
    let idle = shell_round_trips(h, &probe, 100).await?;

    let cpu0 = cpu_time(pid)?;
    let perf = Perf::start(pid, "target/scale-perf.data")?;
    let started = Instant::now();
    let (results, (probe_times, probe_errors)) =
        load_window(h, workers, &probe, started + window, None).await;
    let elapsed = started.elapsed();
    let cpu = cpu_time(pid)? - cpu0;
    perf.stop();
    let mut shells = Vec::new();
    let mut cells = Vec::new();
    let mut errors: Vec<String> = probe_errors;
    for (s, c, e) in results {
        shells.extend(s);
        cells.extend(c);
        errors.extend(e);
    }
    let actions = shells.len() + cells.len();
    let mut all = shells.clone();
    all.extend(cells.iter().copied());
    let (shells, cells, all) = (
        Latencies::new(shells),
        Latencies::new(cells),
        Latencies::new(all),
    );
    let under_load = Latencies::new(probe_times);
    #[allow(clippy::cast_precision_loss)]
    let per_sec = actions as f64 / elapsed.as_secs_f64();
    #[allow(clippy::cast_precision_loss)]
    let cpu_ms_per_action = cpu.as_secs_f64() * 1000.0 / actions.max(1) as f64;

    // The same clients paced at a fraction of the rate just measured (each on a fixed schedule, whatever
    // its answers' times): one more client's round trip there, where the machine has room.
    let fraction: f64 = std::env::var("SCALE_PACED_FRACTION")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.5);
    #[allow(clippy::cast_precision_loss)]
    let pace = Duration::from_secs_f64(clients as f64 / (per_sec * fraction).max(0.001));
    let paced_started = Instant::now();
    let (paced_results, (paced_probe, paced_probe_errors)) =
        load_window(h, workers, &probe, paced_started + window, Some(pace)).await;
    let paced_elapsed = paced_started.elapsed();
    let mut paced_actions = 0usize;
    let mut paced_errors = paced_probe_errors;
    let mut paced_all = Vec::new();
    for (s, c, e) in paced_results {
        paced_actions += s.len() + c.len();
        paced_all.extend(s);
        paced_all.extend(c);
        paced_errors.extend(e);
    }
    #[allow(clippy::cast_precision_loss)]
    let paced_per_sec = paced_actions as f64 / paced_elapsed.as_secs_f64();
    let paced_all = Latencies::new(paced_all);
    let paced_probe = Latencies::new(paced_probe);

    // The baseline: as many concurrent loops of `docker exec` into the same containers.
    let containers: Vec<String> = workers.iter().map(|id| container_of(id)).collect();
    let docker_deadline = Instant::now() + window;
    let docker_started = Instant::now();
    let loops: Vec<_> = containers
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let mut times = Vec::new();
                let mut errors = 0usize;
                while Instant::now() < docker_deadline {
                    let t = Instant::now();
                    match std::process::Command::new("docker")
                        .args(["exec", "-u", "1000", &c, "echo", "scale"])
                        .output()
                    {
                        Ok(o) if o.status.success() && o.stdout == b"scale\n" => {
                            times.push(t.elapsed());
                        }
                        _ => errors += 1,
                    }
                }
                (times, errors)
            })
        })
        .collect();
    let mut docker_times = Vec::new();
    let mut docker_errors = 0usize;
    for l in loops {
        let (t, e) = l
            .join()
            .map_err(|_| anyhow::anyhow!("a docker exec loop panicked"))?;
        docker_times.extend(t);
        docker_errors += e;
    }
    let docker_elapsed = docker_started.elapsed();
    #[allow(clippy::cast_precision_loss)]
    let docker_per_sec = docker_times.len() as f64 / docker_elapsed.as_secs_f64();
    let docker_lat = Latencies::new(docker_times);

    println!(
        "concurrency: {clients} clients for {:.0} s: {actions} actions, {per_sec:.0}/s, {} errors; runtime CPU \
         {cpu_ms_per_action:.2} ms per action",
        elapsed.as_secs_f64(),
        errors.len()
    );
    println!("concurrency: all     {}", all.line());
    println!("concurrency: shell   {}", shells.line());
    println!("concurrency: cells   {}", cells.line());
    println!(
        "concurrency: one more client's shell round trip: idle {}, under the saturating load {} (ratio of p50 {:.2})",
        idle.line(),
        under_load.line(),
        under_load.pct(0.5) / idle.pct(0.5)
    );
    println!(
        "concurrency: paced at {fraction} of that rate ({clients} clients, one action each every {:.0} ms): \
         {paced_per_sec:.0} actions/s, {} errors, each {}",
        pace.as_secs_f64() * 1000.0,
        paced_errors.len(),
        paced_all.line()
    );
    println!(
        "concurrency: one more client's shell round trip: idle {}, under the paced load {} (ratio of p50 \
         {:.2}; goal: at most 3)",
        idle.line(),
        paced_probe.line(),
        paced_probe.pct(0.5) / idle.pct(0.5)
    );
    println!(
        "concurrency: p99 / p50 of all actions {:.1} (goal: under 10)",
        all.pct(0.99) / all.pct(0.5)
    );
    println!(
        "concurrency: {clients} loops of docker exec: {} execs, {docker_per_sec:.0}/s, {docker_errors} errors, each {}",
        docker_lat.0.len(),
        docker_lat.line()
    );
    let mut first_errors: BTreeMap<String, usize> = BTreeMap::new();
    for e in errors.iter().chain(&paced_errors) {
        *first_errors
            .entry(e.chars().take(200).collect())
            .or_default() += 1;
    }
    for (e, n) in &first_errors {
        println!("concurrency: error ({n}x): {e}");
    }
    remove(h, &ids).await?;
    Ok(json!({
        "clients": clients,
        "seconds": elapsed.as_secs_f64(),
        "actions": actions,
        "actions_per_second": per_sec,
        "errors": errors.len(),
        "error_kinds": first_errors,
        "all": all.json(),
        "shell": shells.json(),
        "cells": cells.json(),
        "probe_idle": idle.json(),
        "probe_under_load": under_load.json(),
        "paced_fraction": fraction,
        "paced_actions_per_second": paced_per_sec,
        "paced_errors": paced_errors.len(),
        "paced_all": paced_all.json(),
        "probe_under_paced_load": paced_probe.json(),
        "runtime_cpu_ms_per_action": cpu_ms_per_action,
        "docker_exec": docker_lat.json(),
        "docker_exec_per_second": docker_per_sec,
        "docker_exec_errors": docker_errors,
    }))
}

async fn density() -> anyhow::Result<Value> {
    let n = env_num("SCALE_SANDBOXES", 1000);
    let at_once = env_num("SCALE_CREATE_CONCURRENCY", 8);
    let max = (n + 16).to_string();
    let s = Scaled::start(&[("MENTIS_MAX_SANDBOXES", max.as_str())]).await?;
    let pid = s.pid();
    let h = &s.h;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (first, _) = fill(h, 1, 1, &api::SandboxSpec::default()).await?;
    let one = &first[0];
    tokio::time::sleep(Duration::from_secs(2)).await;
    let alone = shell_round_trips(h, one, 200).await?;
    let cell_alone = cell_round_trips(h, one, 200).await?;
    let direct_alone = direct_round_trips(one, 200).await?;
    let (rss0, avail0) = (rss(pid), mem_available_kib());

    let t = Instant::now();
    let mut ids = first.clone();
    let mut create_times = Vec::new();
    let mut marks = Vec::new();
    while ids.len() < n {
        let step = (n - ids.len()).min(100);
        let filled = fill(h, step, at_once, &api::SandboxSpec::default()).await;
        let (more, times) = match filled {
            Ok(made) => made,
            Err(e) => {
                // Where the machine stood when creates began to fail, then the sandboxes go.
                println!(
                    "density: a create failed with {} sandboxes after {:.0} s: {e:#}; {}",
                    ids.len(),
                    t.elapsed().as_secs_f64(),
                    machine(pid)
                );
                remove(h, &ids).await?;
                return Err(e);
            }
        };
        ids.extend(more);
        create_times.extend(times);
        marks.push((ids.len(), t.elapsed().as_secs_f64()));
        println!(
            "density: {} sandboxes after {:.0} s; {}",
            ids.len(),
            t.elapsed().as_secs_f64(),
            machine(pid)
        );
    }
    let fill_secs = t.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(10)).await;
    let (rss1, avail1) = (rss(pid), mem_available_kib());
    let idle_window = Duration::from_secs(30);
    let cpu0 = cpu_time(pid)?;
    tokio::time::sleep(idle_window).await;
    let idle_cpu = cpu_time(pid)? - cpu0;
    let crowded = shell_round_trips(h, one, 200).await?;
    let cell_crowded = cell_round_trips(h, one, 200).await?;
    let direct_crowded = direct_round_trips(one, 200).await?;
    let host_state = machine(pid);

    let t = Instant::now();
    remove(h, &ids[1..]).await?;
    let delete_secs = t.elapsed().as_secs_f64();
    // Alone again once the others are gone (and the engine has settled): the machine's state drifts over
    // a run this long, so the crowded figure is set beside an alone one from before and one from after.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let alone_after = shell_round_trips(h, one, 200).await?;
    let cell_alone_after = cell_round_trips(h, one, 200).await?;
    remove(h, &ids[..1]).await?;

    let added = ids.len() - 1;
    #[allow(clippy::cast_precision_loss)]
    let per = |kib: u64| kib as f64 / added.max(1) as f64;
    let runtime_kib = per(rss1.saturating_sub(rss0));
    let host_kib = per(avail0.saturating_sub(avail1));
    #[allow(clippy::cast_precision_loss)]
    let creates_per_sec = added as f64 / fill_secs;
    let idle_pct = idle_cpu.as_secs_f64() / idle_window.as_secs_f64() * 100.0;
    let creates = Latencies::new(create_times);
    println!(
        "density: {n} idle sandboxes made in {fill_secs:.0} s ({creates_per_sec:.2}/s, {at_once} at once; each {})",
        creates.line()
    );
    println!(
        "density: runtime memory {runtime_kib:.0} KiB per sandbox (goal: under 200), host memory {:.1} MiB per \
         sandbox, idle runtime CPU {idle_pct:.2} % of a core (goal: under 5)",
        host_kib / 1024.0
    );
    println!(
        "density: shell round trip on one sandbox alone {}, with {n} {}, alone again after {} (ratio of p50 \
         to alone before {:.2}, to alone after {:.2}; goal: at most 1.2)",
        alone.line(),
        crowded.line(),
        alone_after.line(),
        crowded.pct(0.5) / alone.pct(0.5),
        crowded.pct(0.5) / alone_after.pct(0.5)
    );
    println!(
        "density: IPython 1+1 round trip on it alone {}, with {n} {}, alone again after {} (ratio of p50 to \
         alone before {:.2}, to alone after {:.2})",
        cell_alone.line(),
        cell_crowded.line(),
        cell_alone_after.line(),
        cell_crowded.pct(0.5) / cell_alone.pct(0.5),
        cell_crowded.pct(0.5) / cell_alone_after.pct(0.5)
    );
    println!(
        "density: health check straight to its executor (no runtime, no process) alone {}, with {n} {} \
         (ratio of p50 {:.2})",
        direct_alone.line(),
        direct_crowded.line(),
        direct_crowded.pct(0.5) / direct_alone.pct(0.5)
    );
    println!("density: the machine while {n} sat idle: {host_state}");
    println!(
        "density: {} deleted in {delete_secs:.0} s (16 at once)",
        ids.len() - 1
    );
    Ok(json!({
        "sandboxes": n,
        "create_concurrency": at_once,
        "fill_seconds": fill_secs,
        "fill_marks": marks,
        "creates_per_second": creates_per_sec,
        "create_each": creates.json(),
        "runtime_kib_per_sandbox": runtime_kib,
        "host_kib_per_sandbox": host_kib,
        "idle_runtime_cpu_percent_of_a_core": idle_pct,
        "round_trip_alone": alone.json(),
        "round_trip_with_all": crowded.json(),
        "ratio_p50": crowded.pct(0.5) / alone.pct(0.5),
        "round_trip_alone_after": alone_after.json(),
        "ratio_p50_to_after": crowded.pct(0.5) / alone_after.pct(0.5),
        "cell_alone_after": cell_alone_after.json(),
        "cell_alone": cell_alone.json(),
        "cell_with_all": cell_crowded.json(),
        "direct_health_alone": direct_alone.json(),
        "direct_health_with_all": direct_crowded.json(),
        "machine_idle": host_state,
        "delete_seconds": delete_secs,
    }))
}

/// The machine's state, for a line of the density log: load, free memory, the runtime's memory, threads
/// and open files, loop devices in use, the engine's threads.
fn machine(pid: u32) -> String {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(4).collect();
    let count = |dir: String| std::fs::read_dir(dir).map_or(0, Iterator::count);
    let loops = std::fs::read_dir("/sys/block")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    let name = e.file_name();
                    name.to_string_lossy().starts_with("loop")
                        && std::fs::read_to_string(e.path().join("size"))
                            .is_ok_and(|s| s.trim() != "0")
                })
                .count()
        })
        .unwrap_or(0);
    let dockerd = docker_pid().map_or(0, |p| count(format!("/proc/{p}/task")));
    format!(
        "load {}, MemAvailable {} MiB, runtime RSS {} MiB, threads {}, open files {}; loop devices in use \
         {loops}; dockerd threads {dockerd}",
        load.join(" "),
        mem_available_kib() / 1024,
        rss(pid) / 1024,
        count(format!("/proc/{pid}/task")),
        count(format!("/proc/{pid}/fd")),
    )
}

/// The Docker daemon's pid, if one runs here.
fn docker_pid() -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(e.path().join("comm")).ok()?;
        (comm.trim() == "dockerd").then_some(pid)
    })
}

/// The CPU time of every process whose name begins with one of `names` (all of them: the engine's daemons
/// and shims), their own only.
fn cpu_of_named(names: &[&str]) -> Duration {
    cpu_by_command(false)
        .into_iter()
        .filter(|(name, _)| names.iter().any(|n| name.starts_with(n)))
        .map(|(_, d)| d)
        .sum()
}

/// CPU time of every process here, by command name: their own, and with `reaped` their reaped children's
/// too.
fn cpu_by_command(reaped: bool) -> BTreeMap<String, Duration> {
    let mut by: BTreeMap<String, Duration> = BTreeMap::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return by;
    };
    for e in dir.flatten() {
        if e.file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
            .is_none()
        {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        let (Some(open), Some((head, rest))) = (stat.find('('), stat.rsplit_once(')')) else {
            continue;
        };
        let name = head[open + 1..].to_owned();
        let f: Vec<&str> = rest.split_whitespace().collect();
        // utime, stime, cutime, cstime: the 12th to 15th fields after the name; USER_HZ is 100.
        let fields = if reaped { 11..15 } else { 11..13 };
        let ticks: u64 = f
            .get(fields)
            .map_or(0, |t| t.iter().filter_map(|v| v.parse::<u64>().ok()).sum());
        *by.entry(name).or_default() += Duration::from_millis(ticks * 10);
    }
    by
}

/// What `cpu_by_command` grew by from `before`, largest first (processes that ended unreaped are missed).
fn cpu_grown(before: &BTreeMap<String, Duration>) -> Vec<(String, Duration)> {
    let mut grown: Vec<(String, Duration)> = cpu_by_command(true)
        .into_iter()
        .map(|(name, now)| {
            let was = before.get(&name).copied().unwrap_or_default();
            (name, now.saturating_sub(was))
        })
        .filter(|(_, d)| *d >= Duration::from_millis(50))
        .collect();
    grown.sort_by_key(|g| std::cmp::Reverse(g.1));
    grown
}

/// `cpu_grown` as a line: the CPU seconds of each command.
fn cpu_line(grown: &[(String, Duration)]) -> String {
    let total: Duration = grown.iter().map(|(_, d)| *d).sum();
    let each: Vec<String> = grown
        .iter()
        .take(8)
        .map(|(n, d)| format!("{n} {:.2}", d.as_secs_f64()))
        .collect();
    format!(
        "{:.2} CPU s in all: {}",
        total.as_secs_f64(),
        each.join(", ")
    )
}

/// The engine's processes that carry `docker exec`'s output: the daemons and the containers' shims.
const ENGINE: &[&str] = &["dockerd", "containerd"];

/// `output`: the runtime's CPU time per observation byte of a command's stdout (journaled, read by a
/// client to its end), against the engine's (dockerd, containerd and the shims) for `docker exec` of the
/// same command into the same container, runs taken in turn.
async fn output() -> anyhow::Result<Value> {
    let mib = env_num("SCALE_OUTPUT_MIB", 256);
    let runs = env_num("SCALE_OUTPUT_RUNS", 3);
    let bytes = u64::try_from(mib)? << 20;
    // Room in the log for the whole output, as `BENCH_ONLY=throughput` gives it: a reader that falls
    // behind gets a gap rather than the bytes, and every byte is counted here.
    let room = (2 * bytes).to_string();
    let s = Scaled::start(&[("MENTIS_LOG_MAX_BYTES", room.as_str())]).await?;
    let pid = s.pid();
    let h = &s.h;
    let (ids, _) = fill(h, 1, 1, &api::SandboxSpec::default()).await?;
    let id = &ids[0];
    let writer = format!("head -c {bytes} /dev/zero");
    let container = format!("mentis-{id}");
    let docker_exec = || -> anyhow::Result<()> {
        let status = std::process::Command::new("docker")
            .args(["exec", "-u", "1000", &container, "sh", "-c", &writer])
            .stdout(std::process::Stdio::null())
            .status()?;
        anyhow::ensure!(status.success(), "docker exec: {status}");
        Ok(())
    };
    // One warm-up each, not kept.
    anyhow::ensure!(stdout_bytes(h, id, &writer).await? == bytes);
    docker_exec()?;
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    let perf = Perf::start(pid, "target/scale-output-perf.data")?;
    #[allow(clippy::cast_precision_loss)]
    let per_byte = |cpu: Duration, secs: f64| {
        (
            cpu.as_nanos() as f64 / bytes as f64,
            bytes as f64 / 1e6 / secs,
        )
    };
    for _ in 0..runs {
        let (cpu0, t) = (cpu_time(pid)?, Instant::now());
        let got = stdout_bytes(h, id, &writer).await?;
        anyhow::ensure!(got == bytes, "{got} of {bytes} bytes came");
        ours.push(per_byte(cpu_time(pid)? - cpu0, t.elapsed().as_secs_f64()));
        let (cpu0, t) = (cpu_of_named(ENGINE), Instant::now());
        docker_exec()?;
        theirs.push(per_byte(
            cpu_of_named(ENGINE) - cpu0,
            t.elapsed().as_secs_f64(),
        ));
    }
    perf.stop();
    remove(h, &ids).await?;
    let of = |v: &[(f64, f64)], pick: fn(&(f64, f64)) -> f64| median(v.iter().map(pick).collect());
    let (ours_ns, ours_mbs) = (of(&ours, |p| p.0), of(&ours, |p| p.1));
    let (theirs_ns, theirs_mbs) = (of(&theirs, |p| p.0), of(&theirs, |p| p.1));
    println!(
        "output: {mib} MiB of stdout, median of {runs}: the runtime {ours_ns:.2} ns of CPU per byte at \
         {ours_mbs:.0} MB/s (journaled); the engine {theirs_ns:.2} ns per byte for docker exec at {theirs_mbs:.0} MB/s"
    );
    Ok(json!({
        "mib": mib,
        "runs": runs,
        "runtime_cpu_ns_per_byte": ours_ns,
        "runtime_mb_per_s": ours_mbs,
        "engine_cpu_ns_per_byte_docker_exec": theirs_ns,
        "docker_exec_mb_per_s": theirs_mbs,
        "each": ours.iter().zip(&theirs).map(|(o, t)| json!({"runtime_ns_per_byte": o.0, "runtime_mb_s": o.1, "engine_ns_per_byte": t.0, "docker_exec_mb_s": t.1})).collect::<Vec<_>>(),
    }))
}

pub async fn run() -> anyhow::Result<()> {
    let parts = std::env::var("SCALE_PARTS")
        .unwrap_or_else(|_| "bursts,concurrency,density,output".to_owned());
    let mut out = serde_json::Map::new();
    for part in parts.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let started = Instant::now();
        let value = match part {
            "bursts" => bursts().await?,
            "concurrency" => concurrency().await?,
            "density" => density().await?,
            "output" => output().await?,
            other => {
                bail!("SCALE_PARTS: unknown part {other:?} (bursts, concurrency, density, output)")
            }
        };
        println!(
            "scale: {part} took {:.0} s",
            started.elapsed().as_secs_f64()
        );
        out.insert(part.to_owned(), value);
    }
    let path = std::env::var("BENCH_OUT").unwrap_or_else(|_| "target/scale.json".to_owned());
    std::fs::write(&path, serde_json::to_string_pretty(&Value::Object(out))?)?;
    println!("results written to {path}");
    Ok(())
}
