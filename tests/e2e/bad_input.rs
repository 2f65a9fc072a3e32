//! Bad input gets a clear status with details a program can act on (the reason, the field at fault;
//! docs/ARCHITECTURE.md, Errors and statuses) and the runtime keeps serving.

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
    let r = |code, reason: &str, field: Option<&str>| {
        (code, reason.to_owned(), field.map(str::to_owned))
    };
    assert_eq!(
        refusal(h.sandboxes.get_sandbox(get("not-a-uuid")).await),
        r(
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            Some("sandbox_id")
        )
    );
    assert_eq!(
        refusal(h.sandboxes.get_sandbox(get("")).await),
        r(
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            Some("sandbox_id")
        )
    );
    assert_eq!(
        refusal(h.sandboxes.get_sandbox(get(&unknown)).await),
        r(Code::NotFound, "SANDBOX_NOT_FOUND", None)
    );
    let exec = |id: &str, action: Option<api::Action>| api::ExecuteRequest {
        sandbox_id: id.to_owned(),
        action,
        action_id: String::new(),
    };
    assert_eq!(
        refusal(
            h.actions
                .execute(exec(&unknown, Some(shell_action(cmd("true")))))
                .await
        ),
        r(Code::NotFound, "SANDBOX_NOT_FOUND", None)
    );
    assert_eq!(
        refusal(
            h.actions
                .execute(exec("garbage", Some(shell_action(cmd("true")))))
                .await
        ),
        r(
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            Some("sandbox_id")
        )
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

    // Negative and absurd limits, bad space, reserved labels: INVALID_SPEC naming the field.
    for (spec, field) in [
        (
            api::SandboxSpec {
                cpu_limit: -1.0,
                ..Default::default()
            },
            "spec.cpu_limit",
        ),
        (
            api::SandboxSpec {
                cpu_limit: 1e9,
                ..Default::default()
            },
            "spec.cpu_limit",
        ),
        (
            api::SandboxSpec {
                memory_limit_mb: -512,
                ..Default::default()
            },
            "spec.memory_limit_mb",
        ),
        (
            api::SandboxSpec {
                memory_limit_mb: i64::MAX,
                ..Default::default()
            },
            "spec.memory_limit_mb",
        ),
        (
            api::SandboxSpec {
                pids_limit: -1,
                ..Default::default()
            },
            "spec.pids_limit",
        ),
        (
            api::SandboxSpec {
                pids_limit: i64::MAX,
                ..Default::default()
            },
            "spec.pids_limit",
        ),
        (
            api::SandboxSpec {
                space_id: "Not A Space".into(),
                ..Default::default()
            },
            "spec.space_id",
        ),
        (
            api::SandboxSpec {
                labels: [("io.mentis.managed".to_owned(), "x".to_owned())].into(),
                ..Default::default()
            },
            "spec.labels",
        ),
    ] {
        let got = h
            .sandboxes
            .create_sandbox(api::CreateSandboxRequest {
                spec: Some(spec.clone()),
            })
            .await;
        assert_eq!(
            refusal(got),
            r(Code::InvalidArgument, "INVALID_SPEC", Some(field)),
            "{spec:?}"
        );
    }
    assert!(
        h.guard.containers().is_empty(),
        "a rejected spec created a container"
    );
    // An image that does not exist: a clear status, nothing left behind.
    let got = h
        .sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec {
                image: "mentis/no-such-image:none".into(),
                ..Default::default()
            }),
        })
        .await;
    assert_eq!(
        refusal(got),
        r(Code::FailedPrecondition, "IMAGE_MISSING", None)
    );
    assert!(h.guard.containers().is_empty() && h.guard.volumes().is_empty());

    // Actions: missing, empty command, bad action id, absurd timeout.
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    let invalid_action = |field| r(Code::InvalidArgument, "INVALID_ACTION", Some(field));
    assert_eq!(
        refusal(h.actions.execute(exec(&id, None)).await),
        invalid_action("action")
    );
    assert_eq!(
        refusal(
            h.actions
                .execute(exec(&id, Some(api::Action { kind: None })))
                .await
        ),
        invalid_action("action")
    );
    assert_eq!(
        refusal(
            h.actions
                .execute(exec(&id, Some(shell_action(cmd("")))))
                .await
        ),
        invalid_action("action.shell.command")
    );
    assert_eq!(
        refusal(
            h.actions
                .execute(exec(&id, Some(shell_action(cmd("  ")))))
                .await
        ),
        invalid_action("action.shell.command")
    );
    let bad_id = api::ExecuteRequest {
        sandbox_id: id.clone(),
        action: Some(shell_action(cmd("true"))),
        action_id: "has spaces".into(),
    };
    assert_eq!(
        refusal(h.actions.execute(bad_id).await),
        r(Code::InvalidArgument, "INVALID_ARGUMENT", Some("action_id"))
    );
    let absurd = api::ShellAction {
        command: "true".into(),
        timeout_seconds: u32::MAX,
        ..Default::default()
    };
    assert_eq!(
        refusal(
            h.actions
                .execute(exec(&id, Some(shell_action(absurd))))
                .await
        ),
        invalid_action("action.shell.timeout_seconds")
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
    assert_eq!(
        refusal(h.actions.execute(other).await),
        r(Code::AlreadyExists, "ACTION_ID_REUSED", None)
    );

    // A failing command is data, not an error.
    let obs = h.sh(&id, "exit 7").await?;
    assert_eq!(cmd_end(&obs)?.exit_code, 7);

    // Actions on a deleted sandbox: FailedPrecondition, the sandbox has ended.
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    assert_eq!(
        refusal(
            h.actions
                .execute(exec(&id, Some(shell_action(cmd("true")))))
                .await
        ),
        r(Code::FailedPrecondition, "SANDBOX_ENDED", None)
    );

    // Still serving.
    let sb = h.create_default().await?;
    assert_eq!(
        stdout(&h.sh(&sb.sandbox_id, "echo alive").await?),
        "alive\n"
    );
    h.stop().await
}
