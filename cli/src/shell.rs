//! `mentis shell`: an interactive terminal in a sandbox (TerminalService.Open), like `docker exec -it`.
//! With a terminal on stdin, it is put in raw mode (every key goes to the sandbox, Ctrl-C included) and
//! restored on every way out; the local size is sent at the start and on each SIGWINCH. Without one (a
//! pipe), bytes are forwarded as they are and the end of input is sent as Ctrl-D (repeated until the program
//! ends).

use std::io::{IsTerminal, Read, Write};

use clap::Args;
use mentis_proto::api::{self, open_request, open_response};
use rustix::termios::{self, OptionalActions, Termios};
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::client::{Conn, pairs};
use crate::error::{Result, Status};

#[derive(Args, Debug)]
pub struct ShellArgs {
    /// The sandbox.
    sandbox: String,
    /// Re-attach to a terminal that is still running (its scrollback is replayed first).
    #[arg(long, value_name = "TERMINAL_ID", conflicts_with_all = ["command", "workdir", "env"])]
    attach: Option<String>,
    /// Working directory (default /workspace).
    #[arg(long, short = 'w')]
    workdir: Option<String>,
    /// Environment variable for the program (repeatable).
    #[arg(long = "env", short = 'e', value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// The program and its arguments (no shell), after `--`; default: a login bash.
    #[arg(last = true, value_name = "CMD")]
    command: Vec<String>,
}

/// The terminal in raw mode while this lives; its settings are put back when it is dropped.
struct RawMode {
    saved: Termios,
}

