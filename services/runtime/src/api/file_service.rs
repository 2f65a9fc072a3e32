//! FileService: each call goes to the manager's file calls (the executor of a RUNNING sandbox), streams
//! chunk by chunk (a chunk is pulled from one side only when the other has taken the previous one, plus a
//! few in a bounded channel), errors mapped in `status`. A WriteFile or Upload is committed only when its client ended the
//! stream cleanly (`forward`, `client_end`).

mod client_end;
mod forward;

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use mentis_core::files::{Chunk, Edit, FileEventKind, ListFiles, WatchFiles, WatchItem};
use mentis_core::{Error, quoted};
use mentis_proto::api::{
    self, file_service_server::FileService, file_service_server::FileServiceServer,
};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

use super::access::{self, caller};
use super::decode;
use super::status::to_status;
use crate::convert::{file_to_proto, unpacked_to_proto};
use crate::sandboxes::{ByteStream, Manager};
use client_end::ClientEnd;
pub use client_end::Watch;
use forward::forward_client_stream;

/// Implementation of `mentis.v1.FileService`.
#[derive(Debug, Clone)]
pub struct FileApi {
    manager: Arc<Manager>,
    /// Ends WatchFiles streams (telling their clients to resume) when the runtime drains.
    shutdown: CancellationToken,
    /// How often an idle WatchFiles stream carries a keepalive.
    keepalive: std::time::Duration,
}

impl FileApi {
    /// A FileService over the sandboxes of `manager`.
    pub fn new(
        manager: Arc<Manager>,
        shutdown: CancellationToken,
        keepalive: std::time::Duration,
    ) -> Self {
        Self {
            manager,
            shutdown,
            keepalive,
        }
    }

    /// The service to serve: FileService whose requests record how their client ended its stream, which
    /// WriteFile and Upload need to tell a complete stream from a cancelled one; it takes messages up to
    /// `max_message_bytes`, gzip-compressed or not.
    pub fn into_service(self, max_message_bytes: usize) -> Watch<FileServiceServer<Self>> {
        Watch::new(
            FileServiceServer::new(self)
                .max_decoding_message_size(max_message_bytes)
                .accept_compressed(tonic::codec::CompressionEncoding::Gzip),
        )
    }
}

type ChunkStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// A watch's item as the public API's message.
fn watch_item_to_proto(item: WatchItem) -> api::watch_files_response::Kind {
    use api::watch_files_response::Kind as K;
    match item {
        WatchItem::Started { watch_id, last_seq } => {
            K::Started(api::watch_files_response::Started { watch_id, last_seq })
        }
        WatchItem::Gap {
            after_seq,
            first_available_seq,
        } => K::Gap(api::watch_files_response::Gap {
            after_seq,
            first_available_seq,
        }),
        WatchItem::Event(e) => K::Event(api::FileEvent {
            seq: e.seq,
            r#type: match e.kind {
                FileEventKind::Created => api::FileEventType::Created,
                FileEventKind::Modified => api::FileEventType::Modified,
                FileEventKind::Removed => api::FileEventType::Removed,
                FileEventKind::Overflow => api::FileEventType::Overflow,
            } as i32,
            path: e.path,
            is_dir: e.is_dir,
            time: e.time.map(crate::convert::timestamp),
        }),
    }
}

/// INVALID_ARGUMENT for a `watch_id` no watch can have (`watch-` and 12 hex digits).
fn check_watch_id(id: &str) -> Result<(), Error> {
    let ok = id
        .strip_prefix("watch-")
        .is_some_and(|h| h.len() == 12 && h.bytes().all(|b| b.is_ascii_hexdigit()));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(format!("watch_id {} is not a watch id", quoted(id))).at("watch_id"))
    }
}

/// A file's or an archive's bytes as a public chunk stream; its errors pass through the one mapping.
fn forward_chunks<T>(stream: ByteStream, wrap: fn(bytes::Bytes) -> T) -> ChunkStream<T>
where
    T: Send + 'static,
{
    Box::pin(stream.map(move |r| r.map(wrap).map_err(to_status)))
}

/// Longest workspace path a request may name, and longest component (Linux's PATH_MAX less the NUL, and
/// NAME_MAX): longer ones could never name a file, and the executor's answer would quote them whole.
const MAX_PATH_BYTES: usize = 4095;
const MAX_NAME_BYTES: usize = 255;

