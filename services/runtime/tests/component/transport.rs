//! How the API is spoken on the wire: requests may be gzip-compressed, and a request above
//! `MENTIS_MAX_MESSAGE_BYTES` is refused with OUT_OF_RANGE before it is read (TLS is in the e2e tier).

use mentis_proto::api::{self, sandbox_service_client::SandboxServiceClient};
use tonic::Code;
use tonic::codec::CompressionEncoding;

use crate::support::*;

/// A spec whose one label is `bytes` long.
fn spec_of(bytes: usize) -> api::CreateSandboxRequest {
    api::CreateSandboxRequest {
        spec: Some(api::SandboxSpec {
            labels: [("note".to_owned(), "x".repeat(bytes))].into(),
            ..Default::default()
        }),
    }
}

async fn client(rt: &TestRuntime) -> SandboxServiceClient<tonic::transport::Channel> {
    let channel = tonic::transport::Endpoint::from_shared(format!(
        "http://{}",
        rt.runtime.as_ref().unwrap().addr
    ))
    .unwrap()
    .connect()
    .await
    .unwrap();
    SandboxServiceClient::new(channel)
}

#[tokio::test]
async fn requests_may_be_gzip_compressed_and_are_bounded_by_the_configured_size() {
    let rt = TestRuntime::start_with(|c| c.max_message_bytes = 64 * 1024).await;
    let mut plain = client(&rt).await;
    let mut gzip = client(&rt)
        .await
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);

    let created = gzip.create_sandbox(spec_of(10)).await.unwrap().into_inner();
    assert_eq!(
        created.sandbox.unwrap().labels.get("note").map(String::len),
        Some(10)
    );

    let refused = plain.create_sandbox(spec_of(100 * 1024)).await.unwrap_err();
    assert_eq!(refused.code(), Code::OutOfRange, "{refused:?}");
    assert!(refused.message().contains("65536"), "{refused:?}");

    // The same request under the default limit (4 MiB) is read (and judged on its merits).
    let rt = TestRuntime::start().await;
    let mut plain = client(&rt).await;
    let read = plain.create_sandbox(spec_of(100 * 1024)).await;
    assert!(
        read.as_ref()
            .err()
            .is_none_or(|s| s.code() != Code::OutOfRange),
        "{read:?}"
    );
}
