//! What the Kubernetes backend is told (`MENTIS_K8S_*`, read by the application's config): where sandboxes
//! go and how their pods are made.

/// Where a sandbox's workspace lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Workspace {
    /// An `emptyDir` on the node, bounded by the disk limit (`sizeLimit`): gone with the pod.
    EmptyDir,
    /// A claim of its own (`MENTIS_K8S_WORKSPACE=pvc`), of the disk limit's size, of this storage class
    /// (the cluster's default when `None`): it outlives the pod.
    Claim { storage_class: Option<String> },
}

/// The backend's settings.
#[derive(Debug, Clone)]
pub struct KubernetesConfig {
    /// The namespace of sandbox pods (`MENTIS_K8S_NAMESPACE`).
    pub namespace: String,
    /// This control plane's instance: every object is labelled with it.
    pub instance: String,
    /// The image the executor is copied from (`MENTIS_EXECUTOR_IMAGE`); the cluster must be able to pull it.
    pub executor_image: String,
    /// `uid:gid` of the sandbox user.
    pub sandbox_user: String,
    /// `NAME=VALUE` settings every executor gets.
    pub executor_env: Vec<String>,
    pub workspace: Workspace,
    /// `runtimeClassName` of sandbox pods (gVisor, Kata), when the cluster has one (`MENTIS_K8S_RUNTIME_CLASS`).
    pub runtime_class: Option<String>,
    /// `imagePullPolicy` of sandbox pods (the cluster's default when `None`).
    pub image_pull_policy: Option<String>,
    /// The port the executor serves on, in the pod.
    pub executor_port: u16,
    /// Labels of the runtime's pods, which alone may reach sandbox pods (the ingress NetworkPolicy).
    pub runtime_pod_labels: std::collections::BTreeMap<String, String>,
    /// The namespace of the runtime's pods.
    pub runtime_namespace: String,
    /// Address ranges sandboxes with egress never reach: the cluster's pod and service ranges, the node
    /// network (`MENTIS_K8S_INTERNAL_CIDRS`); the metadata address and the private ranges are always in.
    pub internal_cidrs: Vec<String>,
}
