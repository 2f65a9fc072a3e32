//! One cell on the kernel: its execute_request, its iopub traffic forwarded as events while it runs, and
//! how it ended: reply + idle, an interrupt (timeout, cancel), the kernel's death, a reset or shutdown.
//!
//! Two futures run side by side, as for shell actions: `pump` reads the kernel and forwards outputs (it
//! may wait on a slow reader of the events), `control` watches the clock, the cancel and reset signals and
//! the kernel process, so a timeout or a death is acted on even while output waits.

mod result;

pub(crate) use result::{Outcome, Replace, SHUTDOWN_REASON};

use std::time::Duration;

use mentis_model::{IPythonOutput, IPythonOutputKind, ObservationKind};
use nix::sys::signal::Signal;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::kernel::Kernel;
use super::output::{self, MAX_CODE_ECHO, MAX_TEXT_PIECE};
use super::process::{Exit, KernelProcess};
use super::wire::{Incoming, Wire};
use crate::cgroup::Cgroup;
use crate::events::EventSink;
use result::{Control, Pumped, Stop, count, outcome};

/// What a running cell reacts to.
pub(crate) struct Signals<'a> {
    /// Cancel (and, as its parent, executor shutdown).
    pub(crate) cancel: &'a CancellationToken,
    pub(crate) shutdown: &'a CancellationToken,
    /// ResetKernel while this cell runs.
    pub(crate) reset: &'a CancellationToken,
    pub(crate) timeout: Duration,
    /// After an interrupt, how long the kernel may take to end the cell.
    pub(crate) grace: Duration,
}

/// After the cell's `idle` status, how long its reply may still take: both are sent by the kernel's one
/// thread, reply first, but on different sockets, so they may arrive in either order.
const REPLY_AFTER_IDLE: Duration = Duration::from_secs(2);
/// After the cell's reply, how long iopub may stay silent before the cell ends without its `idle` (user
/// code closed the kernel's iopub socket). Counted from the last iopub message: output still flowing to
/// a slow reader keeps the cell open.
const IDLE_AFTER_REPLY: Duration = Duration::from_secs(2);

