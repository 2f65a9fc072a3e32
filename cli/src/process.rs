//! `mentis ps` and `mentis kill`: a sandbox's processes (ActionService.ListProcesses) and a signal to one
//! of them (SignalProcess), without a shell.

use clap::Args;
use mentis_proto::api;
use serde_json::{Value, json};

use crate::client::Conn;
use crate::error::{Result, Status};
use crate::output::{self, Format};

#[derive(Args, Debug)]
pub struct PsArgs {
    /// The sandbox.
    sandbox: String,
    /// Also PID 1 and the executor (MentisSandbox's own processes in the sandbox).
    #[arg(long, short = 'a')]
    all: bool,
}

#[derive(Args, Debug)]
pub struct KillArgs {
    /// The sandbox.
    sandbox: String,
    /// The process id, as `mentis ps` shows it.
    pid: i32,
    /// The signal: TERM (default), KILL, INT, HUP, QUIT, USR1, USR2, STOP, CONT, TSTP or WINCH.
    #[arg(long, short = 's', default_value = "TERM")]
    signal: String,
}

pub async fn ps(conn: &Conn, a: PsArgs, format: Format) -> Result<Status> {
    let sandbox = conn.sandbox_id(&a.sandbox).await?;
    let processes: Vec<api::ProcessInfo> = conn
        .actions()
        .list_processes(api::ListProcessesRequest {
            sandbox_id: sandbox,
        })
        .await?
        .into_inner()
        .processes
        .into_iter()
        .filter(|p| a.all || !matches!(p.role.as_str(), "init" | "executor"))
        .collect();
    match format {
        Format::Json => {
            output::print_json(&Value::Array(processes.iter().map(process_json).collect()))
        }
        Format::Text => output::table(
            &[
                "PID", "PPID", "USER", "%CPU", "RSS", "STAT", "STARTED", "COMMAND",
            ],
            &processes
                .iter()
                .map(|p| {
                    vec![
                        p.pid.to_string(),
                        p.ppid.to_string(),
                        p.user.clone(),
                        format!("{:.1}", p.cpu_percent),
                        kib(p.memory_bytes),
                        p.state.clone(),
                        p.start_time
                            .as_ref()
                            .map(output::rfc3339)
                            .unwrap_or_default(),
                        command(p),
                    ]
                })
                .collect::<Vec<_>>(),
        ),
    }
    Ok(0)
}

pub async fn kill(conn: &Conn, a: KillArgs) -> Result<Status> {
    let sandbox = conn.sandbox_id(&a.sandbox).await?;
    conn.actions()
        .signal_process(api::SignalProcessRequest {
            sandbox_id: sandbox,
            pid: a.pid,
            signal: a.signal,
        })
        .await?;
    Ok(0)
}

/// Resident memory as `ps` prints RSS: KiB.
fn kib(bytes: u64) -> String {
    (bytes / 1024).to_string()
}

/// Its argv, or its name in brackets when it shows none (as `ps` does).
fn command(p: &api::ProcessInfo) -> String {
    let mut c = if p.command.is_empty() {
        format!("[{}]", p.name)
    } else {
        p.command.join(" ")
    };
    if !p.role.is_empty() {
        c.push_str(&format!("  ({})", p.role));
    }
    c
}

fn process_json(p: &api::ProcessInfo) -> Value {
    json!({
        "pid": p.pid,
        "ppid": p.ppid,
        "pgid": p.pgid,
        "uid": p.uid,
        "user": p.user,
        "command": p.command,
        "name": p.name,
        "state": p.state,
        "cpu_seconds": p.cpu_seconds,
        "cpu_percent": p.cpu_percent,
        "memory_bytes": p.memory_bytes,
        "start_time": output::time(p.start_time.as_ref()),
        "role": p.role,
    })
}