/// INVALID_ARGUMENT (naming `field`) for a path no file can have: too long, a component too long, or NUL.
/// The rest (`..`, absolute paths outside the workspace, links) the executor judges.
fn check_path(path: &str, field: &str) -> Result<(), Error> {
    let why = if path.len() > MAX_PATH_BYTES {
        format!("is {} bytes; the limit is {MAX_PATH_BYTES}", path.len())
    } else if path.split('/').any(|c| c.len() > MAX_NAME_BYTES) {
        format!("has a component longer than {MAX_NAME_BYTES} bytes")
    } else if path.contains('\0') {
        "contains NUL".to_owned()
    } else {
        return Ok(());
    };
    Err(Error::invalid(format!("{field} {} {why}", quoted(path))).at(field))
}

#[tonic::async_trait]
impl FileService for FileApi {
    type ReadFileStream = ChunkStream<api::ReadFileResponse>;
    type DownloadStream = ChunkStream<api::DownloadResponse>;
    type WatchFilesStream = ChunkStream<api::WatchFilesResponse>;

    async fn read_file(
        &self,
        req: Request<api::ReadFileRequest>,
    ) -> Result<Response<Self::ReadFileStream>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        let stream = self
            .manager
            .read_file(sandbox, r.path, r.offset, r.length)
            .await
            .map_err(to_status)?;
        Ok(Response::new(forward_chunks(stream, |data| {
            api::ReadFileResponse { data }
        })))
    }

    async fn write_file(
        &self,
        req: Request<Streaming<api::WriteFileRequest>>,
    ) -> Result<Response<api::WriteFileResponse>, Status> {
        let caller = caller(&req)?;
        let end = ClientEnd::of(&req)?;
        let mut inbound = req.into_inner();
        let header = match inbound.message().await.map_err(decode::inbound)? {
            Some(api::WriteFileRequest {
                kind: Some(api::write_file_request::Kind::Header(h)),
            }) => h,
            _ => {
                return Err(to_status(Error::invalid(
                    "the first WriteFile message must be its header",
                )));
            }
        };
        check_path(&header.path, "header.path").map_err(to_status)?;
        let sandbox = access::sandbox(&caller, &self.manager, &header.sandbox_id)?;
        let manager = Arc::clone(&self.manager);
        let (path, mode) = (header.path, header.mode);
        let file = forward_client_stream(
            inbound,
            end,
            |m| match m.kind {
                Some(api::write_file_request::Kind::Data(data)) => Ok(Chunk::Data(data)),
                _ => Err(Error::invalid("WriteFile takes one header, then data")),
            },
            Chunk::Commit,
            move |feed| {
                Box::pin(async move { manager.write_file(sandbox, path, mode, feed).await })
            },
        )
        .await?;
        Ok(Response::new(api::WriteFileResponse {
            file: Some(file_to_proto(file)),
        }))
    }

    async fn list_files(
        &self,
        req: Request<api::ListFilesRequest>,
    ) -> Result<Response<api::ListFilesResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        let page = self
            .manager
            .list_files(
                sandbox,
                ListFiles {
                    path: r.path,
                    recursive: r.recursive,
                    page_size: r.page_size,
                    page_token: r.page_token,
                },
            )
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::ListFilesResponse {
            files: page.files.into_iter().map(file_to_proto).collect(),
            truncated: page.truncated,
            next_page_token: page.next_page_token,
        }))
    }

    async fn stat_file(
        &self,
        req: Request<api::StatFileRequest>,
    ) -> Result<Response<api::StatFileResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        let file = self
            .manager
            .stat_file(sandbox, r.path)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::StatFileResponse {
            file: Some(file_to_proto(file)),
        }))
    }

    async fn edit_file(
        &self,
        req: Request<api::EditFileRequest>,
    ) -> Result<Response<api::EditFileResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        let edited = self
            .manager
            .edit_file(
                sandbox,
                Edit {
                    path: r.path,
                    old_string: r.old_string,
                    new_string: r.new_string,
                    replace_all: r.replace_all,
                },
            )
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::EditFileResponse {
            replacements: edited.replacements,
            file: edited.file.map(file_to_proto),
        }))
    }

    async fn delete_file(
        &self,
        req: Request<api::DeleteFileRequest>,
    ) -> Result<Response<api::DeleteFileResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        self.manager
            .delete_file(sandbox, r.path, r.recursive)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::DeleteFileResponse {}))
    }

    async fn make_directory(
        &self,
        req: Request<api::MakeDirectoryRequest>,
    ) -> Result<Response<api::MakeDirectoryResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        let directory = self
            .manager
            .make_directory(sandbox, r.path, r.mode)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::MakeDirectoryResponse {
            directory: Some(file_to_proto(directory)),
        }))
    }

    async fn watch_files(
        &self,
        req: Request<api::WatchFilesRequest>,
    ) -> Result<Response<Self::WatchFilesStream>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let watch_id = if r.watch_id.is_empty() {
            None
        } else {
            check_watch_id(&r.watch_id).map_err(to_status)?;
            Some(r.watch_id)
        };
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        let items = self
            .manager
            .watch_files(
                sandbox,
                WatchFiles {
                    path: r.path,
                    recursive: r.recursive,
                    watch_id,
                    after_seq: r.after_seq,
                },
            )
            .await
            .map_err(to_status)?;
        let (shutdown, every) = (self.shutdown.clone(), self.keepalive);
        let stream = futures::stream::unfold(Some(items), move |state| {
            let shutdown = shutdown.clone();
            async move {
                let mut items = state?;
                let msg = tokio::select! {
                    biased;
                    () = shutdown.cancelled() => return Some((Err(super::follow::draining()), None)),
                    item = items.next() => match item? {
                        Ok(item) => watch_item_to_proto(item),
                        Err(e) => return Some((Err(to_status(e)), None)),
                    },
                    () = tokio::time::sleep(every) => api::watch_files_response::Kind::Keepalive(
                        crate::convert::timestamp(std::time::SystemTime::now()),
                    ),
                };
                Some((Ok(api::WatchFilesResponse { kind: Some(msg) }), Some(items)))
            }
        });
        Ok(Response::new(Box::pin(stream)))
    }

    async fn move_file(
        &self,
        req: Request<api::MoveFileRequest>,
    ) -> Result<Response<api::MoveFileResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.source, "source").map_err(to_status)?;
        check_path(&r.destination, "destination").map_err(to_status)?;
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        let file = self
            .manager
            .move_file(sandbox, r.source, r.destination, r.overwrite)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::MoveFileResponse {
            file: Some(file_to_proto(file)),
        }))
    }

    async fn upload(
        &self,
        req: Request<Streaming<api::UploadRequest>>,
    ) -> Result<Response<api::UploadResponse>, Status> {
        let caller = caller(&req)?;
        let end = ClientEnd::of(&req)?;
        let mut inbound = req.into_inner();
        let header = match inbound.message().await.map_err(decode::inbound)? {
            Some(api::UploadRequest {
                kind: Some(api::upload_request::Kind::Header(h)),
            }) => h,
            _ => {
                return Err(to_status(Error::invalid(
                    "the first Upload message must be its header",
                )));
            }
        };
        check_path(&header.path, "header.path").map_err(to_status)?;
        let sandbox = access::sandbox(&caller, &self.manager, &header.sandbox_id)?;
        let manager = Arc::clone(&self.manager);
        let path = header.path;
        let unpacked = forward_client_stream(
            inbound,
            end,
            |m| match m.kind {
                Some(api::upload_request::Kind::Data(data)) => Ok(Chunk::Data(data)),
                _ => Err(Error::invalid("Upload takes one header, then data")),
            },
            Chunk::Commit,
            move |feed| Box::pin(async move { manager.upload(sandbox, path, feed).await }),
        )
        .await?;
        Ok(Response::new(unpacked_to_proto(unpacked)))
    }

    async fn download(
        &self,
        req: Request<api::DownloadRequest>,
    ) -> Result<Response<Self::DownloadStream>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        let stream = self
            .manager
            .download(sandbox, r.path)
            .await
            .map_err(to_status)?;
        Ok(Response::new(forward_chunks(stream, |data| {
            api::DownloadResponse { data }
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_no_file_can_have_are_invalid_with_a_short_message() {
        assert!(check_path("src/main.py", "path").is_ok());
        assert!(check_path("", "path").is_ok());
        assert!(check_path(&"a/".repeat(2000), "path").is_ok());
        for bad in ["a\0b".to_owned(), "d/".repeat(3000), "n".repeat(256)] {
            let e = check_path(&bad, "header.path").expect_err("refused");
            assert_eq!(e.field(), Some("header.path"));
            assert!(e.to_string().len() < 200, "{e}");
        }
    }
}
