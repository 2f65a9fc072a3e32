//! What an action reports (its start, output and end, and the sandbox-level events seen while it ran): the
//! kinds of observation, as the executor produces them and the control plane logs them (see
//! docs/ARCHITECTURE.md, "Observations"; the control plane adds the per-sandbox seq and the ids).

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;

use crate::action::ActionKind;

/// Which pipe output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputStream {
    Stdout,
    Stderr,
}

/// Why a shell command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    Exited,
    TimedOut,
    Cancelled,
    /// The control plane lost the command (executor or container gone); its outcome is unknown.
    Lost,
    FailedToStart,
    /// The out-of-memory killer ended it (the sandbox's memory limit was reached).
    OomKilled,
    /// It failed or timed out after the sandbox's pids limit refused a fork.
    PidsLimitReached,
}

/// Terminal observation of a shell action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmdEnd {
    /// Exit code for `Exited` (128 + signal when a signal ended it); -1 otherwise.
    pub exit_code: i32,
    pub reason: EndReason,
    pub duration: Duration,
    /// The signal that ended the process, 0 when none.
    pub signal: i32,
    pub message: String,
}

impl CmdEnd {
    /// The end of a command that could not be started; `message` says why.
    pub fn failed_to_start(message: String) -> Self {
        Self {
            exit_code: -1,
            reason: EndReason::FailedToStart,
            duration: Duration::ZERO,
            signal: 0,
            message,
        }
    }
}

/// Which Jupyter message an IPython output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IPythonOutputKind {
    Stdout,
    Stderr,
    DisplayData,
    ExecuteResult,
    UpdateDisplayData,
}

/// Stream text or a MIME bundle (MIME type -> content as text) from a cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IPythonOutput {
    pub kind: IPythonOutputKind,
    pub text: String,
    pub data: BTreeMap<String, String>,
    pub display_id: String,
}

/// How a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IPythonStatus {
    Ok,
    Error,
    Aborted,
}

/// Terminal observation of an IPython action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IPythonResult {
    pub status: IPythonStatus,
    /// 0 when the kernel never started the cell.
    pub execution_count: i32,
    pub error_name: String,
    pub error_value: String,
    pub traceback: Vec<String>,
    /// Why the cell was aborted; empty otherwise.
    pub reason: String,
    pub duration: Duration,
}

impl IPythonResult {
    /// The end of a cell that was aborted (not run, interrupted, or lost) for `reason`.
    pub fn aborted(reason: impl Into<String>, duration: Duration) -> Self {
        Self {
            status: IPythonStatus::Aborted,
            execution_count: 0,
            error_name: String::new(),
            error_value: String::new(),
            traceback: Vec::new(),
            reason: reason.into(),
            duration,
        }
    }
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ObservationKind {
    CmdStart {
        command: String,
        pid: i32,
    },
    CmdOutput {
        stream: OutputStream,
        data: Bytes,
    },
    CmdEnd(CmdEnd),
    IPythonStart {
        code: String,
        execution_count: i32,
    },
    IPythonOutput(IPythonOutput),
    IPythonResult(IPythonResult),
    /// Informational; never replaces the terminal observation.
    Error {
        message: String,
        details: BTreeMap<String, String>,
    },
    /// A sandbox-level event (for example: the kernel was restarted).
    AgentState {
        message: String,
        details: BTreeMap<String, String>,
    },
}

impl ObservationKind {
    /// Whether this ends its action (exactly one per accepted action).
    pub fn is_terminal(&self) -> bool {
        matches!(self, Self::CmdEnd(_) | Self::IPythonResult(_))
    }

    /// Approximate memory held by this observation, for the log's byte bound.
    pub fn approx_bytes(&self) -> usize {
        const BASE: usize = 96;
        let map = |m: &BTreeMap<String, String>| {
            m.iter().map(|(k, v)| k.len() + v.len() + 48).sum::<usize>()
        };
        BASE + match self {
            Self::CmdStart { command, .. } => command.len(),
            Self::CmdOutput { data, .. } => data.len(),
            Self::CmdEnd(e) => e.message.len(),
            Self::IPythonStart { code, .. } => code.len(),
            Self::IPythonOutput(o) => o.text.len() + map(&o.data) + o.display_id.len(),
            Self::IPythonResult(r) => {
                r.error_name.len()
                    + r.error_value.len()
                    + r.reason.len()
                    + r.traceback.iter().map(String::len).sum::<usize>()
            }
            Self::Error { message, details } | Self::AgentState { message, details } => {
                message.len() + map(details)
            }
        }
    }

    /// The terminal observation the control plane writes when an action's real end can no longer be known
    /// (executor gone, container killed, sandbox deleted).
    pub fn lost(action: ActionKind, reason: &str, duration: Duration) -> Self {
        match action {
            ActionKind::Shell => Self::CmdEnd(CmdEnd {
                exit_code: -1,
                reason: EndReason::Lost,
                duration,
                signal: 0,
                message: reason.to_owned(),
            }),
            ActionKind::IPython => Self::IPythonResult(IPythonResult::aborted(reason, duration)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lost_is_terminal_for_both_kinds() {
        let shell = ObservationKind::lost(ActionKind::Shell, "gone", Duration::ZERO);
        let cell = ObservationKind::lost(ActionKind::IPython, "gone", Duration::ZERO);
        assert!(shell.is_terminal() && cell.is_terminal());
        assert!(matches!(
            shell,
            ObservationKind::CmdEnd(CmdEnd {
                reason: EndReason::Lost,
                ..
            })
        ));
        assert!(matches!(
            cell,
            ObservationKind::IPythonResult(IPythonResult {
                status: IPythonStatus::Aborted,
                ..
            })
        ));
        assert!(
            !ObservationKind::CmdStart {
                command: "x".into(),
                pid: 1
            }
            .is_terminal()
        );
    }

    #[test]
    fn constructors_of_ends() {
        let end = CmdEnd::failed_to_start("no such dir".into());
        assert_eq!(
            (end.reason, end.exit_code, end.signal),
            (EndReason::FailedToStart, -1, 0)
        );
        let aborted = IPythonResult::aborted("cancelled", Duration::from_secs(1));
        assert_eq!(
            (
                aborted.status,
                aborted.execution_count,
                aborted.reason.as_str()
            ),
            (IPythonStatus::Aborted, 0, "cancelled")
        );
    }

    #[test]
    fn size_counts_payload() {
        let k = ObservationKind::CmdOutput {
            stream: OutputStream::Stdout,
            data: Bytes::from(vec![0u8; 1000]),
        };
        assert!(k.approx_bytes() >= 1000);
    }
}
