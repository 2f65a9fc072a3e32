//! Spaces: CRUD, their sandbox limit, and deletion with and without force.

use mentis_e2e::*;
use mentis_proto::api;
use tonic::Code;

fn space(id: &str, max: u32) -> api::Space {
    api::Space {
        space_id: id.to_owned(),
        display_name: format!("Space {id}"),
        description: "e2e".into(),
        metadata: [("team".to_owned(), "e2e".to_owned())].into(),
        limits: Some(api::SpaceLimits {
            max_sandboxes: max,
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn space_crud_limits_and_deletion() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let created = h
        .spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(space("team-a", 1)),
        })
        .await?
        .into_inner()
        .space
        .unwrap();
    assert_eq!(
        (created.space_id.as_str(), created.sandbox_count),
        ("team-a", 0)
    );
    let again = h
        .spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(space("team-a", 1)),
        })
        .await;
    assert_eq!(code(again), Code::AlreadyExists);
    for bad in ["", "Team A", "-x", &"a".repeat(64)] {
        let r = h
            .spaces
            .create_space(api::CreateSpaceRequest {
                space: Some(space(bad, 0)),
            })
            .await;
        assert_eq!(code(r), Code::InvalidArgument, "{bad:?}");
    }
    let r = h
        .spaces
        .get_space(api::GetSpaceRequest {
            space_id: "nope".into(),
        })
        .await;
    assert_eq!(code(r), Code::NotFound);

    // The default space always exists; list pages in id order.
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(space("team-b", 0)),
        })
        .await?;
    let page = h
        .spaces
        .list_spaces(api::ListSpacesRequest {
            page_size: 2,
            page_token: String::new(),
        })
        .await?
        .into_inner();
    let ids: Vec<_> = page.spaces.iter().map(|s| s.space_id.as_str()).collect();
    assert_eq!(ids, ["default", "team-a"]);
    let rest = h
        .spaces
        .list_spaces(api::ListSpacesRequest {
            page_size: 2,
            page_token: page.next_page_token,
        })
        .await?
        .into_inner();
    assert_eq!(rest.spaces[0].space_id, "team-b");
    assert!(rest.next_page_token.is_empty());

    // Update only what the mask names.
    let updated = h
        .spaces
        .update_space(api::UpdateSpaceRequest {
            space: Some(api::Space {
                space_id: "team-a".into(),
                display_name: "Renamed".into(),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["display_name".into()],
            }),
        })
        .await?
        .into_inner()
        .space
        .unwrap();
    assert_eq!(
        (updated.display_name.as_str(), updated.description.as_str()),
        ("Renamed", "e2e")
    );
    assert_eq!(updated.limits.unwrap().max_sandboxes, 1);

    // The space's limit: one sandbox.
    let sb = h
        .create(api::SandboxSpec {
            space_id: "team-a".into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(sb.space_id, "team-a");
    let second = h
        .sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec {
                space_id: "team-a".into(),
                ..Default::default()
            }),
        })
        .await;
    assert_eq!(code(second), Code::ResourceExhausted);
    let unknown = h
        .sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec {
                space_id: "no-such-space".into(),
                ..Default::default()
            }),
        })
        .await;
    assert_eq!(code(unknown), Code::NotFound);
    let listed = h
        .sandboxes
        .list_sandboxes(api::ListSandboxesRequest {
            space_id: "team-a".into(),
            states: vec![api::SandboxState::Running as i32],
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(listed.sandboxes.len(), 1);
    let got = h
        .spaces
        .get_space(api::GetSpaceRequest {
            space_id: "team-a".into(),
        })
        .await?
        .into_inner()
        .space
        .unwrap();
    assert_eq!(got.sandbox_count, 1);

    // Deleting a space with sandboxes needs force; force deletes them.
    let r = h
        .spaces
        .delete_space(api::DeleteSpaceRequest {
            space_id: "team-a".into(),
            force: false,
        })
        .await;
    assert_eq!(code(r), Code::FailedPrecondition);
    h.spaces
        .delete_space(api::DeleteSpaceRequest {
            space_id: "team-a".into(),
            force: true,
        })
        .await?;
    // Its sandboxes go with it, records included (a space deleted leaves nothing).
    let gone = h
        .sandboxes
        .get_sandbox(api::GetSandboxRequest {
            sandbox_id: sb.sandbox_id.clone(),
        })
        .await;
    assert_eq!(code(gone), Code::NotFound);
    assert!(docker(&["inspect", &container_of(&sb.sandbox_id)]).is_err());
    let r = h
        .spaces
        .delete_space(api::DeleteSpaceRequest {
            space_id: "default".into(),
            force: true,
        })
        .await;
    assert_eq!(code(r), Code::FailedPrecondition);
    h.stop().await
}

#[tokio::test]
async fn a_space_gets_its_read_only_data_mount() -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let data = tempfile::tempdir()?;
    std::fs::write(data.path().join("facts.csv"), "a,b\n1,2\n")?;
    // The sandbox user (uid 1000) must be able to read it.
    std::fs::set_permissions(data.path(), std::fs::Permissions::from_mode(0o755))?;
    std::fs::set_permissions(
        data.path().join("facts.csv"),
        std::fs::Permissions::from_mode(0o644),
    )?;
    let host = data.path().to_owned();
    let mut h = Harness::start_with(move |c| {
        c.data_mounts = vec![mentis_runtime::config::SpaceMount {
            space: Some("research".into()),
            mount: mentis_runtime::config::DataMount {
                host,
                target: "/data".into(),
            },
        }];
    })
    .await?;
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(space("research", 0)),
        })
        .await?;
    let id = h
        .create(api::SandboxSpec {
            space_id: "research".into(),
            ..Default::default()
        })
        .await?
        .sandbox_id;
    assert_eq!(
        stdout(&h.sh(&id, "cat /data/facts.csv").await?),
        "a,b\n1,2\n"
    );
    let write = h.sh(&id, "echo x > /data/new 2>&1").await?;
    assert_ne!(cmd_end(&write)?.exit_code, 0, "the mount is read-only");
    assert!(!data.path().join("new").exists());
    let other = h.create_default().await?.sandbox_id;
    assert_eq!(cmd_end(&h.sh(&other, "test -e /data").await?)?.exit_code, 1);
    h.stop().await
}

