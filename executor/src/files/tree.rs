//! Walking directory trees by descriptor: listing and recursive removal, never following links.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;

use mentis_proto::api::{FileInfo, FileType};
use nix::dir::Dir;
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::info;
use super::path::{WsPath, open_dir_at, path_error};
use crate::error::Error;

/// The names in a directory (without `.` and `..`), read from a duplicate of `dir`.
pub(crate) fn names(dir: &OwnedFd, shown: &str) -> Result<Vec<OsString>, Error> {
    let dup = dir.try_clone().map_err(|source| Error::Io {
        context: format!("duplicating the descriptor of {shown:?}"),
        source,
    })?;
    let mut d = Dir::from_fd(dup).map_err(|e| path_error(e, shown))?;
    let mut out = Vec::new();
    for entry in d.iter() {
        let entry = entry.map_err(|e| path_error(e, shown))?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            out.push(OsStr::from_bytes(name).to_owned());
        }
    }
    Ok(out)
}

/// Appends the entries below `dir` (at `path`) to `out`, descending when `recursive`. Returns true when it
/// stopped at `limit` entries.
pub(crate) fn list(
    dir: OwnedFd,
    path: &WsPath,
    recursive: bool,
    limit: usize,
    out: &mut Vec<FileInfo>,
) -> Result<bool, Error> {
    // Depth-first with an explicit stack: a deep tree cannot overflow ours.
    let mut stack = vec![(dir, path.clone())];
    while let Some((fd, at)) = stack.pop() {
        for name in names(&fd, &at.display())? {
            if out.len() >= limit {
                return Ok(true);
            }
            let child = at.join(&name);
            let entry = match info::stat_at(&fd, &name, &child) {
                Ok(entry) => entry,
                // Removed while we list: not an error, just not there.
                Err(Error::PathNotFound(_)) => continue,
                Err(e) => return Err(e),
            };
            let is_dir = entry.r#type == FileType::Directory as i32;
            out.push(entry);
            if recursive && is_dir {
                match open_dir_at(&fd, &name) {
                    Ok(sub) => stack.push((sub, child)),
                    // Swapped for something else since the stat: skip it rather than follow it.
                    Err(_) => continue,
                }
            }
        }
    }
    Ok(false)
}

/// Removes the directory `name` of `parent` with everything in it, without following links.
pub(crate) fn remove_tree(parent: impl AsFd, name: &OsStr, shown: &str) -> Result<(), Error> {
    let dir = open_dir_at(parent.as_fd(), name).map_err(|e| path_error(e, shown))?;
    for child in names(&dir, shown)? {
        match unlinkat(&dir, child.as_os_str(), UnlinkatFlags::NoRemoveDir) {
            Ok(()) => {}
            // A directory (EISDIR on Linux, EPERM by POSIX): empty it first.
            Err(nix::errno::Errno::EISDIR | nix::errno::Errno::EPERM) => {
                remove_tree(&dir, &child, shown)?;
            }
            Err(nix::errno::Errno::ENOENT) => {}
            Err(e) => return Err(path_error(e, shown)),
        }
    }
    unlinkat(parent, name, UnlinkatFlags::RemoveDir).map_err(|e| path_error(e, shown))
}
