//! The reaper: every reaper interval, deletes sandboxes past their maximum lifetime and applies the idle
//! policy (pause, delete or keep) to RUNNING sandboxes idle for their idle timeout with no action running.
//! Times are on the runtime's clock (`crate::clock`).

use std::sync::Arc;
use std::time::Duration;

use mentis_core::{Cause, IdlePolicy, SandboxState};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::lifecycle::Lifecycle;
use super::provision::Provisioner;
use super::registry::Registry;

/// Runs the reaper until `shutdown`, in a task owned by `tasks`.
pub(super) fn spawn(
    tasks: &TaskTracker,
    shutdown: CancellationToken,
    every: Duration,
    registry: Arc<Registry>,
    lifecycle: Arc<Lifecycle>,
    provisioner: Arc<Provisioner>,
) {
    tasks.spawn(async move {
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = tokio::time::sleep(every) => {}
            }
            reap(&registry, &lifecycle, &provisioner).await;
        }
    });
}

async fn reap(registry: &Registry, lifecycle: &Lifecycle, provisioner: &Arc<Provisioner>) {
    let now = crate::clock::now();
    for h in registry.handles() {
        let s = h.snapshot();
        if s.state.is_final() || s.state == SandboxState::Terminating {
            continue;
        }
        let age = now.duration_since(s.created_at).unwrap_or_default();
        if !s.expiry.max_lifetime.is_zero() && age >= s.expiry.max_lifetime {
            tracing::info!(sandbox_id = %s.id, "maximum lifetime reached");
            if let Err(e) = provisioner
                .delete(
                    s.id,
                    "expired: maximum lifetime reached",
                    Some(Cause::MaxLifetime),
                )
                .await
            {
                tracing::warn!(sandbox_id = %s.id, error = %e.chain(), "could not delete an expired sandbox");
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
            IdlePolicy::Pause => lifecycle
                .pause(s.id, "idle timeout", Cause::IdleTimeout)
                .await
                .map(|_| ()),
            IdlePolicy::Delete => provisioner
                .delete(s.id, "expired: idle timeout", Some(Cause::IdleTimeout))
                .await
                .map(drop),
        };
        if let Err(e) = result {
            tracing::warn!(sandbox_id = %s.id, error = %e.chain(), "idle policy not applied this round");
        }
    }
}
