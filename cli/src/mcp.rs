//! `mentis mcp`: MentisSandbox's tools for an MCP client (Claude Desktop, an IDE, an agent framework) on
//! stdio, calling the runtime at `--addr` with the CLI's key. The tools are `mentis-mcp`'s (docs/MCP.md);
//! the runtime serves the same ones over streamable HTTP at `/mcp` on its HTTP listener.

use anyhow::Context as _;
use clap::Args;
use rmcp::ServiceExt as _;

use crate::client::Conn;
use crate::error::{Result, Status};

#[derive(Args, Debug)]
pub struct McpArgs {
    /// Bytes of one output (a command's stdout or stderr, a cell's text, a file) given back at most: the
    /// head and the tail, with a note saying how much was left out between them.
    #[arg(long, env = "MENTIS_MCP_MAX_OUTPUT", default_value_t = mentis_mcp::DEFAULT_MAX_OUTPUT)]
    max_output: usize,
}

/// The tools, a line each, for `mentis mcp --help`.
pub fn tools_help() -> String {
    let tools = mentis_mcp::tools();
    let width = tools.iter().map(|(n, _)| n.len()).max().unwrap_or(0);
    let mut help = String::from("Tools (docs/MCP.md):\n");
    for (name, description) in tools {
        help.push_str(&format!("  {name:<width$}  {description}\n"));
    }
    help
}

/// Serves until the client closes stdin.
pub async fn run(conn: &Conn, a: McpArgs) -> Result<Status> {
    let tools = mentis_mcp::SandboxTools::new(conn.transport(), a.max_output);
    let server = tools
        .serve(rmcp::transport::stdio())
        .await
        .context("starting the MCP session on stdio")?;
    server.waiting().await.context("serving MCP on stdio")?;
    Ok(0)
}
