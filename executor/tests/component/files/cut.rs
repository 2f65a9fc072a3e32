//! Cut writes change nothing: a WriteFile or Upload whose request stream is reset (the caller dropped the
//! call), whose connection drops, or which ends without its commit message leaves the old content byte for
//! byte and no temporary file or staging directory behind. Each cut test waits (on the temporary file or
//! the staging directory, not on a clock) until the executor has received what it sends, then cuts the
//! stream with the sender still alive, so the stream never ends on its own.

use std::net::SocketAddr;
use std::path::Path;

use bytes::Bytes;
use mentis_proto::executor::{
    UploadHeader, UploadRequest, UploadResponse, WriteFileHeader, WriteFileRequest,
    WriteFileResponse, upload_request, write_file_request,
};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;

use super::super::support::*;
use super::{Files, files, raw_tar, tree};

/// A call in flight whose request stream the test feeds; `tx` kept alive keeps the stream open.
struct Open<M, R> {
    tx: mpsc::Sender<M>,
    call: JoinHandle<Result<R, Status>>,
}

impl<M, R: std::fmt::Debug> Open<M, R> {
    async fn send(&self, message: M) {
        assert!(self.tx.send(message).await.is_ok(), "the call is open");
    }

    /// Drops the call future while the stream is still open: the client resets the HTTP/2 stream.
    /// Returns the sender, for the caller to keep until it has looked at the workspace.
    async fn cut(self) -> mpsc::Sender<M> {
        self.call.abort();
        match self.call.await {
            Err(e) if e.is_cancelled() => self.tx,
            other => panic!("the call ended before it was cut: {other:?}"),
        }
    }
}

fn open_write(client: &Files) -> Open<WriteFileRequest, WriteFileResponse> {
    let (tx, rx) = mpsc::channel(16);
    let mut client = client.clone();
    let call = tokio::spawn(async move {
        client
            .write_file(ReceiverStream::new(rx))
            .await
            .map(tonic::Response::into_inner)
    });
    Open { tx, call }
}

fn open_upload(client: &Files) -> Open<UploadRequest, UploadResponse> {
    let (tx, rx) = mpsc::channel(16);
    let mut client = client.clone();
    let call = tokio::spawn(async move {
        client
            .upload(ReceiverStream::new(rx))
            .await
            .map(tonic::Response::into_inner)
    });
    Open { tx, call }
}

fn write_header(path: &str) -> WriteFileRequest {
    WriteFileRequest {
        kind: Some(write_file_request::Kind::Header(WriteFileHeader {
            path: path.to_owned(),
            mode: 0,
        })),
        commit: false,
    }
}

fn write_data(data: &[u8]) -> WriteFileRequest {
    WriteFileRequest {
        kind: Some(write_file_request::Kind::Data(Bytes::copy_from_slice(data))),
        commit: false,
    }
}

fn upload_header(path: &str) -> UploadRequest {
    UploadRequest {
        kind: Some(upload_request::Kind::Header(UploadHeader {
            path: path.to_owned(),
        })),
        commit: false,
    }
}

fn upload_data(data: &[u8]) -> UploadRequest {
    UploadRequest {
        kind: Some(upload_request::Kind::Data(Bytes::copy_from_slice(data))),
        commit: false,
    }
}

/// Sizes of the temporary files of writes in progress in `dir`.
fn temp_sizes(dir: &Path) -> Vec<u64> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(Result::unwrap)
        .filter(|e| e.file_name().to_string_lossy().contains(".mentis-tmp-"))
        .map(|e| e.metadata().unwrap().len())
        .collect()
}

/// The staging directories of uploads in progress in `dir`.
fn staging(dir: &Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(Result::unwrap)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(".mentis-upload-")
        })
        .map(|e| e.path())
        .collect()
}

/// The first two entries of an archive, cut at the boundary after the second (no end-of-archive blocks):
/// a tar reader that takes the end of its input for the end of the archive accepts it whole.
fn two_entries() -> (Vec<u8>, Vec<u8>) {
    let whole = raw_tar(&[
        ("a", tar::EntryType::Regular, "", b"new a"),
        ("b", tar::EntryType::Regular, "", b"new b"),
    ]);
    let boundary = whole.len() - 1024;
    (whole[..boundary].to_vec(), whole)
}

