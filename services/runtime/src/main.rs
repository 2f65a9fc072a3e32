//! mentis-runtime: reads its configuration from the environment, serves until SIGINT or SIGTERM.

use anyhow::Context;
use mentis_runtime::{Runtime, RuntimeConfig};
use tracing_subscriber::EnvFilter;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
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
        tracing::info!("shutting down");
        stop.cancel();
    });
    runtime.wait().await.context("mentis-runtime failed")?;
    Ok(())
}
