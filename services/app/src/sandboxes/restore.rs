//! Start-up: the store's records are reconciled with what the backend holds. Sandboxes that still run are
//! taken over (their containers are never killed because the runtime restarted); paused ones stay paused;
//! records whose container vanished become TERMINATED with the reason; containers with no record go.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mentis_core::{BackendState, Error, Reason, Result, SandboxId, SandboxState};

use mentis_core::SandboxBackend;

use mentis_core::ActionId;
use mentis_core::observation::ActionKind;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::handle::SandboxHandle;
use super::health;
use super::pool::Pools;
use super::pump;
use super::reach::reach_executor;
use super::registry::Registry;
use super::spaces::Spaces;
use crate::config::RuntimeConfig;
use crate::observations::ObservationLog;
use crate::store::{Store, StoredSandbox};

/// Meta key: "1" when the last run shut down cleanly (every newest seq was stored).
pub(super) const CLEAN_SHUTDOWN: &str = "clean_shutdown";
/// Meta key: the `MENTIS_INSTANCE` whose sandboxes the store records.
const INSTANCE: &str = "instance";
/// After a crash the stored newest seq may be behind (it is flushed every second): logs taken over then
/// continue this far above it, so no seq is ever handed out twice.
const SEQ_JUMP_AFTER_CRASH: u64 = 1 << 20;
/// Sandboxes taken over at once.
const RESTORE_CONCURRENCY: usize = 16;
/// How long a taken-over executor has to answer.
const TAKEOVER_READY: Duration = Duration::from_secs(20);

/// What reconciliation works on.
pub(super) struct Restore<'a> {
    pub config: &'a Arc<RuntimeConfig>,
    pub backend: &'a Arc<dyn SandboxBackend>,
    pub store: &'a Arc<Store>,
    pub registry: &'a Registry,
    pub spaces: &'a Spaces,
    pub pools: &'a Arc<Pools>,
    /// The manager's tasks (a watch ends a vanished sandbox on them).
    pub tasks: &'a TaskTracker,
}

