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
    assert_eq!(
        h.get(&sb.sandbox_id).await?.state,
        api::SandboxState::Terminated as i32
    );
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
