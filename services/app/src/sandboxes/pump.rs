//! The action pump: one task per accepted action that starts it on the executor and copies its events into
//! the sandbox's log. The executor holds each event until the pump acknowledges it (once it is journaled),
//! so a broken stream is attached again after the last event the log holds, and a runtime that restarted
//! resumes every action that was running (`resume`). Whatever happens (executor restarted, sandbox deleted
//! or gone) it writes exactly one terminal observation: the executor's own, or a synthesized LOST one.
//! ARCHITECTURE.md, "Durability and restart".

use std::sync::Arc;
use std::time::Duration;

use mentis_core::observation::ActionKind;
use mentis_core::{Action, ActionId, Error, ObservationKind, Reason, Resource, SandboxState};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::handle::SandboxHandle;
use crate::executor_client::kind_from_wire;
use crate::executor_client::{Attached, ExecutorClient};
use crate::observations::Origin;

/// How long after a shell action's timeout the control plane stops waiting for the executor's end.
const DEADLINE_GRACE: Duration = Duration::from_secs(30);
/// Acknowledge after this many events (the executor holds 64 before the action waits), or at the tick.
const ACK_EVERY: u64 = 16;
const ACK_TICK: Duration = Duration::from_millis(100);
/// How long the executor has to close an ended action's stream once its end is acknowledged.
const FINAL_ACK: Duration = Duration::from_secs(5);
/// After a broken stream, how long a RUNNING sandbox's executor has to take the action back.
const REATTACH_PATIENCE: Duration = Duration::from_secs(10);
/// Cells wait in the kernel's line for an unknown time before their timeout starts: no deadline of ours.
const NO_DEADLINE: Duration = Duration::from_secs(365 * 24 * 3600);

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
    let attach = tokio::select! {
        r = client.attach_new(&id, &action, &h.env) => r,
        () = h.cancel.cancelled() => Err(Error::new(Reason::SandboxDeleting, "the sandbox is being deleted")
            .about(Resource::sandbox(h.id))),
    };
    let attached = match attach {
        Ok(a) => a,
        Err(e) => {
            h.unreserve_action(&id);
            let _ = accepted.send(Err(e));
            return;
        }
    };
    // The submitter may have gone away; the action runs (and is logged) regardless.
    let _ = accepted.send(Ok(()));
    let p = Pump {
        deadline: deadline(&action, started),
        kind: ActionKind::from(&action),
        started,
        h,
        id,
    };
    p.follow(Some(attached)).await;
}

/// Follows an action that was running when the runtime stopped: attaches again after the newest event the
/// log holds, and takes it to its end.
/// (Its shell timeout is the executor's to enforce: the pump sets no deadline of its own here.)
pub(super) async fn resume(h: Arc<SandboxHandle>, id: ActionId, kind: ActionKind) {
    let started = Instant::now();
    let p = Pump {
        deadline: started + NO_DEADLINE,
        kind,
        started,
        h,
        id,
    };
    p.follow(None).await;
}

/// The executor ends a shell action at its timeout; if no end arrives well after that, the executor is
/// unreachable in a way the connection has not noticed (yet). For cells the connection's keepalive is the
/// guard.
/// Why an action ends LOST when its sandbox ends under it: deleted, or gone (its container or pod vanished),
/// as the sandbox's state reason says.
fn ended_while_running(h: &SandboxHandle) -> String {
    let reason = h.snapshot().state_reason;
    if reason.is_empty() {
        "the sandbox was deleted while the action ran".to_owned()
    } else {
        format!("the sandbox ended while the action ran ({reason})")
    }
}

fn deadline(action: &Action, started: Instant) -> Instant {
    match action {
        Action::Shell(s) => started + s.timeout + DEADLINE_GRACE,
        Action::IPython(_) => started + NO_DEADLINE,
    }
}

struct Pump {
    h: Arc<SandboxHandle>,
    id: ActionId,
    kind: ActionKind,
    started: Instant,
    deadline: Instant,
}

