//! W3C trace context (`traceparent`, `tracestate`) over gRPC: taken from an incoming call's metadata, so a
//! client's trace continues in ours, and put into the metadata of every call we make.

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};

use futures::future::Either;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

static PROPAGATOR: LazyLock<TraceContextPropagator> = LazyLock::new(TraceContextPropagator::new);

/// Puts the current span's trace context into an outgoing call's metadata (nothing when traces are off).
pub fn inject(metadata: &mut MetadataMap) {
    if !crate::state::traces_on() {
        return;
    }
    let cx = tracing::Span::current().context();
    PROPAGATOR.inject_context(&cx, &mut MetadataInjector(metadata));
}

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            MetadataKey::from_bytes(key.as_bytes()),
            MetadataValue::try_from(value.as_str()),
        ) {
            self.0.insert(key, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// A tower layer for a gRPC server: every call runs in a server span named after its method
/// (`mentis.api.v1.ActionService/Execute`), a child of the caller's `traceparent` when it sent one, with
/// the call's gRPC status when the response carries it in its headers. Passes calls through untouched when
/// traces are off.
#[derive(Clone, Copy, Debug, Default)]
pub struct GrpcTraceLayer;

impl<S> tower::Layer<S> for GrpcTraceLayer {
    type Service = GrpcTraceService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        GrpcTraceService { inner }
    }
}

/// The service [`GrpcTraceLayer`] makes.
#[derive(Clone, Debug)]
pub struct GrpcTraceService<S> {
    inner: S,
}

type Traced<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

/// The gRPC statuses that are the server's failure rather than the client's (OpenTelemetry's semantic
/// conventions for gRPC server spans): UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE,
/// DATA_LOSS.
fn server_error(code: i64) -> bool {
    matches!(code, 2 | 4 | 12 | 13 | 14 | 15)
}

impl<S, B, R> tower::Service<http::Request<B>> for GrpcTraceService<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Either<S::Future, Traced<S::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if !crate::state::traces_on() {
            return Either::Left(self.inner.call(request));
        }
        let path = request.uri().path().trim_start_matches('/');
        let (service, method) = path.split_once('/').unwrap_or((path, ""));
        // Probes and reflection are traced only when the caller asks (sends a traceparent): a mesh's health
        // checks every few seconds are not traces anyone wants.
        if (service.starts_with("grpc.health.") || service.starts_with("grpc.reflection."))
            && !request.headers().contains_key("traceparent")
        {
            return Either::Left(self.inner.call(request));
        }
        let span = tracing::info_span!(
            "grpc",
            otel.name = %path,
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            rpc.system = "grpc",
            rpc.service = %service,
            rpc.method = %method,
            rpc.grpc.status_code = tracing::field::Empty,
        );
        let parent = PROPAGATOR.extract(&HeaderExtractor(request.headers()));
        let _ = span.set_parent(parent);
        let call = {
            let _entered = span.enter();
            self.inner.call(request)
        };
        let recorder = span.clone();
        Either::Right(Box::pin(
            async move {
                let response = call.await;
                if let Ok(r) = &response {
                    // A call that fails before its first message answers with the status in the headers;
                    // a stream's status comes in the trailers, after this span.
                    let code = r
                        .headers()
                        .get("grpc-status")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.parse::<i64>().ok());
                    if let Some(code) = code {
                        recorder.record("rpc.grpc.status_code", code);
                        if server_error(code) {
                            recorder.record("otel.status_code", "error");
                        }
                    }
                }
                response
            }
            .instrument(span),
        ))
    }
}
