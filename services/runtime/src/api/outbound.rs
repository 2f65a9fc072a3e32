//! The server side of every observation stream: a bounded channel between the task that reads the log and
//! the client. It adds keepalives when the stream is idle, and when the client stops reading for the stall
//! timeout it cuts the client off with RESOURCE_EXHAUSTED instead of letting anything pile up: the log keeps
//! the observations, and the client resumes from the last seq it received.

use std::pin::Pin;
use std::sync::Mutex;
use std::task::{Context, Poll};
use std::time::Duration;

use futures::Stream;
use mentis_core::{Error, Reason};
use tokio::sync::{mpsc, oneshot};
use tonic::Status;

use super::status::expected_status;
pub use crate::config::StreamPolicy;

/// The sending half, owned by the task that produces the stream.
pub struct Outbound<T> {
    tx: mpsc::Sender<Result<T, Status>>,
    cut_off: Mutex<Option<oneshot::Sender<Status>>>,
    stall: Duration,
}

/// The receiving half, handed to tonic as the response stream. A cut-off status overtakes buffered messages.
pub struct Guarded<T> {
    rx: mpsc::Receiver<Result<T, Status>>,
    cut_off: Option<oneshot::Receiver<Status>>,
    _open: OpenStream,
}

/// Counts an open stream (`mentis.streams.open`) while it lives.
struct OpenStream;

impl OpenStream {
    fn new() -> Self {
        crate::metrics::metrics().subscribers.add(1, &[]);
        Self
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        crate::metrics::metrics().subscribers.add(-1, &[]);
    }
}

/// A new outgoing stream.
pub fn channel<T>(policy: StreamPolicy) -> (Outbound<T>, Guarded<T>) {
    let (tx, rx) = mpsc::channel(policy.buffer);
    let (cut_tx, cut_rx) = oneshot::channel();
    (
        Outbound {
            tx,
            cut_off: Mutex::new(Some(cut_tx)),
            stall: policy.stall,
        },
        Guarded {
            rx,
            cut_off: Some(cut_rx),
            _open: OpenStream::new(),
        },
    )
}

impl<T> Outbound<T> {
    /// Sends a message; false when the client is gone or was cut off (stop producing then).
    pub async fn send(&self, msg: Result<T, Status>) -> bool {
        match self.tx.send_timeout(msg, self.stall).await {
            Ok(()) => true,
            Err(mpsc::error::SendTimeoutError::Closed(_)) => false,
            Err(mpsc::error::SendTimeoutError::Timeout(_)) => {
                let cut = self
                    .cut_off
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .take();
                if let Some(cut) = cut {
                    tracing::info!(
                        stall_secs = self.stall.as_secs(),
                        "cutting off a client that stopped reading"
                    );
                    crate::metrics::metrics().cut_offs.add(1, &[]);
                    let _ = cut.send(expected_status(&Error::new(
                        Reason::ClientTooSlow,
                        format!(
                            "the client stopped reading for {}s; reconnect with after_seq = the last seq received",
                            self.stall.as_secs()
                        ),
                    )));
                }
                false
            }
        }
    }

    /// Resolves when the client has gone away.
    pub async fn closed(&self) {
        self.tx.closed().await;
    }
}

impl<T> Stream for Guarded<T> {
    type Item = Result<T, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if let Some(cut) = self.cut_off.as_mut() {
            match Pin::new(cut).poll(cx) {
                Poll::Ready(Ok(status)) => {
                    self.cut_off = None;
                    self.rx.close();
                    // Drop what was buffered: the client resumes from its last seq anyway.
                    while self.rx.try_recv().is_ok() {}
                    return Poll::Ready(Some(Err(status)));
                }
                // The producer finished without cutting off.
                Poll::Ready(Err(_)) => self.cut_off = None,
                Poll::Pending => {}
            }
        }
        self.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;

    #[tokio::test]
    async fn a_client_that_stops_reading_is_cut_off_with_a_status() {
        let policy = StreamPolicy {
            keepalive: Duration::from_secs(3600),
            stall: Duration::from_millis(100),
            buffer: 2,
        };
        let (out, mut guarded) = channel::<u32>(policy);
        assert!(out.send(Ok(1)).await);
        assert!(out.send(Ok(2)).await);
        // The buffer is full and nobody reads: the third send gives up after the stall timeout.
        assert!(!out.send(Ok(3)).await);
        let first = guarded.next().await.expect("an item");
        let cut = first.expect_err("cut off");
        assert_eq!(cut.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            crate::api::status::reason_of(&cut),
            Some(Reason::ClientTooSlow)
        );
        assert!(guarded.next().await.is_none(), "nothing after the cut-off");
    }
}
