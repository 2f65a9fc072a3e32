//! Pause and resume: the moves that freeze and thaw a sandbox, through PAUSING and RESUMING (see the table
//! in `mentis_core::lifecycle`), and auto-resume for calls that count as activity.

use std::sync::Arc;

use mentis_core::lifecycle;
use mentis_core::{
    Cause, Ending, Error, Reason, Resource, Result, Sandbox, SandboxBackend, SandboxId,
    SandboxState,
};

use super::handle::SandboxHandle;
use super::keep::Keeper;
use super::reach::{reach_executor, ready_executor};
use super::registry::Registry;
use crate::config::RuntimeConfig;
use crate::executor_client::ExecutorClient;

/// Pauses and resumes sandboxes.
pub struct Lifecycle {
    registry: Arc<Registry>,
    backend: Arc<dyn SandboxBackend>,
    config: Arc<RuntimeConfig>,
    keeper: Arc<Keeper>,
}

impl std::fmt::Debug for Lifecycle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lifecycle").finish_non_exhaustive()
    }
}

impl Lifecycle {
    pub fn new(
        registry: Arc<Registry>,
        backend: Arc<dyn SandboxBackend>,
        config: Arc<RuntimeConfig>,
        keeper: Arc<Keeper>,
    ) -> Self {
        Self {
            registry,
            backend,
            config,
            keeper,
        }
    }

    /// Freezes a RUNNING sandbox, after the snapshot its space asks for (which stops the pause when it
    /// fails). Idempotent for a PAUSED one. FailedPrecondition while actions run (their streams would not
    /// survive the freeze) or in any other state.
    pub async fn pause(&self, id: SandboxId, reason: &str, cause: Cause) -> Result<Sandbox> {
        let h = self.registry.handle(id)?;
        let _lifecycle = h.lifecycle.lock().await;
        if h.state() == SandboxState::Paused {
            return Ok(h.snapshot());
        }
        // PAUSING from here on: no action is admitted (the check and the move share the lock that admits
        // actions), so none can start on a container that is being frozen.
        h.enter_if(SandboxState::Pausing, reason, |now| {
            if now.state != SandboxState::Running {
                return Err(lifecycle::refuse(
                    id,
                    now.state,
                    "PauseSandbox",
                    &[SandboxState::Running, SandboxState::Paused],
                ));
            }
            match now.running_actions {
                0 => Ok(()),
                n => Err(Error::new(
                    Reason::ActionsRunning,
                    format!(
                        "sandbox {id} has {n} running actions; cancel them or let them end before pausing"
                    ),
                )
                .about(Resource::sandbox(id))),
            }
        })?;
        if let Err(e) = self.keeper.before(&h, Ending::Pause(cause)).await {
            h.enter(
                SandboxState::Running,
                "the snapshot before the pause failed",
            )?;
            return Err(e);
        }
        let paused = if self.backend.pauses_in_place() {
            self.backend.pause(id).await
        } else {
            self.suspend(&h).await
        };
        if let Err(e) = paused {
            tracing::warn!(sandbox_id = %id, error = %e.chain(), "could not pause a sandbox");
            h.enter(SandboxState::Running, &format!("pause failed: {e}"))?;
            return Err(e);
        }
        h.enter(SandboxState::Paused, reason)?;
        tracing::info!(sandbox_id = %id, reason, "sandbox paused");
        Ok(h.snapshot())
    }

    /// A pause by snapshot (a backend that cannot freeze a sandbox): the workspace taken, then what runs
    /// removed. Nothing changes when the snapshot fails; the snapshot goes when the removal does.
    async fn suspend(&self, h: &SandboxHandle) -> Result<()> {
        let snapshot = self.keeper.suspend(h).await?;
        if let Err(e) = self.backend.pause(h.id).await {
            self.keeper.forget(&snapshot).await;
            return Err(e);
        }
        h.clear_executor();
        tracing::info!(sandbox_id = %h.id, snapshot = %snapshot.id, "sandbox paused by snapshot: its processes ended, its workspace is kept");
        Ok(())
    }

