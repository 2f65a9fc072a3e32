//! Snapshots (SnapshotService, `spec.snapshot_id`) through the runtime with real sandboxes and the local
//! store: a workspace taken, its sandbox deleted, restored into a new sandbox with every file's bytes, mode
//! and link as they were; a damaged archive refused on restore with nothing left behind; listing, paging,
//! labels, spaces and deletion.

mod policy;
mod s3;

use mentis_e2e::*;
use mentis_proto::api::{self, snapshot_service_client::SnapshotServiceClient};
use tonic::Code;

pub(super) fn snapshots(h: &Harness) -> SnapshotServiceClient<ApiChannel> {
    SnapshotServiceClient::new(h.channel.clone())
}

/// Every entry under /workspace with its type, mode, size, link target and content hash, as the sandbox
/// itself sees it.
pub(super) const STATE: &str = "cd /workspace && find . -mindepth 1 -printf '%p %y %m %s %l\\n' | sort && \
                     find . -type f -print0 | sort -z | xargs -0 -r sha256sum";

pub(super) async fn take(h: &Harness, sandbox: &str, labels: &[(&str, &str)]) -> api::Snapshot {
    snapshots(h)
        .create_snapshot(api::CreateSnapshotRequest {
            sandbox_id: sandbox.to_owned(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap()
}

/// CreateSandbox's own outcome (its status when refused).
pub(super) async fn create(
    h: &Harness,
    spec: api::SandboxSpec,
) -> Result<api::Sandbox, tonic::Status> {
    let r = h
        .sandboxes
        .clone()
        .create_sandbox(api::CreateSandboxRequest { spec: Some(spec) })
        .await?;
    Ok(r.into_inner().sandbox.unwrap_or_default())
}

pub(super) fn from_snapshot(snapshot_id: &str) -> api::SandboxSpec {
    api::SandboxSpec {
        snapshot_id: snapshot_id.to_owned(),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_workspace_comes_back_after_its_sandbox_is_deleted() {
    let mut h = Harness::start().await.unwrap();
    let sandbox = h.create_default().await.unwrap().sandbox_id;
    let made = h
        .sh(
            &sandbox,
            "cd /workspace && mkdir -p src/pkg empty && printf 'print(1)\\n' > src/main.py && \
             head -c 3000000 /dev/urandom > src/pkg/blob.bin && printf '#!/bin/sh\\necho run\\n' > run.sh && \
             chmod 750 run.sh && chmod 700 src/pkg && ln -s src/main.py link.py && \
             printf 'x' > 'name with spaces é.txt'",
        )
        .await
        .unwrap();
    assert_eq!(cmd_end(&made).unwrap().exit_code, 0, "{}", stderr(&made));
    let before = stdout(&h.sh(&sandbox, STATE).await.unwrap());
    assert!(before.contains("./link.py l 777"), "{before}");

    let snap = take(&h, &sandbox, &[("conversation", "c-1")]).await;
    assert_eq!(snap.sandbox_id, sandbox);
    assert_eq!(snap.space_id, "default");
    assert_eq!(snap.store, "local");
    assert_eq!(snap.sha256.len(), 64);
    assert!(snap.archive_bytes > 3_000_000, "{snap:?}");
    // Random bytes do not compress: the archive is about their size, and a header or two more.
    assert!(
        snap.size_bytes > 2_900_000 && snap.size_bytes < snap.archive_bytes,
        "{snap:?}"
    );
    let got = snapshots(&h)
        .get_snapshot(api::GetSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot
        .unwrap();
    assert_eq!(got, snap);

    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: sandbox.clone(),
        })
        .await
        .unwrap();
    let restored = h.create(from_snapshot(&snap.snapshot_id)).await.unwrap();
    assert_ne!(restored.sandbox_id, sandbox);
    let after = stdout(&h.sh(&restored.sandbox_id, STATE).await.unwrap());
    assert_eq!(after, before, "the restored workspace differs");
    let ran = h
        .sh(&restored.sandbox_id, "./run.sh && python3 link.py")
        .await
        .unwrap();
    assert_eq!(stdout(&ran), "run\n1\n");
    h.stop().await.unwrap();
}

#[tokio::test]
async fn a_damaged_archive_is_refused_and_leaves_no_sandbox() {
    let mut h = Harness::start().await.unwrap();
    let sandbox = h.create_default().await.unwrap().sandbox_id;
    h.sh(&sandbox, "seq 1 200000 > /workspace/numbers.txt")
        .await
        .unwrap();
    let snap = take(&h, &sandbox, &[]).await;
    let live_before = h
        .sandboxes
        .list_sandboxes(api::ListSandboxesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .sandboxes
        .len();

    // One byte in the middle of the stored archive flipped.
    let object = h
        .data_dir
        .path()
        .join("snapshots")
        .join(format!("{}.tar.zst", snap.snapshot_id));
    let mut bytes = std::fs::read(&object).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x40;
    std::fs::write(&object, &bytes).unwrap();
    let (code, reason, field) = refusal(create(&h, from_snapshot(&snap.snapshot_id)).await);
    assert_eq!(
        (code, reason.as_str()),
        (Code::FailedPrecondition, "SNAPSHOT_CORRUPT")
    );
    assert_eq!(field, None);
    let live_after = h
        .sandboxes
        .list_sandboxes(api::ListSandboxesRequest {
            states: vec![api::SandboxState::Running as i32],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .sandboxes
        .len();
    assert_eq!(live_after, live_before, "the failed restore left a sandbox");

    // Missing from the store: the same refusal.
    std::fs::remove_file(&object).unwrap();
    let (code, reason, _) = refusal(create(&h, from_snapshot(&snap.snapshot_id)).await);
    assert_eq!(
        (code, reason.as_str()),
        (Code::FailedPrecondition, "SNAPSHOT_CORRUPT")
    );
    h.stop().await.unwrap();
}

#[tokio::test]
async fn snapshots_are_listed_paged_filtered_scoped_and_deleted() {
    let mut h = Harness::start().await.unwrap();
    let a = h.create_default().await.unwrap().sandbox_id;
    let b = h.create_default().await.unwrap().sandbox_id;
    let s1 = take(&h, &a, &[("k", "1")]).await;
    let s2 = take(&h, &b, &[("k", "2")]).await;
    let s3 = take(&h, &a, &[("k", "1")]).await;
    let mut client = snapshots(&h);
    let list = |req: api::ListSnapshotsRequest| {
        let mut client = client.clone();
        async move { client.list_snapshots(req).await.map(|r| r.into_inner()) }
    };
    let ids = |r: &api::ListSnapshotsResponse| -> Vec<String> {
        r.snapshots.iter().map(|s| s.snapshot_id.clone()).collect()
    };
    // Newest first, two per page.
    let page = list(api::ListSnapshotsRequest {
        page_size: 2,
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(ids(&page), [s3.snapshot_id.clone(), s2.snapshot_id.clone()]);
    let rest = list(api::ListSnapshotsRequest {
        page_size: 2,
        page_token: page.next_page_token.clone(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(ids(&rest), std::slice::from_ref(&s1.snapshot_id));
    assert!(rest.next_page_token.is_empty());
    let of_a = list(api::ListSnapshotsRequest {
        sandbox_id: a.clone(),
        labels: [("k".to_owned(), "1".to_owned())].into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(ids(&of_a), [s3.snapshot_id.clone(), s1.snapshot_id.clone()]);
    let other_space = list(api::ListSnapshotsRequest {
        space_id: "nobody-here".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    assert!(other_space.snapshots.is_empty());
    let (code_, reason, field) = refusal(
        list(api::ListSnapshotsRequest {
            page_token: "not a token".into(),
            ..Default::default()
        })
        .await,
    );
    assert_eq!(
        (code_, reason.as_str()),
        (Code::InvalidArgument, "INVALID_ARGUMENT")
    );
    assert_eq!(field.as_deref(), Some("page_token"));

    // Deleted: gone from the store and from the folder, and deleting again is no error.
    client
        .delete_snapshot(api::DeleteSnapshotRequest {
            snapshot_id: s1.snapshot_id.clone(),
        })
        .await
        .unwrap();
    client
        .delete_snapshot(api::DeleteSnapshotRequest {
            snapshot_id: s1.snapshot_id.clone(),
        })
        .await
        .unwrap();
    let (c, reason, _) = refusal(
        client
            .get_snapshot(api::GetSnapshotRequest {
                snapshot_id: s1.snapshot_id.clone(),
            })
            .await,
    );
    assert_eq!((c, reason.as_str()), (Code::NotFound, "SNAPSHOT_NOT_FOUND"));
    let objects: Vec<_> = std::fs::read_dir(h.data_dir.path().join("snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(objects.len(), 2, "{objects:?}");
    assert!(!objects.iter().any(|o| o.starts_with(&s1.snapshot_id)));

    // A snapshot restores only into its own space.
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "elsewhere".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let (c, _, field) = refusal(
        create(
            &h,
            api::SandboxSpec {
                space_id: "elsewhere".into(),
                snapshot_id: s2.snapshot_id.clone(),
                ..Default::default()
            },
        )
        .await,
    );
    assert_eq!(
        (c, field.as_deref()),
        (Code::InvalidArgument, Some("spec.snapshot_id"))
    );
    h.stop().await.unwrap();
}
