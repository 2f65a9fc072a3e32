//! The seam between snapshots and where their archives live.

use std::fmt::Debug;

use mentis_core::Result;
use tokio::io::AsyncRead;

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