    /// A resume by snapshot: the sandbox made again (same id, token and spec) and its workspace restored;
    /// the client of its executor. Nothing is left running when a step fails (the snapshot stays, for the
    /// next try).
    async fn revive(&self, h: &SandboxHandle) -> Result<ExecutorClient> {
        let snapshot = self.keeper.suspended(h)?.ok_or_else(|| {
            Error::new(
                Reason::FailedPrecondition,
                format!(
                    "sandbox {} was paused by snapshot, but its snapshot is gone: it cannot be resumed",
                    h.id
                ),
            )
            .about(Resource::sandbox(h.id))
        })?;
        let spec = h.backend_spec(&self.config);
        let made = async {
            let endpoint = self.backend.create(&spec).await?;
            let client =
                ready_executor(&self.config, &endpoint, &h.token, self.config.ready_timeout)
                    .await?;
            self.keeper.revive(&client, &snapshot).await?;
            Ok::<_, Error>(client)
        }
        .await;
        match made {
            Ok(client) => {
                self.keeper.forget(&snapshot).await;
                tracing::info!(sandbox_id = %h.id, snapshot = %snapshot.id, "sandbox resumed from its snapshot");
                Ok(client)
            }
            Err(e) => {
                if let Err(left) = self.backend.pause(h.id).await {
                    tracing::warn!(sandbox_id = %h.id, error = %left.chain(), "could not remove a failed resume's sandbox");
                }
                Err(e)
            }
        }
    }

    /// Thaws a PAUSED sandbox and waits for its executor. Idempotent for a RUNNING one.
    pub async fn resume(&self, id: SandboxId) -> Result<Sandbox> {
        let h = self.registry.handle(id)?;
        self.resume_handle(&h).await
    }

    async fn resume_handle(&self, h: &Arc<SandboxHandle>) -> Result<Sandbox> {
        let _lifecycle = h.lifecycle.lock().await;
        self.resume_locked(h).await
    }

    /// [`Self::resume`] for a caller that holds the sandbox's lifecycle lock.
    pub(super) async fn resume_locked(&self, h: &SandboxHandle) -> Result<Sandbox> {
        if h.state() == SandboxState::Running {
            return Ok(h.snapshot());
        }
        h.enter_if(SandboxState::Resuming, "", |now| match now.state {
            SandboxState::Paused => Ok(()),
            other => Err(lifecycle::refuse(
                h.id,
                other,
                "ResumeSandbox",
                &[SandboxState::Paused, SandboxState::Running],
            )),
        })?;
        if !self.backend.pauses_in_place() {
            return match self.revive(h).await {
                Ok(client) => {
                    h.set_executor(client);
                    h.touch();
                    h.enter(SandboxState::Running, "")?;
                    Ok(h.snapshot())
                }
                Err(e) => {
                    tracing::warn!(sandbox_id = %h.id, error = %e.chain(), "could not resume a sandbox");
                    h.enter(SandboxState::Paused, &format!("resume failed: {e}"))?;
                    Err(e)
                }
            };
        }
        if let Err(e) = self.backend.resume(h.id).await {
            tracing::warn!(sandbox_id = %h.id, error = %e.chain(), "could not resume a sandbox");
            h.enter(SandboxState::Paused, &format!("resume failed: {e}"))?;
            return Err(e);
        }
        // The old connection died of missed keepalives while frozen: connect afresh (the address may have
        // changed too, if the engine restarted the container meanwhile).
        let reached = reach_executor(
            self.backend.as_ref(),
            &self.config,
            h.id,
            &h.token,
            self.config.ready_timeout,
        )
        .await;
        match reached {
            Ok((client, _)) => {
                h.set_executor(client);
                h.touch();
                h.enter(SandboxState::Running, "")?;
                tracing::info!(sandbox_id = %h.id, "sandbox resumed");
                Ok(h.snapshot())
            }
            Err(e) => {
                // Thawed but silent: the health watch brings it back.
                h.enter(SandboxState::Unhealthy, &e.to_string())?;
                Err(e)
            }
        }
    }

    /// Resumes a PAUSED sandbox whose spec asks for it; anything else is left for the caller to judge.
    pub async fn auto_resume(&self, h: &Arc<SandboxHandle>) -> Result<()> {
        if h.state() == SandboxState::Paused && h.snapshot().expiry.auto_resume {
            self.resume_handle(h).await?;
        }
        Ok(())
    }

    /// The executor of a sandbox for a call that counts as activity (file calls): resumed first when it
    /// is PAUSED with auto_resume, FailedPrecondition when it is not RUNNING.
    pub async fn executor_for(&self, id: SandboxId) -> Result<ExecutorClient> {
        let h = self.registry.handle(id)?;
        self.auto_resume(&h).await?;
        let client = h.running_executor()?;
        h.touch();
        Ok(client)
    }
}
