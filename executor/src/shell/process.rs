//! The command's process group: waiting for it, killing it on timeout / cancel / shutdown, and reading
//! how it ended.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use mentis_model::{CmdEnd, EndReason};
use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cgroup::LimitHits;

/// The shell that runs commands: bash when the image has it, else its `/bin/sh` (dash, busybox ash...),
/// which `launch` checked every sandbox image has. Decided once, at the first command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Shell {
    Bash,
    Sh,
}

impl Shell {
    pub(crate) const BASH: &str = "/bin/bash";

    /// The shell of this machine (see the type's doc).
    pub(crate) fn get() -> Self {
        static SHELL: std::sync::OnceLock<Shell> = std::sync::OnceLock::new();
        *SHELL.get_or_init(|| {
            if std::path::Path::new(Self::BASH).is_file() {
                Self::Bash
            } else {
                tracing::info!(
                    "this image has no {}: commands run in {}",
                    Self::BASH,
                    crate::launch::SH
                );
                Self::Sh
            }
        })
    }

    pub(crate) fn path(self) -> &'static str {
        match self {
            Self::Bash => Self::BASH,
            Self::Sh => crate::launch::SH,
        }
    }
}

/// `/bin/sh` has no `read -N`, so a command reaches an sh as its number of lines, then the lines: this
/// snippet reads `$__mentis_n` lines into `$__mentis_c` (each with its newline back). Sessions
/// (`session::SH_LOOP`) and long commands (`long_command`) use it, with [`sh_lines`] on the writing side.
macro_rules! sh_read_lines {
    () => {
        r#"__mentis_c=
while [ "$__mentis_n" -gt 0 ] && IFS= read -r __mentis_l; do
  __mentis_c="$__mentis_c$__mentis_l
"
  __mentis_n=$((__mentis_n - 1))
done
"#
    };
}
pub(crate) use sh_read_lines;

/// `text` as [`sh_read_lines`] reads it: every line ends with a newline (the last one too, so each `read`
/// returns it whole), and how many lines that makes.
pub(crate) fn sh_lines(text: &str) -> (usize, Vec<u8>) {
    let mut bytes = text.as_bytes().to_vec();
    if !bytes.ends_with(b"\n") {
        bytes.push(b'\n');
    }
    let lines = bytes.iter().filter(|&&b| b == b'\n').count();
    (lines, bytes)
}

/// Why the executor stopped a command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StopReason {
    TimedOut,
    Cancelled,
    ShutDown,
}

/// How the main process ended, and whether we ended it.
#[derive(Debug)]
pub(crate) struct Exit {
    pub(crate) status: io::Result<ExitStatus>,
    pub(crate) stopped: Option<StopReason>,
}

impl Exit {
    /// Exited 0 by itself: no limit is to blame (see [`blame_limits`]), so the counters need no reading.
    pub(crate) fn succeeded(&self) -> bool {
        self.stopped.is_none() && self.status.as_ref().is_ok_and(ExitStatus::success)
    }
}

/// The process group led by the command's bash (pgid = its pid).
///
/// While armed, dropping it kills the group: if the action's task is dropped before the command ended
/// (runtime torn down), nothing it started survives.
pub(crate) struct ProcessGroup {
    pgid: i32,
    armed: bool,
}

impl ProcessGroup {
    pub(crate) fn new(pgid: i32) -> Self {
        Self { pgid, armed: true }
    }

    /// SIGKILL to every process of the group: bash, its children, and their background jobs.
    pub(crate) fn kill(&self) {
        match killpg(Pid::from_raw(self.pgid), Signal::SIGKILL) {
            // ESRCH: everyone is gone already.
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => tracing::warn!(pgid = self.pgid, error = %e, "cannot kill process group"),
        }
    }

    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if self.armed {
            self.kill();
        }
    }
}

/// Waits for the main process, killing its group when the deadline passes or the action is cancelled.
/// Fires `exited` once the main process is reaped, so output and stdin know to wind down.
pub(crate) async fn supervise(
    mut child: Child,
    group: &ProcessGroup,
    deadline: Instant,
    cancel: &CancellationToken,
    shutdown: &CancellationToken,
    exited: &CancellationToken,
) -> Exit {
    let stopped = tokio::select! {
        status = child.wait() => {
            exited.cancel();
            return Exit { status, stopped: None };
        }
        () = tokio::time::sleep_until(deadline) => StopReason::TimedOut,
        () = cancel.cancelled() => {
            // The action token is a child of the shutdown token: tell the two apart for the message.
            if shutdown.is_cancelled() { StopReason::ShutDown } else { StopReason::Cancelled }
        }
    };
    // The main process is not reaped yet, so the group id cannot have been reused.
    group.kill();
    let status = child.wait().await;
    exited.cancel();
    Exit {
        status,
        stopped: Some(stopped),
    }
}

