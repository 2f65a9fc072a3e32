//! The runtime's traces (docs/ARCHITECTURE.md, "Observability"): on when an OTLP endpoint is configured the
//! standard way, exported over gRPC with the project's tonic, with the executors' spans relayed alongside.
//!
//! Settings are OpenTelemetry's own: `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! turns traces on; `OTEL_SERVICE_NAME` (default `mentis-runtime`), `OTEL_RESOURCE_ATTRIBUTES`,
//! `OTEL_TRACES_SAMPLER` / `OTEL_TRACES_SAMPLER_ARG` (default: every trace, or as the caller's
//! `traceparent` says), `OTEL_EXPORTER_OTLP_HEADERS` and `OTEL_EXPORTER_OTLP_TIMEOUT` are read by the
//! OpenTelemetry SDK; `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` keep traces off.

use std::sync::OnceLock;
use std::time::Duration;

use mentis_core::SandboxId;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracerProvider;
use prost::Message as _;
use tonic::transport::Channel;

use crate::executor_client::ExecutorClient;

/// The service name when `OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` name none.
pub const SERVICE_NAME: &str = "mentis-runtime";
/// The resource attribute relayed executor spans get: the sandbox they ran in.
pub const SANDBOX_ATTRIBUTE: &str = "mentis.sandbox_id";
/// Upper bound of one relay of executor spans to the collector.
const RELAY_TIMEOUT: Duration = Duration::from_secs(10);

/// The OTLP endpoint of the traces, when the environment (read through `get`) turns them on.
pub fn traces_endpoint(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    otlp_endpoint("TRACES", get)
}

/// The OTLP endpoint of the metrics, when the environment (read through `get`) turns them on.
pub fn metrics_endpoint(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    otlp_endpoint("METRICS", get)
}

/// `OTEL_EXPORTER_OTLP_<SIGNAL>_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`, unless the SDK or the signal's
/// exporter is turned off (`OTEL_SDK_DISABLED=true`, `OTEL_<SIGNAL>_EXPORTER=none`).
fn otlp_endpoint(signal: &str, get: impl Fn(&str) -> Option<String>) -> Option<String> {
    let set = |name: &str| {
        get(name)
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
    };
    if set("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || set(&format!("OTEL_{signal}_EXPORTER")).is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        return None;
    }
    set(&format!("OTEL_EXPORTER_OTLP_{signal}_ENDPOINT"))
        .or_else(|| set("OTEL_EXPORTER_OTLP_ENDPOINT"))
}

/// The resource of the runtime's traces and metrics: OpenTelemetry's (`OTEL_SERVICE_NAME`,
/// `OTEL_RESOURCE_ATTRIBUTES`), named `mentis-runtime` when those name no service.
pub fn resource() -> Resource {
    let named = std::env::var("OTEL_SERVICE_NAME").is_ok_and(|v| !v.trim().is_empty())
        || std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|v| v.contains("service.name"));
    let builder = Resource::builder();
    if named {
        builder.build()
    } else {
        builder.with_service_name(SERVICE_NAME).build()
    }
}

/// The process's traces: the provider that exports the runtime's spans, and the relay of the executors'.
#[derive(Debug)]
pub struct Traces {
    provider: SdkTracerProvider,
}

static RELAY: OnceLock<SpanRelay> = OnceLock::new();

impl Traces {
    /// The exporter and provider for `endpoint`, and the relay of executor spans to it. Must run inside
    /// the tokio runtime (the exporter's client is tonic's).
    pub fn start(endpoint: &str) -> anyhow::Result<Self> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(endpoint)
            .build()?;
        let provider = SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(resource())
            .build();
        let channel = Channel::from_shared(endpoint.to_owned())
            .map_err(|e| anyhow::anyhow!("bad OTLP endpoint {endpoint:?}: {e}"))?
            .connect_timeout(Duration::from_secs(5))
            .connect_lazy();
        let _ = RELAY.set(SpanRelay {
            client: TraceServiceClient::new(channel),
        });
        Ok(Self { provider })
    }

    /// The provider, for the log subscriber's OpenTelemetry layer.
    pub fn provider(&self) -> &SdkTracerProvider {
        &self.provider
    }

    /// Exports what is still buffered and stops.
    pub fn shutdown(self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "traces: the last export failed");
        }
    }
}

/// The relay of executor spans, when traces are on.
pub fn relay() -> Option<&'static SpanRelay> {
    RELAY.get()
}

/// Takes an executor's finished spans and sends them to the collector, with the sandbox they ran in.
#[derive(Debug)]
pub struct SpanRelay {
    client: TraceServiceClient<Channel>,
}

impl SpanRelay {
    /// Relays what `executor` holds; failures are logged (spans are best effort, never the sandbox's
    /// problem).
    pub async fn relay(&self, executor: &ExecutorClient, sandbox: SandboxId) {
        let taken = match executor.take_spans().await {
            Ok(taken) => taken,
            Err(e) => {
                tracing::debug!(error = %e.chain(), "traces: cannot take the executor's spans");
                return;
            }
        };
        if taken.dropped_spans > 0 {
            tracing::warn!(
                dropped = taken.dropped_spans,
                "traces: the executor's span buffer was full"
            );
        }
        if taken.export_trace_service_request.is_empty() {
            return;
        }
        let mut request =
            match ExportTraceServiceRequest::decode(taken.export_trace_service_request) {
                Ok(r) => r,
                Err(e) => {
                    tracing::warn!(error = %e, "traces: the executor's spans do not decode");
                    return;
                }
            };
        for spans in &mut request.resource_spans {
            spans
                .resource
                .get_or_insert_with(Default::default)
                .attributes
                .push(KeyValue {
                    key: SANDBOX_ATTRIBUTE.to_owned(),
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(sandbox.to_string())),
                    }),
                    ..Default::default()
                });
        }
        let mut client = self.client.clone();
        match tokio::time::timeout(RELAY_TIMEOUT, client.export(request)).await {
            Ok(Ok(_)) => {}
            Ok(Err(s)) => {
                tracing::warn!(status = %s, "traces: the collector refused relayed spans")
            }
            Err(_) => tracing::warn!("traces: the collector did not answer in time"),
        }
    }
}
