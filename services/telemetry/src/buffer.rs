//! The executor's span exporter. An executor cannot reach a collector (its network reaches nothing but the
//! control plane, and the control plane calls it, not the other way round), so its spans wait here, bounded,
//! until the runtime takes them (`ExecutorService/TakeSpans`) and relays them to its own OTLP endpoint.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::transform::common::tonic::ResourceAttributesWithSchema;
use opentelemetry_proto::transform::trace::tonic::group_spans_by_resource_and_scope;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SpanData, SpanExporter};
use prost::Message as _;

/// Finished spans waiting for the runtime, at most `capacity`: when full, the oldest go first.
#[derive(Clone, Debug)]
pub struct SpanBuffer {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug)]
struct Inner {
    spans: VecDeque<SpanData>,
    capacity: usize,
    dropped: u64,
    resource: Option<Resource>,
}

/// What [`SpanBuffer::take`] hands over.
#[derive(Debug, Default)]
pub struct TakenSpans {
    /// The protobuf encoding of an OTLP `ExportTraceServiceRequest` (empty when there were no spans).
    pub request: Vec<u8>,
    /// How many spans were dropped since the last take because the buffer was full.
    pub dropped: u64,
}

impl SpanBuffer {
    /// An empty buffer for at most `capacity` spans.
    pub fn new(capacity: usize) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Inner {
                spans: VecDeque::new(),
                capacity: capacity.max(1),
                dropped: 0,
                resource: None,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Every span waiting, as one OTLP export request, and how many were dropped; the buffer is empty after.
    pub fn take(&self) -> TakenSpans {
        let (spans, dropped, resource) = {
            let mut inner = self.lock();
            let spans: Vec<SpanData> = inner.spans.drain(..).collect();
            let dropped = std::mem::take(&mut inner.dropped);
            (spans, dropped, inner.resource.clone())
        };
        if spans.is_empty() {
            return TakenSpans {
                request: Vec::new(),
                dropped,
            };
        }
        let resource = resource.unwrap_or_else(|| Resource::builder_empty().build());
        let request = ExportTraceServiceRequest {
            resource_spans: group_spans_by_resource_and_scope(
                spans,
                &ResourceAttributesWithSchema::from(&resource),
            ),
        };
        TakenSpans {
            request: request.encode_to_vec(),
            dropped,
        }
    }
}

impl SpanExporter for SpanBuffer {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let mut inner = self.lock();
        for span in batch {
            if inner.spans.len() >= inner.capacity {
                inner.spans.pop_front();
                inner.dropped += 1;
            }
            inner.spans.push_back(span);
        }
        Ok(())
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.lock().resource = Some(resource.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry::trace::{Tracer as _, TracerProvider as _};
    use opentelemetry_sdk::trace::SdkTracerProvider;

    #[test]
    fn a_full_buffer_drops_its_oldest_spans_and_says_how_many() {
        let buffer = SpanBuffer::new(2);
        let provider = SdkTracerProvider::builder()
            .with_simple_exporter(buffer.clone())
            .with_resource(Resource::builder_empty().with_service_name("test").build())
            .build();
        let tracer = provider.tracer("t");
        for name in ["a", "b", "c"] {
            tracer.in_span(name, |_| {});
        }
        let taken = buffer.take();
        assert_eq!(taken.dropped, 1);
        let request = ExportTraceServiceRequest::decode(taken.request.as_slice())
            .expect("a valid export request");
        let names: Vec<&str> = request
            .resource_spans
            .iter()
            .flat_map(|r| &r.scope_spans)
            .flat_map(|s| &s.spans)
            .map(|s| s.name.as_str())
            .collect();
        assert_eq!(names, ["b", "c"]);
        let service = request.resource_spans[0]
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .map(|a| format!("{:?}", a.value));
        assert!(
            service.as_ref().is_some_and(|s| s.contains("test")),
            "{service:?}"
        );
        let again = buffer.take();
        assert!(again.request.is_empty());
        assert_eq!(again.dropped, 0);
    }
}
