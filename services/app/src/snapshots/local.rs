//! The snapshot store on the embedded default: a folder of the data folder (`snapshots/`), one file per
//! archive, written beside its final name and renamed into place when complete.

use std::os::unix::fs::DirBuilderExt as _;
use std::path::PathBuf;

use mentis_core::{Error, Result};
use tokio::io::{AsyncRead, AsyncWriteExt as _};

use super::store::SnapshotStore;

#[derive(Debug)]
pub struct LocalStore {
    dir: PathBuf,
}

impl LocalStore {
    /// The store in `dir` (made when missing, private to this user like the rest of the data folder).
    pub fn open(dir: PathBuf) -> Result<Self> {
        // 0700 like the rest of the data folder, whatever the process's umask (a library user's).
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| {
                Error::internal(format!("snapshots: cannot make {}", dir.display())).with_source(e)
            })?;
        remove_parts(&dir);
        Ok(Self { dir })
    }

    fn path(&self, key: &str) -> Result<PathBuf> {
        // Keys are ours (snapshot ids), but a path is built from them: only plain names.
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        {
            return Err(Error::internal(format!(
                "snapshots: bad object key {key:?}"
            )));
        }
        Ok(self.dir.join(key))
    }
}

/// Removes what a stop in the middle of a `put` left (`<key>.part`, never renamed into place, with no record
/// naming it): at open, before anything writes there.
fn remove_parts(dir: &std::path::Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "part") {
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    tracing::info!(path = %path.display(), "snapshots: removed a partial archive an interrupted snapshot left")
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "snapshots: cannot remove a partial archive")
                }
            }
        }
    }
}

fn io_err(what: String) -> impl FnOnce(std::io::Error) -> Error {
    move |e| Error::internal(what).with_source(e)
}

#[async_trait::async_trait]
impl SnapshotStore for LocalStore {
    fn name(&self) -> &'static str {
        "local"
    }

    async fn put(&self, key: &str, body: &mut (dyn AsyncRead + Send + Unpin)) -> Result<u64> {
        let path = self.path(key)?;
        let part = path.with_extension("part");
        let written = async {
            let mut file = tokio::fs::File::create(&part)
                .await
                .map_err(io_err(format!(
                    "snapshots: cannot create {}",
                    part.display()
                )))?;
            let n = tokio::io::copy(body, &mut file)
                .await
                .map_err(io_err(format!("snapshots: writing {}", part.display())))?;
            file.flush()
                .await
                .map_err(io_err(format!("snapshots: writing {}", part.display())))?;
            file.sync_all()
                .await
                .map_err(io_err(format!("snapshots: syncing {}", part.display())))?;
            tokio::fs::rename(&part, &path)
                .await
                .map_err(io_err(format!("snapshots: renaming {}", part.display())))?;
            Ok::<_, Error>(n)
        }
        .await;
        if written.is_err() {
            let _ = tokio::fs::remove_file(&part).await;
        }
        written
    }

    async fn get(&self, key: &str) -> Result<Box<dyn AsyncRead + Send + Unpin>> {
        let path = self.path(key)?;
        let file = tokio::fs::File::open(&path).await.map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                Error::new(
                    mentis_core::Reason::SnapshotCorrupt,
                    format!("the snapshot's archive {key} is missing from the store"),
                )
            } else {
                Error::internal(format!("snapshots: cannot open {}", path.display())).with_source(e)
            }
        })?;
        Ok(Box::new(file))
    }

    async fn delete(&self, key: &str) -> Result<()> {
        let path = self.path(key)?;
        match tokio::fs::remove_file(&path).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(
                Error::internal(format!("snapshots: cannot delete {}", path.display()))
                    .with_source(e),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    #[test]
    fn opening_removes_the_partial_archives_an_interrupted_snapshot_left() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("snap-1.part"), b"half").unwrap();
        std::fs::write(dir.path().join("snap-2"), b"whole").unwrap();
        super::LocalStore::open(dir.path().to_owned()).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["snap-2"]);
    }
}
