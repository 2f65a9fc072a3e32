//! IPython actions: one Jupyter kernel per executor, cells run one at a time in submission order (later
//! ones wait in a bounded line), kernel death and reset handled, variables inspected between cells.
//!
//! The kernel itself is the resource passed along the line ([`turnstile`]): whoever holds the turn (a
//! cell, InspectVariables, ResetKernel, the eager start) has it alone, so nothing ever runs beside a cell.

mod cell;
mod control;
mod kernel;
mod output;
mod process;
mod rollback;
mod turnstile;
mod wire;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use mentis_model::{IPythonAction, IPythonResult, ObservationKind};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::Config;
use crate::error::Error;
use crate::events::{EventSink, Hold, Outbox, Outboxes};
use crate::reclaim::Processes;
use crate::registry::{Registration, Registry};
use cell::{Outcome, Replace, SHUTDOWN_REASON, Signals};
use kernel::{Kernel, KernelSetup};
use turnstile::{Place, Ticket, Turn, Turnstile};

/// Bound on giving a kernel the sandbox env before a cell.
const ENV_SYNC_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on a kernel's answer on both sockets after a cell that ended without its reply or idle.
const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// A validated IPython action, and the sandbox env it runs under.
#[derive(Debug, Clone)]
pub(crate) struct CellSpec {
    pub(crate) action: IPythonAction,
    /// The sandbox env; a kernel started for this cell gets it over the executor's env.
    pub(crate) sandbox_env: HashMap<String, String>,
}

/// The kernel slot handed along the line: None until started, and after a reset killed it.
type Slot = Option<Kernel>;

/// The executor's IPython side. Cheap to clone.
#[derive(Clone)]
pub(crate) struct IPython(Arc<Shared>);

struct Shared {
    line: Arc<Turnstile<Slot>>,
    python: PathBuf,
    workspace: Arc<Path>,
    start_timeout: Duration,
    interrupt_grace: Duration,
    inspect_wait: Duration,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    /// The reset signal of the cell holding the turn, if a cell holds it.
    running: Mutex<Option<CancellationToken>>,
    /// The sandbox env of the latest cell: kernels started for restarts and resets get it too.
    env: Mutex<HashMap<String, String>>,
    /// Starts kernels, reclaiming the pids limit when it is full.
    processes: Arc<Processes>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // Critical sections are single assignments; a panic cannot leave them half done.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl IPython {
    pub(crate) fn new(
        config: &Config,
        tracker: TaskTracker,
        shutdown: CancellationToken,
        processes: Arc<Processes>,
    ) -> Self {
        let kernel = &config.kernel;
        Self(Arc::new(Shared {
            line: Turnstile::new(None, kernel.queue_limit),
            python: kernel.python.clone(),
            workspace: Arc::from(config.workspace.as_path()),
            start_timeout: kernel.start_timeout,
            interrupt_grace: kernel.interrupt_grace,
            inspect_wait: kernel.inspect_wait,
            tracker,
            shutdown,
            running: Mutex::new(None),
            env: Mutex::new(HashMap::new()),
            processes,
        }))
    }

    /// Starts the kernel now (MENTIS_KERNEL_EAGER), ahead of any cell; it has only the executor's env.
    pub(crate) fn start_eagerly(&self) {
        let shared = Arc::clone(&self.0);
        let Ok(mut ticket) = shared.line.enqueue(Place::Front, false) else {
            return;
        };
        let task = async move {
            let mut turn = tokio::select! {
                turn = ticket.wait() => turn,
                () = shared.shutdown.cancelled() => return,
            };
            if turn.is_none() {
                match shared.start_kernel().await {
                    Ok(kernel) => *turn = Some(kernel),
                    Err(e) => {
                        tracing::warn!(error = %e, "starting the kernel early failed; the first cell tries again")
                    }
                }
            }
        };
        self.0
            .tracker
            .spawn(task.instrument(tracing::info_span!("kernel_eager_start")));
    }

