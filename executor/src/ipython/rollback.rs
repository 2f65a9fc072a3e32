//! The rollback after a failed cell: the names it created in the user namespace are removed (names that
//! existed before keep their values), inside the failed cell's turn.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use mentis_model::ObservationKind;
use serde_json::Value;

use super::kernel::{self, Kernel};
use crate::events::EventSink;

/// Bound on the silent rollback after a failed cell.
const ROLLBACK_TIMEOUT: Duration = Duration::from_secs(30);

/// Removes the names the failed cell `execution_count` created (see helpers.py for what is not undone).
pub(super) async fn rollback(kernel: &mut Kernel, execution_count: i32, sink: &mut EventSink) {
    if !kernel.helpers {
        return;
    }
    let expression = format!("get_ipython()._mentis.rollback({execution_count})");
    let expressions = HashMap::from([("removed".to_owned(), expression)]);
    let failure = match kernel
        .run_silent("", Some(expressions), ROLLBACK_TIMEOUT)
        .await
    {
        Ok(reply) => match reply.pointer("/user_expressions/removed") {
            Some(answer) if kernel::status(answer) == "ok" => {
                let removed = answer
                    .pointer("/data/text~1plain")
                    .and_then(Value::as_str)
                    .unwrap_or("?");
                tracing::debug!(removed, "rolled back the failed cell's new names");
                return;
            }
            Some(answer) => kernel::error_text(answer),
            None => "the kernel gave no answer".to_owned(),
        },
        Err(e) => e.to_string(),
    };
    tracing::warn!(error = %failure, "rollback failed");
    sink.send(ObservationKind::Error {
        message: format!("could not remove the names the failed cell created: {failure}"),
        details: BTreeMap::new(),
    })
    .await;
}
