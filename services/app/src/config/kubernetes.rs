//! `MENTIS_BACKEND` (docker|kubernetes) and the Kubernetes backend's `MENTIS_K8S_*` settings
//! (docs/KUBERNETES.md).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use mentis_backend_kubernetes::Workspace;

use super::error::{ConfigError, err};

/// Where sandboxes run.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum BackendChoice {
    /// Containers on the Docker engine beside the runtime (the embedded default).
    #[default]
    Docker,
    /// Pods of a Kubernetes cluster.
    Kubernetes(Box<KubernetesSettings>),
}

/// The Kubernetes backend's settings, as read (the instance, the executor image and its settings are the
/// runtime's own).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubernetesSettings {
    /// `MENTIS_K8S_NAMESPACE`: the namespace of sandbox pods; the client's own (the service account's in a
    /// cluster, the kubeconfig context's elsewhere) when `None`.
    pub namespace: Option<String>,
    /// `MENTIS_K8S_WORKSPACE` (emptydir|pvc) and `MENTIS_K8S_STORAGE_CLASS`.
    pub workspace: Workspace,
    /// `MENTIS_K8S_RUNTIME_CLASS`: `runtimeClassName` of sandbox pods (gVisor, Kata).
    pub runtime_class: Option<String>,
    /// `MENTIS_K8S_IMAGE_PULL_POLICY` (Always|IfNotPresent|Never).
    pub image_pull_policy: Option<String>,
    /// `MENTIS_K8S_RUNTIME_POD_LABELS` (`k=v,k=v`): the runtime's pods, which alone reach sandbox pods.
    pub runtime_pod_labels: BTreeMap<String, String>,
    /// `MENTIS_K8S_RUNTIME_NAMESPACE`: the runtime pods' namespace (the sandboxes' when `None`).
    pub runtime_namespace: Option<String>,
    /// `MENTIS_K8S_INTERNAL_CIDRS` (comma-separated): the cluster's pod, service and node ranges, never
    /// reached by sandboxes with egress.
    pub internal_cidrs: Vec<String>,
    /// `KUBECONFIG` (one file): the cluster to use; the in-cluster service account (or `~/.kube/config`)
    /// when `None`.
    pub kubeconfig: Option<PathBuf>,
    /// `MENTIS_K8S_UNSCHEDULABLE_SECS` (60): how long a new pod may find no node before its create fails
    /// with the scheduler's words.
    pub unschedulable: Duration,
}

impl Default for KubernetesSettings {
    fn default() -> Self {
        Self {
            namespace: None,
            workspace: Workspace::EmptyDir,
            runtime_class: None,
            image_pull_policy: None,
            runtime_pod_labels: BTreeMap::new(),
            runtime_namespace: None,
            internal_cidrs: Vec::new(),
            kubeconfig: None,
            unschedulable: Duration::from_secs(60),
        }
    }
}

/// Settings only the Kubernetes backend reads: set with the Docker backend they are a mistake.
const K8S_ONLY: &[&str] = &[
    "MENTIS_K8S_NAMESPACE",
    "MENTIS_K8S_WORKSPACE",
    "MENTIS_K8S_STORAGE_CLASS",
    "MENTIS_K8S_RUNTIME_CLASS",
    "MENTIS_K8S_IMAGE_PULL_POLICY",
    "MENTIS_K8S_RUNTIME_POD_LABELS",
    "MENTIS_K8S_RUNTIME_NAMESPACE",
    "MENTIS_K8S_INTERNAL_CIDRS",
    "MENTIS_K8S_UNSCHEDULABLE_SECS",
];

/// Settings only the Docker backend reads: set with the Kubernetes backend they are a mistake.
const DOCKER_ONLY: &[(&str, &str)] = &[
    (
        "MENTIS_DATA_MOUNTS",
        "a pod has no host folders to mount: data mounts need the Docker backend",
    ),
    (
        "MENTIS_CONTAINER_RUNTIME",
        "use MENTIS_K8S_RUNTIME_CLASS to choose the pods' runtime",
    ),
    (
        "MENTIS_NETWORK",
        "pods are reached on the cluster's network (NetworkPolicies isolate them)",
    ),
];

