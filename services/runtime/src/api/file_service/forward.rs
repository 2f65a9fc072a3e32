//! Forwarding a client's WriteFile or Upload stream to the executor, and the one rule that decides whether
//! the executor may keep it: the commit message goes out only after the client ended its stream cleanly.

use std::pin::Pin;

use futures::Stream;
use mentis_core::Error;
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::super::decode;
use super::super::status::to_status;
use super::client_end::ClientEnd;

/// Client chunks buffered between the client's stream and the executor's.
const FORWARD_BUFFER: usize = 4;

/// A request stream towards the executor, fed through a bounded channel.
pub(super) struct Feed<T>(mpsc::Receiver<T>);

impl<T> Stream for Feed<T> {
    type Item = T;

    fn poll_next(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<T>> {
        self.0.poll_recv(cx)
    }
}

/// The executor call, boxed: `forward_client_stream` then needs no generic future type (with one, the
/// compiler could not prove the handler's future Send).
pub(super) type BoxFuture<T> = Pin<Box<dyn std::future::Future<Output = T> + Send + 'static>>;

/// Forwards a client stream to the executor: each client message after the header through `convert`,
/// into the stream `call` (the application's call) reads, until the call answers;
/// once the client's stream has ended cleanly, `commit` (the message that lets the executor keep what
/// it received), then the end of the executor's stream.
///
/// `commit` is sent only when `end` says the client sent END_STREAM: `inbound.message()` returns
/// `Ok(None)` for a stream the client cancelled as well, so its end alone proves nothing. A client
/// stream that fails or is cut, or a message that does not convert, drops the executor call before any
/// commit, and the executor discards the partial write however its own stream then ends.
pub(super) async fn forward_client_stream<In, Out, R>(
    mut inbound: Streaming<In>,
    end: ClientEnd,
    convert: fn(In) -> Result<Out, Error>,
    commit: Out,
    call: impl FnOnce(Feed<Out>) -> BoxFuture<Result<R, Error>>,
) -> Result<R, Status>
where
    In: Send + 'static,
    Out: Send + 'static,
{
    let (tx, rx) = mpsc::channel(FORWARD_BUFFER);
    let mut call = call(Feed(rx));
    // Owns a clone of the sender: `tx` itself stays alive until we decide how the request stream ends.
    let feeder = tx.clone();
    let forward: BoxFuture<Result<(), Status>> = Box::pin(async move {
        while let Some(message) = inbound.message().await.map_err(decode::inbound)? {
            let out = convert(message).map_err(to_status)?;
            if feeder.send(out).await.is_err() {
                // The executor stopped reading: its answer follows.
                return Ok(());
            }
        }
        if !end.ended_cleanly() {
            // The transport's verdict on the stream, like the errors `message()` passes on (there is no
            // domain error to map); a client that cancelled is gone and never reads it.
            return Err(Status::cancelled(
                "the request stream was cut before its end; nothing was written",
            ));
        }
        // Whether the executor still reads or not, its answer follows.
        let _ = feeder.send(commit).await;
        Ok::<(), Status>(())
    });
    let forwarded = tokio::select! {
        answer = &mut call => return answer.map_err(to_status),
        forwarded = forward => forwarded,
    };
    match forwarded {
        // The client's stream ended cleanly and the commit is sent: end the executor's stream, then wait
        // for its verdict.
        Ok(()) => {
            drop(tx);
            call.await.map_err(to_status)
        }
        // `call` is dropped (cancelled) on return, with no commit sent.
        Err(status) => Err(status),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::{Arc, Mutex};

    use bytes::{Buf as _, BufMut as _, Bytes, BytesMut};
    use futures::StreamExt as _;
    use http_body::Frame;
    use tonic::codec::{DecodeBuf, Decoder};

    use super::super::client_end;
    use super::*;

    /// Decodes each gRPC message as its bytes.
    struct Raw;

    impl Decoder for Raw {
        type Item = Bytes;
        type Error = Status;

        fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, Status> {
            Ok(Some(buf.copy_to_bytes(buf.remaining())))
        }
    }

    /// A watched request stream, as tonic decodes it: `messages`, then `last` (an error, or the end).
    fn inbound(messages: &[&str], last: Option<Status>) -> (Streaming<Bytes>, ClientEnd) {
        let mut frames: Vec<Result<Frame<Bytes>, Status>> = messages
            .iter()
            .map(|m| {
                let mut framed = BytesMut::new();
                framed.put_u8(0);
                framed.put_u32(u32::try_from(m.len()).unwrap());
                framed.put_slice(m.as_bytes());
                Ok(Frame::data(framed.freeze()))
            })
            .collect();
        frames.extend(last.map(Err));
        let (body, end) = client_end::watch(client_end::body_of(frames));
        (Streaming::new_request(Raw, body, None, None), end)
    }

    /// Forwards to a stand-in executor that records what it receives and answers when its stream ends.
    async fn forward(
        inbound: Streaming<Bytes>,
        end: ClientEnd,
    ) -> (Result<(), Status>, Vec<String>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = Arc::clone(&seen);
        let answer = forward_client_stream(
            inbound,
            end,
            |b| Ok(String::from_utf8_lossy(&b).into_owned()),
            "commit".to_owned(),
            move |mut feed| {
                Box::pin(async move {
                    while let Some(m) = feed.next().await {
                        record.lock().unwrap().push(m);
                    }
                    Ok(())
                })
            },
        )
        .await;
        let seen = seen.lock().unwrap().clone();
        (answer, seen)
    }

    #[tokio::test]
    async fn tonic_reads_a_cancelled_request_stream_as_ended() {
        let (mut stream, end) = inbound(&["a"], Some(Status::cancelled("reset by the client")));
        assert_eq!(stream.message().await.unwrap().unwrap(), "a");
        assert!(stream.message().await.unwrap().is_none());
        assert!(!end.ended_cleanly(), "the body knows better");
    }

    #[tokio::test]
    async fn only_a_cleanly_ended_client_stream_is_committed() {
        let (stream, end) = inbound(&["a", "b"], None);
        let (answer, seen) = forward(stream, end).await;
        answer.unwrap();
        assert_eq!(seen, ["a", "b", "commit"]);

        for cut in [
            Status::cancelled("reset by the client"),
            Status::unknown("connection closed"),
        ] {
            let (stream, end) = inbound(&["a", "b"], Some(cut.clone()));
            let (answer, seen) = forward(stream, end).await;
            assert!(answer.is_err(), "{cut:?}");
            assert!(!seen.contains(&"commit".to_owned()), "{cut:?}: {seen:?}");
        }
    }
}
