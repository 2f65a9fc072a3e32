//! Persistent shell sessions (docs/ARCHITECTURE.md, "Shell sessions"): shell actions that name a session
//! run one after another in one bash, so `cd`, `export` and shell variables carry over. Each command still
//! gets its own cmd_start, output and cmd_end.
//!
//! The session's bash reads commands from its stdin, each as a line with its length in bytes and then the
//! command (read whole with `read -N` under LC_ALL=C: large reads, where reading up to a NUL would take
//! a system call per byte), and runs each inside a function,
//! `eval`'d, with stdin from /dev/null. Inside that function, before the command, it writes a start marker
//! to stdout; after each it writes an end marker with the exit status to stdout and a marker to stderr (see
//! `framer`). A timeout or cancel sends SIGINT to the session's process group, and only once the start
//! marker has come: a SIGINT while the shell still reads the command would end its `read` and so the
//! loop (bash runs the trap and `read` fails), taking the session's state with it. After the start marker:
//! the foreground program dies, the shell's INT trap returns from the function (the rest of the command
//! list does not run) and the shell waits for the next command. A command that does not end within
//! [`INTERRUPT_GRACE`] of the SIGINT (one that ignores or traps SIGINT; a busy loop of the shell's own
//! builtins may not see the trap in time) costs the session its shell: the process group is killed and the next command starts a new one.
//! `exit` ends the session the same way.
//!
//! As the command runs inside a function, `declare` and `typeset` without `-g` make function-local
//! variables (gone after the command), as in any bash function; plain assignments and `export` stay.
//!
//! In an image without bash the session runs in `/bin/sh` ([`SH_LOOP`]), which cannot read up to a NUL:
//! there a command comes as its number of lines, then those lines.

use std::collections::HashMap;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use mentis_model::{CmdEnd, EndReason, ObservationKind, OutputStream, ShellAction};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, ChildStderr, ChildStdin, ChildStdout};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::framer::{Framer, Piece};
use super::output::{COALESCE, MAX_CHUNK};
use super::process::{self, ProcessGroup, blame_limits_of};
use crate::cgroup::Cgroup;
use crate::config::TOKEN_ENV;
use crate::enter::{self, Priority};
use crate::error::Error;
use crate::events::EventSink;
use crate::reclaim::{Processes, Role, Tracked};

/// The loop of a session in `/bin/sh` (no `read -d`): a line with the command's number of lines, then the
/// lines; otherwise as [`LOOP`].
const SH_LOOP: &str = concat!(
    r#"__mentis_t=$1
__mentis_run() { printf '\036%s+\n' "$__mentis_t"; eval "$1"; }
trap 'return 130 2>/dev/null' INT
while IFS= read -r __mentis_n; do
"#,
    process::sh_read_lines!(),
    r#"  __mentis_run "$__mentis_c" </dev/null
  __mentis_s=$?
  printf '\036%s:%d\n' "$__mentis_t" "$__mentis_s"
  printf '\036%s\n' "$__mentis_t" >&2
done
"#
);

/// Sessions a sandbox may hold at once.
pub(crate) const MAX_SESSIONS: usize = 32;
/// After the SIGINT of a timeout or cancel, how long the command has to end before the shell is killed.
pub(crate) const INTERRUPT_GRACE: Duration = Duration::from_secs(2);
/// A stop that came while the shell still read the command waits for its start marker to send the SIGINT;
/// a shell that has not started the command this long after the stop is killed.
const UNREAD_GRACE: Duration = Duration::from_secs(10);

/// The session shell's loop. `$1` is the marker token. `__mentis_run` writes the start marker, then runs
/// the command. The INT trap's `return` leaves `__mentis_run` (and so the rest of the command); outside
/// it, it does nothing (but a SIGINT during `read` ends the loop: see the module's doc).
const LOOP: &str = r#"__mentis_t=$1
__mentis_run() { printf '\036%s+\n' "$__mentis_t"; eval "$1"; }
trap 'return 130 2>/dev/null' INT
while IFS= read -r __mentis_n && LC_ALL=C IFS= read -r -N "$__mentis_n" __mentis_c; do
  __mentis_run "$__mentis_c" </dev/null
  __mentis_s=$?
  printf '\036%s:%d\n' "$__mentis_t" "$__mentis_s"
  printf '\036%s\n' "$__mentis_t" >&2
