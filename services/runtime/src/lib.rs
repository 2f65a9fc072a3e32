//! mentis-runtime, the MentisSandbox control plane: the public gRPC API over a registry of sandboxes, each
//! with an observation log and a client of its executor, on a pluggable backend (Docker today).

pub mod api;
pub mod auth;
pub mod cli;
pub mod clock;
pub mod config;
pub mod convert;
pub mod executor_client;
pub mod images;
pub mod metrics;
pub mod observations;
pub mod preview;
pub mod private;
pub mod sandboxes;
pub mod server;
pub mod snapshots;
pub mod store;
pub mod telemetry;
pub mod web;

pub use config::RuntimeConfig;
pub use server::{Runtime, ServeError};

/// Makes ring rustls' provider for this process (idempotent). Two providers are linked (tonic's ring, and the
/// S3 client's aws-lc-rs), and rustls then picks none by itself: every TLS server or client of the process
/// would panic. Called before anything speaks TLS: by [`server::Runtime::start_with`], the binary's `main`,
/// and the test harnesses.
pub fn install_crypto_provider() {
    // Err: a provider is already installed (by an earlier call, or by the process): that one stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