/// The terminal event for how the command ended, and why when the sandbox's limits had a hand in it.
pub(crate) fn cmd_end(
    exit: Exit,
    duration: Duration,
    timeout: Duration,
    hits: LimitHits,
) -> CmdEnd {
    let stopped = exit.stopped;
    blame_limits(ended(exit, duration, timeout), stopped, hits)
}

/// How the command ended, by its exit status and what the executor did.
fn ended(exit: Exit, duration: Duration, timeout: Duration) -> CmdEnd {
    let signal = exit
        .status
        .as_ref()
        .ok()
        .and_then(ExitStatus::signal)
        .unwrap_or(0);
    let stopped = |reason, message: String| CmdEnd {
        exit_code: -1,
        reason,
        duration,
        signal,
        message,
    };
    match (exit.stopped, exit.status) {
        (Some(StopReason::TimedOut), _) => stopped(
            EndReason::TimedOut,
            format!(
                "timed out after {} s; the process group was killed",
                timeout.as_secs_f64()
            ),
        ),
        (Some(StopReason::Cancelled), _) => stopped(
            EndReason::Cancelled,
            "cancelled; the process group was killed".to_owned(),
        ),
        (Some(StopReason::ShutDown), _) => stopped(
            EndReason::Cancelled,
            "the executor is shutting down; the process group was killed".to_owned(),
        ),
        (None, Ok(status)) => {
            let (exit_code, signal) = code_and_signal(status);
            CmdEnd {
                exit_code,
                reason: EndReason::Exited,
                duration,
                signal,
                message: String::new(),
            }
        }
        (None, Err(e)) => CmdEnd {
            exit_code: -1,
            reason: EndReason::Exited,
            duration,
            signal: 0,
            message: format!("cannot read the exit status: {e}"),
        },
    }
}

/// A process's exit code and the signal that killed it (0 when it exited). Shell convention, and what the
/// proto asks for: killed by signal N = 128 + N.
pub(crate) fn code_and_signal(status: ExitStatus) -> (i32, i32) {
    match (status.code(), status.signal()) {
        (Some(code), _) => (code, 0),
        (None, Some(sig)) => (128 + sig, sig),
        (None, None) => (-1, 0),
    }
}

/// [`blame_limits`] for a command that ended as `end` says (a session command: the executor did not reap
/// it, so its end is all there is).
pub(crate) fn blame_limits_of(end: CmdEnd, hits: LimitHits) -> CmdEnd {
    let stopped = match end.reason {
        EndReason::TimedOut => Some(StopReason::TimedOut),
        EndReason::Cancelled => Some(StopReason::Cancelled),
        _ => None,
    };
    blame_limits(end, stopped, hits)
}

