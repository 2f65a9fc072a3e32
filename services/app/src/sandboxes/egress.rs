//! The egress gateway of this runtime's sandboxes with EGRESS_RULES (docs/EGRESS.md): started at the first
//! such sandbox, or at start when live ones have rules, on the address the backend's gateway network sends
//! their traffic to, with the backend's routing put in place; it ends with the runtime, whose sandboxes
//! outlive it: the routing stays, so their connections meet no listener until the next runtime's gateway. It asks the registry which
//! sandbox a connection comes from (by its address on the gateway network) and what its policy is now, so a
//! changed policy holds for the next connection, and keeps each sandbox's latest refusals.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::SystemTime;

use mentis_core::egress::Egress;
use mentis_core::{Error, Reason, Result, SandboxBackend, SandboxId, SpaceId};
use mentis_gateway::{Denial, Gateway, GatewayConfig, Policies, Redirected, SandboxPolicy};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::registry::Registry;
use crate::config::RuntimeConfig;
use crate::store::Store;

/// INVALID_ARGUMENT (at `field`, the rule's headers) when `egress` names a secret `space` does not have.
pub fn check_secrets(store: &Store, space: &SpaceId, egress: &Egress, field: &str) -> Result<()> {
    if egress.secrets().is_empty() {
        return Ok(());
    }
    let have = store.secrets(space)?;
    for (i, rule) in egress.rules().iter().enumerate() {
        for header in &rule.headers {
            if let Some(missing) = header.secrets().find(|n| !have.contains_key(*n)) {
                return Err(Error::invalid(format!(
                    "{field}[{i}].headers: space {space} has no secret {missing} (SpaceService/SetSecret)"
                ))
                .at(format!("{field}[{i}].headers")));
            }
        }
    }
    Ok(())
}

/// UNAVAILABLE: the gateway cannot do `what`.
fn unavailable(what: &str, e: std::io::Error) -> Error {
    Error::unavailable(format!("the egress gateway cannot {what}: {e}"))
}

/// Refusals kept per sandbox.
pub const KEPT_DENIALS: usize = 256;

/// One refusal, when it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DenialRecord {
    pub time: SystemTime,
    pub denial: Denial,
}

/// The gateway, once started, and what it asks.
pub struct EgressGateway {
    config: Arc<RuntimeConfig>,
    backend: Arc<dyn SandboxBackend>,
    lookup: Arc<Lookup>,
    /// Started.
    started: tokio::sync::OnceCell<()>,
    /// The instance's CA, loaded or made at first need (behind a lock: two makers would make two).
    interceptor: Mutex<Option<Arc<mentis_gateway::intercept::Interceptor>>>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for EgressGateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressGateway").finish_non_exhaustive()
    }
}

/// What the gateway asks, answered from the registry.
struct Lookup {
    registry: Arc<Registry>,
    store: Arc<Store>,
    /// Addresses on the gateway network, as last seen; checked against the sandbox's executor on each use.
    sources: RwLock<HashMap<IpAddr, SandboxId>>,
    denials: Mutex<HashMap<SandboxId, VecDeque<DenialRecord>>>,
}