    /// Queues a cell; its events arrive on the returned channel (`ipython_start` once it runs).
    pub(crate) fn submit(
        &self,
        action_id: String,
        spec: CellSpec,
        registry: &Arc<Registry>,
        outboxes: &Outboxes,
        hold: Hold,
    ) -> Result<Arc<Outbox>, Error> {
        let shared = &self.0;
        let cancel = shared.shutdown.child_token();
        let registration = registry.register_cell(&action_id, cancel.clone())?;
        // The place in line is taken here, inside the Run call: submission order is run order.
        let ticket = shared
            .line
            .enqueue(Place::Back, true)
            .map_err(|full| Error::QueueFull { limit: full.limit })?;
        let (sink, outbox) = outboxes.open(&action_id, hold)?;
        let span = tracing::info_span!(
            "ipython_cell",
            action_id = %action_id,
            kind = "ipython",
            status = tracing::field::Empty,
            reason = tracing::field::Empty,
            execution_count = tracing::field::Empty,
        );
        shared.tracker.spawn(
            Arc::clone(shared)
                .cell(ticket, spec, cancel, sink, registration)
                .instrument(span),
        );
        Ok(outbox)
    }
}

impl Shared {
    /// The whole life of one cell: wait for the turn, run, roll back, replace the kernel if needed, end.
    async fn cell(
        self: Arc<Self>,
        mut ticket: Ticket<Slot>,
        spec: CellSpec,
        cancel: CancellationToken,
        mut sink: EventSink,
        registration: Registration,
    ) {
        let turn = tokio::select! {
            biased;
            () = cancel.cancelled() => None,
            turn = ticket.wait() => Some(turn),
        };
        // Leaves the line if the turn never came (a no-op otherwise).
        drop(ticket);
        let result = match turn {
            None => IPythonResult::aborted(
                if self.shutdown.is_cancelled() {
                    SHUTDOWN_REASON
                } else {
                    "cancelled before it started"
                },
                Duration::ZERO,
            ),
            Some(mut turn) => {
                let reset = CancellationToken::new();
                *lock(&self.running) = Some(reset.clone());
                *lock(&self.env) = spec.sandbox_env.clone();
                let result = self.run(&mut turn, &spec, &cancel, &reset, &mut sink).await;
                *lock(&self.running) = None;
                // The next cell may start while this one's result is still on its way to the reader.
                drop(turn);
                result
            }
        };
        tracing::info!(status = ?result.status, execution_count = result.execution_count, reason = %result.reason, "cell ended");
        // Free the id before the terminal event, as for shell actions.
        drop(registration);
        sink.send(ObservationKind::IPythonResult(result)).await;
    }

    async fn run(
        &self,
        turn: &mut Turn<Slot>,
        spec: &CellSpec,
        cancel: &CancellationToken,
        reset: &CancellationToken,
        sink: &mut EventSink,
    ) -> IPythonResult {
        // A kernel that died between cells is replaced first, and this cell's stream says so.
        if let Some(kernel) = turn.as_mut()
            && kernel.process.has_ended()
        {
            let exit = kernel.process.kill().await;
            self.replace(turn, Replace::Died(exit), "idle", sink).await;
        }
        if turn.is_none() {
            match self.start_kernel().await {
                Ok(kernel) => **turn = Some(kernel),
                Err(e) => {
                    return IPythonResult::aborted(
                        format!("cannot start the kernel: {e}"),
                        Duration::ZERO,
                    );
                }
            }
        }
        if cancel.is_cancelled() {
            let reason = if self.shutdown.is_cancelled() {
                SHUTDOWN_REASON
            } else {
                "cancelled before it started"
            };
            return IPythonResult::aborted(reason, Duration::ZERO);
        }
        // A cell that never reached the kernel (its shell socket refused it) ran nowhere: it goes once more,
        // to a fresh kernel.
        let mut resent = false;
        loop {
            let outcome = self.run_on(turn, spec, cancel, reset, sink).await;
            if outcome.unsent && !self.shutdown.is_cancelled() {
                self.replace(turn, Replace::Unreachable, "sending a cell", sink)
                    .await;
                if !resent && turn.is_some() {
                    resent = true;
                    continue;
                }
            }
            return outcome.result;
        }
    }

