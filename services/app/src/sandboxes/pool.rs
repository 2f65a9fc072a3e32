//! Warm pools: containers of an image made ahead, each with a healthy executor, waiting to become a
//! sandbox. A claim binds everything a request may carry — env (applied by the runtime to every action),
//! labels, space and key (in the store), limits (`update_limits`) — so any request for a pooled image is
//! served warm, not only requests that look like the pool.
//!
//! Labels cannot change after creation, so a member's container is labelled as a pool member (empty space)
//! and the store says what it is: a row in `pool` while idle, a sandbox record once claimed, moved in one
//! transaction. Reconciliation after a restart reads the store, not the labels.
//!
//! Pools come from `MENTIS_POOL` (one per image, for the runtime's life) and from templates with a
//! `pool_size` (one per template, made, replaced and retired as the template is created, changed and
//! deleted): a template's members are made with its image, limits and the space's data mounts, and have
//! run its start-up commands, so a claim only binds them.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use mentis_core::{
    BackendSpec, BackendState, Limits, Result, SandboxBackend, SandboxId, SpaceId, Template,
};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::reach::{reach_executor, ready_new_executor};
use crate::config::{PoolConfig, RuntimeConfig};
use crate::executor_client::ExecutorClient;
use crate::store::{Store, StoredMember};

/// Upper bound of one health check of an idle member.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a member taken over after a restart has to answer (else it is remade).
const MEMBER_TAKEOVER_READY: Duration = Duration::from_secs(10);
/// Pause after a failed attempt to make a member (a broken image must not spin).
const RETRY_PAUSE: Duration = Duration::from_secs(2);

/// An idle member.
pub struct Member {
    pub(crate) id: SandboxId,
    pub(crate) token: String,
    pub(crate) client: ExecutorClient,
}

/// What the members of a template's pool are made as: the template as it was when the pool was made,
/// resolved against its space (limits, root filesystem).
#[derive(Debug, Clone, PartialEq)]
pub struct TemplatePool {
    pub space_id: SpaceId,
    pub name: String,
    /// The template's update time (ms): members of another version are not taken over after a restart.
    pub version: i64,
    pub limits: Limits,
    pub read_only_rootfs: bool,
    /// The runtime class its members run under (the template's, else its space's); empty: the default.
    pub runtime_class: String,
    /// The template's env (its start-up commands run with it).
    pub env: BTreeMap<String, String>,
    pub setup: Vec<String>,
}

impl TemplatePool {
    /// The key its members are stored under (`SPACE/NAME@VERSION`, then `~CLASS` under a runtime class of
    /// its own): members made under another class (the space's changed) are not taken over after a restart.
    fn key(&self) -> String {
        let class = if self.runtime_class.is_empty() {
            String::new()
        } else {
            format!("~{}", self.runtime_class)
        };
        format!("{}/{}@{}{class}", self.space_id, self.name, self.version)
    }

    /// The pool of `t`, whose sandboxes get `limits`, `read_only_rootfs` and `runtime_class` (resolved by
    /// the caller).
    pub fn of(t: &Template, limits: Limits, read_only_rootfs: bool, runtime_class: &str) -> Self {
        Self {
            space_id: t.space_id.clone(),
            name: t.name.clone(),
            version: crate::store::ms(t.updated_at),
            limits,
            read_only_rootfs,
            runtime_class: runtime_class.to_owned(),
            env: t.env.clone(),
            setup: t.setup.clone(),
        }
    }
}

/// One pool.
pub struct Pool {
    pub config: PoolConfig,
    /// Set for a template's pool.
    pub template: Option<TemplatePool>,
    /// Cancelled when the pool is retired (its template changed or went) or the runtime shuts down.
    stop: CancellationToken,
    idle: Mutex<VecDeque<Member>>,
    creating: AtomicUsize,
    hits: AtomicU64,
    misses: AtomicU64,
    wake: Notify,
}

/// What a pool holds and how it served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolStats {
    pub image: String,
    /// A template's pool: its space and name.
    pub template: Option<(SpaceId, String)>,
    pub min_idle: usize,
    pub max_total: usize,
    pub idle: usize,
    pub creating: usize,
    pub hits: u64,
    pub misses: u64,
}

