//! mentis-runtime, the MentisSandbox control plane: the public gRPC API over a registry of sandboxes, each
//! with an observation log and a client of its executor, on a pluggable backend (Docker today).

pub mod api;
pub mod auth;
pub mod cli;
pub mod clock;
pub mod config;
pub mod convert;
pub mod executor_client;
pub mod metrics;
pub mod observations;
pub mod private;
pub mod sandboxes;
pub mod server;
pub mod snapshots;
pub mod store;
pub mod telemetry;
pub mod web;

pub use config::RuntimeConfig;
pub use server::{Runtime, ServeError};
