//! Logs and traces of a MentisSandbox process (docs/ARCHITECTURE.md, "Observability"), shared by the runtime
//! and the executor:
//! - the log subscriber: text or JSON lines (`MENTIS_LOG_FORMAT`) on stderr, JSON lines carrying the trace
//!   and span ids of the span they were logged in;
//! - when traces are on, an OpenTelemetry layer that turns our spans (info and above, our crates only) into
//!   OpenTelemetry spans, for whatever exporter the process chose (OTLP in the runtime, [`SpanBuffer`] in
//!   the executor);
//! - W3C trace context over gRPC: [`GrpcTraceLayer`] gives every incoming call a span continuing the
//!   caller's trace, [`inject`] carries the current span's context into an outgoing call.
//!
//! Traces are off unless a process installs a tracer provider; then nothing here creates a span or
//! touches metadata.

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Dispatch;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::prelude::*;

#[cfg(feature = "grpc")]
mod buffer;
mod json;
#[cfg(feature = "grpc")]
mod propagation;
mod state;

#[cfg(feature = "grpc")]
pub use buffer::SpanBuffer;
#[cfg(feature = "grpc")]
pub use propagation::{GrpcTraceLayer, GrpcTraceService, inject};

pub use state::traces_on;

/// Whether the current span belongs to a sampled trace: work done outside one (a background check, a
/// reconciliation) gets no spans of its own, so it never shows up as a trace of its own.
pub fn in_trace() -> bool {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    traces_on()
        && tracing::Span::current()
            .context()
            .span()
            .span_context()
            .is_sampled()
}

/// The environment variable that chooses the log format.
pub const LOG_FORMAT_ENV: &str = "MENTIS_LOG_FORMAT";

/// How log lines look on stderr.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LogFormat {
    /// One human-readable line per event (tracing's default format), coloured at a terminal.
    #[default]
    Text,
    /// One JSON object per line: timestamp, level, target, fields, the span and its parents, and
    /// `trace_id` / `span_id` when traces are on.
    Json,
}

impl LogFormat {
    /// `text` or `json` (any case); empty is text.
    pub fn parse(value: &str) -> Result<Self, String> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "text" => Ok(Self::Text),
            "json" => Ok(Self::Json),
            other => Err(format!(
                "{LOG_FORMAT_ENV} must be text or json, not {other:?}"
            )),
        }
    }

    /// From `MENTIS_LOG_FORMAT`.
    pub fn from_env() -> Result<Self, String> {
        Self::parse(&std::env::var(LOG_FORMAT_ENV).unwrap_or_default())
    }
}

/// The target of spans that stay out of traces: long-lived ones (a sandbox's health watch, a kernel's
/// process) that would otherwise hang minutes or hours of unrelated work under one trace. Create them with
/// `parent: None` too: a span keeps its parent open, and a trace's span must not wait for a watch to end.
pub const UNTRACED: &str = "mentis_untraced";

/// The crates whose spans become OpenTelemetry spans (at info and above).
const TRACED_CRATES: [&str; 7] = [
    "mentis_runtime",
    "mentis_app",
    "mentis_store",
    "mentis_executor",
    "mentis_backend_docker",
    "mentis_core",
    "mentis_telemetry",
];

/// Installs the process's subscriber: logs on stderr in `format`, filtered by `filter`, and when `traces`
/// is given, our spans to it under the instrumentation scope `scope`.
pub fn install(
    filter: EnvFilter,
    format: LogFormat,
    traces: Option<&SdkTracerProvider>,
    scope: &'static str,
) -> Result<(), tracing::dispatcher::SetGlobalDefaultError> {
    install_to(filter, format, traces, scope, std::io::stderr)
}

/// [`install`] with log lines going to `writer` (tests read them back).
pub fn install_to<W>(
    filter: EnvFilter,
    format: LogFormat,
    traces: Option<&SdkTracerProvider>,
    scope: &'static str,
    writer: W,
) -> Result<(), tracing::dispatcher::SetGlobalDefaultError>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let otel = traces.map(|provider| {
        let targets = TRACED_CRATES.iter().fold(Targets::new(), |t, name| {
            t.with_target(*name, tracing::Level::INFO)
        });
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer(scope))
            .with_filter(targets)
    });
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let logs = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .with_ansi(ansi)
            .with_filter(filter)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .with_writer(writer)
            .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
            .event_format(json::JsonLines)
            .with_filter(filter)
            .boxed(),
    };
    let dispatch = Dispatch::new(tracing_subscriber::registry().with(otel).with(logs));
    state::set_dispatch(&dispatch);
    tracing::dispatcher::set_global_default(dispatch)?;
    if traces.is_some() {
        state::set_traces_on();
    }
    Ok(())
}
