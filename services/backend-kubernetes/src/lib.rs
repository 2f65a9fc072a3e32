//! The Kubernetes backend (docs/ARCHITECTURE.md, "Kubernetes backend", issue 35; under construction): a
//! sandbox is a pod in the sandbox namespace. The objects it sends are made as plain values whose shape is
//! tested without a cluster: the pod, its token's Secret and workspace claim ([`pod`]), and the instance's
//! NetworkPolicies ([`policy`]). [`status`] reads where a pod stands as a watch reports it (ready with its
//! address, on its way, stuck, or failed with the cause a client sees); [`cluster`] makes a sandbox's
//! objects with the API's client (`kube`), follows its pod with a watch until it is ready or cannot be,
//! and removes them ([`error`] maps the API's errors); [`backend`] is the `SandboxBackend` over them
//! (create, delete, reach, list and ping so far).

pub mod backend;
pub mod cluster;
pub mod config;
pub mod error;
pub mod pod;
pub mod policy;
pub mod status;

pub use backend::{KubernetesBackend, Waits};
pub use config::{KubernetesConfig, Workspace};
