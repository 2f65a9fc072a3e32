//! A request the server cannot decode is the client's mistake, never INTERNAL. tonic reports every decode
//! failure of a request as INTERNAL (invalid UTF-8 in a string field, bytes that are no protobuf message, a
//! bad compression flag, a body cut inside a message) and one over the size limit as OUT_OF_RANGE;
//! [`client_fault`] tells those statuses apart from the runtime's own and says what the client did wrong,
//! as INVALID_ARGUMENT or RESOURCE_EXHAUSTED (MESSAGE_TOO_LARGE, the code gRPC gives a message over the
//! limit). Unary and server-streaming calls decode their one request before the service runs, and tonic
//! answers the failure in the response headers: [`DecodeErrorLayer`] rewrites those. Client-streamed
//! messages (Connect, WriteFile, Upload) fail in the inbound stream, where the service maps them with
//! [`inbound`].

use std::task::{Context, Poll};

use futures::TryFutureExt;
use mentis_core::{Error, Reason, quoted};
use tonic::{Code, Status};

use super::status::to_status;

/// The domain error a decode failure of a request stands for, if `status` is one (None for every other
/// status, which the runtime made itself).
pub fn client_fault(status: &Status) -> Option<Error> {
    let m = status.message();
    let invalid = |what: &str| {
        Some(Error::invalid(format!(
            "the request could not be decoded ({what}): {}",
            quoted(m)
        )))
    };
    match status.code() {
        Code::Internal if m.starts_with("failed to decode Protobuf message") => {
            invalid("not a valid protobuf message of the method's request type")
        }
        Code::Internal if m.starts_with("protocol error:") => invalid("bad gRPC framing"),
        Code::Internal if m.starts_with("Error decompressing") => invalid("bad compressed data"),
        Code::Internal if m.starts_with("Unexpected EOF decoding stream") => {
            invalid("the body ends inside a message")
        }
        Code::Internal if m.starts_with("Missing request message") => {
            invalid("the body holds no message")
        }
        Code::OutOfRange | Code::ResourceExhausted
            if m.starts_with("Error, decoded message length too large")
                || m.starts_with("Error decompressing: size limit") =>
        {
            Some(Error::new(
                Reason::MessageTooLarge,
                format!("the request message is over the size limit: {m}"),
            ))
        }
        _ => None,
    }
}

/// The status a client gets for an error of its inbound stream: a decode failure as the client's
/// mistake, anything else (a reset, a cut connection) as the transport said it.
pub fn inbound(status: Status) -> Status {
    match client_fault(&status) {
        Some(e) => to_status(e),
        None => status,
    }
}

/// Adds [`RewriteDecodeErrors`] to a server.
#[derive(Debug, Clone, Copy, Default)]
pub struct DecodeErrorLayer;

impl<S> tower::Layer<S> for DecodeErrorLayer {
    type Service = RewriteDecodeErrors<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RewriteDecodeErrors { inner }
    }
}

/// Rewrites a response whose headers carry a decode failure's status (a trailers-only answer) into the
/// status [`client_fault`] gives it, details included.
#[derive(Debug, Clone)]
pub struct RewriteDecodeErrors<S> {
    inner: S,
}

type Rewrite<B> = fn(http::Response<B>) -> http::Response<B>;

impl<S, Req, B> tower::Service<Req> for RewriteDecodeErrors<S>
where
    S: tower::Service<Req, Response = http::Response<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = futures::future::MapOk<S::Future, Rewrite<B>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        self.inner.call(req).map_ok(rewrite::<B> as Rewrite<B>)
    }
}

fn rewrite<B>(mut response: http::Response<B>) -> http::Response<B> {
    rewrite_headers(response.headers_mut());
    response
}

/// Replaces a decode failure's status in `headers` (a trailers-only answer); other headers are left alone.
fn rewrite_headers(headers: &mut http::HeaderMap) {
    if !headers.contains_key("grpc-status") {
        return;
    }
    let Some(fault) = Status::from_header_map(headers)
        .as_ref()
        .and_then(client_fault)
    else {
        return;
    };
    for name in ["grpc-status", "grpc-message", "grpc-status-details-bin"] {
        headers.remove(name);
    }
    if let Err(e) = to_status(fault).add_header(headers) {
        tracing::warn!(error = %e, "a decode failure's status could not be rewritten");
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tonic_types::StatusExt;

    fn reason(s: &Status) -> String {
        s.get_error_details().error_info().unwrap().reason.clone()
    }

    #[test]
    fn decode_failures_are_the_clients_and_the_rest_is_left_alone() {
        for (status, code, why) in [
            (
                Status::internal(
                    "failed to decode Protobuf message: SandboxSpec.image: invalid string value: data is not UTF-8 encoded",
                ),
                Code::InvalidArgument,
                "INVALID_ARGUMENT",
            ),
            (
                Status::internal(
                    "protocol error: received message with invalid compression flag: 7 (valid flags are 0 and 1), while sending request",
                ),
                Code::InvalidArgument,
                "INVALID_ARGUMENT",
            ),
            (
                Status::internal("Unexpected EOF decoding stream."),
                Code::InvalidArgument,
                "INVALID_ARGUMENT",
            ),
            (
                Status::internal("Missing request message."),
                Code::InvalidArgument,
                "INVALID_ARGUMENT",
            ),
            (
                Status::out_of_range(
                    "Error, decoded message length too large: found 5000000 bytes, the limit is: 4194304 bytes",
                ),
                Code::ResourceExhausted,
                "MESSAGE_TOO_LARGE",
            ),
            (
                Status::resource_exhausted(
                    "Error decompressing: size limit, of 10 bytes, exceeded while decompressing message",
                ),
                Code::ResourceExhausted,
                "MESSAGE_TOO_LARGE",
            ),
        ] {
            let s = inbound(status.clone());
            assert_eq!(s.code(), code, "{status:?}");
            assert_eq!(reason(&s), why);
            assert!(s.message().len() < 400, "{}", s.message());
        }
        for other in [
            Status::internal("internal error (error id 1)"),
            Status::cancelled("gone"),
            Status::out_of_range("after_seq 9 is beyond"),
        ] {
            assert_eq!(client_fault(&other), None, "{other:?}");
        }
    }

    #[test]
    fn a_trailers_only_decode_failure_is_rewritten_in_the_headers() {
        let mut r = Status::internal("failed to decode Protobuf message: invalid wire type")
            .into_http::<()>();
        rewrite_headers(r.headers_mut());
        let s = Status::from_header_map(r.headers()).unwrap();
        assert_eq!(s.code(), Code::InvalidArgument);
        assert_eq!(reason(&s), "INVALID_ARGUMENT");
        // The runtime's own statuses pass untouched.
        let mut r = Status::internal("internal error (error id 1)").into_http::<()>();
        rewrite_headers(r.headers_mut());
        assert_eq!(
            Status::from_header_map(r.headers()).unwrap().code(),
            Code::Internal
        );
        let mut ok = http::Response::new(());
        rewrite_headers(ok.headers_mut());
        assert!(ok.headers().is_empty());
    }
}
