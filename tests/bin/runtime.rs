//! The real mentis-runtime process, built inside the test package so the end-to-end tests can start it,
//! kill it with SIGKILL and start it again (`CARGO_BIN_EXE_mentis-runtime-under-test`).

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    mentis_runtime::cli::main_with_args(std::env::args().skip(1).collect()).await
}
