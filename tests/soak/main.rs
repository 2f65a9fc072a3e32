//! `make soak`: a chaos soak of the whole chain on 127.0.0.1 and its own containers. N clients run shell
//! commands, cells and file round trips over Execute and Connect while faults land at random: container kill, executor
//! kill, kernel kill, dropped client streams, runtime SIGKILL and SIGTERM with a restart. It checks the
//! invariants all along (every accepted action ends exactly once with what it printed; a seq always
//! carries the same observation; a cut write changes nothing), then that nothing is left behind and that the
//! runtime's RSS stayed within 10 % of its level after warm-up. Prints a summary table (and
//! target/soak.json) and exits non-zero on any broken invariant.
//!
//! `mentis-soak [--duration 30m] [--clients 20] [--seed N] [--fault-every 8]`

mod report;
mod workload;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context, bail};
use mentis_e2e::*;
use mentis_proto::api;
use tokio::time::Instant;

use report::{Summary, Tally};
use workload::{Rng, Shared};

/// A small memory budget for the logs (4 MiB, below what 20 logs keep at their floor of 256 KiB each): their
/// cache is full within seconds, so the RSS check measures what leaks, not the cache filling up to the
/// default budget (each observation costs about 2.5 times what the budget counts for it).
const RUNTIME_ENV: &[(&str, &str)] = &[("MENTIS_LOG_MEMORY_BYTES", "4194304")];

struct Args {
    duration: Duration,
    clients: usize,
    seed: u64,
    fault_every: Duration,
}

fn parse_duration(v: &str) -> anyhow::Result<Duration> {
    let (n, unit) = match v.strip_suffix('m') {
        Some(n) => (n, 60),
        None => (v.strip_suffix('s').unwrap_or(v), 1),
    };
    Ok(Duration::from_secs(
        n.parse::<u64>().context("a duration: 180, 180s or 3m")? * unit,
    ))
}

fn args() -> anyhow::Result<Args> {
    let mut a = Args {
        duration: Duration::from_secs(30 * 60),
        clients: 20,
        seed: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64),
        fault_every: Duration::from_secs(8),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--duration" => a.duration = parse_duration(&value)?,
            "--clients" => a.clients = value.parse().context("--clients")?,
            "--seed" => a.seed = value.parse().context("--seed")?,
            "--fault-every" => a.fault_every = parse_duration(&value)?,
            other => {
                bail!("unknown flag {other}: use --duration, --clients, --seed, --fault-every")
            }
        }
    }
    Ok(a)
}

/// How often the runtime's RSS is sampled.
const RSS_EVERY: Duration = Duration::from_secs(2);

/// The runtime process the soak restarts, on the same address and data folder.
struct Runtime {
    bin: String,
    instance: String,
    data_dir: std::path::PathBuf,
    addr: std::net::SocketAddr,
    process: RuntimeProcess,
}

impl Runtime {
    async fn restart(&mut self) -> anyhow::Result<()> {
        self.process = RuntimeProcess::start_at(
            &self.bin,
            &self.instance,
            &self.data_dir,
            self.addr,
            RUNTIME_ENV,
        )
        .await?;
        Ok(())
    }

