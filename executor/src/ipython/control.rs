//! Kernel control between cells: ResetKernel and InspectVariables. Each takes the kernel's turn, so neither
//! ever runs beside a cell.

use std::collections::HashMap;
use std::time::Duration;

use serde_json::Value;

use super::kernel::{self, SilentError};
use super::turnstile::Place;
use super::{IPython, lock};
use crate::error::Error;

/// Bound on the inspect helper's run.
const INSPECT_TIMEOUT: Duration = Duration::from_secs(30);

impl IPython {
    /// Replaces the kernel with a fresh one: a running cell ends ABORTED, queued cells run on the new one.
    pub(crate) async fn reset(&self) -> Result<(), Error> {
        let shared = &self.0;
        // At the front, so that queued cells come after the reset; taken before the running cell is
        // told, so that the turn comes here as soon as that cell lets go.
        let mut ticket = shared
            .line
            .enqueue(Place::Front, false)
            .map_err(|full| Error::QueueFull { limit: full.limit })?;
        if let Some(reset) = lock(&shared.running).as_ref() {
            reset.cancel();
        }
        let mut turn = shared.turn_or_shutdown(&mut ticket).await?;
        if let Some(mut old) = turn.take() {
            old.process.kill().await;
        }
        let kernel = shared
            .start_kernel()
            .await
            .map_err(|e| Error::Unavailable(format!("cannot start a fresh kernel: {e}")))?;
        tracing::info!(pid = kernel.process.pid(), "kernel reset");
        *turn = Some(kernel);
        Ok(())
    }

    /// Summarises user variables (all when `names` is empty) between cells: the helper's JSON answer, a
    /// list of `{name, type, summary}`. Names that do not exist are left out.
    pub(crate) async fn inspect(&self, names: Vec<String>) -> Result<Value, Error> {
        let shared = &self.0;
        let mut ticket = shared
            .line
            .enqueue(Place::Back, true)
            .map_err(|full| Error::QueueFull { limit: full.limit })?;
        let mut turn =
            match tokio::time::timeout(shared.inspect_wait, shared.turn_or_shutdown(&mut ticket))
                .await
            {
                Ok(turn) => turn?,
                Err(_) => {
                    return Err(Error::Unavailable(format!(
                        "the kernel was busy with cells for {} s; try InspectVariables again later",
                        shared.inspect_wait.as_secs()
                    )));
                }
            };
        let Some(kernel) = turn.as_mut().filter(|kernel| !kernel.process.has_ended()) else {
            // No kernel (yet, or it died): nothing is defined.
            return Ok(Value::Array(Vec::new()));
        };
        if !kernel.helpers {
            return Err(Error::Unavailable(
                "the kernel's inspect helper is not installed (see the executor log)".to_owned(),
            ));
        }
        // The names are validated identifiers, so their JSON list is also a valid Python list literal.
        let names = serde_json::to_string(&names).unwrap_or_else(|_| "[]".to_owned());
        let expression = format!("get_ipython()._mentis.inspect({names})");
        let reply = match kernel
            .run_silent(
                "",
                Some(HashMap::from([("r".to_owned(), expression)])),
                INSPECT_TIMEOUT,
            )
            .await
        {
            Ok(reply) => reply,
            Err(e) => {
                if matches!(e, SilentError::TimedOut) {
                    // Leave the kernel usable for the next cell.
                    kernel.process.interrupt();
                }
                return Err(Error::Unavailable(format!(
                    "inspecting the variables failed: {e}"
                )));
            }
        };
        let answer = reply.get("user_expressions").and_then(|e| e.get("r"));
        match answer
            .and_then(|a| a.get("data"))
            .and_then(|d| d.get("application/json"))
        {
            Some(json) => Ok(json.clone()),
            None => Err(Error::Unavailable(format!(
                "inspecting the variables failed: {}",
                answer.map_or_else(|| "no answer".to_owned(), kernel::error_text)
            ))),
        }
    }
}
