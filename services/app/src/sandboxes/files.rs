//! The workspace's files (FileService): each call goes to the executor of a RUNNING sandbox (a PAUSED one
//! with auto_resume is resumed first) and counts as activity for the idle timeout.

use std::sync::Arc;

use futures::Stream;
use mentis_core::files::{Chunk, Edit, Edited, FileInfo, FilePage, ListFiles, Unpacked};
use mentis_core::{Result, SandboxId};

use super::lifecycle::Lifecycle;
pub use crate::executor_client::ByteStream;

/// File calls on sandboxes' workspaces.
pub(super) struct Files {
    lifecycle: Arc<Lifecycle>,
}

impl Files {
    pub(super) fn new(lifecycle: Arc<Lifecycle>) -> Self {
        Self { lifecycle }
    }

    pub(super) async fn read(
        &self,
        sandbox: SandboxId,
        path: String,
        offset: u64,
        length: u64,
    ) -> Result<ByteStream> {
        let executor = self.lifecycle.executor_for(sandbox).await?;
        executor.read_file(path, offset, length).await
    }

    pub(super) async fn write(
        &self,
        sandbox: SandboxId,
        path: String,
        mode: u32,
        chunks: impl Stream<Item = Chunk> + Send + 'static,
    ) -> Result<FileInfo> {
        let executor = self.lifecycle.executor_for(sandbox).await?;
        executor.write_file(path, mode, chunks).await
    }

    pub(super) async fn list(&self, sandbox: SandboxId, q: ListFiles) -> Result<FilePage> {
        let executor = self.lifecycle.executor_for(sandbox).await?;
        executor.list_files(q).await
    }

    pub(super) async fn stat(&self, sandbox: SandboxId, path: String) -> Result<FileInfo> {
        let executor = self.lifecycle.executor_for(sandbox).await?;
        executor.stat_file(path).await
    }

    pub(super) async fn edit(&self, sandbox: SandboxId, edit: Edit) -> Result<Edited> {
        let executor = self.lifecycle.executor_for(sandbox).await?;
        executor.edit_file(edit).await
    }

    pub(super) async fn delete(
        &self,
        sandbox: SandboxId,
        path: String,
        recursive: bool,
    ) -> Result<()> {
        let executor = self.lifecycle.executor_for(sandbox).await?;
        executor.delete_file(path, recursive).await
    }

    pub(super) async fn make_directory(
        &self,
        sandbox: SandboxId,
        path: String,
        mode: u32,
    ) -> Result<FileInfo> {
        let executor = self.lifecycle.executor_for(sandbox).await?;
        executor.make_directory(path, mode).await
    }

    pub(super) async fn upload(
        &self,
        sandbox: SandboxId,
        path: String,
        chunks: impl Stream<Item = Chunk> + Send + 'static,
    ) -> Result<Unpacked> {
        let executor = self.lifecycle.executor_for(sandbox).await?;
        executor.upload(path, chunks).await
    }

    pub(super) async fn download(&self, sandbox: SandboxId, path: String) -> Result<ByteStream> {
        let executor = self.lifecycle.executor_for(sandbox).await?;
        executor.download(path).await
    }
}
