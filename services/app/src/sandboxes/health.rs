//! The health watch of one sandbox: a periodic check of its executor. The check is an open `grpc.health.v1`
//! Watch of the executor (opened again when it broke or the executor was reached anew): while it is open
//! and the executor last said SERVING, a check sends nothing, so a thousand idle sandboxes cost their
//! connections' keepalives and no calls; news on the watch (another status, its end) is checked at once.
//! Two failed checks in a row make the
//! sandbox UNHEALTHY; the watch then brings the executor back — starting its container again when it
//! stopped, reconnecting when its address changed, restarting the container when the executor runs but does
//! not answer for the ready timeout — and the sandbox is RUNNING again. A container that is
//! gone for good is ended as a delete would: TERMINATING, its actions LOST, then TERMINATED. Every move goes
//! through the lifecycle table, so a watch never undoes a pause, resume or delete that runs beside it. A
//! backend that follows its sandboxes (`SandboxBackend::follow`: a pod's watch) wakes the check of one
//! that went at once, and one failed check is then enough.

use std::sync::Arc;
use std::time::Duration;

use mentis_core::{Error, SandboxBackend, SandboxState};

use tokio_util::task::TaskTracker;
use tracing::Instrument;

use super::handle::SandboxHandle;
use super::reach::{reach_executor, ready_executor};
use crate::config::RuntimeConfig;
use crate::executor_client::{ExecutorClient, HealthWatch};

/// Failed checks in a row before a sandbox is UNHEALTHY (one miss can be a hiccup).
const FAILURES_BEFORE_UNHEALTHY: u32 = 2;
/// Upper bound of one health check.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Starts watching `h`, in a task the sandbox owns (it ends when the sandbox is deleted). The end of a
/// sandbox that is gone runs on `runtime` (the manager's tasks): it waits for the sandbox's own.
pub(super) fn spawn(
    h: &Arc<SandboxHandle>,
    backend: &Arc<dyn SandboxBackend>,
    config: &Arc<RuntimeConfig>,
    runtime: &TaskTracker,
) {
    h.tasks.spawn(
        watch(
            Arc::clone(h),
            Arc::clone(backend),
            Arc::clone(config),
            runtime.clone(),
        )
            .instrument(tracing::info_span!(target: mentis_telemetry::UNTRACED, parent: None, "health", sandbox_id = %h.id)),
    );
}

/// Watches `h` until it is deleted.
async fn watch(
    h: Arc<SandboxHandle>,
    backend: Arc<dyn SandboxBackend>,
    config: Arc<RuntimeConfig>,
    runtime: TaskTracker,
) {
    let mut failures = 0u32;
    let mut watch = Watch::default();
    loop {
        // The backend's word that the container or pod went: a failed check then counts as enough.
        let hinted = tokio::select! {
            () = h.cancel.cancelled() => return,
            () = tokio::time::sleep(config.health_interval) => false,
            () = h.gone_hint.notified() => true,
            () = watch.news() => false,
        };
        if !matches!(h.state(), SandboxState::Running | SandboxState::Unhealthy) {
            failures = 0;
            // Paused, stopped or being replaced: the next executor gets a watch of its own.
            watch.close();
            continue;
        }
        let Some(client) = h.executor() else { continue };
        let checked = tokio::select! {
            () = h.cancel.cancelled() => return,
            r = watch.check(&client, hinted) => r,
        };
        match checked {
            Ok(()) => {
                failures = 0;
                // What the Prometheus endpoint shows per sandbox, as of this check.
                if crate::metrics::export().is_some_and(crate::metrics::MetricsExport::per_sandbox)
                    && let Ok(usage) = client.usage().await
                {
                    h.set_usage(usage);
                }
                if let Some(relay) = crate::telemetry::relay() {
                    tokio::select! {
                        () = h.cancel.cancelled() => return,
                        () = relay.relay(&client, h.id) => {}
                    }
                }
                if h.state() == SandboxState::Unhealthy
                    && h.enter(SandboxState::Running, "").is_ok()
                {
                    tracing::info!("executor answers again");
                }
            }
            Err(e) => {
                failures = if hinted {
                    failures.max(FAILURES_BEFORE_UNHEALTHY)
                } else {
                    failures + 1
                };
                crate::metrics::metrics()
                    .executor_health_failures
                    .add(1, &[]);
                if failures >= FAILURES_BEFORE_UNHEALTHY
                    && h.state() == SandboxState::Running
                    && h.enter(SandboxState::Unhealthy, &e.to_string()).is_ok()
                {
                    tracing::warn!(error = %e.chain(), "executor unreachable");
                }
                if h.state() != SandboxState::Unhealthy {
                    continue;
                }
                let recovered = tokio::select! {
                    () = h.cancel.cancelled() => return,
                    r = recover(&h, backend.as_ref(), &config) => r,
                };
                match recovered {
                    Ok(()) => failures = 0,
                    Err(e @ Error::NotFound(_)) => {
                        end_gone(&h, backend, e.to_string(), &runtime).await;
                        return;
                    }
                    Err(e) => tracing::debug!(error = %e.chain(), "executor not back yet"),
                }
            }
        }
    }
}