    /// Runs the cell on the kernel in `turn`; replaces the kernel afterwards when it must be.
    async fn run_on(
        &self,
        turn: &mut Turn<Slot>,
        spec: &CellSpec,
        cancel: &CancellationToken,
        reset: &CancellationToken,
        sink: &mut EventSink,
    ) -> Outcome {
        let Some(kernel) = turn.as_mut() else {
            return Outcome::aborted(
                "the kernel is not available".to_owned(),
                Duration::ZERO,
                None,
            );
        };
        // Processes killed to start this kernel (here, or earlier by a reset or the eager start) are told in
        // the stream of the first cell that runs on it.
        if let Some(reclaimed) = kernel.process.take_reclaimed() {
            sink.send(reclaimed.observation()).await;
        }
        // A kernel started ahead (eagerly, or for a warm pool member) or under another sandbox env gets
        // this cell's env before the cell runs.
        if kernel.env != spec.sandbox_env {
            let code = kernel::env_sync_code(&kernel.env, &spec.sandbox_env);
            match kernel.run_silent(&code, None, ENV_SYNC_TIMEOUT).await {
                Ok(reply) if kernel::status(&reply) == "ok" => {
                    kernel.env.clone_from(&spec.sandbox_env);
                }
                Ok(reply) => tracing::warn!(
                    error = %kernel::error_text(&reply),
                    "could not give the kernel the sandbox env"
                ),
                Err(e) => tracing::warn!(error = %e, "could not give the kernel the sandbox env"),
            }
        }
        let signals = Signals {
            cancel,
            shutdown: &self.shutdown,
            reset,
            timeout: spec.action.timeout,
            grace: self.interrupt_grace,
        };
        let mut outcome = cell::run(kernel, &spec.action.code, &signals, sink).await;
        if outcome.raised && spec.action.rollback_on_error && outcome.replace.is_none() {
            rollback::rollback(kernel, outcome.result.execution_count, sink).await;
        }
        // Without its reply or its idle the cell may have closed one of the kernel's sockets: a kernel that
        // no longer answers on both is replaced now, so the next cell does not wait on it until its timeout.
        if outcome.check_kernel && !kernel.answers(PROBE_TIMEOUT).await {
            outcome.replace = Some(Replace::Unreachable);
        }
        // (A cell that was not sent is the caller's to handle.)
        if let Some(replace) = outcome.replace
            && !outcome.unsent
            && !self.shutdown.is_cancelled()
        {
            self.replace(turn, replace, "running a cell", sink).await;
        }
        outcome
    }

    /// Kills the kernel in `slot` and, except for a reset (whose caller starts the new one next), starts a
    /// fresh one; tells the cell's stream with an `agent_state` (the control plane logs it sandbox-wide).
    async fn replace(
        &self,
        slot: &mut Turn<Slot>,
        why: Replace,
        during: &str,
        sink: &mut EventSink,
    ) {
        let mut details = BTreeMap::new();
        let reason = match why {
            Replace::Died(exit) => {
                exit.details(&mut details);
                "died"
            }
            Replace::Unresponsive => "unresponsive",
            Replace::Reset => "reset",
            Replace::Unreachable => "unreachable",
        };
        details.insert("reason".to_owned(), reason.to_owned());
        details.insert("while".to_owned(), during.to_owned());
        if let Some(mut old) = slot.take() {
            details.insert("old_pid".to_owned(), old.process.pid().to_string());
            old.process.kill().await;
        }
        tracing::warn!(reason, during, "replacing the kernel");
        let message = if why == Replace::Reset {
            "kernel restarted"
        } else {
            match self.start_kernel().await {
                Ok(mut kernel) => {
                    details.insert("pid".to_owned(), kernel.process.pid().to_string());
                    if let Some(reclaimed) = kernel.process.take_reclaimed() {
                        sink.send(reclaimed.observation()).await;
                    }
                    **slot = Some(kernel);
                    "kernel restarted"
                }
                Err(e) => {
                    // The next cell tries again.
                    details.insert("error".to_owned(), e);
                    "kernel restart failed"
                }
            }
        };
        sink.send(ObservationKind::AgentState {
            message: message.to_owned(),
            details,
        })
        .await;
    }

    async fn start_kernel(&self) -> Result<Kernel, String> {
        let env = lock(&self.env).clone();
        let setup = KernelSetup {
            python: &self.python,
            workspace: &self.workspace,
            start_timeout: self.start_timeout,
            tracker: &self.tracker,
            shutdown: &self.shutdown,
            processes: &self.processes,
        };
        Kernel::start(&setup, &env)
            .instrument(tracing::info_span!("kernel_start"))
            .await
    }

    async fn turn_or_shutdown(&self, ticket: &mut Ticket<Slot>) -> Result<Turn<Slot>, Error> {
        tokio::select! {
            biased;
            () = self.shutdown.cancelled() => Err(Error::ShuttingDown),
            turn = ticket.wait() => Ok(turn),
        }
    }
}
