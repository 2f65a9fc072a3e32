//! The runtime's metrics (docs/ARCHITECTURE.md, "Observability"): OpenTelemetry instruments, read by a
//! Prometheus endpoint (`MENTIS_METRICS_LISTEN`, `GET /metrics`) and pushed over OTLP when traces' OTLP
//! endpoint is set (`OTEL_EXPORTER_OTLP_METRICS_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`). Off by
//! default: then every instrument is OpenTelemetry's no-op.
//!
//! Instruments record where things happen (a create, an action's end, a cut-off); gauges of state
//! (sandboxes by state and space, pool members) are read from the manager at each collection.

use std::sync::{LazyLock, OnceLock};

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram, Meter, MeterProvider as _, UpDownCounter};
use opentelemetry_sdk::metrics::SdkMeterProvider;

/// The instrumentation scope of our metrics.
const SCOPE: &str = "mentis-runtime";

/// Buckets of the latency histograms, in seconds: from a warm claim (milliseconds) to a cold create of a big
/// image or a long command.
const SECONDS: [f64; 14] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// The instruments the runtime records into.
#[derive(Debug)]
pub struct Metrics {
    /// Sandboxes created, by `path` (warm: from a pool; cold: a new container) and `outcome` (ok, error).
    pub creates: Counter<u64>,
    /// How long a create took, by `path`.
    pub create_duration: Histogram<f64>,
    /// Actions started, by `kind` (shell, ipython).
    pub actions_started: Counter<u64>,
    /// Actions ended, by `kind` and `reason` (Exited, TimedOut, Cancelled, Lost, ...; ok, error, aborted
    /// for cells).
    pub actions_ended: Counter<u64>,
    /// How long actions ran, by `kind` and `reason`.
    pub action_duration: Histogram<f64>,
    /// Observations appended to the logs.
    pub observations: Counter<u64>,
    /// Their approximate size in bytes.
    pub observation_bytes: Counter<u64>,
    /// Open observation streams (Execute, Connect, StreamObservations).
    pub subscribers: UpDownCounter<i64>,
    /// Streams cut off because their client stopped reading.
    pub cut_offs: Counter<u64>,
    /// Failed health checks of executors.
    pub executor_health_failures: Counter<u64>,
    /// Open connections, by `listener` (api, http, health, metrics).
    pub connections_open: UpDownCounter<i64>,
    /// Connections closed as soon as they were accepted, by `listener` and `reason` (limit: the listener's
    /// total; per_address: the client address's share).
    pub connections_refused: Counter<u64>,
    /// Connections closed by their listener, by `listener` and `reason` (first_request: none came in time;
    /// idle: no byte went either way for too long; evicted: a newcomer took the place of this connection,
    /// which had brought no request, at a full listener).
    pub connections_timed_out: Counter<u64>,
    /// Connections and DNS questions the egress gateway refused, by `protocol` (dns, tcp, tls, http).
    pub egress_denied: Counter<u64>,
}

/// The process's instruments: no-ops until [`MetricsExport::start`] installed a provider (it must run
/// before anything records).
pub fn metrics() -> &'static Metrics {
    static METRICS: LazyLock<Metrics> =
        LazyLock::new(|| Metrics::new(&opentelemetry::global::meter(SCOPE)));
    &METRICS
}

