//! The executor client's file calls (`mentis.executor.v1.WorkspaceService`). Unary calls are bounded by
//! the call timeout; streams are not (a large file takes its time), and a dead executor fails them through
//! the channel's keepalives.

use futures::Stream;
use mentis_core::Error;
use mentis_proto::api::{FileInfo, UploadResponse};
use mentis_proto::executor::{
    DeleteFileRequest, DownloadRequest, DownloadResponse, EditFileRequest, EditFileResponse,
    ListFilesRequest, ListFilesResponse, MakeDirectoryRequest, ReadFileRequest, ReadFileResponse,
    StatFileRequest, UploadRequest, WriteFileRequest,
};
use tonic::Streaming;

use super::{ExecutorClient, status_to_error};

impl ExecutorClient {
    /// Starts reading a file; the stream carries its chunks.
    pub async fn read_file(
        &self,
        req: ReadFileRequest,
    ) -> Result<Streaming<ReadFileResponse>, Error> {
        let mut files = self.files.clone();
        self.timed(files.read_file(req))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Writes a file from `messages` (header first, the last one with `commit` set). The executor keeps
    /// the file only after the commit and the clean end of `messages`; dropping the future before the
    /// commit cancels the call, and the executor discards what it received.
    pub async fn write_file(
        &self,
        messages: impl Stream<Item = WriteFileRequest> + Send + 'static,
    ) -> Result<FileInfo, Error> {
        let mut files = self.files.clone();
        let answer = files.write_file(messages).await.map_err(status_to_error)?;
        answer
            .into_inner()
            .file
            .ok_or_else(|| Error::internal("the executor's WriteFile answer has no file"))
    }

    /// Lists a directory.
    pub async fn list_files(&self, req: ListFilesRequest) -> Result<ListFilesResponse, Error> {
        let mut files = self.files.clone();
        self.timed(files.list_files(req))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Describes one entry.
    pub async fn stat_file(&self, req: StatFileRequest) -> Result<FileInfo, Error> {
        let mut files = self.files.clone();
        self.timed(files.stat_file(req))
            .await?
            .into_inner()
            .file
            .ok_or_else(|| Error::internal("the executor's StatFile answer has no file"))
    }

    /// Replaces a string in a file.
    pub async fn edit_file(&self, req: EditFileRequest) -> Result<EditFileResponse, Error> {
        let mut files = self.files.clone();
        self.timed(files.edit_file(req))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Deletes an entry.
    pub async fn delete_file(&self, req: DeleteFileRequest) -> Result<(), Error> {
        let mut files = self.files.clone();
        self.timed(files.delete_file(req)).await.map(drop)
    }

    /// Creates a directory with its parents.
    pub async fn make_directory(&self, req: MakeDirectoryRequest) -> Result<FileInfo, Error> {
        let mut files = self.files.clone();
        self.timed(files.make_directory(req))
            .await?
            .into_inner()
            .directory
            .ok_or_else(|| Error::internal("the executor's MakeDirectory answer has no directory"))
    }

    /// Unpacks a tar stream (header first, the last message with `commit` set); committed or cancelled
    /// like [`ExecutorClient::write_file`].
    pub async fn upload(
        &self,
        messages: impl Stream<Item = UploadRequest> + Send + 'static,
    ) -> Result<UploadResponse, Error> {
        let mut files = self.files.clone();
        let answer = files.upload(messages).await.map_err(status_to_error)?;
        Ok(answer.into_inner().summary.unwrap_or_default())
    }

    /// Starts a tar download; the stream carries its chunks.
    pub async fn download(
        &self,
        req: DownloadRequest,
    ) -> Result<Streaming<DownloadResponse>, Error> {
        let mut files = self.files.clone();
        self.timed(files.download(req))
            .await
            .map(tonic::Response::into_inner)
    }
}
