//! `mentis exec` (a shell action) and `mentis run-code` (an IPython cell): ActionService.Execute, its
//! observations streamed to stdout and stderr as they come.

use std::io::{Read, Write};

use anyhow::Context;
use clap::Args;
use futures::StreamExt;
use mentis_proto::api::{
    self, action, connect_request, connect_response, execute_response, observation,
};
use tokio::io::AsyncReadExt as _;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

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
    /// Send stdin to the command (as it comes, then its end). Without -i it is sent when it is not a
    /// terminal (a pipe or a file); `< /dev/null` sends none.
    #[arg(long, short = 'i')]
    interactive: bool,
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
    /// Save the images the cell displays (plots) in this folder, as image-<seq>.png and so on; without
    /// it, mentis says on stderr that one was shown.
    #[arg(long, value_name = "DIR")]
    images: Option<std::path::PathBuf>,
}

/// What the streams of Execute and Connect carry for one action.
enum Event {
    Observation(api::Observation),
    Gap(api::LogGap),
    /// Connect's refusal of the submit: its code name and message.
    Rejected(String, String),
    Nothing,
}

/// Runs `action` and hands each observation to `each` until a terminal one, whose status it returns.
/// With `stdin`, the action runs over Connect with its stdin kept open, and mentis's stdin is sent to it
/// as it comes, then closed (as `docker exec -i`); without, over Execute. Ctrl-C cancels the action
/// (CancelAction) and waits for its end, then exits 130; a second Ctrl-C stops waiting.
async fn execute(
    conn: &Conn,
    sandbox: String,
    action: action::Kind,
    stdin: bool,
    mut each: impl FnMut(api::Observation) -> Flow,
) -> Result<Status> {
    use connect_request::Kind as Req;
    // Chosen here, so a Ctrl-C can name it before the server said anything.
    let action_id = uuid::Uuid::new_v4().to_string();
    let mut interrupt = signal(SignalKind::interrupt())?;
    let action = api::Action { kind: Some(action) };
    // Connect's requests after the submit (stdin), while stdin is open.
    let mut requests: Option<mpsc::Sender<api::ConnectRequest>> = None;
    let mut stream: futures::stream::BoxStream<'static, std::result::Result<Event, tonic::Status>> =
        if stdin {
            let (tx, rx) = mpsc::channel(8);
            for kind in [
                Req::Attach(connect_request::Attach {
                    sandbox_id: sandbox.clone(),
                    after_seq: None,
                }),
                Req::Submit(connect_request::Submit {
                    action: Some(action),
                    action_id: action_id.clone(),
                }),
            ] {
                let _ = tx.send(api::ConnectRequest { kind: Some(kind) }).await;
            }
            requests = Some(tx);
            let ours = action_id.clone();
            conn.actions()
                .connect(ReceiverStream::new(rx))
                .await?
                .into_inner()
                .map(move |m| {
                    use connect_response::Kind as K;
                    m.map(|m| match m.kind {
                        Some(K::Observation(o)) if o.action_id == ours => Event::Observation(o),
                        Some(K::Gap(g)) => Event::Gap(g),
                        Some(K::Rejected(r)) if r.action_id == ours || r.action_id.is_empty() => {
                            Event::Rejected(r.code, r.message)
                        }
                        _ => Event::Nothing,
                    })
                })
                .boxed()
        } else {
            conn.actions()
                .execute(api::ExecuteRequest {
                    sandbox_id: sandbox.clone(),
                    action: Some(action),
                    action_id: action_id.clone(),
                })
                .await?
                .into_inner()
                .map(|m| {
                    m.map(|m| match m.kind {
                        Some(execute_response::Kind::Observation(o)) => Event::Observation(o),
                        Some(execute_response::Kind::Gap(g)) => Event::Gap(g),
                        _ => Event::Nothing,
                    })
                })
                .boxed()
        };
    let mut input = tokio::io::stdin();
    let mut buf = vec![0u8; 64 * 1024];
    // Bytes read from stdin and not yet sent; `Some(empty)` is the end of stdin, to be sent.
    let mut pending: Option<Vec<u8>> = None;
    let mut interrupted = false;
    // The CancelAction sent at Ctrl-C or when stdout closed, beside the stream it ends (aborted if the
    // action ends first).
    let mut cancels = tokio::task::JoinSet::new();
    let cancel = |cancels: &mut tokio::task::JoinSet<()>| {
        let mut actions = conn.actions();
        let cancel = api::CancelActionRequest {
            sandbox_id: sandbox.clone(),
            action_id: action_id.clone(),
        };
        cancels.spawn(async move {
            if let Err(s) = actions.cancel_action(cancel).await {
                eprintln!(
                    "mentis: {}: {}",
                    crate::error::code_name(s.code()),
                    s.message()
                );
            }
        });
    };
    loop {
        let event = tokio::select! {
            msg = stream.next() => match msg {
                Some(m) => m?,
                None => break,
            },
            _ = interrupt.recv() => {
                if interrupted {
                    return Ok(INTERRUPTED);
                }
                interrupted = true;
                eprintln!("mentis: cancelling (Ctrl-C again to stop waiting)");
                cancel(&mut cancels);
                continue;
            }
            read = input.read(&mut buf), if requests.is_some() && pending.is_none() => {
                // A read error ends stdin as its end does.
                pending = Some(read.map_or(Vec::new(), |n| buf[..n].to_vec()));
                continue;
            }
            permit = async { requests.clone()?.reserve_owned().await.ok() }, if pending.is_some() => {
                let data = pending.take().unwrap_or_default();
                let eof = data.is_empty();
                if let Some(permit) = permit {
                    permit.send(api::ConnectRequest {
                        kind: Some(Req::Stdin(connect_request::Stdin {
                            action_id: action_id.clone(),
                            data: data.into(),
                            eof,
                        })),
                    });
                }
                if eof {
                    // Our side of the stream closes; the observations keep coming.
                    requests = None;
                }
                continue;
            }
        };
        match event {
            Event::Observation(o) => match each(o) {
                Flow::End(status) => {
                    return Ok(if interrupted { INTERRUPTED } else { status });
                }
                Flow::StdoutClosed if !interrupted => {
                    // Nobody reads what it prints any more: stop it, and end as a closed pipe ends
                    // programs, without a word.
                    cancel(&mut cancels);
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(5), async {
                        while cancels.join_next().await.is_some() {}
                    })
                    .await;
                    return Ok(BROKEN_PIPE);
                }
                _ => {}
            },
            Event::Gap(g) => eprintln!(
                "mentis: the log no longer holds observations {}..{} of this action",
                g.after_seq + 1,
                g.first_available_seq.saturating_sub(1)
            ),
            Event::Rejected(code, message) => {
                return Err(anyhow::anyhow!("{code}: {message}").into());
            }
            Event::Nothing => {}
        }
    }
    Err(anyhow::anyhow!("the stream ended before the action did").into())
}

