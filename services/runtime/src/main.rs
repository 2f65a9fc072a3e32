//! mentis-runtime: reads its configuration from the environment, serves until SIGINT or SIGTERM.

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    mentis_runtime::cli::run_from_env().await
}
