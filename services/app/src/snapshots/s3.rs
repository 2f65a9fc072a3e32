//! Snapshot archives in any S3-compatible store (`MENTIS_S3_ENDPOINT`, `MENTIS_S3_BUCKET`, `MENTIS_S3_REGION`,
//! `MENTIS_S3_PREFIX`; credentials from the standard `AWS_*` variables), through `object_store`: an archive
//! goes up as a multipart upload, visible only once completed and aborted on any failure, so a failed
//! snapshot leaves no object and no earlier one changes; it comes back as a stream.

use std::sync::Arc;

use futures::TryStreamExt as _;
use mentis_core::{Error, Reason, Result};
use object_store::buffered::BufWriter;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt as _};
use tokio::io::{AsyncRead, AsyncWriteExt as _};
use tokio_util::io::StreamReader;

use super::store::SnapshotStore;

/// Where a runtime keeps its archives in S3.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Settings {
    pub endpoint: String,
    pub bucket: String,
    pub region: String,
    /// Put before every object's name ("" or ending in '/').
    pub prefix: String,
    /// Access key id and secret (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`); None: whatever else the
    /// `AWS_*` environment provides (a session token, a web identity, ...).
    pub credentials: Option<(String, String)>,
}

impl std::fmt::Debug for S3Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Settings")
            .field("endpoint", &self.endpoint)
            .field("bucket", &self.bucket)
            .field("region", &self.region)
            .field("prefix", &self.prefix)
            .field(
                "access_key_id",
                &self.credentials.as_ref().map(|(id, _)| id),
            )
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
pub struct S3Store {
    store: Arc<dyn ObjectStore>,
    prefix: String,
}

fn s3_err(what: String) -> impl FnOnce(object_store::Error) -> Error {
    move |e| Error::unavailable(format!("snapshot store (S3): {what}: {e}")).with_source(e)
}

impl S3Store {
    /// The bucket of `settings`, with the credentials of the `AWS_*` environment variables.
    pub fn open(settings: &S3Settings) -> Result<Self> {
        let mut builder = object_store::aws::AmazonS3Builder::from_env()
            .with_endpoint(&settings.endpoint)
            .with_allow_http(settings.endpoint.starts_with("http://"))
            .with_bucket_name(&settings.bucket)
            .with_region(&settings.region);
        if let Some((id, secret)) = &settings.credentials {
            builder = builder
                .with_access_key_id(id)
                .with_secret_access_key(secret);
        }
        let store = builder.build().map_err(|e| {
            Error::internal(format!("snapshot store (S3): bad settings: {e}")).with_source(e)
        })?;
        Ok(Self {
            store: Arc::new(store),
            prefix: settings.prefix.clone(),
        })
    }

    fn path(&self, key: &str) -> Path {
        Path::from(format!("{}{key}", self.prefix))
    }
}

#[async_trait::async_trait]
impl SnapshotStore for S3Store {
    fn name(&self) -> &'static str {
        "s3"
    }

    async fn put(&self, key: &str, body: &mut (dyn AsyncRead + Send + Unpin)) -> Result<u64> {
        let path = self.path(key);
        let mut upload = BufWriter::new(Arc::clone(&self.store), path.clone());
        let copied = tokio::io::copy(body, &mut upload).await;
        let failed = match copied {
            // Completes the upload (one PUT for a small archive, else the multipart's completion); a
            // failure here leaves nothing to abort (and `abort` would panic after a shutdown).
            Ok(n) => match upload.shutdown().await {
                Ok(()) => return Ok(n),
                Err(e) => e,
            },
            Err(e) => {
                if let Err(a) = upload.abort().await {
                    tracing::warn!(%path, error = %a, "aborting a failed snapshot upload");
                }
                e
            }
        };
        // The source's own error (the executor's stream) is reported by the caller when it is the cause;
        // this names the store's side.
        Err(
            Error::unavailable(format!("snapshot store (S3): writing {path}: {failed}"))
                .with_source(failed),
        )
    }

    async fn get(&self, key: &str) -> Result<Box<dyn AsyncRead + Send + Unpin>> {
        let path = self.path(key);
        let got = self.store.get(&path).await.map_err(|e| match e {
            object_store::Error::NotFound { .. } => Error::new(
                Reason::SnapshotCorrupt,
                format!("the snapshot's archive {path} is missing from the store"),
            ),
            e => s3_err(format!("reading {path}"))(e),
        })?;
        let stream = got.into_stream().map_err(std::io::Error::other);
        Ok(Box::new(StreamReader::new(stream)))
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key);
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(s3_err(format!("deleting {path}"))(e)),
        }
    }
}