/// The status after a Ctrl-C (128 + SIGINT), as shells report an interrupted command.
const INTERRUPTED: Status = 130;
/// The status after stdout closed (128 + SIGPIPE), as shells report a program a closed pipe ended.
const BROKEN_PIPE: Status = 141;

/// What to do after an observation.
enum Flow {
    Continue,
    /// The action ended: mentis exits with this status.
    End(Status),
    /// Nobody reads mentis's stdout any more (`mentis exec ... | head`).
    StdoutClosed,
}

/// Writes `data`; false when the reader has gone (a closed pipe). Other errors (a full disk behind a
/// redirection) are not the command's: they are said once on stderr.
fn write_flush(mut w: impl Write, data: &[u8]) -> bool {
    match w.write_all(data).and_then(|()| w.flush()) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => false,
        Err(e) => {
            eprintln!("mentis: writing the output: {e}");
            true
        }
    }
}

/// The flow after writing to stdout.
fn to_stdout(data: &[u8]) -> Flow {
    if write_flush(std::io::stdout().lock(), data) {
        Flow::Continue
    } else {
        Flow::StdoutClosed
    }
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
    let sandbox = conn.sandbox_id(&a.sandbox).await?;
    // stdin goes to the command with -i, or when it is a pipe or a file (not in a session, whose commands
    // read none).
    let stdin = a.interactive || (a.session.is_empty() && stdin_is_data());
    let shell = api::ShellAction {
        command: a.command.join(" "),
        work_dir: a.workdir,
        env: pairs(&a.env, "--env")?,
        timeout_seconds: a.timeout,
        session: a.session,
        keep_stdin_open: stdin,
        ..Default::default()
    };
    execute(
        conn,
        sandbox,
        action::Kind::Shell(shell),
        stdin,
        |o| match o.kind {
            Some(observation::Kind::CmdOutput(out)) => {
                if out.stream() == api::OutputStream::Stderr {
                    write_flush(std::io::stderr().lock(), &out.data);
                    Flow::Continue
                } else {
                    to_stdout(&out.data)
                }
            }
            Some(observation::Kind::CmdEnd(end)) => Flow::End(cmd_status(&end)),
            Some(observation::Kind::Error(e)) => {
                eprintln!("mentis: {}", e.message);
                Flow::Continue
            }
            _ => Flow::Continue,
        },
    )
    .await
}

