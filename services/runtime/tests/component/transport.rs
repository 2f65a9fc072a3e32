//! How the API is spoken on the wire: requests may be gzip-compressed, and a request above
//! `MENTIS_MAX_MESSAGE_BYTES` is refused with RESOURCE_EXHAUSTED (MESSAGE_TOO_LARGE, gRPC's code for a
//! message over the limit; tonic says OUT_OF_RANGE, which `api::decode` rewrites) before it is read (TLS is in the e2e tier).

use mentis_proto::api;
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

#[tokio::test]
async fn requests_may_be_gzip_compressed_and_are_bounded_by_the_configured_size() {
    let rt = TestRuntime::start_with(|c| c.max_message_bytes = 64 * 1024).await;
    let mut plain = rt.sandboxes.clone();
    let mut gzip = rt
        .sandboxes
        .clone()
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);

    let created = gzip.create_sandbox(spec_of(10)).await.unwrap().into_inner();
    assert_eq!(
        created.sandbox.unwrap().labels.get("note").map(String::len),
        Some(10)
    );

    let refused = plain.create_sandbox(spec_of(100 * 1024)).await.unwrap_err();
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert_eq!(
        tonic_types::StatusExt::get_error_details(&refused)
            .error_info()
            .map(|i| i.reason.as_str()),
        Some("MESSAGE_TOO_LARGE")
    );
    assert!(refused.message().contains("65536"), "{refused:?}");

    // The same request under the default limit (4 MiB) is read (and judged on its merits).
    let rt = TestRuntime::start().await;
    let mut plain = rt.sandboxes.clone();
    let read = plain.create_sandbox(spec_of(100 * 1024)).await;
    assert!(
        read.as_ref()
            .err()
            .is_none_or(|s| s.code() != Code::ResourceExhausted),
        "{read:?}"
    );
}

/// TLS files that cannot be read or used stop the start, naming what is wrong; nothing is served.
#[tokio::test]
async fn tls_files_that_cannot_be_used_stop_the_start() {
    let dir = tempfile::tempdir().unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").unwrap();
    let missing = dir.path().join("missing.pem");
    for (cert, key, why) in [
        (&missing, &garbage, "cannot read"),
        (&garbage, &garbage, "private key"),
    ] {
        let mut config = base_config(dir.path());
        config.tls = Some(mentis_runtime::config::TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: None,
        });
        let err = mentis_runtime::Runtime::start_with(config, crate::fake::FakeBackend::new())
            .await
            .expect_err("the start must fail");
        assert!(err.to_string().contains(why), "{err}");
    }
}
