//! mentis-executor: the process inside each sandbox container that runs actions for the control plane.
//!
//! The control plane calls [`serve`]'s gRPC API (`mentis.executor.v1.ExecutorService`, behind a bearer
//! token) to run shell commands; readiness is `grpc.health.v1` answering SERVING.

mod actions;
mod auth;
mod config;
mod convert;
mod error;
mod events;
mod registry;
mod server;
mod shell;

pub use config::{
    Config, DEFAULT_ACTION_TIMEOUT, DEFAULT_LISTEN, DEFAULT_MAX_ACTIONS, DEFAULT_WORKSPACE,
    LISTEN_ENV, MAX_ACTIONS_ENV, TOKEN_ENV, Token, WORKSPACE_ENV,
};
pub use error::Error;
pub use server::serve;
