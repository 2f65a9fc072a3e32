//! A template's start-up commands (docs/ARCHITECTURE.md, "Templates"): run in order in a new sandbox, as
//! shell actions of the sandbox user in the workspace with the sandbox's env, before it is handed out. The
//! first that does not exit 0 fails the create with its exit and the end of its output.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;
use mentis_core::{
    Action, ActionId, EndReason, Error, ObservationKind, Reason, Result, ShellAction, quoted,
};

use crate::executor_client::ExecutorClient;
use crate::executor_client::kind_from_wire;

/// Longest a start-up command may run (installing packages can take a while).
pub(crate) const SETUP_TIMEOUT: Duration = Duration::from_secs(600);
/// How much of a failed command's output its error quotes (the end of it).
const OUTPUT_TAIL: usize = 2000;

/// Runs `commands` of template `template` in order; the first that fails is FAILED_PRECONDITION.
pub(super) async fn run(
    client: &ExecutorClient,
    template: &str,
    commands: &[String],
    env: &BTreeMap<String, String>,
) -> Result<()> {
    for (i, command) in commands.iter().enumerate() {
        let action = Action::Shell(ShellAction {
            command: command.clone(),
            work_dir: String::new(),
            env: BTreeMap::new(),
            timeout: SETUP_TIMEOUT,
            stdin: Bytes::new(),
            keep_stdin_open: false,
            session: None,
        });
        let mut events = client.run(&ActionId::generate(), &action, env).await?;
        let mut output: Vec<u8> = Vec::new();
        let end = loop {
            let event = events.message().await.map_err(|s| {
                Error::new(
                    Reason::ExecutorUnavailable,
                    format!(
                        "the executor failed while running a start-up command: {}",
                        s.message()
                    ),
                )
            })?;
            let Some(event) = event else {
                return Err(Error::new(
                    Reason::ExecutorUnavailable,
                    "the executor ended a start-up command's stream before the command ended",
                ));
            };
            match kind_from_wire(event.kind)? {
                ObservationKind::CmdOutput { data, .. } => {
                    output.extend_from_slice(&data);
                    if output.len() > 2 * OUTPUT_TAIL {
                        output.drain(..output.len() - OUTPUT_TAIL);
                    }
                }
                ObservationKind::CmdEnd(end) => break end,
                _ => {}
            }
        };
        if end.reason == EndReason::Exited && end.exit_code == 0 {
            continue;
        }
        let tail = String::from_utf8_lossy(&output[output.len().saturating_sub(OUTPUT_TAIL)..])
            .trim()
            .to_owned();
        let how = match end.reason {
            EndReason::Exited => format!("exited with {}", end.exit_code),
            EndReason::TimedOut => format!("ran past {} s", SETUP_TIMEOUT.as_secs()),
            other => format!("ended {other:?}: {}", end.message),
        };
        return Err(Error::new(
            Reason::FailedPrecondition,
            format!(
                "start-up command {} of template {} ({}) {how}; its output ends with: {tail}",
                i + 1,
                quoted(template),
                quoted(command),
            ),
        ));
    }
    Ok(())
}
