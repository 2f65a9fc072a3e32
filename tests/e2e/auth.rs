//! API keys: no key or an unknown one is refused (Unauthenticated), a space-scoped key acts only in its
//! spaces (PermissionDenied elsewhere), a revoked key is refused, health stays open, and the dev flag lets
//! everybody in.

use futures::StreamExt;
use mentis_e2e::*;
use mentis_proto::api::{
    self, action_service_client::ActionServiceClient, file_service_client::FileServiceClient,
    key_service_client::KeyServiceClient, sandbox_service_client::SandboxServiceClient,
    space_service_client::SpaceServiceClient,
};
use mentis_runtime::config::AuthConfig;
use tonic::Code;
use tonic_health::pb::health_client::HealthClient;

fn in_space(space: &str) -> api::SandboxSpec {
    api::SandboxSpec {
        space_id: space.to_owned(),
        ..Default::default()
    }
}

async fn make_space(h: &mut Harness, id: &str) -> anyhow::Result<()> {
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: id.to_owned(),
                ..Default::default()
            }),
        })
        .await?;
    Ok(())
}

/// Every service, presenting `key`: the codes of one call on each.
async fn codes_of_every_service(h: &Harness, key: Option<&str>, sandbox: &str) -> Vec<Code> {
    let ch = h.with_key(key);
    let get = api::GetSandboxRequest {
        sandbox_id: sandbox.to_owned(),
    };
    vec![
        code(SandboxServiceClient::new(ch.clone()).get_sandbox(get).await),
        code(
            SpaceServiceClient::new(ch.clone())
                .list_spaces(api::ListSpacesRequest::default())
                .await,
        ),
        code(
            ActionServiceClient::new(ch.clone())
                .execute(api::ExecuteRequest {
                    sandbox_id: sandbox.to_owned(),
                    action: Some(shell_action(cmd("true"))),
                    action_id: String::new(),
                })
                .await,
        ),
        code(
            FileServiceClient::new(ch.clone())
                .list_files(api::ListFilesRequest {
                    sandbox_id: sandbox.to_owned(),
                    ..Default::default()
                })
                .await,
        ),
        code(
            KeyServiceClient::new(ch)
                .list_api_keys(api::ListApiKeysRequest {})
                .await,
        ),
    ]
}

