//! The egress gateway (docs/EGRESS.md): where the connections and DNS questions of sandboxes with
//! EGRESS_RULES arrive, redirected by the network in front of them (on Docker, the host's netfilter on their
//! network's bridge), and are decided by their policy. It never runs inside a sandbox.
//!
//! - DNS: a name some rule allows gets its IPv4 addresses as the gateway resolves it (its own `hosts` first,
//!   then the host's resolver); any other name NXDOMAIN, never asked upstream.
//! - TCP: a connection to an address a network rule allows (with its port) is passed through; any other is
//!   read until its first bytes name where it is going (TLS server name, HTTP Host), and a name a domain rule
//!   allows on that port is connected to *as the gateway resolves the name*, never to the address the sandbox
//!   asked for, so a forged server name reaches only the named host. Rules with headers end TLS and set them
//!   on each request (`intercept`).
//! - Never reachable, whatever a rule says: loopback, link-local (cloud metadata), multicast, the host's own
//!   addresses and the networks the runtime names (its sandboxes' own).
//!
//! Every refusal is reported to [`Policies::denied`] with the sandbox it was for.

pub mod dns;
pub mod intercept;
pub mod sniff;

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::Duration;

use mentis_core::egress::{Cidr, Egress};
use mentis_core::{SandboxId, SpaceId};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use sniff::Sniffed;

/// Questions answered at once at most; more wait.
const DNS_IN_FLIGHT: usize = 256;
/// Connections served at once at most; more wait in the listener's backlog.
const CONNECTIONS: usize = 4096;

/// Where the gateway listens and what it never reaches.
#[derive(Debug, Clone)]
pub struct GatewayConfig {
    /// Redirected TCP connections arrive here.
    pub tcp: SocketAddr,
    /// Redirected DNS questions (UDP) arrive here.
    pub dns: SocketAddr,
    /// Names answered from here before the host's resolver (lowercase).
    pub hosts: HashMap<String, Vec<Ipv4Addr>>,
    /// Never reachable, whatever a rule allows.
    pub never: Never,
    /// A connection must name where it goes within this.
    pub sniff_timeout: Duration,
    /// Connecting upstream gives up after this.
    pub connect_timeout: Duration,
    /// Ends TLS for domains with headers to set; `None`: such rules are refused at connection time.
    pub intercept: Option<Arc<intercept::Interceptor>>,
}

impl GatewayConfig {
    /// Listening on `tcp` and `dns`, with the standard never-reachable addresses and `never` beside them.
    pub fn new(tcp: SocketAddr, dns: SocketAddr, never: Vec<Cidr>) -> io::Result<Self> {
        Ok(Self {
            tcp,
            dns,
            hosts: HashMap::new(),
            never: Never::standard(never)?,
            sniff_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(10),
            intercept: None,
        })
    }
}

/// The addresses no sandbox reaches through the gateway.
#[derive(Debug, Clone, Default)]
pub struct Never {
    /// Loopback, link-local, multicast, broadcast and unspecified addresses.
    pub special: bool,
    /// Networks named by the runtime (its sandboxes' own) and the host's own addresses.
    pub networks: Vec<Cidr>,
}

impl Never {
    /// The special addresses, the host's own (as its interfaces have them now) and `networks`.
    pub fn standard(mut networks: Vec<Cidr>) -> io::Result<Self> {
        let interfaces = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
        for ifa in interfaces {
            if let Some(addr) = ifa.address.as_ref().and_then(|a| a.as_sockaddr_in()) {
                networks.push(Cidr {
                    addr: addr.ip(),
                    prefix: 32,
                });
            }
        }
        Ok(Self {
            special: true,
            networks,
        })
    }

    pub fn forbids(&self, ip: Ipv4Addr) -> bool {
        (self.special
            && (ip.is_loopback()
                || ip.is_link_local()
                || ip.is_multicast()
                || ip.is_broadcast()
                || ip.is_unspecified()))
            || self.networks.iter().any(|n| n.contains(ip))
    }
}

