//! Reaching an executor: a client of the executor at an endpoint once it answers its health check, for a
//! new sandbox, a claimed pool member, a resumed or recovered one, and takeover after a restart.

use std::time::Duration;

use mentis_core::{Endpoint, Result, SandboxBackend, SandboxId};

use crate::config::RuntimeConfig;
use crate::executor_client::ExecutorClient;

/// A client of the executor at `endpoint`, once it answers its health check (within `within`).
pub(super) async fn ready_executor(
    config: &RuntimeConfig,
    endpoint: &Endpoint,
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

/// A client of a new sandbox's executor, once it answers (within `within`); fails sooner when the
/// sandbox's container stops meanwhile (an image that cannot run a sandbox), with the backend's reason.
pub(super) async fn ready_new_executor(
    backend: &dyn SandboxBackend,
    config: &RuntimeConfig,
    id: SandboxId,
    endpoint: &Endpoint,
    token: &str,
    within: Duration,
) -> Result<ExecutorClient> {
    let stopped = async {
        loop {
            tokio::time::sleep(STOPPED_POLL).await;
            match backend.why_stopped(id).await {
                Ok(Some(e)) => return e,
                Ok(None) => {}
                Err(e) => tracing::debug!(error = %e, "cannot tell whether the new container runs"),
            }
        }
    };
    tokio::select! {
        ready = ready_executor(config, endpoint, token, within) => ready,
        e = stopped => Err(e),
    }
}

/// How often a new sandbox's container is looked at while its executor is waited for.
const STOPPED_POLL: Duration = Duration::from_millis(500);

/// The executor of an existing sandbox (its container started again when it stopped), once it answers.
pub(super) async fn reach_executor(
    backend: &dyn SandboxBackend,
    config: &RuntimeConfig,
    id: SandboxId,
    token: &str,
    within: Duration,
) -> Result<(ExecutorClient, Endpoint)> {
    let endpoint = backend.ensure_running(id).await?;
    let client = ready_executor(config, &endpoint, token, within).await?;
    Ok((client, endpoint))
}
