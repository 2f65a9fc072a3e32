//! The executor client's file calls (`mentis.executor.v1.WorkspaceService`), in the domain's terms
//! (`mentis_core::files`): the executor's messages are made and read here and nowhere else. Unary calls
//! are bounded by the call timeout; streams are not (a large file takes its time), and a dead executor
//! fails them through the channel's keepalives.

use bytes::Bytes;
use futures::{Stream, StreamExt as _};
use mentis_core::Error;
use mentis_core::files::{
    Chunk, Edit, Edited, FileEvent, FileEventKind, FileInfo, FilePage, FileType, ListFiles,
    Unpacked, WatchFiles, WatchItem,
};
use mentis_proto::executor::{
    self as wire, DeleteFileRequest, DownloadRequest, EditFileRequest, ListFilesRequest,
    MakeDirectoryRequest, MoveFileRequest, ReadFileRequest, StatFileRequest, UploadHeader,
    UploadRequest, WatchFilesRequest, WriteFileHeader, WriteFileRequest, upload_request,
    write_file_request,
};

use super::{ByteStream, ExecutorClient, WatchStream, status_to_error};

impl ExecutorClient {
    /// Starts reading `length` bytes (0: to the end) of a file from `offset`.
    pub async fn read_file(
        &self,
        path: String,
        offset: u64,
        length: u64,
    ) -> Result<ByteStream, Error> {
        let mut files = self.files.clone();
        let stream = self
            .timed(files.read_file(ReadFileRequest {
                path,
                offset,
                length,
            }))
            .await?
            .into_inner();
        Ok(Box::pin(
            stream.map(|r| r.map(|c| c.data).map_err(status_to_error)),
        ))
    }

    /// Writes a file from `chunks`. The executor keeps the file only after [`Chunk::Commit`] and the clean
    /// end of `chunks`; dropping the future before the commit cancels the call, and the executor discards
    /// what it received.
    pub async fn write_file(
        &self,
        path: String,
        mode: u32,
        chunks: impl Stream<Item = Chunk> + Send + 'static,
    ) -> Result<FileInfo, Error> {
        let header = WriteFileRequest {
            kind: Some(write_file_request::Kind::Header(WriteFileHeader {
                path,
                mode,
            })),
            commit: false,
        };
        let messages = futures::stream::once(async { header }).chain(chunks.map(|c| match c {
            Chunk::Data(data) => WriteFileRequest {
                kind: Some(write_file_request::Kind::Data(data)),
                commit: false,
            },
            Chunk::Commit => WriteFileRequest {
                kind: Some(write_file_request::Kind::Data(Bytes::new())),
                commit: true,
            },
        }));
        let mut files = self.files.clone();
        let answer = files.write_file(messages).await.map_err(status_to_error)?;
        answer
            .into_inner()
            .file
            .map(file_from_wire)
            .ok_or_else(|| Error::internal("the executor's WriteFile answer has no file"))
    }

    /// One page of a directory's entries.
    pub async fn list_files(&self, q: ListFiles) -> Result<FilePage, Error> {
        let mut files = self.files.clone();
        let page = self
            .timed(files.list_files(ListFilesRequest {
                path: q.path,
                recursive: q.recursive,
                page_size: q.page_size,
                page_token: q.page_token,
            }))
            .await?
            .into_inner();
        Ok(FilePage {
            files: page.files.into_iter().map(file_from_wire).collect(),
            truncated: page.truncated,
            next_page_token: page.next_page_token,
        })
    }

    /// Describes one entry.
    pub async fn stat_file(&self, path: String) -> Result<FileInfo, Error> {
        let mut files = self.files.clone();
        self.timed(files.stat_file(StatFileRequest { path }))
            .await?
            .into_inner()
            .file
            .map(file_from_wire)
            .ok_or_else(|| Error::internal("the executor's StatFile answer has no file"))
    }

    /// Replaces a string in a file.
    pub async fn edit_file(&self, edit: Edit) -> Result<Edited, Error> {
        let mut files = self.files.clone();
        let edited = self
            .timed(files.edit_file(EditFileRequest {
                path: edit.path,
                old_string: edit.old_string,
                new_string: edit.new_string,
                replace_all: edit.replace_all,
            }))
            .await?
            .into_inner();
        Ok(Edited {
            replacements: edited.replacements,
            file: edited.file.map(file_from_wire),
        })
    }

    /// Deletes an entry (a directory with its contents when `recursive`).
    pub async fn delete_file(&self, path: String, recursive: bool) -> Result<(), Error> {
        let mut files = self.files.clone();
        self.timed(files.delete_file(DeleteFileRequest { path, recursive }))
            .await
            .map(drop)
    }

    /// Creates a directory with its parents.
    pub async fn make_directory(&self, path: String, mode: u32) -> Result<FileInfo, Error> {
        let mut files = self.files.clone();
        self.timed(files.make_directory(MakeDirectoryRequest { path, mode }))
            .await?
            .into_inner()
            .directory
            .map(file_from_wire)
            .ok_or_else(|| Error::internal("the executor's MakeDirectory answer has no directory"))
    }

