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
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
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
            headers: otlp_headers(|name| std::env::var(name).ok()),
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
    /// What the runtime's own exporter sends too (`OTEL_EXPORTER_OTLP_HEADERS`: a collector's auth).
    headers: MetadataMap,
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
        let mut request = tonic::Request::new(request);
        *request.metadata_mut() = self.headers.clone();
        match tokio::time::timeout(RELAY_TIMEOUT, client.export(request)).await {
            Ok(Ok(_)) => {}
            Ok(Err(s)) => {
                tracing::warn!(status = %s, "traces: the collector refused relayed spans")
            }
            Err(_) => tracing::warn!("traces: the collector did not answer in time"),
        }
    }
}

/// `OTEL_EXPORTER_OTLP_TRACES_HEADERS` or `OTEL_EXPORTER_OTLP_HEADERS` (`key=value,key2=value2`, values
/// percent-encoded) as gRPC metadata; entries that are not valid metadata are left out (and logged).
fn otlp_headers(get: impl Fn(&str) -> Option<String>) -> MetadataMap {
    let mut map = MetadataMap::new();
    let Some(raw) = get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
        .filter(|v| !v.trim().is_empty())
        .or_else(|| get("OTEL_EXPORTER_OTLP_HEADERS"))
    else {
        return map;
    };
    for entry in raw.split(',').filter(|e| !e.trim().is_empty()) {
        let parsed = entry.split_once('=').and_then(|(k, v)| {
            let key = MetadataKey::from_bytes(k.trim().to_ascii_lowercase().as_bytes()).ok()?;
            let value = MetadataValue::try_from(percent_decode(v.trim())?.as_str()).ok()?;
            Some((key, value))
        });
        match parsed {
            Some((key, value)) => {
                map.insert(key, value);
            }
            None => {
                tracing::warn!("traces: a header in OTEL_EXPORTER_OTLP_HEADERS is not key=value")
            }
        }
    }
    map
}

/// `%XX` sequences decoded; None when one is malformed or the result is not UTF-8.
fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_headers_parse_as_the_sdk_reads_them() {
        let env = |general: &'static str, traces: &'static str| {
            move |name: &str| match name {
                "OTEL_EXPORTER_OTLP_HEADERS" => Some(general.to_owned()),
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS" => Some(traces.to_owned()),
                _ => None,
            }
        };
        let h = otlp_headers(env("Authorization=Bearer%20abc, x-tenant = t1", ""));
        assert_eq!(
            h.get("authorization").and_then(|v| v.to_str().ok()),
            Some("Bearer abc")
        );
        assert_eq!(h.get("x-tenant").and_then(|v| v.to_str().ok()), Some("t1"));
        // The traces' own setting wins; malformed entries are left out.
        let h = otlp_headers(env("a=1", "b=2,broken,c=%zz"));
        assert!(h.get("a").is_none());
        assert_eq!(h.get("b").and_then(|v| v.to_str().ok()), Some("2"));
        assert_eq!(h.len(), 1);
        assert!(otlp_headers(|_| None).is_empty());
    }
}
