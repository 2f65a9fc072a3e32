//! Shell actions: `/bin/bash -c COMMAND` in its own process group, output streamed as it arrives, exactly one
//! `cmd_end` whatever happens (exit, timeout, cancel, failure to start, shutdown).

mod direct;
mod framer;
pub(crate) mod output;
pub(crate) mod process;
pub(crate) mod session;
pub(crate) mod stdin;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use bytes::Bytes;
use mentis_model::{CmdEnd, ObservationKind, ShellAction};
use tokio::process::Command;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::cgroup::{Cgroup, LimitHits};
use crate::config::TOKEN_ENV;
use crate::enter::{self, Priority};
use crate::events::EventSink;
use crate::reclaim::{Processes, Role};
use crate::registry::Registration;
use process::{ProcessGroup, Shell};
use stdin::StdinWrite;

/// A validated shell action, and the sandbox env it runs under.
#[derive(Debug, Clone)]
pub(crate) struct ShellSpec {
    /// Its work_dir is empty, relative to the workspace, or absolute; its env goes over the sandbox env.
    pub(crate) action: ShellAction,
    /// The sandbox's env (over the image env).
    pub(crate) sandbox_env: HashMap<String, String>,
}

/// What a running shell action gets from the executor.
pub(crate) struct ShellContext {
    pub(crate) workspace: Arc<Path>,
    /// This action's token: cancelled by Cancel, and (as a child of it) by executor shutdown.
    pub(crate) cancel: CancellationToken,
    /// The executor's shutdown token, to tell a cancel from a shutdown and to stop detached drains.
    pub(crate) shutdown: CancellationToken,
    /// Owner of the tasks that outlive the action (draining pipes held by background processes).
    pub(crate) tracker: TaskTracker,
    /// WriteStdin requests, when the action keeps stdin open.
    pub(crate) stdin_writes: Option<mpsc::Receiver<StdinWrite>>,
    /// Spawns the command, reclaiming the pids limit from leftovers when it is full.
    pub(crate) processes: Arc<Processes>,
    /// The session the command runs in (ShellAction.session), if it names one.
    pub(crate) session: Option<Arc<session::Session>>,
}

/// Runs the action to its end and sends its events, the terminal `cmd_end` last.
pub(crate) async fn run(
    spec: ShellSpec,
    ctx: ShellContext,
    mut sink: EventSink,
    registration: Registration,
) {
    let end = execute(spec, ctx, &mut sink).await;
    tracing::info!(reason = ?end.reason, exit_code = end.exit_code, signal = end.signal, "shell action ended");
    // Free the id and the slot before the terminal event, so a client that reacts to cmd_end by reusing the
    // id or starting the next action is not refused.
    drop(registration);
    sink.send(ObservationKind::CmdEnd(end)).await;
}

async fn execute(spec: ShellSpec, ctx: ShellContext, sink: &mut EventSink) -> CmdEnd {
    if let Some(session) = &ctx.session {
        let in_session = session::Context {
            action: &spec.action,
            sandbox_env: &spec.sandbox_env,
            workspace: &ctx.workspace,
            cancel: &ctx.cancel,
            processes: &ctx.processes,
        };
        return session::run(session, &in_session, sink).await;
    }
    let dir = match work_dir(&ctx.workspace, &spec.action.work_dir) {
        Ok(dir) => dir,
        Err(message) => return CmdEnd::failed_to_start(message),
    };
    // Simple commands run through bash until bash has said what it passes on (asked once, beside).
    if Shell::get() == Shell::Bash
        && let Some(asking) = direct::ask_shlvl_once()
    {
        ctx.tracker
            .spawn(asking.instrument(tracing::debug_span!(parent: None, "shlvl")));
    }
    let (mut command, stdin_first) = match command(&spec, &dir) {
        Ok(command) => command,
        Err(e) => {
            return CmdEnd::failed_to_start(format!("cannot start {}: {e}", Shell::get().path()));
        }
    };
    let cgroup = Cgroup::get();
    let counters = cgroup.counters().await;
    let spawned = ctx.processes.spawn(Role::Action, &mut command).await;
    // What was killed to make room is said before the command starts (or fails to).
    if let Some(reclaimed) = &spawned.reclaimed {
        sink.send(reclaimed.observation()).await;
    }
    // Until dropped at the end of this function, the group belongs to a running action; after, what it
    // left running is reclaimable.
    let (mut child, _tracked) = match spawned.result {
        Ok(spawned) => spawned,
        Err(e) => {
            let mut message = format!("cannot start {}: {e}", Shell::get().path());
            if let Some(reclaimed) = &spawned.reclaimed {
                message = format!("{message}; {} and tried again", reclaimed.summary());
            }
            return CmdEnd::failed_to_start(message);
        }
    };
    let started = Instant::now();
    let timeout = spec.action.timeout;
    let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) else {
        // Only possible if the child was already reaped, which nothing did yet.
        return CmdEnd::failed_to_start("the started process has no pid".to_owned());
    };
    // From here on, leaving early (task dropped at runtime shutdown) kills the group.
    let mut group = ProcessGroup::new(pid);
    tracing::debug!(pid, ?dir, "shell action started");
    sink.send(ObservationKind::CmdStart {
        command: spec.action.command.clone(),
        pid,
    })
    .await;

    let exited = CancellationToken::new();
    let detach = output::Detach {
        tracker: &ctx.tracker,
        shutdown: &ctx.shutdown,
    };
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let stdin_pipe = child.stdin.take();
    // One task, three concurrent futures: the timer and cancel are watched even while output waits on a
    // slow reader, and stdin is fed while output is read (a process echoing its input cannot deadlock).
    let (exit, (), ()) = tokio::join!(
        process::supervise(
            child,
            &group,
            started + timeout,
            &ctx.cancel,
            &ctx.shutdown,
            &exited
        ),
        output::pump(stdout, stderr, sink, &exited, &detach),
        stdin::feed(stdin_pipe, stdin_first, ctx.stdin_writes, &exited),
    );
    // On a normal exit background processes (servers started with `&`) keep running by design; on the
    // other paths supervise already killed the group.
    group.disarm();
    let duration = started.elapsed();
    let hits = if exit.succeeded() {
        LimitHits::default()
    } else {
        cgroup.hits_since(counters).await
    };
    process::cmd_end(exit, duration, timeout, hits)
}

