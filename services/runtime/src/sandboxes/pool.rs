//! Warm pools: containers of an image made ahead, each with a healthy executor, waiting to become a
//! sandbox. A claim binds everything a request may carry — env (applied by the runtime to every action),
//! labels, space and key (in the store), limits (`update_limits`) — so any request for a pooled image is
//! served warm, not only requests that look like the pool.
//!
//! Labels cannot change after creation, so a member's container is labelled as a pool member (empty space)
//! and the store says what it is: a row in `pool` while idle, a sandbox record once claimed, moved in one
//! transaction. Reconciliation after a restart reads the store, not the labels.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mentis_core::{BackendSpec, BackendState, Result, SandboxBackend, SandboxId};
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

/// One pool.
pub struct Pool {
    pub config: PoolConfig,
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
    pub min_idle: usize,
    pub max_total: usize,
    pub idle: usize,
    pub creating: usize,
    pub hits: u64,
    pub misses: u64,
}

impl Pool {
    fn new(config: PoolConfig) -> Arc<Self> {
        Arc::new(Self {
            config,
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
    pools: Vec<Arc<Pool>>,
    config: Arc<RuntimeConfig>,
    backend: Arc<dyn SandboxBackend>,
    store: Arc<Store>,
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
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        Arc::new(Self {
            pools: config.pools.iter().cloned().map(Pool::new).collect(),
            config,
            backend,
            store,
            shutdown,
        })
    }

    /// The pool of `image`, when there is one.
    pub fn pool_for(&self, image: &str) -> Option<Arc<Pool>> {
        self.pools.iter().find(|p| p.config.image == image).cloned()
    }

    /// Every pool's figures.
    pub fn stats(&self) -> Vec<PoolStats> {
        self.pools.iter().map(|p| p.stats()).collect()
    }

    /// One task per pool, owned by `tasks`: keep `min_idle` members ready (within `max_total`), and
    /// replace members whose executor stops answering.
    pub fn spawn(self: &Arc<Self>, tasks: &TaskTracker) {
        for pool in &self.pools {
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
                        () = this.shutdown.cancelled() => return,
                        () = pool.wake.notified() => {}
                        () = tokio::time::sleep(pause) => this.check_members(&pool).await,
                    }
                }
            });
        }
    }

    /// Makes members until the pool has its minimum; false when making one failed.
    async fn fill(&self, pool: &Pool) -> bool {
        loop {
            let idle = pool.idle().len();
            let creating = pool.creating.load(Ordering::Relaxed);
            if idle + creating >= pool.config.min_idle
                || idle + creating >= pool.config.max_total
                || self.shutdown.is_cancelled()
            {
                return true;
            }
            pool.creating.fetch_add(1, Ordering::Relaxed);
            let made = self.make_member(pool).await;
            pool.creating.fetch_sub(1, Ordering::Relaxed);
            match made {
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
        let stored = StoredMember {
            id,
            image: pool.config.image.clone(),
            token: self.store.executor_token(id),
            legacy: false,
        };
        self.store.put_member(stored.id, &stored.image)?;
        let spec = BackendSpec {
            id: stored.id,
            space_id: None,
            image: stored.image.clone(),
            limits: self.config.limits.default,
            read_only_rootfs: self.config.read_only_rootfs,
            token: stored.token.clone(),
            data_mounts: self.config.mounts_for_every_space(),
            // A kernel started ahead makes the first cell of a claimed sandbox as quick as the next ones;
            // the executor gives it the sandbox's env before that cell.
            executor_env: if pool.config.kernel {
                vec!["MENTIS_KERNEL_EAGER=1".to_owned()]
            } else {
                Vec::new()
            },
            egress: false,
        };
        let made = async {
            let endpoint = self.backend.create(&spec).await?;
            ready_new_executor(
                self.backend.as_ref(),
                &self.config,
                stored.id,
                &endpoint,
                &stored.token,
                self.config.ready_timeout,
            )
            .await
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
            let pool = self.pool_for(&m.image);
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
