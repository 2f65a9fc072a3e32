//! The process entry: configuration from the environment, logs to stderr, serve until SIGINT or SIGTERM
//! (which drain: see `server`), and exit at once on a second one.
//! The `mentis-runtime` binary is this function; the end-to-end tests run it as a real process too (to kill
//! it with SIGKILL and start it again).

use anyhow::Context;
use tracing_subscriber::EnvFilter;

use crate::{Runtime, RuntimeConfig};

/// Runs the runtime as a process until it is told to stop.
pub async fn run_from_env() -> anyhow::Result<()> {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info"))
        // bollard logs request bodies at debug, and a container's env carries its executor token.
        .add_directive("bollard=info".parse()?);
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let config = RuntimeConfig::from_env().context("bad configuration")?;
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
    runtime.wait().await.context("mentis-runtime failed")?;
    Ok(())
}
