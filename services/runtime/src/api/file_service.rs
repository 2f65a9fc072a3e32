//! FileService: each call is forwarded to the executor of a RUNNING sandbox, streams chunk by chunk (a
//! chunk is pulled from one side only when the other has taken the previous one, plus a few in a bounded
//! channel), errors mapped in `status`. A WriteFile or Upload is committed only when its client ended the
//! stream cleanly (`forward`, `client_end`).

mod client_end;
mod forward;

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt as _};
use mentis_core::{Error, quoted};
use mentis_proto::api::{
    self, file_service_server::FileService, file_service_server::FileServiceServer,
};
use mentis_proto::executor as exec;
use tonic::{Request, Response, Status, Streaming};

use super::access::{self, caller};
use super::decode;
use super::status::to_status;
use crate::auth::Caller;
use crate::executor_client::{ExecutorClient, status_to_error};
use crate::sandboxes::Manager;
use client_end::ClientEnd;
pub use client_end::Watch;
use forward::forward_client_stream;

/// Implementation of `mentis.v1.FileService`.
#[derive(Debug, Clone)]
pub struct FileApi {
    manager: Arc<Manager>,
}

impl FileApi {
    /// A FileService over the sandboxes of `manager`.
    pub fn new(manager: Arc<Manager>) -> Self {
        Self { manager }
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

    /// The executor of a RUNNING sandbox (NotFound, FailedPrecondition or Unavailable otherwise); a PAUSED
    /// sandbox with auto_resume is resumed first. A file call counts as activity for the idle timeout.
    async fn executor(&self, caller: &Caller, sandbox_id: &str) -> Result<ExecutorClient, Status> {
        let id = access::sandbox(caller, &self.manager, sandbox_id)?;
        self.manager.executor_for(id).await.map_err(to_status)
    }
}

type ChunkStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// An executor's chunk stream as a public one; its errors pass through the one mapping.
fn forward_chunks<E, T>(stream: Streaming<E>, wrap: fn(E) -> T) -> ChunkStream<T>
where
    E: Send + 'static,
    T: Send + 'static,
{
    Box::pin(stream.map(move |r| r.map(wrap).map_err(|s| to_status(status_to_error(s)))))
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

    async fn read_file(
        &self,
        req: Request<api::ReadFileRequest>,
    ) -> Result<Response<Self::ReadFileStream>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let executor = self.executor(&caller, &r.sandbox_id).await?;
        let stream = executor
            .read_file(exec::ReadFileRequest {
                path: r.path,
                offset: r.offset,
                length: r.length,
            })
            .await
            .map_err(to_status)?;
        Ok(Response::new(forward_chunks(stream, |c| {
            api::ReadFileResponse { data: c.data }
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
        let executor = self.executor(&caller, &header.sandbox_id).await?;
        let first = exec::WriteFileRequest {
            kind: Some(exec::write_file_request::Kind::Header(
                exec::WriteFileHeader {
                    path: header.path,
                    mode: header.mode,
                },
            )),
            commit: false,
        };
        let commit = exec::WriteFileRequest {
            kind: Some(exec::write_file_request::Kind::Data(bytes::Bytes::new())),
            commit: true,
        };
        let file = forward_client_stream(
            inbound,
            end,
            first,
            |m| match m.kind {
                Some(api::write_file_request::Kind::Data(data)) => Ok(exec::WriteFileRequest {
                    kind: Some(exec::write_file_request::Kind::Data(data)),
                    commit: false,
                }),
                _ => Err(Error::invalid("WriteFile takes one header, then data")),
            },
            commit,
            |feed| Box::pin(async move { executor.write_file(feed).await }),
        )
        .await?;
        Ok(Response::new(api::WriteFileResponse { file: Some(file) }))
    }

    async fn list_files(
        &self,
        req: Request<api::ListFilesRequest>,
    ) -> Result<Response<api::ListFilesResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let executor = self.executor(&caller, &r.sandbox_id).await?;
        let listed = executor
            .list_files(exec::ListFilesRequest {
                path: r.path,
                recursive: r.recursive,
                page_size: r.page_size,
                page_token: r.page_token,
            })
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::ListFilesResponse {
            files: listed.files,
            truncated: listed.truncated,
            next_page_token: listed.next_page_token,
        }))
    }

    async fn stat_file(
        &self,
        req: Request<api::StatFileRequest>,
    ) -> Result<Response<api::StatFileResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let executor = self.executor(&caller, &r.sandbox_id).await?;
        let file = executor
            .stat_file(exec::StatFileRequest { path: r.path })
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::StatFileResponse { file: Some(file) }))
    }

    async fn edit_file(
        &self,
        req: Request<api::EditFileRequest>,
    ) -> Result<Response<api::EditFileResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let executor = self.executor(&caller, &r.sandbox_id).await?;
        let edited = executor
            .edit_file(exec::EditFileRequest {
                path: r.path,
                old_string: r.old_string,
                new_string: r.new_string,
                replace_all: r.replace_all,
            })
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::EditFileResponse {
            replacements: edited.replacements,
            file: edited.file,
        }))
    }

    async fn delete_file(
        &self,
        req: Request<api::DeleteFileRequest>,
    ) -> Result<Response<api::DeleteFileResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let executor = self.executor(&caller, &r.sandbox_id).await?;
        executor
            .delete_file(exec::DeleteFileRequest {
                path: r.path,
                recursive: r.recursive,
            })
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
        let executor = self.executor(&caller, &r.sandbox_id).await?;
        let directory = executor
            .make_directory(exec::MakeDirectoryRequest {
                path: r.path,
                mode: r.mode,
            })
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::MakeDirectoryResponse {
            directory: Some(directory),
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
        let executor = self.executor(&caller, &header.sandbox_id).await?;
        let first = exec::UploadRequest {
            kind: Some(exec::upload_request::Kind::Header(exec::UploadHeader {
                path: header.path,
            })),
            commit: false,
        };
        let commit = exec::UploadRequest {
            kind: Some(exec::upload_request::Kind::Data(bytes::Bytes::new())),
            commit: true,
        };
        let summary = forward_client_stream(
            inbound,
            end,
            first,
            |m| match m.kind {
                Some(api::upload_request::Kind::Data(data)) => Ok(exec::UploadRequest {
                    kind: Some(exec::upload_request::Kind::Data(data)),
                    commit: false,
                }),
                _ => Err(Error::invalid("Upload takes one header, then data")),
            },
            commit,
            |feed| Box::pin(async move { executor.upload(feed).await }),
        )
        .await?;
        Ok(Response::new(summary))
    }

    async fn download(
        &self,
        req: Request<api::DownloadRequest>,
    ) -> Result<Response<Self::DownloadStream>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        check_path(&r.path, "path").map_err(to_status)?;
        let executor = self.executor(&caller, &r.sandbox_id).await?;
        let stream = executor
            .download(exec::DownloadRequest { path: r.path })
            .await
            .map_err(to_status)?;
        Ok(Response::new(forward_chunks(stream, |c| {
            api::DownloadResponse { data: c.data }
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