/// A Kubernetes name: a DNS label (lowercase letters, digits, '-'), 1-63 characters.
fn dns_label(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !v.starts_with('-')
        && !v.ends_with('-')
}

/// A label key (optionally `prefix/`) or value: what the API accepts, roughly (letters, digits, `-_.`, 1-63
/// characters for the name part).
fn label_part(v: &str) -> bool {
    !v.is_empty()
        && v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn label_key(k: &str) -> bool {
    match k.rsplit_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'.')
                })
                && label_part(name)
        }
        None => label_part(k),
    }
}

/// An IPv4 or IPv6 range `ADDRESS/BITS`.
fn cidr(v: &str) -> bool {
    let Some((addr, bits)) = v.split_once('/') else {
        return false;
    };
    match (addr.parse::<std::net::IpAddr>(), bits.parse::<u8>()) {
        (Ok(std::net::IpAddr::V4(_)), Ok(b)) => b <= 32,
        (Ok(std::net::IpAddr::V6(_)), Ok(b)) => b <= 128,
        _ => false,
    }
}

pub(super) fn backend(get: &impl Fn(&str) -> Option<String>) -> Result<BackendChoice, ConfigError> {
    let var = |name: &str| get(name).filter(|v| !v.is_empty());
    match var("MENTIS_BACKEND").as_deref() {
        None | Some("docker") => {
            for name in K8S_ONLY {
                if let Some(v) = var(name) {
                    return Err(err(name, &v, "set without MENTIS_BACKEND=kubernetes"));
                }
            }
            return Ok(BackendChoice::Docker);
        }
        Some("kubernetes") => {}
        Some(v) => return Err(err("MENTIS_BACKEND", v, "use docker or kubernetes")),
    }
    for (name, why) in DOCKER_ONLY {
        if let Some(v) = var(name) {
            return Err(err(
                name,
                &v,
                format!("not used with MENTIS_BACKEND=kubernetes: {why}"),
            ));
        }
    }
    let mut s = KubernetesSettings::default();
    for (name, slot) in [
        ("MENTIS_K8S_NAMESPACE", &mut s.namespace),
        ("MENTIS_K8S_RUNTIME_NAMESPACE", &mut s.runtime_namespace),
        ("MENTIS_K8S_RUNTIME_CLASS", &mut s.runtime_class),
    ] {
        if let Some(v) = var(name) {
            if !dns_label(&v) {
                return Err(err(
                    name,
                    &v,
                    "not a Kubernetes name (1-63 lowercase letters, digits or '-')",
                ));
            }
            *slot = Some(v);
        }
    }
    let storage_class = var("MENTIS_K8S_STORAGE_CLASS");
    s.workspace = match var("MENTIS_K8S_WORKSPACE").as_deref() {
        None | Some("emptydir") => {
            if let Some(v) = storage_class {
                return Err(err(
                    "MENTIS_K8S_STORAGE_CLASS",
                    &v,
                    "set without MENTIS_K8S_WORKSPACE=pvc",
                ));
            }
            Workspace::EmptyDir
        }
        Some("pvc") => Workspace::Claim { storage_class },
        Some(v) => return Err(err("MENTIS_K8S_WORKSPACE", v, "use emptydir or pvc")),
    };
    if let Some(v) = var("MENTIS_K8S_IMAGE_PULL_POLICY") {
        if !matches!(v.as_str(), "Always" | "IfNotPresent" | "Never") {
            return Err(err(
                "MENTIS_K8S_IMAGE_PULL_POLICY",
                &v,
                "use Always, IfNotPresent or Never",
            ));
        }
        s.image_pull_policy = Some(v);
    }
    if let Some(v) = var("MENTIS_K8S_RUNTIME_POD_LABELS") {
        for pair in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let Some((k, val)) = pair.split_once('=') else {
                return Err(err(
                    "MENTIS_K8S_RUNTIME_POD_LABELS",
                    &v,
                    format!("{pair:?} is not KEY=VALUE"),
                ));
            };
            if !label_key(k) || !label_part(val) {
                return Err(err(
                    "MENTIS_K8S_RUNTIME_POD_LABELS",
                    &v,
                    format!("{pair:?} is not a Kubernetes label"),
                ));
            }
            s.runtime_pod_labels.insert(k.to_owned(), val.to_owned());
        }
    }
    if s.runtime_pod_labels.is_empty() {
        // An empty selector in the ingress policy would let every pod of the namespace in.
        return Err(err(
            "MENTIS_K8S_RUNTIME_POD_LABELS",
            "",
            "required with MENTIS_BACKEND=kubernetes: the labels of the runtime's pods, which alone may \
             reach sandbox pods (for example app.kubernetes.io/name=mentis)",
        ));
    }
    if let Some(v) = var("MENTIS_K8S_INTERNAL_CIDRS") {
        for range in v.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            if !cidr(range) {
                return Err(err(
                    "MENTIS_K8S_INTERNAL_CIDRS",
                    &v,
                    format!("{range:?} is not a range such as 10.96.0.0/12"),
                ));
            }
            s.internal_cidrs.push(range.to_owned());
        }
    }
    if let Some(v) = var("MENTIS_K8S_UNSCHEDULABLE_SECS") {
        match v.parse::<u64>() {
            Ok(n) if n > 0 => s.unschedulable = Duration::from_secs(n),
            _ => {
                return Err(err(
                    "MENTIS_K8S_UNSCHEDULABLE_SECS",
                    &v,
                    "must be a whole number of seconds, at least 1",
                ));
            }
        }
    }
    if let Some(v) = var("KUBECONFIG") {
        if v.contains(':') {
            return Err(err(
                "KUBECONFIG",
                &v,
                "the runtime reads one kubeconfig file, not a list",
            ));
        }
        s.kubeconfig = Some(PathBuf::from(v));
    }
    Ok(BackendChoice::Kubernetes(Box::new(s)))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<BackendChoice, ConfigError> {
        let vars: BTreeMap<String, String> = vars
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        backend(&|k: &str| vars.get(k).cloned())
    }

    const LABELS: (&str, &str) = (
        "MENTIS_K8S_RUNTIME_POD_LABELS",
        "app.kubernetes.io/name=mentis",
    );

    #[test]
    fn docker_is_the_default_and_kubernetes_settings_need_the_kubernetes_backend() {
        assert_eq!(read(&[]).unwrap(), BackendChoice::Docker);
        assert_eq!(
            read(&[("MENTIS_BACKEND", "docker")]).unwrap(),
            BackendChoice::Docker
        );
        let e = read(&[("MENTIS_K8S_NAMESPACE", "sandboxes")]).unwrap_err();
        assert_eq!(e.var, "MENTIS_K8S_NAMESPACE");
        assert!(e.reason.contains("MENTIS_BACKEND=kubernetes"), "{e}");
        let e = read(&[("MENTIS_BACKEND", "podman")]).unwrap_err();
        assert_eq!(e.var, "MENTIS_BACKEND");
    }

    #[test]
    fn kubernetes_settings_are_read_and_checked() {
        let BackendChoice::Kubernetes(s) = read(&[
            ("MENTIS_BACKEND", "kubernetes"),
            ("MENTIS_K8S_NAMESPACE", "sandboxes"),
            ("MENTIS_K8S_WORKSPACE", "pvc"),
            ("MENTIS_K8S_STORAGE_CLASS", "fast"),
            ("MENTIS_K8S_RUNTIME_CLASS", "gvisor"),
            ("MENTIS_K8S_IMAGE_PULL_POLICY", "IfNotPresent"),
            (
                "MENTIS_K8S_RUNTIME_POD_LABELS",
                "app.kubernetes.io/name=mentis, app.kubernetes.io/instance=prod",
            ),
            ("MENTIS_K8S_RUNTIME_NAMESPACE", "mentis"),
            ("MENTIS_K8S_INTERNAL_CIDRS", "10.96.0.0/12,fd00:10::/56"),
            ("MENTIS_K8S_UNSCHEDULABLE_SECS", "5"),
            ("KUBECONFIG", "/etc/mentis/kubeconfig"),
        ])
        .unwrap() else {
            panic!("not the Kubernetes backend");
        };
        assert_eq!(s.namespace.as_deref(), Some("sandboxes"));
        assert_eq!(
            s.workspace,
            Workspace::Claim {
                storage_class: Some("fast".to_owned())
            }
        );
        assert_eq!(s.runtime_class.as_deref(), Some("gvisor"));
        assert_eq!(s.runtime_pod_labels.len(), 2);
        assert_eq!(s.runtime_namespace.as_deref(), Some("mentis"));
        assert_eq!(s.internal_cidrs, ["10.96.0.0/12", "fd00:10::/56"]);
        assert_eq!(s.unschedulable, Duration::from_secs(5));
        assert_eq!(
            s.kubeconfig.as_deref(),
            Some(std::path::Path::new("/etc/mentis/kubeconfig"))
        );

        let k8s = ("MENTIS_BACKEND", "kubernetes");
        for (bad, var) in [
            (
                ("MENTIS_K8S_NAMESPACE", "Sand_boxes"),
                "MENTIS_K8S_NAMESPACE",
            ),
            (("MENTIS_K8S_WORKSPACE", "nfs"), "MENTIS_K8S_WORKSPACE"),
            (
                ("MENTIS_K8S_STORAGE_CLASS", "fast"),
                "MENTIS_K8S_STORAGE_CLASS",
            ),
            (
                ("MENTIS_K8S_IMAGE_PULL_POLICY", "always"),
                "MENTIS_K8S_IMAGE_PULL_POLICY",
            ),
            (
                ("MENTIS_K8S_INTERNAL_CIDRS", "10.0.0.0"),
                "MENTIS_K8S_INTERNAL_CIDRS",
            ),
            (
                ("MENTIS_K8S_UNSCHEDULABLE_SECS", "0"),
                "MENTIS_K8S_UNSCHEDULABLE_SECS",
            ),
            (("KUBECONFIG", "/a:/b"), "KUBECONFIG"),
            (("MENTIS_DATA_MOUNTS", "*=/srv:/data"), "MENTIS_DATA_MOUNTS"),
            (
                ("MENTIS_CONTAINER_RUNTIME", "runsc"),
                "MENTIS_CONTAINER_RUNTIME",
            ),
        ] {
            let e = read(&[k8s, LABELS, bad]).unwrap_err();
            assert_eq!(e.var, var, "{bad:?}: {e}");
        }
        let e = read(&[k8s, ("MENTIS_K8S_RUNTIME_POD_LABELS", "app")]).unwrap_err();
        assert_eq!(e.var, "MENTIS_K8S_RUNTIME_POD_LABELS");
        // A claim is as large as the disk limit: it cannot be off.
        let e = crate::config::RuntimeConfig::from_lookup(|k| {
            [
                k8s,
                LABELS,
                ("MENTIS_K8S_WORKSPACE", "pvc"),
                ("MENTIS_DISK_LIMITS", "off"),
            ]
            .iter()
            .find(|(name, _)| *name == k)
            .map(|(_, v)| (*v).to_owned())
        })
        .unwrap_err();
        assert_eq!(e.var, "MENTIS_DISK_LIMITS");
        // Without the runtime's labels the ingress policy would let every pod in.
        let e = read(&[k8s]).unwrap_err();
        assert_eq!(e.var, "MENTIS_K8S_RUNTIME_POD_LABELS");
    }
}
