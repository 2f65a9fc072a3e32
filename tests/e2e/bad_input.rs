//! Bad input gets a clear status (docs/ARCHITECTURE.md, Errors and statuses) and the runtime keeps serving.

use mentis_e2e::*;
use mentis_proto::api;
use tonic::Code;

#[tokio::test]
async fn bad_requests_get_clear_statuses_and_the_runtime_keeps_serving() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let unknown = uuid::Uuid::new_v4().to_string();

    // Sandbox ids: malformed and unknown.
    let get = |id: &str| api::GetSandboxRequest {
        sandbox_id: id.to_owned(),
    };
    assert_eq!(
        code(h.sandboxes.get_sandbox(get("not-a-uuid")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(h.sandboxes.get_sandbox(get("")).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(h.sandboxes.get_sandbox(get(&unknown)).await),
        Code::NotFound
    );
    let exec = |id: &str, action: Option<api::Action>| api::ExecuteRequest {
        sandbox_id: id.to_owned(),
        action,
        action_id: String::new(),
    };
    assert_eq!(
        code(
            h.actions
                .execute(exec(&unknown, Some(shell_action(cmd("true")))))
                .await
        ),
        Code::NotFound
    );
    assert_eq!(
        code(
            h.actions
                .execute(exec("garbage", Some(shell_action(cmd("true")))))
                .await
        ),
        Code::InvalidArgument
    );
    // Delete of an unknown (well-formed) id is idempotent.
    assert_eq!(
        code(
            h.sandboxes
                .delete_sandbox(api::DeleteSandboxRequest {
                    sandbox_id: unknown.clone()
                })
                .await
        ),
        Code::Ok
    );

    // Negative and absurd limits, bad space, reserved labels.
    for spec in [
        api::SandboxSpec {
            cpu_limit: -1.0,
            ..Default::default()
        },
        api::SandboxSpec {
            cpu_limit: 1e9,
            ..Default::default()
        },
        api::SandboxSpec {
            memory_limit_mb: -512,
            ..Default::default()
        },
        api::SandboxSpec {
            memory_limit_mb: i64::MAX,
            ..Default::default()
        },
        api::SandboxSpec {
            pids_limit: -1,
            ..Default::default()
        },
        api::SandboxSpec {
            pids_limit: i64::MAX,
            ..Default::default()
        },
        api::SandboxSpec {
            space_id: "Not A Space".into(),
            ..Default::default()
        },
        api::SandboxSpec {
            labels: [("io.mentis.managed".to_owned(), "x".to_owned())].into(),
            ..Default::default()
        },
    ] {
        let r = h
            .sandboxes
            .create_sandbox(api::CreateSandboxRequest {
                spec: Some(spec.clone()),
            })
            .await;
        assert_eq!(code(r), Code::InvalidArgument, "{spec:?}");
    }
    assert!(
        h.guard.containers().is_empty(),
        "a rejected spec created a container"
    );
    // An image that does not exist: a clear status, nothing left behind.
    let r = h
        .sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec {
                image: "mentis/no-such-image:none".into(),
                ..Default::default()
            }),
        })
        .await;
    assert_eq!(code(r), Code::FailedPrecondition);
    assert!(h.guard.containers().is_empty() && h.guard.volumes().is_empty());

    // Actions: missing, empty command, bad action id, absurd timeout.
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    assert_eq!(
        code(h.actions.execute(exec(&id, None)).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            h.actions
                .execute(exec(&id, Some(api::Action { kind: None })))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            h.actions
                .execute(exec(&id, Some(shell_action(cmd("")))))
                .await
        ),
        Code::InvalidArgument
    );
    assert_eq!(
        code(
            h.actions
                .execute(exec(&id, Some(shell_action(cmd("  ")))))
                .await
        ),
        Code::InvalidArgument
    );
    let bad_id = api::ExecuteRequest {
        sandbox_id: id.clone(),
        action: Some(shell_action(cmd("true"))),
        action_id: "has spaces".into(),
    };
    assert_eq!(code(h.actions.execute(bad_id).await), Code::InvalidArgument);
    let absurd = api::ShellAction {
        command: "true".into(),
        timeout_seconds: u32::MAX,
        ..Default::default()
    };
    assert_eq!(
        code(
            h.actions
                .execute(exec(&id, Some(shell_action(absurd))))
                .await
        ),
        Code::InvalidArgument
    );

    // A retried submission (same id, same action) does not run again: it replays; another action under the
    // same id is refused.
    let once = api::ExecuteRequest {
        sandbox_id: id.clone(),
        action: Some(shell_action(cmd("echo ran >> /workspace/count; echo once"))),
        action_id: "once".into(),
    };
    let first = collect(
        h.actions.execute(once.clone()).await?.into_inner(),
        std::time::Duration::from_secs(60),
    )
    .await?;
    let retry = collect(
        h.actions.execute(once).await?.into_inner(),
        std::time::Duration::from_secs(60),
    )
    .await?;
    assert_eq!(first, retry, "the retry replays the same observations");
    assert_eq!(
        stdout(&h.sh(&id, "wc -l < /workspace/count").await?),
        "1\n",
        "the command ran once"
    );
    let other = api::ExecuteRequest {
        sandbox_id: id.clone(),
        action: Some(shell_action(cmd("echo different"))),
        action_id: "once".into(),
    };
    assert_eq!(code(h.actions.execute(other).await), Code::AlreadyExists);

    // A failing command is data, not an error.
    let obs = h.sh(&id, "exit 7").await?;
    assert_eq!(cmd_end(&obs)?.exit_code, 7);

    // Actions on a deleted sandbox: FailedPrecondition.
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    assert_eq!(
        code(
            h.actions
                .execute(exec(&id, Some(shell_action(cmd("true")))))
                .await
        ),
        Code::FailedPrecondition
    );

    // Still serving.
    let sb = h.create_default().await?;
    assert_eq!(
        stdout(&h.sh(&sb.sandbox_id, "echo alive").await?),
        "alive\n"
    );
    h.stop().await
}