/// Resolves and checks the working directory; the error is the `cmd_end` message.
///
/// One stat, done in place: a trip to a blocking thread and back costs more than the call (about 0.1 ms a
/// command in a container, where waking another thread is dear).
pub(crate) fn work_dir(workspace: &Path, work_dir: &str) -> Result<PathBuf, String> {
    // join() keeps an absolute work_dir as given.
    let dir = if work_dir.is_empty() {
        workspace.to_path_buf()
    } else {
        workspace.join(work_dir)
    };
    match std::fs::metadata(&dir) {
        Ok(meta) if meta.is_dir() => Ok(dir),
        Ok(_) => Err(format!("work_dir {} is not a directory", dir.display())),
        Err(e) => Err(format!("work_dir {} is not accessible: {e}", dir.display())),
    }
}

/// The longest argument Linux passes to a program (MAX_ARG_STRLEN, 32 pages, less its NUL): a longer
/// command cannot be `bash -c`'s argument, and comes through stdin instead (see [`long_command`]).
const LONGEST_ARGUMENT: usize = 32 * 4096 - 1;

/// `bash -c COMMAND` (`sh -c` in an image without bash) as user code (see `enter`): the OOM killer's first choice from its start, at a lower
/// CPU priority, as the sandbox user. Also the bytes to write to its stdin before anything else: the
/// action's stdin, after the command itself when it is too long for an argument.
fn command(spec: &ShellSpec, dir: &Path) -> std::io::Result<(Command, Bytes)> {
    let shell = Shell::get();
    let has_stdin = spec.action.keep_stdin_open || !spec.action.stdin.is_empty();
    if shell == Shell::Bash
        && let Some(mut command) = direct::command(
            &spec.action.command,
            dir,
            std::env::vars_os().filter(|(name, _)| name != TOKEN_ENV),
            spec.sandbox_env.iter().chain(&spec.action.env),
            direct::passed_shlvl,
        )
    {
        user_process(&mut command, has_stdin);
        return Ok((command, spec.action.stdin.clone()));
    }
    let path = enter::path_of([spec.action.env.get("PATH"), spec.sandbox_env.get("PATH")]);
    let mut command = enter::command(
        std::ffi::OsStr::new(shell.path()),
        dir,
        path.as_deref(),
        Priority::Lowered,
    )?;
    let long = spec.action.command.len() > LONGEST_ARGUMENT;
    let stdin_first = if long {
        let (script, length, first) = long_command(shell, &spec.action.command, has_stdin);
        command.arg("-c").arg(script).arg(shell.path()).arg(length);
        let mut bytes = first;
        bytes.extend_from_slice(&spec.action.stdin);
        Bytes::from(bytes)
    } else {
        command.arg("-c").arg(&spec.action.command);
        spec.action.stdin.clone()
    };
    command
        // The image env is inherited; the token is ours alone, even if something put it back in our env.
        .env_remove(TOKEN_ENV)
        .envs(&spec.sandbox_env)
        .envs(&spec.action.env);
    user_process(&mut command, has_stdin || long);
    Ok((command, stdin_first))
}

