//! Errors a program can act on: every refusal a client gets carries `google.rpc` details — ErrorInfo with a
//! stable reason in the "mentis.dev" domain, BadRequest naming the field, RetryInfo when a retry can cure
//! it, ResourceInfo naming the resource — and Connect's in-stream rejections carry the same reason
//! (docs/ARCHITECTURE.md, "Errors and statuses").

use std::collections::HashMap;
use std::time::Duration;

use mentis_proto::api::{
    self, connect_request, connect_response, file_service_client::FileServiceClient,
};
use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt};

use crate::support::*;

/// The reason of a status's ErrorInfo, checking its domain.
fn reason(s: &tonic::Status) -> String {
    let details = s.get_error_details();
    let info = details.error_info().expect("every status has an ErrorInfo");
    assert_eq!(info.domain, "mentis.dev");
    info.reason.clone()
}

fn details(s: &tonic::Status) -> ErrorDetails {
    s.get_error_details()
}

/// The field of a status's one BadRequest violation.
fn field(s: &tonic::Status) -> String {
    let d = details(s);
    let v = &d.bad_request().expect("a BadRequest").field_violations;
    assert_eq!(v.len(), 1, "{v:?}");
    v[0].field.clone()
}

fn retry(s: &tonic::Status) -> Option<Duration> {
    details(s).retry_info().and_then(|r| r.retry_delay)
}

/// ResourceInfo's type and name.
fn resource(s: &tonic::Status) -> (String, String) {
    let d = details(s);
    let r = d.resource_info().expect("a ResourceInfo");
    (r.resource_type.clone(), r.resource_name.clone())
}

#[tokio::test]
async fn an_unknown_or_malformed_sandbox_id_says_which_and_names_it() {
    let mut rt = TestRuntime::start().await;
    let unknown = uuid::Uuid::new_v4().to_string();
    let s = rt.get(&unknown).await.unwrap_err();
    assert_eq!(s.code(), Code::NotFound);
    assert_eq!(reason(&s), "SANDBOX_NOT_FOUND");
    assert_eq!(resource(&s), ("sandbox".to_owned(), unknown.clone()));
    assert_eq!(
        details(&s).error_info().unwrap().metadata,
        HashMap::from([("sandbox_id".to_owned(), unknown.clone())])
    );
    assert_eq!(retry(&s), None);

    let s = rt.get("not-a-uuid").await.unwrap_err();
    assert_eq!(
        (s.code(), reason(&s), field(&s)),
        (
            Code::InvalidArgument,
            "INVALID_ARGUMENT".to_owned(),
            "sandbox_id".to_owned()
        )
    );
}