async fn sleep_until_some(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// Runs `code` on `kernel` and forwards its events; the caller sends the terminal one.
pub(crate) async fn run(
    kernel: &mut Kernel,
    code: &str,
    signals: &Signals<'_>,
    sink: &mut EventSink,
) -> Outcome {
    let cgroup = Cgroup::get();
    let counters = cgroup.counters().await;
    let started = Instant::now();
    kernel.wire.discard_stale();
    let msg_id = match kernel.wire.execute(code, false, None).await {
        Ok(msg_id) => msg_id,
        Err(e) => {
            let mut outcome = Outcome::aborted(
                format!("cannot send the cell to the kernel: {e}"),
                started.elapsed(),
                Some(Replace::Unreachable),
            );
            outcome.unsent = true;
            return outcome;
        }
    };
    let finished = CancellationToken::new();
    let halt = CancellationToken::new();
    let Kernel { process, wire, .. } = kernel;
    let (control, pumped) = tokio::join!(
        control(
            process,
            signals,
            started + signals.timeout,
            &finished,
            &halt
        ),
        pump(wire, &msg_id, code, sink, &finished, &halt),
    );
    tracing::debug!(?control, "cell ended");
    let duration = started.elapsed();
    // A kernel that died of SIGKILL while the OOM kill count rose was the OOM killer's victim (its score
    // makes it the first choice; best effort with concurrent shell commands, see `cgroup`).
    let oom = match control {
        Control::Died(_, Exit::Signal(signal)) if signal == Signal::SIGKILL as i32 => {
            let hits = cgroup.hits_since(counters).await;
            (hits.oom_kills > 0).then(|| hits.oom_text())
        }
        _ => None,
    };
    outcome(
        control,
        pumped,
        signals.timeout,
        signals.grace,
        duration,
        oom,
    )
}

async fn control(
    process: &mut KernelProcess,
    signals: &Signals<'_>,
    deadline: Instant,
    finished: &CancellationToken,
    halt: &CancellationToken,
) -> Control {
    // Biased: a cell that finished wins over a deadline passing at the same moment.
    let stop = tokio::select! {
        biased;
        () = finished.cancelled() => return Control::Done,
        exit = process.wait_exit() => {
            halt.cancel();
            return Control::Died(None, exit);
        }
        () = signals.reset.cancelled() => {
            process.kill().await;
            halt.cancel();
            return Control::Reset;
        }
        () = signals.cancel.cancelled() => {
            if signals.shutdown.is_cancelled() {
                process.kill().await;
                halt.cancel();
                return Control::ShutDown;
            }
            Stop::Cancelled
        }
        () = tokio::time::sleep_until(deadline) => Stop::TimedOut,
    };
    tracing::info!(?stop, "interrupting the kernel");
    process.interrupt();
    let grace_end = Instant::now() + signals.grace;
    tokio::select! {
        biased;
        () = finished.cancelled() => Control::Interrupted(stop),
        exit = process.wait_exit() => {
            halt.cancel();
            Control::Died(Some(stop), exit)
        }
        () = signals.reset.cancelled() => {
            process.kill().await;
            halt.cancel();
            Control::Reset
        }
        () = signals.shutdown.cancelled() => {
            process.kill().await;
            halt.cancel();
            Control::ShutDown
        }
        () = tokio::time::sleep_until(grace_end) => {
            tracing::warn!("the kernel ignored the interrupt; killing it");
            process.kill().await;
            halt.cancel();
            Control::Unresponsive(stop)
        }
    }
}

/// Reads the kernel until the cell's reply and its `idle` status have both arrived (or until halted),
/// forwarding the cell's outputs. Messages of other requests (earlier cells, helpers) are skipped.
async fn pump(
    wire: &mut Wire,
    msg_id: &str,
    code: &str,
    sink: &mut EventSink,
    finished: &CancellationToken,
    halt: &CancellationToken,
) -> Pumped {
    let mut pumped = Pumped::default();
    // When `idle` came first: how long the reply (on another socket) may still take.
    let mut reply_by = None;
    // The last iopub message and the reply's arrival: how long iopub has been silent since the reply.
    let mut last_iopub = Instant::now();
    let mut reply_at = Instant::now();
    while pumped.reply.is_none() || !pumped.idle {
        if pumped.idle && reply_by.is_none() {
            reply_by = Some(Instant::now() + REPLY_AFTER_IDLE);
        }
        let idle_by = (pumped.reply.is_some() && !pumped.idle)
            .then(|| last_iopub.max(reply_at) + IDLE_AFTER_REPLY);
        tokio::select! {
            // ipykernel went idle without answering: an interrupt that reached its message handler
            // before or after the user's code ("KeyboardInterrupt caught in kernel"), a handler that
            // failed, or a shell socket that user code closed. The kernel is alive and idle.
            () = sleep_until_some(reply_by) => {
                pumped.unanswered = true;
                break;
            }
            // Answered, and iopub went silent without the idle that always follows: user code closed
            // the iopub socket. The reply is the result.
            () = sleep_until_some(idle_by) => {
                pumped.idle_missing = true;
                break;
            }
            () = halt.cancelled() => {
                // Forward what had already arrived: the output written just before a death explains it.
                while let Ok(message) = wire.iopub.try_recv() {
                    if message.is_child_of(msg_id) {
                        forward(message, code, &mut pumped, sink).await;
                    }
                }
                break;
            }
            message = wire.iopub.recv() => match message {
                Some(message) if message.is_child_of(msg_id) => {
                    forward(message, code, &mut pumped, sink).await;
                    last_iopub = Instant::now();
                }
                Some(_) => last_iopub = Instant::now(),
                None => break,
            },
            reply = wire.replies.recv() => match reply {
                Some(reply) if reply.msg_type == "execute_reply" && reply.is_child_of(msg_id) => {
                    pumped.reply = Some(reply.content);
                    reply_at = Instant::now();
                }
                Some(_) => {}
                None => break,
            },
        }
    }
    finished.cancel();
    pumped
}

/// Turns one iopub message of the cell into events (or state).
async fn forward(message: Incoming, code: &str, pumped: &mut Pumped, sink: &mut EventSink) {
    let Incoming {
        msg_type, content, ..
    } = message;
    match msg_type.as_str() {
        "execute_input" => {
            pumped.execution_count = count(&content).unwrap_or(pumped.execution_count);
            start(pumped, code, sink).await;
        }
        "stream" => {
            start(pumped, code, sink).await;
            let kind = match content.get("name").and_then(Value::as_str) {
                Some("stderr") => IPythonOutputKind::Stderr,
                _ => IPythonOutputKind::Stdout,
            };
            let text = content.get("text").and_then(Value::as_str).unwrap_or("");
            // Piece by piece: a 50 MB print is never copied whole, and waits for the reader as it goes.
            for piece in output::pieces(text, MAX_TEXT_PIECE) {
                sink.send(ObservationKind::IPythonOutput(IPythonOutput {
                    kind,
                    text: piece.to_owned(),
                    data: Default::default(),
                    display_id: String::new(),
                }))
                .await;
            }
        }
        "display_data" | "execute_result" | "update_display_data" => {
            start(pumped, code, sink).await;
            let kind = match msg_type.as_str() {
                "display_data" => IPythonOutputKind::DisplayData,
                "execute_result" => IPythonOutputKind::ExecuteResult,
                _ => IPythonOutputKind::UpdateDisplayData,
            };
            let (output, dropped) = output::rich(kind, &content);
            if !dropped.is_empty() {
                sink.send(ObservationKind::Error {
                    message: format!(
                        "an output of the cell was too large; left out: {}",
                        dropped.join(", ")
                    ),
                    details: [("limit_bytes".to_owned(), output::MAX_BUNDLE.to_string())].into(),
                })
                .await;
            }
            sink.send(ObservationKind::IPythonOutput(output)).await;
        }
        "error" => pumped.error = Some(content),
        "status" if content.get("execution_state").and_then(Value::as_str) == Some("idle") => {
            pumped.idle = true;
        }
        // clear_output, comm messages, ...: nothing the API carries.
        _ => {}
    }
}

/// Sends `ipython_start` once, before the cell's first output.
async fn start(pumped: &mut Pumped, code: &str, sink: &mut EventSink) {
    if pumped.started {
        return;
    }
    pumped.started = true;
    sink.send(ObservationKind::IPythonStart {
        code: output::cut(code, MAX_CODE_ECHO),
        execution_count: pumped.execution_count,
    })
    .await;
}
