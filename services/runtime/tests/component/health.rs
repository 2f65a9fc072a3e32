//! Health tells the truth: every service NOT_SERVING while the container engine does not answer, and
//! SERVING again once it does (the drain's NOT_SERVING is in `drain`).

use std::time::Duration;

use futures::StreamExt;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use crate::fake::Faults;
use crate::support::*;

/// The server as a whole and every service a client calls.
const SERVICES: [&str; 6] = [
    "",
    "mentis.v1.SandboxService",
    "mentis.v1.SpaceService",
    "mentis.v1.ActionService",
    "mentis.v1.FileService",
    "mentis.v1.KeyService",
];

async fn statuses(health: &mut HealthClient<tonic::transport::Channel>) -> Vec<i32> {
    let mut out = Vec::new();
    for service in SERVICES {
        let answer = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap();
        out.push(answer.into_inner().status);
    }
    out
}

#[tokio::test]
async fn health_is_not_serving_while_the_engine_does_not_answer_and_serving_once_it_does() {
    let rt = TestRuntime::start().await;
    let mut health = HealthClient::new(rt.channel.clone());
    let serving = vec![ServingStatus::Serving as i32; SERVICES.len()];
    let not_serving = vec![ServingStatus::NotServing as i32; SERVICES.len()];
    assert_eq!(statuses(&mut health).await, serving);
    let mut watch = watch_server_health(&rt).await;
    // A probe every 2 s, 3 s to answer: a watcher hears of it within seconds.
    let within = Duration::from_secs(10);

    rt.backend.set_faults(Faults {
        unreachable: true,
        ..Default::default()
    });
    let next = tokio::time::timeout(within, watch.next()).await.unwrap();
    assert_eq!(
        next.unwrap().unwrap().status,
        ServingStatus::NotServing as i32
    );
    assert_eq!(statuses(&mut health).await, not_serving);

    rt.backend.set_faults(Faults::default());
    let next = tokio::time::timeout(within, watch.next()).await.unwrap();
    assert_eq!(next.unwrap().unwrap().status, ServingStatus::Serving as i32);
    assert_eq!(statuses(&mut health).await, serving);
}
