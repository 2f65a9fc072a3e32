//! Authentication: ExecutorService needs the bearer token; health does not.

use mentis_proto::executor::executor_service_server::SERVICE_NAME;
use mentis_proto::executor::{CancelRequest, WriteStdinRequest};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::support::*;

#[tokio::test]
async fn calls_without_the_right_token_are_unauthenticated() {
    let executor = TestExecutor::start().await;
    for token in [None, Some("wrong-token"), Some("test-token-012345678")] {
        let mut client = executor.client_with(token).await;
        let status = client
            .run(request(&action_id(), shell("touch ran")))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "{token:?}");
        let status = client
            .cancel(CancelRequest {
                action_id: "x".to_owned(),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated);
        let status = client
            .write_stdin(WriteStdinRequest {
                action_id: "x".to_owned(),
                data: Default::default(),
                eof: true,
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated);
    }
    assert!(!executor.path("ran").exists(), "nothing ran");
}

#[tokio::test]
async fn health_is_serving_without_a_token() {
    let executor = TestExecutor::start().await;
    let mut health = HealthClient::new(executor.channel().await);
    for service in ["", SERVICE_NAME] {
        let response = health
            .check(HealthCheckRequest {
                service: service.to_owned(),
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            response.status,
            ServingStatus::Serving as i32,
            "{service:?}"
        );
    }
}
