//! A workspace into a store and back: the executor's tar stream, zstd and SHA-256 on the way, in chunks.

use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use async_compression::Level;
use async_compression::tokio::bufread::{ZstdDecoder, ZstdEncoder};
use futures::StreamExt as _;
use mentis_core::files::Chunk;
use mentis_core::{Error, Reason, Result};
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncRead, BufReader, ReadBuf};
use tokio_util::io::{ReaderStream, StreamReader};

use super::store::SnapshotStore;
use crate::executor_client::ExecutorClient;

/// Bytes of unpacked archive per Upload message.
const CHUNK: usize = 256 * 1024;

/// What [`take`] stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Taken {
    /// Bytes of the compressed archive.
    pub size: u64,
    /// Bytes of the tar archive.
    pub archive_bytes: u64,
    /// SHA-256 of the compressed archive, hex.
    pub sha256: String,
}

/// Hashes and counts what is read through it.
struct Hashing<R> {
    inner: R,
    hash: Sha256,
    count: u64,
}

impl<R> Hashing<R> {
    fn new(inner: R) -> Self {
        Self {
            inner,
            hash: Sha256::new(),
            count: 0,
        }
    }

    fn hex(&self) -> String {
        hex::encode(self.hash.clone().finalize())
    }
}

impl<R: AsyncRead + Unpin> AsyncRead for Hashing<R> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = &polled {
            let new = &buf.filled()[before..];
            this.hash.update(new);
            this.count += new.len() as u64;
        }
        polled
    }
}

/// The first error of a stream, kept aside: the IO layers between it and us would make it an io::Error.
type FirstError = Arc<Mutex<Option<Error>>>;

fn keep(slot: &FirstError, e: Error) -> io::Error {
    let text = e.to_string();
    let mut first = slot.lock().unwrap_or_else(|p| p.into_inner());
    first.get_or_insert(e);
    io::Error::other(text)
}

fn first(slot: &FirstError) -> Option<Error> {
    slot.lock().unwrap_or_else(|p| p.into_inner()).take()
}

/// Archives the workspace behind `executor` into object `key` of `store`.
pub async fn take(
    executor: &ExecutorClient,
    store: &dyn SnapshotStore,
    key: &str,
) -> Result<Taken> {
    let stream = executor.download(String::new()).await?;
    let failed: FirstError = Arc::default();
    let slot = Arc::clone(&failed);
    let chunks = stream.map(move |r| r.map_err(|e| keep(&slot, e)));
    let mut tar = StreamReader::new(chunks);
    let counted = {
        // Count the tar's bytes as the encoder pulls them.
        let mut hashing_tar = Hashing::new(&mut tar);
        let encoder = ZstdEncoder::with_quality(BufReader::new(&mut hashing_tar), Level::Default);
        let mut compressed = Hashing::new(encoder);
        let stored = store.put(key, &mut compressed).await;
        let (sha256, size) = (compressed.hex(), compressed.count);
        drop(compressed);
        match stored {
            Ok(n) if n == size => Taken {
                size,
                archive_bytes: hashing_tar.count,
                sha256,
            },
            Ok(n) => {
                let _ = store.delete(key).await;
                return Err(Error::internal(format!(
                    "snapshots: the store took {n} bytes of {size}"
                )));
            }
            Err(e) => {
                let _ = store.delete(key).await;
                return Err(first(&failed).unwrap_or(e));
            }
        }
    };
    Ok(counted)
}

/// Unpacks object `key` of `store` into the workspace behind `executor`, committed only when the whole
/// archive was read, unpacked and its SHA-256 is `sha256`: otherwise SNAPSHOT_CORRUPT and nothing changes.
pub async fn restore(
    executor: &ExecutorClient,
    store: &dyn SnapshotStore,
    key: &str,
    sha256: &str,
) -> Result<()> {
    let object = store.get(key).await?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Chunk>(4);
    let expected = sha256.to_owned();
    let key_name = key.to_owned();
    // The producer: decompress, send chunks; the commit only after the checksum matched at the end.
    // Beside the upload in the same task (joined below): it ends when the upload stops taking chunks.
    let producer = async move {
        let mut decoder = ZstdDecoder::new(BufReader::new(Hashing::new(object)));
        let mut chunks = ReaderStream::with_capacity(&mut decoder, CHUNK);
        while let Some(chunk) = chunks.next().await {
            let data = chunk.map_err(|e| {
                Error::new(
                    Reason::SnapshotCorrupt,
                    format!("snapshot archive {key_name} cannot be unpacked: {e}"),
                )
            })?;
            if tx.send(Chunk::Data(data)).await.is_err() {
                // The upload ended first: its own error says why.
                return Ok(());
            }
        }
        drop(chunks);
        let actual = decoder.into_inner().into_inner().hex();
        if actual != expected {
            return Err(Error::new(
                Reason::SnapshotCorrupt,
                format!(
                    "snapshot archive {key_name} fails its checksum (SHA-256 {actual}, recorded {expected}): \
                     it was changed or damaged in the store"
                ),
            ));
        }
        let _ = tx.send(Chunk::Commit).await;
        Ok::<(), Error>(())
    };
    let (uploaded, produced) = tokio::join!(
        executor.upload(
            String::new(),
            tokio_stream::wrappers::ReceiverStream::new(rx)
        ),
        producer
    );
    // A corrupt archive explains the upload's failure (it ended without its commit).
    produced?;
    uploaded.map(|_| ())
}
