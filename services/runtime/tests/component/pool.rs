//! Warm pools on the fake backend: a claim binds the request (limits, labels, env) to a member made ahead,
//! a member that cannot be bound fails the create cleanly, and the pool refills.

use std::time::Duration;

use mentis_proto::api::{self, SandboxState};
use mentis_runtime::config::PoolConfig;

use crate::support::*;

fn with_pool(c: &mut mentis_runtime::RuntimeConfig) {
    c.pools = vec![PoolConfig {
        image: c.executor_image.clone(),
        min_idle: 1,
        max_total: 4,
        kernel: false,
    }];
}

async fn pool(rt: &mut TestRuntime) -> api::Pool {
    let _busy = Busy::hold();
    rt.sandboxes
        .list_pools(api::ListPoolsRequest {})
        .await
        .unwrap()
        .into_inner()
        .pools
        .remove(0)
}

async fn wait_idle(rt: &mut TestRuntime, idle: u32) -> api::Pool {
    for _ in 0..300 {
        let p = pool(rt).await;
        if p.idle >= idle {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the pool never had {idle} idle members: {:?}",
        pool(rt).await
    );
}

#[tokio::test]
async fn a_claim_binds_the_request_to_a_member_made_ahead() {
    let mut rt = TestRuntime::start_with(with_pool).await;
    wait_idle(&mut rt, 1).await;
    let made_before = rt.backend.created();
    let sb = rt
        .create(api::SandboxSpec {
            env: [("GREETING".to_owned(), "warm".to_owned())].into(),
            labels: [("owner".to_owned(), "pool-test".to_owned())].into(),
            memory_limit_mb: 768,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(sb.state, SandboxState::Running as i32);
    assert_eq!(
        sb.labels.get("owner").map(String::as_str),
        Some("pool-test")
    );
    let p = pool(&mut rt).await;
    assert_eq!((p.hits, p.misses), (1, 0), "{p:?}");
    // Served by a member that existed before the request, its limits changed in the backend.
    assert_eq!(rt.backend.calls("create", sid(&sb)), 1);
    assert!(rt.backend.created() <= made_before + 1);
    assert_eq!(rt.backend.limits(sid(&sb)).unwrap().memory_mb, 768);
    let obs = rt.sh(&sb.sandbox_id, "echo $GREETING").await.unwrap();
    assert_eq!(stdout(&obs), "warm\n");
    // The pool refills.
    wait_idle(&mut rt, 1).await;
}

#[tokio::test]
async fn a_member_that_cannot_be_bound_fails_the_create_and_is_removed() {
    let mut rt = TestRuntime::start_with(with_pool).await;
    wait_idle(&mut rt, 1).await;
    rt.backend.set_faults(Faults {
        update_limits_fails: true,
        ..Faults::default()
    });
    let refused = rt
        .create(api::SandboxSpec {
            memory_limit_mb: 768,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    rt.backend.set_faults(Faults::default());
    // The failed sandbox is listed FAILED, its container is gone, and the pool makes a new member.
    let listed = rt.list().await;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].state, SandboxState::Failed as i32);
    assert_eq!(rt.backend.state(sid(&listed[0])), None);
    wait_idle(&mut rt, 1).await;
    let sb = rt.create_default().await;
    assert_eq!(sb.state, SandboxState::Running as i32);
}
