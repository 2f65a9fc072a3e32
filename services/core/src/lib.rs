//! Domain types of the MentisSandbox control plane: sandboxes, spaces, observations, the `SandboxBackend`
//! seam and the one error enum shared across crate boundaries. No I/O, no tonic, no bollard: the API layer
//! translates proto types into these, and backends speak only these.
//!
//! Actions and the kinds of observation are the model the executor shares (`mentis-model`), re-exported
//! here at their usual paths (`mentis_core::action`, `mentis_core::observation`, ...).

pub mod backend;
pub mod egress;
pub mod error;
pub mod files;
pub mod ids;
pub mod image;
pub mod kernel;
pub mod layout;
pub mod lifecycle;
pub mod limits;
pub mod observation;
pub mod process;
pub mod runtime_class;
pub mod sandbox;
pub mod space;
pub mod template;

pub use mentis_model::action;
pub use mentis_model::quote::{self, quoted};
pub use mentis_model::terminal;

pub use action::{Action, IPythonAction, ShellAction};
pub use backend::{
    BackendSandbox, BackendSpec, BackendState, DataMount, Endpoint, GatewayNetwork,
    IMAGE_SPACE_LABEL, ImageBuild, ImageInfo, SandboxBackend,
};
pub use error::{Chain, Detail, Error, Reason, Resource, ResourceKind, Result};
pub use ids::{ActionId, SandboxId, SpaceId};
pub use kernel::VariableSummary;
pub use observation::{
    ActionKind, CmdEnd, EndReason, IPythonOutput, IPythonOutputKind, IPythonResult, IPythonStatus,
    Observation, ObservationKind, OutputStream,
};
pub use sandbox::{
    Expiry, IdlePolicy, Limits, LimitsPolicy, Sandbox, SandboxRequest, SandboxSpec, SandboxState,
    check_labels,
};
pub use space::{Cause, Ending, SnapshotPolicy, Space, SpaceLimits, SpaceUpdate};
pub use template::{Template, TemplateUpdate};