done
"#;

/// Every session of the sandbox, by name.
#[derive(Default)]
pub(crate) struct Sessions {
    by_name: Mutex<HashMap<String, Arc<Session>>>,
}

/// One session: its shell, when one runs, used by one command at a time (in the order they came).
#[derive(Default)]
pub(crate) struct Session {
    shell: tokio::sync::Mutex<Option<Shell>>,
}

struct Shell {
    child: Child,
    pid: i32,
    group: ProcessGroup,
    control: ChildStdin,
    stdout: ChildStdout,
    stderr: ChildStderr,
    out: Framer,
    err: Framer,
    _tracked: Tracked,
}

impl Sessions {
    /// The session `name`, made when new; RESOURCE_EXHAUSTED beyond [`MAX_SESSIONS`].
    pub(crate) fn get_or_open(&self, name: &str) -> Result<Arc<Session>, Error> {
        let mut by_name = self.by_name.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = by_name.get(name) {
            return Ok(Arc::clone(s));
        }
        if by_name.len() >= MAX_SESSIONS {
            return Err(Error::TooManySessions {
                limit: MAX_SESSIONS,
            });
        }
        let session = Arc::new(Session::default());
        by_name.insert(name.to_owned(), Arc::clone(&session));
        Ok(session)
    }
}

/// What a session command needs from the executor.
pub(crate) struct Context<'a> {
    pub(crate) action: &'a ShellAction,
    /// The sandbox's env, which a new session shell starts with.
    pub(crate) sandbox_env: &'a HashMap<String, String>,
    pub(crate) workspace: &'a std::path::Path,
    /// The action's token (cancel, and shutdown as its parent).
    pub(crate) cancel: &'a CancellationToken,
    pub(crate) processes: &'a Arc<Processes>,
}

/// Why a command stopped before its end marker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stop {
    TimedOut,
    Cancelled,
}

/// Runs a session command to its end, sending its events; returns its cmd_end.
pub(crate) async fn run(session: &Session, ctx: &Context<'_>, sink: &mut EventSink) -> CmdEnd {
    let mut slot = tokio::select! {
        slot = session.shell.lock() => slot,
        () = ctx.cancel.cancelled() => {
            return stopped(EndReason::Cancelled, "cancelled before it started (the session was busy)", Duration::ZERO);
        }
    };
    if slot.is_none() {
        match start(ctx).await {
            Ok((shell, reclaimed)) => {
                if let Some(reclaimed) = reclaimed {
                    sink.send(reclaimed).await;
                }
                *slot = Some(shell);
            }
            Err(message) => return CmdEnd::failed_to_start(message),
        }
    }
    let Some(shell) = slot.as_mut() else {
        return CmdEnd::failed_to_start("the session has no shell".to_owned());
    };
    let cgroup = Cgroup::get();
    let counters = cgroup.counters().await;
    let started = Instant::now();
    sink.send(ObservationKind::CmdStart {
        command: ctx.action.command.clone(),
        pid: shell.pid,
    })
    .await;
    let (end, keep) = drive(shell, ctx, sink, started).await;
    if !keep && let Some(mut gone) = slot.take() {
        gone.group.kill();
        let _ = gone.child.wait().await;
    }
    // A command that ended well is not blamed on a limit: the counters are read again only otherwise (as
    // for a plain command).
    if end.reason == EndReason::Exited && end.exit_code == 0 && end.signal == 0 {
        return end;
    }
    let hits = cgroup.hits_since(counters).await;
    blame_limits_of(end, hits)
}