impl RawMode {
    fn enable() -> std::io::Result<Self> {
        let stdin = std::io::stdin();
        let saved = termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        termios::tcsetattr(&stdin, OptionalActions::Now, &raw)?;
        Ok(Self { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = termios::tcsetattr(std::io::stdin(), OptionalActions::Now, &self.saved);
    }
}

/// The local terminal's size (columns, rows), when stdout or stdin is a terminal.
fn local_size() -> Option<(u32, u32)> {
    let ws = termios::tcgetwinsize(std::io::stdout())
        .or_else(|_| termios::tcgetwinsize(std::io::stdin()))
        .ok()?;
    (ws.ws_col > 0 && ws.ws_row > 0).then(|| (u32::from(ws.ws_col), u32::from(ws.ws_row)))
}

fn input(data: Vec<u8>) -> api::OpenRequest {
    api::OpenRequest {
        kind: Some(open_request::Kind::Input(open_request::Input {
            data: data.into(),
        })),
    }
}

fn resize((cols, rows): (u32, u32)) -> api::OpenRequest {
    api::OpenRequest {
        kind: Some(open_request::Kind::Resize(open_request::Resize {
            cols,
            rows,
        })),
    }
}

/// The program of a terminal started with no command while stdin is not a terminal: a login bash without
/// readline (no line editing, so no bracketed-paste codes and no second echo) on a terminal that does not
/// echo, so the output is the programs' own, as with `docker exec -i`.
const PIPED_COMMAND: [&str; 3] = [
    "/bin/bash",
    "-c",
    "stty -echo 2>/dev/null; exec /bin/bash --noediting -l",
];

pub async fn run(conn: &Conn, mut a: ShellArgs) -> Result<Status> {
    a.sandbox = conn.sandbox_id(&a.sandbox).await?;
    // Signals are caught first: a window change from now on is not lost, and none of them can leave the
    // terminal raw.
    let mut winch = signal(SignalKind::window_change())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut hangup = signal(SignalKind::hangup())?;
    let mut interrupt = signal(SignalKind::interrupt())?;
    let tty = std::io::stdin().is_terminal();
    let size = local_size();
    let first = match &a.attach {
        Some(terminal_id) => open_request::Kind::Attach(open_request::Attach {
            sandbox_id: a.sandbox.clone(),
            terminal_id: terminal_id.clone(),
            after_seq: 0,
        }),
        None => {
            let (cols, rows) = size.unwrap_or((0, 0));
            let command = if a.command.is_empty() && !tty {
                PIPED_COMMAND.map(str::to_owned).to_vec()
            } else {
                a.command.clone()
            };
            open_request::Kind::Start(open_request::Start {
                sandbox_id: a.sandbox.clone(),
                command,
                cols,
                rows,
                env: pairs(&a.env, "--env")?,
                work_dir: a.workdir.clone().unwrap_or_default(),
                idle_timeout_seconds: 0,
            })
        }
    };
    let (tx, rx) = mpsc::channel::<api::OpenRequest>(64);
    let _ = tx.send(api::OpenRequest { kind: Some(first) }).await;
    let mut stream = conn
        .terminals()
        .open(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let terminal_id = match stream.message().await? {
        Some(api::OpenResponse {
            kind: Some(open_response::Kind::Started(started)),
        }) => started.terminal_id,
        other => {
            return Err(anyhow::anyhow!("expected the terminal's start, got {other:?}").into());
        }
    };
    let _raw = if tty { Some(RawMode::enable()?) } else { None };
    // An attached terminal takes this size; a started one too when the window changed meanwhile.
    if let Some(now) = local_size()
        && (a.attach.is_some() || Some(now) != size)
    {
        let _ = tx.send(resize(now)).await;
    }
    // stdin is read by a thread of its own (a blocking read); it is simply left behind at the end.
    let keys = tx.clone();
    // The piped shell turns the terminal's echo off first (PIPED_COMMAND): input sent before that would be
    // echoed back, so it waits for the first output (the prompt, printed after `stty -echo`), 5 s at most.
    let piped = a.command.is_empty() && !tty && a.attach.is_none();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let mut ready_tx = piped.then_some(ready_tx);
    std::thread::spawn(move || {
        if piped {
            let _ = ready_rx.recv_timeout(std::time::Duration::from_secs(5));
        }
        let mut stdin = std::io::stdin().lock();
        let mut buf = [0u8; 4096];
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    if !tty {
                        // End of piped input: Ctrl-D, so a shell at its prompt ends. Again every half
                        // second: one that reaches the terminal while it is still in line mode (before
                        // bash's readline took it, or during a command) can be lost.
                        while keys.blocking_send(input(vec![0x04])).is_ok() {
                            std::thread::sleep(std::time::Duration::from_millis(500));
                        }
                    }
                    break;
                }
                Ok(n) => {
                    if keys.blocking_send(input(buf[..n].to_vec())).is_err() {
                        break;
                    }
                }
            }
        }
    });
    let mut stdout = std::io::stdout();
    loop {
        tokio::select! {
            msg = stream.message() => match msg? {
                Some(api::OpenResponse { kind: Some(open_response::Kind::Output(out)) }) => {
                    if let Some(ready) = ready_tx.take() {
                        let _ = ready.send(());
                    }
                    stdout.write_all(&out.data)?;
                    stdout.flush()?;
                }
                Some(api::OpenResponse { kind: Some(open_response::Kind::Exited(e)) }) => {
                    return Ok(u8::try_from(e.exit_code.clamp(0, 255)).unwrap_or(1));
                }
                Some(_) => {}
                None => return exit_code_of(conn, &a.sandbox, &terminal_id).await,
            },
            _ = winch.recv() => {
                if let Some(size) = local_size() {
                    let _ = tx.send(resize(size)).await;
                }
            }
            // Not in raw mode (stdin is not a terminal): Ctrl-C goes to the remote program too.
            _ = interrupt.recv() => {
                let _ = tx.send(input(vec![0x03])).await;
            }
            // The local terminal went away or mentis was asked to stop: the remote terminal keeps running
            // (re-attach with --attach) until its idle timeout.
            _ = term.recv() => return Ok(143),
            _ = hangup.recv() => return Ok(129),
        }
    }
}