impl Restore<'_> {
    /// Checks the store's instance, prepares the backend, loads spaces and sandboxes from the store and
    /// reconciles them with what the backend holds.
    pub async fn run(&self) -> Result<()> {
        // The store and the backend's labels must speak of the same instance, or the reconciliation below
        // would take another instance's sandboxes for vanished ones.
        let instance = &self.config.docker.instance;
        match self.store.meta(INSTANCE)? {
            None => self.store.set_meta(INSTANCE, instance)?,
            Some(owner) if &owner == instance => {}
            Some(owner) => {
                return Err(Error::new(
                    Reason::FailedPrecondition,
                    format!(
                        "the store in {} belongs to instance {owner:?}, not {instance:?}: set \
                     MENTIS_INSTANCE={owner} or use another MENTIS_DATA_DIR",
                        self.config.data_dir.display()
                    ),
                ));
            }
        }
        self.backend.prepare().await?;
        self.spaces.load()?;
        // Templates' pools, before their stored members are matched to pools.
        for t in self.store.pooled_templates()? {
            let pool = self
                .spaces
                .record(&t.space_id)
                .and_then(|space| super::pool::template_pool(self.config, &space, &t));
            match pool {
                Ok(pool) => self.pools.set_template(&t.space_id, &t.name, pool),
                Err(e) => {
                    tracing::warn!(space_id = %t.space_id, template = %t.name, error = %e.chain(), "no pool for this template")
                }
            }
        }
        let clean = self.store.meta(CLEAN_SHUTDOWN)?.as_deref() == Some("1");
        self.store.set_meta(CLEAN_SHUTDOWN, "0")?;
        let found: HashMap<SandboxId, BackendState> = self
            .backend
            .list()
            .await?
            .into_iter()
            .map(|s| (s.id, s.state))
            .collect();
        let stored = self.store.sandboxes()?;
        let members = self.store.members()?;
        let known: HashSet<SandboxId> = stored
            .iter()
            .map(|s| s.record.id)
            .chain(members.iter().map(|m| m.id))
            .collect();
        self.pools.restore_members(members, &found).await;
        // Several at once: one executor that does not answer must not hold the others (or the start) up
        // for long.
        futures::stream::iter(stored)
            .map(|s| {
                let state = found.get(&s.record.id).copied();
                self.restore(s, state, clean)
            })
            .buffer_unordered(RESTORE_CONCURRENCY)
            .collect::<()>()
            .await;
        // Ended records past their retention go now, and journals no record speaks of.
        self.registry.forget_old_ended();
        self.remove_stray_journals();
        for (id, state) in found {
            if !known.contains(&id) {
                tracing::info!(sandbox_id = %id, ?state, "removing a sandbox with no record");
                if let Err(e) = self.backend.delete(id).await {
                    tracing::warn!(sandbox_id = %id, error = %e.chain(), "could not remove an unknown sandbox");
                }
            }
        }
        Ok(())
    }

    /// Removes the journal folders of sandboxes the registry does not hold (a crash between forgetting a
    /// sandbox and removing its journal).
    fn remove_stray_journals(&self) {
        let Ok(entries) = std::fs::read_dir(self.config.data_dir.join("logs")) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let known = name
                .to_str()
                .and_then(|n| SandboxId::parse(n).ok())
                .is_some_and(|id| self.registry.find(id).is_some());
            if !known && let Err(e) = std::fs::remove_dir_all(entry.path()) {
                tracing::warn!(path = %entry.path().display(), error = %e, "could not remove a stray journal");
            }
        }
    }

    /// Actions that were running when the runtime stopped: each is followed again (its executor holds what
    /// it emitted meanwhile) by a pump that waits for the sandbox to be reached; in an ended sandbox they
    /// end LOST.
    fn follow_unended(
        &self,
        h: &Arc<SandboxHandle>,
        unended: Vec<(ActionId, ActionKind)>,
        ended: bool,
    ) {
        for (action, kind) in unended {
            if ended {
                h.end_lost(
                    &action,
                    kind,
                    "the runtime restarted while the action ran and the sandbox ended meanwhile",
                );
                continue;
            }
            let span = tracing::info_span!(
                "action",
                sandbox_id = %h.id,
                action_id = %action,
                resumed = true,
                exit_code = tracing::field::Empty,
                reason = tracing::field::Empty,
                status = tracing::field::Empty,
            );
            h.tasks
                .spawn(pump::resume(Arc::clone(h), action, kind).instrument(span));
        }
    }

    async fn restore(&self, s: StoredSandbox, found: Option<BackendState>, clean: bool) {
        let id = s.record.id;
        let dir = self.config.log_dir(id);
        // The journal holds every seq a client saw. Without one (a record from before journals), the stored
        // newest seq may lag after a crash (it is flushed every second): continue far above it then, so no
        // seq is ever handed out twice.
        let journal = self.config.log_journal && dir.is_dir();
        let fallback = if clean || journal {
            s.last_seq
        } else {
            s.last_seq + SEQ_JUMP_AFTER_CRASH
        };
        let actions = match self.store.actions(id) {
            Ok(actions) => actions,
            Err(e) => {
                tracing::warn!(sandbox_id = %id, error = %e.chain(), "could not read a sandbox's actions");
                Vec::new()
            }
        };
        let unfinished: HashSet<_> = actions
            .iter()
            .filter(|a| !a.finished)
            .map(|a| a.id.clone())
            .collect();
        let log = if self.config.log_journal {
            ObservationLog::reopen(
                id,
                self.config.log_limits.clone(),
                &dir,
                fallback,
                &unfinished,
            )
        } else {
            ObservationLog::starting_after(id, self.config.log_limits.clone(), fallback)
        };
        let h = Arc::new(SandboxHandle::new(
            s.record.clone(),
            s.env,
            log,
            s.token,
            Arc::clone(self.store),
        ));
        let was = s.record.state;
        self.registry.insert(Arc::clone(&h));
        let unended = h.restore_actions(actions);
        self.follow_unended(&h, unended, was.is_final());
        if was.is_final() {
            // Kept for Get (and its log for replay) until the retention time passes.
            h.log.close();
            return;
        }
        let gone = |reason: &str| {
            tracing::warn!(sandbox_id = %id, reason, "sandbox ended while the runtime was down");
            h.reconcile(SandboxState::Terminated, reason, "sandbox gone");
        };
        match (was, found) {
            (SandboxState::Creating | SandboxState::Terminating, _) => {
                // Half made or half removed when the runtime stopped: finish removing it.
                if let Err(e) = self.backend.delete(id).await {
                    tracing::warn!(sandbox_id = %id, error = %e.chain(), "could not remove a half-made sandbox");
                }
                let (to, reason) = if was == SandboxState::Creating {
                    (
                        SandboxState::Failed,
                        "the runtime restarted while creating it",
                    )
                } else {
                    (SandboxState::Terminated, "deleted")
                };
                if let Err(e) = h.enter(to, reason) {
                    tracing::warn!(sandbox_id = %id, error = %e.chain(), "could not end a half-made sandbox");
                }
            }
            (SandboxState::Paused, None | Some(BackendState::Missing))
                if !self.backend.pauses_in_place() =>
            {
                // Paused by snapshot: nothing runs, its snapshot holds the workspace.
                h.reconcile(
                    SandboxState::Paused,
                    "paused",
                    "sandbox taken over after a runtime restart",
                );
                tracing::info!(sandbox_id = %id, "took over a sandbox paused by snapshot");
                health::spawn(&h, self.backend, self.config, self.tasks);
            }
            (_, None | Some(BackendState::Missing)) => {
                // The container vanished behind our back; remove what is left (its workspace volume).
                if let Err(e) = self.backend.delete(id).await {
                    tracing::warn!(sandbox_id = %id, error = %e.chain(), "could not remove a sandbox's leftovers");
                }
                gone("its container vanished while the runtime was down");
            }
            (_, Some(BackendState::Paused)) => {
                h.reconcile(
                    SandboxState::Paused,
                    "paused",
                    "sandbox taken over after a runtime restart",
                );
                tracing::info!(sandbox_id = %id, "took over a paused sandbox");
                health::spawn(&h, self.backend, self.config, self.tasks);
            }
            (_, Some(BackendState::Running | BackendState::Stopped)) => {
                let within = TAKEOVER_READY.min(self.config.ready_timeout);
                let reached =
                    reach_executor(self.backend.as_ref(), self.config, id, &h.token, within);
                match reached.await {
                    Ok((client, _)) => {
                        h.set_executor(client);
                        h.reconcile(
                            SandboxState::Running,
                            "",
                            "sandbox taken over after a runtime restart",
                        );
                        tracing::info!(sandbox_id = %id, "took over a running sandbox");
                    }
                    Err(e) => {
                        // Alive but not answering yet: the health watch brings it back.
                        tracing::warn!(sandbox_id = %id, error = %e.chain(), "executor not answering after a restart");
                        h.reconcile(
                            SandboxState::Unhealthy,
                            &e.to_string(),
                            "executor unreachable after a runtime restart",
                        );
                    }
                }
                health::spawn(&h, self.backend, self.config, self.tasks);
            }
        }
        // Last activity counts from the takeover, not from before the downtime.
        if !h.state().is_final() {
            h.touch();
        }
        h.persist();
    }
}
