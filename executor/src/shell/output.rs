//! Reading a command's stdout and stderr into `cmd_output` chunks: raw bytes, as they arrive, with small
//! writes coalesced for a few milliseconds so a chatty command does not become one event per byte.

use std::io;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use mentis_model::{ObservationKind, OutputStream};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::events::EventSink;

/// Largest `cmd_output` chunk (also the read size).
pub(crate) const MAX_CHUNK: usize = 64 * 1024;
/// How long the first byte of a chunk waits for more before the chunk is sent.
pub(crate) const COALESCE: Duration = Duration::from_millis(5);
/// After the main process exited, how long pipes still held open (by background jobs) are read before the
/// action ends. Output already in the pipes is read first (reads win over this timer).
pub(crate) const EXIT_GRACE: Duration = Duration::from_millis(200);
/// Hard bound after exit for a background job that writes without pause.
pub(crate) const EXIT_DRAIN_CAP: Duration = Duration::from_secs(2);

/// Where pipes still open after the action ended are handed for draining.
pub(crate) struct Detach<'a> {
    pub(crate) tracker: &'a TaskTracker,
    pub(crate) shutdown: &'a CancellationToken,
}

/// The chunk being built: one stream at a time, so stdout/stderr interleaving keeps its order.
struct Pending {
    stream: OutputStream,
    data: BytesMut,
    flush_at: Instant,
}

/// Reads both pipes until they close (or the grace after `exited` ends), sending chunks to `sink`.
pub(crate) async fn pump<O, E>(
    mut stdout: Option<O>,
    mut stderr: Option<E>,
    sink: &mut EventSink,
    exited: &CancellationToken,
    detach: &Detach<'_>,
) where
    O: AsyncRead + Unpin + Send + 'static,
    E: AsyncRead + Unpin + Send + 'static,
{
    let mut out_buf = vec![0u8; MAX_CHUNK];
    let mut err_buf = vec![0u8; MAX_CHUNK];
    let mut pending: Option<Pending> = None;
    // Set when the main process exited: (end of grace, hard cap).
    let mut after_exit: Option<(Instant, Instant)> = None;

    while stdout.is_some() || stderr.is_some() {
        if after_exit.is_some_and(|(_, cap)| Instant::now() >= cap) {
            break;
        }
        let flush_at = pending.as_ref().map(|p| p.flush_at);
        let grace_end = after_exit.map(|(grace, _)| grace);
        // Biased: a due flush first (latency), then data (nothing already written is lost to the grace
        // timer), then the exit notice and the grace timer.
        tokio::select! {
            biased;
            () = sleep_until(flush_at), if flush_at.is_some() => flush(&mut pending, sink).await,
            read = read_some(&mut stdout, &mut out_buf), if stdout.is_some() => match read {
                Ok(n) if n > 0 => push(&mut pending, OutputStream::Stdout, &out_buf[..n], sink).await,
                end => closed(&mut stdout, OutputStream::Stdout, end),
            },
            read = read_some(&mut stderr, &mut err_buf), if stderr.is_some() => match read {
                Ok(n) if n > 0 => push(&mut pending, OutputStream::Stderr, &err_buf[..n], sink).await,
                end => closed(&mut stderr, OutputStream::Stderr, end),
            },
            () = exited.cancelled(), if after_exit.is_none() => {
                let now = Instant::now();
                after_exit = Some((now + EXIT_GRACE, now + EXIT_DRAIN_CAP));
            }
            () = sleep_until(grace_end), if grace_end.is_some() => break,
        }
    }
    flush(&mut pending, sink).await;

    // A background job still holds a pipe. Keep reading it (discarding) rather than closing it: a closed
    // pipe would kill a server started with `&` by SIGPIPE at its next log line.
    if let Some(pipe) = stdout {
        drain_detached(pipe, OutputStream::Stdout, detach);
    }
    if let Some(pipe) = stderr {
        drain_detached(pipe, OutputStream::Stderr, detach);
    }
}

async fn read_some<R: AsyncRead + Unpin>(
    pipe: &mut Option<R>,
    buf: &mut [u8],
) -> io::Result<usize> {
    match pipe {
        Some(pipe) => pipe.read(buf).await,
        // Never polled: the select guard excludes a closed pipe.
        None => std::future::pending().await,
    }
}

