//! `mentis.executor.v1.WorkspaceService`: translates requests, runs the blocking file operations on
//! blocking threads and bridges bulk data through bounded channels.

use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;
use futures::Stream;
use mentis_proto::executor::workspace_service_server::WorkspaceService;
use mentis_proto::executor::{
    DeleteFileRequest, DeleteFileResponse, DownloadRequest, DownloadResponse, EditFileRequest,
    EditFileResponse, FileEvent, FileEventType, ListFilesRequest, ListFilesResponse,
    MakeDirectoryRequest, MakeDirectoryResponse, MoveFileRequest, MoveFileResponse,
    ReadFileRequest, ReadFileResponse, StatFileRequest, StatFileResponse, UploadRequest,
    UploadResponse, WatchFilesRequest, WatchFilesResponse, WriteFileRequest, WriteFileResponse,
    upload_request, watch_files_response, write_file_request,
};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use super::pipe::{ChannelReader, ChannelWriter, Feed};
use super::watch::{self, Watches};
use super::{CHANNEL_CHUNKS, Workspace, read};
use crate::error::Error;

/// The gRPC face of [`Workspace`].
pub(crate) struct WorkspaceApi {
    ws: Arc<Workspace>,
    readers: TaskTracker,
    watches: Arc<Watches>,
}

impl WorkspaceApi {
    /// `readers` owns the blocking tasks that send a ReadFile's or a Download's bytes.
    pub(crate) fn new(ws: Workspace, readers: TaskTracker, watches: Arc<Watches>) -> Self {
        Self {
            ws: Arc::new(ws),
            readers,
            watches,
        }
    }
}

/// A watch's items as WatchFiles responses.
fn watch_response(item: watch::Item) -> WatchFilesResponse {
    use watch_files_response::Kind as K;
    let kind = match item {
        watch::Item::Event(e) => K::Event(FileEvent {
            seq: e.seq,
            r#type: match e.kind {
                watch::Kind::Created => FileEventType::Created,
                watch::Kind::Modified => FileEventType::Modified,
                watch::Kind::Removed => FileEventType::Removed,
                watch::Kind::Overflow => FileEventType::Overflow,
            } as i32,
            path: e.path,
            is_dir: e.is_dir,
            time: e
                .time
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0.0, |d| d.as_secs_f64()),
        }),
        watch::Item::Gap {
            after_seq,
            first_available_seq,
        } => K::Gap(watch_files_response::Gap {
            after_seq,
            first_available_seq,
        }),
    };
    WatchFilesResponse { kind: Some(kind) }
}

/// Runs a blocking file operation on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, Error> + Send + 'static,
) -> Result<T, Error> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::Io {
            context: "a file operation's thread failed".to_owned(),
            source: std::io::Error::other(e.to_string()),
        })?
}

type ByteStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Bytes from a blocking producer, as a response stream of `wrap`ped chunks.
fn chunk_stream<T: Send + 'static>(
    rx: mpsc::Receiver<Result<Bytes, Error>>,
    wrap: fn(Bytes) -> T,
) -> ByteStream<T> {
    Box::pin(ReceiverStream::new(rx).map(move |r| r.map(wrap).map_err(Status::from)))
}

/// The first message of a client stream, which must be its header (and cannot commit: a write or upload
/// commits after its last data message).
async fn header<M, H>(
    stream: &mut Streaming<M>,
    take: impl Fn(M) -> Option<H>,
    what: &str,
) -> Result<H, Status> {
    match stream.message().await? {
        Some(m) => take(m).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "the first {what} message must be its header, without commit"
            ))
            .into()
        }),
        None => Err(Error::InvalidArgument(format!("empty {what} stream")).into()),
    }
}

/// The answer to a stream that ended without its commit. Usually nobody reads it: the runtime stops
/// sending without a commit only when its own client's stream was cut, and then it has dropped the call.
fn uncommitted(what: &str) -> Status {
    Error::InvalidArgument(format!(
        "the {what} stream ended without its commit message; nothing was written"
    ))
    .into()
}

/// A message after the one that committed.
fn after_commit(what: &str) -> Status {
    Error::InvalidArgument(format!(
        "{what} takes nothing after the message that commits it"
    ))
    .into()
}

#[tonic::async_trait]
impl WorkspaceService for WorkspaceApi {
    type ReadFileStream = ByteStream<ReadFileResponse>;
    type WatchFilesStream = ByteStream<WatchFilesResponse>;
    type DownloadStream = ByteStream<DownloadResponse>;

