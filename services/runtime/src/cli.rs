//! The process entry: configuration from the environment, logs to stderr, serve until SIGINT or SIGTERM
//! (which drain: see `server`), and exit at once on a second one.
//! The `mentis-runtime` binary is this function; the end-to-end tests run it as a real process too (to kill
//! it with SIGKILL and start it again).

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use tonic_health::pb::health_check_response::ServingStatus;
use tracing_subscriber::EnvFilter;

use crate::metrics::MetricsExport;
use crate::telemetry::{self, Traces};
use crate::{Runtime, RuntimeConfig};

const USAGE: &str = "usage: mentis-runtime [healthcheck | --version | --help]
  (no argument)  serve the API; every setting comes from MENTIS_* environment variables (docs/CONFIGURATION.md)
  healthcheck    ask the runtime configured by this environment whether it serves: exit 0 SERVING, 1 not";

/// The `mentis-runtime` command line: no argument serves, `healthcheck` checks a running runtime.
pub async fn main_with_args(args: Vec<String>) -> anyhow::Result<()> {
    crate::install_crypto_provider();
    match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => run_from_env().await,
        ["healthcheck"] => std::process::exit(healthcheck().await),
        ["--version"] => {
            println!("mentis-runtime {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        ["--help" | "-h"] => {
            println!("{USAGE}");
            Ok(())
        }
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    }
}

/// Runs the runtime as a process until it is told to stop.
pub async fn run_from_env() -> anyhow::Result<()> {
    // What the process makes is its user's alone (the data folder: see `private`); the library makes its
    // files with explicit modes too, for embedders that keep another umask.
    nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o077));
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info"))
        // bollard logs request bodies at debug, and a container's env carries its executor token.
        .add_directive("bollard=info".parse()?)
        // OpenTelemetry's own notes (a provider was set, ...) only when something is wrong.
        .add_directive("opentelemetry=warn".parse()?)
        .add_directive("opentelemetry_sdk=warn".parse()?);
    let format = mentis_telemetry::LogFormat::from_env().map_err(anyhow::Error::msg)?;
    let traces = match telemetry::traces_endpoint(|name| std::env::var(name).ok()) {
        Some(endpoint) => Some(Traces::start(&endpoint).context("cannot start traces")?),
        None => None,
    };
    mentis_telemetry::install(
        filter,
        format,
        traces.as_ref().map(Traces::provider),
        "mentis-runtime",
    )?;
    let config = RuntimeConfig::from_env().context("bad configuration")?;
    open_files_for(&config);
    neighbours_for(&config);
    // Before anything records: the instruments are made at their first use.
    let metrics = MetricsExport::start(
        config.metrics_listen.is_some(),
        telemetry::metrics_endpoint(|name| std::env::var(name).ok()).is_some(),
    )
    .context("cannot start metrics")?;
    let mut runtime = Runtime::start(config)
        .await
        .context("cannot start mentis-runtime")?;
    // The signals are watched beside the runtime, in this task: the first drains, a second exits at once.
    let stop = runtime.shutdown_token();
    let result = tokio::select! {
        served = runtime.wait() => served,
        never = on_signals(stop) => match never {},
    };
    let result = result.context("mentis-runtime failed");
    if let Some(metrics) = metrics {
        let _ = tokio::task::spawn_blocking(move || metrics.shutdown()).await;
    }
    if let Some(traces) = traces {
        // The exporter's last batch; blocking, so off the async threads.
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    result
}

/// Raises the process's soft limit of open files to its hard limit (as Go's runtime does: the soft limit,
/// often 1024, is there for old `select` users), and warns when the listeners' connection limits with room for
/// the sandboxes (executor connections, journals) do not fit under it: the runtime would run out of file
/// descriptors before its doors refuse anyone.
fn open_files_for(config: &RuntimeConfig) {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok(limits) => limits,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the limit of open files");
            return;
        }
    };
    let soft = if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!(error = %e, soft, hard, "cannot raise the limit of open files");
                soft
            }
        }
    } else {
        soft
    };
    let listeners = [
        Some(config.connections.total),
        config.http_listen.map(|_| config.connections.total),
        config
            .health_listen
            .map(|_| config.connections.side().total),
        config
            .metrics_listen
            .map(|_| config.connections.side().total),
    ];
    let connections: usize = listeners.into_iter().flatten().sum();
    // Per sandbox: its executor's connection, its journal, a terminal or two; and the process's own.
    let needed = connections + 4 * config.max_sandboxes + 256;
    if u64::try_from(needed).unwrap_or(u64::MAX) > soft {
        tracing::warn!(
            open_files = soft,
            needed,
            "the limit of open files is below what the listeners' connection limits and MENTIS_MAX_SANDBOXES \
             may need: lower MENTIS_MAX_CONNECTIONS or raise the limit (ulimit -n, LimitNOFILE=)"
        );
    }
}