impl Metrics {
    fn new(meter: &Meter) -> Self {
        Self {
            creates: meter
                .u64_counter("mentis.sandbox.creates")
                .with_description("Sandboxes created, by path (warm, cold) and outcome (ok, error)")
                .build(),
            create_duration: meter
                .f64_histogram("mentis.sandbox.create.duration")
                .with_unit("s")
                .with_description("Time to create a sandbox, by path (warm, cold)")
                .with_boundaries(SECONDS.to_vec())
                .build(),
            actions_started: meter
                .u64_counter("mentis.actions.started")
                .with_description("Actions started, by kind")
                .build(),
            actions_ended: meter
                .u64_counter("mentis.actions.ended")
                .with_description("Actions ended, by kind and reason")
                .build(),
            action_duration: meter
                .f64_histogram("mentis.action.duration")
                .with_unit("s")
                .with_description("How long actions ran, by kind and reason")
                .with_boundaries(SECONDS.to_vec())
                .build(),
            observations: meter
                .u64_counter("mentis.observations.appended")
                .with_description("Observations appended to sandbox logs")
                .build(),
            observation_bytes: meter
                .u64_counter("mentis.observations.appended.size")
                .with_unit("By")
                .with_description("Approximate bytes of the observations appended to sandbox logs")
                .build(),
            subscribers: meter
                .i64_up_down_counter("mentis.streams.open")
                .with_description("Open observation streams")
                .build(),
            cut_offs: meter
                .u64_counter("mentis.streams.cut_offs")
                .with_description("Streams cut off because their client stopped reading")
                .build(),
            executor_health_failures: meter
                .u64_counter("mentis.executor.health_failures")
                .with_description("Failed health checks of sandbox executors")
                .build(),
            connections_open: meter
                .i64_up_down_counter("mentis.connections.open")
                .with_description("Open connections, by listener")
                .build(),
            connections_refused: meter
                .u64_counter("mentis.connections.refused")
                .with_description(
                    "Connections closed at accept, by listener and reason (limit, per_address)",
                )
                .build(),
            connections_timed_out: meter
                .u64_counter("mentis.connections.timed_out")
                .with_description(
                    "Connections closed by their listener, by listener and reason (first_request, idle, evicted)",
                )
                .build(),
            egress_denied: meter
                .u64_counter("mentis.egress.denied")
                .with_description(
                    "Connections and DNS questions of sandboxes the egress gateway refused, by protocol",
                )
                .build(),
        }
    }
}

/// Counts one refusal of the egress gateway.
pub fn egress_denied(protocol: &'static str) {
    metrics().egress_denied.add(1, &[kv("protocol", protocol)]);
}

/// One attribute.
pub fn kv(key: &'static str, value: impl Into<opentelemetry::Value>) -> KeyValue {
    KeyValue::new(key, value)
}

/// Where metrics go, when anywhere: the provider with its readers.
#[derive(Debug)]
pub struct MetricsExport {
    provider: SdkMeterProvider,
    prometheus: Option<prometheus::Registry>,
}

static EXPORT: OnceLock<MetricsExport> = OnceLock::new();

/// The process's metrics export, once [`MetricsExport::start`] made one.
pub fn export() -> Option<&'static MetricsExport> {
    EXPORT.get()
}

impl MetricsExport {
    /// A provider reading into a Prometheus registry when `prometheus` is set, and pushing over OTLP when
    /// `otlp` is; nothing when neither (metrics stay no-ops). Installs it for the process, before anything
    /// records (the instruments are made at their first use); once per process.
    pub fn start(prometheus: bool, otlp: bool) -> anyhow::Result<Option<&'static Self>> {
        if !prometheus && !otlp {
            return Ok(None);
        }
        let mut builder = SdkMeterProvider::builder().with_resource(crate::telemetry::resource());
        let prometheus = match prometheus {
            true => {
                let registry = prometheus::Registry::new();
                let reader = opentelemetry_prometheus::exporter()
                    .with_registry(registry.clone())
                    .build()?;
                builder = builder.with_reader(reader);
                Some(registry)
            }
            false => None,
        };
        if otlp {
            let exporter = opentelemetry_otlp::MetricExporter::builder()
                .with_tonic()
                .build()?;
            builder = builder.with_periodic_exporter(exporter);
        }
        let provider = builder.build();
        opentelemetry::global::set_meter_provider(provider.clone());
        let _ = EXPORT.set(Self {
            provider,
            prometheus,
        });
        Ok(EXPORT.get())
    }

    /// The meter of the gauges read at each collection (`server::observe_manager`).
    pub fn meter(&self) -> Meter {
        self.provider.meter(SCOPE)
    }

    /// Whether per-sandbox usage is shown (on the Prometheus endpoint only: see [`SandboxUsage`]), so worth
    /// reading at each health check.
    pub fn per_sandbox(&self) -> bool {
        self.prometheus.is_some()
    }

    /// Adds a collector read at each scrape of `GET /metrics` (nothing without the endpoint).
    pub fn register(&self, collector: Box<dyn prometheus::core::Collector>) {
        if let Some(registry) = &self.prometheus
            && let Err(e) = registry.register(collector)
        {
            tracing::warn!(error = %e, "metrics: cannot register a collector");
        }
    }

    /// The Prometheus text exposition of every metric (None without the endpoint), for `GET /metrics`.
    pub fn render(&self) -> Option<Vec<u8>> {
        self.prometheus.as_ref().map(render)
    }

    /// Pushes what is left and stops.
    pub fn shutdown(&self) {
        if let Err(e) = self.provider.shutdown() {
            tracing::warn!(error = %e, "metrics: the last export failed");
        }
    }
}

