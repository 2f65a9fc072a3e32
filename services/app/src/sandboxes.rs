//! The sandbox manager: a thin façade over the parts of the control plane's core, each in its own module —
//! the registry (admission, get, list, forget), provisioning (bring-up, pool claim and bind, delete), the
//! lifecycle moves (pause, resume), action routing (submit, cancel, stdin, the pump), spaces, pools, the
//! health watch, the reaper and the restore after a restart. Every state change goes through
//! `SandboxHandle::enter` and the table in `mentis_core::lifecycle` (docs/ARCHITECTURE.md, "Sandbox
//! lifecycle").

mod actions;
mod egress;
mod gauges;
mod handle;
mod health;
mod keep;
mod lifecycle;
mod pool;
mod provision;
mod pump;
mod reach;
mod reaper;
mod registry;
mod restore;
mod setup;
mod spaces;
mod terminals;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mentis_core::files::{Chunk, Edit, Edited, FileInfo, FilePage, ListFiles, Unpacked};
use mentis_core::{
    Action, ActionId, Cause, Error, Reason, Resource, Result, Sandbox, SandboxBackend, SandboxId,
    SandboxRequest, Space, SpaceId, SpaceUpdate, Template, TemplateUpdate,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use actions::Submitted;
pub use egress::DenialRecord as EgressDenial;
pub use pool::{Pool, PoolStats};
pub use registry::ListQuery;
pub use spaces::SpaceView;

use crate::auth::Caller;
use crate::config::RuntimeConfig;
use crate::images::{Images, Owners};
use crate::observations::ObservationLog;
use crate::snapshots::Snapshots;
use crate::store::Store;
pub use crate::store::snapshots::{SnapshotFilter, SnapshotRecord};

/// The most templates one space may hold.
pub const MAX_TEMPLATES_PER_SPACE: usize = 100;

/// How often changed records are written to the store.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Owner of every sandbox of this runtime.
pub struct Manager {
    config: Arc<RuntimeConfig>,
    store: Arc<Store>,
    snapshots: Arc<Snapshots>,
    backend: Arc<dyn SandboxBackend>,
    registry: Arc<Registry>,
    spaces: Arc<Spaces>,
    pools: Arc<Pools>,
    provisioner: Arc<Provisioner>,
    lifecycle: Arc<Lifecycle>,
    actions: Actions,
    terminals: Terminals,
    images: Images,
    /// The keys: a deleted space leaves their scope.
    keyring: Arc<crate::auth::Keyring>,
    /// The egress gateway of sandboxes with EGRESS_RULES.
    egress: Arc<egress::EgressGateway>,
    /// Owns the runtime-wide tasks (creates, deletes, the sweeper, the reaper, the pools).
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

pub use crate::executor_client::ByteStream;
use actions::Actions;
use keep::Keeper;
use lifecycle::Lifecycle;
use pool::Pools;
use provision::Provisioner;
use registry::Registry;
use spaces::Spaces;
pub use terminals::TerminalSession;
use terminals::Terminals;

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager").finish_non_exhaustive()
    }
}

impl Manager {
    pub fn new(
        config: Arc<RuntimeConfig>,
        backend: Arc<dyn SandboxBackend>,
        store: Arc<Store>,
        snapshots: Arc<Snapshots>,
        keyring: Arc<crate::auth::Keyring>,
        generations: Arc<crate::auth::SpaceGenerations>,
        shutdown: CancellationToken,
    ) -> Arc<Self> {
        let tasks = TaskTracker::new();
        let registry = Arc::new(Registry::new(
            Arc::clone(&store),
            config.max_sandboxes,
            config.ended_retention,
        ));
        let spaces = Arc::new(Spaces::new(
            Arc::clone(&store),
            Arc::clone(&registry),
            config.limits,
            generations,
        ));
        let egress = Arc::new(egress::EgressGateway::new(
            Arc::clone(&config),
            Arc::clone(&backend),
            Arc::clone(&registry),
            Arc::clone(&store),
            tasks.clone(),
            shutdown.clone(),
        ));
        let pools = Pools::new(
            Arc::clone(&config),
            Arc::clone(&backend),
            Arc::clone(&store),
            Arc::clone(&egress),
            shutdown.clone(),
        );
        let keeper = Arc::new(Keeper::new(Arc::clone(&spaces), Arc::clone(&snapshots)));
        let lifecycle = Arc::new(Lifecycle::new(
            Arc::clone(&registry),
            Arc::clone(&backend),
            Arc::clone(&config),
            Arc::clone(&keeper),
        ));
        let owners = Arc::new(Owners::new(
            &config,
            Arc::clone(&store),
            Arc::clone(&backend),
        ));
        let provisioner = Arc::new(Provisioner::new(
            Arc::clone(&config),
            Arc::clone(&owners),
            Arc::clone(&backend),
            Arc::clone(&store),
            Arc::clone(&registry),
            Arc::clone(&spaces),
            Arc::clone(&pools),
            Arc::clone(&lifecycle),
            keeper,
            Arc::clone(&egress),
            tasks.clone(),
            shutdown.clone(),
        ));
        let actions = Actions::new(
            Arc::clone(&registry),
            Arc::clone(&lifecycle),
            Arc::clone(&config),
        );
        let images = Images::new(
            Arc::clone(&backend),
            Arc::clone(&owners),
            config.builds,
            config.data_dir.join("uploads"),
            tasks.clone(),
            shutdown.clone(),
        );
        let terminals = Terminals::new(
            Arc::clone(&registry),
            Arc::clone(&lifecycle),
            config.terminals,
        );
        Arc::new(Self {
            egress,
            terminals,
            images,
            keyring,
            config,
            store,
            snapshots,
            backend,
            registry,
            spaces,
            pools,
            provisioner,
            lifecycle,
            actions,
            tasks,
            shutdown,
        })
    }