    /// Moves or renames an entry (replacing the destination only when `overwrite`).
    pub async fn move_file(
        &self,
        source: String,
        destination: String,
        overwrite: bool,
    ) -> Result<FileInfo, Error> {
        let mut files = self.files.clone();
        self.timed(files.move_file(MoveFileRequest {
            source,
            destination,
            overwrite,
        }))
        .await?
        .into_inner()
        .file
        .map(file_from_wire)
        .ok_or_else(|| Error::internal("the executor's MoveFile answer has no file"))
    }

    /// Unpacks the tar stream `chunks` into the directory `path`; committed or cancelled like
    /// [`ExecutorClient::write_file`].
    pub async fn upload(
        &self,
        path: String,
        chunks: impl Stream<Item = Chunk> + Send + 'static,
    ) -> Result<Unpacked, Error> {
        let header = UploadRequest {
            kind: Some(upload_request::Kind::Header(UploadHeader { path })),
            commit: false,
        };
        let messages = futures::stream::once(async { header }).chain(chunks.map(|c| match c {
            Chunk::Data(data) => UploadRequest {
                kind: Some(upload_request::Kind::Data(data)),
                commit: false,
            },
            Chunk::Commit => UploadRequest {
                kind: Some(upload_request::Kind::Data(Bytes::new())),
                commit: true,
            },
        }));
        let mut files = self.files.clone();
        let answer = files.upload(messages).await.map_err(status_to_error)?;
        let s = answer.into_inner().summary.unwrap_or_default();
        Ok(Unpacked {
            files: s.files,
            directories: s.directories,
            links: s.links,
            bytes: s.bytes,
        })
    }

    /// Starts a tar download of `path`.
    pub async fn download(&self, path: String) -> Result<ByteStream, Error> {
        let mut files = self.files.clone();
        let stream = self
            .timed(files.download(DownloadRequest { path }))
            .await?
            .into_inner();
        Ok(Box::pin(
            stream.map(|r| r.map(|c| c.data).map_err(status_to_error)),
        ))
    }
}

impl ExecutorClient {
    /// Starts a watch (no `watch_id`), or reads one again after `after_seq`.
    pub async fn watch_files(&self, w: WatchFiles) -> Result<WatchStream, Error> {
        let mut files = self.files.clone();
        let stream = self
            .timed(files.watch_files(WatchFilesRequest {
                path: w.path,
                recursive: w.recursive,
                watch_id: w.watch_id.unwrap_or_default(),
                after_seq: w.after_seq,
            }))
            .await?
            .into_inner();
        Ok(Box::pin(stream.filter_map(|r| async move {
            match r {
                Err(s) => Some(Err(status_to_error(s))),
                Ok(m) => watch_item_from_wire(m).map(Ok),
            }
        })))
    }
}

fn watch_item_from_wire(m: wire::WatchFilesResponse) -> Option<WatchItem> {
    use wire::watch_files_response::Kind as K;
    Some(match m.kind? {
        K::Started(s) => WatchItem::Started {
            watch_id: s.watch_id,
            last_seq: s.last_seq,
        },
        K::Gap(g) => WatchItem::Gap {
            after_seq: g.after_seq,
            first_available_seq: g.first_available_seq,
        },
        K::Event(e) => WatchItem::Event(FileEvent {
            seq: e.seq,
            kind: match wire::FileEventType::try_from(e.r#type) {
                Ok(wire::FileEventType::Created) => FileEventKind::Created,
                Ok(wire::FileEventType::Modified) => FileEventKind::Modified,
                Ok(wire::FileEventType::Removed) => FileEventKind::Removed,
                Ok(wire::FileEventType::Overflow | wire::FileEventType::Unspecified) | Err(_) => {
                    FileEventKind::Overflow
                }
            },
            path: e.path,
            is_dir: e.is_dir,
            time: (e.time > 0.0)
                .then(|| {
                    std::time::UNIX_EPOCH.checked_add(std::time::Duration::from_secs_f64(e.time))
                })
                .flatten(),
        }),
    })
}

/// An entry as the executor describes it.
fn file_from_wire(f: wire::FileInfo) -> FileInfo {
    let file_type = match wire::FileType::try_from(f.r#type) {
        Ok(wire::FileType::File) => FileType::File,
        Ok(wire::FileType::Directory) => FileType::Directory,
        Ok(wire::FileType::Symlink) => FileType::Symlink,
        Ok(wire::FileType::Other | wire::FileType::Unspecified) | Err(_) => FileType::Other,
    };
    FileInfo {
        path: f.path,
        file_type,
        size: f.size,
        mode: f.mode,
        modified: f
            .modify_time
            .and_then(|t| std::time::SystemTime::try_from(t).ok()),
        symlink_target: f.symlink_target,
    }
}
