//! The Kubernetes backend (docs/ARCHITECTURE.md, "Kubernetes backend", issue 35; under construction): a
//! sandbox is a pod in the sandbox namespace. This first part makes the objects the backend sends, as plain
//! values whose shape is tested without a cluster: the pod, its token's Secret and workspace claim
//! ([`pod`]), and the instance's NetworkPolicies ([`policy`]); and it reads where a pod stands as a watch
//! reports it ([`status`]: ready with its address, on its way, stuck, or failed with the cause a client
//! sees). The client (`kube`) and the `SandboxBackend` come next.

pub mod config;
pub mod pod;
pub mod policy;
pub mod status;

pub use config::{KubernetesConfig, Workspace};