impl EgressGateway {
    pub fn new(
        config: Arc<RuntimeConfig>,
        backend: Arc<dyn SandboxBackend>,
        registry: Arc<Registry>,
        store: Arc<Store>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            config,
            backend,
            lookup: Arc::new(Lookup {
                registry,
                store,
                sources: RwLock::new(HashMap::new()),
                denials: Mutex::new(HashMap::new()),
            }),
            started: tokio::sync::OnceCell::new(),
            interceptor: Mutex::new(None),
            tasks,
            shutdown,
        }
    }

    /// Starts the gateway unless it runs; FAILED_PRECONDITION when the backend cannot put sandboxes behind
    /// one.
    pub async fn ensure(&self) -> Result<()> {
        self.started.get_or_try_init(|| self.start()).await?;
        Ok(())
    }

    /// The env every sandbox gets where the backend can put it behind the gateway: the CA for its trust
    /// store, so rules given to it later (another mode included) can set headers over the gateway's TLS.
    /// Empty elsewhere, and when the CA cannot be read or made (said in the log; a sandbox with rules is
    /// then refused at the gateway's start).
    pub fn sandbox_env(&self) -> Vec<String> {
        if !self.backend.supports_gateway() {
            return Vec::new();
        }
        match self.interceptor() {
            Ok(i) => mentis_core::layout::egress_ca_env(i.ca_pem()),
            Err(e) => {
                tracing::warn!(error = %e.chain(), "egress gateway: no CA for the sandbox's trust store");
                Vec::new()
            }
        }
    }

    /// The instance's CA (`MENTIS_DATA_DIR/egress-ca.pem`), with the upstream trust store.
    fn interceptor(&self) -> Result<Arc<mentis_gateway::intercept::Interceptor>> {
        let mut held = self.interceptor.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = held.as_ref() {
            return Ok(Arc::clone(i));
        }
        let roots = mentis_gateway::intercept::roots(
            &self
                .config
                .egress
                .upstream_ca_files
                .iter()
                .map(std::path::PathBuf::as_path)
                .collect::<Vec<_>>(),
        )
        .map_err(|e| unavailable("read its upstream CA files", e))?;
        let made = Arc::new(
            mentis_gateway::intercept::Interceptor::load_or_create(&self.config.data_dir, roots)
                .map_err(|e| unavailable("load or make its CA", e))?,
        );
        *held = Some(Arc::clone(&made));
        Ok(made)
    }

    async fn start(&self) -> Result<()> {
        let Some(network) = self.backend.gateway_network().await? else {
            return Err(Error::new(
                Reason::FailedPrecondition,
                "this runtime's backend cannot put sandboxes behind an egress gateway: EGRESS_RULES is \
                 not available here (docs/EGRESS.md)",
            ));
        };
        let any_port = |ip| SocketAddr::new(IpAddr::V4(ip), 0);
        let mut config = GatewayConfig::new(
            any_port(network.address),
            any_port(network.address),
            network.own_networks.clone(),
        )
        .map_err(|e| unavailable("read the host's addresses", e))?;
        config.hosts = self.config.egress.hosts.clone();
        config.intercept = Some(self.interceptor()?);
        let gateway = Gateway::bind(config, self.lookup.clone(), Arc::new(Redirected))
            .await
            .map_err(|e| unavailable("listen", e))?;
        let (tcp, dns) = (
            gateway.tcp_addr().map_err(|e| unavailable("listen", e))?,
            gateway.dns_addr().map_err(|e| unavailable("listen", e))?,
        );
        self.backend
            .route_to_gateway(tcp.port(), dns.port())
            .await?;
        tracing::info!(%tcp, %dns, "egress gateway started");
        self.tasks.spawn(gateway.run(self.shutdown.clone()));
        Ok(())
    }

    /// The latest refusals of a sandbox, oldest first.
    pub fn denials(&self, id: SandboxId) -> Vec<DenialRecord> {
        self.lookup
            .denials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&id)
            .map(|d| d.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Forgets the refusals of sandboxes the runtime forgot.
    pub fn prune(&self, known: impl Fn(SandboxId) -> bool) {
        self.lookup
            .denials
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|id, _| known(*id));
    }
}

impl Lookup {
    /// The policy of the live sandbox whose executor's gateway address is `source`.
    fn policy_of(&self, id: SandboxId, source: IpAddr) -> Option<SandboxPolicy> {
        let h = self.registry.find(id)?;
        if h.executor()?.gateway_source() != Some(source) {
            return None;
        }
        let record = h.snapshot();
        if record.state.is_final() {
            return None;
        }
        Some(SandboxPolicy {
            sandbox: id,
            space: record.space_id,
            egress: Arc::new(match record.egress {
                rules @ Egress::Rules(_) => rules,
                // Moved off rules meanwhile: nothing more through the gateway.
                _ => Egress::Rules(Vec::new()),
            }),
        })
    }
}

impl Policies for Lookup {
    fn policy(&self, source: IpAddr) -> Option<SandboxPolicy> {
        let known = self
            .sources
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&source)
            .copied();
        if let Some(policy) = known.and_then(|id| self.policy_of(id, source)) {
            return Some(policy);
        }
        // A new sandbox, or one that came back at another address: look again at every live executor.
        // (The engine gives a deleted sandbox's address to the next one, while the ended record stays.)
        let fresh: HashMap<IpAddr, SandboxId> = self
            .registry
            .handles()
            .into_iter()
            .filter(|h| !h.state().is_final())
            .filter_map(|h| Some((h.executor()?.gateway_source()?, h.id)))
            .collect();
        let id = fresh.get(&source).copied();
        *self.sources.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        self.policy_of(id?, source)
    }

    fn secret(&self, space: &SpaceId, name: &str) -> Option<String> {
        match self.store.secrets(space) {
            Ok(mut secrets) => secrets.remove(name),
            Err(e) => {
                tracing::warn!(space_id = %space, error = %e.chain(), "egress gateway: secrets not read");
                None
            }
        }
    }

    fn denied(&self, sandbox: SandboxId, denial: Denial) {
        crate::metrics::egress_denied(denial.protocol);
        let mut all = self.denials.lock().unwrap_or_else(|p| p.into_inner());
        let list = all.entry(sandbox).or_default();
        if list.len() >= KEPT_DENIALS {
            list.pop_front();
        }
        list.push_back(DenialRecord {
            time: crate::clock::now(),
            denial,
        });
    }
}
