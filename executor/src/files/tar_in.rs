//! Upload: unpack a tar stream into a workspace directory, all or nothing.
//!
//! The tar crate only parses; every entry is written by us, relative to descriptors (see `path`), into a
//! fresh hidden staging directory inside the target. Entries that would leave it (absolute names, `..`,
//! links whose target climbs out, hard links to names outside the archive) or special files refuse the
//! whole upload. Only a complete, accepted archive is moved into the target (rename by rename, never
//! following a link that is already there); a refused or failed one is removed with its staging directory.
//! Complete means the whole stream was read and committed (see `pipe::Feed::End`), not only that the tar
//! reader met the end of the archive: that may come before the stream is cut.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};

use mentis_proto::executor::{FileType, UploadSummary};
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{Mode, fchmod, fstatat, mkdirat};
use nix::unistd::{UnlinkatFlags, linkat, symlinkat, unlinkat};
use tar::EntryType;

use super::path::{WsPath, open_dir_at, path_error, undo_created, walk};
use super::tree::{names, remove_tree};
use super::write::io_error;
use super::{Workspace, dir_mode, info};
use crate::error::Error;

impl Workspace {
    /// Unpacks the tar archive read from `archive` into the directory `target` (created when missing).
    /// Blocking.
    pub(crate) fn unpack(
        &self,
        target: &WsPath,
        mut archive: impl Read,
    ) -> Result<UploadSummary, Error> {
        let shown = target.display();
        let root = self.open_root()?;
        let walked = walk(&root, target.parts(), Some(dir_mode(0)?), &shown)?;
        let staging = format!(".mentis-upload-{}", uuid::Uuid::new_v4().simple());
        let staging = OsStr::new(&staging);
        let result = mkdirat(&walked.fd, staging, Mode::from_bits_truncate(0o700))
            .map_err(|e| path_error(e, &shown))
            .and_then(|()| open_dir_at(&walked.fd, staging).map_err(|e| path_error(e, &shown)))
            .and_then(|stage| {
                let summary = extract(&stage, &mut archive, self.max_write_bytes)?;
                // The tar reader stops at the end-of-archive blocks; the stream may still be cut after
                // them. Read on to its end, which is an error unless the stream ended and was committed.
                std::io::copy(&mut archive, &mut std::io::sink()).map_err(bad_archive)?;
                check_merge(&stage, &walked.fd, target)?;
                merge(&stage, &walked.fd, target)?;
                Ok(summary)
            });
        match result {
            Ok(summary) => {
                unlinkat(&walked.fd, staging, UnlinkatFlags::RemoveDir)
                    .map_err(|e| path_error(e, &shown))?;
                Ok(summary)
            }
            Err(e) => {
                if let Err(cleanup) = remove_tree(&walked.fd, staging, &shown)
                    && !matches!(cleanup, Error::PathNotFound(_))
                {
                    tracing::warn!(error = %cleanup, "cannot remove a refused upload's staging directory");
                }
                if let Some(first) = walked.first_created {
                    undo_created(&root, target.parts(), first);
                }
                Err(e)
            }
        }
    }
}

