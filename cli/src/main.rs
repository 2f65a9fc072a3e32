//! `mentis`: the command line of MentisSandbox (docs/CLI.md). Every command is one or a few calls of the
//! public gRPC API (proto/mentis/v1), made with the generated clients of `mentis-proto`.
//!
//! Exit status: 0 on success; 1 when a call fails (`mentis: <CODE>: <message>` on stderr) or the client
//! itself fails; 2 for usage errors (clap's); `exec` and `shell` exit with the remote program's status.

mod client;
mod egress;
mod error;
mod exec;
mod files;
mod logs;
mod mcp;
mod output;
mod preview;
mod process;
mod sandbox;
mod secret;
mod shell;
mod snapshot;
mod template;

use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand};

use crate::client::Conn;
use crate::error::{Failure, Result, Status, code_name};

#[derive(Parser, Debug)]
#[command(
    name = "mentis",
    version,
    about = "Command line of MentisSandbox: sandboxes for AI agents"
)]
struct Cli {
    /// Address of the runtime's API.
    #[arg(long, global = true, env = "MENTIS_ADDR", default_value = client::DEFAULT_ADDR)]
    addr: String,
    /// API key (sent as `authorization: Bearer <key>`). Without it, and without MENTIS_API_KEY, the admin
    /// key file `$MENTIS_DATA_DIR/admin.key` (default `mentis-data/admin.key`) is used when readable.
    #[arg(long, global = true, env = "MENTIS_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// PEM file of the certificate authority to trust for an https:// address.
    #[arg(long, global = true, env = "MENTIS_CA_CERT")]
    ca_cert: Option<std::path::PathBuf>,
    /// How commands that print records print them.
    #[arg(long, short = 'o', global = true, value_enum, default_value_t = output::Format::Text)]
    output: output::Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create, list, inspect, pause, resume and delete sandboxes; their egress rules and refusals.
    #[command(subcommand)]
    Sandbox(sandbox::SandboxCommand),
    /// A space's secrets: values the egress gateway puts into the headers of sandboxes' requests
    /// (`--header 'DOMAIN=Authorization: Bearer {secret:NAME}'`), which never enter a sandbox.
    #[command(subcommand)]
    Secret(secret::SecretCommand),
    /// Take, list, inspect and delete snapshots of sandboxes' workspaces (`sandbox create --snapshot ID`
    /// restores one).
    #[command(subcommand)]
    Snapshot(snapshot::SnapshotCommand),
    /// Templates (a named image, limits, env, work dir, start-up commands and warm pool; `sandbox create
    /// --template NAME`), and images built or imported on the runtime's engine.
    #[command(subcommand)]
    Template(template::TemplateCommand),
    /// Preview URLs: open a web app, dev server or notebook running in a sandbox from outside it
    /// (`preview url SANDBOX PORT`), and revoke them (`preview revoke SANDBOX`).
    #[command(subcommand)]
    Preview(preview::PreviewCommand),
    /// Run a bash command line in a sandbox; its stdout and stderr stream live, and mentis exits with its
    /// status.
    Exec(exec::ExecArgs),
    /// Run Python code in the sandbox's IPython kernel (a file, or `-` for stdin).
    RunCode(exec::RunCodeArgs),
    /// An interactive terminal in a sandbox (like `docker exec -it`).
    Shell(shell::ShellArgs),
    /// A sandbox's processes (pid, user, CPU, memory, command), as `ps` inside it would show them.
    Ps(process::PsArgs),
    /// Send a signal to a process of a sandbox (TERM by default), without a shell.
    Kill(process::KillArgs),
    /// List or close a sandbox's terminals (those of `mentis shell`), or link one for a browser.
    #[command(subcommand)]
    Terminals(shell::TerminalsCommand),
    /// Print a sandbox's observations (its log), optionally following new ones.
    Logs(logs::LogsArgs),
    /// Copy a file or directory into or out of a sandbox: `mentis cp SANDBOX:PATH LOCAL` or `mentis cp LOCAL SANDBOX:PATH`.
    Cp(files::CpArgs),
    /// Files of a sandbox's workspace.
    #[command(subcommand)]
    Files(files::FilesCommand),
    /// Serve MentisSandbox's tools to an MCP client on stdio (create_sandbox, run_shell, run_python, the file
    /// tools, delete_sandbox): e.g. `{"command": "mentis", "args": ["mcp"]}` in the client's configuration.
    #[command(after_help = mcp::tools_help())]
    Mcp(mcp::McpArgs),
    /// Print a shell completion script (e.g. `mentis completions bash > /etc/bash_completion.d/mentis`).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

async fn run(cli: Cli) -> Result<Status> {
    let conn = || Conn::new(&cli.addr, cli.api_key.as_deref(), cli.ca_cert.as_deref());
    match cli.command {
        Command::Sandbox(c) => sandbox::run(&conn()?, c, cli.output).await,
        Command::Secret(c) => secret::run(&conn()?, c, cli.output).await,
        Command::Snapshot(c) => snapshot::run(&conn()?, c, cli.output).await,
        Command::Template(c) => template::run(&conn()?, c, cli.output).await,
        Command::Preview(c) => preview::run(&conn()?, c, cli.output).await,
        Command::Exec(a) => exec::exec(&conn()?, a).await,
        Command::RunCode(a) => exec::run_code(&conn()?, a).await,
        Command::Shell(a) => shell::run(&conn()?, a).await,
        Command::Terminals(c) => shell::terminals(&conn()?, c, cli.output).await,
        Command::Ps(a) => process::ps(&conn()?, a, cli.output).await,
        Command::Kill(a) => process::kill(&conn()?, a).await,
        Command::Logs(a) => logs::run(&conn()?, a, cli.output).await,
        Command::Cp(a) => files::cp(&conn()?, a).await,
        Command::Files(c) => files::run(&conn()?, c, cli.output).await,
        Command::Mcp(a) => mcp::run(&conn()?, a).await,
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Cli::command(), "mentis", &mut std::io::stdout());
            Ok(0)
        }
    }
}

/// Lets a closed stdout end mentis quietly, as it ends other Unix tools (`mentis logs $SB | head`): by
/// SIGPIPE, instead of the error (and panic of `println!`) that Rust's ignoring of it gives. Not for
/// `exec` and `run-code`, which cancel their action first, nor `shell`, which puts the terminal back.
fn die_on_broken_pipe() {
    #[allow(unsafe_code)]
    // SAFETY: called first thing in main, before any thread exists; SIG_DFL installs no handler code.
    unsafe {
        let _ = nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        );
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(
        cli.command,
        Command::Exec(_) | Command::RunCode(_) | Command::Shell(_)
    ) {
        die_on_broken_pipe();
    }
    let reach = client::Reach::new(&cli.addr, cli.api_key.as_deref());
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("mentis: {e}");
            return ExitCode::from(1);
        }
    };
    let outcome = runtime.block_on(run(cli));
    // Blocking readers (stdin) must not hold the exit up.
    runtime.shutdown_background();
    match outcome {
        Ok(status) => ExitCode::from(status),
        Err(Failure::Rpc(s)) => {
            eprintln!(
                "mentis: {}: {}{}",
                code_name(s.code()),
                s.message(),
                client::causes(&s)
            );
            if let Some(hint) = reach.hint(&s) {
                eprintln!("mentis: {hint}");
            }
            ExitCode::from(1)
        }
        Err(Failure::Usage(m)) => {
            eprintln!("mentis: {m}");
            ExitCode::from(2)
        }
        Err(Failure::Other(e)) => {
            eprintln!("mentis: {e:#}");
            ExitCode::from(1)
        }
    }
}
