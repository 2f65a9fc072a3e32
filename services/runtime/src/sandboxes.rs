//! The sandbox manager: the registry of sandboxes and the operations on them (create, get, list, delete,
//! submit, cancel). Long operations run in tasks owned by the manager, so a client that hangs up half-way
//! never leaves a half-created container or an action without its terminal observation.

mod handle;
mod health;
mod lifecycle;
mod pool;
mod pump;
mod restore;
mod spaces;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use mentis_core::{
    Action, ActionId, BackendSpec, Error, Result, Sandbox, SandboxBackend, SandboxId,
    SandboxRequest, SandboxState, Space, SpaceId,
};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

pub use handle::{ActionStatus, Reserved, SandboxHandle};
pub use pool::{Pool, PoolStats};

use crate::config::RuntimeConfig;
use crate::executor_client::ExecutorClient;
use crate::observations::ObservationLog;
use crate::store::Store;

/// Ended sandboxes kept for Get and log replay before the oldest are forgotten.
const KEPT_ENDED: usize = 256;
/// How often changed records are written to the store.
const FLUSH_EVERY: Duration = Duration::from_secs(1);
/// How long a delete waits for the action pumps to write their terminal observations.
const PUMP_DRAIN: Duration = Duration::from_secs(10);

/// An accepted submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    pub id: ActionId,
    /// The action's observations have seqs above this.
    pub after_seq: u64,
    /// A retry of an earlier submission: nothing was run this time.
    pub resumed: bool,
}

/// Filter and page of a listing.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub space_id: Option<String>,
    /// Only sandboxes of these spaces (the caller's); `None` = any space.
    pub allowed: Option<std::collections::BTreeSet<SpaceId>>,
    pub labels: Vec<(String, String)>,
    /// Any of these states; empty = any state.
    pub states: Vec<SandboxState>,
    pub page_size: usize,
    /// Id of the last sandbox of the previous page.
    pub after: Option<SandboxId>,
}

/// Owner of every sandbox of this runtime.
pub struct Manager {
    config: Arc<RuntimeConfig>,
    backend: Arc<dyn SandboxBackend>,
    store: Arc<Store>,
    sandboxes: RwLock<HashMap<SandboxId, Arc<SandboxHandle>>>,
    spaces: RwLock<BTreeMap<String, Space>>,
    pools: Vec<Arc<Pool>>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager").finish_non_exhaustive()
    }
}

/// A client of the executor at `endpoint`, once it answers its health check (within `within`).
async fn ready_executor(
    config: &RuntimeConfig,
    endpoint: &mentis_core::Endpoint,
    token: &str,
    within: Duration,
) -> Result<ExecutorClient> {
    let client = ExecutorClient::new(
        endpoint,
        token,
        config.executor_call_timeout,
        config.executor_keepalive,
    )?;
    client.wait_ready(within).await?;
    Ok(client)
}

/// The executor of an existing sandbox (its container started again when it stopped), once it answers:
/// for recovery, resume and takeover after a restart.
async fn reach_executor(
    backend: &dyn SandboxBackend,
    config: &RuntimeConfig,
    id: SandboxId,
    token: &str,
    within: Duration,
) -> Result<(ExecutorClient, mentis_core::Endpoint)> {
    let endpoint = backend.ensure_running(id).await?;
    let client = ready_executor(config, &endpoint, token, within).await?;
    Ok((client, endpoint))
}

