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
use super::reach::reach_executor;
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
        if let Err(e) = self.backend.pause(id).await {
            tracing::warn!(sandbox_id = %id, error = %e.chain(), "could not pause a sandbox");
            h.enter(SandboxState::Running, &format!("pause failed: {e}"))?;
            return Err(e);
        }
        h.enter(SandboxState::Paused, reason)?;
        tracing::info!(sandbox_id = %id, reason, "sandbox paused");
        Ok(h.snapshot())
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
