//! The health watch of one sandbox: a periodic check of its executor. Two failed checks in a row make the
//! sandbox UNHEALTHY (with an agent_state observation); the watch then brings the executor back — starting
//! its container again when it stopped, reconnecting when its address changed — and the sandbox is RUNNING
//! again (another agent_state). A container that is gone for good makes the sandbox TERMINATED.

use std::sync::Arc;
use std::time::Duration;

use mentis_core::{Error, SandboxBackend, SandboxState};

use super::handle::SandboxHandle;
use crate::config::RuntimeConfig;

/// Failed checks in a row before a sandbox is UNHEALTHY (one miss can be a hiccup).
const FAILURES_BEFORE_UNHEALTHY: u32 = 2;
/// Upper bound of one health check.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Watches `h` until it is deleted.
pub(super) async fn watch(
    h: Arc<SandboxHandle>,
    backend: Arc<dyn SandboxBackend>,
    config: Arc<RuntimeConfig>,
) {
    let mut failures = 0u32;
    loop {
        tokio::select! {
            () = h.cancel.cancelled() => return,
            () = tokio::time::sleep(config.health_interval) => {}
        }
        let state = h.state();
        if !matches!(state, SandboxState::Running | SandboxState::Unhealthy) {
            continue;
        }
        let Some(client) = h.executor() else { continue };
        let checked = tokio::select! {
            () = h.cancel.cancelled() => return,
            r = client.check(CHECK_TIMEOUT) => r,
        };
        match checked {
            Ok(()) => {
                failures = 0;
                if h.transition(&[SandboxState::Unhealthy], SandboxState::Running, "") {
                    tracing::info!("executor answers again");
                    h.agent_state("executor reachable again", &[("state", "RUNNING")]);
                }
            }
            Err(e) => {
                failures += 1;
                if failures >= FAILURES_BEFORE_UNHEALTHY
                    && h.transition(
                        &[SandboxState::Running],
                        SandboxState::Unhealthy,
                        e.to_string(),
                    )
                {
                    tracing::warn!(error = %e, "executor unreachable");
                    h.agent_state(
                        "executor unreachable",
                        &[("state", "UNHEALTHY"), ("reason", &e.to_string())],
                    );
                }
                if h.state() == SandboxState::Unhealthy {
                    let recovered = tokio::select! {
                        () = h.cancel.cancelled() => return,
                        r = recover(&h, backend.as_ref(), &config) => r,
                    };
                    match recovered {
                        Ok(()) => failures = 0,
                        Err(Error::NotFound(reason)) => {
                            if h.transition(
                                &[SandboxState::Unhealthy],
                                SandboxState::Terminated,
                                reason.clone(),
                            ) {
                                tracing::warn!(%reason, "sandbox gone");
                                h.agent_state(
                                    "sandbox gone",
                                    &[("state", "TERMINATED"), ("reason", &reason)],
                                );
                                end_gone(&h, backend.as_ref()).await;
                            }
                            return;
                        }
                        Err(e) => tracing::debug!(error = %e, "executor not back yet"),
                    }
                }
            }
        }
    }
}

/// A sandbox whose container vanished: its running actions end LOST, its leftovers (the workspace volume)
/// go, and its log closes once the pumps have written their terminals.
async fn end_gone(h: &Arc<SandboxHandle>, backend: &dyn SandboxBackend) {
    if let Err(e) = backend.delete(h.id).await {
        tracing::warn!(error = %e, "could not remove the leftovers of a vanished sandbox");
    }
    h.cancel.cancel();
    h.tasks.close();
    // This watch is one of the tasks: wait for the others from outside.
    let h = Arc::clone(h);
    tokio::spawn(async move {
        let _ = tokio::time::timeout(Duration::from_secs(10), h.tasks.wait()).await;
        h.log.close();
    });
}

/// Brings the executor back: its container running, a client for its (possibly new) address, healthy.
async fn recover(
    h: &SandboxHandle,
    backend: &dyn SandboxBackend,
    config: &RuntimeConfig,
) -> Result<(), Error> {
    let (client, endpoint) =
        super::reach_executor(backend, config, h.id, &h.token, config.ready_timeout).await?;
    h.set_executor(client);
    if h.transition(&[SandboxState::Unhealthy], SandboxState::Running, "") {
        tracing::info!(endpoint = %endpoint.uri, "executor recovered");
        h.agent_state(
            "executor recovered",
            &[("state", "RUNNING"), ("endpoint", &endpoint.uri)],
        );
    }
    Ok(())
}