impl Pool {
    fn new(
        config: PoolConfig,
        template: Option<TemplatePool>,
        stop: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            config,
            template,
            stop,
            idle: Mutex::new(VecDeque::new()),
            creating: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            misses: AtomicU64::new(0),
            wake: Notify::new(),
        })
    }

    fn idle(&self) -> std::sync::MutexGuard<'_, VecDeque<Member>> {
        // Pushes and pops only: a poisoned queue is still consistent.
        self.idle.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Takes an idle member (each goes to exactly one caller: the pop is under the lock).
    pub(crate) fn take(&self) -> Option<Member> {
        let member = self.idle().pop_front();
        match member {
            Some(_) => self.hits.fetch_add(1, Ordering::Relaxed),
            None => self.misses.fetch_add(1, Ordering::Relaxed),
        };
        self.wake.notify_one();
        member
    }

    /// Returns a member taken for a claim that did not happen.
    pub(crate) fn put_back(&self, m: Member) {
        self.hits.fetch_sub(1, Ordering::Relaxed);
        self.idle().push_front(m);
    }

    /// A claimed member that could not be bound: it was a hit, it is gone now; the pool refills.
    pub(crate) fn put_back_failed(&self) {
        self.wake.notify_one();
    }

    pub fn stats(&self) -> PoolStats {
        PoolStats {
            image: self.config.image.clone(),
            template: self
                .template
                .as_ref()
                .map(|t| (t.space_id.clone(), t.name.clone())),
            min_idle: self.config.min_idle,
            max_total: self.config.max_total,
            idle: self.idle().len(),
            creating: self.creating.load(Ordering::Relaxed),
            hits: self.hits.load(Ordering::Relaxed),
            misses: self.misses.load(Ordering::Relaxed),
        }
    }
}

/// Every pool of this runtime, and what keeps them filled.
pub struct Pools {
    pools: RwLock<Vec<Arc<Pool>>>,
    /// Where the pools' tasks run, once [`Pools::spawn`] started them (pools added later start at once).
    tasks: OnceLock<TaskTracker>,
    config: Arc<RuntimeConfig>,
    backend: Arc<dyn SandboxBackend>,
    store: Arc<Store>,
    /// The egress gateway, whose CA each member trusts.
    egress: Arc<super::egress::EgressGateway>,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Pools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pools").finish_non_exhaustive()
    }
}

impl Pools {
    pub fn new(
        config: Arc<RuntimeConfig>,
        backend: Arc<dyn SandboxBackend>,
        store: Arc<Store>,
        egress: Arc<super::egress::EgressGateway>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let pools = config
            .pools
            .iter()
            .cloned()
            .map(|c| Pool::new(c, None, shutdown.child_token()))
            .collect();
        Arc::new(Self {
            pools: RwLock::new(pools),
            tasks: OnceLock::new(),
            config,
            backend,
            store,
            egress,
            shutdown,
        })
    }