fn random_token() -> String {
    use rand::RngCore;
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl Manager {
    pub fn new(
        config: Arc<RuntimeConfig>,
        backend: Arc<dyn SandboxBackend>,
        store: Arc<Store>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let pools = config.pools.iter().cloned().map(Pool::new).collect();
        Arc::new(Self {
            config,
            backend,
            store,
            sandboxes: RwLock::new(HashMap::new()),
            spaces: RwLock::new(BTreeMap::new()),
            pools,
            tasks: TaskTracker::new(),
            shutdown,
        })
    }

    /// The runtime's configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<SandboxId, Arc<SandboxHandle>>> {
        self.sandboxes.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<SandboxId, Arc<SandboxHandle>>> {
        self.sandboxes.write().unwrap_or_else(|p| p.into_inner())
    }

    /// The handle of a sandbox; NotFound when unknown.
    pub fn handle(&self, id: SandboxId) -> Result<Arc<SandboxHandle>> {
        self.read()
            .get(&id)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("sandbox {id} not found")))
    }

    /// Creates a sandbox and returns it RUNNING. Runs in a task of its own: the work finishes (or is
    /// cleaned up) even when the caller goes away.
    pub async fn create(self: &Arc<Self>, req: SandboxRequest) -> Result<Sandbox> {
        if self.shutdown.is_cancelled() {
            return Err(Error::Unavailable("the runtime is shutting down".into()));
        }
        // The space narrows the runtime's limits and may set the root filesystem's default.
        let space = self.space_record(&SpaceId::parse_or_default(&req.space_id)?)?;
        let policy = self
            .config
            .limits
            .narrowed(&space.limits.sandbox_default, &space.limits.sandbox_max);
        let spec = req.validate(
            &policy,
            &self.config.expiry,
            self.config.egress_default,
            space
                .limits
                .read_only_rootfs
                .unwrap_or(self.config.read_only_rootfs),
        )?;
        let image = spec
            .image
            .clone()
            .unwrap_or_else(|| self.config.executor_image.clone());
        // A pool member fits any request for its image, unless the space has data mounts of its own (those
        // are bound at container creation).
        // Members have no egress network either (networks are attached at creation here), their ulimits
        // and root filesystem are the runtime's defaults (`docker update` changes neither), and they keep
        // the default limits where the backend cannot change those either.
        let pool = self.pool_for(&image).filter(|_| {
            !spec.egress
                && spec.limits.nofile == self.config.limits.default.nofile
                && spec.read_only_rootfs == self.config.read_only_rootfs
                && self.config.mounts_for(spec.space_id.as_str())
                    == self.config.mounts_for_every_space()
                && (self.backend.updates_limits() || spec.limits == self.config.limits.default)
        });
        let member = pool.as_ref().and_then(|p| p.take());
        let (id, token) = match &member {
            Some(m) => (m.id, m.token.clone()),
            None => (SandboxId::new(), random_token()),
        };
        let now = crate::clock::now();
        let record = Sandbox {
            id,
            space_id: spec.space_id.clone(),
            state: SandboxState::Creating,
            image,
            labels: spec.labels.clone(),
            limits: spec.limits,
            created_at: now,
            updated_at: now,
            state_reason: String::new(),
            external_key: spec.external_key.clone(),
            expiry: spec.expiry,
            last_activity: now,
            egress: spec.egress,
            read_only_rootfs: spec.read_only_rootfs,
        };
        let handle = Arc::new(SandboxHandle::new(
            record.clone(),
            spec.env.clone(),
            ObservationLog::new(id, self.config.log_limits),
            token,
            Arc::clone(&self.store),
        ));
        // Held until the sandbox is up or failed: a delete that finds it CREATING waits for that.
        let creating = Arc::clone(&handle.lifecycle)
            .try_lock_owned()
            .map_err(|_| Error::Internal("a new sandbox's lifecycle lock was taken".into()))?;
        let claim = member.zip(pool);
        let admitted = self.admit(&handle, &record, &spec.env, claim.is_some());
        match (admitted, claim) {
            (Ok(None), Some((member, pool))) => {
                let this = Arc::clone(self);
                let span = tracing::info_span!("claim_sandbox", sandbox_id = %id);
                return self
                    .tasks
                    .spawn(
                        async move {
                            let _creating = creating;
                            this.bind(handle, member, &pool).await
                        }
                        .instrument(span),
                    )
                    .await
                    .map_err(|e| Error::Internal(format!("claim task failed: {e}")))?;
            }
            (Ok(None), None) => {}
            (refused, claim) => {
                // Not claimed after all: the member goes back to its pool.
                if let Some((member, pool)) = claim {
                    pool.put_back(member);
                }
                // An existing sandbox with the request's key, or why the request was refused.
                return refused.and_then(|existing| {
                    existing.ok_or_else(|| Error::Internal("admission had no outcome".into()))
                });
            }
        }
        let backend_spec = BackendSpec {
            id,
            space_id: Some(record.space_id.clone()),
            image: record.image.clone(),
            limits: record.limits,
            token: handle.token.clone(),
            data_mounts: self.config.mounts_for(record.space_id.as_str()),
            executor_env: Vec::new(),
            egress: record.egress,
            read_only_rootfs: record.read_only_rootfs,
        };
        let this = Arc::clone(self);
        let span = tracing::info_span!("create_sandbox", sandbox_id = %id);
        let task = self.tasks.spawn(
            async move {
                let _creating = creating;
                this.bring_up(handle, backend_spec).await
            }
            .instrument(span),
        );
        task.await
            .map_err(|e| Error::Internal(format!("create task failed: {e}")))?
    }

    /// Checks the space, the key and the limits, records the sandbox and registers its handle, all under
    /// the registry's lock. `Some` = a live sandbox already carries the request's key: that is the answer.
    fn admit(
        &self,
        handle: &Arc<SandboxHandle>,
        record: &Sandbox,
        env: &BTreeMap<String, String>,
        claimed: bool,
    ) -> Result<Option<Sandbox>> {
        let id = record.id;
        {
            let mut map = self.write();
            let space = self.space_record(&record.space_id)?;
            // Get-or-create: a live sandbox with this key in this space is the answer.
            if let Some(key) = &record.external_key
                && let Some(existing) = map
                    .values()
                    .find(|h| h.is_live_with_key(&record.space_id, key))
            {
                return Ok(Some(existing.snapshot()));
            }
            let live = map.values().filter(|h| !h.state().is_final()).count();
            if live >= self.config.max_sandboxes {
                return Err(Error::ResourceExhausted(format!(
                    "this runtime already holds {live} sandboxes (MENTIS_MAX_SANDBOXES)"
                )));
            }
            let in_space = map
                .values()
                .filter(|h| h.is_live_in(&record.space_id))
                .count();
            let max = space.limits.max_sandboxes as usize;
            if max > 0 && in_space >= max {
                return Err(Error::ResourceExhausted(format!(
                    "space {} already holds {in_space} sandboxes, its limit",
                    record.space_id
                )));
            }
            if claimed {
                self.store.claim(record, env, &handle.token)?;
            } else {
                self.store.put_sandbox(record, env, &handle.token, 0)?;
            }
            map.insert(id, Arc::clone(handle));
        }
        Ok(None)
    }

    /// Makes a claimed pool member the sandbox of `h`: its limits are set, its executor is the sandbox's.
    async fn bind(
        &self,
        h: Arc<SandboxHandle>,
        member: pool::Member,
        pool: &Pool,
    ) -> Result<Sandbox> {
        let record = h.snapshot();
        let bound = if record.limits == self.config.limits.default {
            Ok(())
        } else {
            self.backend.update_limits(h.id, record.limits).await
        };
        match bound {
            Ok(()) => {
                h.set_executor(member.client);
                self.running(&h)?;
                tracing::info!("sandbox running (warm pool)");
                Ok(h.snapshot())
            }
            Err(e) => {
                tracing::warn!(error = %e, "could not bind a pool member");
                let _ = self.backend.delete(h.id).await;
                h.enter(SandboxState::Failed, &e.to_string())?;
                pool.put_back_failed();
                Err(e)
            }
        }
    }

    /// A new sandbox whose executor answers: RUNNING, its health watched.
    fn running(&self, h: &Arc<SandboxHandle>) -> Result<()> {
        h.enter(SandboxState::Running, "")?;
        self.watch_health(h);
        Ok(())
    }

    async fn bring_up(&self, h: Arc<SandboxHandle>, spec: BackendSpec) -> Result<Sandbox> {
        let started = tokio::time::Instant::now();
        let result = async {
            let endpoint = self.backend.create(&spec).await?;
            let ready = ready_executor(
                &self.config,
                &endpoint,
                &spec.token,
                self.config.ready_timeout,
            );
            match ready.await {
                Ok(client) => Ok(client),
                Err(e) => {
                    let _ = self.backend.delete(spec.id).await;
                    Err(e)
                }
            }
        }
        .await;
        match result {
            Ok(client) => {
                h.set_executor(client);
                self.running(&h)?;
                tracing::info!(
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "sandbox running"
                );
                Ok(h.snapshot())
            }
            Err(e) => {
                tracing::warn!(error = %e, "sandbox failed to start");
                h.enter(SandboxState::Failed, &e.to_string())?;
                self.forget_old_ended();
                Err(e)
            }
        }
    }

    /// The space of a sandbox.
    pub fn space_of(&self, id: SandboxId) -> Result<SpaceId> {
        Ok(self.handle(id)?.space_id())
    }

    /// A sandbox's record and the seq of its newest observation.
    pub fn get(&self, id: SandboxId) -> Result<(Sandbox, u64)> {
        let h = self.handle(id)?;
        Ok((h.snapshot(), h.log.last_seq()))
    }

    /// One page of sandboxes, oldest first, and whether more follow.
    pub fn list(&self, q: &ListQuery) -> (Vec<(Sandbox, u64)>, bool) {
        let mut all: Vec<(Sandbox, u64)> = self
            .read()
            .values()
            .map(|h| (h.snapshot(), h.log.last_seq()))
            .filter(|(s, _)| {
                q.space_id
                    .as_deref()
                    .is_none_or(|sp| s.space_id.as_str() == sp)
            })
            .filter(|(s, _)| q.allowed.as_ref().is_none_or(|a| a.contains(&s.space_id)))
            .filter(|(s, _)| q.labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .filter(|(s, _)| q.states.is_empty() || q.states.contains(&s.state))
            .collect();
        all.sort_by(|(a, _), (b, _)| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        let start = match q.after {
            Some(after) => match all.iter().position(|(s, _)| s.id == after) {
                Some(i) => i + 1,
                None => {
                    // The cursor's sandbox is gone: resume after where it would sort.
                    all.iter()
                        .position(|(s, _)| s.id > after)
                        .unwrap_or(all.len())
                }
            },
            None => 0,
        };
        let mut page: Vec<_> = all.into_iter().skip(start).collect();
        let more = page.len() > q.page_size;
        page.truncate(q.page_size);
        (page, more)
    }

    /// Deletes a sandbox: its running actions end LOST, its container and volume go. Idempotent.
    pub async fn delete(self: &Arc<Self>, id: SandboxId) -> Result<()> {
        self.delete_with_reason(id, "deleted").await
    }

    /// [`Manager::delete`], recording why (deleted by a client, expired, ...).
    pub(crate) async fn delete_with_reason(
        self: &Arc<Self>,
        id: SandboxId,
        reason: &'static str,
    ) -> Result<()> {
        let handle = self.read().get(&id).cloned();
        let this = Arc::clone(self);
        let span = tracing::info_span!("delete_sandbox", sandbox_id = %id);
        self.tasks
            .spawn(
                async move {
                    let Some(h) = handle else {
                        // Unknown here, but a container may be left from an earlier run: make sure.
                        return this.backend.delete(id).await;
                    };
                    // A sandbox being created, paused or resumed is deleted once that is done.
                    let _lifecycle = h.lifecycle.lock().await;
                    if h.state().is_final() {
                        return Ok(());
                    }
                    h.enter(SandboxState::Terminating, reason)?;
                    h.cancel.cancel();
                    h.tasks.close();
                    if tokio::time::timeout(PUMP_DRAIN, h.tasks.wait())
                        .await
                        .is_err()
                    {
                        tracing::warn!("action pumps did not finish in time");
                    }
                    this.backend.delete(id).await?;
                    h.enter(SandboxState::Terminated, reason)?;
                    this.forget_old_ended();
                    tracing::info!(reason, "sandbox deleted");
                    Ok(())
                }
                .instrument(span),
            )
            .await
            .map_err(|e| Error::Internal(format!("delete task failed: {e}")))?
    }

    /// Forgets ended sandboxes (and their logs) once they have been ended for the retention time, and the
    /// oldest ones beyond a count bound.
    fn forget_old_ended(&self) {
        let mut map = self.write();
        let mut ended: Vec<(SystemTime, SandboxId)> = map
            .values()
            .map(|h| h.snapshot())
            .filter(|s| s.state.is_final())
            .map(|s| (s.updated_at, s.id))
            .collect();
        ended.sort();
        let now = crate::clock::now();
        let expired = ended
            .iter()
            .filter(|(t, _)| {
                now.duration_since(*t).unwrap_or_default() > self.config.ended_retention
            })
            .count();
        let excess = ended.len().saturating_sub(KEPT_ENDED);
        for (_, id) in ended.iter().take(expired.max(excess)) {
            map.remove(id);
            if let Err(e) = self.store.delete_sandbox(*id) {
                tracing::warn!(sandbox_id = %id, error = %e, "could not forget a sandbox in the store");
            }
        }
    }

    /// Until shutdown: flushes changed records to the store every second, and runs `forget_old_ended` now
    /// and then.
    fn spawn_sweeper(self: &Arc<Self>) {
        let this = Arc::clone(self);
        let every = (self.config.ended_retention / 10)
            .clamp(Duration::from_secs(1), Duration::from_secs(60));
        self.tasks.spawn(async move {
            let mut last_forget = tokio::time::Instant::now();
            loop {
                tokio::select! {
                    () = this.shutdown.cancelled() => return,
                    () = tokio::time::sleep(FLUSH_EVERY) => {}
                }
                this.flush();
                if last_forget.elapsed() >= every {
                    this.forget_old_ended();
                    last_forget = tokio::time::Instant::now();
                }
            }
        });
    }

    /// The live sandbox carrying `key` in `space`.
    pub fn get_by_key(&self, space: &SpaceId, key: &str) -> Result<(Sandbox, u64)> {
        mentis_core::sandbox::validate_external_key(key)?;
        self.read()
            .values()
            .find(|h| h.is_live_with_key(space, key))
            .map(|h| (h.snapshot(), h.log.last_seq()))
            .ok_or_else(|| {
                Error::NotFound(format!("no live sandbox with key {key:?} in space {space}"))
            })
    }

    /// Accepts an action: the executor has it and its observations will follow in the log. A retry of an
    /// accepted submission (same client-chosen id, same action) is not run again. Returns the action's id,
    /// the seq after which its observations appear, and whether it was such a retry.
    pub async fn submit(
        &self,
        sandbox: SandboxId,
        action_id: Option<ActionId>,
        action: Action,
    ) -> Result<Submitted> {
        let h = self.handle(sandbox)?;
        self.auto_resume(&h).await?;
        let id = action_id.unwrap_or_else(ActionId::generate);
        // Admitted only while RUNNING, under the lock a pause takes to leave RUNNING; a retry of a known
        // submission is answered from the log in any state.
        let after_seq = match h.reserve_action(
            &id,
            action.fingerprint(),
            self.config.max_actions_per_sandbox,
        )? {
            Reserved::Known { after_seq } => {
                return Ok(Submitted {
                    id,
                    after_seq,
                    resumed: true,
                });
            }
            Reserved::New { after_seq } => after_seq,
        };
        let Some(client) = h.executor() else {
            h.unreserve_action(&id);
            return Err(Error::Internal(format!(
                "sandbox {sandbox} is RUNNING without an executor"
            )));
        };
        h.touch();
        let (tx, rx) = oneshot::channel();
        let span = tracing::info_span!("action", sandbox_id = %sandbox, action_id = %id, kind = action.kind_name());
        h.tasks
            .spawn(pump::pump(Arc::clone(&h), client, id.clone(), action, tx).instrument(span));
        match rx.await {
            Ok(Ok(())) => Ok(Submitted {
                id,
                after_seq,
                resumed: false,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Internal(
                "the action task ended before answering".into(),
            )),
        }
    }

    /// Cancels a running action. A finished action is left as it is (cancel raced with its end).
    pub async fn cancel(&self, sandbox: SandboxId, action: &ActionId) -> Result<()> {
        let h = self.handle(sandbox)?;
        match h.action_status(action) {
            ActionStatus::Unknown => Err(Error::NotFound(format!(
                "action {action} not found in sandbox {sandbox}"
            ))),
            ActionStatus::Finished => Ok(()),
            ActionStatus::Running => match h.running_executor()?.cancel(action).await {
                // It ended between our look and the executor's.
                Err(Error::NotFound(_)) => Ok(()),
                r => r,
            },
        }
    }

    /// Writes to a running action's stdin.
    pub async fn write_stdin(
        &self,
        sandbox: SandboxId,
        action: &ActionId,
        data: Bytes,
        eof: bool,
    ) -> Result<()> {
        let h = self.handle(sandbox)?;
        match h.action_status(action) {
            ActionStatus::Unknown => Err(Error::NotFound(format!(
                "action {action} not found in sandbox {sandbox}"
            ))),
            ActionStatus::Finished => Err(Error::FailedPrecondition(format!(
                "action {action} has ended"
            ))),
            ActionStatus::Running => h.running_executor()?.write_stdin(action, data, eof).await,
        }
    }

    /// Replaces a sandbox's kernel with a fresh one.
    pub async fn reset_kernel(&self, sandbox: SandboxId) -> Result<()> {
        self.handle(sandbox)?
            .running_executor()?
            .reset_kernel()
            .await
    }

    /// Summarises variables of a sandbox's kernel.
    pub async fn inspect_variables(
        &self,
        sandbox: SandboxId,
        names: Vec<String>,
    ) -> Result<Vec<mentis_core::VariableSummary>> {
        mentis_core::kernel::validate_names(&names)?;
        let client = self.handle(sandbox)?.running_executor()?;
        client.inspect_variables(names).await
    }

    /// Stops accepting work, waits for running operations to finish their bookkeeping, and leaves the
    /// store up to date (marked as cleanly shut down, so the next start continues every log's seqs).
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.tasks.wait()).await;
        self.flush();
        if let Err(e) = self.store.set_meta(restore::CLEAN_SHUTDOWN, "1") {
            tracing::warn!(error = %e, "could not mark the store as cleanly shut down");
        }
    }

    /// Writes every changed record (state, last activity, newest seq) to the store.
    fn flush(&self) {
        for h in self.handles() {
            let seq_changed =
                h.log.last_seq() != h.stored_seq.load(std::sync::atomic::Ordering::Relaxed);
            if h.take_dirty() || seq_changed {
                h.persist();
            }
        }
    }

    fn watch_health(&self, h: &Arc<SandboxHandle>) {
        h.tasks.spawn(
            health::watch(
                Arc::clone(h),
                Arc::clone(&self.backend),
                Arc::clone(&self.config),
            )
            .instrument(tracing::info_span!("health", sandbox_id = %h.id)),
        );
    }

    /// The handles of every sandbox, for the reaper and the flusher.
    fn handles(&self) -> Vec<Arc<SandboxHandle>> {
        self.read().values().cloned().collect()
    }

    /// A copy of a space's record; NotFound when unknown.
    fn space_record(&self, id: &SpaceId) -> Result<Space> {
        self.spaces
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(id.as_str())
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("space {id} not found")))
    }
}
