//! Disk limits through the runtime: the spec's limit (or the default) reaches the backend and GetSandbox and
//! outlives a restart; with disk limits off no sandbox claims one and asking for one is refused.

use mentis_proto::api;
use mentis_runtime::config::DiskLimits;

use crate::support::*;

#[tokio::test]
async fn a_disk_limit_reaches_the_backend_and_outlives_a_restart() {
    let mut rt = TestRuntime::start().await;
    let small = rt
        .create(api::SandboxSpec {
            disk_limit_mb: 64,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(small.disk_limit_mb, 64);
    assert_eq!(rt.backend.limits(sid(&small)).unwrap().disk_mb, 64);
    let default = rt.create_default().await;
    assert_eq!(default.disk_limit_mb, 4096);
    assert_eq!(rt.backend.limits(sid(&default)).unwrap().disk_mb, 4096);
    let refused = rt
        .create(api::SandboxSpec {
            disk_limit_mb: 8,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("disk_limit_mb 8"), "{refused:?}");

    let backend = rt.backend.clone();
    let mut rt = {
        let _busy = Busy::hold();
        rt.runtime.take().unwrap().stop().await.unwrap();
        TestRuntime::start_on(backend, rt.config.clone(), rt.data_dir.clone()).await
    };
    assert_eq!(rt.get(&small.sandbox_id).await.unwrap().disk_limit_mb, 64);
    assert_eq!(
        rt.get(&default.sandbox_id).await.unwrap().disk_limit_mb,
        4096
    );
}

#[tokio::test]
async fn with_disk_limits_off_no_sandbox_claims_a_limit() {
    let mut rt = TestRuntime::start_with(|c| c.disk_limits = DiskLimits::Off).await;
    let sb = rt.create_default().await;
    assert_eq!(sb.disk_limit_mb, 0);
    assert_eq!(rt.backend.limits(sid(&sb)).unwrap().disk_mb, 0);
    let refused = rt
        .create(api::SandboxSpec {
            disk_limit_mb: 64,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(
        refused.message().contains("MENTIS_DISK_LIMITS=off"),
        "{refused:?}"
    );
}