fn closed<R>(pipe: &mut Option<R>, stream: OutputStream, end: io::Result<usize>) {
    if let Err(e) = end {
        tracing::debug!(?stream, error = %e, "reading output failed; treating as end of stream");
    }
    *pipe = None;
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Adds bytes to the pending chunk, sending it first if the stream changes or it would grow too big.
async fn push(
    pending: &mut Option<Pending>,
    stream: OutputStream,
    data: &[u8],
    sink: &mut EventSink,
) {
    if pending
        .as_ref()
        .is_some_and(|p| p.stream != stream || p.data.len() + data.len() > MAX_CHUNK)
    {
        flush(pending, sink).await;
    }
    let chunk = pending.get_or_insert_with(|| Pending {
        stream,
        data: BytesMut::with_capacity(data.len()),
        flush_at: Instant::now() + COALESCE,
    });
    chunk.data.extend_from_slice(data);
    if chunk.data.len() >= MAX_CHUNK {
        flush(pending, sink).await;
    }
}

async fn flush(pending: &mut Option<Pending>, sink: &mut EventSink) {
    if let Some(chunk) = pending.take() {
        let data: Bytes = chunk.data.freeze();
        sink.send(ObservationKind::CmdOutput {
            stream: chunk.stream,
            data,
        })
        .await;
    }
}

fn drain_detached<R>(mut pipe: R, stream: OutputStream, detach: &Detach<'_>)
where
    R: AsyncRead + Unpin + Send + 'static,
{
    tracing::info!(
        ?stream,
        "a background process still holds the pipe; its further output is discarded"
    );
    let shutdown = detach.shutdown.clone();
    // Outlives its action (a background process may hold the pipe for hours): no parent, so the action's
    // span ends with the action.
    // (The log line above names the action.)
    let span = tracing::info_span!(target: mentis_telemetry::UNTRACED, parent: None, "drain_background_output", ?stream);
    detach.tracker.spawn(
        async move {
            let mut buf = vec![0u8; 8 * 1024];
            loop {
                tokio::select! {
                    read = pipe.read(&mut buf) => match read {
                        Ok(n) if n > 0 => {}
                        _ => break,
                    },
                    () = shutdown.cancelled() => break,
                }
            }
            tracing::debug!("background output drained");
        }
        .instrument(span),
    );
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::events::Event;
    use tokio::io::{AsyncWriteExt, DuplexStream};

    fn output(event: &Event) -> (OutputStream, Vec<u8>) {
        match &event.kind {
            ObservationKind::CmdOutput { stream, data } => (*stream, data.to_vec()),
            other => panic!("not output: {other:?}"),
        }
    }

    async fn run_pump(
        out: DuplexStream,
        err: DuplexStream,
        exited: CancellationToken,
    ) -> Vec<Event> {
        let (mut sink, mut rx) = EventSink::channel();
        let tracker = TaskTracker::new();
        let shutdown = CancellationToken::new();
        let collector = tokio::spawn(async move {
            let mut all = Vec::new();
            while let Some(r) = rx.recv().await {
                all.push(r);
            }
            all
        });
        pump(
            Some(out),
            Some(err),
            &mut sink,
            &exited,
            &Detach {
                tracker: &tracker,
                shutdown: &shutdown,
            },
        )
        .await;
        drop(sink);
        shutdown.cancel();
        tracker.close();
        tracker.wait().await;
        collector.await.unwrap()
    }

    #[tokio::test]
    async fn chunks_are_capped_and_streams_kept_apart() {
        let (mut out_w, out_r) = tokio::io::duplex(MAX_CHUNK * 4);
        let (mut err_w, err_r) = tokio::io::duplex(1024);
        let big = vec![7u8; MAX_CHUNK * 2 + 10];
        out_w.write_all(&big).await.unwrap();
        err_w.write_all(b"\xff\xfe").await.unwrap();
        drop(out_w);
        drop(err_w);
        let events = run_pump(out_r, err_r, CancellationToken::new()).await;
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        for event in &events {
            let (stream, data) = output(event);
            assert!(data.len() <= MAX_CHUNK);
            if stream == OutputStream::Stdout {
                stdout.extend(data);
            } else {
                stderr.extend(data);
            }
        }
        assert_eq!(stdout, big);
        assert_eq!(stderr, b"\xff\xfe");
    }

    #[tokio::test]
    async fn a_pipe_held_open_after_exit_does_not_hang() {
        let (mut out_w, out_r) = tokio::io::duplex(1024);
        let (_err_w, err_r) = tokio::io::duplex(1024);
        out_w.write_all(b"before exit").await.unwrap();
        let exited = CancellationToken::new();
        exited.cancel();
        // The writers stay alive (like a background job's copy of the pipe).
        let events = tokio::time::timeout(Duration::from_secs(30), run_pump(out_r, err_r, exited))
            .await
            .unwrap();
        let data: Vec<u8> = events.iter().flat_map(|e| output(e).1).collect();
        assert_eq!(data, b"before exit");
        drop(out_w);
    }
}
