//! mentis-app, the MentisSandbox application layer: the sandbox manager and its siblings (snapshots, images,
//! files, terminals, previews, keys and links) over a `SandboxBackend`, each sandbox with its observation log
//! and a client of its executor. The API (mentis-runtime) calls these and nothing below them: the store and
//! the executor client are this crate's own (docs/ARCHITECTURE.md, "Code map").

pub mod app;
pub mod auth;
pub mod clock;
pub mod config;
mod executor_client;
pub mod images;
pub mod metrics;
pub mod observations;
pub mod preview;
pub mod sandboxes;
pub mod snapshots;
pub mod telemetry;

// The durable store, below this layer: its own crate, which the API does not depend on.
use mentis_store as store;
use mentis_store::private;