    /// Counts as activity of a sandbox (an open preview tunnel); nothing when it is unknown.
    pub fn touch(&self, id: SandboxId) {
        if let Some(h) = self.registry.find(id) {
            h.touch();
        }
    }

    /// Whether the backend (the container engine) answers now.
    pub async fn ping_backend(&self) -> Result<()> {
        self.backend.ping().await
    }

    /// Registers the metrics' gauges of this manager's sandboxes and pools with `export`.
    pub fn observe(&self, export: &crate::metrics::MetricsExport) {
        gauges::observe(export, &self.registry, &self.pools);
    }

    /// Image builds and imports on the sandboxes' backend.
    pub fn images(&self) -> &Images {
        &self.images
    }

    /// The runtime's configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.config
    }

    /// Reconciles the store with the backend (see `restore`), then starts the sweeper, the reaper and the
    /// pools.
    pub async fn start(self: &Arc<Self>) -> Result<()> {
        restore::Restore {
            config: &self.config,
            backend: &self.backend,
            store: &self.store,
            registry: &self.registry,
            spaces: &self.spaces,
            pools: &self.pools,
            tasks: &self.tasks,
        }
        .run()
        .await?;
        // A sandbox whose restore a stop interrupted has not got its workspace: a failed restore leaves no
        // sandbox, and neither does this one.
        for sandbox in self.store.unfinished_restores()? {
            tracing::warn!(sandbox_id = %sandbox, "the runtime stopped while restoring this sandbox's workspace: it is deleted");
            if let Err(e) = self
                .provisioner
                .delete(
                    sandbox,
                    "the runtime stopped while restoring its workspace",
                    None,
                )
                .await
            {
                tracing::warn!(sandbox_id = %sandbox, error = %e.chain(), "could not delete a sandbox whose restore never finished");
            }
            self.store.end_restore(sandbox)?;
        }
        // Deletions a stop interrupted are finished before anything else can reach those spaces.
        for space in self.store.spaces_being_deleted()? {
            tracing::info!(%space, "finishing the deletion of a space");
            self.purge_space(&space, true).await?;
        }
        // Sandboxes with rules outlived the last runtime: their gateway starts again now. Until it does (or
        // when it cannot), their connections are refused: the routing the last one left leads nowhere.
        let with_rules = self.registry.handles().into_iter().any(|h| {
            !h.state().is_final()
                && h.snapshot().egress.mode() == mentis_core::egress::EgressMode::Rules
        });
        if with_rules && let Err(e) = self.egress.ensure().await {
            tracing::warn!(error = %e.chain(), "egress gateway: not started again; sandboxes with rules reach nothing");
        }
        self.spawn_sweeper();
        reaper::spawn(
            &self.tasks,
            self.shutdown.clone(),
            self.config.reaper_interval,
            Arc::clone(&self.registry),
            Arc::clone(&self.lifecycle),
            Arc::clone(&self.provisioner),
        );
        self.pools.spawn(&self.tasks);
        self.spawn_follower();
        Ok(())
    }

    /// Until shutdown: what the backend sees happen to sandboxes from outside wakes their health checks.
    fn spawn_follower(&self) {
        let registry = Arc::clone(&self.registry);
        let backend = Arc::clone(&self.backend);
        let shutdown = self.shutdown.clone();
        self.tasks.spawn(async move {
            let gone = move |id: SandboxId| {
                if let Some(h) = registry.find(id) {
                    tracing::debug!(sandbox_id = %id, "the backend says the sandbox went");
                    h.gone_hint.notify_one();
                }
            };
            tokio::select! {
                () = shutdown.cancelled() => {}
                () = backend.follow(&gone) => {}
            }
        });
    }

    /// Until shutdown: flushes changed records to the store and syncs the journals every second, and
    /// forgets ended sandboxes past their retention now and then.
    fn spawn_sweeper(&self) {
        let registry = Arc::clone(&self.registry);
        let egress = Arc::clone(&self.egress);
        let shutdown = self.shutdown.clone();
        let every = (self.config.ended_retention / 10)
            .clamp(Duration::from_secs(1), Duration::from_secs(60));
        self.tasks.spawn(async move {
            let mut last_forget = tokio::time::Instant::now();
            loop {
                tokio::select! {
                    () = shutdown.cancelled() => return,
                    () = tokio::time::sleep(FLUSH_EVERY) => {}
                }
                // Both block on the disk: off the runtime's threads, so no action waits behind them.
                let syncing = Arc::clone(&registry);
                if let Err(e) = tokio::task::spawn_blocking(move || {
                    syncing.flush();
                    syncing.sync_logs();
                })
                .await
                {
                    tracing::warn!(error = %e, "syncing the journals failed");
                }
                if last_forget.elapsed() >= every {
                    registry.forget_old_ended();
                    egress.prune(|id| registry.find(id).is_some());
                    last_forget = tokio::time::Instant::now();
                }
            }
        });
    }

    /// Stops accepting work, waits for running operations to finish their bookkeeping, and leaves the
    /// store up to date (marked as cleanly shut down, so the next start continues every log's seqs).
    pub async fn shutdown(&self) {
        self.shutdown.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(Duration::from_secs(10), self.tasks.wait()).await;
        self.registry.flush();
        self.registry.sync_logs();
        if let Err(e) = self.store.set_meta(restore::CLEAN_SHUTDOWN, "1") {
            tracing::warn!(error = %e, "could not mark the store as cleanly shut down");
        }
    }

    // Sandboxes.

    /// Creates a sandbox and returns it RUNNING; with `snapshot`, its workspace is the snapshot's, and a
    /// sandbox that cannot get it is deleted (the create fails with the restore's error).
    pub async fn create(
        &self,
        req: SandboxRequest,
        snapshot: Option<&SnapshotRecord>,
        caller: &Caller,
    ) -> Result<Sandbox> {
        if let Some(record) = snapshot {
            let space = req.space()?;
            if record.space_id != space.as_str() {
                return Err(Error::invalid(format!(
                    "snapshot {} is of space {}, not of the sandbox's space {space}",
                    record.id, record.space_id
                ))
                .at("spec.snapshot_id"));
            }
        }
        let sandbox = self.provisioner.create(req, caller).await?;
        if let Some(record) = snapshot {
            self.restore_into(sandbox.id, record).await?;
        }
        Ok(sandbox)
    }

    /// Restores snapshot `record` into the new sandbox `id`; a sandbox that cannot get it is deleted.
    async fn restore_into(&self, id: SandboxId, record: &SnapshotRecord) -> Result<()> {
        // Marked first, so a stop in the middle leaves no sandbox that looks made but lacks its workspace:
        // the next start discards it (see `start`).
        self.store.begin_restore(id, &record.id)?;
        let restored = async {
            let executor = self.lifecycle.executor_for(id).await?;
            self.snapshots.restore(&executor, record).await
        }
        .await;
        if let Err(e) = restored {
            tracing::warn!(sandbox = %id, snapshot = %record.id, error = %e, "restore failed: the sandbox is deleted");
            if let Err(d) = self
                .provisioner
                .delete(id, "its workspace could not be restored", None)
                .await
            {
                tracing::warn!(sandbox = %id, error = %d, "deleting the sandbox whose restore failed");
            }
            self.store.end_restore(id)?;
            return Err(e);
        }
        self.store.end_restore(id)?;
        tracing::info!(sandbox = %id, snapshot = %record.id, "workspace restored");
        Ok(())
    }

    /// A sandbox's observation log, for followers; NotFound when unknown.
    pub fn log(&self, id: SandboxId) -> Result<Arc<ObservationLog>> {
        Ok(Arc::clone(&self.registry.handle(id)?.log))
    }

    /// The space of a sandbox.
    pub fn space_of(&self, id: SandboxId) -> Result<SpaceId> {
        Ok(self.registry.handle(id)?.space_id())
    }

    /// A sandbox's record and the seq of its newest observation.
    pub fn get(&self, id: SandboxId) -> Result<(Sandbox, u64)> {
        let h = self.registry.handle(id)?;
        Ok((h.snapshot(), h.log.last_seq()))
    }

    /// A new egress policy for a sandbox, in force for its next connection: new rules in place; another
    /// mode (a RUNNING sandbox only) with its networks changed (docs/EGRESS.md, "Changing a running
    /// sandbox").
    pub async fn update_egress(
        &self,
        id: SandboxId,
        egress: mentis_core::egress::Egress,
    ) -> Result<Sandbox> {
        let h = self.registry.handle(id)?;
        self.spaces.record(&h.space_id())?.egress_cap.admit(
            &egress,
            h.space_id().as_str(),
            "sandbox.egress",
        )?;
        egress::check_secrets(&self.store, &h.space_id(), &egress, "sandbox.egress_rules")?;
        let before = h.snapshot().egress;
        if before.mode() == egress.mode() {
            return h.set_egress(egress);
        }
        // Another mode: its networks change first, under its lifecycle lock (no pause, resume or delete
        // meanwhile), on a RUNNING sandbox only.
        let _lifecycle = h.lifecycle.lock().await;
        let state = h.state();
        if state != mentis_core::SandboxState::Running {
            return Err(mentis_core::lifecycle::refuse(
                id,
                state,
                "a change of egress mode",
                &[mentis_core::SandboxState::Running],
            ));
        }
        let rules = egress.mode() == mentis_core::egress::EgressMode::Rules;
        if rules {
            self.egress.ensure().await?;
        }
        match self.backend.set_egress(id, egress.is_allow(), rules).await {
            Ok(source) => {
                h.set_gateway_source(source);
                tracing::info!(sandbox_id = %id, from = ?before.mode(), to = ?egress.mode(), "egress mode changed");
                h.set_egress(egress)
            }
            Err(e) => {
                // Back to the networks it had, as far as that goes (it then has at most what it had).
                let back = self
                    .backend
                    .set_egress(
                        id,
                        before.is_allow(),
                        before.mode() == mentis_core::egress::EgressMode::Rules,
                    )
                    .await;
                match back {
                    Ok(source) => h.set_gateway_source(source),
                    Err(b) => {
                        tracing::warn!(sandbox_id = %id, error = %b.chain(), "egress: the networks before the change could not be restored")
                    }
                }
                Err(e)
            }
        }
    }

    /// The latest connections and DNS questions the egress gateway refused to a sandbox, oldest first.
    pub fn egress_denials(&self, id: SandboxId) -> Result<Vec<EgressDenial>> {
        self.registry.handle(id)?;
        Ok(self.egress.denials(id))
    }

    /// The live sandbox carrying `key` in `space`.
    pub fn get_by_key(&self, space: &SpaceId, key: &str) -> Result<(Sandbox, u64)> {
        self.registry.get_by_key(space, key)
    }

    /// One page of sandboxes, oldest first, and whether more follow.
    pub fn list(&self, q: &ListQuery) -> (Vec<(Sandbox, u64)>, bool) {
        self.registry.list(q)
    }

    /// Deletes a sandbox: its running actions end LOST, its container and volume go, after the snapshot
    /// its space asks for. Idempotent: false when there was no sandbox to delete (none with this id, or it
    /// had ended).
    pub async fn delete(&self, id: SandboxId) -> Result<bool> {
        self.provisioner
            .delete(id, "deleted", Some(Cause::Request))
            .await
    }

    /// Freezes a RUNNING sandbox (idempotent for a PAUSED one), after the snapshot its space asks for.
    pub async fn pause(&self, id: SandboxId) -> Result<Sandbox> {
        self.lifecycle
            .pause(id, "paused by a client", Cause::Request)
            .await
    }

    /// Thaws a PAUSED sandbox (idempotent for a RUNNING one).
    pub async fn resume(&self, id: SandboxId) -> Result<Sandbox> {
        self.lifecycle.resume(id).await
    }

    /// Where port `port` of a sandbox is reached (its address on the executor network), for a preview:
    /// resumed first when PAUSED with auto_resume, counted as activity. PERMISSION_DENIED for the
    /// executor's own port, which no preview reaches.
    pub async fn app_address(&self, sandbox: SandboxId, port: u16) -> Result<(String, u16)> {
        let executor = self.lifecycle.executor_for(sandbox).await?;
        if port == executor.port() {
            return Err(Error::new(
                Reason::PermissionDenied,
                "the sandbox's executor port is not previewable",
            ));
        }
        Ok((executor.host().to_owned(), port))
    }

    /// Whether `port` is the sandbox's executor's (which no preview reaches).
    pub fn is_executor_port(&self, sandbox: SandboxId, port: u16) -> Result<bool> {
        let h = self.registry.handle(sandbox)?;
        Ok(h.executor().is_some_and(|e| e.port() == port))
    }

    // Terminals: each call resumes a PAUSED sandbox with auto_resume and counts as activity.

    /// Opens a terminal stream on a sandbox with `first`, a start or an attach (checked by the caller).
    pub async fn open_terminal(
        &self,
        sandbox: SandboxId,
        first: mentis_core::terminal::TerminalInput,
    ) -> Result<TerminalSession> {
        self.terminals.open(sandbox, first).await
    }

    /// Refuses a web terminal link the page could not open: FailedPrecondition when the sandbox opens no
    /// terminal (ended, between states, PAUSED without auto_resume), NotFound when it is RUNNING without
    /// `terminal`. Nothing is resumed.
    pub async fn check_terminal_link(
        &self,
        sandbox: SandboxId,
        terminal: Option<&str>,
    ) -> Result<()> {
        self.terminals.check_link(sandbox, terminal).await
    }

    /// A sandbox's terminals.
    pub async fn list_terminals(
        &self,
        sandbox: SandboxId,
    ) -> Result<Vec<mentis_core::terminal::TerminalInfo>> {
        self.terminals.list(sandbox).await
    }

    /// Hangs a terminal up (or forgets an exited one).
    pub async fn close_terminal(&self, sandbox: SandboxId, terminal_id: &str) -> Result<()> {
        self.terminals.close(sandbox, terminal_id).await
    }

    // Files: each call resumes a PAUSED sandbox with auto_resume and counts as activity.

    /// Starts reading `length` bytes (0: to the end) of a workspace file from `offset`.
    pub async fn read_file(
        &self,
        sandbox: SandboxId,
        path: String,
        offset: u64,
        length: u64,
    ) -> Result<ByteStream> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .read_file(path, offset, length)
            .await
    }

    /// Writes a workspace file from `chunks`, kept only after [`Chunk::Commit`] and their clean end.
    pub async fn write_file(
        &self,
        sandbox: SandboxId,
        path: String,
        mode: u32,
        chunks: impl futures::Stream<Item = Chunk> + Send + 'static,
    ) -> Result<FileInfo> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .write_file(path, mode, chunks)
            .await
    }

    /// One page of a workspace directory's entries.
    pub async fn list_files(&self, sandbox: SandboxId, q: ListFiles) -> Result<FilePage> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .list_files(q)
            .await
    }

    /// Describes one workspace entry.
    pub async fn stat_file(&self, sandbox: SandboxId, path: String) -> Result<FileInfo> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .stat_file(path)
            .await
    }

    /// Replaces a string in a workspace file.
    pub async fn edit_file(&self, sandbox: SandboxId, edit: Edit) -> Result<Edited> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .edit_file(edit)
            .await
    }

    /// Deletes a workspace entry (a directory with its contents when `recursive`).
    pub async fn delete_file(
        &self,
        sandbox: SandboxId,
        path: String,
        recursive: bool,
    ) -> Result<()> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .delete_file(path, recursive)
            .await
    }

    /// Creates a workspace directory with its parents.
    pub async fn make_directory(
        &self,
        sandbox: SandboxId,
        path: String,
        mode: u32,
    ) -> Result<FileInfo> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .make_directory(path, mode)
            .await
    }

    /// Starts a watch of a workspace directory, or reads one again (the executor keeps it; see
    /// docs/FILES.md, "Watch a folder").
    pub async fn watch_files(
        &self,
        sandbox: SandboxId,
        w: mentis_core::files::WatchFiles,
    ) -> Result<crate::executor_client::WatchStream> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .watch_files(w)
            .await
    }

    /// Moves or renames a workspace entry (replacing the destination only when `overwrite`).
    pub async fn move_file(
        &self,
        sandbox: SandboxId,
        source: String,
        destination: String,
        overwrite: bool,
    ) -> Result<FileInfo> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .move_file(source, destination, overwrite)
            .await
    }

    /// Unpacks the tar stream `chunks` into the workspace directory `path`, kept only after
    /// [`Chunk::Commit`] and their clean end.
    pub async fn upload(
        &self,
        sandbox: SandboxId,
        path: String,
        chunks: impl futures::Stream<Item = Chunk> + Send + 'static,
    ) -> Result<Unpacked> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .upload(path, chunks)
            .await
    }

    /// Starts a tar download of the workspace path `path`.
    pub async fn download(&self, sandbox: SandboxId, path: String) -> Result<ByteStream> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .download(path)
            .await
    }

    /// Every pool's figures.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        self.pools.stats()
    }

    // Actions.

    /// Accepts an action (or recognises a retry of one); see [`actions::Actions::submit`].
    pub async fn submit(
        &self,
        sandbox: SandboxId,
        action_id: Option<ActionId>,
        action: Action,
    ) -> Result<Submitted> {
        self.actions.submit(sandbox, action_id, action).await
    }

    /// Ok when the sandbox knows the action; see [`actions::Actions::require_action`].
    pub fn require_action(&self, sandbox: SandboxId, action: &ActionId) -> Result<()> {
        self.actions.require_action(sandbox, action)
    }

    /// Cancels a running action.
    pub async fn cancel(&self, sandbox: SandboxId, action: &ActionId) -> Result<()> {
        self.actions.cancel(sandbox, action).await
    }

    /// Writes to a running action's stdin.
    pub async fn write_stdin(
        &self,
        sandbox: SandboxId,
        action: &ActionId,
        data: Bytes,
        eof: bool,
    ) -> Result<()> {
        self.actions.write_stdin(sandbox, action, data, eof).await
    }

    /// Replaces a sandbox's kernel with a fresh one.
    pub async fn reset_kernel(&self, sandbox: SandboxId) -> Result<()> {
        self.actions.reset_kernel(sandbox).await
    }

    /// Summarises variables of a sandbox's kernel.
    pub async fn inspect_variables(
        &self,
        sandbox: SandboxId,
        names: Vec<String>,
    ) -> Result<Vec<mentis_core::VariableSummary>> {
        self.actions.inspect_variables(sandbox, names).await
    }

    /// The sandbox's processes (a PAUSED one with auto_resume is resumed to ask, as for files).
    pub async fn list_processes(
        &self,
        sandbox: SandboxId,
    ) -> Result<Vec<mentis_core::process::ProcessInfo>> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .processes()
            .await
    }

    /// Sends `signal` (checked by `mentis_model::process::signal_name`) to process `pid` of the sandbox.
    pub async fn signal_process(&self, sandbox: SandboxId, pid: i32, signal: String) -> Result<()> {
        self.lifecycle
            .executor_for(sandbox)
            .await?
            .signal_process(pid, signal)
            .await
    }

    // Spaces.

    pub fn create_space(&self, space: Space) -> Result<SpaceView> {
        self.config
            .runtime_classes
            .admit(&space.runtime_class, "runtime_class")
            .map_err(|e| e.within("space"))?;
        if let Some(egress) = &space.egress {
            // A new space has no secrets yet: a default naming one is set by UpdateSpace after SetSecret.
            egress::check_secrets(&self.store, &space.id, egress, "space.egress_rules")?;
        }
        self.spaces.create(space)
    }

    pub fn get_space(&self, id: &SpaceId) -> Result<SpaceView> {
        self.spaces.get(id)
    }

    /// Sets a secret of a space (docs/EGRESS.md, "Secrets"); INVALID_ARGUMENT for a bad name or value,
    /// NOT_FOUND for an unknown space.
    pub fn set_secret(&self, space: &SpaceId, name: &str, value: &str) -> Result<()> {
        mentis_core::egress::check_secret_name(name).map_err(|e| Error::invalid(e).at("name"))?;
        if value.is_empty()
            || value.len() > mentis_core::egress::MAX_HEADER_VALUE
            || value.bytes().any(|b| b.is_ascii_control() && b != b'\t')
        {
            return Err(Error::invalid(format!(
                "a secret's value is 1-{} bytes without control characters (it goes into HTTP headers)",
                mentis_core::egress::MAX_HEADER_VALUE
            ))
            .at("value"));
        }
        self.spaces.get(space)?;
        self.store.change_secrets(space, |s| {
            s.insert(name.to_owned(), value.to_owned());
        })?;
        tracing::info!(space_id = %space, secret = name, "secret set");
        Ok(())
    }

    /// The names of a space's secrets, in order.
    pub fn secret_names(&self, space: &SpaceId) -> Result<Vec<String>> {
        self.spaces.get(space)?;
        Ok(self.store.secrets(space)?.into_keys().collect())
    }

    /// Removes a secret; NOT_FOUND when the space has no such secret.
    pub fn delete_secret(&self, space: &SpaceId, name: &str) -> Result<()> {
        self.spaces.get(space)?;
        if !self
            .store
            .change_secrets(space, |s| s.remove(name).is_some())?
        {
            return Err(Error::new(
                Reason::NotFound,
                format!("space {space} has no secret {}", mentis_core::quoted(name)),
            ));
        }
        tracing::info!(space_id = %space, secret = name, "secret deleted");
        Ok(())
    }

    pub fn list_spaces(
        &self,
        after: Option<&str>,
        page_size: usize,
        allowed: Option<&BTreeSet<SpaceId>>,
    ) -> (Vec<SpaceView>, bool) {
        self.spaces.list(after, page_size, allowed)
    }

    /// A new runtime class makes the pools of the space's templates again under it (sandboxes made before
    /// keep theirs).
    pub fn update_space(&self, id: &SpaceId, update: SpaceUpdate) -> Result<SpaceView> {
        if let Some(class) = &update.runtime_class {
            self.config
                .runtime_classes
                .admit(class, "runtime_class")
                .map_err(|e| e.within("space"))?;
        }
        if let Some(Some(egress)) = &update.egress {
            egress::check_secrets(&self.store, id, egress, "space.egress_rules")?;
        }
        let before = self.spaces.record(id)?;
        let (space, live) = self.spaces.update(id, update)?;
        if (&space.runtime_class, &space.egress, &space.egress_cap)
            != (&before.runtime_class, &before.egress, &before.egress_cap)
        {
            for t in self.store.pooled_templates()? {
                if t.space_id == space.id {
                    // A template the space's policy no longer admits keeps no pool (its sandboxes are
                    // refused at creation, saying why).
                    let pool = pool::template_pool(&self.config, &space, &t).unwrap_or_else(|e| {
                        tracing::warn!(space_id = %t.space_id, template = %t.name, error = %e,
                            "the template's pool is not made again");
                        None
                    });
                    self.pools.set_template(&t.space_id, &t.name, pool);
                }
            }
        }
        Ok((space, live))
    }

    /// Deletes a space. FailedPrecondition while it has live sandboxes unless `force`, which deletes them
    /// first. The default space stays.
    pub async fn delete_space(&self, id: &SpaceId, force: bool) -> Result<()> {
        if id.is_default() {
            return Err(
                Error::new(Reason::DefaultSpace, "the default space cannot be deleted")
                    .about(Resource::space(id)),
            );
        }
        self.spaces.record(id)?;
        let members = self.registry.live_in(id);
        if members > 0 && !force {
            return Err(Error::new(
                Reason::SpaceNotEmpty,
                format!(
                    "space {id} still has {members} sandboxes; delete them first or pass force"
                ),
            )
            .about(Resource::space(id)));
        }
        self.purge_space(id, force).await
    }

    /// Deletes a space and everything that belongs to it (docs/ARCHITECTURE.md, "Security model"): its
    /// sandboxes, live (when `force`) and ended (records and logs), its snapshots and their archives, its
    /// templates and their pools, and its place in every key's scope (a key left with no space is revoked).
    /// The store marks the space first, so a restart finishes what a stop interrupted; its keys lose it at
    /// once; and the id can be taken again only when everything is gone, by a space of another generation.
    async fn purge_space(&self, id: &SpaceId, force: bool) -> Result<()> {
        self.spaces.begin_delete(id)?;
        let members: Vec<SandboxId> = self
            .registry
            .handles()
            .into_iter()
            .filter(|h| h.is_live_in(id))
            .map(|h| h.id)
            .collect();
        if !members.is_empty() && !force {
            self.spaces.cancel_delete(id)?;
            return Err(Error::new(
                Reason::SpaceNotEmpty,
                format!("space {id} got a sandbox while it was being deleted"),
            )
            .about(Resource::space(id)));
        }
        for sandbox in members {
            self.provisioner
                .delete(sandbox, "deleted with its space", Some(Cause::Request))
                .await?;
        }
        self.spaces.remove_if_empty(id)?;
        self.registry.forget_ended_in(id);
        // Its snapshots, archives first (a record without its archive is harmless; an archive without its
        // record could never be deleted).
        loop {
            let (page, _) = self.list_snapshots(
                SnapshotFilter {
                    spaces: Some(vec![id.as_str().to_owned()]),
                    ..SnapshotFilter::default()
                },
                100,
            )?;
            if page.is_empty() {
                break;
            }
            for snapshot in &page {
                self.snapshots.delete(snapshot).await?;
            }
        }
        // Its templates go with it, and their pools.
        self.pools.retire_space(id);
        self.store.delete_templates_of(id)?;
        self.keyring.forget_space(id)?;
        self.spaces.finish_delete(id)?;
        tracing::info!(space = %id, "space deleted with everything in it");
        Ok(())
    }

    // Snapshots (docs/ARCHITECTURE.md, "Snapshots").

    /// The record of snapshot `id`; SNAPSHOT_NOT_FOUND when there is none.
    pub fn snapshot(&self, id: &str) -> Result<SnapshotRecord> {
        self.store
            .snapshot(id)?
            .ok_or_else(|| Error::new(Reason::SnapshotNotFound, format!("snapshot {id} not found")))
    }

    /// Up to `page_size` snapshots that `filter` selects (its `limit` is set here), and whether more
    /// follow.
    pub fn list_snapshots(
        &self,
        mut filter: SnapshotFilter<'_>,
        page_size: usize,
    ) -> Result<(Vec<SnapshotRecord>, bool)> {
        filter.limit = page_size + 1;
        let mut found = self.store.snapshots(&filter)?;
        let more = found.len() > page_size;
        found.truncate(page_size);
        Ok((found, more))
    }

    /// Takes a snapshot of a sandbox's workspace (a call that counts as activity) and records it.
    pub async fn take_snapshot(
        &self,
        sandbox: SandboxId,
        labels: std::collections::BTreeMap<String, String>,
    ) -> Result<SnapshotRecord> {
        let space = self.space_of(sandbox)?;
        let executor = self.lifecycle.executor_for(sandbox).await?;
        self.snapshots
            .take(&executor, sandbox, &space, labels)
            .await
    }

    /// Deletes a snapshot: its archive, then its record.
    pub async fn delete_snapshot(&self, record: &SnapshotRecord) -> Result<()> {
        self.snapshots.delete(record).await
    }

    // Templates (docs/ARCHITECTURE.md, "Templates").

    /// Adds a template to an existing space; ALREADY_EXISTS when the space has one of that name. A runtime
    /// class is the admin's to set.
    pub fn create_template(&self, caller: &Caller, mut template: Template) -> Result<Template> {
        self.check_runtime_class(caller, "", &template.runtime_class)?;
        // Times as the store keeps them (ms), so what is returned now is what Get returns later.
        let now = stored_time(crate::clock::now());
        (template.created_at, template.updated_at) = (now, now);
        let space = self.spaces.admitting(&template.space_id)?;
        let pool = pool::template_pool(&self.config, &space, &template)
            .map_err(|e| e.within("template"))?;
        self.check_template_quota(&space, &template, true)?;
        self.store.create_template(&template)?;
        self.pools
            .set_template(&template.space_id, &template.name, pool);
        Ok(template)
    }

    /// A template's runtime class goes from `before` to `after`: one the runtime offers, and set or changed
    /// by the admin only (it decides what boundary a space's code runs behind).
    fn check_runtime_class(&self, caller: &Caller, before: &str, after: &str) -> Result<()> {
        if before == after {
            return Ok(());
        }
        self.config
            .runtime_classes
            .admit(after, "template.runtime_class")?;
        caller
            .require_admin("setting a template's runtime_class")
            .map_err(|e| e.at("template.runtime_class"))
    }

    /// A space holds at most [`MAX_TEMPLATES_PER_SPACE`] templates, and its templates' pools together keep at
    /// most as many warm sandboxes as the space may run (its `max_sandboxes`, or `MENTIS_MAX_SANDBOXES` when
    /// it sets none): a key of a small space cannot fill the host with warm containers.
    /// RESOURCE_EXHAUSTED (`SPACE_QUOTA_EXCEEDED`) otherwise.
    fn check_template_quota(
        &self,
        space: &Space,
        template: &Template,
        creating: bool,
    ) -> Result<()> {
        let others: Vec<Template> = self
            .store
            .templates(&space.id, "", MAX_TEMPLATES_PER_SPACE + 1)?
            .into_iter()
            .filter(|t| t.name != template.name)
            .collect();
        if creating && others.len() >= MAX_TEMPLATES_PER_SPACE {
            return Err(Error::new(
                Reason::SpaceQuotaExceeded,
                format!(
                    "space {} already has {MAX_TEMPLATES_PER_SPACE} templates, the most a space may have",
                    space.id
                ),
            )
            .about(Resource::space(&space.id)));
        }
        let warm: u64 = others
            .iter()
            .chain(std::iter::once(template))
            .map(|t| u64::from(t.pool_size))
            .sum();
        let most = match space.limits.max_sandboxes {
            0 => u64::try_from(self.config.max_sandboxes).unwrap_or(u64::MAX),
            n => u64::from(n),
        };
        if warm > most {
            return Err(Error::new(
                Reason::SpaceQuotaExceeded,
                format!(
                    "the pools of space {}'s templates would keep {warm} sandboxes warm, more than the {most} \
                     the space may run: lower pool_size",
                    space.id
                ),
            )
            .about(Resource::space(&space.id)));
        }
        Ok(())
    }

    /// NOT_FOUND when the space has no such template.
    pub fn get_template(&self, space: &SpaceId, name: &str) -> Result<Template> {
        self.store
            .template(space, name)?
            .ok_or_else(|| template_not_found(space, name))
    }

    /// A page of a space's templates after `after`, and whether more follow.
    pub fn list_templates(
        &self,
        space: &SpaceId,
        after: &str,
        page_size: usize,
    ) -> Result<(Vec<Template>, bool)> {
        self.spaces.record(space)?;
        let mut page = self.store.templates(space, after, page_size + 1)?;
        let more = page.len() > page_size;
        page.truncate(page_size);
        Ok((page, more))
    }

    /// Sets the fields of `update`; the template checked again. A change of its runtime class is the
    /// admin's to make.
    pub fn update_template(
        &self,
        caller: &Caller,
        space: &SpaceId,
        name: &str,
        update: TemplateUpdate,
    ) -> Result<Template> {
        let current = self.get_template(space, name)?;
        let before = current.runtime_class.clone();
        let updated = current.updated(update, stored_time(crate::clock::now()));
        updated.check("template")?;
        self.check_runtime_class(caller, &before, &updated.runtime_class)?;
        let record = self.spaces.admitting(space)?;
        let pool = pool::template_pool(&self.config, &record, &updated)
            .map_err(|e| e.within("template"))?;
        self.check_template_quota(&record, &updated, false)?;
        self.store.put_template(&updated)?;
        self.pools.set_template(space, name, pool);
        Ok(updated)
    }

    /// NOT_FOUND when there is no such template; its sandboxes keep running.
    pub fn delete_template(&self, space: &SpaceId, name: &str) -> Result<()> {
        if self.store.delete_template(space, name)? {
            self.pools.set_template(space, name, None);
            Ok(())
        } else {
            Err(template_not_found(space, name))
        }
    }
}

/// `t` to the millisecond, as the store keeps times.
fn stored_time(t: std::time::SystemTime) -> std::time::SystemTime {
    crate::store::time(crate::store::ms(t))
}

fn template_not_found(space: &SpaceId, name: &str) -> Error {
    Error::new(
        Reason::NotFound,
        format!(
            "space {space} has no template {}",
            mentis_core::quoted(name)
        ),
    )
    .about(Resource::template(space, name))
}