/// A workspace with `f.txt` (11 bytes) and `dest/a`, `dest/keep`; returns the tree to compare with.
fn old_content(executor: &TestExecutor) -> Vec<String> {
    std::fs::write(executor.path("f.txt"), b"hello world").unwrap();
    std::fs::create_dir(executor.path("dest")).unwrap();
    std::fs::write(executor.path("dest/a"), b"old a").unwrap();
    std::fs::write(executor.path("dest/keep"), b"keep").unwrap();
    tree(executor.workspace.path())
}

fn assert_unchanged(executor: &TestExecutor, before: &[String], what: &str) {
    assert_eq!(tree(executor.workspace.path()), before, "{what}");
    assert_eq!(
        std::fs::read(executor.path("f.txt")).unwrap(),
        b"hello world",
        "{what}"
    );
    assert_eq!(
        std::fs::read(executor.path("dest/a")).unwrap(),
        b"old a",
        "{what}"
    );
    assert_eq!(
        std::fs::read(executor.path("dest/keep")).unwrap(),
        b"keep",
        "{what}"
    );
}

#[tokio::test]
async fn a_write_cut_after_its_header_changes_nothing() {
    let executor = TestExecutor::start().await;
    let before = old_content(&executor);
    let client = files(&executor).await;
    let call = open_write(&client);
    call.send(write_header("f.txt")).await;
    let root = executor.workspace.path().to_owned();
    eventually("the write has its temporary file", || {
        temp_sizes(&root) == [0]
    })
    .await;
    let _tx = call.cut().await;
    eventually("the cut write is gone", || temp_sizes(&root).is_empty()).await;
    assert_unchanged(&executor, &before, "cut after the header");
}

#[tokio::test]
async fn a_write_cut_mid_data_changes_nothing() {
    let executor = TestExecutor::start().await;
    let before = old_content(&executor);
    let client = files(&executor).await;
    let call = open_write(&client);
    call.send(write_header("f.txt")).await;
    call.send(write_data(&[b'x'; 1000])).await;
    let root = executor.workspace.path().to_owned();
    eventually("the write has 1000 bytes", || temp_sizes(&root) == [1000]).await;
    let _tx = call.cut().await;
    eventually("the cut write is gone", || temp_sizes(&root).is_empty()).await;
    assert_unchanged(&executor, &before, "cut mid-data");
}

#[tokio::test]
async fn an_upload_cut_at_an_entry_boundary_changes_nothing() {
    let executor = TestExecutor::start().await;
    let before = old_content(&executor);
    let client = files(&executor).await;
    let (entries, _) = two_entries();
    let call = open_upload(&client);
    call.send(upload_header("dest")).await;
    call.send(upload_data(&entries)).await;
    let dest = executor.path("dest");
    eventually("both entries are staged", || {
        staging(&dest)
            .iter()
            .any(|s| std::fs::read(s.join("b")).is_ok_and(|b| b == b"new b"))
    })
    .await;
    let _tx = call.cut().await;
    eventually("the cut upload is gone", || staging(&dest).is_empty()).await;
    assert_unchanged(&executor, &before, "upload cut at an entry boundary");
}

#[tokio::test]
async fn an_upload_cut_after_the_archive_end_but_before_the_stream_end_changes_nothing() {
    let executor = TestExecutor::start().await;
    let before = old_content(&executor);
    let client = files(&executor).await;
    let (_, whole) = two_entries();
    let call = open_upload(&client);
    call.send(upload_header("dest")).await;
    call.send(upload_data(&whole)).await;
    let dest = executor.path("dest");
    // The end-of-archive blocks are not the end of the stream: the upload must wait for that.
    eventually("both entries are staged (or, wrongly, moved in)", || {
        std::fs::read(dest.join("b")).is_ok()
            || staging(&dest)
                .iter()
                .any(|s| std::fs::read(s.join("b")).is_ok_and(|b| b == b"new b"))
    })
    .await;
    let _tx = call.cut().await;
    eventually("the cut upload is gone", || staging(&dest).is_empty()).await;
    assert_unchanged(&executor, &before, "upload cut after the archive's end");
}

