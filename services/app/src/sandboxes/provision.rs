//! Provisioning: bringing a sandbox up (cold, or by claiming a warm pool member and binding the request to
//! it) and taking it down. Each runs in a task owned by the runtime, so a client that hangs up half-way
//! never leaves a half-made container, nor an action without its terminal observation.

use std::collections::BTreeMap;
use std::sync::Arc;

use mentis_core::egress::{Egress, EgressMode};

use super::egress::EgressGateway;
use mentis_core::{
    BackendSpec, Cause, Ending, Error, Reason, Resource, Result, Sandbox, SandboxBackend,
    SandboxId, SandboxRequest, SandboxState,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::handle::SandboxHandle;
use super::health;
use super::keep::Keeper;
use super::lifecycle::Lifecycle;
use super::pool::{Member, Pool, Pools};
use super::reach::ready_new_executor;
use super::registry::{Admission, Recording, Registry};
use super::spaces::Spaces;
use crate::auth::Caller;
use crate::config::RuntimeConfig;
use crate::executor_client::ExecutorClient;
use crate::images::Owners;
use crate::observations::ObservationLog;
use crate::store::Store;

/// Brings sandboxes up and takes them down.
pub struct Provisioner {
    pub(super) config: Arc<RuntimeConfig>,
    /// Who may use which image.
    owners: Arc<Owners>,
    pub(super) backend: Arc<dyn SandboxBackend>,
    store: Arc<Store>,
    registry: Arc<Registry>,
    spaces: Arc<Spaces>,
    pools: Arc<Pools>,
    lifecycle: Arc<Lifecycle>,
    keeper: Arc<Keeper>,
    /// The egress gateway, started by the first sandbox with EGRESS_RULES.
    egress: Arc<EgressGateway>,
    /// Owns every create and delete in flight.
    pub(super) tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl std::fmt::Debug for Provisioner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provisioner").finish_non_exhaustive()
    }
}