/// Writes every entry of the archive below `stage`.
fn extract(stage: &OwnedFd, archive: impl Read, limit: u64) -> Result<UploadSummary, Error> {
    let mut summary = UploadSummary::default();
    let mut archive = tar::Archive::new(archive);
    let entries = archive.entries().map_err(bad_archive)?;
    for entry in entries {
        let mut entry = entry.map_err(bad_archive)?;
        let raw = entry.path().map_err(bad_archive)?.into_owned();
        let shown = raw.display().to_string();
        let rel = WsPath::from_relative(&raw).map_err(|()| {
            Error::InvalidArgument(format!(
                "archive entry {shown:?} leaves the target directory (absolute or \"..\")"
            ))
        })?;
        let kind = entry.header().entry_type();
        let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
        match kind {
            EntryType::XGlobalHeader
            | EntryType::XHeader
            | EntryType::GNULongName
            | EntryType::GNULongLink => continue,
            _ if rel.is_root() => {
                if kind == EntryType::Directory {
                    continue;
                }
                return Err(Error::InvalidArgument(format!(
                    "archive entry {shown:?} has no name"
                )));
            }
            EntryType::Directory => {
                walk(stage, rel.parts(), Some(dir_mode(mode)?), &shown)?;
                summary.directories += 1;
            }
            EntryType::Regular | EntryType::Continuous | EntryType::GNUSparse => {
                let (dir, name) = parent_of(stage, &rel, &shown)?;
                replace_non_dir(&dir, name, &shown)?;
                let fd = openat(
                    &dir,
                    name,
                    OFlag::O_WRONLY
                        | OFlag::O_CREAT
                        | OFlag::O_EXCL
                        | OFlag::O_NOFOLLOW
                        | OFlag::O_CLOEXEC,
                    Mode::from_bits_truncate(0o600),
                )
                .map_err(|e| path_error(e, &shown))?;
                let mut file = std::fs::File::from(fd);
                // Count what is written, not what the header claims: sparse entries expand.
                let left = limit.saturating_sub(summary.bytes);
                let copied = std::io::copy(&mut (&mut entry).take(left + 1), &mut file)
                    .map_err(|e| io_error(e, &shown))?;
                if copied > left {
                    return Err(Error::TooLarge(format!(
                        "the archive unpacks to more than the cap of {limit} bytes \
                         (MENTIS_EXECUTOR_MAX_WRITE_BYTES); nothing was written"
                    )));
                }
                fchmod(&file, Mode::from_bits_truncate(mode)).map_err(|e| path_error(e, &shown))?;
                summary.bytes += copied;
                summary.files += 1;
            }
            EntryType::Symlink => {
                let target = entry
                    .link_name()
                    .map_err(bad_archive)?
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!("archive link {shown:?} has no target"))
                    })?
                    .into_owned();
                if !link_stays_inside(rel.parts().len() - 1, &target) {
                    return Err(Error::InvalidArgument(format!(
                        "archive link {shown:?} points outside the target directory ({})",
                        target.display()
                    )));
                }
                let (dir, name) = parent_of(stage, &rel, &shown)?;
                replace_non_dir(&dir, name, &shown)?;
                symlinkat(target.as_path(), &dir, name).map_err(|e| path_error(e, &shown))?;
                summary.links += 1;
            }
            EntryType::Link => {
                let target = entry
                    .link_name()
                    .map_err(bad_archive)?
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!("archive link {shown:?} has no target"))
                    })?
                    .into_owned();
                let old = WsPath::from_relative(&target)
                    .ok()
                    .filter(|p| !p.is_root())
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "archive hard link {shown:?} points outside the target directory ({})",
                            target.display()
                        ))
                    })?;
                let (old_dir, old_name) = parent_of_existing(stage, &old).map_err(|_| {
                    Error::InvalidArgument(format!(
                        "archive hard link {shown:?} points to {}, which is not earlier in the archive",
                        target.display()
                    ))
                })?;
                let (dir, name) = parent_of(stage, &rel, &shown)?;
                replace_non_dir(&dir, name, &shown)?;
                // No AT_SYMLINK_FOLLOW: a link to a symlink links the symlink itself.
                linkat(&old_dir, old_name, &dir, name, AtFlags::empty()).map_err(|_| {
                    Error::InvalidArgument(format!(
                        "archive hard link {shown:?} points to {}, which is not a file earlier in the archive",
                        target.display()
                    ))
                })?;
                summary.links += 1;
            }
            other => {
                return Err(Error::InvalidArgument(format!(
                    "archive entry {shown:?} is a {other:?}; only files, directories and links are accepted"
                )));
            }
        }
    }
    Ok(summary)
}

fn bad_archive(e: std::io::Error) -> Error {
    if e.kind() == std::io::ErrorKind::UnexpectedEof && e.to_string().contains("upload stream") {
        // The stream failed: the service reports why; this is what the unpacker saw.
        return Error::Unavailable("the upload stream ended before its end".to_owned());
    }
    Error::InvalidArgument(format!("not a valid tar archive: {e}"))
}

/// The directory (created when missing) holding `rel`, and `rel`'s last name.
fn parent_of<'a>(
    stage: &OwnedFd,
    rel: &'a WsPath,
    shown: &str,
) -> Result<(OwnedFd, &'a OsStr), Error> {
    let (parent, name) = rel
        .split_last()
        .ok_or_else(|| Error::InvalidArgument(format!("archive entry {shown:?} has no name")))?;
    let dir = walk(stage, parent, Some(dir_mode(0)?), shown)?;
    Ok((dir.fd, name))
}

fn parent_of_existing<'a>(stage: &OwnedFd, rel: &'a WsPath) -> Result<(OwnedFd, &'a OsStr), Error> {
    let (parent, name) = rel
        .split_last()
        .ok_or_else(|| Error::InvalidArgument("empty name".to_owned()))?;
    let dir = walk(stage, parent, None, &rel.display())?;
    Ok((dir.fd, name))
}