    async fn read_file(
        &self,
        request: Request<ReadFileRequest>,
    ) -> Result<Response<Self::ReadFileStream>, Status> {
        let ReadFileRequest {
            path,
            offset,
            length,
        } = request.into_inner();
        let p = self.ws.parse(&path)?;
        let ws = Arc::clone(&self.ws);
        let shown = p.display();
        // Open first, so a bad path is the call's status rather than an error inside the stream.
        let (file, _) = blocking(move || ws.open_read(&p)).await?;
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        // Ends when the range is sent or the receiver (the client) is gone.
        self.readers
            .spawn_blocking(move || read::send_range(file, &shown, offset, length, &tx));
        Ok(Response::new(chunk_stream(rx, |data| ReadFileResponse {
            data,
        })))
    }

    async fn write_file(
        &self,
        request: Request<Streaming<WriteFileRequest>>,
    ) -> Result<Response<WriteFileResponse>, Status> {
        let mut stream = request.into_inner();
        let head = header(
            &mut stream,
            |m| match m.kind {
                Some(write_file_request::Kind::Header(h)) if !m.commit => Some(h),
                _ => None,
            },
            "WriteFile",
        )
        .await?;
        let p = self.ws.parse(&head.path)?;
        let ws = Arc::clone(&self.ws);
        let mut out = blocking(move || ws.create_atomic(&p, head.mode)).await?;
        // The temporary file is removed when `out` is dropped uncommitted: on any error below, when the
        // stream ends without its commit, and when the caller goes away (this future is dropped).
        let mut committed = false;
        // `Ok(None)` also follows a reset by the caller (tonic reports a cancelled request stream as
        // ended), which is why the commit message, not the end, decides.
        while let Some(message) = stream.message().await? {
            if committed {
                return Err(after_commit("WriteFile"));
            }
            match message.kind {
                Some(write_file_request::Kind::Data(data)) => {
                    if !data.is_empty() {
                        out = blocking(move || out.write(&data).map(|()| out)).await?;
                    }
                }
                _ => {
                    return Err(Error::InvalidArgument(
                        "WriteFile takes one header, then data".to_owned(),
                    )
                    .into());
                }
            }
            committed = message.commit;
        }
        if !committed {
            return Err(uncommitted("WriteFile"));
        }
        let file = blocking(move || out.commit()).await?;
        Ok(Response::new(WriteFileResponse { file: Some(file) }))
    }

    async fn list_files(
        &self,
        request: Request<ListFilesRequest>,
    ) -> Result<Response<ListFilesResponse>, Status> {
        let ListFilesRequest {
            path,
            recursive,
            page_size,
            page_token,
        } = request.into_inner();
        let p = self.ws.parse(&path)?;
        let ws = Arc::clone(&self.ws);
        let page = blocking(move || {
            ws.list(
                &p,
                super::pages::PageRequest {
                    recursive,
                    size: page_size,
                    token: &page_token,
                },
            )
        })
        .await?;
        Ok(Response::new(ListFilesResponse {
            files: page.files,
            truncated: page.next.is_some(),
            next_page_token: page.next.unwrap_or_default(),
        }))
    }

    async fn stat_file(
        &self,
        request: Request<StatFileRequest>,
    ) -> Result<Response<StatFileResponse>, Status> {
        let p = self.ws.parse(&request.into_inner().path)?;
        let ws = Arc::clone(&self.ws);
        let file = blocking(move || ws.stat(&p)).await?;
        Ok(Response::new(StatFileResponse { file: Some(file) }))
    }

    async fn edit_file(
        &self,
        request: Request<EditFileRequest>,
    ) -> Result<Response<EditFileResponse>, Status> {
        let EditFileRequest {
            path,
            old_string,
            new_string,
            replace_all,
        } = request.into_inner();
        let p = self.ws.parse(&path)?;
        let ws = Arc::clone(&self.ws);
        let (replacements, file) =
            blocking(move || ws.edit(&p, &old_string, &new_string, replace_all)).await?;
        Ok(Response::new(EditFileResponse {
            replacements,
            file: Some(file),
        }))
    }

    async fn delete_file(
        &self,
        request: Request<DeleteFileRequest>,
    ) -> Result<Response<DeleteFileResponse>, Status> {
        let DeleteFileRequest { path, recursive } = request.into_inner();
        let p = self.ws.parse(&path)?;
        let ws = Arc::clone(&self.ws);
        blocking(move || ws.delete(&p, recursive)).await?;
        Ok(Response::new(DeleteFileResponse {}))
    }

    async fn make_directory(
        &self,
        request: Request<MakeDirectoryRequest>,
    ) -> Result<Response<MakeDirectoryResponse>, Status> {
        let MakeDirectoryRequest { path, mode } = request.into_inner();
        let p = self.ws.parse(&path)?;
        let ws = Arc::clone(&self.ws);
        let directory = blocking(move || ws.make_dir(&p, mode)).await?;
        Ok(Response::new(MakeDirectoryResponse {
            directory: Some(directory),
        }))
    }

