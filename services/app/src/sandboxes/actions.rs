//! Action routing: admitting a submission (or recognising its retry), starting its pump, and the calls on
//! running actions (cancel, stdin) and on the kernel (reset, inspect).

use std::sync::Arc;

use bytes::Bytes;
use mentis_core::{Action, ActionId, Error, Reason, Resource, Result, SandboxId};
use tokio::sync::oneshot;
use tracing::Instrument;

use super::handle::{ActionStatus, Reserved};
use super::lifecycle::Lifecycle;
use super::pump::pump;
use super::registry::Registry;
use crate::config::RuntimeConfig;

/// An accepted submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Submitted {
    pub id: ActionId,
    /// The action's observations have seqs above this.
    pub after_seq: u64,
    /// A retry of an earlier submission: nothing was run this time.
    pub resumed: bool,
}

/// Routes actions to their sandbox's executor.
pub struct Actions {
    registry: Arc<Registry>,
    lifecycle: Arc<Lifecycle>,
    config: Arc<RuntimeConfig>,
}

impl std::fmt::Debug for Actions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Actions").finish_non_exhaustive()
    }
}

impl Actions {
    pub fn new(
        registry: Arc<Registry>,
        lifecycle: Arc<Lifecycle>,
        config: Arc<RuntimeConfig>,
    ) -> Self {
        Self {
            registry,
            lifecycle,
            config,
        }
    }

    /// Accepts an action: the executor has it and its observations will follow in the log. A retry of an
    /// accepted submission (same client-chosen id, same action) is not run again. Returns the action's id,
    /// the seq after which its observations appear, and whether it was such a retry.
    pub async fn submit(
        &self,
        sandbox: SandboxId,
        action_id: Option<ActionId>,
        action: Action,
    ) -> Result<Submitted> {
        let h = self.registry.handle(sandbox)?;
        self.lifecycle.auto_resume(&h).await?;
        let id = action_id.unwrap_or_else(ActionId::generate);
        // Admitted only while RUNNING, under the lock a pause takes to leave RUNNING; a retry of a known
        // submission is answered from the log in any state.
        let after_seq = match h.reserve_action(
            &id,
            action.kind(),
            action.fingerprint(),
            self.config.max_actions_per_sandbox,
        )? {
            Reserved::Known { after_seq } => {
                return Ok(Submitted {
                    id,
                    after_seq,
                    resumed: true,
                });
            }
            Reserved::New { after_seq } => after_seq,
        };
        let Some(client) = h.executor() else {
            h.unreserve_action(&id);
            return Err(Error::internal(format!(
                "sandbox {sandbox} is RUNNING without an executor"
            )));
        };
        h.touch();
        // A sandbox made from a template with a work_dir starts its shell actions there, unless they name
        // a directory or run in a session (which keeps its own).
        let mut action = action;
        if let Action::Shell(shell) = &mut action
            && shell.work_dir.is_empty()
            && shell.session.is_none()
        {
            shell.work_dir = h.work_dir();
        }
        let (tx, rx) = oneshot::channel();
        let span = tracing::info_span!(
            "action",
            sandbox_id = %sandbox,
            action_id = %id,
            kind = action.kind_name(),
            exit_code = tracing::field::Empty,
            reason = tracing::field::Empty,
            status = tracing::field::Empty,
        );
        crate::metrics::metrics()
            .actions_started
            .add(1, &[crate::metrics::kv("kind", action.kind_name())]);
        h.tasks
            .spawn(pump(Arc::clone(&h), client, id.clone(), action, tx).instrument(span));
        match rx.await {
            Ok(Ok(())) => Ok(Submitted {
                id,
                after_seq,
                resumed: false,
            }),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Error::Internal(
                "the action task ended before answering".into(),
            )),
        }
    }

    /// Ok when the sandbox knows the action (running, or among the finished ones it remembers);
    /// ACTION_NOT_FOUND otherwise.
    pub fn require_action(&self, sandbox: SandboxId, action: &ActionId) -> Result<()> {
        match self.registry.handle(sandbox)?.action_status(action)? {
            ActionStatus::Unknown => Err(action_not_found(sandbox, action)),
            ActionStatus::Running | ActionStatus::Finished => Ok(()),
        }
    }

    /// Cancels a running action. A finished action is left as it is (cancel raced with its end).
    pub async fn cancel(&self, sandbox: SandboxId, action: &ActionId) -> Result<()> {
        let h = self.registry.handle(sandbox)?;
        match h.action_status(action)? {
            ActionStatus::Unknown => Err(action_not_found(sandbox, action)),
            ActionStatus::Finished => Ok(()),
            ActionStatus::Running => match h.running_executor()?.cancel(action).await {
                // It ended between our look and the executor's.
                Err(Error::NotFound(_)) => Ok(()),
                r => r,
            },
        }
    }

    /// Writes to a running action's stdin.
    pub async fn write_stdin(
        &self,
        sandbox: SandboxId,
        action: &ActionId,
        data: Bytes,
        eof: bool,
    ) -> Result<()> {
        let h = self.registry.handle(sandbox)?;
        match h.action_status(action)? {
            ActionStatus::Unknown => Err(action_not_found(sandbox, action)),
            ActionStatus::Finished => Err(Error::new(
                Reason::ActionEnded,
                format!("action {action} has ended"),
            )
            .about(Resource::action(action))
            .about(Resource::sandbox(sandbox))),
            ActionStatus::Running => h.running_executor()?.write_stdin(action, data, eof).await,
        }
    }

    /// Replaces a sandbox's kernel with a fresh one.
    pub async fn reset_kernel(&self, sandbox: SandboxId) -> Result<()> {
        self.registry
            .handle(sandbox)?
            .running_executor()?
            .reset_kernel()
            .await
    }

    /// Summarises variables of a sandbox's kernel.
    pub async fn inspect_variables(
        &self,
        sandbox: SandboxId,
        names: Vec<String>,
    ) -> Result<Vec<mentis_core::VariableSummary>> {
        mentis_core::kernel::validate_names(&names)?;
        let client = self.registry.handle(sandbox)?.running_executor()?;
        client.inspect_variables(names).await
    }
}

/// ACTION_NOT_FOUND for `action` in `sandbox`.
fn action_not_found(sandbox: SandboxId, action: &ActionId) -> Error {
    Error::new(
        Reason::ActionNotFound,
        format!("action {action} not found in sandbox {sandbox}"),
    )
    .about(Resource::action(action))
    .about(Resource::sandbox(sandbox))
}
