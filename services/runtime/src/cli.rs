//! The process entry: configuration from the environment, logs to stderr, serve until SIGINT or SIGTERM
//! (which drain: see `server`), and exit at once on a second one.
//! The `mentis-runtime` binary is this function; the end-to-end tests run it as a real process too (to kill
//! it with SIGKILL and start it again).

use anyhow::Context;
use tracing_subscriber::EnvFilter;

use crate::metrics::MetricsExport;
use crate::telemetry::{self, Traces};
use crate::{Runtime, RuntimeConfig};

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
    // Before anything records: the instruments are made at their first use.
    let metrics = MetricsExport::start(
        config.metrics_listen.is_some(),
        telemetry::metrics_endpoint(|name| std::env::var(name).ok()).is_some(),
    )
    .context("cannot start metrics")?;
    let mut runtime = Runtime::start(config)
        .await
        .context("cannot start mentis-runtime")?;
    let stop = runtime.shutdown_token();
    tokio::spawn(async move {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    tracing::error!(error = %e, "cannot listen for SIGTERM");
                    return;
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
    });
    let result = runtime.wait().await.context("mentis-runtime failed");
    if let Some(metrics) = metrics {
        let _ = tokio::task::spawn_blocking(move || metrics.shutdown()).await;
    }
    if let Some(traces) = traces {
        // The exporter's last batch; blocking, so off the async threads.
        let _ = tokio::task::spawn_blocking(move || traces.shutdown()).await;
    }
    result
}