/// Names a limit the command ran into (`hits`: what the sandbox's counters saw during the command), keeping
/// exit_code and signal as they were.
///
/// OOM: the command died of SIGKILL that the executor did not send, either itself (`signal` 9) or a child
/// bash waited for (exit 137), while the OOM kill count rose. Pids: a fork was refused while the command ran
/// and the command then failed or timed out; a fork bomb usually runs until its timeout (its survivors keep
/// trying), and the limit is the better explanation. A command that succeeded despite a refused fork (bash
/// retries) stays EXITED; a cancel or a shutdown stays what it is: someone chose to stop it. The counters
/// are sandbox-wide, so with concurrent commands this is best effort (see `cgroup`).
fn blame_limits(end: CmdEnd, stopped: Option<StopReason>, hits: LimitHits) -> CmdEnd {
    const SIGKILL: i32 = Signal::SIGKILL as i32;
    let killed = end.signal == SIGKILL || end.exit_code == 128 + SIGKILL;
    if stopped.is_none() && killed && hits.oom_kills > 0 {
        return CmdEnd {
            reason: EndReason::OomKilled,
            message: hits.oom_text(),
            ..end
        };
    }
    let failed = match stopped {
        None => end.exit_code != 0,
        Some(StopReason::TimedOut) => true,
        Some(StopReason::Cancelled | StopReason::ShutDown) => false,
    };
    if failed && hits.fork_failures > 0 {
        let message = if end.message.is_empty() {
            hits.pids_text()
        } else {
            format!("{}; then {}", hits.pids_text(), end.message)
        };
        return CmdEnd {
            reason: EndReason::PidsLimitReached,
            message,
            ..end
        };
    }
    end
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(raw_wait_status: i32, stopped: Option<StopReason>) -> Exit {
        Exit {
            status: Ok(ExitStatus::from_raw(raw_wait_status)),
            stopped,
        }
    }

    fn end(exit: Exit, hits: LimitHits) -> CmdEnd {
        let t = Duration::from_secs(5);
        cmd_end(exit, t, t, hits)
    }

    const OOM: LimitHits = LimitHits {
        oom_kills: 1,
        memory_limit: Some(256 << 20),
        fork_failures: 0,
        pids_limit: None,
    };
    const PIDS: LimitHits = LimitHits {
        oom_kills: 0,
        memory_limit: None,
        fork_failures: 3,
        pids_limit: Some(128),
    };

    #[test]
    fn the_oom_killer_is_named_when_it_killed() {
        // Killed by SIGKILL (bash exec'd python), or bash reporting a child's SIGKILL as 137.
        for (raw, code, signal) in [(9, 137, 9), (137 << 8, 137, 0)] {
            let e = end(exit(raw, None), OOM);
            assert_eq!(
                (e.reason, e.exit_code, e.signal),
                (EndReason::OomKilled, code, signal)
            );
            assert_eq!(
                e.message,
                "killed by the out-of-memory killer (memory limit 256 MiB)"
            );
        }
        // Another way to die, or no OOM kill seen: not the OOM killer.
        assert_eq!(end(exit(15, None), OOM).reason, EndReason::Exited);
        assert_eq!(end(exit(1 << 8, None), OOM).reason, EndReason::Exited);
        assert_eq!(
            end(exit(9, None), LimitHits::default()).reason,
            EndReason::Exited
        );
        // Our own SIGKILL at a timeout is the timeout.
        assert_eq!(
            end(exit(9, Some(StopReason::TimedOut)), OOM).reason,
            EndReason::TimedOut
        );
        // Both limits hit and killed: the OOM kill explains the SIGKILL.
        let both = LimitHits {
            fork_failures: 2,
            ..OOM
        };
        assert_eq!(end(exit(9, None), both).reason, EndReason::OomKilled);
    }

    #[test]
    fn the_pids_limit_is_named_when_the_command_failed_or_timed_out() {
        let failed = end(exit(254 << 8, None), PIDS);
        assert_eq!(
            (failed.reason, failed.exit_code, failed.signal),
            (EndReason::PidsLimitReached, 254, 0)
        );
        assert_eq!(
            failed.message,
            "the pids limit (128) was reached: fork failed"
        );
        let timed_out = end(exit(9, Some(StopReason::TimedOut)), PIDS);
        assert_eq!(
            (timed_out.reason, timed_out.exit_code, timed_out.signal),
            (EndReason::PidsLimitReached, -1, 9)
        );
        assert_eq!(
            timed_out.message,
            "the pids limit (128) was reached: fork failed; then timed out after 5 s; the process \
             group was killed"
        );
        // Succeeded anyway (bash retries forks), or stopped on purpose: as it was.
        assert_eq!(end(exit(0, None), PIDS).reason, EndReason::Exited);
        assert_eq!(
            end(exit(9, Some(StopReason::Cancelled)), PIDS).reason,
            EndReason::Cancelled
        );
        assert_eq!(
            end(exit(9, Some(StopReason::ShutDown)), PIDS).reason,
            EndReason::Cancelled
        );
    }

    #[test]
    fn exit_codes_and_signals() {
        let t = Duration::from_secs(1);
        let end = cmd_end(exit(3 << 8, None), t, t, LimitHits::default());
        assert_eq!(
            (end.exit_code, end.signal, end.reason),
            (3, 0, EndReason::Exited)
        );
        // Raw wait status 15 = killed by SIGTERM.
        let end = cmd_end(exit(15, None), t, t, LimitHits::default());
        assert_eq!(
            (end.exit_code, end.signal, end.reason),
            (143, 15, EndReason::Exited)
        );
        let end = cmd_end(
            exit(9, Some(StopReason::TimedOut)),
            t,
            t,
            LimitHits::default(),
        );
        assert_eq!(
            (end.exit_code, end.signal, end.reason),
            (-1, 9, EndReason::TimedOut)
        );
        assert!(end.message.contains("timed out"));
        let end = cmd_end(
            exit(9, Some(StopReason::ShutDown)),
            t,
            t,
            LimitHits::default(),
        );
        assert_eq!(end.reason, EndReason::Cancelled);
        assert!(end.message.contains("shutting down"));
    }
}
