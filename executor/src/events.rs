//! An action's events (start, output, end) and the bounded sink that numbers them and streams them out.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use mentis_proto::executor::RunResponse;
use tokio::sync::mpsc;

use crate::convert;

/// Events buffered per action before the producer waits for the control plane to read.
pub(crate) const EVENT_BUFFER: usize = 64;

/// Which pipe an output chunk came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutputStream {
    Stdout,
    Stderr,
}

/// Why a shell command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EndReason {
    Exited,
    TimedOut,
    Cancelled,
    FailedToStart,
    /// Killed by the OOM killer when the memory limit was reached (see `cgroup`).
    OomKilled,
    /// Failed or timed out after the pids limit refused a fork.
    PidsLimitReached,
}

/// The terminal event of a shell action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CmdEnd {
    /// Exit code for `Exited` (128 + signal when a signal ended it); -1 otherwise.
    pub(crate) exit_code: i32,
    pub(crate) reason: EndReason,
    pub(crate) duration: Duration,
    /// The signal that ended the process, 0 when none.
    pub(crate) signal: i32,
    pub(crate) message: String,
}

impl CmdEnd {
    pub(crate) fn failed_to_start(message: String) -> Self {
        Self {
            exit_code: -1,
            reason: EndReason::FailedToStart,
            duration: Duration::ZERO,
            signal: 0,
            message,
        }
    }
}

/// The Jupyter message an IPython output came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutputKind {
    Stdout,
    Stderr,
    DisplayData,
    ExecuteResult,
    UpdateDisplayData,
}

/// One IPython output: stream text, or a MIME bundle (MIME type -> content as text).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CellOutput {
    pub(crate) kind: OutputKind,
    pub(crate) text: String,
    pub(crate) data: HashMap<String, String>,
    pub(crate) display_id: String,
}

/// How a cell ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CellStatus {
    Ok,
    Error,
    Aborted,
}

/// The terminal event of an IPython action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CellResult {
    pub(crate) status: CellStatus,
    /// 0 when the kernel never started the cell.
    pub(crate) execution_count: i32,
    pub(crate) error_name: String,
    pub(crate) error_value: String,
    pub(crate) traceback: Vec<String>,
    /// Why the cell was aborted; empty otherwise.
    pub(crate) reason: String,
    pub(crate) duration: Duration,
}

impl CellResult {
    pub(crate) fn aborted(reason: impl Into<String>, duration: Duration) -> Self {
        Self {
            status: CellStatus::Aborted,
            execution_count: 0,
            error_name: String::new(),
            error_value: String::new(),
            traceback: Vec::new(),
            reason: reason.into(),
            duration,
        }
    }
}

/// One event of an action, before it becomes a `RunResponse`.
// Named after the wire kinds (cmd_start, ipython_output, ...).
#[allow(clippy::enum_variant_names)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    CmdStart {
        command: String,
        pid: i32,
    },
    CmdOutput {
        stream: OutputStream,
        data: Bytes,
    },
    CmdEnd(CmdEnd),
    IPythonStart {
        code: String,
        execution_count: i32,
    },
    IPythonOutput(CellOutput),
    IPythonResult(CellResult),
    /// Informational; never replaces the terminal event.
    Error {
        message: String,
        details: HashMap<String, String>,
    },
    /// A sandbox-level event seen while running this action (the kernel was restarted).
    AgentState {
        message: String,
        details: HashMap<String, String>,
    },
}

/// Numbers events 1, 2, 3... and sends them on a bounded channel.
///
/// When the receiver is gone (the control plane disconnected) events are dropped instead of failing: the
/// command keeps running and its output keeps being drained, so it never blocks on a full pipe.
pub(crate) struct EventSink {
    tx: mpsc::Sender<RunResponse>,
    next_index: u64,
    receiver_gone: bool,
}

impl EventSink {
    pub(crate) fn channel() -> (Self, mpsc::Receiver<RunResponse>) {
        let (tx, rx) = mpsc::channel(EVENT_BUFFER);
        let sink = Self {
            tx,
            next_index: 1,
            receiver_gone: false,
        };
        (sink, rx)
    }

    /// Sends `event`, waiting while the channel is full (backpressure from a slow reader).
    pub(crate) async fn send(&mut self, event: Event) {
        let index = self.next_index;
        self.next_index += 1;
        if self.receiver_gone {
            return;
        }
        let response = convert::run_response(index, SystemTime::now(), event);
        if self.tx.send(response).await.is_err() {
            self.receiver_gone = true;
            tracing::info!(
                "the event stream's reader is gone; the action continues, its events are dropped"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[tokio::test]
    async fn numbers_events_and_survives_a_gone_receiver() {
        let (mut sink, mut rx) = EventSink::channel();
        sink.send(Event::CmdStart {
            command: "true".into(),
            pid: 7,
        })
        .await;
        let first = rx.recv().await.unwrap();
        assert_eq!(first.index, 1);
        assert!(first.time.is_some());
        drop(rx);
        // Must neither panic nor block.
        sink.send(Event::CmdEnd(CmdEnd::failed_to_start("x".into())))
            .await;
        sink.send(Event::CmdEnd(CmdEnd::failed_to_start("y".into())))
            .await;
        assert_eq!(sink.next_index, 4);
    }
}
