//! JSON log lines: tracing's JSON shape (timestamp, level, target, fields, span, spans) plus the trace and
//! span ids of the span the event was logged in, so a log line leads to its trace.

use std::fmt;

use opentelemetry::trace::TraceContextExt as _;
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Formats one event as one JSON object on one line.
pub(crate) struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut line = Map::new();
        let mut timestamp = String::new();
        SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        line.insert("timestamp".into(), timestamp.into());
        let meta = event.metadata();
        line.insert("level".into(), meta.level().as_str().into());
        let mut fields = Fields(Map::new());
        event.record(&mut fields);
        line.insert("fields".into(), Value::Object(fields.0));
        line.insert("target".into(), meta.target().into());

        if let Some(scope) = ctx.event_scope() {
            let mut spans = Vec::new();
            for span in scope.from_root() {
                let mut entry = Map::new();
                entry.insert("name".into(), span.name().into());
                if let Some(f) = span.extensions().get::<FormattedFields<JsonFields>>()
                    && let Ok(Value::Object(f)) = serde_json::from_str::<Value>(&f.fields)
                {
                    entry.extend(f);
                }
                spans.push(Value::Object(entry));
            }
            if let Some(leaf) = ctx.lookup_current()
                && let Some((trace_id, span_id)) = otel_ids(&leaf.id())
            {
                line.insert("trace_id".into(), trace_id.into());
                line.insert("span_id".into(), span_id.into());
            }
            if let Some(current) = spans.last() {
                line.insert("span".into(), current.clone());
            }
            line.insert("spans".into(), Value::Array(spans));
        }
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// The OpenTelemetry trace and span ids (lowercase hex) of a span, when traces are on and it is sampled.
fn otel_ids(id: &tracing::span::Id) -> Option<(String, String)> {
    if !crate::state::traces_on() {
        return None;
    }
    let dispatch = crate::state::dispatch()?;
    let cx = tracing_opentelemetry::get_otel_context(id, &dispatch)?;
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

/// An event's fields as JSON values.
struct Fields(Map<String, Value>);

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), value.into());
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.0.insert(field.name().into(), value.to_string().into());
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), format!("{value:?}").into());
    }
}