#[tokio::test]
async fn a_bad_spec_or_action_names_the_field_in_the_request() {
    let mut rt = TestRuntime::start().await;
    for (spec, want) in [
        (
            api::SandboxSpec {
                memory_limit_mb: -512,
                ..Default::default()
            },
            "spec.memory_limit_mb",
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
        let s = rt.create(spec).await.unwrap_err();
        assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
        assert_eq!(
            (reason(&s), field(&s)),
            ("INVALID_SPEC".to_owned(), want.to_owned())
        );
        // The violation's description is the message, its reason the status's.
        let d = details(&s);
        let v = &d.bad_request().unwrap().field_violations[0];
        assert_eq!(
            (v.description.as_str(), v.reason.as_str()),
            (s.message(), "INVALID_SPEC")
        );
    }
    assert!(rt.backend.ids().is_empty(), "a refused spec made a sandbox");

    let id = rt.create_default().await.sandbox_id;
    let s = rt.sh(&id, "  ").await.unwrap_err();
    assert_eq!(
        (s.code(), reason(&s), field(&s)),
        (
            Code::InvalidArgument,
            "INVALID_ACTION".to_owned(),
            "action.shell.command".to_owned()
        )
    );
    let s = rt.exec(&id, shell("true"), "has spaces").await.unwrap_err();
    assert_eq!(
        (reason(&s), field(&s)),
        ("INVALID_ARGUMENT".to_owned(), "action_id".to_owned())
    );
}

#[tokio::test]
async fn limits_reached_say_when_to_retry() {
    let mut rt = TestRuntime::start_with(|c| {
        c.max_sandboxes = 3;
        c.max_actions_per_sandbox = 1;
    })
    .await;
    let id = rt.create_default().await.sandbox_id;

    // The sandbox's action bound: retry in a second.
    let mut long = rt.start_action(&id, shell("echo started; sleep 1"));
    long.started().await;
    let s = rt.sh(&id, "true").await.unwrap_err();
    assert_eq!(
        (s.code(), reason(&s)),
        (Code::ResourceExhausted, "TOO_MANY_ACTIONS".to_owned())
    );
    assert_eq!(retry(&s), Some(Duration::from_secs(1)));
    assert_eq!(resource(&s), ("sandbox".to_owned(), id.clone()));
    long.end().await;

    // A space's quota, then the runtime's.
    let _busy = Busy::hold();
    rt.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "one".into(),
                limits: Some(api::SpaceLimits {
                    max_sandboxes: 1,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    drop(_busy);
    let in_one = || api::SandboxSpec {
        space_id: "one".into(),
        ..Default::default()
    };
    rt.create(in_one()).await.unwrap();
    let s = rt.create(in_one()).await.unwrap_err();
    assert_eq!(
        (s.code(), reason(&s)),
        (Code::ResourceExhausted, "SPACE_QUOTA_EXCEEDED".to_owned())
    );
    assert_eq!(resource(&s), ("space".to_owned(), "one".to_owned()));
    assert_eq!(retry(&s), Some(Duration::from_secs(10)));
    rt.create_default().await;
    let s = rt.create(api::SandboxSpec::default()).await.unwrap_err();
    assert_eq!(
        (s.code(), reason(&s)),
        (Code::ResourceExhausted, "RUNTIME_QUOTA_EXCEEDED".to_owned())
    );
    assert_eq!(retry(&s), Some(Duration::from_secs(10)));

    // A space that exists already, and a space that does not.
    let _busy = Busy::hold();
    let s = rt
        .spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "one".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (s.code(), reason(&s)),
        (Code::AlreadyExists, "SPACE_EXISTS".to_owned())
    );
    let s = rt
        .spaces
        .get_space(api::GetSpaceRequest {
            space_id: "none".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (s.code(), reason(&s)),
        (Code::NotFound, "SPACE_NOT_FOUND".to_owned())
    );
    assert_eq!(resource(&s), ("space".to_owned(), "none".to_owned()));
    let s = rt
        .spaces
        .delete_space(api::DeleteSpaceRequest {
            space_id: "one".into(),
            force: false,
        })
        .await
        .unwrap_err();
    assert_eq!(
        (s.code(), reason(&s)),
        (Code::FailedPrecondition, "SPACE_NOT_EMPTY".to_owned())
    );
}

#[tokio::test]
async fn a_paused_sandbox_and_a_missing_file_say_so() {
    let mut rt = TestRuntime::start().await;
    let id = rt.create_default().await.sandbox_id;

    // The executor's verdict keeps the executor's reason.
    let mut files = FileServiceClient::new(rt.channel.clone());
    let _busy = Busy::hold();
    let s = files
        .stat_file(api::StatFileRequest {
            sandbox_id: id.clone(),
            path: "no/such/file".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(
        (s.code(), reason(&s)),
        (Code::NotFound, "PATH_NOT_FOUND".to_owned())
    );
    drop(_busy);

    rt.pause(&id).await.unwrap();
    let s = rt.sh(&id, "true").await.unwrap_err();
    assert_eq!(
        (s.code(), reason(&s)),
        (Code::FailedPrecondition, "SANDBOX_PAUSED".to_owned())
    );
    assert_eq!(resource(&s), ("sandbox".to_owned(), id.clone()));
    rt.delete(&id).await.unwrap();
    let s = rt.sh(&id, "true").await.unwrap_err();
    assert_eq!(
        (s.code(), reason(&s)),
        (Code::FailedPrecondition, "SANDBOX_ENDED".to_owned())
    );
}

#[tokio::test]
async fn connect_rejections_carry_the_reason_of_the_status() {
    let mut rt = TestRuntime::start().await;
    let id = rt.create_default().await.sandbox_id;
    let _busy = Busy::hold();
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let mut replies = rt
        .actions
        .connect(futures::stream::unfold(rx, |mut rx| async {
            rx.recv().await.map(|m| (m, rx))
        }))
        .await
        .unwrap()
        .into_inner();
    let send = |k| api::ConnectRequest { kind: Some(k) };
    tx.send(send(connect_request::Kind::Attach(
        connect_request::Attach {
            sandbox_id: id.clone(),
            after_seq: None,
        },
    )))
    .await
    .unwrap();
    // An empty command, a cancel of an unknown action, then another action under a used id.
    tx.send(send(connect_request::Kind::Submit(
        connect_request::Submit {
            action: Some(shell("")),
            action_id: "a".into(),
        },
    )))
    .await
    .unwrap();
    tx.send(send(connect_request::Kind::Cancel(
        connect_request::Cancel {
            action_id: "nobody".into(),
        },
    )))
    .await
    .unwrap();
    let mut rejected = Vec::new();
    while rejected.len() < 2 {
        let m = tokio::time::timeout(PATIENCE, replies.message())
            .await
            .expect("an answer in time")
            .unwrap()
            .expect("the stream stays open");
        if let Some(connect_response::Kind::Rejected(r)) = m.kind {
            rejected.push((r.action_id, r.code, r.reason));
        }
    }
    let owned = |a: &str, c: &str, r: &str| (a.to_owned(), c.to_owned(), r.to_owned());
    assert_eq!(
        rejected,
        [
            owned("a", "INVALID_ARGUMENT", "INVALID_ACTION"),
            owned("nobody", "NOT_FOUND", "ACTION_NOT_FOUND"),
        ]
    );
}