/// The open health watch of a sandbox's executor, if any: open only while its executor last said SERVING
/// (anything else closes it).
#[derive(Default)]
struct Watch {
    open: Option<HealthWatch>,
}

impl Watch {
    /// Ok when the open watch is `client`'s (nothing is sent); else a new watch, whose first answer is the
    /// check. After the backend's word that the sandbox went (`hinted`), always a new one.
    async fn check(&mut self, client: &ExecutorClient, hinted: bool) -> Result<(), Error> {
        if !hinted && self.open.as_ref().is_some_and(|w| w.is_of(client)) {
            return Ok(());
        }
        self.close();
        self.open = Some(client.watch_health(CHECK_TIMEOUT).await?);
        Ok(())
    }

    /// Resolves when the open watch brings news; never while none is open. Anything but SERVING closes
    /// it (the executor may be shutting down: an open watch would hold up its graceful stop).
    async fn news(&mut self) {
        let Some(open) = self.open.as_mut() else {
            return std::future::pending().await;
        };
        if let Err(e) = open.changed().await {
            tracing::debug!(error = %e.chain(), "the executor's health watch brought news");
            self.close();
        }
    }

    fn close(&mut self) {
        self.open = None;
    }
}

/// A sandbox whose container vanished: TERMINATING (under the lifecycle lock, so a delete beside it waits),
/// its running actions end LOST, its leftovers (the workspace volume) go, then TERMINATED.
async fn end_gone(
    h: &Arc<SandboxHandle>,
    backend: Arc<dyn SandboxBackend>,
    reason: String,
    runtime: &TaskTracker,
) {
    let lifecycle = tokio::select! {
        () = h.cancel.cancelled() => return,
        g = Arc::clone(&h.lifecycle).lock_owned() => g,
    };
    if let Err(e) = h.enter(SandboxState::Terminating, &reason) {
        tracing::debug!(error = %e.chain(), "a vanished sandbox is already ending");
        return;
    }
    tracing::warn!(%reason, "sandbox gone");
    h.stop_tasks();
    // This watch is one of the sandbox's tasks: the rest waits for them from the runtime's.
    let h = Arc::clone(h);
    let span = tracing::info_span!(target: mentis_telemetry::UNTRACED, parent: None, "end of a vanished sandbox", sandbox_id = %h.id);
    runtime.spawn(
        async move {
            let _lifecycle = lifecycle;
            h.tasks_stopped().await;
            if let Err(e) = backend.delete(h.id).await {
                tracing::warn!(error = %e.chain(), "could not remove the leftovers of a vanished sandbox");
            }
            if let Err(e) = h.enter(SandboxState::Terminated, &reason) {
                tracing::warn!(error = %e.chain(), "could not end a vanished sandbox");
            }
        }
        .instrument(span),
    );
}

/// Brings the executor back: its container running, a client for its (possibly new) address, healthy.
async fn recover(
    h: &SandboxHandle,
    backend: &dyn SandboxBackend,
    config: &RuntimeConfig,
) -> Result<(), Error> {
    let (client, endpoint) = match reach_executor(
        backend,
        config,
        h.id,
        &h.token,
        config.ready_timeout,
    )
    .await
    {
        Ok(reached) => reached,
        // The container runs but its executor has not answered for the whole ready timeout (stopped by
        // a signal, wedged): start the container afresh. Its processes end (their actions end LOST, the
        // kernel's state is gone), the workspace stays.
        Err(Error::Unavailable(why)) => {
            tracing::warn!(%why, "the executor runs but does not answer: restarting its container");
            h.agent_state(
                "restarting the sandbox's container: its executor does not answer",
                &[("state", "UNHEALTHY"), ("reason", why.message())],
            );
            let endpoint = backend.restart(h.id).await?;
            let client = ready_executor(config, &endpoint, &h.token, config.ready_timeout).await?;
            (client, endpoint)
        }
        Err(e) => return Err(e),
    };
    h.set_executor(client);
    if h.enter(SandboxState::Running, "").is_ok() {
        tracing::info!(endpoint = %endpoint.uri, "executor recovered");
    }
    Ok(())
}
