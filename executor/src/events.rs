//! The bounded sink of an action's events: numbers them 1, 2, 3... as they happen and hands them, still
//! domain types (the shared model's [`ObservationKind`]), to whoever streams them out. Only the server turns
//! them into proto.

use std::time::SystemTime;

use mentis_model::ObservationKind;
use tokio::sync::mpsc;

/// Events buffered per action before the producer waits for the control plane to read.
pub(crate) const EVENT_BUFFER: usize = 64;

/// One event of an action: its place in the action's stream, when it happened, and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// 1, 2, 3... per action.
    pub(crate) index: u64,
    pub(crate) time: SystemTime,
    pub(crate) kind: ObservationKind,
}

/// Numbers events 1, 2, 3... and sends them on a bounded channel.
///
/// When the receiver is gone (the control plane disconnected) events are dropped instead of failing: the
/// command keeps running and its output keeps being drained, so it never blocks on a full pipe.
pub(crate) struct EventSink {
    tx: mpsc::Sender<Event>,
    next_index: u64,
    receiver_gone: bool,
}

impl EventSink {
    pub(crate) fn channel() -> (Self, mpsc::Receiver<Event>) {
        let (tx, rx) = mpsc::channel(EVENT_BUFFER);
        let sink = Self {
            tx,
            next_index: 1,
            receiver_gone: false,
        };
        (sink, rx)
    }

    /// Sends `kind` as the next event, waiting while the channel is full (backpressure from a slow reader).
    pub(crate) async fn send(&mut self, kind: ObservationKind) {
        let index = self.next_index;
        self.next_index += 1;
        if self.receiver_gone {
            return;
        }
        let event = Event {
            index,
            time: SystemTime::now(),
            kind,
        };
        if self.tx.send(event).await.is_err() {
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

    use mentis_model::CmdEnd;

    use super::*;

    #[tokio::test]
    async fn numbers_events_and_survives_a_gone_receiver() {
        let (mut sink, mut rx) = EventSink::channel();
        let before = SystemTime::now();
        sink.send(ObservationKind::CmdStart {
            command: "true".into(),
            pid: 7,
        })
        .await;
        let first = rx.recv().await.unwrap();
        assert_eq!(first.index, 1);
        assert!(first.time >= before);
        assert!(matches!(
            first.kind,
            ObservationKind::CmdStart { pid: 7, .. }
        ));
        drop(rx);
        // Must neither panic nor block.
        sink.send(ObservationKind::CmdEnd(CmdEnd::failed_to_start("x".into())))
            .await;
        sink.send(ObservationKind::CmdEnd(CmdEnd::failed_to_start("y".into())))
            .await;
        assert_eq!(sink.next_index, 4);
    }
}
