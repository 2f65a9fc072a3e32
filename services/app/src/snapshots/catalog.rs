//! Snapshots as the rest of the runtime uses them: an archive in the snapshot store and its record in the
//! durable store, written, read and deleted together.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::SystemTime;

use mentis_core::{Result, SandboxId, SpaceId};

use super::archive;
use super::store::SnapshotStore;
use crate::executor_client::ExecutorClient;
use crate::store::Store;
use crate::store::snapshots::SnapshotRecord;

/// The object of snapshot `id` in the snapshot store.
pub fn object_key(id: &str) -> String {
    format!("{id}.tar.zst")
}

/// Every snapshot of this runtime: archives in `archives`, records in `records`.
#[derive(Debug)]
pub struct Snapshots {
    archives: Arc<dyn SnapshotStore>,
    records: Arc<Store>,
}

impl Snapshots {
    /// Archives in `archives` (the server picks a folder of the data folder, or S3), records in
    /// `records`.
    pub fn new(archives: Arc<dyn SnapshotStore>, records: Arc<Store>) -> Self {
        Self { archives, records }
    }

    /// Takes a snapshot of the workspace behind `executor` (of `sandbox`, in `space`) and records it.
    /// Nothing is left behind when it fails.
    pub async fn take(
        &self,
        executor: &ExecutorClient,
        sandbox: SandboxId,
        space: &SpaceId,
        labels: BTreeMap<String, String>,
    ) -> Result<SnapshotRecord> {
        let id = uuid::Uuid::now_v7().to_string();
        // At the store's precision (milliseconds), so Create and Get answer the same.
        let created_at = crate::store::time(crate::store::ms(SystemTime::now()));
        let taken = archive::take(executor, &*self.archives, &object_key(&id)).await?;
        let record = SnapshotRecord {
            id,
            sandbox_id: sandbox.to_string(),
            space_id: space.to_string(),
            labels,
            created_at,
            size: taken.size,
            archive_bytes: taken.archive_bytes,
            sha256: taken.sha256,
            store: self.archives.name().to_owned(),
        };
        if let Err(e) = self.records.put_snapshot(&record) {
            let _ = self.archives.delete(&object_key(&record.id)).await;
            return Err(e);
        }
        tracing::info!(snapshot = %record.id, %sandbox, size = record.size, archive = record.archive_bytes, "snapshot taken");
        Ok(record)
    }

    /// Restores snapshot `record` into the workspace behind `executor` (committed only when its checksum
    /// matched).
    pub async fn restore(&self, executor: &ExecutorClient, record: &SnapshotRecord) -> Result<()> {
        archive::restore(
            executor,
            &*self.archives,
            &object_key(&record.id),
            &record.sha256,
        )
        .await
    }

    /// The newest snapshot of `sandbox` carrying all of `labels`.
    pub fn newest(
        &self,
        sandbox: SandboxId,
        labels: &BTreeMap<String, String>,
    ) -> Result<Option<SnapshotRecord>> {
        let sandbox = sandbox.to_string();
        Ok(self
            .records
            .snapshots(&crate::store::snapshots::SnapshotFilter {
                sandbox_id: Some(&sandbox),
                spaces: None,
                labels: Some(labels),
                before: None,
                limit: 1,
            })?
            .into_iter()
            .next())
    }

    /// Deletes snapshot `record`: its archive, then its record.
    pub async fn delete(&self, record: &SnapshotRecord) -> Result<()> {
        self.archives.delete(&object_key(&record.id)).await?;
        self.records.delete_snapshot(&record.id)
    }
}