impl Pump {
    async fn follow(self, mut attached: Option<Attached>) {
        let h = &self.h;
        let mut last = h.log.progress(&self.id);
        let mut unacked = 0u64;
        let mut tick = tokio::time::interval(ACK_TICK);
        let lost_reason = loop {
            let Some(a) = attached.as_mut() else {
                match self.attach_again(last).await {
                    Ok(a) => {
                        attached = Some(a);
                        continue;
                    }
                    Err(reason) => break reason,
                }
            };
            tokio::select! {
                biased;
                () = h.cancel.cancelled() => break ended_while_running(h),
                () = tokio::time::sleep_until(self.deadline) => {
                    break "the action's timeout passed without an end from the executor".to_owned();
                }
                msg = a.events.message() => match msg {
                    Ok(Some(response)) => {
                        let Some(ev) = response.event else { continue };
                        if ev.index <= last {
                            // Held by the log already (sent again after an attach).
                            continue;
                        }
                        if ev.index > last + 1 {
                            let dropped = ev.index - last - 1;
                            h.log.append(Some(self.id.clone()), ObservationKind::Error {
                                message: format!(
                                    "{dropped} events of this action were dropped by the executor: nobody \
                                     took them while the control plane was away"
                                ),
                                details: [("dropped_events".to_owned(), dropped.to_string())].into(),
                            });
                        }
                        last = ev.index;
                        match kind_from_wire(ev.kind) {
                            Ok(k) => {
                                let terminal = k.is_terminal();
                                // Sandbox-level events (a kernel restart) seen during the action belong to no
                                // action.
                                let owner = (!matches!(k, ObservationKind::AgentState { .. }))
                                    .then(|| self.id.clone());
                                let origin = Origin { action: self.id.clone(), index: ev.index };
                                if terminal {
                                    record_end(&k);
                                }
                                h.log.append_from(owner, k, Some(&origin));
                                if terminal {
                                    a.ack(last);
                                    h.finish_action(&self.id);
                                    // The executor ends the stream once it has the last ack, and then forgets
                                    // the action; dropping the stream before that could lose the ack.
                                    let _ = tokio::time::timeout(FINAL_ACK, a.events.message()).await;
                                    return;
                                }
                            }
                            Err(e) => tracing::warn!(action_id = %self.id, error = %e.chain(), "dropped a malformed executor event"),
                        }
                        unacked += 1;
                        if unacked >= ACK_EVERY {
                            a.ack(last);
                            unacked = 0;
                        }
                    }
                    Ok(None) => break "the executor ended the action's stream without a terminal event".to_owned(),
                    Err(status) => {
                        tracing::info!(action_id = %self.id, %status, "the executor stream broke; attaching again");
                        attached = None;
                        unacked = 0;
                    }
                },
                _ = tick.tick(), if unacked > 0 => {
                    a.ack(last);
                    unacked = 0;
                }
            }
        };
        let lost = ObservationKind::lost(self.kind, &lost_reason, self.started.elapsed());
        record_end(&lost);
        h.log.append(Some(self.id.clone()), lost);
        h.finish_action(&self.id);
    }

    /// Attaches to the action again after event `after`. While the sandbox is RUNNING its executor has
    /// [`REATTACH_PATIENCE`] to answer; while it is paused, unhealthy or being recovered, this waits for it.
    /// The reason the action is lost otherwise.
    async fn attach_again(&self, after: u64) -> Result<Attached, String> {
        let h = &self.h;
        let mut patience = REATTACH_PATIENCE;
        let mut delay = Duration::from_millis(50);
        let mut last_error = String::new();
        loop {
            let state = h.state();
            if state.is_final() || state == SandboxState::Terminating {
                return Err(format!(
                    "the sandbox ended ({state:?}) while the action ran"
                ));
            }
            let client = h.executor().filter(|_| state == SandboxState::Running);
            let round = Instant::now();
            let tried = client.is_some();
            if let Some(client) = client {
                let attempt = tokio::time::timeout(patience, client.attach_again(&self.id, after));
                tokio::select! {
                    biased;
                    () = h.cancel.cancelled() => {
                        return Err(ended_while_running(h));
                    }
                    r = attempt => match r {
                        Ok(Ok(a)) => return Ok(a),
                        Ok(Err(Error::NotFound(_))) => {
                            return Err("the executor restarted while the action ran: its end was not observed".to_owned());
                        }
                        Ok(Err(e)) => last_error = e.to_string(),
                        Err(_) => last_error = "the executor did not answer".to_owned(),
                    },
                }
            }
            tokio::select! {
                biased;
                () = h.cancel.cancelled() => return Err(ended_while_running(h)),
                () = tokio::time::sleep_until(self.deadline) => {
                    return Err("the action's timeout passed without an end from the executor".to_owned());
                }
                () = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(1));
            if tried {
                patience = patience.saturating_sub(round.elapsed());
                if patience.is_zero() {
                    return Err(format!("lost the connection to the executor: {last_error}"));
                }
            }
        }
    }
}

/// Counts an action's end by kind and reason, with its duration, and puts its outcome on its span
/// (`action`) when traces are on: exit code and reason of a command, status and reason of a cell.
pub(super) fn record_end(kind: &ObservationKind) {
    use crate::metrics::{kv, metrics};
    let (action, reason, took) = match kind {
        ObservationKind::CmdEnd(end) => ("shell", format!("{:?}", end.reason), end.duration),
        ObservationKind::IPythonResult(r) => ("ipython", format!("{:?}", r.status), r.duration),
        _ => return,
    };
    let attrs = [kv("kind", action), kv("reason", reason)];
    metrics().actions_ended.add(1, &attrs);
    metrics().action_duration.record(took.as_secs_f64(), &attrs);
    if !mentis_telemetry::traces_on() {
        return;
    }
    let span = tracing::Span::current();
    match kind {
        ObservationKind::CmdEnd(end) => {
            span.record("exit_code", end.exit_code);
            span.record("reason", tracing::field::debug(end.reason));
        }
        ObservationKind::IPythonResult(result) => {
            span.record("status", tracing::field::debug(result.status));
            span.record("reason", result.reason.as_str());
        }
        _ => {}
    }
}
