//! `mentis exec` (a shell action) and `mentis run-code` (an IPython cell): ActionService.Execute, its
//! observations streamed to stdout and stderr as they come.

use std::io::{Read, Write};

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use mentis_proto::api::{self, action, execute_response, observation};
use tokio::signal::unix::{SignalKind, signal};

use crate::client::{Conn, pairs};
use crate::error::{Result, Status};

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// The sandbox.
    sandbox: String,
    /// Working directory (default /workspace; relative paths are taken from /workspace).
    #[arg(long, short = 'w', default_value = "", hide_default_value = true)]
    workdir: String,
    /// Environment variable for the command (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// Stop the command after this many seconds (0: the runtime's default, 300); mentis then exits 124.
    #[arg(long, default_value_t = 0)]
    timeout: u32,
    /// Run in this persistent shell session (its directory and variables carry over between commands).
    #[arg(long, default_value = "", hide_default_value = true)]
    session: String,
    /// The command: the words after `--`, joined with spaces, run by `bash -c` in the sandbox.
    #[arg(last = true, required = true, value_name = "CMD")]
    command: Vec<String>,
}

#[derive(Args, Debug)]
pub struct RunCodeArgs {
    /// The sandbox.
    sandbox: String,
    /// A Python file, or `-` for stdin.
    file: String,
    /// Stop the cell after this many seconds (0: the runtime's default).
    #[arg(long, default_value_t = 0)]
    timeout: u32,
}

/// Runs `action` and hands each observation to `each` until a terminal one, whose status it returns.
/// Ctrl-C cancels the action (CancelAction) and waits for its end, then exits 130; a second Ctrl-C stops
/// waiting.
async fn execute(
    conn: &Conn,
    sandbox: String,
    action: action::Kind,
    mut each: impl FnMut(observation::Kind) -> Option<Status>,
) -> Result<Status> {
    // Chosen here, so a Ctrl-C can name it before the server said anything.
    let action_id = uuid::Uuid::new_v4().to_string();
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut stream = conn
        .actions()
        .execute(api::ExecuteRequest {
            sandbox_id: sandbox.clone(),
            action: Some(api::Action { kind: Some(action) }),
            action_id: action_id.clone(),
        })
        .await?
        .into_inner();
    let mut interrupted = false;
    // The CancelAction sent at Ctrl-C, beside the stream it ends (aborted if the action ends first).
    let mut cancels = tokio::task::JoinSet::new();
    loop {
        let msg = tokio::select! {
            msg = stream.next() => msg,
            _ = interrupt.recv() => {
                if interrupted {
                    return Ok(INTERRUPTED);
                }
                interrupted = true;
                eprintln!("mentis: cancelling (Ctrl-C again to stop waiting)");
                let mut actions = conn.actions();
                let cancel = api::CancelActionRequest {
                    sandbox_id: sandbox.clone(),
                    action_id: action_id.clone(),
                };
                cancels.spawn(async move {
                    if let Err(s) = actions.cancel_action(cancel).await {
                        eprintln!("mentis: {}: {}", crate::error::code_name(s.code()), s.message());
                    }
                });
                continue;
            }
        };
        let Some(msg) = msg else { break };
        match msg?.kind {
            Some(execute_response::Kind::Observation(o)) => {
                if let Some(kind) = o.kind
                    && let Some(status) = each(kind)
                {
                    return Ok(if interrupted { INTERRUPTED } else { status });
                }
            }
            Some(execute_response::Kind::Gap(g)) => eprintln!(
                "mentis: the log no longer holds observations {}..{} of this action",
                g.after_seq + 1,
                g.first_available_seq.saturating_sub(1)
            ),
            Some(execute_response::Kind::Keepalive(_)) | None => {}
        }
    }
    Err(anyhow::anyhow!("the stream ended before the action did").into())
}

/// The status after a Ctrl-C (128 + SIGINT), as shells report an interrupted command.
const INTERRUPTED: Status = 130;

fn write_flush(mut w: impl Write, data: &[u8]) {
    // A closed pipe (`mentis exec ... | head`) is not an error of the command.
    let _ = w.write_all(data);
    let _ = w.flush();
}

/// The exit status for a command's end (docs/CLI.md, Exit codes).
pub fn cmd_status(end: &api::CmdEnd) -> Status {
    use api::EndReason;
    let reason = end.reason();
    let clamp = |c: i32| u8::try_from(c.clamp(0, 255)).unwrap_or(1);
    match reason {
        EndReason::Exited | EndReason::Unspecified => {
            if end.signal != 0 {
                clamp(128 + end.signal)
            } else {
                clamp(end.exit_code)
            }
        }
        _ => {
            let name = crate::output::enum_name(reason.as_str_name(), "END_REASON_");
            if end.message.is_empty() {
                eprintln!("mentis: command ended: {name}");
            } else {
                eprintln!("mentis: command ended: {name}: {}", end.message);
            }
            match reason {
                EndReason::TimedOut => 124,
                EndReason::OomKilled | EndReason::PidsLimitReached if end.signal != 0 => {
                    clamp(128 + end.signal)
                }
                EndReason::OomKilled | EndReason::PidsLimitReached if end.exit_code > 0 => {
                    clamp(end.exit_code)
                }
                _ => 1,
            }
        }
    }
}

