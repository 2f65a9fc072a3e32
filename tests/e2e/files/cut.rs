//! A cut write changes nothing, through the whole chain: a WriteFile cancelled after its header or in the
//! middle of its data, an Upload cancelled at a tar entry boundary, and a WriteFile whose client vanishes
//! (its connection drops) each leave the old content byte for byte, checked once the executor has dropped
//! the temporary file or staging directory and a second more has passed, long enough for a late commit
//! to show. Each test waits, by looking into the sandbox, until the executor holds what was sent, then cuts
//! the stream with its sender still alive, so the stream never ends on its own.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use mentis_e2e::*;
use mentis_proto::api::{self, file_service_client::FileServiceClient};
use mentis_runtime::config::AuthConfig;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use tonic::service::interceptor::InterceptedService;

use super::{files, read, write};

/// Long enough for a commit that would follow the cut to have happened.
const LATE_COMMIT: Duration = Duration::from_secs(1);
/// Bound on waiting for the sandbox to show a state.
const PATIENCE: Duration = Duration::from_secs(60);

/// What the workspace holds before each cut write: an 11-byte file, and a directory an upload goes into.
const OLD: [(&str, &[u8]); 3] = [
    ("f.txt", b"hello world"),
    ("dest/a", b"old a"),
    ("dest/keep", b"keep"),
];

/// A call in flight whose request stream the test feeds; `tx` kept alive keeps the stream open.
struct Open<M, R> {
    tx: mpsc::Sender<M>,
    call: JoinHandle<Result<R, Status>>,
}

impl<M, R: std::fmt::Debug> Open<M, R> {
    async fn send(&self, message: M) {
        assert!(self.tx.send(message).await.is_ok(), "the call is open");
    }

    /// Drops the call future while the stream is still open: the client resets its HTTP/2 stream (what
    /// a cancelled call of any gRPC client does). Returns the sender, to be kept until the checks are done.
    async fn cancel(self) -> mpsc::Sender<M> {
        self.call.abort();
        match self.call.await {
            Err(e) if e.is_cancelled() => self.tx,
            other => panic!("the call ended before it was cancelled: {other:?}"),
        }
    }
}