    fn all(&self) -> Vec<Arc<Pool>> {
        self.pools.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The pool of `image` (`MENTIS_POOL`), when there is one.
    pub fn pool_for(&self, image: &str) -> Option<Arc<Pool>> {
        self.all()
            .into_iter()
            .find(|p| p.template.is_none() && p.config.image == image)
    }

    /// The pool of template `name` of `space`, when it has one.
    pub fn pool_for_template(&self, space: &SpaceId, name: &str) -> Option<Arc<Pool>> {
        self.all().into_iter().find(|p| {
            p.template
                .as_ref()
                .is_some_and(|t| &t.space_id == space && t.name == name)
        })
    }

    /// Every pool's figures.
    pub fn stats(&self) -> Vec<PoolStats> {
        self.all().iter().map(|p| p.stats()).collect()
    }

    /// Makes `template` the pool of its template (retiring the one it had), or only retires that one when
    /// `template` is None or asks for no member (`size` 0).
    pub fn set_template(
        self: &Arc<Self>,
        space: &SpaceId,
        name: &str,
        template: Option<(TemplatePool, String, usize)>,
    ) {
        let old = {
            let mut pools = self.pools.write().unwrap_or_else(|p| p.into_inner());
            let old: Vec<Arc<Pool>> = pools
                .iter()
                .filter(|p| {
                    p.template
                        .as_ref()
                        .is_some_and(|t| &t.space_id == space && t.name == name)
                })
                .cloned()
                .collect();
            pools.retain(|p| !old.iter().any(|o| Arc::ptr_eq(o, p)));
            if let Some((t, image, size)) = template.filter(|(_, _, size)| *size > 0) {
                let pool = Pool::new(
                    PoolConfig {
                        image,
                        min_idle: size,
                        max_total: size,
                        kernel: false,
                    },
                    Some(t),
                    self.shutdown.child_token(),
                );
                if let Some(tasks) = self.tasks.get() {
                    self.spawn_pool(tasks, &pool);
                }
                pools.push(pool);
            }
            old
        };
        for pool in old {
            // Its task drops what is idle, and whatever a make in flight still brings.
            pool.stop.cancel();
            pool.wake.notify_one();
        }
    }

    /// Retires the pools of every template of `space` (the space is deleted).
    pub fn retire_space(self: &Arc<Self>, space: &SpaceId) {
        let names: Vec<String> = self
            .all()
            .iter()
            .filter_map(|p| p.template.as_ref())
            .filter(|t| &t.space_id == space)
            .map(|t| t.name.clone())
            .collect();
        for name in names {
            self.set_template(space, &name, None);
        }
    }

    /// One task per pool, owned by `tasks`: keep `min_idle` members ready (within `max_total`), and
    /// replace members whose executor stops answering. Pools added later get theirs at once.
    pub fn spawn(self: &Arc<Self>, tasks: &TaskTracker) {
        let _ = self.tasks.set(tasks.clone());
        for pool in self.all() {
            self.spawn_pool(tasks, &pool);
        }
    }

    fn spawn_pool(self: &Arc<Self>, tasks: &TaskTracker, pool: &Arc<Pool>) {
        let this = Arc::clone(self);
        let pool = Arc::clone(pool);
        tasks.spawn(async move {
            loop {
                let made = this.fill(&pool).await;
                let pause = if made {
                    this.config.health_interval
                } else {
                    RETRY_PAUSE
                };
                tokio::select! {
                    () = pool.stop.cancelled() => break,
                    () = pool.wake.notified() => {}
                    () = tokio::time::sleep(pause) => this.check_members(&pool).await,
                }
            }
            // Retired (not at shutdown: the members of a running runtime's pools are taken over after a
            // restart): its idle members go.
            if !this.shutdown.is_cancelled() {
                let idle: Vec<Member> = pool.idle().drain(..).collect();
                for m in idle {
                    this.drop_member(m.id).await;
                }
            }
        });
    }

    /// Makes members until the pool has its minimum; false when making one failed.
    async fn fill(&self, pool: &Pool) -> bool {
        loop {
            let idle = pool.idle().len();
            let creating = pool.creating.load(Ordering::Relaxed);
            if idle + creating >= pool.config.min_idle
                || idle + creating >= pool.config.max_total
                || pool.stop.is_cancelled()
            {
                return true;
            }
            pool.creating.fetch_add(1, Ordering::Relaxed);
            let made = self.make_member(pool).await;
            pool.creating.fetch_sub(1, Ordering::Relaxed);
            match made {
                // Retired meanwhile (not shut down): this member belongs to no pool any more.
                Ok(member) if pool.stop.is_cancelled() && !self.shutdown.is_cancelled() => {
                    self.drop_member(member.id).await;
                    return true;
                }
                Ok(member) => pool.idle().push_back(member),
                Err(e) => {
                    tracing::warn!(image = %pool.config.image, error = %e.chain(), "could not make a pool member");
                    return false;
                }
            }
        }
    }

    async fn make_member(&self, pool: &Pool) -> Result<Member> {
        let id = SandboxId::new();
        let template = pool.template.as_ref();
        let stored = StoredMember {
            id,
            image: pool.config.image.clone(),
            template: template.map(TemplatePool::key).unwrap_or_default(),
            token: self.store.executor_token(id),
            legacy: false,
        };
        self.store
            .put_member(stored.id, &stored.image, &stored.template)?;
        let spec = BackendSpec {
            id: stored.id,
            space_id: None,
            image: stored.image.clone(),
            limits: template.map_or(self.config.limits.default, |t| t.limits),
            read_only_rootfs: template.map_or(self.config.read_only_rootfs, |t| t.read_only_rootfs),
            token: stored.token.clone(),
            data_mounts: template.map_or_else(
                || self.config.mounts_for_every_space(),
                |t| self.config.mounts_for(t.space_id.as_str()),
            ),
            // A kernel started ahead makes the first cell of a claimed sandbox as quick as the next ones;
            // the executor gives it the sandbox's env before that cell.
            // The gateway's CA too: a claimed member may be given rules later.
            executor_env: pool
                .config
                .kernel
                .then(|| "MENTIS_KERNEL_EAGER=1".to_owned())
                .into_iter()
                .chain(self.egress.sandbox_env())
                .collect(),
            egress: false,
            gateway: false,
            runtime_class: template
                .map(|t| t.runtime_class.clone())
                .filter(|c| !c.is_empty()),
        };
        let made = async {
            let endpoint = self.backend.create(&spec).await?;
            let client = ready_new_executor(
                self.backend.as_ref(),
                &self.config,
                stored.id,
                &endpoint,
                &stored.token,
                self.config.ready_timeout,
            )
            .await?;
            if let Some(t) = template
                && !t.setup.is_empty()
            {
                super::setup::run(&client, &t.name, &t.setup, &t.env).await?;
            }
            Ok(client)
        }
        .await;
        match made {
            Ok(client) => {
                tracing::debug!(sandbox_id = %stored.id, image = %stored.image, "pool member ready");
                Ok(Member {
                    id: stored.id,
                    token: stored.token,
                    client,
                })
            }
            Err(e) => {
                self.drop_member(stored.id).await;
                Err(e)
            }
        }
    }

    /// Removes a member's container, volume and row.
    async fn drop_member(&self, id: SandboxId) {
        if let Err(e) = self.backend.delete(id).await {
            tracing::warn!(sandbox_id = %id, error = %e.chain(), "could not remove a pool member");
        }
        if let Err(e) = self.store.delete_member(id) {
            tracing::warn!(sandbox_id = %id, error = %e.chain(), "could not forget a pool member");
        }
    }

    /// Health-checks the idle members; those that do not answer are removed (the next fill replaces them).
    async fn check_members(&self, pool: &Pool) {
        let members: Vec<(SandboxId, ExecutorClient)> = pool
            .idle()
            .iter()
            .map(|m| (m.id, m.client.clone()))
            .collect();
        for (id, client) in members {
            if let Err(e) = client.check(CHECK_TIMEOUT).await {
                let removed = {
                    let mut idle = pool.idle();
                    let before = idle.len();
                    idle.retain(|m| m.id != id);
                    before != idle.len()
                };
                if removed {
                    tracing::warn!(sandbox_id = %id, error = %e.chain(), "pool member unhealthy: replacing it");
                    self.drop_member(id).await;
                    pool.wake.notify_one();
                }
            }
        }
    }

    /// Takes the stored members over after a restart: running ones whose pool still exists become idle
    /// members again; the rest go.
    pub async fn restore_members(
        &self,
        members: Vec<StoredMember>,
        found: &HashMap<SandboxId, BackendState>,
    ) {
        for m in members {
            let pool = if m.template.is_empty() {
                self.pool_for(&m.image)
            } else {
                self.all()
                    .into_iter()
                    .find(|p| p.template.as_ref().is_some_and(|t| t.key() == m.template))
            };
            let running = found.get(&m.id) == Some(&BackendState::Running);
            if m.legacy {
                tracing::info!(sandbox_id = %m.id, image = %m.image, "replacing a pool member made by an earlier version (its token was stored)");
            }
            let kept = match pool {
                Some(pool) if running && !m.legacy && pool.idle().len() < pool.config.max_total => {
                    let reached = reach_executor(
                        self.backend.as_ref(),
                        &self.config,
                        m.id,
                        &m.token,
                        MEMBER_TAKEOVER_READY,
                    );
                    match reached.await {
                        Ok((client, _)) => {
                            pool.idle().push_back(Member {
                                id: m.id,
                                token: m.token.clone(),
                                client,
                            });
                            true
                        }
                        Err(e) => {
                            tracing::warn!(sandbox_id = %m.id, error = %e.chain(), "pool member does not answer");
                            false
                        }
                    }
                }
                _ => false,
            };
            if kept {
                tracing::info!(sandbox_id = %m.id, image = %m.image, "took over a pool member");
            } else {
                self.drop_member(m.id).await;
            }
        }
    }
}

/// The pool `t` asks for, as [`Pools::set_template`] takes it: its members get what a sandbox made from
/// the template with an otherwise empty spec gets in `space` (the template's limits within the space's,
/// the space's root filesystem, the template's image or the runtime's default). None without a pool.
/// INVALID_SPEC when such a sandbox could not be made (limits above the space's maxima, say), pool or not.
pub(super) fn template_pool(
    config: &RuntimeConfig,
    space: &mentis_core::Space,
    t: &Template,
) -> Result<Option<(TemplatePool, String, usize)>> {
    let mut req = mentis_core::SandboxRequest {
        space_id: t.space_id.to_string(),
        template: t.name.clone(),
        ..Default::default()
    };
    t.apply(&mut req);
    let defaulted = space.fill_egress(&mut req);
    let policy = config
        .limits
        .narrowed(&space.limits.sandbox_default, &space.limits.sandbox_max);
    let spec = req.validate(
        &policy,
        &config.expiry,
        &config.default_egress(),
        space
            .limits
            .read_only_rootfs
            .unwrap_or(config.read_only_rootfs),
    )?;
    if t.pool_size == 0 {
        return Ok(None);
    }
    if space.admit_egress(spec.egress.clone(), defaulted, "egress")?
        != mentis_core::egress::Egress::Deny
    {
        // Members have only the executor network (a network is attached when a container is made): a
        // template whose sandboxes reach out has them all made for their request.
        tracing::warn!(space_id = %t.space_id, template = %t.name,
            "a template with egress keeps no pool: its sandboxes are made when asked for");
        return Ok(None);
    }
    let image = spec
        .image
        .clone()
        .unwrap_or_else(|| config.executor_image.clone());
    Ok(Some((
        TemplatePool::of(
            t,
            spec.limits,
            spec.read_only_rootfs,
            mentis_core::runtime_class::resolve(Some(&t.runtime_class), &space.runtime_class),
        ),
        image,
        usize::try_from(t.pool_size).unwrap_or(usize::MAX),
    )))
}