/// Starts the session's shell: the sandbox env, the workspace, as user code (see `enter`), its own
/// process group.
async fn start(ctx: &Context<'_>) -> Result<(Shell, Option<ObservationKind>), String> {
    let token = uuid::Uuid::new_v4().simple().to_string();
    let path = enter::path_of([ctx.sandbox_env.get("PATH")]);
    let program = process::Shell::get();
    let mut command = enter::command(
        std::ffi::OsStr::new(program.path()),
        ctx.workspace,
        path.as_deref(),
        Priority::Lowered,
    )
    .map_err(|e| format!("cannot start the session's {}: {e}", program.path()))?;
    command
        .arg("-c")
        .arg(match program {
            process::Shell::Bash => LOOP,
            process::Shell::Sh => SH_LOOP,
        })
        .arg("mentis-session")
        .arg(&token)
        .env_remove(TOKEN_ENV)
        .envs(ctx.sandbox_env)
        .process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    let spawned = ctx.processes.spawn(Role::Action, &mut command).await;
    let reclaimed = spawned.reclaimed.as_ref().map(|r| r.observation());
    let (mut child, tracked) = spawned
        .result
        .map_err(|e| format!("cannot start the session's {}: {e}", program.path()))?;
    let pid = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .ok_or_else(|| "the session's shell has no pid".to_owned())?;
    let (Some(control), Some(stdout), Some(stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err("the session's shell has no pipes".to_owned());
    };
    Ok((
        Shell {
            child,
            pid,
            group: ProcessGroup::new(pid),
            control,
            stdout,
            stderr,
            out: Framer::new(&token),
            err: Framer::new(&token),
            _tracked: tracked,
        },
        reclaimed,
    ))
}

/// The command's text as the session runs it: the action's work_dir and env first (they stay, as if
/// typed), then the command.
fn script(action: &ShellAction, shell: process::Shell) -> Vec<u8> {
    let mut s = String::new();
    if !action.work_dir.is_empty() {
        s.push_str(&format!("cd -- {} || return\n", quote(&action.work_dir)));
    }
    for (k, v) in &action.env {
        s.push_str(&format!("export {}={}\n", k, quote(v)));
    }
    s.push_str(&action.command);
    match shell {
        process::Shell::Bash => format!("{}\n{s}", s.len()).into_bytes(),
        process::Shell::Sh => {
            let (lines, text) = process::sh_lines(&s);
            let mut bytes = format!("{lines}\n").into_bytes();
            bytes.extend_from_slice(&text);
            bytes
        }
    }
}

/// `s` in single quotes, for bash.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// A chunk being built (as in `output`): one stream at a time, sent when due, when the stream changes, when
/// full, or before the end.
struct Pending {
    stream: OutputStream,
    data: BytesMut,
    flush_at: Instant,
}

async fn flush(pending: &mut Option<Pending>, sink: &mut EventSink) {
    if let Some(p) = pending.take() {
        sink.send(ObservationKind::CmdOutput {
            stream: p.stream,
            data: p.data.freeze(),
        })
        .await;
    }
}

async fn push(
    pending: &mut Option<Pending>,
    stream: OutputStream,
    data: Bytes,
    sink: &mut EventSink,
) {
    if pending
        .as_ref()
        .is_some_and(|p| p.stream != stream || p.data.len() + data.len() > MAX_CHUNK)
    {
        flush(pending, sink).await;
    }
    let p = pending.get_or_insert_with(|| Pending {
        stream,
        data: BytesMut::new(),
        flush_at: Instant::now() + COALESCE,
    });
    p.data.extend_from_slice(&data);
}

/// Sends the command and follows it to its end. Returns its cmd_end and whether the shell is still good
/// for the next command.
async fn drive(
    shell: &mut Shell,
    ctx: &Context<'_>,
    sink: &mut EventSink,
    started: Instant,
) -> (CmdEnd, bool) {
    let timeout = ctx.action.timeout;
    if let Err(e) = shell
        .control
        .write_all(&script(ctx.action, process::Shell::get()))
        .await
    {
        return (
            CmdEnd::failed_to_start(format!("the session's shell is gone: {e}")),
            false,
        );
    }
    let mut out_buf = vec![0u8; MAX_CHUNK];
    let mut err_buf = vec![0u8; MAX_CHUNK];
    let mut pending: Option<Pending> = None;
    let mut status: Option<i32> = None;
    let (mut out_done, mut err_done) = (false, false);
    let mut stop: Option<(Stop, Instant)> = None;
    // Whether the start marker came: the command runs in `__mentis_run`, where a SIGINT is safe.
    let mut running = false;
    // A stop asked for before the start marker: its SIGINT waits for it.
    let mut interrupt_due = false;
    // When the SIGINT went out: the command's grace runs from there, not from the stop (the shell may still
    // have been reading a long command then).
    let mut interrupted_at: Option<Instant> = None;
    loop {
        if out_done && err_done {
            flush(&mut pending, sink).await;
            let code = status.unwrap_or(-1);
            let duration = started.elapsed();
            let end = match stop {
                None => CmdEnd {
                    exit_code: code,
                    reason: EndReason::Exited,
                    duration,
                    signal: 0,
                    message: String::new(),
                },
                Some((why, _)) => interrupted(
                    why,
                    timeout,
                    duration,
                    "interrupted with SIGINT; the session keeps its state",
                ),
            };
            return (end, true);
        }
        let flush_at = pending.as_ref().map(|p| p.flush_at);
        let deadline = started + timeout;
        let kill_at = kill_at(interrupted_at, stop.map(|(_, at)| at));
        tokio::select! {
            biased;
            () = sleep_until(flush_at), if flush_at.is_some() => flush(&mut pending, sink).await,
            read = shell.stdout.read(&mut out_buf), if !out_done => match read {
                Ok(n) if n > 0 => {
                    for piece in shell.out.feed(&out_buf[..n]) {
                        match piece {
                            Piece::Output(data) => push(&mut pending, OutputStream::Stdout, data, sink).await,
                            Piece::Start => {
                                running = true;
                                if std::mem::take(&mut interrupt_due) {
                                    interrupt(shell.pid);
                                    interrupted_at = Some(Instant::now());
                                }
                            }
                            Piece::End(s) => { status = s; out_done = true; }
                        }
                    }
                }
                _ => return shell_ended(shell, &mut pending, sink, stop, timeout, started).await,
            },
            read = shell.stderr.read(&mut err_buf), if !err_done => match read {
                Ok(n) if n > 0 => {
                    for piece in shell.err.feed(&err_buf[..n]) {
                        match piece {
                            Piece::Output(data) => push(&mut pending, OutputStream::Stderr, data, sink).await,
                            Piece::Start => {}
                            Piece::End(_) => err_done = true,
                        }
                    }
                }
                _ => return shell_ended(shell, &mut pending, sink, stop, timeout, started).await,
            },
            () = tokio::time::sleep_until(deadline), if stop.is_none() => {
                interrupted_at = interrupt_when(running, &mut interrupt_due, shell.pid);
                stop = Some((Stop::TimedOut, Instant::now()));
            }
            () = ctx.cancel.cancelled(), if stop.is_none() => {
                interrupted_at = interrupt_when(running, &mut interrupt_due, shell.pid);
                stop = Some((Stop::Cancelled, Instant::now()));
            }
            () = sleep_until(kill_at), if kill_at.is_some() => {
                flush(&mut pending, sink).await;
                let (why, _) = stop.unwrap_or((Stop::TimedOut, Instant::now()));
                let message = if interrupted_at.is_some() {
                    "did not end within 2 s of SIGINT; the session's shell was killed (the next command \
                     starts a new one)"
                } else {
                    "the session's shell did not start the command within 10 s of the stop; it was killed \
                     (the next command starts a new one)"
                };
                return (interrupted(why, timeout, started.elapsed(), message), false);
            }
        }
    }
}

/// The shell ended (`exit`, killed): the command's end is the shell's. Output still in the pipes is read.
async fn shell_ended(
    shell: &mut Shell,
    pending: &mut Option<Pending>,
    sink: &mut EventSink,
    stop: Option<(Stop, Instant)>,
    timeout: Duration,
    started: Instant,
) -> (CmdEnd, bool) {
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(super::output::EXIT_GRACE, async {
        let _ = shell.stdout.read_to_end(&mut rest).await;
    })
    .await;
    for piece in shell.out.feed(&rest) {
        if let Piece::Output(data) = piece {
            push(pending, OutputStream::Stdout, data, sink).await;
        }
    }
    let mut rest = Vec::new();
    let _ = tokio::time::timeout(super::output::EXIT_GRACE, async {
        let _ = shell.stderr.read_to_end(&mut rest).await;
    })
    .await;
    for piece in shell.err.feed(&rest) {
        if let Piece::Output(data) = piece {
            push(pending, OutputStream::Stderr, data, sink).await;
        }
    }
    for (stream, rest) in [
        (OutputStream::Stdout, shell.out.rest()),
        (OutputStream::Stderr, shell.err.rest()),
    ] {
        if let Some(data) = rest {
            push(pending, stream, data, sink).await;
        }
    }
    flush(pending, sink).await;
    let duration = started.elapsed();
    if let Some((why, _)) = stop {
        return (
            interrupted(why, timeout, duration, "the session's shell ended"),
            false,
        );
    }
    let status = shell.child.wait().await;
    let end = match status {
        Ok(status) => {
            let (exit_code, signal) = super::process::code_and_signal(status);
            CmdEnd {
                exit_code,
                reason: EndReason::Exited,
                duration,
                signal,
                message: "the session's shell exited; the next command starts a new one".to_owned(),
            }
        }
        Err(e) => CmdEnd {
            exit_code: -1,
            reason: EndReason::Exited,
            duration,
            signal: 0,
            message: format!("cannot read the session shell's exit status: {e}"),
        },
    };
    (end, false)
}

fn interrupted(why: Stop, timeout: Duration, duration: Duration, what: &str) -> CmdEnd {
    match why {
        Stop::TimedOut => CmdEnd {
            exit_code: -1,
            reason: EndReason::TimedOut,
            duration,
            signal: 0,
            message: format!("timed out after {} s; {what}", timeout.as_secs_f64()),
        },
        Stop::Cancelled => stopped(
            EndReason::Cancelled,
            &format!("cancelled; {what}"),
            duration,
        ),
    }
}

fn stopped(reason: EndReason, message: &str, duration: Duration) -> CmdEnd {
    CmdEnd {
        exit_code: -1,
        reason,
        duration,
        signal: 0,
        message: message.to_owned(),
    }
}

/// When a stopped command's shell is killed: [`INTERRUPT_GRACE`] after its SIGINT went out, or
/// [`UNREAD_GRACE`] after the stop while the SIGINT still waits for the start marker.
fn kill_at(interrupted_at: Option<Instant>, stopped_at: Option<Instant>) -> Option<Instant> {
    match (interrupted_at, stopped_at) {
        (Some(at), _) => Some(at + INTERRUPT_GRACE),
        (None, Some(at)) => Some(at + UNREAD_GRACE),
        (None, None) => None,
    }
}

/// The SIGINT of a stop: now when the command runs (when it went out), else when its start marker comes
/// (`due`).
fn interrupt_when(running: bool, due: &mut bool, pid: i32) -> Option<Instant> {
    if running {
        interrupt(pid);
        Some(Instant::now())
    } else {
        *due = true;
        None
    }
}

/// SIGINT to the session's process group: its shell (trapped) and the command's foreground programs.
fn interrupt(pid: i32) {
    let _ = killpg(Pid::from_raw(pid), Signal::SIGINT);
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Runs `commands` one after another in one session loop of `program`, as the session does; returns
    /// what each wrote to stdout and its exit status.
    async fn run_in(program: process::Shell, commands: &[&str]) -> Vec<(String, i32)> {
        let dir = tempfile::tempdir().unwrap();
        let mut child = tokio::process::Command::new(program.path())
            .arg("-c")
            .arg(match program {
                process::Shell::Bash => LOOP,
                process::Shell::Sh => SH_LOOP,
            })
            .arg("mentis-session")
            .arg("T")
            .current_dir(dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut out = Vec::new();
        let mut seen = String::new();
        for command in commands {
            let action = ShellAction {
                command: (*command).to_owned(),
                work_dir: String::new(),
                env: [("GREETING".to_owned(), "it's".to_owned())].into(),
                timeout: Duration::from_secs(10),
                stdin: Bytes::new(),
                keep_stdin_open: false,
                session: Some("s".to_owned()),
            };
            stdin.write_all(&script(&action, program)).await.unwrap();
            let marker = "\u{1e}T:";
            while !seen.contains(marker) || !seen[seen.find(marker).unwrap()..].contains('\n') {
                let mut buf = [0u8; 1024];
                let n = stdout.read(&mut buf).await.unwrap();
                assert!(n > 0, "the session's shell ended; output so far: {seen:?}");
                seen.push_str(std::str::from_utf8(&buf[..n]).unwrap());
            }
            let at = seen.find(marker).unwrap();
            let end = at + seen[at..].find('\n').unwrap();
            let status = seen[at + marker.len()..end].parse().unwrap();
            let output = seen[..at].strip_prefix("\u{1e}T+\n");
            let output = output.unwrap_or_else(|| panic!("no start marker first: {seen:?}"));
            out.push((output.to_owned(), status));
            seen = seen[end + 1..].to_owned();
        }
        out
    }

    #[tokio::test]
    async fn a_session_keeps_its_state_in_bash_and_in_sh() {
        // Longer than an argument may be, with what reading could mangle (multibyte text, backslashes).
        let filler = "  x\\y 'q' é \\\n".repeat(20_000);
        let big = format!("cat <<'END' | wc -c\n{filler}END");
        let commands = [
            "mkdir sub && cd sub && x=5 && export Y=6",
            "basename \"$PWD\"; echo \"$x $Y $GREETING\"",
            "printf 'one\\n'\necho two\n\necho 'three\nfour'",
            "false",
            "exit_code_of() { return 3; }\nexit_code_of",
            &big,
            "echo after",
        ];
        let want = vec![
            (String::new(), 0),
            ("sub\n5 6 it's\n".to_owned(), 0),
            ("one\ntwo\nthree\nfour\n".to_owned(), 0),
            (String::new(), 1),
            (String::new(), 3),
            (format!("{}\n", filler.len()), 0),
            ("after\n".to_owned(), 0),
        ];
        for program in [process::Shell::Bash, process::Shell::Sh] {
            assert_eq!(run_in(program, &commands).await, want, "{program:?}");
        }
    }

    /// The loop in bash, in `dir`, as [`start`] runs it (not demoted: a test runs as whoever runs it).
    /// Through `mentis-enter` as there: a test process started with SIGINT ignored (a background job of a
    /// shell without job control, as CI may be) would give a plain child bash an INT it cannot trap.
    async fn test_shell(dir: &std::path::Path, processes: &Arc<Processes>) -> Shell {
        let mut command =
            enter::command(std::ffi::OsStr::new("bash"), dir, None, Priority::Kept).unwrap();
        command
            .arg("-c")
            .arg(LOOP)
            .arg("mentis-session")
            .arg("T")
            .process_group(0)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let (mut child, tracked) = processes
            .spawn(Role::Action, &mut command)
            .await
            .result
            .unwrap();
        let pid = i32::try_from(child.id().unwrap()).unwrap();
        Shell {
            pid,
            group: ProcessGroup::new(pid),
            control: child.stdin.take().unwrap(),
            stdout: child.stdout.take().unwrap(),
            stderr: child.stderr.take().unwrap(),
            child,
            out: Framer::new("T"),
            err: Framer::new("T"),
            _tracked: tracked,
        }
    }

    /// Drives `command` in `shell` as `run` does, cancelled first when `cancelled`; its cmd_end, whether the
    /// shell stays, and its stdout.
    async fn drive_one(
        shell: &mut Shell,
        dir: &std::path::Path,
        processes: &Arc<Processes>,
        command: &str,
        cancelled: bool,
    ) -> (CmdEnd, bool, String) {
        let action = ShellAction {
            command: command.to_owned(),
            work_dir: String::new(),
            env: std::collections::BTreeMap::new(),
            timeout: Duration::from_secs(60),
            stdin: Bytes::new(),
            keep_stdin_open: false,
            session: Some("s".to_owned()),
        };
        let cancel = CancellationToken::new();
        if cancelled {
            cancel.cancel();
        }
        let env = HashMap::new();
        let ctx = Context {
            action: &action,
            sandbox_env: &env,
            workspace: dir,
            cancel: &cancel,
            processes,
        };
        let (mut sink, mut reader) = EventSink::channel();
        let (end, keep) = drive(shell, &ctx, &mut sink, Instant::now()).await;
        drop(sink);
        let mut stdout = Vec::new();
        while let Some(event) = reader.next().await {
            if let ObservationKind::CmdOutput {
                stream: OutputStream::Stdout,
                data,
            } = event.kind
            {
                stdout.extend_from_slice(&data);
            }
        }
        (end, keep, String::from_utf8(stdout).unwrap())
    }

    /// A cancel that comes while the shell still reads a long command (seconds, on a loaded machine)
    /// gets the SIGINT's whole grace once its start marker comes.
    #[test]
    fn the_grace_runs_from_the_sigint_not_from_the_stop() {
        let stop = Instant::now();
        let sigint = stop + Duration::from_secs(3);
        assert_eq!(kill_at(None, None), None);
        assert_eq!(kill_at(None, Some(stop)), Some(stop + UNREAD_GRACE));
        assert_eq!(
            kill_at(Some(sigint), Some(stop)),
            Some(sigint + INTERRUPT_GRACE)
        );
    }

    /// The race of the e2e test `sessions::a_timeout_or_cancel_interrupts_only_the_command_and_a_stubborn_one_costs_the_shell`
    /// made certain: the cancel comes before bash has read the command (a long one, which it reads for a
    /// while). A SIGINT then would end bash's `read` and the loop, and the session's state with it; it waits
    /// for the start marker instead, and the command is interrupted as it starts.
    #[tokio::test]
    async fn a_cancel_before_the_command_runs_interrupts_it_and_keeps_the_session() {
        let dir = tempfile::tempdir().unwrap();
        let processes = Processes::new(false);
        let mut shell = test_shell(dir.path(), &processes).await;
        let (end, keep, _) =
            drive_one(&mut shell, dir.path(), &processes, "export KEPT=yes", false).await;
        assert_eq!(
            (end.reason, end.exit_code, keep),
            (EndReason::Exited, 0, true),
            "{end:?}"
        );
        let long = format!("{}sleep 30; echo after", ": padding\n".repeat(20_000));
        for _ in 0..5 {
            let started = Instant::now();
            let (end, keep, out) = drive_one(&mut shell, dir.path(), &processes, &long, true).await;
            assert_eq!(end.reason, EndReason::Cancelled, "{end:?}");
            assert!(end.message.contains("keeps its state"), "{end:?}");
            assert!(keep, "{end:?}");
            assert_eq!(out, "", "the rest of the command does not run");
            // Neither the sleep's 30 s nor a kill: the SIGINT's grace runs from the start marker, however
            // long a loaded machine took to read the command.
            assert!(started.elapsed() < UNREAD_GRACE, "{:?}", started.elapsed());
        }
        let (end, keep, out) =
            drive_one(&mut shell, dir.path(), &processes, "echo $KEPT", false).await;
        assert_eq!(
            (end.exit_code, keep, out.as_str()),
            (0, true, "yes\n"),
            "{end:?}"
        );
    }
}
