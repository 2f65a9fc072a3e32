//! mentis-executor: the process inside each sandbox container that runs actions for the control plane.
//!
//! The control plane calls [`serve`]'s gRPC API (`mentis.executor.v1.ExecutorService`, behind a bearer
//! token) to run shell commands and IPython cells (on a Jupyter kernel it starts and drives); readiness is
//! `grpc.health.v1` answering SERVING.
//!
//! Layers, each using only the ones below it: `server` (the gRPC edge; it and its `convert` are the only
//! code that turns actions and their events into proto and back) → `actions` (dispatch, and the `registry`
//! of running actions) → `shell` / `ipython` (running them) → `events` (the sink of domain events).
//! Actions and events are the shared model's types (`mentis-model`), with the control plane's rules and
//! limits. `files` serves the WorkspaceService beside them.

mod actions;
mod auth;
mod cgroup;
mod config;
mod convert;
mod enter;
mod error;
mod events;
mod files;
pub mod identity;
mod ipython;
pub mod launch;
mod processes;
mod reclaim;
mod registry;
mod server;
mod shell;
mod terminal;
pub mod threads;

pub use config::{
    Config, DEFAULT_KERNEL_PYTHON, DEFAULT_KERNEL_QUEUE, DEFAULT_LISTEN, DEFAULT_MAX_ACTIONS,
    DEFAULT_MAX_WRITE_BYTES, DEFAULT_WORKSPACE, KERNEL_EAGER_ENV, KERNEL_PYTHON_ENV, KernelConfig,
    LISTEN_ENV, MAX_ACTIONS_ENV, MAX_WRITE_BYTES_ENV, SPAN_BUFFER, TOKEN_ENV, TRACES_ENV, Token,
    WORKSPACE_ENV,
};
pub use error::Error;
pub use server::serve;
