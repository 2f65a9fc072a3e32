//! Observations: everything a sandbox reports, in one per-sandbox sequence (DESIGN.md section 3).

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use bytes::Bytes;

use crate::ids::{ActionId, SandboxId};

/// One event of a sandbox, with its place in the sandbox's sequence.
#[derive(Debug, Clone, PartialEq)]
pub struct Observation {
    /// Per sandbox, strictly increasing, starting at 1.
    pub seq: u64,
    pub sandbox_id: SandboxId,
    /// `None` for sandbox-level observations.
    pub action_id: Option<ActionId>,
    pub time: SystemTime,
    pub kind: ObservationKind,
}

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
    Lost,
    FailedToStart,
    /// The out-of-memory killer ended it (the sandbox's memory limit was reached).
    OomKilled,
    /// It failed or timed out after the sandbox's pids limit refused a fork.
    PidsLimitReached,
}

/// Terminal observation of a shell action.
#[derive(Debug, Clone, PartialEq)]
pub struct CmdEnd {
    pub exit_code: i32,
    pub reason: EndReason,
    pub duration: Duration,
    pub signal: i32,
    pub message: String,
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

/// Stream text or a MIME bundle from a cell.
#[derive(Debug, Clone, PartialEq)]
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
#[derive(Debug, Clone, PartialEq)]
pub struct IPythonResult {
    pub status: IPythonStatus,
    pub execution_count: i32,
    pub error_name: String,
    pub error_value: String,
    pub traceback: Vec<String>,
    pub reason: String,
    pub duration: Duration,
}

/// What happened.
#[derive(Debug, Clone, PartialEq)]
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
    Error {
        message: String,
        details: BTreeMap<String, String>,
    },
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
            ActionKind::IPython => Self::IPythonResult(IPythonResult {
                status: IPythonStatus::Aborted,
                execution_count: 0,
                error_name: String::new(),
                error_value: String::new(),
                traceback: Vec::new(),
                reason: reason.to_owned(),
                duration,
            }),
        }
    }
}

/// The kind of an action, without its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionKind {
    Shell,
    IPython,
}

impl From<&crate::Action> for ActionKind {
    fn from(a: &crate::Action) -> Self {
        match a {
            crate::Action::Shell(_) => Self::Shell,
            crate::Action::IPython(_) => Self::IPython,
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
    fn size_counts_payload() {
        let k = ObservationKind::CmdOutput {
            stream: OutputStream::Stdout,
            data: Bytes::from(vec![0u8; 1000]),
        };
        assert!(k.approx_bytes() >= 1000);
    }
}
