//! How a cell ended: what `control` and `pump` saw, and from that the terminal `ipython_result`, whether
//! the cell raised (a rollback candidate), and whether the kernel must be replaced.

use std::time::Duration;

use mentis_model::{IPythonResult, IPythonStatus};
use serde_json::Value;

use crate::ipython::process::Exit;
use crate::ipython::{kernel, output};

/// The reason given to cells ended by executor shutdown.
pub(crate) const SHUTDOWN_REASON: &str = "the executor is shutting down";

/// Why the kernel must be replaced after the cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Replace {
    Died(Exit),
    /// It ignored the interrupt, or the wire failed: it was killed.
    Unresponsive,
    /// ResetKernel: it was killed; the reset starts the fresh one.
    Reset,
    /// Its process runs, but its sockets stopped answering (user code closed them): it was killed.
    Unreachable,
}

/// How a cell ended, and what the IPython side must do about the kernel.
pub(crate) struct Outcome {
    pub(crate) result: IPythonResult,
    /// The cell ended with an exception and the kernel is alive: a candidate for rollback.
    pub(crate) raised: bool,
    pub(crate) replace: Option<Replace>,
    /// The cell ended without its reply or without its `idle`: the kernel lives, but one of its sockets
    /// may no longer answer. The IPython side asks it before the next cell is sent there.
    pub(crate) check_kernel: bool,
    /// The cell never reached the kernel (its shell socket refused it): nothing ran, so it may be sent
    /// to a fresh kernel.
    pub(crate) unsent: bool,
}

impl Outcome {
    pub(crate) fn aborted(reason: String, duration: Duration, replace: Option<Replace>) -> Self {
        Self {
            result: IPythonResult::aborted(reason, duration),
            raised: false,
            replace,
            check_kernel: false,
            unsent: false,
        }
    }
}

/// Why the executor interrupted the cell.
#[derive(Debug, Clone, Copy)]
pub(super) enum Stop {
    TimedOut,
    Cancelled,
}

/// What `control` saw.
#[derive(Debug)]
pub(super) enum Control {
    /// The pump ended (normally: reply and idle arrived).
    Done,
    Interrupted(Stop),
    Died(Option<Stop>, Exit),
    Unresponsive(Stop),
    Reset,
    ShutDown,
}

/// What `pump` saw.
#[derive(Debug, Default)]
pub(super) struct Pumped {
    pub(super) started: bool,
    pub(super) execution_count: i32,
    pub(super) reply: Option<Value>,
    pub(super) idle: bool,
    /// The iopub `error` content, in case the reply lacks the details.
    pub(super) error: Option<Value>,
    /// The kernel went idle and no reply came: it is alive, the cell has no result.
    pub(super) unanswered: bool,
    /// The reply came and then iopub stayed silent, with no `idle`: the result is the reply's, and some
    /// output may be missing.
    pub(super) idle_missing: bool,
}

/// The `execution_count` of a kernel message's content.
pub(super) fn count(content: &Value) -> Option<i32> {
    content
        .get("execution_count")
        .and_then(Value::as_i64)
        .and_then(|n| i32::try_from(n).ok())
}

