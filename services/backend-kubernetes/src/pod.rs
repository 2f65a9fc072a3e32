//! A sandbox as a pod (docs/ARCHITECTURE.md, "Kubernetes backend"): the objects the backend sends for one
//! sandbox, made here as plain values so that their shape is tested without a cluster.
//!
//! - The **pod** runs the sandbox's image with our entrypoint, as on Docker: an init container copies the
//!   executor from the executor image into an `emptyDir` (`mentis-executor install`), mounted read-only at
//!   [`layout::MOUNT`]; the launcher starts as root with SETUID, SETGID and CHOWN only (everything else
//!   dropped, no privilege escalation, seccomp `RuntimeDefault`) and runs user code as the sandbox user.
//! - The **token** the executor obeys is in a Secret of its own, named by the pod (`secretKeyRef`), so
//!   whoever may read pods does not hold it.
//! - CPU and memory are requests and limits alike (the Guaranteed class, so a sandbox is not the first one
//!   evicted when a node runs short); the workspace is an `emptyDir` whose `sizeLimit` is the disk limit
//!   (the kubelet evicts a pod over it: no ENOSPC as on Docker, see docs/KUBERNETES.md) or a claim of its
//!   own ([`Workspace::Claim`]).
//! - No service account token, no service links, no host namespaces or paths; without egress no DNS either
//!   (a resolver nobody answers at), with egress the cluster's (the only address inside the cluster's
//!   ranges the egress policy lets it reach, on port 53).
//! - The kubelet restarts the sandbox's container in place (the workspace kept) when its executor stops
//!   answering gRPC health checks for a minute (a liveness probe), as the runtime restarts a container
//!   whose executor does not answer on Docker.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerResizePolicy, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    GRPCAction, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    PersistentVolumeClaimVolumeSource, Pod, PodDNSConfig, PodSecurityContext, PodSpec, Probe,
    ResourceRequirements, SeccompProfile, Secret, SecretKeySelector, SecurityContext, Volume,
    VolumeMount, VolumeResourceRequirements,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mentis_core::layout::{self, LABEL_EGRESS, SANDBOX_USER_ENV, TOKEN_ENV};
use mentis_core::{BackendSpec, Limits, SandboxId};

use crate::config::{KubernetesConfig, Workspace};

/// The container that runs the sandbox's image.
pub const SANDBOX_CONTAINER: &str = "sandbox";
/// The init container that copies the executor in.
pub const INSTALL_CONTAINER: &str = "executor";
/// The key of the token in its Secret.
pub const TOKEN_KEY: &str = "token";

/// The pod of sandbox `id`.
pub fn pod_name(id: SandboxId) -> String {
    format!("mentis-sb-{id}")
}

/// The Secret holding the token of sandbox `id`.
pub fn secret_name(id: SandboxId) -> String {
    format!("mentis-sb-{id}-token")
}

/// The workspace claim of sandbox `id` ([`Workspace::Claim`]).
pub fn claim_name(id: SandboxId) -> String {
    format!("mentis-ws-{id}")
}

/// The labels of every object of sandbox `spec`, the egress mark included (the NetworkPolicies select on
/// it).
pub fn labels(config: &KubernetesConfig, spec: &BackendSpec) -> BTreeMap<String, String> {
    let mut labels: BTreeMap<String, String> =
        layout::labels_of(&config.instance, spec.id, spec.space_id.as_ref())
            .into_iter()
            .collect();
    labels.insert(LABEL_EGRESS.to_owned(), spec.egress.to_string());
    labels
}

fn metadata(config: &KubernetesConfig, name: String, spec: &BackendSpec) -> ObjectMeta {
    ObjectMeta {
        name: Some(name),
        namespace: Some(config.namespace.clone()),
        labels: Some(labels(config, spec)),
        ..Default::default()
    }
}

/// The Secret of `spec`'s token.
pub fn secret(config: &KubernetesConfig, spec: &BackendSpec) -> Secret {
    Secret {
        metadata: metadata(config, secret_name(spec.id), spec),
        type_: Some("Opaque".to_owned()),
        string_data: Some(BTreeMap::from([(TOKEN_KEY.to_owned(), spec.token.clone())])),
        immutable: Some(true),
        ..Default::default()
    }
}