fn open_write(
    client: &FileServiceClient<ApiChannel>,
) -> Open<api::WriteFileRequest, api::WriteFileResponse> {
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

fn write_header(sandbox: &str, path: &str) -> api::WriteFileRequest {
    api::WriteFileRequest {
        kind: Some(api::write_file_request::Kind::Header(
            api::WriteFileHeader {
                sandbox_id: sandbox.to_owned(),
                path: path.to_owned(),
                mode: 0,
            },
        )),
    }
}

fn write_data(data: &[u8]) -> api::WriteFileRequest {
    api::WriteFileRequest {
        kind: Some(api::write_file_request::Kind::Data(Bytes::copy_from_slice(
            data,
        ))),
    }
}

/// Runs `command` in the sandbox until its output satisfies `done`; returns that output.
async fn until(
    h: &mut Harness,
    sandbox: &str,
    command: &str,
    done: impl Fn(&str) -> bool,
) -> String {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        let out = stdout(&h.sh(sandbox, command).await.unwrap());
        if done(&out) {
            return out;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting on `{command}`; it printed {out:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Sizes of the temporary files of writes in progress in /workspace, one a line.
const TEMP_SIZES: &str = "find /workspace -maxdepth 1 -name '.*.mentis-tmp-*' -printf '%s\\n'";

/// Every entry of the workspace with its type (temporary files and staging directories included).
async fn listing(h: &mut Harness, sandbox: &str) -> String {
    let obs = h
        .sh(
            sandbox,
            "cd /workspace && find . -mindepth 1 -printf '%p %y\\n' | sort",
        )
        .await
        .unwrap();
    stdout(&obs)
}

/// `f.txt` (11 bytes), `dest/a` and `dest/keep` in a fresh sandbox; returns the sandbox and its listing.
async fn old_content(
    h: &mut Harness,
    client: &mut FileServiceClient<ApiChannel>,
) -> (String, String) {
    let sandbox = h.create_default().await.unwrap().sandbox_id;
    for (path, data) in OLD {
        write(client, &sandbox, path, vec![Bytes::from_static(data)])
            .await
            .unwrap();
    }
    let before = listing(h, &sandbox).await;
    assert_eq!(
        before, "./dest d\n./dest/a f\n./dest/keep f\n./f.txt f\n",
        "the old content"
    );
    (sandbox, before)
}

/// After a late commit would have shown: the same entries, and the same bytes in each file.
async fn assert_unchanged(
    h: &mut Harness,
    client: &mut FileServiceClient<ApiChannel>,
    sandbox: &str,
    before: &str,
    what: &str,
) {
    tokio::time::sleep(LATE_COMMIT).await;
    assert_eq!(listing(h, sandbox).await, before, "{what}: the entries");
    for (path, data) in OLD {
        let now = read(client, sandbox, path).await.unwrap();
        assert!(
            now == data,
            "{what}: {path} has {} bytes {:?}..., had {:?}",
            now.len(),
            String::from_utf8_lossy(&now[..now.len().min(16)]),
            String::from_utf8_lossy(data)
        );
    }
}

#[tokio::test]
async fn a_write_cancelled_after_its_header_changes_nothing() {
    let mut h = Harness::start().await.unwrap();
    let mut client = files(&h);
    let (sandbox, before) = old_content(&mut h, &mut client).await;
    let call = open_write(&client);
    call.send(write_header(&sandbox, "f.txt")).await;
    until(&mut h, &sandbox, TEMP_SIZES, |out| out == "0\n").await;
    let _tx = call.cancel().await;
    until(&mut h, &sandbox, TEMP_SIZES, str::is_empty).await;
    assert_unchanged(
        &mut h,
        &mut client,
        &sandbox,
        &before,
        "cancelled after the header",
    )
    .await;
    h.stop().await.unwrap();
}

#[tokio::test]
async fn a_write_cancelled_mid_data_changes_nothing() {
    let mut h = Harness::start().await.unwrap();
    let mut client = files(&h);
    let (sandbox, before) = old_content(&mut h, &mut client).await;
    let call = open_write(&client);
    call.send(write_header(&sandbox, "f.txt")).await;
    call.send(write_data(&[b'x'; 1000])).await;
    until(&mut h, &sandbox, TEMP_SIZES, |out| out == "1000\n").await;
    let _tx = call.cancel().await;
    until(&mut h, &sandbox, TEMP_SIZES, str::is_empty).await;
    assert_unchanged(&mut h, &mut client, &sandbox, &before, "cancelled mid-data").await;
    h.stop().await.unwrap();
}

#[tokio::test]
async fn an_upload_cancelled_at_a_tar_entry_boundary_changes_nothing() {
    let mut h = Harness::start().await.unwrap();
    let mut client = files(&h);
    let (sandbox, before) = old_content(&mut h, &mut client).await;
    // Two whole entries and no end-of-archive blocks: taken for a whole archive by a reader that takes
    // the end of its input for the end of the archive.
    let mut builder = tar::Builder::new(Vec::new());
    for (name, body) in [("a", b"new a"), ("b", b"new b")] {
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder.append_data(&mut header, name, &body[..]).unwrap();
    }
    let entries = builder.get_ref().clone();
    let (tx, rx) = mpsc::channel(16);
    let mut uploader = client.clone();
    let call = Open {
        tx,
        call: tokio::spawn(async move {
            uploader
                .upload(ReceiverStream::new(rx))
                .await
                .map(tonic::Response::into_inner)
        }),
    };
    call.send(api::UploadRequest {
        kind: Some(api::upload_request::Kind::Header(api::UploadHeader {
            sandbox_id: sandbox.clone(),
            path: "dest".into(),
        })),
    })
    .await;
    call.send(api::UploadRequest {
        kind: Some(api::upload_request::Kind::Data(Bytes::from(entries))),
    })
    .await;
    let staged = "find /workspace/dest -path '*/.mentis-upload-*/b' -printf '%s\\n'";
    until(&mut h, &sandbox, staged, |out| out == "5\n").await;
    let _tx = call.cancel().await;
    let staging = "find /workspace/dest -maxdepth 1 -name '.mentis-upload-*'";
    until(&mut h, &sandbox, staging, str::is_empty).await;
    assert_unchanged(
        &mut h,
        &mut client,
        &sandbox,
        &before,
        "upload cancelled at an entry boundary",
    )
    .await;
    h.stop().await.unwrap();
}

/// A TCP proxy to `to`; aborting the returned task drops every connection through it at once, as when
/// the client's process or machine vanishes.
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
async fn a_write_whose_client_vanishes_mid_data_changes_nothing() {
    let mut key = None;
    let mut h = Harness::start_with(|c| {
        if let AuthConfig::Keys { admin_key } = &c.auth {
            key.clone_from(admin_key);
        }
    })
    .await
    .unwrap();
    let mut client = files(&h);
    let (sandbox, before) = old_content(&mut h, &mut client).await;
    let runtime = h.runtime.as_ref().unwrap().addr;
    let (addr, link) = proxy(runtime).await;
    let raw = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let far = FileServiceClient::new(InterceptedService::new(raw, Bearer::new(key.as_deref())));
    let call = open_write(&far);
    call.send(write_header(&sandbox, "f.txt")).await;
    call.send(write_data(&[b'x'; 1000])).await;
    until(&mut h, &sandbox, TEMP_SIZES, |out| out == "1000\n").await;
    // The client's connection is gone at once: no end of stream, no reset, no goodbye.
    link.abort();
    let _ = link.await;
    until(&mut h, &sandbox, TEMP_SIZES, str::is_empty).await;
    assert_unchanged(
        &mut h,
        &mut client,
        &sandbox,
        &before,
        "the client vanished mid-data",
    )
    .await;
    drop(call);
    h.stop().await.unwrap();
}
