//! The data folder (`MENTIS_DATA_DIR`) is private to the runtime's user: the folder and every folder under it
//! 0700, every file 0600. The store, the key, the admin key, the observation journals and the disk images
//! live there, and the host reaches every executor, so a folder others could read would hand them the
//! sandboxes (docs/ARCHITECTURE.md, "Security model"). Checked and fixed at start ([`secure`]); what the
//! runtime makes later is made private by [`create_dir`] and [`file_options`] (and the binary's umask, 0077).

use std::fs::{DirBuilder, OpenOptions};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use mentis_core::{Error, Result};

/// Mode of the folders under the data folder.
pub const DIR_MODE: u32 = 0o700;
/// Mode of the files under the data folder.
pub const FILE_MODE: u32 = 0o600;

/// Creates `dir` and its missing parents, each 0700.
pub fn create_dir(dir: &Path) -> io::Result<()> {
    DirBuilder::new().recursive(true).mode(DIR_MODE).create(dir)
}

/// Options that create a missing file 0600 (an existing file keeps its mode: [`secure`] fixed it at start).
pub fn file_options() -> OpenOptions {
    let mut o = OpenOptions::new();
    o.mode(FILE_MODE);
    o
}

/// Creates the data folder `dir` when missing and makes it and everything under it private to this user:
/// what others could read, write or enter loses those bits, with a warning naming it. Symbolic links are
/// left alone (a disk image's device link points into `/dev`). A mode that cannot be fixed stops the start.
/// Returns what was fixed.
pub fn secure(dir: &Path) -> Result<Vec<PathBuf>> {
    let fail = |path: &Path, e: io::Error| {
        Error::internal(format!(
            "cannot make {} private to the runtime's user",
            path.display()
        ))
        .with_source(e)
    };
    create_dir(dir).map_err(|e| fail(dir, e))?;
    let mut fixed = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(path) = todo.pop() {
        let meta = std::fs::symlink_metadata(&path).map_err(|e| fail(&path, e))?;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.mode() & 0o7777;
        if meta.is_dir() {
            for entry in std::fs::read_dir(&path).map_err(|e| fail(&path, e))? {
                todo.push(entry.map_err(|e| fail(&path, e))?.path());
            }
        }
        if mode & 0o077 != 0 {
            // Only the owner's bits stay (a folder keeps rwx, a file rw and x if it had it).
            let private = if meta.is_dir() {
                DIR_MODE
            } else {
                mode & 0o700
            };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(private))
                .map_err(|e| fail(&path, e))?;
            tracing::warn!(
                path = %path.display(),
                was = format!("{mode:04o}"),
                now = format!("{private:04o}"),
                "made a path in the data folder private to the runtime's user (it was open to others)"
            );
            fixed.push(path);
        }
    }
    Ok(fixed)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn wider_modes_are_fixed_and_private_ones_and_links_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("data");
        std::fs::create_dir_all(dir.join("logs/a")).unwrap();
        for (p, m) in [("", 0o755), ("logs", 0o777), ("logs/a", 0o700)] {
            std::fs::set_permissions(dir.join(p), std::fs::Permissions::from_mode(m)).unwrap();
        }
        for (p, m) in [
            ("mentis.db", 0o644),
            ("mentis.db-wal", 0o666),
            ("logs/a/seg", 0o640),
            ("tool", 0o755),
            ("admin.key", 0o600),
        ] {
            std::fs::write(dir.join(p), b"x").unwrap();
            std::fs::set_permissions(dir.join(p), std::fs::Permissions::from_mode(m)).unwrap();
        }
        let outside = root.path().join("outside");
        std::fs::write(&outside, b"x").unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::symlink(&outside, dir.join("link")).unwrap();

        let mut fixed = secure(&dir).unwrap();
        fixed.sort();
        let mut want: Vec<PathBuf> = [
            "",
            "logs",
            "logs/a/seg",
            "mentis.db",
            "mentis.db-wal",
            "tool",
        ]
        .iter()
        .map(|p| {
            if p.is_empty() {
                dir.clone()
            } else {
                dir.join(p)
            }
        })
        .collect();
        want.sort();
        assert_eq!(fixed, want);
        for (p, m) in [
            ("", 0o700),
            ("logs", 0o700),
            ("logs/a", 0o700),
            ("mentis.db", 0o600),
            ("mentis.db-wal", 0o600),
            ("logs/a/seg", 0o600),
            ("tool", 0o700),
            ("admin.key", 0o600),
        ] {
            assert_eq!(mode(&dir.join(p)), m, "{p}");
        }
        assert_eq!(mode(&outside), 0o644, "a link's target is not touched");
        assert!(
            secure(&dir).unwrap().is_empty(),
            "nothing to fix the second time"
        );
    }

    #[test]
    fn a_missing_folder_is_made_private() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        assert!(secure(&dir).unwrap().is_empty());
        assert_eq!(mode(&dir), 0o700);
        let f = dir.join("f");
        file_options()
            .write(true)
            .create_new(true)
            .open(&f)
            .unwrap();
        assert_eq!(mode(&f), 0o600);
    }
}