pub async fn exec(conn: &Conn, a: ExecArgs) -> Result<Status> {
    let shell = api::ShellAction {
        command: a.command.join(" "),
        work_dir: a.workdir,
        env: pairs(&a.env, "--env")?,
        timeout_seconds: a.timeout,
        session: a.session,
        ..Default::default()
    };
    execute(
        conn,
        a.sandbox,
        action::Kind::Shell(shell),
        |kind| match kind {
            observation::Kind::CmdOutput(out) => {
                if out.stream() == api::OutputStream::Stderr {
                    write_flush(std::io::stderr().lock(), &out.data);
                } else {
                    write_flush(std::io::stdout().lock(), &out.data);
                }
                None
            }
            observation::Kind::CmdEnd(end) => Some(cmd_status(&end)),
            observation::Kind::Error(e) => {
                eprintln!("mentis: {}", e.message);
                None
            }
            _ => None,
        },
    )
    .await
}

pub async fn run_code(conn: &Conn, a: RunCodeArgs) -> Result<Status> {
    let mut code = String::new();
    if a.file == "-" {
        std::io::stdin()
            .read_to_string(&mut code)
            .context("reading the code from stdin")?;
    } else {
        code = std::fs::read_to_string(&a.file).with_context(|| format!("reading {}", a.file))?;
    }
    let cell = api::IPythonAction {
        code,
        timeout_seconds: a.timeout,
        ..Default::default()
    };
    execute(
        conn,
        a.sandbox,
        action::Kind::Ipython(cell),
        |kind| match kind {
            observation::Kind::IpythonOutput(out) => {
                use api::IpythonOutputKind as K;
                match out.kind() {
                    K::StreamStderr => write_flush(std::io::stderr().lock(), out.text.as_bytes()),
                    K::StreamStdout => write_flush(std::io::stdout().lock(), out.text.as_bytes()),
                    _ => {
                        // A result or display: its plain-text form, the way IPython prints it.
                        if let Some(text) = out.data.get("text/plain") {
                            write_flush(std::io::stdout().lock(), format!("{text}\n").as_bytes());
                        } else if !out.text.is_empty() {
                            write_flush(std::io::stdout().lock(), out.text.as_bytes());
                        }
                    }
                }
                None
            }
            observation::Kind::IpythonResult(r) => Some(match r.status() {
                api::IpythonStatus::Ok => 0,
                api::IpythonStatus::Error => {
                    for line in &r.traceback {
                        eprintln!("{line}");
                    }
                    if r.traceback.is_empty() {
                        eprintln!("{}: {}", r.error_name, r.error_value);
                    }
                    1
                }
                _ => {
                    eprintln!("mentis: cell aborted: {}", r.reason);
                    if r.reason.to_lowercase().contains("time") {
                        124
                    } else {
                        1
                    }
                }
            }),
            observation::Kind::Error(e) => {
                eprintln!("mentis: {}", e.message);
                None
            }
            _ => None,
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(reason: api::EndReason, exit_code: i32, signal: i32) -> api::CmdEnd {
        api::CmdEnd {
            exit_code,
            reason: reason as i32,
            signal,
            ..Default::default()
        }
    }

    #[test]
    fn a_commands_end_maps_to_an_exit_status() {
        use api::EndReason::*;
        assert_eq!(cmd_status(&end(Exited, 0, 0)), 0);
        assert_eq!(cmd_status(&end(Exited, 7, 0)), 7);
        assert_eq!(cmd_status(&end(Exited, 300, 0)), 255);
        assert_eq!(cmd_status(&end(Exited, -1, 9)), 137);
        assert_eq!(cmd_status(&end(TimedOut, -1, 9)), 124);
        assert_eq!(cmd_status(&end(Cancelled, -1, 9)), 1);
        assert_eq!(cmd_status(&end(Lost, -1, 0)), 1);
        assert_eq!(cmd_status(&end(FailedToStart, -1, 0)), 1);
        assert_eq!(cmd_status(&end(OomKilled, -1, 9)), 137);
        assert_eq!(cmd_status(&end(PidsLimitReached, 2, 0)), 2);
        assert_eq!(cmd_status(&end(PidsLimitReached, -1, 0)), 1);
    }
}
