//! Snapshots a space asks for (`Space.snapshot_policy`): before a delete (of a RUNNING and of a PAUSED
//! sandbox), before a pause, and before the idle timeout ends a sandbox; each labelled with its trigger and
//! the sandbox's key, so a deleted conversation's sandbox comes back whole. A snapshot that cannot be
//! written stops the delete and leaves the sandbox as it was.

use std::collections::HashMap;
use std::time::Duration;

use mentis_e2e::*;
use mentis_proto::api;

use super::{STATE, from_snapshot, snapshots};

async fn space(h: &mut Harness, id: &str, policy: api::SnapshotPolicy) -> api::Space {
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: id.into(),
                snapshot_policy: Some(policy),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .space
        .unwrap()
}

async fn policy_snapshots(h: &Harness, labels: &[(&str, &str)]) -> Vec<api::Snapshot> {
    snapshots(h)
        .list_snapshots(api::ListSnapshotsRequest {
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshots
}

async fn delete(h: &mut Harness, sandbox: &str) -> Result<(), tonic::Status> {
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: sandbox.to_owned(),
        })
        .await
        .map(|_| ())
}

#[tokio::test]
async fn a_space_keeps_its_sandboxes_workspaces_on_delete_pause_and_idle_expiry() {
    let mut h = Harness::start_with(|c| c.reaper_interval = Duration::from_secs(1))
        .await
        .unwrap();
    let on_delete = space(
        &mut h,
        "keep-on-delete",
        api::SnapshotPolicy {
            on_delete: true,
            ..Default::default()
        },
    )
    .await;
    assert!(on_delete.snapshot_policy.unwrap().on_delete);

    // A conversation's sandbox, deleted: its workspace comes back from the snapshot its delete left.
    let conversation = h
        .create(api::SandboxSpec {
            space_id: "keep-on-delete".into(),
            external_key: "conversation-7".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .sandbox_id;
    h.sh(
        &conversation,
        "cd /workspace && mkdir notes && echo 'step 1' > notes/log.txt && chmod 640 notes/log.txt",
    )
    .await
    .unwrap();
    let before = stdout(&h.sh(&conversation, STATE).await.unwrap());
    delete(&mut h, &conversation).await.unwrap();
    let kept = policy_snapshots(
        &h,
        &[
            ("io.mentis.trigger", "delete"),
            ("io.mentis.sandbox-key", "conversation-7"),
        ],
    )
    .await;
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        (kept[0].sandbox_id.as_str(), kept[0].space_id.as_str()),
        (conversation.as_str(), "keep-on-delete")
    );
    let back = h
        .create(api::SandboxSpec {
            space_id: "keep-on-delete".into(),
            external_key: "conversation-7".into(),
            ..from_snapshot(&kept[0].snapshot_id)
        })
        .await
        .unwrap()
        .sandbox_id;
    assert_eq!(stdout(&h.sh(&back, STATE).await.unwrap()), before);

    // A PAUSED sandbox is resumed for its snapshot, then deleted.
    h.sh(&back, "echo 'step 2' >> /workspace/notes/log.txt")
        .await
        .unwrap();
    h.sandboxes
        .pause_sandbox(api::PauseSandboxRequest {
            sandbox_id: back.clone(),
        })
        .await
        .unwrap();
    delete(&mut h, &back).await.unwrap();
    let of_back = snapshots(&h)
        .list_snapshots(api::ListSnapshotsRequest {
            sandbox_id: back.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .snapshots;
    assert_eq!(
        of_back.len(),
        1,
        "only the delete asks for one: {of_back:?}"
    );
    let again = h
        .create(api::SandboxSpec {
            space_id: "keep-on-delete".into(),
            ..from_snapshot(&of_back[0].snapshot_id)
        })
        .await
        .unwrap()
        .sandbox_id;
    let log = h.sh(&again, "cat /workspace/notes/log.txt").await.unwrap();
    assert_eq!(stdout(&log), "step 1\nstep 2\n");

    // A snapshot that cannot be written stops the delete: the sandbox stays, with its workspace.
    let folder = h.data_dir.path().join("snapshots");
    let aside = h.data_dir.path().join("snapshots.aside");
    std::fs::rename(&folder, &aside).unwrap();
    std::fs::write(&folder, b"not a folder").unwrap();
    // The store's failure is the runtime's own: INTERNAL, its story in the runtime's log under the
    // error id the client gets.
    let refused = delete(&mut h, &again).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Internal, "{refused:?}");
    let still = h.get(&again).await.unwrap();
    assert_eq!(still.state, api::SandboxState::Running as i32);
    assert_eq!(
        stdout(&h.sh(&again, "cat /workspace/notes/log.txt").await.unwrap()),
        "step 1\nstep 2\n"
    );
    std::fs::remove_file(&folder).unwrap();
    std::fs::rename(&aside, &folder).unwrap();
    delete(&mut h, &again).await.unwrap();

    // Pause and expiry, in a space that asks for both: a pause by a client, and the idle timeout's
    // delete, each leave one labelled with what took it.
    space(
        &mut h,
        "keep-on-expiry",
        api::SnapshotPolicy {
            on_pause: true,
            on_expiry: true,
            ..Default::default()
        },
    )
    .await;
    let paused = h
        .create(api::SandboxSpec {
            space_id: "keep-on-expiry".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .sandbox_id;
    h.sandboxes
        .pause_sandbox(api::PauseSandboxRequest {
            sandbox_id: paused.clone(),
        })
        .await
        .unwrap();
    let idle = h
        .create(api::SandboxSpec {
            space_id: "keep-on-expiry".into(),
            idle_timeout_seconds: 2,
            idle_policy: api::IdlePolicy::Delete as i32,
            ..Default::default()
        })
        .await
        .unwrap()
        .sandbox_id;
    h.sh(&idle, "echo idle > /workspace/left.txt")
        .await
        .unwrap();
    h.wait_state(
        &idle,
        api::SandboxState::Terminated,
        Duration::from_secs(60),
    )
    .await
    .unwrap();
    let triggers: HashMap<String, String> = policy_snapshots(&h, &[])
        .await
        .into_iter()
        .filter(|s| s.space_id == "keep-on-expiry")
        .map(|s| (s.sandbox_id, s.labels["io.mentis.trigger"].clone()))
        .collect();
    assert_eq!(
        triggers,
        HashMap::from([
            (paused.clone(), "pause".to_owned()),
            (idle.clone(), "idle-timeout".to_owned()),
        ])
    );
    // Deleting the paused one takes none: this space does not ask for one on delete.
    delete(&mut h, &paused).await.unwrap();
    assert_eq!(
        policy_snapshots(&h, &[("io.mentis.trigger", "delete")])
            .await
            .iter()
            .filter(|s| s.space_id == "keep-on-expiry")
            .count(),
        0
    );

    // The policy is changed with UpdateSpace (its own mask path) and read back.
    let updated = h
        .spaces
        .update_space(api::UpdateSpaceRequest {
            space: Some(api::Space {
                space_id: "keep-on-expiry".into(),
                snapshot_policy: Some(api::SnapshotPolicy::default()),
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["snapshot_policy".into()],
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .space
        .unwrap();
    assert_eq!(
        updated.snapshot_policy,
        Some(api::SnapshotPolicy::default())
    );
    h.stop().await.unwrap();
}