/// The workspace claim of `spec`, when workspaces are claims.
pub fn claim(config: &KubernetesConfig, spec: &BackendSpec) -> Option<PersistentVolumeClaim> {
    let Workspace::Claim { storage_class } = &config.workspace else {
        return None;
    };
    Some(PersistentVolumeClaim {
        metadata: metadata(config, claim_name(spec.id), spec),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".to_owned()]),
            storage_class_name: storage_class.clone(),
            resources: Some(VolumeResourceRequirements {
                requests: Some(BTreeMap::from([(
                    "storage".to_owned(),
                    mebibytes(spec.limits.disk_mb),
                )])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
}

fn mebibytes(mb: i64) -> Quantity {
    Quantity(format!("{}Mi", mb.max(1)))
}

/// CPUs as millicores (at least one).
fn millicores(cpu: f64) -> Quantity {
    // Limits are checked before they get here (0.1 to 64 CPUs): the product fits.
    #[allow(clippy::cast_possible_truncation)]
    let milli = (cpu * 1000.0).round().max(1.0) as i64;
    Quantity(format!("{milli}m"))
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar {
        name: name.to_owned(),
        value: Some(value.into()),
        ..Default::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_owned(),
        mount_path: path.to_owned(),
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn empty_dir(name: &str, medium: Option<&str>, size: Option<Quantity>) -> Volume {
    Volume {
        name: name.to_owned(),
        empty_dir: Some(EmptyDirVolumeSource {
            medium: medium.map(str::to_owned),
            size_limit: size,
        }),
        ..Default::default()
    }
}

/// Root with only the capabilities the executor needs, never more (see the Docker backend's container).
fn executor_security(read_only_root: bool, add: &[&str]) -> SecurityContext {
    SecurityContext {
        run_as_user: Some(0),
        run_as_group: Some(0),
        run_as_non_root: Some(false),
        allow_privilege_escalation: Some(false),
        privileged: Some(false),
        read_only_root_filesystem: Some(read_only_root),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_owned()]),
            add: (!add.is_empty()).then(|| add.iter().map(|c| (*c).to_owned()).collect()),
        }),
        seccomp_profile: Some(runtime_default()),
        ..Default::default()
    }
}

fn runtime_default() -> SeccompProfile {
    SeccompProfile {
        type_: "RuntimeDefault".to_owned(),
        ..Default::default()
    }
}

/// The sandbox container's CPU and memory for `limits`: requests and limits alike (the Guaranteed class,
/// which a resize keeps).
pub fn resources(limits: &Limits) -> ResourceRequirements {
    let limits = BTreeMap::from([
        ("cpu".to_owned(), millicores(limits.cpu)),
        ("memory".to_owned(), mebibytes(limits.memory_mb)),
    ]);
    ResourceRequirements {
        limits: Some(limits.clone()),
        requests: Some(limits),
        ..Default::default()
    }
}

/// The pod of sandbox `spec`.
pub fn pod(config: &KubernetesConfig, spec: &BackendSpec) -> Pod {
    let resources = resources(&spec.limits);
    let mut env = vec![
        EnvVar {
            name: TOKEN_ENV.to_owned(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret_name(spec.id),
                    key: TOKEN_KEY.to_owned(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        },
        env(SANDBOX_USER_ENV, config.sandbox_user.clone()),
    ];
    env.extend(
        config
            .executor_env
            .iter()
            .chain(&spec.executor_env)
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| self::env(k, v)),
    );
    let mut mounts = vec![
        mount("workspace", "/workspace", false),
        mount("executor", layout::MOUNT, true),
    ];
    let workspace = match &config.workspace {
        Workspace::EmptyDir => empty_dir(
            "workspace",
            None,
            (spec.limits.disk_mb > 0).then(|| mebibytes(spec.limits.disk_mb)),
        ),
        Workspace::Claim { .. } => Volume {
            name: "workspace".to_owned(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim_name(spec.id),
                read_only: Some(false),
            }),
            ..Default::default()
        },
    };
    let mut volumes = vec![workspace, empty_dir("executor", None, None)];
    if spec.read_only_rootfs {
        // As on Docker: /tmp in memory, half the limit, and HOME there.
        volumes.push(empty_dir(
            "tmp",
            Some("Memory"),
            Some(mebibytes((spec.limits.memory_mb / 2).max(1))),
        ));
        mounts.push(mount("tmp", "/tmp", false));
        env.push(self::env("HOME", "/tmp"));
    }
    let install = Container {
        name: INSTALL_CONTAINER.to_owned(),
        image: Some(config.executor_image.clone()),
        image_pull_policy: config.image_pull_policy.clone(),
        command: Some(vec![
            format!("{}/bin/mentis-executor", layout::MOUNT),
            "install".to_owned(),
            "/target".to_owned(),
        ]),
        volume_mounts: Some(vec![mount("executor", "/target", false)]),
        security_context: Some(executor_security(true, &[])),
        resources: Some(ResourceRequirements {
            limits: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("500m".to_owned())),
                ("memory".to_owned(), Quantity("128Mi".to_owned())),
            ])),
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity("100m".to_owned())),
                ("memory".to_owned(), Quantity("64Mi".to_owned())),
            ])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let sandbox = Container {
        name: SANDBOX_CONTAINER.to_owned(),
        image: Some(spec.image.clone()),
        image_pull_policy: config.image_pull_policy.clone(),
        command: Some(layout::entrypoint()),
        args: Some(Vec::new()),
        working_dir: Some("/workspace".to_owned()),
        env: Some(env),
        resources: Some(resources),
        volume_mounts: Some(mounts),
        security_context: Some(executor_security(
            spec.read_only_rootfs,
            &["SETUID", "SETGID", "CHOWN"],
        )),
        // The executor's gRPC health (open to anyone who reaches the port; the kubelet does): a minute
        // without an answer, the runtime's ready timeout, and the container starts again in place.
        // A claimed warm pod's CPU and memory change in place (pods/resize), its processes kept.
        resize_policy: Some(
            ["cpu", "memory"]
                .iter()
                .map(|r| ContainerResizePolicy {
                    resource_name: (*r).to_owned(),
                    restart_policy: "NotRequired".to_owned(),
                })
                .collect(),
        ),
        liveness_probe: Some(Probe {
            grpc: Some(GRPCAction {
                port: i32::from(config.executor_port),
                service: None,
            }),
            period_seconds: Some(10),
            timeout_seconds: Some(5),
            failure_threshold: Some(6),
            ..Default::default()
        }),
        ..Default::default()
    };
    let (dns_policy, dns_config) = if spec.egress {
        // The cluster's resolver, which the egress policy lets it reach on port 53 (a node's own resolver is
        // often at a private or link-local address, which that policy denies).
        ("ClusterFirst", None)
    } else {
        // No resolver at all: a name fails at once rather than after a timeout against a blocked one.
        (
            "None",
            Some(PodDNSConfig {
                nameservers: Some(vec!["127.0.0.1".to_owned()]),
                ..Default::default()
            }),
        )
    };
    Pod {
        metadata: metadata(config, pod_name(spec.id), spec),
        spec: Some(PodSpec {
            init_containers: Some(vec![install]),
            containers: vec![sandbox],
            volumes: Some(volumes),
            // The executor dying restarts its container in place, as on Docker: the workspace stays.
            restart_policy: Some("Always".to_owned()),
            automount_service_account_token: Some(false),
            enable_service_links: Some(false),
            host_network: Some(false),
            host_pid: Some(false),
            host_ipc: Some(false),
            dns_policy: Some(dns_policy.to_owned()),
            dns_config,
            // The sandbox's own class (its template's or space's), else the runtime's default.
            runtime_class_name: spec
                .runtime_class
                .clone()
                .or_else(|| config.runtime_class.clone()),
            security_context: Some(PodSecurityContext {
                seccomp_profile: Some(runtime_default()),
                ..Default::default()
            }),
            termination_grace_period_seconds: Some(5),
            ..Default::default()
        }),
        ..Default::default()
    }
}
