//! `MENTIS_METRICS_LISTEN`: `GET /metrics`, the Prometheus text exposition of the application's metrics,
//! behind the listener's door like every other listener.

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse as _;
use axum::routing::get;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use super::door::{Activity, Guarded, MarkRequests};
use crate::metrics::MetricsExport;

/// Serves `GET /metrics` on `listener` until `shutdown`, in a task of `tasks` (nothing when the export has no
/// Prometheus registry).
pub(super) fn serve(
    export: &'static MetricsExport,
    listener: Guarded,
    shutdown: CancellationToken,
    tasks: &TaskTracker,
) {
    if !export.per_sandbox() {
        return;
    }
    if let Ok(at) = listener.local_addr() {
        tracing::info!(%at, "metrics served at /metrics");
    }
    let app = Router::new()
        .route(
            "/metrics",
            get(move || async move {
                (
                    [(
                        header::CONTENT_TYPE,
                        "text/plain; version=0.0.4; charset=utf-8",
                    )],
                    export.render().unwrap_or_default(),
                )
                    .into_response()
            }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "GET /metrics\n") })
        .layer(MarkRequests);
    let serving = async move {
        let stopping = shutdown.clone();
        let server = axum::serve(
            listener,
            app.into_make_service_with_connect_info::<Activity>(),
        )
        .with_graceful_shutdown(async move { stopping.cancelled().await });
        // A scrape still open after a short grace is cut.
        let served = tokio::select! {
            served = server => served,
            () = async {
                shutdown.cancelled().await;
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            } => Ok(()),
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "the metrics listener failed");
        }
    };
    tasks.spawn(serving.instrument(
        tracing::info_span!(target: mentis_telemetry::UNTRACED, parent: None, "metrics listener"),
    ));
}
