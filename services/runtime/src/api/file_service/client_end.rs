//! How a client ended its request stream: with END_STREAM, or not (a reset, a dropped connection).
//!
//! tonic cannot say. `Streaming::message()` returns `Ok(None)` for a request stream the client cancelled
//! (RST_STREAM with CANCEL, which every gRPC client sends for a cancelled call) exactly as for one it
//! ended, so FileService would take a cancelled WriteFile or Upload for a complete one and commit it.
//! [`Watch`] serves FileService with each request body wrapped below tonic's decoding, and gives each
//! request a [`ClientEnd`] (in its extensions) that the body sets when it ends.
//!
//! Not told apart: a reset with NO_ERROR, which hyper reports as a clean end. HTTP/2 defines it for a
//! server that has answered early, not for a client giving up; gRPC clients cancel with CANCEL.

use std::pin::Pin;
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use mentis_core::Error;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Request, Status};
use tower::Service;

use super::super::status::to_status;

/// How a request body ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    /// The body's last poll returned its end: the client sent END_STREAM.
    Clean,
    /// The body's last poll returned an error: a reset, or the connection dropped.
    Failed,
}

/// How the client ended the request stream it goes with; set once, by the request's body.
#[derive(Debug, Clone, Default)]
pub(super) struct ClientEnd(Arc<OnceLock<Ending>>);

impl ClientEnd {
    /// How the client of `req` ends its request stream (Internal when FileService is served without
    /// [`Watch`]: without it, no write could be told complete).
    pub(super) fn of<T>(req: &Request<T>) -> Result<Self, Status> {
        req.extensions().get::<Self>().cloned().ok_or_else(|| {
            to_status(Error::internal(
                "FileService is served without its stream watch (FileApi::into_service)",
            ))
        })
    }

    /// True once the client has ended its stream with END_STREAM; false while it has not ended, and
    /// forever after it failed.
    pub(super) fn ended_cleanly(&self) -> bool {
        self.0.get() == Some(&Ending::Clean)
    }

    fn set(&self, ending: Ending) {
        // The first ending is the one that happened; a body is not polled past it.
        let _ = self.0.set(ending);
    }
}

/// A request body that records how it ended in its [`ClientEnd`].
struct Watched {
    inner: Body,
    end: ClientEnd,
}

/// `body`, recording how it ends in the returned [`ClientEnd`].
pub(super) fn watch(body: Body) -> (Body, ClientEnd) {
    let end = ClientEnd::default();
    let watched = Watched {
        inner: body,
        end: end.clone(),
    };
    (Body::new(watched), end)
}

impl http_body::Body for Watched {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(None) => self.end.set(Ending::Clean),
            Poll::Ready(Some(Err(_))) => self.end.set(Ending::Failed),
            Poll::Ready(Some(Ok(_))) | Poll::Pending => {}
        }
        polled
    }

    // Never a shortcut: the end is recorded only when a poll returns it (`Body::new` would drop a body
    // that says it has ended, and its end with it).
    fn is_end_stream(&self) -> bool {
        false
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A gRPC service whose requests carry a [`ClientEnd`] set by their body.
#[derive(Debug, Clone)]
pub struct Watch<S>(S);

impl<S> Watch<S> {
    pub(super) fn new(inner: S) -> Self {
        Self(inner)
    }
}

impl<S> Service<http::Request<Body>> for Watch<S>
where
    S: Service<http::Request<Body>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> S::Future {
        let (mut parts, body) = req.into_parts();
        let (body, end) = watch(body);
        parts.extensions.insert(end);
        self.0.call(http::Request::from_parts(parts, body))
    }
}

impl<S: NamedService> NamedService for Watch<S> {
    const NAME: &'static str = S::NAME;
}

/// A request body of `frames`, then its end (for tests: an `Err` frame stands for a reset).
#[cfg(test)]
pub(super) fn body_of(frames: Vec<Result<Frame<Bytes>, Status>>) -> Body {
    struct Frames(futures::stream::Iter<std::vec::IntoIter<Result<Frame<Bytes>, Status>>>);

    impl http_body::Body for Frames {
        type Data = Bytes;
        type Error = Status;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            cx: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
            futures::StreamExt::poll_next_unpin(&mut self.0, cx)
        }
    }

    Body::new(Frames(futures::stream::iter(frames)))
}

#[cfg(test)]
mod tests {
    use http_body::Body as _;

    use super::*;

    /// A body of `frames` data frames, then `last` (an error, or the end).
    fn body(frames: usize, last: Option<Status>) -> Body {
        let mut items: Vec<Result<Frame<Bytes>, Status>> = (0..frames)
            .map(|_| Ok(Frame::data(Bytes::from_static(b"x"))))
            .collect();
        items.extend(last.map(Err));
        body_of(items)
    }

    /// Polls `body` to its end; returns the frames it gave.
    async fn drain(mut body: Watched) -> usize {
        let mut frames = 0;
        while let Some(frame) = std::future::poll_fn(|cx| Pin::new(&mut body).poll_frame(cx)).await
        {
            if frame.is_err() {
                break;
            }
            frames += 1;
        }
        frames
    }

    #[tokio::test]
    async fn only_an_end_of_stream_is_a_clean_end() {
        for (last, clean) in [
            (None, true),
            (Some(Status::cancelled("reset by the client")), false),
            (Some(Status::unknown("connection closed")), false),
        ] {
            let end = ClientEnd::default();
            let watched = Watched {
                inner: body(2, last.clone()),
                end: end.clone(),
            };
            assert!(!end.ended_cleanly(), "not before the end");
            assert_eq!(drain(watched).await, 2);
            assert_eq!(end.ended_cleanly(), clean, "{last:?}");
        }
        // A body dropped before its end never ended cleanly.
        let end = ClientEnd::default();
        drop(Watched {
            inner: body(1, None),
            end: end.clone(),
        });
        assert!(!end.ended_cleanly());
    }
}