/// The text exposition of `registry`.
fn render(registry: &prometheus::Registry) -> Vec<u8> {
    use prometheus::Encoder as _;
    let mut out = Vec::new();
    if let Err(e) = prometheus::TextEncoder::new().encode(&registry.gather(), &mut out) {
        tracing::warn!(error = %e, "metrics: cannot encode");
    }
    out
}

/// Per-sandbox memory and CPU time, for the Prometheus endpoint only: made afresh at each scrape from the
/// sandboxes running then, so a deleted sandbox's series goes with it. (OpenTelemetry's SDK keeps the last
/// value of every series it ever saw, which per sandbox would grow without bound.)
pub struct SandboxUsage<F> {
    memory: prometheus::GaugeVec,
    cpu: prometheus::CounterVec,
    read: F,
}

/// One running sandbox's usage: id, space, memory bytes, CPU microseconds.
pub type UsageRow = (String, String, Option<u64>, Option<u64>);

impl<F> SandboxUsage<F>
where
    F: Fn() -> Vec<UsageRow> + Send + Sync + 'static,
{
    /// A collector reading the sandboxes' usage with `read`.
    pub fn new(read: F) -> prometheus::Result<Self> {
        let labels = ["sandbox_id", "space"];
        Ok(Self {
            memory: prometheus::GaugeVec::new(
                prometheus::Opts::new(
                    "mentis_sandbox_memory_bytes",
                    "Memory a running sandbox uses (its cgroup, page cache included), as of its last health check",
                ),
                &labels,
            )?,
            cpu: prometheus::CounterVec::new(
                prometheus::Opts::new(
                    "mentis_sandbox_cpu_seconds_total",
                    "CPU time a running sandbox used since its container started, as of its last health check",
                ),
                &labels,
            )?,
            read,
        })
    }
}

impl<F> prometheus::core::Collector for SandboxUsage<F>
where
    F: Fn() -> Vec<UsageRow> + Send + Sync + 'static,
{
    fn desc(&self) -> Vec<&prometheus::core::Desc> {
        let mut d = self.memory.desc();
        d.extend(self.cpu.desc());
        d
    }

    fn collect(&self) -> Vec<prometheus::proto::MetricFamily> {
        self.memory.reset();
        self.cpu.reset();
        for (id, space, memory, cpu) in (self.read)() {
            let labels = [id.as_str(), space.as_str()];
            if let Some(bytes) = memory {
                self.memory.with_label_values(&labels).set(bytes as f64);
            }
            if let Some(usec) = cpu {
                self.cpu
                    .with_label_values(&labels)
                    .inc_by(usec as f64 / 1e6);
            }
        }
        let mut families = self.memory.collect();
        families.extend(self.cpu.collect());
        families
    }
}
