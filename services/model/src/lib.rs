//! mentis-model: the one model of actions and observations, with their rules and limits, shared by the
//! control plane (`mentis-core` re-exports it) and the executor, so both accept and report the same things.
//!
//! No I/O, no async, no tonic: each binary converts between these types and proto at its own edge.

pub mod action;
pub mod env;
pub mod error;
pub mod kernel;
pub mod observation;
pub mod process;
pub mod quote;
pub mod reason;
pub mod terminal;

pub use action::{Action, ActionKind, IPythonAction, ShellAction};
pub use error::Error;
pub use observation::{
    CmdEnd, EndReason, IPythonOutput, IPythonOutputKind, IPythonResult, IPythonStatus,
    ObservationKind, OutputStream,
};
pub use quote::quoted;
pub use reason::Reason;