/// Whether stdin is a pipe, a socket or a file, rather than a terminal or a device such as /dev/null.
fn stdin_is_data() -> bool {
    use std::os::fd::AsFd as _;
    use std::os::unix::fs::FileTypeExt as _;
    let Ok(fd) = std::io::stdin().as_fd().try_clone_to_owned() else {
        return false;
    };
    std::fs::File::from(fd)
        .metadata()
        .map(|m| {
            let t = m.file_type();
            t.is_fifo() || t.is_socket() || t.is_file()
        })
        .unwrap_or(false)
}

/// The file extension of an image MIME type a cell can display.
fn image_extension(mime: &str) -> Option<&'static str> {
    Some(match mime {
        "image/png" => "png",
        "image/jpeg" => "jpg",
        "image/gif" => "gif",
        "image/webp" => "webp",
        "image/svg+xml" => "svg",
        _ => return None,
    })
}

/// Saves the images of a display in `dir` as `image-<seq>[-<n>].<ext>` (the observation's seq), and
/// says on stderr where each went; without a folder, says that one was shown and how to keep it.
fn save_images(o: &api::Observation, out: &api::IPythonOutput, dir: Option<&std::path::Path>) {
    use base64::Engine as _;
    let mut images: Vec<(&str, &'static str, &String)> = out
        .data
        .iter()
        .filter_map(|(mime, data)| image_extension(mime).map(|ext| (mime.as_str(), ext, data)))
        .collect();
    images.sort();
    for (n, (mime, ext, data)) in images.iter().enumerate() {
        let bytes = if *ext == "svg" {
            Ok(data.as_bytes().to_vec())
        } else {
            base64::engine::general_purpose::STANDARD.decode(data.trim())
        };
        let bytes = match bytes {
            Ok(b) => b,
            Err(e) => {
                eprintln!("mentis: the cell's {mime} is not base64: {e}");
                continue;
            }
        };
        let Some(dir) = dir else {
            eprintln!(
                "mentis: the cell displayed an image ({mime}, {} bytes): --images DIR saves it",
                bytes.len()
            );
            continue;
        };
        let name = if images.len() == 1 {
            format!("image-{}.{ext}", o.seq)
        } else {
            format!("image-{}-{}.{ext}", o.seq, n + 1)
        };
        let path = dir.join(name);
        match std::fs::create_dir_all(dir).and_then(|()| std::fs::write(&path, &bytes)) {
            Ok(()) => eprintln!(
                "mentis: saved {mime} ({} bytes) to {}",
                bytes.len(),
                path.display()
            ),
            Err(e) => eprintln!("mentis: saving {mime} to {}: {e}", path.display()),
        }
    }
}

pub async fn run_code(conn: &Conn, a: RunCodeArgs) -> Result<Status> {
    let sandbox = conn.sandbox_id(&a.sandbox).await?;
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
    let images = a.images;
    execute(
        conn,
        sandbox,
        action::Kind::Ipython(cell),
        false,
        |o| match &o.kind {
            Some(observation::Kind::IpythonOutput(out)) => {
                use api::IpythonOutputKind as K;
                match out.kind() {
                    K::StreamStderr => {
                        write_flush(std::io::stderr().lock(), out.text.as_bytes());
                        Flow::Continue
                    }
                    K::StreamStdout => to_stdout(out.text.as_bytes()),
                    _ => {
                        save_images(&o, out, images.as_deref());
                        // A result or display: its plain-text form, the way IPython prints it.
                        if let Some(text) = out.data.get("text/plain") {
                            to_stdout(format!("{text}\n").as_bytes())
                        } else if !out.text.is_empty() {
                            to_stdout(out.text.as_bytes())
                        } else {
                            Flow::Continue
                        }
                    }
                }
            }
            Some(observation::Kind::IpythonResult(r)) => Flow::End(match r.status() {
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
            Some(observation::Kind::Error(e)) => {
                eprintln!("mentis: {}", e.message);
                Flow::Continue
            }
            _ => Flow::Continue,
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
