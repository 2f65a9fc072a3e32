//! Pause, resume, and the reaper that applies each sandbox's idle timeout and maximum lifetime.

use std::sync::Arc;

use mentis_core::lifecycle;
use mentis_core::{Error, IdlePolicy, Result, Sandbox, SandboxId, SandboxState};

use super::Manager;
use super::handle::SandboxHandle;
use crate::executor_client::ExecutorClient;

impl Manager {
    /// Freezes a RUNNING sandbox. Idempotent for a PAUSED one. FailedPrecondition while actions run (their
    /// streams would not survive the freeze) or in any other state.
    pub async fn pause(self: &Arc<Self>, id: SandboxId) -> Result<Sandbox> {
        self.pause_with_reason(id, "paused by a client").await
    }

    pub(super) async fn pause_with_reason(
        self: &Arc<Self>,
        id: SandboxId,
        reason: &str,
    ) -> Result<Sandbox> {
        let h = self.handle(id)?;
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
                n => Err(Error::FailedPrecondition(format!(
                    "sandbox {id} has {n} running actions; cancel them or let them end before pausing"
                ))),
            }
        })?;
        if let Err(e) = self.backend.pause(id).await {
            tracing::warn!(sandbox_id = %id, error = %e, "could not pause a sandbox");
            h.enter(SandboxState::Running, &format!("pause failed: {e}"))?;
            return Err(e);
        }
        h.enter(SandboxState::Paused, reason)?;
        tracing::info!(sandbox_id = %id, reason, "sandbox paused");
        Ok(h.snapshot())
    }

    /// Thaws a PAUSED sandbox and waits for its executor. Idempotent for a RUNNING one.
    pub async fn resume(self: &Arc<Self>, id: SandboxId) -> Result<Sandbox> {
        let h = self.handle(id)?;
        self.resume_handle(&h).await
    }

    async fn resume_handle(&self, h: &Arc<SandboxHandle>) -> Result<Sandbox> {
        let _lifecycle = h.lifecycle.lock().await;
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
            tracing::warn!(sandbox_id = %h.id, error = %e, "could not resume a sandbox");
            h.enter(SandboxState::Paused, &format!("resume failed: {e}"))?;
            return Err(e);
        }
        // The old connection died of missed keepalives while frozen: connect afresh (the address may have
        // changed too, if the engine restarted the container meanwhile).
        let reached = super::reach_executor(
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
    pub(crate) async fn auto_resume(&self, h: &Arc<SandboxHandle>) -> Result<()> {
        if h.state() == SandboxState::Paused && h.snapshot().expiry.auto_resume {
            self.resume_handle(h).await?;
        }
        Ok(())
    }

    /// The executor of a sandbox for a call that counts as activity (file calls): resumed first when it
    /// is PAUSED with auto_resume, FailedPrecondition when it is not RUNNING.
    pub async fn executor_for(&self, id: SandboxId) -> Result<ExecutorClient> {
        let h = self.handle(id)?;
        self.auto_resume(&h).await?;
        let client = h.running_executor()?;
        h.touch();
        Ok(client)
    }

    /// Until shutdown: every reaper interval, deletes sandboxes past their maximum lifetime and applies the
    /// idle policy to RUNNING sandboxes idle for their idle timeout (with no action running).
    pub(super) fn spawn_reaper(self: &Arc<Self>) {
        let this = Arc::clone(self);
        self.tasks.spawn(async move {
            loop {
                tokio::select! {
                    () = this.shutdown.cancelled() => return,
                    () = tokio::time::sleep(this.config.reaper_interval) => {}
                }
                this.reap().await;
            }
        });
    }

    async fn reap(self: &Arc<Self>) {
        let now = crate::clock::now();
        for h in self.handles() {
            let s = h.snapshot();
            if s.state.is_final() || s.state == SandboxState::Terminating {
                continue;
            }
            let age = now.duration_since(s.created_at).unwrap_or_default();
            if !s.expiry.max_lifetime.is_zero() && age >= s.expiry.max_lifetime {
                tracing::info!(sandbox_id = %s.id, "maximum lifetime reached");
                if let Err(e) = self
                    .delete_with_reason(s.id, "expired: maximum lifetime reached")
                    .await
                {
                    tracing::warn!(sandbox_id = %s.id, error = %e, "could not delete an expired sandbox");
                }
                continue;
            }
            let idle = now.duration_since(s.last_activity).unwrap_or_default();
            if s.state != SandboxState::Running
                || s.expiry.idle_timeout.is_zero()
                || idle < s.expiry.idle_timeout
                || h.running_actions() > 0
            {
                continue;
            }
            let result = match s.expiry.idle_policy {
                IdlePolicy::Keep => Ok(()),
                IdlePolicy::Pause => self
                    .pause_with_reason(s.id, "idle timeout")
                    .await
                    .map(|_| ()),
                IdlePolicy::Delete => self.delete_with_reason(s.id, "expired: idle timeout").await,
            };
            if let Err(e) = result {
                tracing::debug!(sandbox_id = %s.id, error = %e, "idle policy not applied this round");
            }
        }
    }
}
