//! Walking directory trees by descriptor: reading names and recursive removal, never following links.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;

use nix::dir::Dir;
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::path::{open_dir_at, path_error};
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