/// Issue 40, finding 2: a deleted space took nothing with it. Now its snapshots (records and archives), its
/// ended sandboxes, its templates and its keys' scope go with it, and a space made again under the same id is
/// another generation that starts empty: the old key reaches nothing of it.
#[tokio::test]
async fn a_deleted_space_leaves_nothing_and_a_space_made_again_under_its_id_starts_empty()
-> anyhow::Result<()> {
    use mentis_proto::api::{
        file_service_client::FileServiceClient, key_service_client::KeyServiceClient,
        sandbox_service_client::SandboxServiceClient,
        snapshot_service_client::SnapshotServiceClient,
        template_service_client::TemplateServiceClient,
    };
    let mut h = Harness::start().await?;
    let make_space = |id: &str| api::CreateSpaceRequest {
        space: Some(api::Space {
            space_id: id.to_owned(),
            ..Default::default()
        }),
    };
    let mut keys = KeyServiceClient::new(h.channel.clone());
    let make_key = |name: &str, spaces: &[&str]| api::CreateApiKeyRequest {
        name: name.to_owned(),
        space_ids: spaces.iter().map(|s| (*s).to_owned()).collect(),
    };
    h.spaces.create_space(make_space("tz")).await?;
    h.spaces.create_space(make_space("neighbour")).await?;
    let k1 = keys
        .create_api_key(make_key("k1", &["tz"]))
        .await?
        .into_inner();
    let k3 = keys
        .create_api_key(make_key("k3", &["tz", "neighbour"]))
        .await?
        .into_inner();
    let (k1_id, k1) = (k1.api_key.unwrap_or_default().key_id, k1.secret);
    let k3 = k3.secret;

    let old = h
        .create(api::SandboxSpec {
            space_id: "tz".into(),
            ..Default::default()
        })
        .await?
        .sandbox_id;
    h.sh(&old, "echo TENANT1-SECRET > /workspace/secret")
        .await?;
    let mut snapshots = SnapshotServiceClient::new(h.channel.clone());
    let snapshot = snapshots
        .create_snapshot(api::CreateSnapshotRequest {
            sandbox_id: old.clone(),
            labels: Default::default(),
        })
        .await?
        .into_inner()
        .snapshot
        .unwrap_or_default()
        .snapshot_id;
    let archives = h.data_dir.path().join("snapshots");
    let holds_archive = |dir: &std::path::Path| -> bool {
        fn walk(dir: &std::path::Path, id: &str) -> bool {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| {
                    let p = e.path();
                    p.to_string_lossy().contains(id) || (p.is_dir() && walk(&p, id))
                })
        }
        walk(dir, &snapshot)
    };
    assert!(
        holds_archive(&archives),
        "the archive is in the data folder"
    );
    let mut templates = TemplateServiceClient::new(h.channel.clone());
    templates
        .create_template(api::CreateTemplateRequest {
            template: Some(api::Template {
                space_id: "tz".into(),
                name: "tpl".into(),
                ..Default::default()
            }),
        })
        .await?;
    // An ended sandbox of the space, kept for its retention hour until now.
    let ended = h
        .create(api::SandboxSpec {
            space_id: "tz".into(),
            ..Default::default()
        })
        .await?
        .sandbox_id;
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: ended.clone(),
        })
        .await?;

    h.spaces
        .delete_space(api::DeleteSpaceRequest {
            space_id: "tz".into(),
            force: true,
        })
        .await?;

    // Nothing of it is left: the snapshot's record and archive, the sandboxes' records, the template.
    let got = snapshots
        .get_snapshot(api::GetSnapshotRequest {
            snapshot_id: snapshot.clone(),
        })
        .await;
    assert_eq!(code(got), tonic::Code::NotFound);
    assert!(!holds_archive(&archives), "the archive is gone");
    for id in [&old, &ended] {
        let got = h
            .sandboxes
            .get_sandbox(api::GetSandboxRequest {
                sandbox_id: id.clone(),
            })
            .await;
        assert_eq!(code(got), tonic::Code::NotFound, "sandbox {id}");
    }
    // k1 had only tz: revoked. k3 keeps its other space.
    let listed = keys
        .list_api_keys(api::ListApiKeysRequest {})
        .await?
        .into_inner();
    let k1_now = listed
        .api_keys
        .iter()
        .find(|k| k.key_id == k1_id)
        .expect("k1 listed");
    assert!(k1_now.revoke_time.is_some(), "{k1_now:?}");
    let as_k1 = SandboxServiceClient::new(h.with_key(Some(&k1)));
    assert_eq!(
        code(
            as_k1
                .clone()
                .list_sandboxes(api::ListSandboxesRequest::default())
                .await
        ),
        tonic::Code::Unauthenticated
    );

    // tz made again, with a new key k2: it starts empty.
    h.spaces.create_space(make_space("tz")).await?;
    let k2 = keys
        .create_api_key(make_key("k2", &["tz"]))
        .await?
        .into_inner()
        .secret;
    let got = SnapshotServiceClient::new(h.with_key(Some(&k2)))
        .list_snapshots(api::ListSnapshotsRequest::default())
        .await?
        .into_inner();
    assert!(got.snapshots.is_empty(), "{:?}", got.snapshots);
    let restore = SandboxServiceClient::new(h.with_key(Some(&k2)))
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec {
                space_id: "tz".into(),
                snapshot_id: snapshot.clone(),
                ..Default::default()
            }),
        })
        .await;
    assert_eq!(code(restore), tonic::Code::NotFound);
    let got = TemplateServiceClient::new(h.with_key(Some(&k2)))
        .get_template(api::GetTemplateRequest {
            space_id: "tz".into(),
            name: "tpl".into(),
        })
        .await;
    assert_eq!(code(got), tonic::Code::NotFound);
    let new = SandboxServiceClient::new(h.with_key(Some(&k2)))
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec {
                space_id: "tz".into(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner()
        .sandbox
        .unwrap_or_default()
        .sandbox_id;
    h.wait_state(
        &new,
        api::SandboxState::Running,
        std::time::Duration::from_secs(60),
    )
    .await?;
    // Neither k1 (revoked) nor k3 (made for the first tz) reaches the new tenant's sandbox or files.
    for (who, key) in [("k1", &k1), ("k3", &k3)] {
        let listed = SandboxServiceClient::new(h.with_key(Some(key)))
            .list_sandboxes(api::ListSandboxesRequest::default())
            .await;
        if let Ok(listed) = listed {
            assert!(
                listed
                    .into_inner()
                    .sandboxes
                    .iter()
                    .all(|s| s.sandbox_id != new),
                "{who} lists the new tenant's sandbox"
            );
        }
        let read = FileServiceClient::new(h.with_key(Some(key)))
            .read_file(api::ReadFileRequest {
                sandbox_id: new.clone(),
                path: "secret".into(),
                ..Default::default()
            })
            .await;
        assert!(
            matches!(
                code(read),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ),
            "{who} reads the new tenant's files"
        );
    }
    // k3 still works in its other space.
    SandboxServiceClient::new(h.with_key(Some(&k3)))
        .list_sandboxes(api::ListSandboxesRequest {
            space_id: "neighbour".into(),
            ..Default::default()
        })
        .await?;
    h.stop().await
}
