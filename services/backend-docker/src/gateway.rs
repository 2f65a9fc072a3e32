//! The network in front of the egress gateway (docs/EGRESS.md): sandboxes with EGRESS_RULES are attached to
//! it beside the executor network. It is a bridge with a default route (to the host), inter-container
//! traffic off, and the host's netfilter in its way: every TCP connection and every DNS question (UDP 53) that
//! arrives from it is redirected to the gateway's ports on the bridge's own address (the original destination
//! kept for `SO_ORIGINAL_DST`), the gateway's two ports are the only ones of the host it may open, and nothing
//! is forwarded out of it (`DOCKER-USER`, which the engine never rewrites). One per runtime instance, made at
//! the first sandbox that needs it.
//!
//! The rules live in chains of their own named after the bridge (`MGW-<bridge>`, in the nat and filter
//! tables), jumped to from PREROUTING, INPUT and DOCKER-USER for the bridge only, so they are replaced as a
//! whole. They stay when the runtime stops: its sandboxes outlive it, and the redirect then leads to no
//! listener (their connections are refused) until the next runtime's gateway takes the chains over; the
//! DROP of forwarded traffic is never lifted.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use bollard::Docker;
use bollard::models::NetworkCreateRequest;
use mentis_core::egress::Cidr;
use mentis_core::{Error, GatewayNetwork, Result};

use crate::config::DockerConfig;
use crate::error::{is_not_found, to_core};
use crate::labels::{LABEL_INSTANCE, LABEL_MANAGED};
use crate::network;

/// The chain of a bridge's rules.
fn chain(bridge: &str) -> String {
    format!("MGW-{bridge}")
}

/// The gateway network, made when missing, and the bridge it is on.
pub(crate) async fn ensure(
    docker: &Docker,
    config: &DockerConfig,
) -> Result<(GatewayNetwork, String)> {
    let name = &config.gateway_network;
    match docker.inspect_network(name, None).await {
        Ok(_) => {}
        Err(e) if is_not_found(&e) => {
            let request = NetworkCreateRequest {
                name: name.clone(),
                driver: Some("bridge".into()),
                internal: Some(false),
                options: Some(HashMap::from([(
                    "com.docker.network.bridge.enable_icc".to_owned(),
                    "false".to_owned(),
                )])),
                labels: Some(HashMap::from([
                    (LABEL_MANAGED.to_owned(), "true".to_owned()),
                    (LABEL_INSTANCE.to_owned(), config.instance.clone()),
                ])),
                ..Default::default()
            };
            match docker.create_network(request).await {
                Ok(_) => tracing::info!(network = %name, "created the egress gateway's network"),
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 409, ..
                }) => {}
                Err(e) => return Err(to_core("create the egress gateway's network", e)),
            }
        }
        Err(e) => return Err(to_core("inspect the egress gateway's network", e)),
    }
    let bridge = network::bridge_of(docker, name).await?;
    network::guard_host(&bridge).await?;
    let (address, subnet) = address_of(docker, name).await?;
    let mut own_networks = vec![subnet];
    for other in [&config.network, &config.egress_network] {
        if let Ok((_, subnet)) = address_of(docker, other).await {
            own_networks.push(subnet);
        }
    }
    Ok((
        GatewayNetwork {
            address,
            own_networks,
        },
        bridge,
    ))
}

/// A network's gateway address (the bridge's, on the host) and subnet.
async fn address_of(docker: &Docker, name: &str) -> Result<(Ipv4Addr, Cidr)> {
    let net = docker
        .inspect_network(name, None)
        .await
        .map_err(|e| to_core("inspect a network", e))?;
    let config = net
        .ipam
        .and_then(|i| i.config)
        .unwrap_or_default()
        .into_iter()
        .find_map(|c| {
            let subnet = Cidr::parse(c.subnet.as_deref()?).ok()?;
            let gateway: Ipv4Addr = c.gateway.as_deref()?.parse().ok()?;
            Some((gateway, subnet))
        });
    config.ok_or_else(|| Error::internal(format!("network {name} has no IPv4 subnet and gateway")))
}

/// Sends the bridge's TCP and DNS to the gateway's ports and forwards nothing else. Idempotent.
pub(crate) async fn route(bridge: &str, tcp_port: u16, dns_port: u16) -> Result<()> {
    let chain = chain(bridge);
    let (tcp, dns) = (tcp_port.to_string(), dns_port.to_string());
    for table in ["nat", "filter"] {
        // New, or emptied: the rules below are the whole of it.
        if !network::iptables(&["-t", table, "-N", &chain]).await? {
            network::iptables_ok(&["-t", table, "-F", &chain]).await?;
        }
    }
    network::iptables_ok(&[
        "-t",
        "nat",
        "-A",
        &chain,
        "-p",
        "tcp",
        "-j",
        "REDIRECT",
        "--to-ports",
        &tcp,
    ])
    .await?;
    network::iptables_ok(&[
        "-t",
        "nat",
        "-A",
        &chain,
        "-p",
        "udp",
        "--dport",
        "53",
        "-j",
        "REDIRECT",
        "--to-ports",
        &dns,
    ])
    .await?;
    network::iptables_ok(&["-A", &chain, "-p", "tcp", "--dport", &tcp, "-j", "ACCEPT"]).await?;
    network::iptables_ok(&["-A", &chain, "-p", "udp", "--dport", &dns, "-j", "ACCEPT"]).await?;
    // Before the host guard's DROP (INPUT), before anything the engine adds (PREROUTING).
    jump(&["-t", "nat"], "PREROUTING", bridge, &["-j", &chain]).await?;
    jump(&[], "INPUT", bridge, &["-j", &chain]).await?;
    let forward = if network::iptables(&["-L", "DOCKER-USER", "-n"]).await? {
        "DOCKER-USER"
    } else {
        "FORWARD"
    };
    jump(&[], forward, bridge, &["-j", "DROP"]).await?;
    tracing::info!(%bridge, tcp_port, dns_port, "egress gateway: the network's traffic goes to the gateway");
    Ok(())
}

/// Inserts `-i bridge <target>` first in `from` unless it is there.
async fn jump(table: &[&str], from: &str, bridge: &str, target: &[&str]) -> Result<()> {
    let rule = |op: &'static str| {
        let mut args: Vec<&str> = table.to_vec();
        args.extend([op, from, "-i", bridge]);
        args.extend(target);
        args
    };
    if !network::iptables(&rule("-C")).await? {
        let mut insert = rule("-I");
        // `-I CHAIN 1`: the position goes after the chain's name.
        let at = insert
            .iter()
            .position(|a| *a == from)
            .map_or(insert.len(), |i| i + 1);
        insert.insert(at, "1");
        network::iptables_ok(&insert).await?;
    }
    Ok(())
}