/// The exit status of a terminal whose stream ended without `exited` (a runtime before the fix of that
/// race, or a stream cut otherwise): what ListTerminals says, asked for a few seconds.
async fn exit_code_of(conn: &Conn, sandbox: &str, terminal_id: &str) -> Result<Status> {
    for _ in 0..20 {
        let list = conn
            .terminals()
            .list_terminals(api::ListTerminalsRequest {
                sandbox_id: sandbox.to_owned(),
            })
            .await?
            .into_inner()
            .terminals;
        match list.iter().find(|t| t.terminal_id == terminal_id) {
            Some(t) => {
                if let Some(code) = t.exit_code {
                    return Ok(u8::try_from(code.clamp(0, 255)).unwrap_or(1));
                }
            }
            None => break,
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
    Err(anyhow::anyhow!("the terminal's stream ended before its program").into())
}

#[derive(clap::Subcommand, Debug)]
pub enum TerminalsCommand {
    /// A sandbox's terminals (to re-attach with `mentis shell SANDBOX --attach TERMINAL_ID`).
    Ls { sandbox: String },
    /// Hang up a terminal (its session gets SIGHUP, then SIGKILL).
    Close {
        sandbox: String,
        terminal_id: String,
    },
    /// Print a link that opens a terminal of the sandbox in a browser (the runtime's web terminal): a new
    /// login bash, or TERMINAL_ID's. The link carries a short-lived token instead of your key.
    Link {
        sandbox: String,
        terminal_id: Option<String>,
        /// How long the link lives, in seconds (default one hour, at most 12 hours).
        #[arg(long, value_name = "SECONDS")]
        ttl: Option<u32>,
    },
}

pub async fn terminals(
    conn: &Conn,
    cmd: TerminalsCommand,
    format: crate::output::Format,
) -> Result<Status> {
    use crate::output::{self, Format};
    let mut c = conn.terminals();
    match cmd {
        TerminalsCommand::Link {
            sandbox,
            terminal_id,
            ttl,
        } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            let r = c
                .create_terminal_link(api::CreateTerminalLinkRequest {
                    sandbox_id: sandbox,
                    terminal_id: terminal_id.unwrap_or_default(),
                    ttl_seconds: ttl.unwrap_or(0),
                })
                .await?
                .into_inner();
            match format {
                Format::Json => output::print_json(&serde_json::json!({
                    "url": r.url,
                    "path": r.path,
                    "expires_at": output::time(r.expires_at.as_ref()),
                })),
                Format::Text => println!("{}", r.url),
            }
        }
        TerminalsCommand::Ls { sandbox } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            let list = c
                .list_terminals(api::ListTerminalsRequest {
                    sandbox_id: sandbox,
                })
                .await?
                .into_inner()
                .terminals;
            match format {
                Format::Json => output::print_json(&serde_json::Value::Array(
                    list.iter()
                        .map(|t| {
                            serde_json::json!({
                                "terminal_id": t.terminal_id,
                                "command": t.command,
                                "cols": t.cols,
                                "rows": t.rows,
                                "pid": t.pid,
                                "created_at": output::time(t.created_at.as_ref()),
                                "last_seq": t.last_seq,
                                "attached": t.attached,
                                "exit_code": t.exit_code,
                            })
                        })
                        .collect(),
                )),
                Format::Text => output::table(
                    &[
                        "TERMINAL", "PID", "SIZE", "ATTACHED", "EXIT", "CREATED", "COMMAND",
                    ],
                    &list
                        .iter()
                        .map(|t| {
                            vec![
                                t.terminal_id.clone(),
                                t.pid.to_string(),
                                format!("{}x{}", t.cols, t.rows),
                                t.attached.to_string(),
                                t.exit_code.map(|c| c.to_string()).unwrap_or_default(),
                                t.created_at
                                    .as_ref()
                                    .map(output::rfc3339)
                                    .unwrap_or_default(),
                                t.command.join(" "),
                            ]
                        })
                        .collect::<Vec<_>>(),
                ),
            }
        }
        TerminalsCommand::Close {
            sandbox,
            terminal_id,
        } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            c.close_terminal(api::CloseTerminalRequest {
                sandbox_id: sandbox,
                terminal_id,
            })
            .await?;
        }
    }
    Ok(0)
}
