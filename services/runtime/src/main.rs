//! mentis-runtime: reads its configuration from the environment, serves until SIGINT or SIGTERM.
//! `mentis-runtime healthcheck` asks a running one whether it serves (exit 0) or not (1).

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    mentis_runtime::cli::main_with_args(std::env::args().skip(1).collect()).await
}
