//! Action dispatch: turns a validated spec into a running task of the right kind (a shell command, or an
//! IPython cell queued for the kernel), routes Cancel / WriteStdin to running actions, and hands kernel
//! control (reset, inspect) to the IPython side.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::Config;
use crate::error::Error;
use crate::events::{Hold, Outbox, Outboxes};
use crate::ipython::{CellSpec, IPython};
use crate::reclaim::Processes;
use crate::registry::Registry;
use crate::shell::session::Sessions;
use crate::shell::stdin::{STDIN_QUEUE, StdinWrite};
use crate::shell::{self, ShellContext, ShellSpec};

/// A validated action, by kind.
#[derive(Debug, Clone)]
pub(crate) enum ActionSpec {
    Shell(ShellSpec),
    IPython(CellSpec),
}

/// The executor's running work: owns every action task and the registry that finds them.
pub(crate) struct Actions {
    registry: Arc<Registry>,
    tracker: TaskTracker,
    /// Cancelled when the executor shuts down; every action's token is a child of it.
    shutdown: CancellationToken,
    workspace: Arc<Path>,
    ipython: IPython,
    /// What the executor started, for reclaiming the pids limit.
    processes: Arc<Processes>,
    /// Every action's events until they are handed over.
    outboxes: Outboxes,
    /// Persistent shell sessions, by name.
    sessions: Sessions,
}

impl Actions {
    /// The pids ListProcesses names: this executor's and the running kernel's.
    pub(crate) fn roles(&self) -> crate::processes::Roles {
        crate::processes::Roles {
            executor: std::process::id().cast_signed(),
            kernel: self.processes.kernel(),
        }
    }

    pub(crate) fn new(config: &Config, shutdown: CancellationToken) -> Self {
        let tracker = TaskTracker::new();
        let processes = Processes::new(config.reclaim_all);
        let ipython = IPython::new(
            config,
            tracker.clone(),
            shutdown.clone(),
            Arc::clone(&processes),
        );
        if config.kernel.eager {
            ipython.start_eagerly();
        }
        Self {
            registry: Registry::new(config.max_actions),
            tracker,
            shutdown,
            workspace: Arc::from(config.workspace.as_path()),
            ipython,
            processes,
            outboxes: Outboxes::default(),
            sessions: Sessions::default(),
        }
    }

    /// Starts an action; its events go to the returned outbox, the terminal one last, and stay there as
    /// `hold` says.
    pub(crate) fn start(
        &self,
        action_id: String,
        spec: ActionSpec,
        hold: Hold,
    ) -> Result<Arc<Outbox>, Error> {
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        match spec {
            ActionSpec::Shell(spec) => self.start_shell(action_id, spec, hold),
            ActionSpec::IPython(spec) => {
                self.ipython
                    .submit(action_id, spec, &self.registry, &self.outboxes, hold)
            }
        }
    }

    /// The outbox of an action started earlier (running, or ended with events not yet acknowledged).
    pub(crate) fn outbox(&self, action_id: &str) -> Result<Arc<Outbox>, Error> {
        self.outboxes.get(action_id)
    }

    /// Forgets an action's outbox once everything in it was handed over.
    pub(crate) fn release_if_done(&self, action_id: &str, outbox: &Arc<Outbox>) {
        self.outboxes.release_if_done(action_id, outbox);
    }

    /// Replaces the kernel with a fresh one (ResetKernel).
    pub(crate) async fn reset_kernel(&self) -> Result<(), Error> {
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        self.ipython.reset().await
    }

    /// Summarises kernel variables between cells (InspectVariables): the helper's JSON answer.
    pub(crate) async fn inspect_variables(
        &self,
        names: Vec<String>,
    ) -> Result<serde_json::Value, Error> {
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        self.ipython.inspect(names).await
    }

    fn start_shell(
        &self,
        action_id: String,
        spec: ShellSpec,
        hold: Hold,
    ) -> Result<Arc<Outbox>, Error> {
        let session = match &spec.action.session {
            Some(name) => Some(self.sessions.get_or_open(name)?),
            None => None,
        };
        let cancel = self.shutdown.child_token();
        let (stdin_tx, stdin_rx) = if spec.action.keep_stdin_open {
            let (tx, rx) = mpsc::channel(STDIN_QUEUE);
            (Some(tx), Some(rx))
        } else {
            (None, None)
        };
        let registration = self
            .registry
            .register(&action_id, cancel.clone(), stdin_tx)?;
        let (sink, outbox) = self.outboxes.open(&action_id, hold)?;
        let ctx = ShellContext {
            workspace: Arc::clone(&self.workspace),
            cancel,
            shutdown: self.shutdown.clone(),
            tracker: self.tracker.clone(),
            stdin_writes: stdin_rx,
            processes: Arc::clone(&self.processes),
            session,
        };
        let span = tracing::info_span!(
            "shell_action",
            action_id = %action_id,
            kind = "shell",
            exit_code = tracing::field::Empty,
            reason = tracing::field::Empty,
        );
        self.tracker
            .spawn(shell::run(spec, ctx, sink, registration).instrument(span));
        Ok(outbox)
    }

    /// Kills a running shell action (its stream then ends with CANCELLED), interrupts a running cell or
    /// drops a queued one (ABORTED).
    pub(crate) fn cancel(&self, action_id: &str) -> Result<(), Error> {
        self.registry.cancel(action_id)
    }

    /// Writes to a running action's stdin; returns once the bytes are in the pipe.
    pub(crate) async fn write_stdin(
        &self,
        action_id: &str,
        data: Bytes,
        eof: bool,
    ) -> Result<(), Error> {
        let queue = self.registry.stdin(action_id, eof)?;
        let closed = |detail: &str| {
            Error::FailedPrecondition(format!("stdin of action {action_id:?} is closed{detail}"))
        };
        let (done, answer) = oneshot::channel();
        queue
            .send(StdinWrite { data, eof, done })
            .await
            .map_err(|_| closed(""))?;
        match answer.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(closed(&format!(": {e}"))),
            // The feeder stopped (the command exited) before taking this write.
            Err(_) => Err(closed("")),
        }
    }

    /// Kills every running action and the kernel (running and queued cells end ABORTED) and waits
    /// (bounded) for their tasks to finish.
    pub(crate) async fn shutdown(&self, grace: Duration) {
        self.shutdown.cancel();
        self.tracker.close();
        if tokio::time::timeout(grace, self.tracker.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                tasks = self.tracker.len(),
                "action tasks still running after the shutdown grace"
            );
        }
    }
}
