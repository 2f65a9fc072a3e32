//! Feeding a command's stdin: the request's bytes first, then WriteStdin calls until eof or exit.

use std::io;

use bytes::Bytes;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

/// WriteStdin calls queued per action before the next one waits.
pub(crate) const STDIN_QUEUE: usize = 16;

/// Handle the registry hands to WriteStdin.
pub(crate) type StdinSender = mpsc::Sender<StdinWrite>;

/// One WriteStdin call; `done` answers once the bytes are in the pipe (and, with eof, the pipe is closed).
pub(crate) struct StdinWrite {
    pub(crate) data: Bytes,
    pub(crate) eof: bool,
    pub(crate) done: oneshot::Sender<io::Result<()>>,
}

/// Writes `initial`, then serves `writes`; closes the pipe (by dropping it) at eof, when the queue closes,
/// on a write error (the command closed its stdin), or when the main process exited.
pub(crate) async fn feed<W: AsyncWrite + Unpin>(
    pipe: Option<W>,
    initial: Bytes,
    writes: Option<mpsc::Receiver<StdinWrite>>,
    exited: &CancellationToken,
) {
    let Some(mut pipe) = pipe else { return };
    if !initial.is_empty()
        && let Err(e) = write(&mut pipe, &initial, exited).await
    {
        tracing::debug!(error = %e, "stdin closed before the initial bytes were written");
        return;
    }
    let Some(mut writes) = writes else { return };
    loop {
        let request = tokio::select! {
            request = writes.recv() => request,
            () = exited.cancelled() => None,
        };
        let Some(StdinWrite { data, eof, done }) = request else {
            return;
        };
        let result = write(&mut pipe, &data, exited).await;
        let failed = result.is_err();
        if eof || failed {
            // Close before answering, so the caller's eof is in effect when its call returns.
            drop(pipe);
            let _ = done.send(result);
            return;
        }
        // The caller may have given up waiting; that does not undo the write.
        let _ = done.send(result);
    }
}

async fn write<W: AsyncWrite + Unpin>(
    pipe: &mut W,
    data: &[u8],
    exited: &CancellationToken,
) -> io::Result<()> {
    // A command that exited (or never reads) must not keep us blocked on a full pipe.
    tokio::select! {
        result = async {
            pipe.write_all(data).await?;
            pipe.flush().await
        } => result,
        () = exited.cancelled() => Err(io::Error::new(io::ErrorKind::BrokenPipe, "the command exited")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn initial_bytes_then_writes_then_eof() {
        let (pipe, mut reader) = tokio::io::duplex(1024);
        let (tx, rx) = mpsc::channel(STDIN_QUEUE);
        let exited = CancellationToken::new();
        let feeder = tokio::spawn(async move {
            feed(Some(pipe), Bytes::from_static(b"one "), Some(rx), &exited).await;
        });
        let (done, answer) = oneshot::channel();
        tx.send(StdinWrite {
            data: Bytes::from_static(b"two"),
            eof: true,
            done,
        })
        .await
        .unwrap();
        answer.await.unwrap().unwrap();
        feeder.await.unwrap();
        let mut got = Vec::new();
        reader.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"one two");
        assert!(tx.is_closed(), "the queue closes with the pipe");
    }

    #[tokio::test]
    async fn exit_stops_a_blocked_write() {
        // A 1-byte pipe nobody reads: the write blocks until `exited`.
        let (pipe, _reader) = tokio::io::duplex(1);
        let exited = CancellationToken::new();
        exited.cancel();
        feed(Some(pipe), Bytes::from_static(b"too much"), None, &exited).await;
    }
}
