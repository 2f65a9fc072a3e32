//! Snapshots in a real S3-compatible server (a multipart upload, a restore, a changed object refused, a
//! wrong key refused with nothing left): s3s-fs (`.tools/bin/s3s-fs`, built by `make tools`), started
//! here on a free port with a key of its own and a bucket folder, stopped at the end.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mentis_app::snapshots::S3Settings;
use mentis_e2e::*;
use mentis_proto::api;
use mentis_runtime::config::SnapshotStoreConfig;
use tonic::Code;

use super::{STATE, create, from_snapshot, snapshots, take};

const BUCKET: &str = "mentis-snapshots";
const PREFIX: &str = "e2e/";

struct S3Server {
    child: std::process::Child,
    endpoint: String,
    root: tempfile::TempDir,
    access_key: String,
    secret_key: String,
}

impl S3Server {
    async fn start() -> anyhow::Result<Self> {
        let bin = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.tools/bin/s3s-fs"));
        anyhow::ensure!(
            bin.exists(),
            "{} is missing: `make tools` builds it (deploy/ensure-tools.sh)",
            bin.display()
        );
        let root = tempfile::tempdir()?;
        std::fs::create_dir(root.path().join(BUCKET))?;
        let port = free_port()?;
        let (access_key, secret_key) = ("mentis-e2e".to_owned(), random_key());
        let child = std::process::Command::new(&bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--access-key", &access_key, "--secret-key", &secret_key])
            .arg(root.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let server = Self {
            child,
            endpoint: format!("http://127.0.0.1:{port}"),
            root,
            access_key,
            secret_key,
        };
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return Ok(server);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!("s3s-fs did not listen on {port} within 10 s")
    }

    fn settings(&self, secret: &str) -> SnapshotStoreConfig {
        SnapshotStoreConfig::S3(S3Settings {
            endpoint: self.endpoint.clone(),
            bucket: BUCKET.into(),
            region: "us-east-1".into(),
            prefix: PREFIX.into(),
            credentials: Some((self.access_key.clone(), secret.to_owned())),
        })
    }

    /// The objects under the prefix, as s3s-fs keeps them: files in the bucket's folder.
    fn objects(&self) -> Vec<(String, u64)> {
        let dir = self
            .root
            .path()
            .join(BUCKET)
            .join(PREFIX.trim_end_matches('/'));
        let Ok(entries) = std::fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut out: Vec<(String, u64)> = entries
            .filter_map(Result::ok)
            .filter(|e| e.path().is_file())
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    e.metadata().map(|m| m.len()).unwrap_or(0),
                )
            })
            .collect();
        out.sort();
        out
    }

    fn object(&self, name: &str) -> PathBuf {
        Path::new(self.root.path())
            .join(BUCKET)
            .join(PREFIX)
            .join(name)
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_workspace_goes_to_s3_and_comes_back() {
    let s3 = S3Server::start().await.unwrap();
    let store = s3.settings(&s3.secret_key);
    let mut h = Harness::start_with(|c| c.snapshot_store = store)
        .await
        .unwrap();
    let sandbox = h.create_default().await.unwrap().sandbox_id;
    h.sh(
        &sandbox,
        "cd /workspace && mkdir -p data && seq 1 100000 > data/numbers.txt && chmod 640 data/numbers.txt && \
         ln -s data/numbers.txt n && head -c 12000000 /dev/urandom > data/blob.bin",
    )
    .await
    .unwrap();
    let before = stdout(&h.sh(&sandbox, STATE).await.unwrap());
    let snap = take(&h, &sandbox, &[]).await;
    assert_eq!(snap.store, "s3");
    // Over object_store's 10 MiB buffer: a multipart upload.
    assert!(snap.size_bytes > 12_000_000, "{snap:?}");
    let name = format!("{}.tar.zst", snap.snapshot_id);
    assert_eq!(s3.objects(), [(name.clone(), snap.size_bytes)]);
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: sandbox.clone(),
        })
        .await
        .unwrap();
    let restored = create(&h, from_snapshot(&snap.snapshot_id)).await.unwrap();
    let after = stdout(&h.sh(&restored.sandbox_id, STATE).await.unwrap());
    assert_eq!(after, before, "the workspace restored from S3 differs");

    // An object changed in the bucket is refused on restore.
    let object = s3.object(&name);
    let mut bytes = std::fs::read(&object).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&object, &bytes).unwrap();
    let (code, reason, _) = refusal(create(&h, from_snapshot(&snap.snapshot_id)).await);
    assert_eq!(
        (code, reason.as_str()),
        (Code::FailedPrecondition, "SNAPSHOT_CORRUPT")
    );

    snapshots(&h)
        .delete_snapshot(api::DeleteSnapshotRequest {
            snapshot_id: snap.snapshot_id.clone(),
        })
        .await
        .unwrap();
    assert_eq!(s3.objects(), []);
    h.stop().await.unwrap();
}

#[tokio::test]
async fn a_wrong_key_is_refused_and_leaves_nothing() {
    let s3 = S3Server::start().await.unwrap();
    let store = s3.settings("not-the-secret");
    let mut h = Harness::start_with(|c| c.snapshot_store = store)
        .await
        .unwrap();
    let sandbox = h.create_default().await.unwrap().sandbox_id;
    h.sh(&sandbox, "echo x > /workspace/x").await.unwrap();
    let refused = snapshots(&h)
        .create_snapshot(api::CreateSnapshotRequest {
            sandbox_id: sandbox.clone(),
            labels: Default::default(),
        })
        .await;
    let status = refused.expect_err("a wrong key is refused");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("S3"), "{}", status.message());
    assert_eq!(s3.objects(), []);
    let listed = snapshots(&h)
        .list_snapshots(api::ListSnapshotsRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(listed.snapshots.is_empty(), "{listed:?}");
    h.stop().await.unwrap();
}