/// A command's process group and pipes.
fn user_process(command: &mut Command, stdin: bool) {
    command
        // Its own group, so a timeout or cancel can kill everything the command started.
        .process_group(0)
        .stdin(if stdin { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Killing is explicit (the whole group, not just bash): see ProcessGroup.
        .kill_on_drop(false);
}

/// A command longer than [`LONGEST_ARGUMENT`]: the shell's script (`$0` stays the shell's path, as with
/// `-c COMMAND`), its one argument (the command's length), and what to write to its stdin first. The shell reads the command from
/// stdin (exactly its length: whatever follows is the action's own stdin), puts stdin back to /dev/null
/// when the action has none, and `eval`s the command. It runs as `-c COMMAND` would, except that a syntax
/// error is reported by `eval` and the last command is not exec'd in place of the shell.
///
/// bash reads the command in large reads (`read -N`, counting bytes under LC_ALL=C) into
/// `BASH_EXECUTION_STRING`, which then holds the command as it does under `-c`. `/bin/sh` has no
/// `read -N`: it reads the command's lines as a session in sh does (`process::sh_read_lines`; a byte a
/// read, slower; only images without bash).
fn long_command(shell: Shell, command: &str, has_stdin: bool) -> (String, String, Vec<u8>) {
    let (read, length, first, text) = match shell {
        Shell::Bash => (
            r#"LC_ALL=C IFS= read -r -N "$1" BASH_EXECUTION_STRING"#,
            command.len(),
            command.as_bytes().to_vec(),
            "$BASH_EXECUTION_STRING",
        ),
        Shell::Sh => {
            let (lines, first) = process::sh_lines(command);
            (
                concat!(
                    "__mentis_n=$1\n",
                    process::sh_read_lines!(),
                    "unset __mentis_n __mentis_l"
                ),
                lines,
                first,
                "$__mentis_c",
            )
        }
    };
    let no_stdin = if has_stdin { "" } else { "exec </dev/null; " };
    let script = format!("{read}; set --; {no_stdin}eval \"{text}\"");
    (script, length.to_string(), first)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Runs [`long_command`]'s script in `shell` as `command` would: stdin piped (or not), the first bytes
    /// then `stdin` written to it. Returns stdout.
    fn run_long(shell: Shell, program: &str, command: &str, stdin: Option<&[u8]>) -> String {
        use std::io::Write;
        let (script, length, mut first) = long_command(shell, command, stdin.is_some());
        first.extend_from_slice(stdin.unwrap_or_default());
        let mut child = std::process::Command::new(program)
            .arg("-c")
            .arg(script)
            .arg(program)
            .arg(length)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut pipe = child.stdin.take().unwrap();
        let writer = std::thread::spawn(move || pipe.write_all(&first).unwrap());
        let out = child.wait_with_output().unwrap();
        writer.join().unwrap();
        assert!(out.status.success(), "{program}: {:?}", out.status);
        String::from_utf8(out.stdout).unwrap()
    }

    #[test]
    fn a_command_too_long_for_an_argument_runs_as_it_would_with_dash_c() {
        // Over the limit, with what a shell's reading could mangle: multibyte text, backslashes, quotes,
        // leading blanks, a last line with no newline.
        let filler = "  x\\y 'q' \"é\" ünïcode\n".repeat(LONGEST_ARGUMENT / 20);
        let command = format!(
            "echo \"$0 $#\"\ncat >/tmp/ignored-$$ <<'END'\n{filler}END\nwc -c </tmp/ignored-$$; rm /tmp/ignored-$$\n\
             readlink /proc/self/fd/0\ncat"
        );
        assert!(command.len() > LONGEST_ARGUMENT);
        let heredoc = filler.len();
        for (shell, program) in [(Shell::Bash, "/bin/bash"), (Shell::Sh, "/bin/sh")] {
            let with_stdin = run_long(shell, program, &command, Some(b"the action's stdin\n"));
            let mut lines = with_stdin.lines();
            assert_eq!(
                lines.next(),
                Some(format!("{program} 0").as_str()),
                "{program}"
            );
            assert_eq!(
                lines.next(),
                Some(heredoc.to_string().as_str()),
                "{program}"
            );
            assert!(lines.next().unwrap().starts_with("pipe:"), "{program}");
            assert_eq!(lines.next(), Some("the action's stdin"), "{program}");
            assert_eq!(lines.next(), None, "{program}");
            // Without stdin, the command reads /dev/null, as when it is an argument.
            let without = run_long(shell, program, &command, None);
            assert!(without.ends_with("/dev/null\n"), "{program}: {without}");
        }
        // bash: the variable holds the command, as under -c.
        let echo =
            "echo \"${#BASH_EXECUTION_STRING}\" #".to_owned() + &"z".repeat(LONGEST_ARGUMENT);
        let out = run_long(Shell::Bash, "/bin/bash", &echo, None);
        assert_eq!(out.trim(), echo.len().to_string());
    }

    #[test]
    fn work_dir_resolution() {
        let ws = tempfile::tempdir().unwrap();
        std::fs::create_dir(ws.path().join("sub")).unwrap();
        std::fs::write(ws.path().join("file"), b"x").unwrap();
        let root = ws.path();
        assert_eq!(work_dir(root, "").unwrap(), root);
        assert_eq!(work_dir(root, "sub").unwrap(), root.join("sub"));
        assert_eq!(work_dir(root, "/tmp").unwrap(), PathBuf::from("/tmp"));
        assert!(
            work_dir(root, "file")
                .unwrap_err()
                .contains("not a directory")
        );
        assert!(
            work_dir(root, "missing")
                .unwrap_err()
                .contains("not accessible")
        );
    }
}