/// `oom`: how the OOM killer ended the kernel, when it did ("killed by the out-of-memory killer ...").
pub(super) fn outcome(
    control: Control,
    pumped: Pumped,
    timeout: Duration,
    grace: Duration,
    duration: Duration,
    oom: Option<String>,
) -> Outcome {
    let stop_text = |stop: Stop| match stop {
        Stop::TimedOut => format!("timed out after {} s", timeout.as_secs_f64()),
        Stop::Cancelled => "cancelled".to_owned(),
    };
    let lost = |reason: String| {
        Outcome::aborted(reason, duration, Some(Replace::Unresponsive)).with_count(&pumped)
    };
    let check_kernel = pumped.unanswered || pumped.idle_missing;
    let mut outcome = match control {
        Control::Done => match &pumped.reply {
            Some(reply) => from_reply(reply, &pumped, duration, None),
            None if pumped.unanswered => Outcome::aborted(
                "the kernel ended the cell without a result".to_owned(),
                duration,
                None,
            )
            .with_count(&pumped),
            None => lost("lost contact with the kernel while running the cell".to_owned()),
        },
        Control::Interrupted(stop) => match &pumped.reply {
            Some(reply) => from_reply(reply, &pumped, duration, Some(stop_text(stop))),
            // The interrupt landed in ipykernel's own code around the cell, which swallowed it: the
            // cell is over, the kernel alive and idle.
            None if pumped.unanswered => {
                Outcome::aborted(stop_text(stop), duration, None).with_count(&pumped)
            }
            None => lost(format!(
                "{}; then lost contact with the kernel",
                stop_text(stop)
            )),
        },
        Control::Died(stop, exit) => {
            let how = match oom {
                Some(oom) => format!("was {oom}"),
                None => exit.to_string(),
            };
            let reason = match stop {
                None => format!("the kernel {how} while running the cell"),
                Some(stop) => format!("{}; the kernel {how} after the interrupt", stop_text(stop)),
            };
            Outcome::aborted(reason, duration, Some(Replace::Died(exit))).with_count(&pumped)
        }
        Control::Unresponsive(stop) => Outcome::aborted(
            format!(
                "{}; the kernel did not respond to the interrupt within {} s and was killed",
                stop_text(stop),
                grace.as_secs_f64()
            ),
            duration,
            Some(Replace::Unresponsive),
        )
        .with_count(&pumped),
        Control::Reset => {
            Outcome::aborted("kernel reset".to_owned(), duration, Some(Replace::Reset))
                .with_count(&pumped)
        }
        Control::ShutDown => {
            Outcome::aborted(SHUTDOWN_REASON.to_owned(), duration, None).with_count(&pumped)
        }
    };
    outcome.check_kernel = check_kernel && outcome.replace.is_none();
    outcome
}

impl Outcome {
    fn with_count(mut self, pumped: &Pumped) -> Self {
        self.result.execution_count = pumped.execution_count;
        self
    }
}

