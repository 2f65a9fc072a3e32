//! mentis-runtime, the MentisSandbox control plane's API: the public gRPC services and the HTTP listener (web
//! terminal, MCP, preview proxy) over the application layer (`mentis-app`), the server that assembles them,
//! and the binary's command line. Every handler calls the application's services and nothing below them.

pub mod api;
pub mod cli;
pub mod convert;
pub mod proxy;
pub mod server;
pub mod web;

pub use config::RuntimeConfig;
pub use mentis_app::{config, metrics, telemetry};
pub use server::{Runtime, ServeError};

// The application's modules the API speaks to, at the paths the handlers name them by.
use mentis_app::{auth, clock, images, observations, preview, sandboxes};

/// Makes ring rustls' provider for this process (idempotent). Two providers are linked (tonic's ring, and the
/// S3 client's aws-lc-rs), and rustls then picks none by itself: every TLS server or client of the process
/// would panic. Called before anything speaks TLS: by [`server::Runtime::start_with`], the binary's `main`,
/// and the test harnesses.
pub fn install_crypto_provider() {
    // Err: a provider is already installed (by an earlier call, or by the process): that one stays.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
