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

/// The pool of template `name`, when ListPools shows one.
async fn template_pool(rt: &mut TestRuntime, name: &str) -> Option<api::Pool> {
    let _busy = Busy::hold();
    rt.sandboxes
        .list_pools(api::ListPoolsRequest {})
        .await
        .unwrap()
        .into_inner()
        .pools
        .into_iter()
        .find(|p| p.template == name)
}

async fn wait_template_idle(rt: &mut TestRuntime, name: &str, idle: u32) -> api::Pool {
    for _ in 0..300 {
        if let Some(p) = template_pool(rt, name).await
            && p.idle >= idle
        {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the pool of {name} never had {idle} idle members: {:?}",
        template_pool(rt, name).await
    );
}

#[tokio::test]
async fn a_template_keeps_its_own_pool_of_prepared_sandboxes_and_replaces_it_when_it_changes() {
    use mentis_proto::api::template_service_client::TemplateServiceClient;
    let mut rt = TestRuntime::start().await;
    let mut templates = TemplateServiceClient::new(rt.channel.clone());
    let template = api::Template {
        name: "warm".to_owned(),
        limits: Some(api::SandboxLimits {
            memory_mb: 640,
            ..Default::default()
        }),
        env: [("STAGE".to_owned(), "one".to_owned())].into(),
        setup_commands: vec!["echo \"prepared $STAGE\" > marker".to_owned()],
        pool_size: 2,
        ..Default::default()
    };
    templates
        .create_template(api::CreateTemplateRequest {
            template: Some(template.clone()),
        })
        .await
        .unwrap();
    let p = wait_template_idle(&mut rt, "warm", 2).await;
    assert_eq!(
        (p.space_id.as_str(), p.min_idle, p.max_total),
        ("default", 2, 2)
    );
    let made_before = rt.backend.created();

    // A sandbox of the template is a member made ahead: its start-up commands ran before the request.
    let sb = rt
        .create(api::SandboxSpec {
            template: "warm".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(sb.state, SandboxState::Running as i32);
    assert_eq!((sb.template.as_str(), sb.memory_limit_mb), ("warm", 640));
    assert_eq!(rt.backend.calls("create", sid(&sb)), 1);
    assert!(rt.backend.created() <= made_before + 1);
    let p = template_pool(&mut rt, "warm").await.unwrap();
    assert_eq!((p.hits, p.misses), (1, 0), "{p:?}");
    let obs = rt.sh(&sb.sandbox_id, "cat marker").await.unwrap();
    assert_eq!(stdout(&obs), "prepared one\n");
    // Other limits are bound to the member (the fake backend can change them).
    let other = rt
        .create(api::SandboxSpec {
            template: "warm".to_owned(),
            memory_limit_mb: 700,
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(rt.backend.limits(sid(&other)).unwrap().memory_mb, 700);
    wait_template_idle(&mut rt, "warm", 2).await;

    // A change replaces the members: the old ones go, new ones run the new start-up commands.
    let old: Vec<_> = rt.backend.ids();
    templates
        .update_template(api::UpdateTemplateRequest {
            template: Some(api::Template {
                env: [("STAGE".to_owned(), "two".to_owned())].into(),
                ..template.clone()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["env".to_owned()],
            }),
        })
        .await
        .unwrap();
    let p = wait_template_idle(&mut rt, "warm", 2).await;
    assert_eq!((p.hits, p.misses), (0, 0), "a new pool: {p:?}");
    let live = [sid(&sb), sid(&other)];
    for id in old.iter().filter(|id| !live.contains(id)) {
        for _ in 0..100 {
            if rt.backend.state(*id).is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(rt.backend.state(*id), None, "an old member is left: {id}");
    }
    let sb2 = rt
        .create(api::SandboxSpec {
            template: "warm".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    let obs = rt.sh(&sb2.sandbox_id, "cat marker").await.unwrap();
    assert_eq!(stdout(&obs), "prepared two\n");

    // Deleted: the pool and its idle members go; its sandboxes stay.
    wait_template_idle(&mut rt, "warm", 2).await;
    templates
        .delete_template(api::DeleteTemplateRequest {
            space_id: String::new(),
            name: "warm".to_owned(),
        })
        .await
        .unwrap();
    assert!(template_pool(&mut rt, "warm").await.is_none());
    let keep = [sid(&sb), sid(&other), sid(&sb2)];
    for _ in 0..100 {
        if rt.backend.ids().iter().all(|id| keep.contains(id)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut left = rt.backend.ids();
    left.sort();
    let mut want = keep.to_vec();
    want.sort();
    assert_eq!(left, want);
    assert_eq!(rt.state(&sb.sandbox_id).await, SandboxState::Running);
}

#[tokio::test]
async fn a_restarted_runtime_takes_over_the_members_of_a_templates_pool_unless_the_template_changed()
 {
    use mentis_proto::api::template_service_client::TemplateServiceClient;
    let mut rt = TestRuntime::start().await;
    let template = api::Template {
        name: "kept".to_owned(),
        setup_commands: vec!["echo once >> runs".to_owned()],
        pool_size: 1,
        ..Default::default()
    };
    TemplateServiceClient::new(rt.channel.clone())
        .create_template(api::CreateTemplateRequest {
            template: Some(template.clone()),
        })
        .await
        .unwrap();
    wait_template_idle(&mut rt, "kept", 1).await;
    let member = rt.backend.ids();
    assert_eq!(member.len(), 1);

    // Stopped and started again: the member is taken over, not made again.
    let backend = rt.backend.clone();
    let mut rt = {
        let _busy = Busy::hold();
        rt.runtime.take().unwrap().stop().await.unwrap();
        TestRuntime::start_on(backend, rt.config.clone(), rt.data_dir.clone()).await
    };
    wait_template_idle(&mut rt, "kept", 1).await;
    assert_eq!(rt.backend.ids(), member);
    let sb = rt
        .create(api::SandboxSpec {
            template: "kept".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    assert_eq!(sid(&sb), member[0]);
    let obs = rt.sh(&sb.sandbox_id, "cat runs").await.unwrap();
    assert_eq!(stdout(&obs), "once\n", "the start-up command ran once");
    wait_template_idle(&mut rt, "kept", 1).await;

    // Changed while the runtime was down (its row rewritten): the member of the old version goes.
    let idle: Vec<_> = rt
        .backend
        .ids()
        .into_iter()
        .filter(|id| *id != sid(&sb))
        .collect();
    assert_eq!(idle.len(), 1);
    let backend = rt.backend.clone();
    let mut rt = {
        let _busy = Busy::hold();
        rt.runtime.take().unwrap().stop().await.unwrap();
        let store = mentis_store::Store::open(rt.data_dir.path()).unwrap();
        let space = mentis_core::SpaceId::default_space();
        let mut t = store.template(&space, "kept").unwrap().unwrap();
        t.updated_at += Duration::from_secs(1);
        t.setup = vec!["echo twice >> runs".to_owned()];
        store.put_template(&t).unwrap();
        drop(store);
        TestRuntime::start_on(backend, rt.config.clone(), rt.data_dir.clone()).await
    };
    wait_template_idle(&mut rt, "kept", 1).await;
    assert_eq!(
        rt.backend.state(idle[0]),
        None,
        "the old version's member is gone"
    );
    let again = rt
        .create(api::SandboxSpec {
            template: "kept".to_owned(),
            ..Default::default()
        })
        .await
        .unwrap();
    let obs = rt.sh(&again.sandbox_id, "cat runs").await.unwrap();
    assert_eq!(stdout(&obs), "twice\n");
}
