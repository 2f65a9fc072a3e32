//! JSON log lines carry the trace and span ids of the span they were logged in (its own process: the test
//! installs the global subscriber).

use std::io::Write;
use std::sync::{Arc, Mutex};

use mentis_telemetry::{LogFormat, SpanBuffer};
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::EnvFilter;

/// Log lines, kept for the test to read.
#[derive(Clone, Default)]
struct Lines(Arc<Mutex<Vec<u8>>>);

impl Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn json_lines_carry_the_trace_and_span_of_their_span() -> Result<(), Box<dyn std::error::Error>> {
    let spans = SpanBuffer::new(16);
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(spans.clone())
        .build();
    let lines = Lines::default();
    let sink = lines.clone();
    mentis_telemetry::install_to(
        EnvFilter::new("info"),
        LogFormat::Json,
        Some(&provider),
        "test",
        move || sink.clone(),
    )?;
    assert!(mentis_telemetry::traces_on());

    tracing::info!(outside = 1, "before any span");
    {
        // The target must be one of ours for the span to be traced.
        let span = tracing::info_span!(target: "mentis_runtime::test", "work", sandbox_id = "sb-1");
        let _entered = span.enter();
        tracing::info!(count = 3, "inside");
    }
    drop(provider);

    let text = String::from_utf8(lines.0.lock().map(|l| l.clone()).unwrap_or_default())?;
    let parsed: Vec<serde_json::Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()?;
    let [before, inside] = parsed.as_slice() else {
        return Err(format!("two lines expected:\n{text}").into());
    };
    assert_eq!(before["fields"]["message"], "before any span");
    assert_eq!(before["fields"]["outside"], 1);
    assert!(before.get("trace_id").is_none(), "{before}");

    assert_eq!(inside["level"], "INFO");
    assert_eq!(inside["fields"]["count"], 3);
    assert_eq!(inside["span"]["name"], "work");
    assert_eq!(inside["span"]["sandbox_id"], "sb-1");
    let trace_id = inside["trace_id"].as_str().unwrap_or_default();
    let span_id = inside["span_id"].as_str().unwrap_or_default();
    assert_eq!((trace_id.len(), span_id.len()), (32, 16), "{inside}");

    // The ids are those of the exported span.
    let taken = spans.take();
    use prost::Message as _;
    let request =
        opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest::decode(
            taken.request.as_slice(),
        )?;
    let span = request
        .resource_spans
        .iter()
        .flat_map(|r| &r.scope_spans)
        .flat_map(|s| &s.spans)
        .find(|s| s.name == "work")
        .ok_or("the span was not exported")?;
    assert_eq!(hex(&span.trace_id), trace_id);
    assert_eq!(hex(&span.span_id), span_id);
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
