//! Snapshots of workspaces (SnapshotService; docs/ARCHITECTURE.md, "Snapshots"): a workspace leaves its
//! sandbox as the executor's tar stream (Download of /workspace), compressed with zstd and hashed (SHA-256)
//! on the way into a [`SnapshotStore`], never whole in memory; it comes back through the executor's Upload,
//! decompressed on the way, and is committed only when the archive's checksum matched at its end (a
//! mismatch or a broken archive leaves the workspace as it was).

mod archive;
mod local;
mod s3;

use std::fmt::Debug;

use mentis_core::Result;
use tokio::io::AsyncRead;

pub use archive::{Taken, restore, take};
pub use local::LocalStore;
pub use s3::{S3Settings, S3Store};

/// Where snapshot archives live: objects written whole or not at all.
#[async_trait::async_trait]
pub trait SnapshotStore: Send + Sync + Debug {
    /// The store's name in `Snapshot.store` ("local", "s3").
    fn name(&self) -> &'static str;
    /// Writes object `key` from `body` (complete when this returns Ok; absent otherwise); its size.
    async fn put(&self, key: &str, body: &mut (dyn AsyncRead + Send + Unpin)) -> Result<u64>;
    /// Reads object `key`.
    async fn get(&self, key: &str) -> Result<Box<dyn AsyncRead + Send + Unpin>>;
    /// Deletes object `key` (nothing when it is absent).
    async fn delete(&self, key: &str) -> Result<()>;
}