/// A TCP proxy to `to`; aborting the returned task drops every connection through it at once, as when
/// the caller's machine vanishes.
async fn proxy(to: SocketAddr) -> (SocketAddr, JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        // Owned here, so aborting this task drops (closes) every proxied connection.
        let mut connections = tokio::task::JoinSet::new();
        loop {
            let (mut inbound, _) = listener.accept().await.unwrap();
            connections.spawn(async move {
                let mut outbound = tokio::net::TcpStream::connect(to).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    });
    (addr, task)
}

#[tokio::test]
async fn a_write_whose_connection_drops_mid_data_changes_nothing() {
    let executor = TestExecutor::start().await;
    let before = old_content(&executor);
    let (addr, link) = proxy(executor.addr).await;
    let client =
        mentis_proto::executor::workspace_service_client::WorkspaceServiceClient::with_interceptor(
            channel(addr).await,
            AddToken::bearer(TOKEN),
        );
    let call = open_write(&client);
    call.send(write_header("f.txt")).await;
    call.send(write_data(&[b'x'; 1000])).await;
    let root = executor.workspace.path().to_owned();
    eventually("the write has 1000 bytes", || temp_sizes(&root) == [1000]).await;
    link.abort();
    let _ = link.await;
    eventually("the cut write is gone", || temp_sizes(&root).is_empty()).await;
    let answer = tokio::time::timeout(PATIENCE, call.call)
        .await
        .unwrap()
        .unwrap();
    assert!(answer.is_err(), "{answer:?}");
    drop(call.tx);
    assert_unchanged(&executor, &before, "connection dropped mid-data");
}

#[tokio::test]
async fn a_stream_that_ends_without_its_commit_changes_nothing() {
    let executor = TestExecutor::start().await;
    let before = old_content(&executor);
    let mut client = files(&executor).await;
    // What the executor saw when its runtime let a cut client stream end: a clean end, no commit.
    for messages in [
        vec![write_header("f.txt")],
        vec![write_header("f.txt"), write_data(&[b'x'; 1000])],
    ] {
        let status = client
            .write_file(futures::stream::iter(messages))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains("without its commit"),
            "{status:?}"
        );
        assert_unchanged(&executor, &before, "a write without its commit");
    }
    let (entries, whole) = two_entries();
    for archive in [entries, whole] {
        let messages = vec![upload_header("dest"), upload_data(&archive)];
        let status = client
            .upload(futures::stream::iter(messages))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains("without its commit"),
            "{status:?}"
        );
        assert_unchanged(&executor, &before, "an upload without its commit");
    }
}

#[tokio::test]
async fn a_commit_is_the_last_message_and_never_the_header() {
    let executor = TestExecutor::start().await;
    let before = old_content(&executor);
    let mut client = files(&executor).await;
    let commit = WriteFileRequest {
        commit: true,
        ..write_data(b"new")
    };
    let header_commits = WriteFileRequest {
        commit: true,
        ..write_header("f.txt")
    };
    for (what, messages) in [
        (
            "data after the commit",
            vec![write_header("f.txt"), commit.clone(), write_data(b"more")],
        ),
        ("a header that commits", vec![header_commits]),
    ] {
        let status = client
            .write_file(futures::stream::iter(messages))
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            tonic::Code::InvalidArgument,
            "{what}: {status:?}"
        );
        assert_unchanged(&executor, &before, what);
    }
    let status = client
        .upload(futures::stream::iter(vec![
            upload_header("dest"),
            UploadRequest {
                commit: true,
                ..upload_data(&two_entries().1)
            },
            upload_data(b"more"),
        ]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert_unchanged(&executor, &before, "an upload with data after its commit");

    // With the commit last, both land.
    let file = client
        .write_file(futures::stream::iter(vec![write_header("f.txt"), commit]))
        .await
        .unwrap()
        .into_inner()
        .file
        .unwrap();
    assert_eq!(file.size, 3);
    assert_eq!(std::fs::read(executor.path("f.txt")).unwrap(), b"new");
    client
        .upload(futures::stream::iter(vec![
            upload_header("dest"),
            UploadRequest {
                commit: true,
                ..upload_data(&two_entries().1)
            },
        ]))
        .await
        .unwrap();
    assert_eq!(std::fs::read(executor.path("dest/a")).unwrap(), b"new a");
    assert_eq!(std::fs::read(executor.path("dest/b")).unwrap(), b"new b");
}
