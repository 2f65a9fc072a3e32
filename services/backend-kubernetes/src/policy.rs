//! Isolation by the cluster (docs/ARCHITECTURE.md, "Kubernetes backend"): the NetworkPolicies of one
//! instance's sandbox pods, applied at start.
//!
//! - **ingress**: only the runtime's pods reach a sandbox pod, and only on the executor's port; so pods of
//!   one space cannot reach those of another (nor of their own);
//! - **no egress**: a sandbox that did not ask for egress sends nothing at all (DNS included: its pod has no
//!   resolver);
//! - **egress**: a sandbox that asked reaches any address but the cluster's own ranges, the private and
//!   link-local ranges (the metadata address among them) and the loopback; and the cluster's DNS
//!   (`k8s-app=kube-dns` in `kube-system`) on port 53, its only resolver (a node's resolver is often at a
//!   private or link-local address, which the ranges deny).
//!
//! A NetworkPolicy is enforced only where the cluster's network plugin does (Calico, Cilium, …): on one that
//! does not, these allow everything, and docs/KUBERNETES.md says so.

use std::collections::BTreeMap;

use k8s_openapi::api::networking::v1::{
    IPBlock, NetworkPolicy, NetworkPolicyEgressRule, NetworkPolicyIngressRule, NetworkPolicyPeer,
    NetworkPolicyPort, NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mentis_core::layout::{LABEL_EGRESS, LABEL_INSTANCE, LABEL_MANAGED};

use crate::config::KubernetesConfig;

/// Ranges no sandbox reaches even with egress, besides the cluster's own (`internal_cidrs`).
pub const ALWAYS_DENIED_V4: &[&str] = &[
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
    "127.0.0.0/8",
    "0.0.0.0/8",
];
pub const ALWAYS_DENIED_V6: &[&str] = &["fc00::/7", "fe80::/10", "::1/128"];

fn selector(config: &KubernetesConfig, egress: Option<bool>) -> LabelSelector {
    let mut labels = BTreeMap::from([
        (LABEL_MANAGED.to_owned(), "true".to_owned()),
        (LABEL_INSTANCE.to_owned(), config.instance.clone()),
    ]);
    if let Some(egress) = egress {
        labels.insert(LABEL_EGRESS.to_owned(), egress.to_string());
    }
    LabelSelector {
        match_labels: Some(labels),
        ..Default::default()
    }
}

fn policy(config: &KubernetesConfig, name: &str, spec: NetworkPolicySpec) -> NetworkPolicy {
    NetworkPolicy {
        metadata: ObjectMeta {
            name: Some(format!("mentis-{}-{name}", config.instance)),
            namespace: Some(config.namespace.clone()),
            labels: Some(BTreeMap::from([
                (LABEL_MANAGED.to_owned(), "true".to_owned()),
                (LABEL_INSTANCE.to_owned(), config.instance.clone()),
            ])),
            ..Default::default()
        },
        spec: Some(spec),
    }
}

/// The instance's policies, in the order they are applied.
pub fn policies(config: &KubernetesConfig) -> Vec<NetworkPolicy> {
    let runtime = NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(config.runtime_pod_labels.clone()),
            ..Default::default()
        }),
        namespace_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "kubernetes.io/metadata.name".to_owned(),
                config.runtime_namespace.clone(),
            )])),
            ..Default::default()
        }),
        ..Default::default()
    };
    let ingress = policy(
        config,
        "ingress",
        NetworkPolicySpec {
            pod_selector: Some(selector(config, None)),
            policy_types: Some(vec!["Ingress".to_owned()]),
            ingress: Some(vec![NetworkPolicyIngressRule {
                from: Some(vec![runtime]),
                ports: Some(vec![NetworkPolicyPort {
                    protocol: Some("TCP".to_owned()),
                    port: Some(IntOrString::Int(i32::from(config.executor_port))),
                    ..Default::default()
                }]),
            }]),
            ..Default::default()
        },
    );
    let no_egress = policy(
        config,
        "no-egress",
        NetworkPolicySpec {
            pod_selector: Some(selector(config, Some(false))),
            policy_types: Some(vec!["Egress".to_owned()]),
            egress: Some(Vec::new()),
            ..Default::default()
        },
    );
    let block = |cidr: &str, except: Vec<String>| NetworkPolicyPeer {
        ip_block: Some(IPBlock {
            cidr: cidr.to_owned(),
            except: Some(except),
        }),
        ..Default::default()
    };
    // The ranges an address family never reaches: the fixed ones and the cluster's own of that family.
    let denied = |always: &[&str], v6: bool| -> Vec<String> {
        let internal = config
            .internal_cidrs
            .iter()
            .filter(|c| c.contains(':') == v6);
        always
            .iter()
            .map(|c| (*c).to_owned())
            .chain(internal.cloned())
            .collect()
    };
    let egress = policy(
        config,
        "egress",
        NetworkPolicySpec {
            pod_selector: Some(selector(config, Some(true))),
            policy_types: Some(vec!["Egress".to_owned()]),
            egress: Some(vec![
                NetworkPolicyEgressRule {
                    to: Some(vec![
                        block("0.0.0.0/0", denied(ALWAYS_DENIED_V4, false)),
                        block("::/0", denied(ALWAYS_DENIED_V6, true)),
                    ]),
                    ..Default::default()
                },
                // Names: the cluster's DNS (its address is a service's, inside the denied ranges), on port
                // 53 only. A name of the cluster resolves, but its address stays out of reach.
                NetworkPolicyEgressRule {
                    to: Some(vec![NetworkPolicyPeer {
                        namespace_selector: Some(LabelSelector {
                            match_labels: Some(BTreeMap::from([(
                                "kubernetes.io/metadata.name".to_owned(),
                                "kube-system".to_owned(),
                            )])),
                            ..Default::default()
                        }),
                        pod_selector: Some(LabelSelector {
                            match_labels: Some(BTreeMap::from([(
                                "k8s-app".to_owned(),
                                "kube-dns".to_owned(),
                            )])),
                            ..Default::default()
                        }),
                        ..Default::default()
                    }]),
                    ports: Some(
                        ["UDP", "TCP"]
                            .iter()
                            .map(|protocol| NetworkPolicyPort {
                                protocol: Some((*protocol).to_owned()),
                                port: Some(IntOrString::Int(53)),
                                ..Default::default()
                            })
                            .collect(),
                    ),
                },
            ]),
            ..Default::default()
        },
    );
    vec![ingress, no_egress, egress]
}
