//! Snapshots of workspaces (SnapshotService; docs/ARCHITECTURE.md, "Snapshots"): a workspace leaves its
//! sandbox as the executor's tar stream (Download of /workspace), compressed with zstd and hashed (SHA-256)
//! on the way into a [`SnapshotStore`], never whole in memory; it comes back through the executor's Upload,
//! decompressed on the way, and is committed only when the archive's checksum matched at its end (a
//! mismatch or a broken archive leaves the workspace as it was). [`Snapshots`] keeps each archive with its
//! record in the durable store.

mod archive;
mod catalog;
mod local;
mod s3;
mod store;

pub use catalog::{Snapshots, object_key};
pub use local::LocalStore;
pub use s3::{S3Settings, S3Store};
pub use store::SnapshotStore;
