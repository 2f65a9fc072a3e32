//! Bad input gets a clear status with details a program can act on (the reason, the field at fault;
//! docs/ARCHITECTURE.md, Errors and statuses) and the runtime keeps serving.

mod raw;
mod table;

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

    // Image headers past what the engine's request can carry (issue 40: INTERNAL, the engine's URL too
    // long), at their full size: within the default message limit, beyond the table's.
    let mut templates =
        mentis_proto::api::template_service_client::TemplateServiceClient::new(h.channel.clone());
    let header = api::BuildImageHeader {
        image: "mentis/e2e-refused:1".into(),
        build_args: (0..100)
            .map(|i| (format!("ARG{i}"), "x".repeat(30_000)))
            .collect(),
        ..Default::default()
    };
    let messages = [
        api::build_image_request::Kind::Header(header),
        api::build_image_request::Kind::Context(bytes::Bytes::from_static(&[0; 1024])),
    ]
    .map(|kind| api::BuildImageRequest { kind: Some(kind) });
    assert_eq!(
        refusal(templates.build_image(futures::stream::iter(messages)).await),
        r(
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            Some("header.build_args")
        )
    );
    let messages = [
        api::import_image_request::Kind::Header(api::ImportImageHeader {
            image: "mentis/e2e-refused:1".into(),
            changes: vec![format!("ENV LONG={}", "x".repeat(70_000))],
            ..Default::default()
        }),
        api::import_image_request::Kind::Data(bytes::Bytes::from_static(&[0; 1024])),
    ]
    .map(|kind| api::ImportImageRequest { kind: Some(kind) });
    assert_eq!(
        refusal(
            templates
                .import_image(futures::stream::iter(messages))
                .await
        ),
        r(
            Code::InvalidArgument,
            "INVALID_ARGUMENT",
            Some("header.changes")
        )
    );

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

/// The bad-input suite (`table`): every method of the public API, the usual malformed inputs and each
/// method's own mistakes, each answered with the status docs/ERRORS.md lists; the runtime keeps serving.
#[tokio::test]
async fn every_method_answers_malformed_input_with_the_status_docs_errors_lists()
-> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| {
        c.max_message_bytes = table::LIMIT;
        // CreateTerminalLink and GetPreviewUrl answer only with the HTTP listener on.
        c.http_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], 0)));
    })
    .await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    assert_eq!(
        stdout(&h.sh(&id, "echo hi > /workspace/f.txt; echo ok").await?),
        "ok\n"
    );
    let last_seq = h.get(&id).await?.last_seq;
    let image = no_command_image(&h.guard.instance)?;
    let built = format!("mentis/e2e-crlf:{}", h.guard.instance);
    let fixture = table::Fixture {
        sandbox: id.clone(),
        last_seq,
        no_command_image: image.clone(),
        built_image: built.clone(),
        refused_image: format!("mentis/e2e-refused:{}", h.guard.instance),
    };
    let cases = table::cases(&fixture);
    let wrong = table::run(&h.channel, &cases).await;
    let crlf_label = docker(&[
        "image",
        "inspect",
        "--format",
        "{{.Config.Labels.crlf}}",
        &built,
    ]);
    let _ = docker(&["image", "rm", "--force", &built]);
    let _ = docker(&["image", "rm", "--force", &fixture.refused_image]);
    let _ = docker(&["image", "rm", "--force", &image]);
    assert!(
        wrong.is_empty(),
        "{} of {} cases answered otherwise:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    // The build across a CRLF continuation made its image.
    assert_eq!(crlf_label?.trim(), "yes");

    // InspectVariables names the names that do not exist.
    h.py(&id, "present = 1").await?;
    let got = h
        .actions
        .inspect_variables(api::InspectVariablesRequest {
            sandbox_id: id.clone(),
            names: vec!["present".into(), "absent".into(), "absent".into()],
        })
        .await?
        .into_inner();
    assert_eq!(
        got.variables
            .iter()
            .map(|v| v.name.as_str())
            .collect::<Vec<_>>(),
        ["present"]
    );
    assert_eq!(got.missing_names, ["absent"]);

    // Nothing of the refused creates is left, and the runtime still serves.
    assert_eq!(h.guard.containers().len(), 1, "{:?}", h.guard.containers());
    assert_eq!(stdout(&h.sh(&id, "echo alive").await?), "alive\n");
    h.stop().await
}

/// An image with no command (no ENTRYPOINT or CMD): an empty filesystem imported under a tag of this
/// instance (removed by the test).
fn no_command_image(instance: &str) -> anyhow::Result<String> {
    let dir = tempfile::tempdir()?;
    let tar = dir.path().join("empty.tar");
    let mut builder = ::tar::Builder::new(std::fs::File::create(&tar)?);
    let mut header = ::tar::Header::new_gnu();
    header.set_size(0);
    header.set_mode(0o644);
    header.set_cksum();
    builder.append_data(&mut header, "empty", std::io::empty())?;
    builder.finish()?;
    let image = format!("mentis/e2e-no-command:{instance}");
    docker(&["import", &tar.to_string_lossy(), &image])?;
    Ok(image)
}