#[tokio::test]
async fn api_keys_authenticate_callers_and_scope_them_to_their_spaces() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    make_space(&mut h, "team-a").await?;
    make_space(&mut h, "team-b").await?;
    let theirs = h.create(in_space("team-b")).await?.sandbox_id;

    // No key, a malformed header, an unknown key: Unauthenticated on every service; health stays open.
    for key in [None, Some("msk_0000"), Some(&*random_key())] {
        assert_eq!(
            codes_of_every_service(&h, key, &theirs).await,
            vec![Code::Unauthenticated; 5],
            "{key:?}"
        );
    }
    // The auth layer's refusal says why, with the same details as a service's.
    for (key, why) in [
        (None, "API_KEY_MISSING"),
        (Some(&*random_key()), "API_KEY_UNKNOWN"),
    ] {
        let r = SandboxServiceClient::new(h.with_key(key))
            .get_sandbox(api::GetSandboxRequest {
                sandbox_id: theirs.clone(),
            })
            .await;
        assert_eq!(
            refusal(r),
            (Code::Unauthenticated, why.to_owned(), None),
            "{key:?}"
        );
    }
    let mut health = HealthClient::new(h.raw.clone());
    health
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await?;

    // A key for team-a.
    let mut keys = KeyServiceClient::new(h.channel.clone());
    let made = keys
        .create_api_key(api::CreateApiKeyRequest {
            name: "agent of team a".into(),
            space_ids: vec!["team-a".into()],
        })
        .await?
        .into_inner();
    let secret = made.secret;
    let key_id = made.api_key.unwrap().key_id;
    assert!(secret.starts_with("msk_"), "{secret}");
    // Keys need existing spaces, at least one.
    for bad in [vec!["no-such-space".to_owned()], vec![]] {
        let r = keys
            .create_api_key(api::CreateApiKeyRequest {
                name: "x".into(),
                space_ids: bad.clone(),
            })
            .await;
        assert!(
            matches!(code(r), Code::NotFound | Code::InvalidArgument),
            "{bad:?}"
        );
    }

    let a = h.with_key(Some(&secret));
    let mut sandboxes = SandboxServiceClient::new(a.clone());
    let mut spaces = SpaceServiceClient::new(a.clone());
    let mut actions = ActionServiceClient::new(a.clone());
    let mut files = FileServiceClient::new(a.clone());

    // In its space it works end to end: create, run, read files, list.
    let ours = sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(in_space("team-a")),
        })
        .await?
        .into_inner()
        .sandbox
        .unwrap()
        .sandbox_id;
    let stream = actions
        .execute(api::ExecuteRequest {
            sandbox_id: ours.clone(),
            action: Some(shell_action(cmd("echo scoped"))),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let obs = collect(stream, std::time::Duration::from_secs(60)).await?;
    assert_eq!(stdout(&obs), "scoped\n");
    files
        .list_files(api::ListFilesRequest {
            sandbox_id: ours.clone(),
            ..Default::default()
        })
        .await?;
    let listed: Vec<String> = sandboxes
        .list_sandboxes(api::ListSandboxesRequest::default())
        .await?
        .into_inner()
        .sandboxes
        .into_iter()
        .map(|s| s.sandbox_id)
        .collect();
    assert_eq!(
        listed,
        vec![ours.clone()],
        "a scoped key lists its spaces only"
    );
    let listed: Vec<String> = spaces
        .list_spaces(api::ListSpacesRequest::default())
        .await?
        .into_inner()
        .spaces
        .into_iter()
        .map(|s| s.space_id)
        .collect();
    assert_eq!(listed, vec!["team-a".to_owned()]);

    // Another space's sandbox, named by id: refused without saying whose it is (issue 40, finding 9).
    let refused = sandboxes
        .get_sandbox(api::GetSandboxRequest {
            sandbox_id: theirs.clone(),
        })
        .await
        .expect_err("another space's sandbox");
    assert_eq!(refused.code(), Code::PermissionDenied);
    assert!(
        !refused.message().contains("team-b")
            && !String::from_utf8_lossy(refused.details()).contains("team-b"),
        "{refused:?}"
    );
    // Elsewhere: PermissionDenied, whatever the call.
    let denied = [
        code(
            sandboxes
                .create_sandbox(api::CreateSandboxRequest {
                    spec: Some(in_space("team-b")),
                })
                .await,
        ),
        // No space = the default space, which this key is not for.
        code(
            sandboxes
                .create_sandbox(api::CreateSandboxRequest {
                    spec: Some(api::SandboxSpec::default()),
                })
                .await,
        ),
        code(
            sandboxes
                .delete_sandbox(api::DeleteSandboxRequest {
                    sandbox_id: theirs.clone(),
                })
                .await,
        ),
        code(
            sandboxes
                .list_sandboxes(api::ListSandboxesRequest {
                    space_id: "team-b".into(),
                    ..Default::default()
                })
                .await,
        ),
        code(
            spaces
                .get_space(api::GetSpaceRequest {
                    space_id: "team-b".into(),
                })
                .await,
        ),
        code(
            spaces
                .update_space(api::UpdateSpaceRequest {
                    space: Some(api::Space {
                        space_id: "team-a".into(),
                        ..Default::default()
                    }),
                    update_mask: None,
                })
                .await,
        ),
        code(
            KeyServiceClient::new(a.clone())
                .list_api_keys(api::ListApiKeysRequest {})
                .await,
        ),
    ];
    assert_eq!(denied, [Code::PermissionDenied; 7]);
    let elsewhere = sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(in_space("team-b")),
        })
        .await;
    assert_eq!(refusal(elsewhere).1, "SPACE_NOT_ALLOWED");
    let admin_only = KeyServiceClient::new(a.clone())
        .list_api_keys(api::ListApiKeysRequest {})
        .await;
    assert_eq!(refusal(admin_only).1, "ADMIN_REQUIRED");
    let mut denied = codes_of_every_service(&h, Some(&secret), &theirs).await;
    denied.remove(1); // ListSpaces is allowed (filtered)
    assert_eq!(denied, vec![Code::PermissionDenied; 4]);

    // Connect: attaching to another space's sandbox ends the stream with PermissionDenied.
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    tx.send(api::ConnectRequest {
        kind: Some(api::connect_request::Kind::Attach(
            api::connect_request::Attach {
                sandbox_id: theirs.clone(),
                after_seq: None,
            },
        )),
    })
    .await?;
    let mut stream = actions
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), stream.next()).await?;
    assert_eq!(
        first.map(code),
        Some(Code::PermissionDenied),
        "attach to another space's sandbox"
    );

    // The admin sees the key (never its secret); once revoked, the key is refused.
    let revoked = keys
        .revoke_api_key(api::RevokeApiKeyRequest {
            key_id: key_id.clone(),
        })
        .await?
        .into_inner()
        .api_key
        .unwrap();
    assert!(revoked.revoke_time.is_some());
    let all = keys
        .list_api_keys(api::ListApiKeysRequest {})
        .await?
        .into_inner()
        .api_keys;
    assert_eq!(all.len(), 1);
    assert_eq!(
        (all[0].key_id.as_str(), all[0].space_ids.as_slice()),
        (key_id.as_str(), &["team-a".to_owned()][..])
    );
    let after = sandboxes
        .get_sandbox(api::GetSandboxRequest {
            sandbox_id: ours.clone(),
        })
        .await;
    assert_eq!(
        refusal(after),
        (Code::Unauthenticated, "API_KEY_REVOKED".to_owned(), None)
    );
    // The sandbox itself is untouched: the admin still reaches it.
    h.get(&ours).await?;
    h.stop().await
}

#[tokio::test]
async fn with_auth_disabled_anybody_is_admin() -> anyhow::Result<()> {
    let h = Harness::start_with(|c| c.auth = AuthConfig::Disabled).await?;
    let anon = h.with_key(None);
    let sb = SandboxServiceClient::new(anon.clone())
        .create_sandbox(api::CreateSandboxRequest::default())
        .await?
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(sb.space_id, "default");
    // Keys would not be checked, so none can be made.
    let r = KeyServiceClient::new(anon)
        .create_api_key(api::CreateApiKeyRequest {
            name: "x".into(),
            space_ids: vec!["default".into()],
        })
        .await;
    assert_eq!(
        refusal(r),
        (Code::FailedPrecondition, "AUTH_DISABLED".to_owned(), None)
    );
    h.stop().await
}