/// The kernel's neighbour (ARP) table, where the runtime reaches executors on the engine's bridge: past its
/// `gc_thresh2` entries (512 by default) new sandboxes' executors were no longer reached here (`make
/// bench-scale`, density: every create after the 501st timed out waiting for its executor, with or without
/// disk limits, and went on to 650 once the thresholds were raised). Warns when `MENTIS_MAX_SANDBOXES`
/// does not fit under it. Docker only: a pod's address is the cluster network's business.
fn neighbours_for(config: &RuntimeConfig) {
    if !matches!(config.backend, crate::config::BackendChoice::Docker) {
        return;
    }
    let read = |name: &str| {
        std::fs::read_to_string(format!("/proc/sys/net/ipv4/neigh/default/{name}"))
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
    };
    if let Some(why) = read("gc_thresh2").and_then(|t| neighbour_room(config.max_sandboxes, t)) {
        tracing::warn!("{why}");
    }
}

/// Why `max_sandboxes` sandboxes (and the runtime's own few neighbours) may not fit under a neighbour table
/// that starts evicting at `gc_thresh2` entries; None when they do.
fn neighbour_room(max_sandboxes: usize, gc_thresh2: usize) -> Option<String> {
    let needed = max_sandboxes + 64;
    (needed > gc_thresh2).then(|| {
        format!(
            "MENTIS_MAX_SANDBOXES={max_sandboxes} may not fit in the kernel's neighbour table, which starts \
             evicting at {gc_thresh2} entries (net.ipv4.neigh.default.gc_thresh2): past about that many \
             sandboxes new executors may not be reached. Raise gc_thresh1/2/3 (for example sysctl -w \
             net.ipv4.neigh.default.gc_thresh1=1024 net.ipv4.neigh.default.gc_thresh2=4096 \
             net.ipv4.neigh.default.gc_thresh3=8192) or lower MENTIS_MAX_SANDBOXES"
        )
    })
}

/// The first SIGTERM or SIGINT cancels `stop` (the drain); a second exits the process at once.
async fn on_signals(stop: CancellationToken) -> std::convert::Infallible {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            tracing::error!(error = %e, "cannot listen for SIGTERM");
            return std::future::pending().await;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("draining (a second SIGTERM or SIGINT exits at once)");
    stop.cancel();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::warn!("second signal: exiting now");
    std::process::exit(130);
}

/// `mentis-runtime healthcheck`: asks the running runtime's `grpc.health.v1` (on `MENTIS_HEALTH_LISTEN`, or
/// on `MENTIS_LISTEN` when the API is plaintext) whether it serves, with the same environment as the runtime
/// (Docker's HEALTHCHECK runs it in the runtime's container). Exit status: 0 SERVING, 1 anything else (not
/// serving, draining, unreachable), 2 a configuration it cannot use.
pub async fn healthcheck() -> i32 {
    let config = match RuntimeConfig::from_env() {
        Ok(config) => config,
        Err(e) => {
            eprintln!("mentis-runtime healthcheck: bad configuration: {e}");
            return 2;
        }
    };
    let addr = match (config.health_listen, &config.tls) {
        (Some(addr), _) => addr,
        (None, None) => config.listen,
        (None, Some(_)) => {
            eprintln!(
                "mentis-runtime healthcheck: the API is served over TLS; set MENTIS_HEALTH_LISTEN (a plaintext \
                 listener for health alone, e.g. 127.0.0.1:50060) for the runtime and this check"
            );
            return 2;
        }
    };
    match health_of(addr).await {
        Ok(ServingStatus::Serving) => {
            println!("SERVING");
            0
        }
        Ok(status) => {
            println!("{}", status.as_str_name());
            1
        }
        Err(e) => {
            println!("unreachable: {e:#}");
            1
        }
    }
}

/// The overall health status at `addr` (an unspecified address, as listened on, is asked on loopback).
async fn health_of(addr: std::net::SocketAddr) -> anyhow::Result<ServingStatus> {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(std::time::Duration::from_secs(3))
        .timeout(std::time::Duration::from_secs(5))
        .connect()
        .await
        .with_context(|| format!("connecting to {addr}"))?;
    let reply = tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .with_context(|| format!("grpc.health.v1.Health/Check at {addr}"))?
        .into_inner();
    Ok(ServingStatus::try_from(reply.status).unwrap_or(ServingStatus::Unknown))
}

#[cfg(test)]
mod tests {
    use super::neighbour_room;

    #[test]
    fn the_neighbour_table_must_hold_every_sandbox_and_some_room() {
        // The defaults: 256 sandboxes in a table of 512.
        assert_eq!(neighbour_room(256, 512), None);
        let why = neighbour_room(1000, 512).expect("1000 do not fit in 512");
        assert!(
            why.contains("MENTIS_MAX_SANDBOXES=1000") && why.contains("gc_thresh2"),
            "{why}"
        );
        assert_eq!(neighbour_room(1000, 4096), None);
        assert!(neighbour_room(460, 512).is_some());
    }
}