/// Removes an earlier entry of the same name (archives may repeat names; the last one wins). A directory
/// stays: replacing it with a file is refused.
fn replace_non_dir(dir: &OwnedFd, name: &OsStr, shown: &str) -> Result<(), Error> {
    match unlinkat(dir, name, UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(nix::errno::Errno::ENOENT) => Ok(()),
        Err(nix::errno::Errno::EISDIR | nix::errno::Errno::EPERM) => Err(Error::InvalidArgument(
            format!("archive entry {shown:?} replaces a directory of the same archive"),
        )),
        Err(e) => Err(path_error(e, shown)),
    }
}

/// Whether a symbolic link at depth `depth` (components of its directory below the target) with `target`
/// resolves inside the target directory, read lexically (links are never followed by us, but programs in
/// the sandbox will follow them).
fn link_stays_inside(depth: usize, target: &Path) -> bool {
    let mut depth = depth;
    for c in target.components() {
        match c {
            Component::Normal(_) => depth += 1,
            Component::CurDir => {}
            Component::ParentDir => match depth.checked_sub(1) {
                Some(d) => depth = d,
                None => return false,
            },
            Component::RootDir | Component::Prefix(_) => return false,
        }
    }
    true
}

/// Refuses (before anything moves) an archive that puts a non-directory where the target has a directory.
fn check_merge(src: &OwnedFd, dst: &OwnedFd, at: &WsPath) -> Result<(), Error> {
    for name in names(src, &at.display())? {
        let here = at.join(&name);
        let src_is_dir = is_dir_at(src, &name)?;
        let dst_kind = kind_at(dst, &name)?;
        match (src_is_dir, dst_kind) {
            (true, Some(FileType::Directory)) => {
                let s = open_dir_at(src, &name).map_err(|e| path_error(e, &here.display()))?;
                let d = open_dir_at(dst, &name).map_err(|e| path_error(e, &here.display()))?;
                check_merge(&s, &d, &here)?;
            }
            (false, Some(FileType::Directory)) => {
                return Err(Error::FailedPrecondition(format!(
                    "the archive has a file at {:?}, where the workspace has a directory; nothing was written",
                    here.display()
                )));
            }
            _ => {}
        }
    }
    Ok(())
}

/// Moves everything in `src` into `dst`: new names by rename, directories present on both sides merged,
/// other existing names replaced (a link is replaced, never followed).
fn merge(src: &OwnedFd, dst: &OwnedFd, at: &WsPath) -> Result<(), Error> {
    for name in names(src, &at.display())? {
        let here = at.join(&name);
        let shown = here.display();
        let src_is_dir = is_dir_at(src, &name)?;
        match (src_is_dir, kind_at(dst, &name)?) {
            (true, Some(FileType::Directory)) => {
                let s = open_dir_at(src, &name).map_err(|e| path_error(e, &shown))?;
                let d = open_dir_at(dst, &name).map_err(|e| path_error(e, &shown))?;
                merge(&s, &d, &here)?;
                unlinkat(src, name.as_os_str(), UnlinkatFlags::RemoveDir)
                    .map_err(|e| path_error(e, &shown))?;
            }
            (true, Some(_)) => {
                unlinkat(dst, name.as_os_str(), UnlinkatFlags::NoRemoveDir)
                    .map_err(|e| path_error(e, &shown))?;
                renameat(src, name.as_os_str(), dst, name.as_os_str())
                    .map_err(|e| path_error(e, &shown))?;
            }
            _ => renameat(src, name.as_os_str(), dst, name.as_os_str())
                .map_err(|e| path_error(e, &shown))?,
        }
    }
    Ok(())
}

fn is_dir_at(dir: impl AsFd, name: &OsStr) -> Result<bool, Error> {
    Ok(kind_at(dir, name)? == Some(FileType::Directory))
}

/// The type of `name` in `dir` (not following links), `None` when absent.
fn kind_at(dir: impl AsFd, name: &OsStr) -> Result<Option<FileType>, Error> {
    match fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(info::file_type(&st))),
        Err(nix::errno::Errno::ENOENT) => Ok(None),
        Err(e) => Err(path_error(e, &name.to_string_lossy())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_may_not_climb_out() {
        assert!(link_stays_inside(0, Path::new("a/b")));
        assert!(link_stays_inside(1, Path::new("../x")));
        assert!(link_stays_inside(0, Path::new("./x")));
        assert!(!link_stays_inside(0, Path::new("../x")));
        assert!(!link_stays_inside(1, Path::new("../../x")));
        assert!(!link_stays_inside(2, Path::new("/etc/passwd")));
        assert!(!link_stays_inside(0, Path::new("a/../../x")));
    }
}
