//! Server reflection in both versions clients ask for: `grpc.reflection.v1` (newer grpcurl, buf curl,
//! Postman ask for it first) and `grpc.reflection.v1alpha` (older clients, the grpcurl of `.tools`), each
//! listing the public services, health and itself, describing a public method's file, and never the
//! executor's internal API. Without a key, as health.

use mentis_e2e::*;
use tokio_stream::StreamExt as _;
use tonic_reflection::pb::{v1, v1alpha};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reflection_v1_and_v1alpha_list_and_describe_the_public_api_without_a_key()
-> anyhow::Result<()> {
    let h = Harness::start().await?;
    // v1: the list of services, then the file that holds a public method.
    let mut client = v1::server_reflection_client::ServerReflectionClient::new(h.raw.clone());
    let asks = [
        v1::server_reflection_request::MessageRequest::ListServices(String::new()),
        v1::server_reflection_request::MessageRequest::FileContainingSymbol(
            "mentis.v1.FileService.WatchFiles".into(),
        ),
        v1::server_reflection_request::MessageRequest::FileContainingSymbol(
            "mentis.executor.v1.ExecutorService".into(),
        ),
    ];
    let requests = tokio_stream::iter(asks.map(|m| v1::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(m),
    }));
    let mut answers = client.server_reflection_info(requests).await?.into_inner();
    use v1::server_reflection_response::MessageResponse as R;
    let Some(R::ListServicesResponse(list)) = answers
        .next()
        .await
        .transpose()?
        .and_then(|a| a.message_response)
    else {
        anyhow::bail!("v1: no list of services");
    };
    let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    for want in [
        "mentis.v1.SandboxService",
        "mentis.v1.ActionService",
        "mentis.v1.FileService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1.ServerReflection",
    ] {
        assert!(
            names.iter().any(|n| n == want),
            "v1 lists no {want}: {names:?}"
        );
    }
    assert!(
        !names.iter().any(|n| n.starts_with("mentis.executor")),
        "{names:?}"
    );
    match answers
        .next()
        .await
        .transpose()?
        .and_then(|a| a.message_response)
    {
        Some(R::FileDescriptorResponse(f)) => assert!(!f.file_descriptor_proto.is_empty()),
        other => anyhow::bail!("v1: no file for FileService.WatchFiles: {other:?}"),
    }
    // The executor's internal API is unknown to it: the stream ends NOT_FOUND.
    match answers.next().await {
        Some(Err(s)) => assert_eq!(s.code(), tonic::Code::NotFound, "{s:?}"),
        other => anyhow::bail!("v1 describes the executor's internal API: {other:?}"),
    }

    // v1alpha: the same list.
    let mut client = v1alpha::server_reflection_client::ServerReflectionClient::new(h.raw.clone());
    let requests = tokio_stream::iter([v1alpha::ServerReflectionRequest {
        host: String::new(),
        message_request: Some(
            v1alpha::server_reflection_request::MessageRequest::ListServices(String::new()),
        ),
    }]);
    let mut answers = client.server_reflection_info(requests).await?.into_inner();
    match answers
        .next()
        .await
        .transpose()?
        .and_then(|a| a.message_response)
    {
        Some(v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(list)) => {
            let names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            assert!(
                names.iter().any(|n| n == "mentis.v1.SandboxService"),
                "{names:?}"
            );
            assert!(
                names
                    .iter()
                    .any(|n| n == "grpc.reflection.v1alpha.ServerReflection"),
                "{names:?}"
            );
        }
        other => anyhow::bail!("v1alpha: no list of services: {other:?}"),
    }
    Ok(())
}