impl Provisioner {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        config: Arc<RuntimeConfig>,
        owners: Arc<Owners>,
        backend: Arc<dyn SandboxBackend>,
        store: Arc<Store>,
        registry: Arc<Registry>,
        spaces: Arc<Spaces>,
        pools: Arc<Pools>,
        lifecycle: Arc<Lifecycle>,
        keeper: Arc<Keeper>,
        egress: Arc<EgressGateway>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            egress,
            config,
            owners,
            backend,
            store,
            registry,
            spaces,
            pools,
            lifecycle,
            keeper,
            tasks,
            shutdown,
        }
    }

    /// Creates a sandbox and returns it RUNNING (or the live one that already carries the request's key),
    /// of an image `caller` may use in its space (the spec's, the template's or the runtime's default).
    pub async fn create(self: &Arc<Self>, req: SandboxRequest, caller: &Caller) -> Result<Sandbox> {
        if self.shutdown.is_cancelled() {
            return Err(Error::new(
                Reason::ShuttingDown,
                "the runtime is shutting down",
            ));
        }
        // A template fills what the request leaves unset.
        let mut req = req;
        let template = if req.template.is_empty() {
            None
        } else {
            let space_id = req.space()?;
            let t = self
                .store
                .template(&space_id, &req.template)?
                .ok_or_else(|| {
                    Error::new(
                        Reason::NotFound,
                        format!(
                            "space {space_id} has no template {}",
                            mentis_core::quoted(&req.template)
                        ),
                    )
                    .about(Resource::template(&space_id, &req.template))
                    .at("spec.template")
                })?;
            t.apply(&mut req);
            Some(t)
        };
        // The space narrows the runtime's limits and may set the root filesystem's default.
        let space = self.spaces.admitting(&req.space()?)?;
        let policy = self
            .config
            .limits
            .narrowed(&space.limits.sandbox_default, &space.limits.sandbox_max);
        let defaulted = space.fill_egress(&mut req);
        let mut spec = req.validate(
            &policy,
            &self.config.expiry,
            &self.config.default_egress(),
            space
                .limits
                .read_only_rootfs
                .unwrap_or(self.config.read_only_rootfs),
        )?;
        spec.egress = space.admit_egress(spec.egress, defaulted, "spec.egress")?;
        if spec.egress.mode() == EgressMode::Rules {
            super::egress::check_secrets(
                &self.store,
                &spec.space_id,
                &spec.egress,
                "spec.egress_rules",
            )?;
            // Its only way out: the gateway must run (FAILED_PRECONDITION where the backend has none).
            self.egress.ensure().await?;
        }
        let image = spec
            .image
            .clone()
            .unwrap_or_else(|| self.config.executor_image.clone());
        let runtime_class = mentis_core::runtime_class::resolve(
            template.as_ref().map(|t| t.runtime_class.as_str()),
            &space.runtime_class,
        )
        .to_owned();
        let class = Some(runtime_class.as_str()).filter(|c| !c.is_empty());
        self.owners
            .check_use(caller, &spec.space_id, &image)
            .await?;
        // A pool member fits any request for its image, unless the space has data mounts of its own (those
        // are bound at container creation). Members have no egress network either (networks are attached
        // at creation here), their ulimits, disk and root filesystem are the runtime's defaults (`docker
        // update` changes none of them: a workspace's filesystem has its size for good), and they keep the
        // default limits where the backend cannot change those either.
        // A template's own pool first: its members were made as the template's sandboxes are, and ran its
        // start-up commands already; they fit when the spec kept what cannot change.
        let template_pool = template
            .as_ref()
            .and_then(|t| self.pools.pool_for_template(&t.space_id, &t.name))
            .filter(|p| {
                p.template.as_ref().is_some_and(|made| {
                    p.config.image == image
                        && spec.egress == Egress::Deny
                        && spec.limits.nofile == made.limits.nofile
                        && spec.limits.disk_mb == made.limits.disk_mb
                        && spec.read_only_rootfs == made.read_only_rootfs
                        && runtime_class == made.runtime_class
                        && self
                            .backend
                            .changes_limits(&made.limits, &spec.limits, class)
                })
            });
        let pool = template_pool.or_else(|| {
            self.pools.pool_for(&image).filter(|_| {
                // An image's pool runs under the runtime's default class.
                class.is_none()
                    && spec.egress == Egress::Deny
                    && spec.limits.nofile == self.config.limits.default.nofile
                    && spec.limits.disk_mb == self.config.limits.default.disk_mb
                    && spec.read_only_rootfs == self.config.read_only_rootfs
                    && self.config.mounts_for(spec.space_id.as_str())
                        == self.config.mounts_for_every_space()
                    && self
                        .backend
                        .changes_limits(&self.config.limits.default, &spec.limits, None)
            })
        });
        let member = pool.as_ref().and_then(|p| p.take());
        let (id, token) = match &member {
            Some(m) => (m.id, m.token.clone()),
            None => {
                let id = SandboxId::new();
                (id, self.store.executor_token(id))
            }
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
            egress: spec.egress.clone(),
            read_only_rootfs: spec.read_only_rootfs,
            template: template
                .as_ref()
                .map(|t| t.name.clone())
                .unwrap_or_default(),
            work_dir: template
                .as_ref()
                .map(|t| t.work_dir.clone())
                .unwrap_or_default(),
            runtime_class,
        };
        let setup = template.filter(|t| !t.setup.is_empty()).map(|t| Setup {
            template: t.name,
            commands: t.setup,
            env: spec.env.clone(),
        });
        let handle = Arc::new(SandboxHandle::new(
            record.clone(),
            spec.env.clone(),
            if self.config.log_journal {
                ObservationLog::durable(
                    id,
                    self.config.log_limits.clone(),
                    &self.config.log_dir(id),
                )
            } else {
                ObservationLog::new(id, self.config.log_limits.clone())
            },
            token,
            Arc::clone(&self.store),
        ));
        // Held until the sandbox is up or failed: a delete that finds it CREATING waits for that.
        let creating = Arc::clone(&handle.lifecycle)
            .try_lock_owned()
            .map_err(|_| Error::internal("a new sandbox's lifecycle lock was taken"))?;
        // A member of the template's pool ran its start-up commands when it was made.
        let setup = setup
            .filter(|_| member.is_none() || pool.as_ref().is_none_or(|p| p.template.is_none()));
        let claim = member.zip(pool);
        let recording = if claim.is_some() {
            Recording::Claim
        } else {
            Recording::New
        };
        let space_id = record.space_id.clone();
        let admitted = self.registry.admit(
            &handle,
            || self.spaces.admitting(&space_id),
            &spec.env,
            recording,
        );
        let started = std::time::Instant::now();
        match (admitted, claim) {
            (Ok(Admission::Admitted), Some((member, pool))) => {
                let this = Arc::clone(self);
                let span = tracing::info_span!("claim_sandbox", sandbox_id = %id);
                let created = self
                    .tasks
                    .spawn(
                        async move {
                            let _creating = creating;
                            this.bind(handle, member, &pool, setup).await
                        }
                        .instrument(span),
                    )
                    .await
                    .map_err(|e| Error::internal("claim task failed").with_source(e))?;
                record_create("warm", started, &created);
                created
            }
            (Ok(Admission::Admitted), None) => {
                let mut backend_spec = handle.backend_spec(&self.config);
                backend_spec.executor_env.extend(self.egress.sandbox_env());
                let this = Arc::clone(self);
                let span = tracing::info_span!("create_sandbox", sandbox_id = %id);
                let created = self
                    .tasks
                    .spawn(
                        async move {
                            let _creating = creating;
                            this.bring_up(handle, backend_spec, setup).await
                        }
                        .instrument(span),
                    )
                    .await
                    .map_err(|e| Error::internal("create task failed").with_source(e))?;
                record_create("cold", started, &created);
                created
            }
            (refused, claim) => {
                // Not claimed after all: the member goes back to its pool.
                if let Some((member, pool)) = claim {
                    pool.put_back(member);
                }
                match refused? {
                    Admission::Existing(existing) => Ok(*existing),
                    Admission::Admitted => Err(Error::internal("admission had no outcome")),
                }
            }
        }
    }

    /// Makes a claimed pool member the sandbox of `h`: its limits are set, its executor is the sandbox's.
    async fn bind(
        &self,
        h: Arc<SandboxHandle>,
        member: Member,
        pool: &Pool,
        setup: Option<Setup>,
    ) -> Result<Sandbox> {
        let record = h.snapshot();
        let made_with = pool
            .template
            .as_ref()
            .map_or(self.config.limits.default, |t| t.limits);
        let bound = if record.limits == made_with {
            Ok(())
        } else {
            self.backend.update_limits(h.id, record.limits).await
        };
        let bound = match (bound, &setup) {
            (Ok(()), Some(setup)) => tokio::select! {
                ran = setup.run(&member.client) => ran,
                () = h.cancel.cancelled() => Err(deleted_while_created()),
            },
            (bound, _) => bound,
        };
        match bound {
            Ok(()) => {
                h.set_executor(member.client);
                self.running(&h)?;
                tracing::info!("sandbox running (warm pool)");
                Ok(h.snapshot())
            }
            Err(e) => {
                tracing::warn!(error = %e.chain(), "could not bind a pool member");
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
        health::spawn(h, &self.backend, &self.config, &self.tasks);
        Ok(())
    }

    async fn bring_up(
        &self,
        h: Arc<SandboxHandle>,
        spec: BackendSpec,
        setup: Option<Setup>,
    ) -> Result<Sandbox> {
        let started = tokio::time::Instant::now();
        let result = async {
            let endpoint = self.backend.create(&spec).await?;
            let ready = ready_new_executor(
                self.backend.as_ref(),
                &self.config,
                spec.id,
                &endpoint,
                &spec.token,
                self.config.ready_timeout,
            )
            .instrument(tracing::info_span!("executor_ready"));
            let ready = async {
                let client = ready.await?;
                match &setup {
                    Some(setup) => setup.run(&client).await.map(|()| client),
                    None => Ok(client),
                }
            };
            // A delete of the sandbox while it comes up (a start-up command that hangs, say) ends this at
            // once instead of waiting for the create's deadline.
            let ready = tokio::select! {
                ready = ready => ready,
                () = h.cancel.cancelled() => Err(deleted_while_created()),
            };
            match ready {
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
                tracing::warn!(error = %e.chain(), "sandbox failed to start");
                h.enter(SandboxState::Failed, &e.to_string())?;
                self.registry.forget_old_ended();
                Err(e)
            }
        }
    }

    /// Deletes a sandbox, recording why (deleted by a client, expired, ...): TERMINATING, its running
    /// actions end LOST, its container and volume go, TERMINATED. Idempotent: false when there was no
    /// sandbox to delete (none with this id, or it had ended).
    pub async fn delete(
        self: &Arc<Self>,
        id: SandboxId,
        reason: &'static str,
        cause: Option<Cause>,
    ) -> Result<bool> {
        let handle = self.registry.find(id);
        let this = Arc::clone(self);
        let span = tracing::info_span!("delete_sandbox", sandbox_id = %id);
        self.tasks
            .spawn(
                async move {
                    let Some(h) = handle else {
                        // Unknown here, but a container may be left from an earlier run: make sure.
                        return this.backend.delete(id).await.map(|()| false);
                    };
                    // A sandbox being created is told to give up (its create fails and removes what it
                    // made); one being paused or resumed is deleted once that is done.
                    if h.state() == SandboxState::Creating {
                        h.cancel.cancel();
                    }
                    let _lifecycle = h.lifecycle.lock().await;
                    match h.state() {
                        s if s.is_final() => return Ok(false),
                        // An earlier delete got this far and failed to remove the container: retry that.
                        SandboxState::Terminating => {}
                        _ => {
                            if let Some(cause) = cause {
                                this.keep(&h, cause).await?;
                            }
                            h.enter(SandboxState::Terminating, reason)?;
                        }
                    }
                    h.stop_tasks();
                    h.tasks_stopped().await;
                    // The executor's last spans, before it goes (the health watch relays the others).
                    if let (Some(relay), Some(client)) = (crate::telemetry::relay(), h.executor()) {
                        relay.relay(&client, id).await;
                    }
                    this.backend.delete(id).await?;
                    // Deleted while paused by snapshot: the snapshot that held its workspace goes too.
                    if !this.backend.pauses_in_place()
                        && let Ok(Some(snapshot)) = this.keeper.suspended(&h)
                    {
                        this.keeper.forget(&snapshot).await;
                    }
                    h.enter(SandboxState::Terminated, reason)?;
                    this.registry.forget_old_ended();
                    tracing::info!(reason, "sandbox deleted");
                    Ok(true)
                }
                .instrument(span),
            )
            .await
            .map_err(|e| Error::internal("delete task failed").with_source(e))?
    }
}

impl Provisioner {
    /// The snapshot the space of `h` asks for before a delete, taken while `h`'s lifecycle lock is held:
    /// a PAUSED sandbox is resumed for it. A failed snapshot of a RUNNING sandbox stops the delete (its
    /// workspace is still there for the next try); a sandbox that cannot be reached (UNHEALTHY, CREATING,
    /// or not resumed) goes without one.
    async fn keep(&self, h: &SandboxHandle, cause: Cause) -> Result<()> {
        let ending = Ending::Delete(cause);
        if self.keeper.wants(h, ending).is_none() {
            return Ok(());
        }
        if h.state() == SandboxState::Paused
            && let Err(e) = self.lifecycle.resume_locked(h).await
        {
            tracing::warn!(sandbox_id = %h.id, error = %e.chain(), "deleted without the snapshot its space asks for: it could not be resumed");
            return Ok(());
        }
        match h.state() {
            SandboxState::Running => self.keeper.before(h, ending).await,
            other => {
                tracing::warn!(sandbox_id = %h.id, state = %other, "deleted without the snapshot its space asks for: it cannot be reached");
                Ok(())
            }
        }
    }
}

/// Counts a create by `path` (warm: a pool member; cold: a new container) and outcome, and its duration.
fn record_create(path: &'static str, started: std::time::Instant, created: &Result<Sandbox>) {
    use crate::metrics::{kv, metrics};
    let outcome = if created.is_ok() { "ok" } else { "error" };
    metrics()
        .creates
        .add(1, &[kv("path", path), kv("outcome", outcome)]);
    if created.is_ok() {
        metrics()
            .create_duration
            .record(started.elapsed().as_secs_f64(), &[kv("path", path)]);
    }
}

/// A template's start-up commands for a new sandbox (see `setup`).
struct Setup {
    template: String,
    commands: Vec<String>,
    env: BTreeMap<String, String>,
}

impl Setup {
    async fn run(&self, client: &ExecutorClient) -> Result<()> {
        super::setup::run(client, &self.template, &self.commands, &self.env)
            .instrument(tracing::info_span!("template_setup", template = %self.template))
            .await
    }
}

/// Why a create ends when its sandbox is deleted before it is up.
fn deleted_while_created() -> Error {
    Error::new(
        Reason::SandboxEnded,
        "the sandbox was deleted while it was being created",
    )
}
