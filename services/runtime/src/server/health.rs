//! The runtime's own health (grpc.health.v1): every service (and the server as a whole, "") is SERVING
//! while the container engine answers, NOT_SERVING while it does not, and NOT_SERVING for good once the
//! drain has begun. A balancer or mesh that watches it stops sending work the runtime could not do.
//! ARCHITECTURE.md, "Health".

use std::sync::Arc;
use std::time::Duration;

use mentis_core::Error;
use tokio_util::sync::CancellationToken;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::sandboxes::Manager;

/// How often the engine is asked whether it answers.
const PROBE_EVERY: Duration = Duration::from_secs(2);
/// How long it has to answer.
const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

pub(super) struct Health {
    reporter: HealthReporter,
    /// Every service's name, and "" for the server.
    services: Vec<&'static str>,
    /// Set once the drain has begun: nothing says SERVING after that.
    draining: tokio::sync::Mutex<bool>,
}

impl Health {
    pub(super) fn new(reporter: HealthReporter, services: &[&'static str]) -> Arc<Self> {
        Arc::new(Self {
            reporter,
            services: std::iter::once("")
                .chain(services.iter().copied())
                .collect(),
            draining: tokio::sync::Mutex::new(false),
        })
    }

    async fn set(&self, status: ServingStatus) {
        for service in &self.services {
            self.reporter.set_service_status(*service, status).await;
        }
    }

    /// Says whether the runtime can serve, unless the drain has begun.
    pub(super) async fn serving(&self, serving: bool) {
        let draining = self.draining.lock().await;
        if !*draining {
            self.set(if serving {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            })
            .await;
        }
    }

    /// NOT_SERVING from now on.
    pub(super) async fn drain(&self) {
        let mut draining = self.draining.lock().await;
        *draining = true;
        self.set(ServingStatus::NotServing).await;
    }

    /// Asks the engine every [`PROBE_EVERY`] whether it answers and says so, until `stop`.
    pub(super) async fn watch(self: Arc<Self>, manager: Arc<Manager>, stop: CancellationToken) {
        let mut answers = true;
        let mut tick = tokio::time::interval(PROBE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {}
            }
            let probe = tokio::time::timeout(PROBE_TIMEOUT, manager.ping_backend())
                .await
                .unwrap_or_else(|_| {
                    Err(Error::unavailable(
                        "the container engine did not answer in time",
                    ))
                });
            match (answers, probe) {
                (true, Err(e)) => {
                    tracing::warn!(error = %e.chain(),
                        "the container engine does not answer: every service is NOT_SERVING until it does");
                    answers = false;
                    self.serving(false).await;
                }
                (false, Ok(())) => {
                    tracing::info!("the container engine answers again: every service is SERVING");
                    answers = true;
                    self.serving(true).await;
                }
                _ => {}
            }
        }
    }
}
