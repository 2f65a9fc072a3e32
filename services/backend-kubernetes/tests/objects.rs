//! The objects the Kubernetes backend sends, checked for what they must say (isolation, limits, the token
//! out of the pod spec) and validated against Kubernetes' OpenAPI schema (kubernetes-validate, strict: an
//! unknown field fails), as the Helm chart's manifests are (tests/helm-check.py).

use std::collections::BTreeMap;
use std::path::PathBuf;

use mentis_backend_kubernetes::{KubernetesConfig, Workspace, pod, policy};
use mentis_core::layout::{LABEL_EGRESS, LABEL_INSTANCE, LABEL_SANDBOX_ID, TOKEN_ENV};
use mentis_core::{BackendSpec, Limits, SandboxId, SpaceId};

/// The Kubernetes release the objects are validated against (as tests/helm-check.py).
const KUBE_VERSION: &str = "1.34.0";

fn config(workspace: Workspace) -> KubernetesConfig {
    KubernetesConfig {
        namespace: "mentis-sandboxes".to_owned(),
        instance: "i1".to_owned(),
        executor_image: "mentis/executor:latest".to_owned(),
        sandbox_user: "1000:1000".to_owned(),
        executor_env: vec!["MENTIS_LOG_FORMAT=json".to_owned()],
        workspace,
        runtime_class: Some("gvisor".to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        executor_port: 50052,
        runtime_pod_labels: BTreeMap::from([(
            "app.kubernetes.io/name".to_owned(),
            "mentis".to_owned(),
        )]),
        runtime_namespace: "mentis".to_owned(),
        internal_cidrs: vec!["10.96.0.0/12".to_owned(), "fd00:10:96::/112".to_owned()],
    }
}

fn spec(egress: bool, read_only_rootfs: bool) -> BackendSpec {
    BackendSpec {
        id: SandboxId::new(),
        space_id: Some(SpaceId::parse_or_default("team-a").expect("a space id")),
        image: "python:3.12-slim".to_owned(),
        limits: Limits {
            cpu: 1.5,
            memory_mb: 1024,
            pids: 512,
            nofile: 1024,
            disk_mb: 4096,
        },
        token: "the-executor-token-0123456789abcdef".to_owned(),
        data_mounts: Vec::new(),
        executor_env: vec!["MENTIS_KERNEL=warm".to_owned()],
        egress,
        gateway: false,
        read_only_rootfs,
        // One of the pods checked against the schema names its own class (a template's or a space's).
        runtime_class: egress.then(|| "kata-qemu".to_owned()),
    }
}

/// Runs kubernetes-validate (strict) on `objects`: what it says when it refuses them. Fails when the tool
/// is missing (`make tools`).
fn refusal(objects: &[serde_json::Value]) -> Option<String> {
    let tool =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.tools/venv/bin/kubernetes-validate");
    assert!(
        tool.exists(),
        "{} is missing: run `make tools` (deploy/ensure-tools.sh installs kubernetes-validate)",
        tool.display()
    );
    let dir = tempfile::tempdir().expect("a temporary folder");
    let mut files = Vec::new();
    for (i, object) in objects.iter().enumerate() {
        let file = dir.path().join(format!("{i}.json"));
        std::fs::write(&file, serde_json::to_vec_pretty(object).expect("json")).expect("write");
        files.push(file);
    }
    let out = std::process::Command::new(&tool)
        .args(["--strict", "-k", KUBE_VERSION])
        .args(&files)
        .output()
        .expect("run kubernetes-validate");
    (!out.status.success()).then(|| {
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn json<T: serde::Serialize>(object: &T) -> serde_json::Value {
    serde_json::to_value(object).expect("serialize")
}

#[test]
fn every_object_the_backend_sends_is_valid_against_the_kubernetes_schema() {
    let mut objects = Vec::new();
    for workspace in [
        Workspace::EmptyDir,
        Workspace::Claim {
            storage_class: Some("fast".to_owned()),
        },
    ] {
        let config = config(workspace);
        for (egress, read_only) in [(false, true), (true, false)] {
            let spec = spec(egress, read_only);
            objects.push(json(&pod::pod(&config, &spec)));
            objects.push(json(&pod::secret(&config, &spec)));
            if let Some(claim) = pod::claim(&config, &spec) {
                objects.push(json(&claim));
            }
        }
        objects.extend(policy::policies(&config).iter().map(json));
    }
    assert_eq!(objects.len(), 2 * 2 * 2 + 2 + 2 * 3);
    if let Some(why) = refusal(&objects) {
        panic!(
            "kubernetes-validate refused them:\n{why}\n{}",
            serde_json::to_string_pretty(&objects).unwrap_or_default()
        );
    }
    // The check can fail: a field the schema does not have, or a value of the wrong type, is refused.
    let mut unknown = objects[0].clone();
    unknown["spec"]["containers"][0]["privilegedd"] = serde_json::Value::Bool(false);
    let mut mistyped = objects[0].clone();
    mistyped["spec"]["automountServiceAccountToken"] = serde_json::Value::from("no");
    for broken in [unknown, mistyped] {
        assert!(
            refusal(&[broken]).is_some(),
            "kubernetes-validate let a broken pod through"
        );
    }
}

#[test]
fn a_sandbox_s_runtime_class_wins_over_the_runtime_s_default() {
    let mut config = config(Workspace::EmptyDir);
    config.runtime_class = None;
    let class = |config: &KubernetesConfig, spec: &BackendSpec| {
        pod::pod(config, spec)
            .spec
            .and_then(|s| s.runtime_class_name)
    };
    assert_eq!(class(&config, &spec(false, true)), None);
    assert_eq!(
        class(&config, &spec(true, true)).as_deref(),
        Some("kata-qemu")
    );
    config.runtime_class = Some("gvisor".to_owned());
    assert_eq!(
        class(&config, &spec(false, true)).as_deref(),
        Some("gvisor")
    );
    assert_eq!(
        class(&config, &spec(true, true)).as_deref(),
        Some("kata-qemu")
    );
}

#[test]
fn a_sandbox_pod_is_isolated_limited_and_never_holds_its_token_in_clear() {
    let config = config(Workspace::EmptyDir);
    let spec = spec(false, true);
    let pod = pod::pod(&config, &spec);
    let text = serde_json::to_string(&pod).expect("json");
    assert!(
        !text.contains(&spec.token),
        "the token is in the pod spec: {text}"
    );
    let labels = pod.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get(LABEL_INSTANCE).map(String::as_str), Some("i1"));
    assert_eq!(labels.get(LABEL_SANDBOX_ID), Some(&spec.id.to_string()));
    assert_eq!(labels.get(LABEL_EGRESS).map(String::as_str), Some("false"));

    let p = pod.spec.expect("a pod spec");
    assert_eq!(p.automount_service_account_token, Some(false));
    assert_eq!(p.enable_service_links, Some(false));
    assert_eq!(
        (p.host_network, p.host_pid, p.host_ipc),
        (Some(false), Some(false), Some(false))
    );
    assert!(
        p.volumes.iter().flatten().all(|v| v.host_path.is_none()),
        "no host paths"
    );
    // Without egress, no resolver (not the cluster's either).
    assert_eq!(p.dns_policy.as_deref(), Some("None"));
    assert_eq!(p.runtime_class_name.as_deref(), Some("gvisor"));

    let sandbox = &p.containers[0];
    assert_eq!(sandbox.image.as_deref(), Some("python:3.12-slim"));
    assert_eq!(
        sandbox.command.as_deref(),
        Some(mentis_core::layout::entrypoint().as_slice())
    );
    let token = sandbox
        .env
        .iter()
        .flatten()
        .find(|e| e.name == TOKEN_ENV)
        .expect("the token's variable");
    assert_eq!(token.value, None);
    let from = token
        .value_from
        .as_ref()
        .and_then(|f| f.secret_key_ref.as_ref())
        .expect("from the Secret");
    assert_eq!(from.name, pod::secret_name(spec.id));
    let security = sandbox
        .security_context
        .as_ref()
        .expect("a security context");
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    let caps = security.capabilities.as_ref().expect("capabilities");
    assert_eq!(caps.drop.as_deref(), Some(["ALL".to_owned()].as_slice()));
    assert_eq!(
        caps.add.as_deref(),
        Some(["SETUID", "SETGID", "CHOWN"].map(str::to_owned).as_slice())
    );
    let resources = sandbox.resources.as_ref().expect("resources");
    let limits = resources.limits.clone().unwrap_or_default();
    assert_eq!(limits.get("cpu").map(|q| q.0.as_str()), Some("1500m"));
    assert_eq!(limits.get("memory").map(|q| q.0.as_str()), Some("1024Mi"));
    assert_eq!(resources.requests, resources.limits, "the Guaranteed class");
    let workspace = p
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "workspace")
        .and_then(|v| v.empty_dir.as_ref())
        .expect("an emptyDir workspace");
    assert_eq!(
        workspace.size_limit.as_ref().map(|q| q.0.as_str()),
        Some("4096Mi")
    );
    // The executor comes from its image through the init container, mounted read-only.
    let install = &p.init_containers.as_deref().expect("init containers")[0];
    assert_eq!(install.image.as_deref(), Some("mentis/executor:latest"));
    assert!(
        sandbox
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path == mentis_core::layout::MOUNT && m.read_only == Some(true))
    );

    // A wedged executor is restarted in place by the kubelet (its gRPC health, a minute).
    let probe = sandbox.liveness_probe.as_ref().expect("a liveness probe");
    assert_eq!(probe.grpc.as_ref().map(|g| g.port), Some(50052));
    assert_eq!(
        probe.period_seconds.unwrap_or(10) * probe.failure_threshold.unwrap_or(3),
        60
    );

    // With egress: the cluster's resolver, which the egress policy lets it reach on port 53.
    let with = pod::pod(&config, &self::spec(true, false));
    let p = with.spec.expect("a pod spec");
    assert_eq!(p.dns_policy.as_deref(), Some("ClusterFirst"));
}

#[test]
fn network_policies_let_only_the_runtime_in_and_egress_out_of_internal_ranges_only() {
    let config = config(Workspace::EmptyDir);
    let policies = policy::policies(&config);
    let text = serde_json::to_value(&policies).expect("json");
    let [ingress, no_egress, egress] = policies.as_slice() else {
        panic!("three policies: {text}");
    };
    let rules = ingress
        .spec
        .as_ref()
        .and_then(|s| s.ingress.clone())
        .expect("ingress rules");
    assert_eq!(rules.len(), 1);
    let from = rules[0].from.clone().expect("from the runtime only");
    assert_eq!(from.len(), 1);
    assert!(from[0].pod_selector.is_some() && from[0].namespace_selector.is_some());
    assert_eq!(
        no_egress.spec.as_ref().and_then(|s| s.egress.clone()),
        Some(Vec::new()),
        "no egress at all"
    );
    let to = egress
        .spec
        .as_ref()
        .and_then(|s| s.egress.clone())
        .expect("egress rules")[0]
        .to
        .clone()
        .expect("to");
    let except: Vec<String> = to
        .iter()
        .filter_map(|peer| peer.ip_block.as_ref())
        .flat_map(|b| b.except.clone().unwrap_or_default())
        .collect();
    // Names through the cluster's DNS only, on port 53.
    let dns = egress
        .spec
        .as_ref()
        .and_then(|s| s.egress.clone())
        .expect("egress rules")[1]
        .clone();
    let ports: Vec<(String, String)> = dns
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.protocol.clone().unwrap_or_default(),
                serde_json::to_string(&p.port).unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        ports,
        [
            ("UDP".to_owned(), "53".to_owned()),
            ("TCP".to_owned(), "53".to_owned())
        ]
    );
    let peer = &dns.to.expect("to the cluster's DNS")[0];
    assert!(
        peer.ip_block.is_none() && peer.pod_selector.is_some() && peer.namespace_selector.is_some()
    );
    for cidr in [
        "169.254.0.0/16",
        "10.0.0.0/8",
        "10.96.0.0/12",
        "fd00:10:96::/112",
        "fc00::/7",
    ] {
        assert!(
            except.iter().any(|c| c == cidr),
            "{cidr} is not denied: {except:?}"
        );
    }
}