    async fn watch_files(
        &self,
        request: Request<WatchFilesRequest>,
    ) -> Result<Response<Self::WatchFilesStream>, Status> {
        let WatchFilesRequest {
            path,
            recursive,
            watch_id,
            after_seq,
        } = request.into_inner();
        let watch = if watch_id.is_empty() {
            let p = self.ws.parse(&path)?;
            let (ws, watches) = (Arc::clone(&self.ws), Arc::clone(&self.watches));
            // Walking and adding the directories' watches are system calls: off the reactor.
            blocking(move || watches.start(&ws, &p, recursive)).await?
        } else {
            self.watches.get(&watch_id)?
        };
        let started = WatchFilesResponse {
            kind: Some(watch_files_response::Kind::Started(
                watch_files_response::Started {
                    watch_id: watch.id.clone(),
                    last_seq: watch.last_seq(),
                },
            )),
        };
        let items = watch.read(after_seq)?.map(|i| Ok(watch_response(i)));
        Ok(Response::new(Box::pin(
            futures::stream::iter([Ok(started)]).chain(items),
        )))
    }

    async fn move_file(
        &self,
        request: Request<MoveFileRequest>,
    ) -> Result<Response<MoveFileResponse>, Status> {
        let MoveFileRequest {
            source,
            destination,
            overwrite,
        } = request.into_inner();
        let from = self.ws.parse(&source)?;
        let to = self.ws.parse(&destination)?;
        let ws = Arc::clone(&self.ws);
        let file = blocking(move || ws.rename(&from, &to, overwrite)).await?;
        Ok(Response::new(MoveFileResponse { file: Some(file) }))
    }

    async fn upload(
        &self,
        request: Request<Streaming<UploadRequest>>,
    ) -> Result<Response<UploadResponse>, Status> {
        let mut stream = request.into_inner();
        let head = header(
            &mut stream,
            |m| match m.kind {
                Some(upload_request::Kind::Header(h)) if !m.commit => Some(h),
                _ => None,
            },
            "Upload",
        )
        .await?;
        let p = self.ws.parse(&head.path)?;
        let limit = self.ws.max_write_bytes();
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let ws = Arc::clone(&self.ws);
        let unpack = blocking(move || ws.unpack(&p, ChannelReader::new(rx)));
        // Feeds the unpacker; its verdict on the stream wins over what the unpacker then saw. Dropping
        // `tx` without `Feed::End` makes the unpacker fail, so a stream that breaks, or ends (or is reset:
        // that looks the same) without its commit, never moves anything in.
        let feed = async move {
            let mut total: u64 = 0;
            let mut committed = false;
            while let Some(message) = stream.message().await? {
                if committed {
                    return Err(after_commit("Upload"));
                }
                match message.kind {
                    Some(upload_request::Kind::Data(data)) => {
                        total = total.saturating_add(data.len() as u64);
                        // The archive is at least as large as what it unpacks to (sparse entries aside,
                        // which the unpacker counts): stop reading early.
                        if total > limit.saturating_add(1024 * 1024) {
                            return Err(Status::from(Error::TooLarge(format!(
                                "the archive is larger than the cap of {limit} bytes \
                                 (MENTIS_EXECUTOR_MAX_WRITE_BYTES); nothing was written"
                            ))));
                        }
                        if tx.send(Feed::Data(data)).await.is_err() {
                            // The unpacker stopped (it refused the archive): its error is the answer.
                            return Ok(());
                        }
                    }
                    _ => {
                        return Err(Status::from(Error::InvalidArgument(
                            "Upload takes one header, then data".to_owned(),
                        )));
                    }
                }
                committed = message.commit;
            }
            if !committed {
                return Err(uncommitted("Upload"));
            }
            let _ = tx.send(Feed::End).await;
            Ok::<(), Status>(())
        };
        let (fed, unpacked) = tokio::join!(feed, unpack);
        fed?;
        let summary = unpacked?;
        Ok(Response::new(UploadResponse {
            summary: Some(summary),
        }))
    }

    async fn download(
        &self,
        request: Request<DownloadRequest>,
    ) -> Result<Response<Self::DownloadStream>, Status> {
        let p = self.ws.parse(&request.into_inner().path)?;
        // Check the path first, so a bad one is the call's status.
        let ws = Arc::clone(&self.ws);
        let checked = p.clone();
        blocking(move || ws.stat(&checked)).await?;
        let (tx, rx) = mpsc::channel(CHANNEL_CHUNKS);
        let ws = Arc::clone(&self.ws);
        self.readers.spawn_blocking(move || {
            let errors = tx.clone();
            if let Err(e) = ws.archive(&p, ChannelWriter::new(tx)) {
                // The client may be gone (that is how most downloads that fail here end).
                let _ = errors.blocking_send(Err(e));
            }
        });
        Ok(Response::new(chunk_stream(rx, |data| DownloadResponse {
            data,
        })))
    }
}
