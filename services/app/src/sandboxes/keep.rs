//! The snapshots a space's policy asks for before its sandboxes are paused or deleted
//! (`mentis.v1.SnapshotPolicy`): taken by the pause or the delete itself, under the sandbox's lifecycle
//! lock, so no other move interleaves; a snapshot that fails stops the pause or the delete.

use std::collections::BTreeMap;
use std::sync::Arc;

use mentis_core::{Ending, Error, Reason, Resource, Result};

use super::handle::SandboxHandle;
use super::spaces::Spaces;
use crate::executor_client::ExecutorClient;
use crate::snapshots::Snapshots;
use crate::store::snapshots::SnapshotRecord;

/// Label of a policy snapshot: what took it (pause, delete, idle-timeout, max-lifetime).
pub const TRIGGER_LABEL: &str = "io.mentis.trigger";
/// Label of a policy snapshot of a sandbox with a client key: the key.
pub const KEY_LABEL: &str = "io.mentis.sandbox-key";
/// [`TRIGGER_LABEL`] of the snapshot that holds the workspace of a sandbox paused by snapshot (a backend
/// that cannot freeze it, `SandboxBackend::pauses_in_place`): restored by its resume, then deleted.
pub const SUSPEND_TRIGGER: &str = "pause-by-snapshot";

/// Takes the snapshots spaces ask for.
pub struct Keeper {
    spaces: Arc<Spaces>,
    snapshots: Arc<Snapshots>,
}

impl std::fmt::Debug for Keeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keeper").finish_non_exhaustive()
    }
}

impl Keeper {
    pub fn new(spaces: Arc<Spaces>, snapshots: Arc<Snapshots>) -> Self {
        Self { spaces, snapshots }
    }

    /// The trigger of the snapshot `ending` of sandbox `h` calls for, if its space asks for one.
    pub fn wants(&self, h: &SandboxHandle, ending: Ending) -> Option<&'static str> {
        let space = h.snapshot().space_id;
        // A space being deleted with force is still there while its sandboxes go.
        let policy = self.spaces.record(&space).ok()?.snapshot_policy;
        policy.trigger(ending)
    }

    /// The workspace of `h` (RUNNING or PAUSING, its lifecycle lock held by the caller) as the snapshot a
    /// resume by snapshot restores.
    pub async fn suspend(&self, h: &SandboxHandle) -> Result<SnapshotRecord> {
        let record = h.snapshot();
        let executor = h.executor().ok_or_else(|| {
            Error::new(
                Reason::SandboxNotRunning,
                format!(
                    "sandbox {} has no executor to take its workspace from",
                    h.id
                ),
            )
            .about(Resource::sandbox(h.id))
        })?;
        let mut labels = BTreeMap::from([(TRIGGER_LABEL.to_owned(), SUSPEND_TRIGGER.to_owned())]);
        if let Some(key) = &record.external_key {
            labels.insert(KEY_LABEL.to_owned(), key.clone());
        }
        self.snapshots
            .take(&executor, h.id, &record.space_id, labels)
            .await
            .map_err(|e| {
                e.context("the snapshot that keeps the workspace of the paused sandbox failed")
            })
    }

    /// The snapshot holding the workspace of `h`, paused by snapshot (the newest, should a pause have
    /// left one behind).
    pub fn suspended(&self, h: &SandboxHandle) -> Result<Option<SnapshotRecord>> {
        let labels = BTreeMap::from([(TRIGGER_LABEL.to_owned(), SUSPEND_TRIGGER.to_owned())]);
        self.snapshots.newest(h.id, &labels)
    }

    /// Restores `snapshot` into the workspace behind `executor`.
    pub async fn revive(&self, executor: &ExecutorClient, snapshot: &SnapshotRecord) -> Result<()> {
        self.snapshots.restore(executor, snapshot).await
    }

    /// Deletes a pause's snapshot once it is no longer needed (restored, or its sandbox deleted).
    pub async fn forget(&self, snapshot: &SnapshotRecord) {
        if let Err(e) = self.snapshots.delete(snapshot).await {
            tracing::warn!(snapshot = %snapshot.id, error = %e.chain(), "could not delete the snapshot of a pause");
        }
    }

    /// Takes the snapshot `ending` calls for, if any, from the executor of `h` (which the caller holds
    /// the lifecycle lock of, with the sandbox RUNNING or PAUSING).
    pub async fn before(&self, h: &SandboxHandle, ending: Ending) -> Result<()> {
        let Some(trigger) = self.wants(h, ending) else {
            return Ok(());
        };
        let record = h.snapshot();
        let executor = h.executor().ok_or_else(|| {
            Error::new(
                Reason::SandboxNotRunning,
                format!("sandbox {} has no executor to take a snapshot from", h.id),
            )
            .about(Resource::sandbox(h.id))
        })?;
        let mut labels = BTreeMap::from([(TRIGGER_LABEL.to_owned(), trigger.to_owned())]);
        if let Some(key) = &record.external_key {
            labels.insert(KEY_LABEL.to_owned(), key.clone());
        }
        let taken = self
            .snapshots
            .take(&executor, h.id, &record.space_id, labels)
            .await;
        match taken {
            Ok(s) => {
                tracing::info!(sandbox_id = %h.id, snapshot = %s.id, trigger, "snapshot taken by the space's policy");
                Ok(())
            }
            Err(e) => {
                tracing::warn!(sandbox_id = %h.id, trigger, error = %e.chain(), "the snapshot the space's policy asks for failed");
                Err(e.context(&format!("the {trigger} snapshot the space asks for failed")))
            }
        }
    }
}