/// The result the kernel reported. `interrupted` (the reason) turns an error into ABORTED: the exception
/// is the KeyboardInterrupt we caused. A cell that finished OK before the interrupt took effect is OK.
fn from_reply(
    reply: &Value,
    pumped: &Pumped,
    duration: Duration,
    interrupted: Option<String>,
) -> Outcome {
    let execution_count = count(reply).unwrap_or(pumped.execution_count);
    let field = |name: &str| {
        reply
            .get(name)
            .or_else(|| pumped.error.as_ref().and_then(|e| e.get(name)))
    };
    let text = |name: &str| {
        field(name)
            .and_then(Value::as_str)
            .map(|s| output::cut(s, output::MAX_ERROR_TEXT))
            .unwrap_or_default()
    };
    let traceback = field("traceback")
        .and_then(Value::as_array)
        .map(|frames| {
            frames
                .iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let (status, raised, reason) = match (kernel::status(reply), interrupted) {
        ("ok", _) => (IPythonStatus::Ok, false, String::new()),
        ("error", None) => (IPythonStatus::Error, true, String::new()),
        ("error", Some(reason)) => (IPythonStatus::Aborted, true, reason),
        (_, Some(reason)) => (IPythonStatus::Aborted, false, reason),
        (other, None) => (
            IPythonStatus::Aborted,
            false,
            format!("the kernel answered {other:?}"),
        ),
    };
    let ok = status == IPythonStatus::Ok;
    Outcome {
        result: IPythonResult {
            status,
            execution_count,
            error_name: if ok { String::new() } else { text("ename") },
            error_value: if ok { String::new() } else { text("evalue") },
            traceback: if ok {
                Vec::new()
            } else {
                output::bounded_traceback(traceback)
            },
            reason,
            duration,
        },
        raised,
        replace: None,
        check_kernel: false,
        unsent: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pumped() -> Pumped {
        Pumped {
            started: true,
            execution_count: 4,
            ..Pumped::default()
        }
    }

    #[test]
    fn replies_become_results() {
        let d = Duration::from_secs(1);
        let ok = from_reply(
            &json!({"status": "ok", "execution_count": 5}),
            &pumped(),
            d,
            None,
        );
        assert_eq!(
            (ok.result.status, ok.result.execution_count, ok.raised),
            (IPythonStatus::Ok, 5, false)
        );
        let error = json!({"status": "error", "execution_count": 5, "ename": "ZeroDivisionError",
            "evalue": "division by zero", "traceback": ["a", "b"]});
        let failed = from_reply(&error, &pumped(), d, None);
        assert_eq!(failed.result.status, IPythonStatus::Error);
        assert_eq!(failed.result.error_name, "ZeroDivisionError");
        assert_eq!(failed.result.traceback, vec!["a", "b"]);
        assert!(failed.raised);
        let interrupted = from_reply(&error, &pumped(), d, Some("cancelled".into()));
        assert_eq!(interrupted.result.status, IPythonStatus::Aborted);
        assert_eq!(interrupted.result.reason, "cancelled");
        assert!(interrupted.raised);
        // Finished before the interrupt landed: what the kernel says stands.
        let late = from_reply(&json!({"status": "ok"}), &pumped(), d, Some("x".into()));
        assert_eq!(late.result.status, IPythonStatus::Ok);
        assert_eq!(late.result.execution_count, 4);
    }

    #[test]
    fn deaths_name_the_signal_and_ask_for_a_new_kernel() {
        let died = outcome(
            Control::Died(None, Exit::Signal(9)),
            pumped(),
            Duration::from_secs(300),
            Duration::from_secs(5),
            Duration::from_secs(1),
            None,
        );
        assert_eq!(died.result.status, IPythonStatus::Aborted);
        assert!(
            died.result.reason.contains("SIGKILL"),
            "{}",
            died.result.reason
        );
        assert_eq!(died.replace, Some(Replace::Died(Exit::Signal(9))));
        let ignored = outcome(
            Control::Unresponsive(Stop::TimedOut),
            pumped(),
            Duration::from_secs(2),
            Duration::from_secs(5),
            Duration::from_secs(7),
            None,
        );
        assert!(ignored.result.reason.starts_with("timed out after 2 s"));
        assert_eq!(ignored.replace, Some(Replace::Unresponsive));
        let oom = outcome(
            Control::Died(None, Exit::Signal(9)),
            pumped(),
            Duration::from_secs(300),
            Duration::from_secs(5),
            Duration::from_secs(1),
            Some("killed by the out-of-memory killer (memory limit 256 MiB)".to_owned()),
        );
        assert_eq!(
            oom.result.reason,
            "the kernel was killed by the out-of-memory killer (memory limit 256 MiB) while running \
             the cell"
        );
        assert_eq!(oom.replace, Some(Replace::Died(Exit::Signal(9))));
    }

    #[test]
    fn an_idle_kernel_without_a_reply_is_kept_and_one_that_went_silent_is_replaced() {
        let end = |control, unanswered| {
            let pumped = Pumped {
                idle: unanswered,
                unanswered,
                ..pumped()
            };
            let d = Duration::from_secs(1);
            outcome(control, pumped, d, d, d, None)
        };
        // An interrupt that ipykernel swallowed outside the user's code: over, kernel kept.
        let swallowed = end(Control::Interrupted(Stop::Cancelled), true);
        assert_eq!(swallowed.result.status, IPythonStatus::Aborted);
        assert_eq!(swallowed.result.reason, "cancelled");
        assert_eq!(swallowed.replace, None);
        assert!(!swallowed.raised, "nothing to roll back to: no result");
        let handler_failed = end(Control::Done, true);
        assert_eq!(handler_failed.result.status, IPythonStatus::Aborted);
        assert_eq!(handler_failed.replace, None);
        // Either way its sockets are asked before the next cell (user code may have closed one).
        assert!(swallowed.check_kernel && handler_failed.check_kernel);
        // No idle and no reply: the wire is gone, the kernel is replaced.
        assert_eq!(
            end(Control::Interrupted(Stop::Cancelled), false).replace,
            Some(Replace::Unresponsive)
        );
        let silent = end(Control::Done, false);
        assert_eq!(silent.replace, Some(Replace::Unresponsive));
        assert!(!silent.check_kernel, "replaced anyway");
    }

    #[test]
    fn a_reply_without_idle_is_the_result_and_the_kernel_is_asked() {
        let pumped = Pumped {
            reply: Some(json!({"status": "ok", "execution_count": 4})),
            idle_missing: true,
            ..pumped()
        };
        let d = Duration::from_secs(1);
        let end = outcome(Control::Done, pumped, d, d, d, None);
        assert_eq!(end.result.status, IPythonStatus::Ok);
        assert_eq!(end.result.execution_count, 4);
        assert_eq!(end.replace, None);
        assert!(end.check_kernel);
    }
}
