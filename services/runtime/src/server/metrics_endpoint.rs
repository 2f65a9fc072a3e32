//! `MENTIS_METRICS_LISTEN`: `GET /metrics`, the Prometheus text exposition of the application's metrics,
//! behind the listener's door like every other listener.

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse as _;
use axum::routing::get;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::door::{Guarded, serve_http};
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
        .fallback(|| async { (StatusCode::NOT_FOUND, "GET /metrics\n") });
    // A scrape still open after a short grace is cut.
    serve_http(
        listener,
        app,
        "metrics",
        std::time::Duration::from_secs(2),
        shutdown,
        tasks,
    );
}
