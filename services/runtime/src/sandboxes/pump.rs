//! The action pump: one task per accepted action that starts it on the executor and copies its events into
//! the sandbox's log. Whatever happens (executor gone, stream broken, sandbox deleted) it writes exactly one
//! terminal observation: the executor's own, or a synthesized LOST/ABORTED one.

use std::sync::Arc;
use std::time::Duration;

use mentis_core::observation::ActionKind;
use mentis_core::{Action, ActionId, Error, ObservationKind};
use tokio::sync::oneshot;
use tokio::time::Instant;

/// How long after a shell action's timeout the control plane stops waiting for the executor's end.
const DEADLINE_GRACE: Duration = Duration::from_secs(30);

use super::handle::SandboxHandle;
use crate::convert::kind_from_executor;
use crate::executor_client::ExecutorClient;

/// Runs one action to its terminal observation. `accepted` learns whether the executor took it; until then
/// nothing is written to the log, so a refused action leaves no trace.
pub(super) async fn pump(
    h: Arc<SandboxHandle>,
    client: ExecutorClient,
    id: ActionId,
    action: Action,
    accepted: oneshot::Sender<Result<(), Error>>,
) {
    let started = Instant::now();
    let kind = ActionKind::from(&action);
    let run = tokio::select! {
        r = client.run(&id, &action, &h.env) => r,
        () = h.cancel.cancelled() => Err(Error::unavailable("the sandbox is being deleted")),
    };
    let mut stream = match run {
        Ok(s) => s,
        Err(e) => {
            h.unreserve_action(&id);
            let _ = accepted.send(Err(e));
            return;
        }
    };
    // The submitter may have gone away; the action runs (and is logged) regardless.
    let _ = accepted.send(Ok(()));
    // The executor ends a shell action at its timeout; if no end arrives well after that, the executor is
    // unreachable in a way the connection has not noticed (yet). Cells wait in the kernel's queue for an
    // unknown time before their timeout starts, so for them the connection's keepalive is the guard.
    let deadline = match &action {
        Action::Shell(s) => started + s.timeout + DEADLINE_GRACE,
        Action::IPython(_) => started + Duration::from_secs(365 * 24 * 3600),
    };

    let lost_reason = loop {
        tokio::select! {
            biased;
            () = h.cancel.cancelled() => break "the sandbox was deleted while the action ran".to_owned(),
            () = tokio::time::sleep_until(deadline) => {
                break "the action's timeout passed without an end from the executor".to_owned();
            }
            msg = stream.message() => match msg {
                Ok(Some(ev)) => match kind_from_executor(ev.kind) {
                    Ok(k) => {
                        let terminal = k.is_terminal();
                        // Sandbox-level events (a kernel restart) seen during the action belong to no action.
                        let owner = (!matches!(k, ObservationKind::AgentState { .. })).then(|| id.clone());
                        h.log.append(owner, k);
                        if terminal {
                            h.finish_action(&id);
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(action_id = %id, error = %e.chain(), "dropped a malformed executor event"),
                },
                Ok(None) => break "the executor ended the action's stream without a terminal event".to_owned(),
                Err(status) => {
                    tracing::warn!(action_id = %id, %status, "lost the executor stream");
                    break format!("lost the connection to the executor: {}", status.message());
                }
            },
        }
    };
    h.log.append(
        Some(id.clone()),
        ObservationKind::lost(kind, &lost_reason, started.elapsed()),
    );
    h.finish_action(&id);
}