    async fn sigterm(&mut self) -> anyhow::Result<()> {
        self.process.signal("TERM")?;
        if self
            .process
            .exited_within(Duration::from_secs(20))
            .await?
            .is_none()
        {
            bail!("the runtime did not exit within 20 s of SIGTERM");
        }
        Ok(())
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    let bin = std::env::current_exe()?
        .parent()
        .context("the soak's folder")?
        .join("mentis-runtime-under-test")
        .to_string_lossy()
        .into_owned();
    let mut guard = Harness::new_instance();
    let data_dir = tempfile::tempdir()?;
    guard.watch(data_dir.path());
    let process =
        RuntimeProcess::start_with_env(&bin, &guard.instance, data_dir.path(), RUNTIME_ENV).await?;
    let key = process.admin_key()?;
    let mut rt = Runtime {
        bin,
        instance: guard.instance.clone(),
        data_dir: data_dir.path().to_owned(),
        addr: process.addr,
        process,
    };
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", rt.addr))?
        .connect_timeout(Duration::from_secs(2))
        .connect_lazy();
    let shared = Arc::new(Shared {
        channel: tonic::service::interceptor::InterceptedService::new(
            channel,
            Bearer::new(Some(&key)),
        ),
        drop_stream: AtomicBool::new(false),
    });
    println!(
        "soak: {} clients for {:?}, seed {}, a fault every {:?} (replay with --seed {})",
        args.clients, args.duration, args.seed, args.fault_every, args.seed
    );
    let start = Instant::now();
    let until = start + args.duration;
    let mut seeds = Rng(args.seed | 1);
    let clients: Vec<_> = (0..args.clients)
        .map(|i| tokio::spawn(workload::run(Arc::clone(&shared), i, seeds.next(), until)))
        .collect();

    // Runtime restarts stop at half time. RSS is sampled every 2 s: its level after warm-up is the median
    // of the samples from 60 to 75 % of the run, its level at the end the median from 85 % on (the
    // allocator's give and take makes single samples swing by several per cent).
    let restarts_until = start + args.duration.mul_f64(0.5);
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    let mut rng = Rng(seeds.next());
    let mut tally = Tally::default();
    let mut rss_samples: Vec<(f64, u64)> = Vec::new();
    let mut next_fault = start + args.fault_every;
    while Instant::now() < until {
        tokio::time::sleep_until((Instant::now() + RSS_EVERY).min(next_fault).min(until)).await;
        let at = start.elapsed().as_secs_f64() / args.duration.as_secs_f64();
        rss_samples.push((at, rt.process.rss_kib()?));
        if Instant::now() >= until {
            break;
        }
        if Instant::now() < next_fault {
            continue;
        }
        next_fault = Instant::now() + args.fault_every;
        let containers: Vec<String> = guard.containers().into_iter().collect();
        let pick = |rng: &mut Rng| {
            containers
                .get(rng.below(containers.len() as u64) as usize)
                .cloned()
        };
        let restarts = Instant::now() < restarts_until;
        let fault = match rng.below(if restarts { 6 } else { 4 }) {
            0 => "client stream dropped",
            1 => "container killed",
            2 => "executor killed",
            3 => "kernel killed",
            4 => "runtime SIGKILL and restart",
            _ => "runtime SIGTERM and restart",
        };
        let done = match fault {
            "client stream dropped" => {
                shared
                    .drop_stream
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
            "container killed" => {
                pick(&mut rng).map_or(Ok(()), |c| docker(&["kill", &c]).map(drop))
            }
            "executor killed" => pick(&mut rng).map_or(Ok(()), |c| {
                docker(&["exec", "-d", &c, "pkill", "-9", "mentis-executor"]).map(drop)
            }),
            "kernel killed" => pick(&mut rng).map_or(Ok(()), |c| {
                // As the sandbox user: the container's root has no CAP_KILL for user code.
                docker(&[
                    "exec",
                    "-d",
                    "-u",
                    "1000",
                    &c,
                    "pkill",
                    "-9",
                    "-f",
                    "ipykernel",
                ])
                .map(drop)
            }),
            "runtime SIGKILL and restart" => {
                rt.process.kill();
                rt.restart().await
            }
            _ => match rt.sigterm().await {
                Ok(()) => rt.restart().await,
                Err(e) => Err(e),
            },
        };
        match done {
            Ok(()) => *faults.entry(fault.to_owned()).or_default() += 1,
            // A container that ended meanwhile cannot be killed: not the runtime's fault.
            Err(e) => tally.note(format!("{fault}: {e}")),
        }
    }

    let mut sandboxes = Vec::new();
    for c in clients {
        let c = c.await?;
        sandboxes.push(c.sandbox);
        tally.merge(c.tally);
    }
    rss_samples.push((1.0, rt.process.rss_kib()?));
    let level = |from: f64, to: f64| {
        let mut v: Vec<u64> = rss_samples
            .iter()
            .filter(|(at, _)| (from..=to).contains(at))
            .map(|(_, kib)| *kib)
            .collect();
        v.sort_unstable();
        v.get(v.len() / 2).copied().unwrap_or(0)
    };
    let (baseline, rss_end) = (level(0.6, 0.75), level(0.85, 1.0));
    let mib: Vec<(u64, u64)> = rss_samples
        .iter()
        .step_by(4)
        .map(|(at, kib)| ((at * args.duration.as_secs_f64()) as u64, kib / 1024))
        .collect();
    println!("soak: runtime RSS (s, MiB), every 8 s: {mib:?}");
    let mut api = api::sandbox_service_client::SandboxServiceClient::new(shared.channel.clone());
    for id in sandboxes.iter().filter(|s| !s.is_empty()) {
        if let Err(e) = api
            .delete_sandbox(api::DeleteSandboxRequest {
                sandbox_id: id.clone(),
            })
            .await
        {
            tally.fail(format!("delete {id}: {e}"));
        }
    }
    rt.sigterm().await?;
    let mut leftovers = guard.containers();
    leftovers.extend(guard.volumes());
    leftovers.extend(guard.loop_devices());
    let summary = Summary {
        duration_s: start.elapsed().as_secs(),
        seed: args.seed,
        clients: args.clients,
        faults,
        rss_baseline_kib: baseline,
        rss_end_kib: rss_end,
        leftovers,
        tally,
    };
    summary.print();
    std::fs::create_dir_all("target")?;
    std::fs::write(
        "target/soak.json",
        serde_json::to_string_pretty(&summary.json())?,
    )?;
    if summary.invariants().iter().any(|(_, ok)| !ok) {
        bail!("the soak broke an invariant (seed {})", args.seed);
    }
    Ok(())
}
