//! Terminals (TerminalService; docs/ARCHITECTURE.md, "A terminal"): a client's terminal stream passed on to
//! the sandbox's executor, which owns the terminal (its pty, scrollback and idle timer). The runtime
//! resumes a paused sandbox, adds the sandbox's env and its terminal policy to the first request, counts the
//! traffic as activity, and ends the stream when the sandbox is deleted.

use std::sync::Arc;

use futures::StreamExt as _;
use mentis_core::terminal::{TerminalInfo, TerminalInput, TerminalOutput, TerminalSettings};
use mentis_core::{Error, Reason, Result, SandboxId, SandboxState};
use tokio::sync::mpsc;

use super::handle::SandboxHandle;
use super::lifecycle::Lifecycle;
use super::registry::Registry;
use crate::config::TerminalPolicy;
use crate::executor_client::TerminalOutputs;

/// Client requests waiting for the executor.
const INBOUND: usize = 16;

/// Terminal calls on sandboxes.
pub(super) struct Terminals {
    registry: Arc<Registry>,
    lifecycle: Arc<Lifecycle>,
    policy: TerminalPolicy,
}

/// One open terminal stream: the client's requests go in with [`TerminalSession::send`], the terminal's
/// outputs come from [`TerminalSession::next`].
pub struct TerminalSession {
    handle: Arc<SandboxHandle>,
    to_executor: Option<mpsc::Sender<TerminalInput>>,
    outputs: TerminalOutputs,
}

impl std::fmt::Debug for TerminalSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalSession")
            .field("sandbox", &self.handle.id)
            .finish_non_exhaustive()
    }
}

impl TerminalSession {
    /// Whether the executor still takes requests (it stops once the program's end is on its way).
    pub fn takes_input(&self) -> bool {
        self.to_executor.is_some()
    }

    /// Passes a client's request on, as activity; a request after the executor stopped taking them is
    /// moot, and the stream goes on until `Exited` has been passed on.
    pub async fn send(&mut self, input: TerminalInput) {
        self.handle.touch();
        if let Some(to) = self.to_executor.as_ref()
            && to.send(input).await.is_err()
        {
            self.to_executor = None;
        }
    }

    /// The client closed its side: the terminal runs on and its output still comes.
    pub fn close_input(&mut self) {
        self.to_executor = None;
    }

    /// The terminal's next output (output counts as activity); `None` once `Exited` was passed on.
    /// SANDBOX_ENDED when the sandbox is deleted meanwhile.
    pub async fn next(&mut self) -> Result<Option<TerminalOutput>> {
        let out = tokio::select! {
            out = self.outputs.next() => out,
            () = self.handle.cancel.cancelled() => return Err(self.deleted()),
        };
        match out {
            Some(Ok(output)) => {
                if matches!(output, TerminalOutput::Output { .. }) {
                    self.handle.touch();
                }
                Ok(Some(output))
            }
            None => Ok(None),
            Some(Err(_)) if self.handle.cancel.is_cancelled() => Err(self.deleted()),
            Some(Err(e)) => Err(e),
        }
    }

    fn deleted(&self) -> Error {
        Error::new(
            Reason::SandboxEnded,
            format!("sandbox {} was deleted", self.handle.id),
        )
    }
}

impl Terminals {
    pub(super) fn new(
        registry: Arc<Registry>,
        lifecycle: Arc<Lifecycle>,
        policy: TerminalPolicy,
    ) -> Self {
        Self {
            registry,
            lifecycle,
            policy,
        }
    }

    /// Opens a terminal stream on `sandbox` with `first` (a start or an attach, checked by the caller).
    pub(super) async fn open(
        &self,
        sandbox: SandboxId,
        first: TerminalInput,
    ) -> Result<TerminalSession> {
        let handle = self.registry.handle(sandbox)?;
        let executor = self.lifecycle.executor_for(sandbox).await?;
        let settings = TerminalSettings {
            env: handle.env.clone(),
            max_terminals: u32::try_from(self.policy.max_per_sandbox).unwrap_or(u32::MAX),
            default_idle_timeout: self.policy.idle_timeout,
            scrollback_bytes: self.policy.scrollback_bytes as u64,
        };
        let (to_executor, requests) = mpsc::channel(INBOUND);
        let inputs = futures::stream::unfold(requests, |mut rx| async move {
            rx.recv().await.map(|request| (request, rx))
        });
        let outputs = executor.terminal(first, settings, inputs).await?;
        Ok(TerminalSession {
            handle,
            to_executor: Some(to_executor),
            outputs,
        })
    }

    /// Whether a web terminal link to `sandbox` (and `terminal`) can open: the sandbox opens terminals
    /// (RUNNING, or PAUSED with auto_resume, which the page's visit resumes), and a RUNNING one has
    /// `terminal` (a paused one is not woken to ask: its page's attach says TERMINAL_NOT_FOUND).
    pub(super) async fn check_link(
        &self,
        sandbox: SandboxId,
        terminal: Option<&str>,
    ) -> Result<()> {
        let handle = self.registry.handle(sandbox)?;
        let state = handle.state();
        if state == SandboxState::Paused && handle.snapshot().expiry.auto_resume {
            return Ok(());
        }
        let executor = handle.running_executor()?;
        let Some(terminal) = terminal else {
            return Ok(());
        };
        if executor
            .list_terminals()
            .await?
            .iter()
            .any(|t| t.terminal_id == terminal)
        {
            return Ok(());
        }
        Err(Error::new(
            Reason::TerminalNotFound,
            format!(
                "sandbox {sandbox} has no terminal {}",
                mentis_core::quoted(terminal)
            ),
        )
        .about(mentis_core::Resource::sandbox(sandbox)))
    }

    pub(super) async fn list(&self, sandbox: SandboxId) -> Result<Vec<TerminalInfo>> {
        let executor = self.lifecycle.executor_for(sandbox).await?;
        executor.list_terminals().await
    }

    pub(super) async fn close(&self, sandbox: SandboxId, terminal_id: &str) -> Result<()> {
        let executor = self.lifecycle.executor_for(sandbox).await?;
        executor
            .close_terminal(terminal_id)
            .await
            .map_err(|e| e.about(mentis_core::Resource::sandbox(sandbox)))
    }
}
