//! Observations: everything a sandbox reports, in one per-sandbox sequence (see docs/ARCHITECTURE.md,
//! "Observations"). What an observation says is the shared model's [`ObservationKind`], re-exported here
//! with its parts; the sequence and the ids are the control plane's.

use std::time::SystemTime;

pub use mentis_model::action::ActionKind;
pub use mentis_model::observation::{
    CmdEnd, EndReason, IPythonOutput, IPythonOutputKind, IPythonResult, IPythonStatus,
    ObservationKind, OutputStream,
};

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