/// A sandbox's policy, as the gateway needs it.
#[derive(Debug, Clone)]
pub struct SandboxPolicy {
    pub sandbox: SandboxId,
    pub space: SpaceId,
    pub egress: Arc<Egress>,
}

/// One refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Denial {
    /// "dns", "tcp", "tls" or "http".
    pub protocol: &'static str,
    /// The name asked for or sent, when there was one.
    pub name: Option<String>,
    /// Where the connection was going, when it was a connection.
    pub address: Option<SocketAddrV4>,
    pub reason: String,
}

/// What the gateway asks of the runtime.
pub trait Policies: Send + Sync + 'static {
    /// The sandbox whose address (on the network in front of the gateway) is `source`, and its policy now.
    fn policy(&self, source: IpAddr) -> Option<SandboxPolicy>;
    /// The value of a space's secret.
    fn secret(&self, space: &SpaceId, name: &str) -> Option<String>;
    /// A refusal, for the sandbox's list and the metrics.
    fn denied(&self, sandbox: SandboxId, denial: Denial);
}

/// Where a connection that arrived at the gateway was going.
pub trait Destinations: Send + Sync + 'static {
    fn original(&self, stream: &TcpStream) -> io::Result<SocketAddrV4>;
}

/// The destination netfilter's REDIRECT kept (`SO_ORIGINAL_DST`).
#[derive(Debug, Clone, Copy)]
pub struct Redirected;

impl Destinations for Redirected {
    fn original(&self, stream: &TcpStream) -> io::Result<SocketAddrV4> {
        let addr = nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::OriginalDst)
            .map_err(io::Error::from)?;
        Ok(SocketAddrV4::new(
            Ipv4Addr::from(u32::from_be(addr.sin_addr.s_addr)),
            u16::from_be(addr.sin_port),
        ))
    }
}

/// The gateway, bound.
pub struct Gateway {
    tcp: TcpListener,
    dns: UdpSocket,
    shared: Arc<Shared>,
}

struct Shared {
    config: GatewayConfig,
    policies: Arc<dyn Policies>,
    destinations: Arc<dyn Destinations>,
    /// Its own TCP address: a connection straight to it goes nowhere.
    own: SocketAddr,
}

impl Gateway {
    pub async fn bind(
        config: GatewayConfig,
        policies: Arc<dyn Policies>,
        destinations: Arc<dyn Destinations>,
    ) -> io::Result<Self> {
        let tcp = TcpListener::bind(config.tcp).await?;
        let dns = UdpSocket::bind(config.dns).await?;
        let own = tcp.local_addr()?;
        Ok(Self {
            tcp,
            dns,
            shared: Arc::new(Shared {
                config,
                policies,
                destinations,
                own,
            }),
        })
    }

    pub fn tcp_addr(&self) -> io::Result<SocketAddr> {
        self.tcp.local_addr()
    }

    pub fn dns_addr(&self) -> io::Result<SocketAddr> {
        self.dns.local_addr()
    }

