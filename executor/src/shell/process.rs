//! The command's process group: waiting for it, killing it on timeout / cancel / shutdown, and reading
//! how it ended.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Child;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::events::{CmdEnd, EndReason};

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

/// The terminal event for how the command ended.
pub(crate) fn cmd_end(exit: Exit, duration: Duration, timeout: Duration) -> CmdEnd {
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
            let (exit_code, signal) = match (status.code(), status.signal()) {
                (Some(code), _) => (code, 0),
                // Shell convention, and what the proto asks for: killed by signal N = 128 + N.
                (None, Some(sig)) => (128 + sig, sig),
                (None, None) => (-1, 0),
            };
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

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(raw_wait_status: i32, stopped: Option<StopReason>) -> Exit {
        Exit {
            status: Ok(ExitStatus::from_raw(raw_wait_status)),
            stopped,
        }
    }

    #[test]
    fn exit_codes_and_signals() {
        let t = Duration::from_secs(1);
        let end = cmd_end(exit(3 << 8, None), t, t);
        assert_eq!(
            (end.exit_code, end.signal, end.reason),
            (3, 0, EndReason::Exited)
        );
        // Raw wait status 15 = killed by SIGTERM.
        let end = cmd_end(exit(15, None), t, t);
        assert_eq!(
            (end.exit_code, end.signal, end.reason),
            (143, 15, EndReason::Exited)
        );
        let end = cmd_end(exit(9, Some(StopReason::TimedOut)), t, t);
        assert_eq!(
            (end.exit_code, end.signal, end.reason),
            (-1, 9, EndReason::TimedOut)
        );
        assert!(end.message.contains("timed out"));
        let end = cmd_end(exit(9, Some(StopReason::ShutDown)), t, t);
        assert_eq!(end.reason, EndReason::Cancelled);
        assert!(end.message.contains("shutting down"));
    }
}