    /// Serves until `cancel`; every connection and question it started is ended and awaited before it
    /// returns.
    pub async fn run(self, cancel: CancellationToken) {
        let dns = Arc::new(self.dns);
        let mut tasks = JoinSet::new();
        let slots = Arc::new(tokio::sync::Semaphore::new(CONNECTIONS));
        let questions = Arc::new(tokio::sync::Semaphore::new(DNS_IN_FLIGHT));
        let mut packet = vec![0u8; 4096];
        loop {
            tokio::select! {
                () = cancel.cancelled() => break,
                Some(_) = tasks.join_next(), if !tasks.is_empty() => {}
                accepted = self.tcp.accept() => match accepted {
                    Ok((stream, peer)) => {
                        let Ok(slot) = slots.clone().acquire_owned().await else { break };
                        let shared = self.shared.clone();
                        tasks.spawn(async move {
                            let _slot = slot;
                            shared.connection(stream, peer).await;
                        });
                    }
                    Err(e) => {
                        // Out of descriptors and the like: the listener stays.
                        tracing::warn!(error = %e, "egress gateway: accept failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                received = dns.recv_from(&mut packet) => match received {
                    Ok((n, peer)) => {
                        let Ok(slot) = questions.clone().acquire_owned().await else { break };
                        let shared = self.shared.clone();
                        let dns = dns.clone();
                        let query = packet[..n].to_vec();
                        tasks.spawn(async move {
                            let _slot = slot;
                            if let Some(response) = shared.question(&query, peer).await {
                                let _ = dns.send_to(&response, peer).await;
                            }
                        });
                    }
                    Err(e) => tracing::debug!(error = %e, "egress gateway: a DNS packet could not be read"),
                },
            }
        }
        tasks.shutdown().await;
    }
}

impl Shared {
    fn deny(&self, policy: &SandboxPolicy, denial: Denial) {
        tracing::debug!(sandbox_id = %policy.sandbox, ?denial, "egress denied");
        self.policies.denied(policy.sandbox, denial);
    }

    async fn question(&self, query: &[u8], peer: SocketAddr) -> Option<Vec<u8>> {
        let (message, question) = match dns::question(query) {
            Ok(q) => q,
            Err(response) => return response,
        };
        let Some(policy) = self.policies.policy(peer.ip()) else {
            return dns::respond(&message, dns::Answer::Refused);
        };
        if !policy.egress.resolves(&question.name) {
            self.deny(
                &policy,
                Denial {
                    protocol: "dns",
                    name: Some(question.name.clone()),
                    address: None,
                    reason: format!("no rule allows {}", question.name),
                },
            );
            return dns::respond(&message, dns::Answer::NxDomain);
        }
        let answer = if question.kind == hickory_proto::rr::RecordType::A {
            match self.resolve(&question.name).await {
                Ok(addrs) => dns::Answer::Addresses(addrs),
                Err(e) => {
                    tracing::debug!(name = %question.name, error = %e, "egress gateway: name not resolved");
                    dns::Answer::ServFail
                }
            }
        } else {
            dns::Answer::NoData
        };
        dns::respond(&message, answer)
    }

    /// The IPv4 addresses of `name` a sandbox may reach: the gateway's hosts, else the host's resolver.
    async fn resolve(&self, name: &str) -> io::Result<Vec<Ipv4Addr>> {
        let all: Vec<Ipv4Addr> = match self.config.hosts.get(name) {
            Some(addrs) => addrs.clone(),
            None => tokio::net::lookup_host((name, 0))
                .await?
                .filter_map(|a| match a.ip() {
                    IpAddr::V4(v4) => Some(v4),
                    IpAddr::V6(_) => None,
                })
                .collect(),
        };
        Ok(all
            .into_iter()
            .filter(|ip| !self.config.never.forbids(*ip))
            .collect())
    }

    async fn connection(&self, mut stream: TcpStream, peer: SocketAddr) {
        let Some(policy) = self.policies.policy(peer.ip()) else {
            tracing::debug!(%peer, "egress gateway: a connection from no known sandbox");
            return;
        };
        let dst = match self.destinations.original(&stream) {
            Ok(dst) => dst,
            Err(e) => {
                tracing::debug!(%peer, error = %e, "egress gateway: no original destination");
                return;
            }
        };
        let deny = |reason: String, protocol: &'static str, name: Option<String>| {
            self.deny(
                &policy,
                Denial {
                    protocol,
                    name,
                    address: Some(dst),
                    reason,
                },
            );
        };
        if SocketAddr::V4(dst) == self.own {
            return deny("the gateway itself".to_owned(), "tcp", None);
        }
        if self.never.forbids(*dst.ip()) {
            return deny(
                format!("{} is never reachable from a sandbox", dst.ip()),
                "tcp",
                None,
            );
        }
        if policy.egress.rule_for_addr(*dst.ip(), dst.port()).is_some() {
            let Some(upstream) = self.connect(&[*dst.ip()], dst.port()).await else {
                return;
            };
            splice(stream, upstream, &[]).await;
            return;
        }
        let sniffed =
            tokio::time::timeout(self.config.sniff_timeout, sniff::sniff(&mut stream)).await;
        let (sniffed, head) = match sniffed {
            Ok(Ok(s)) => s,
            Ok(Err(_)) => return,
            Err(_) => {
                return deny(
                    format!("sent nothing for {:?}", self.config.sniff_timeout),
                    "tcp",
                    None,
                );
            }
        };
        let (protocol, name) = match sniffed {
            Sniffed::Tls(name) => ("tls", name),
            Sniffed::Http(name) => ("http", name),
            Sniffed::Other => {
                return deny(
                    format!(
                        "neither TLS nor HTTP to {dst}, and no rule allows the address: only a cidr rule allows other protocols"
                    ),
                    "tcp",
                    None,
                );
            }
        };
        let Some(name) = name else {
            return deny(format!("{protocol} without a server name"), protocol, None);
        };
        let Some(rule) = policy.egress.rule_for_name(&name, dst.port()) else {
            return deny(
                format!("no rule allows {name} on port {}", dst.port()),
                protocol,
                Some(name),
            );
        };
        let addrs = match self.resolve(&name).await {
            Ok(addrs) if !addrs.is_empty() => addrs,
            Ok(_) => {
                return deny(
                    format!("{name} has no address a sandbox may reach"),
                    protocol,
                    Some(name),
                );
            }
            Err(e) => {
                return deny(
                    format!("{name} does not resolve: {e}"),
                    protocol,
                    Some(name),
                );
            }
        };
        if rule.intercepts() {
            let Some(interceptor) = self.config.intercept.clone() else {
                return deny(
                    "this gateway sets no headers (it has no CA)".to_owned(),
                    protocol,
                    Some(name),
                );
            };
            let Some(upstream) = self.connect(&addrs, dst.port()).await else {
                return;
            };
            let headers =
                match intercept::render(rule, |secret| self.policies.secret(&policy.space, secret))
                {
                    Ok(headers) => headers,
                    Err(missing) => {
                        return deny(
                            format!("the space has no secret {missing} for {name}"),
                            protocol,
                            Some(name),
                        );
                    }
                };
            let tls = protocol == "tls";
            interceptor
                .serve(stream, head, upstream, &name, tls, headers)
                .await;
            return;
        }
        let Some(upstream) = self.connect(&addrs, dst.port()).await else {
            return;
        };
        splice(stream, upstream, &head).await;
    }

    /// The first of `addrs` that answers on `port`.
    async fn connect(&self, addrs: &[Ipv4Addr], port: u16) -> Option<TcpStream> {
        for ip in addrs {
            let addr = SocketAddrV4::new(*ip, port);
            match tokio::time::timeout(self.config.connect_timeout, TcpStream::connect(addr)).await
            {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Some(stream);
                }
                Ok(Err(e)) => {
                    tracing::debug!(%addr, error = %e, "egress gateway: upstream refused")
                }
                Err(_) => tracing::debug!(%addr, "egress gateway: upstream did not answer"),
            }
        }
        None
    }
}

impl std::ops::Deref for Shared {
    type Target = GatewayConfig;
    fn deref(&self) -> &GatewayConfig {
        &self.config
    }
}

/// Sends `head` upstream, then copies both ways until both sides are done.
async fn splice(mut client: TcpStream, mut upstream: TcpStream, head: &[u8]) {
    if !head.is_empty() && upstream.write_all(head).await.is_err() {
        return;
    }
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}
