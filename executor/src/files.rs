//! Workspace file operations, confined to the workspace root (see `path` for how and why).
//!
//! Every operation here is blocking (plain system calls on descriptors); the gRPC layer (`service`) runs
//! them with `spawn_blocking` and streams bulk data through bounded channels in chunks of [`CHUNK`] bytes,
//! so a large file is never held whole in memory.

mod info;
mod pages;
mod path;
mod pipe;
mod read;
pub(crate) mod service;
mod tar_in;
mod tar_out;
mod tree;
pub(crate) mod watch;
mod write;

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use mentis_proto::executor::{FileInfo, FileType};
use nix::errno::Errno;
use nix::fcntl::{AtFlags, RenameFlags, renameat2};
use nix::sys::stat::{Mode, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::config::Config;
use crate::error::Error;
pub(crate) use path::WsPath;
use path::{errno_error, walk};

/// Size of the chunks files and archives are streamed in.
pub(crate) const CHUNK: usize = 256 * 1024;
/// Chunks buffered between a blocking reader or writer and its gRPC stream.
pub(crate) const CHANNEL_CHUNKS: usize = 4;
/// EditFile reads the whole file: bound it.
pub(crate) const MAX_EDIT_BYTES: u64 = 64 * 1024 * 1024;

/// Default mode of files written without one.
const DEFAULT_FILE_MODE: u32 = 0o644;
/// Default mode of directories created without one.
const DEFAULT_DIR_MODE: u32 = 0o755;

/// The workspace, as file operations see it.
#[derive(Debug, Clone)]
pub(crate) struct Workspace {
    root: PathBuf,
    max_write_bytes: u64,
}

impl Workspace {
    pub(crate) fn new(config: &Config) -> Self {
        Self {
            root: config.workspace.clone(),
            max_write_bytes: config.max_write_bytes,
        }
    }

    /// Checks a request path (InvalidArgument when it leaves the workspace).
    pub(crate) fn parse(&self, raw: &str) -> Result<WsPath, Error> {
        WsPath::parse(&self.root, raw)
    }

    pub(crate) fn max_write_bytes(&self) -> u64 {
        self.max_write_bytes
    }

    fn open_root(&self) -> Result<OwnedFd, Error> {
        path::open_root(&self.root)
    }

    /// Describes one entry (links are described, not followed).
    pub(crate) fn stat(&self, p: &WsPath) -> Result<FileInfo, Error> {
        let root = self.open_root()?;
        match p.split_last() {
            None => info::stat_fd(&root, p),
            Some((parent, name)) => {
                let dir = walk(&root, parent, None, &p.display())?;
                info::stat_at(&dir.fd, name, p)
            }
        }
    }

    /// One page of a directory's entries, or of everything below it (`pages`).
    pub(crate) fn list(
        &self,
        p: &WsPath,
        page: pages::PageRequest<'_>,
    ) -> Result<pages::Page, Error> {
        let root = self.open_root()?;
        let dir = walk(&root, p.parts(), None, &p.display())?;
        pages::list(dir.fd, p, page)
    }

    /// Deletes a file, a link (not its target) or a directory (with its content only when `recursive`).
    pub(crate) fn delete(&self, p: &WsPath, recursive: bool) -> Result<(), Error> {
        let shown = p.display();
        let Some((parent, name)) = p.split_last() else {
            return Err(Error::InvalidArgument(
                "the workspace root itself cannot be deleted".to_owned(),
            ));
        };
        let root = self.open_root()?;
        let dir = walk(&root, parent, None, &shown)?;
        let st = fstatat(&dir.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| errno_error(e, &dir.fd, name, &shown))?;
        if info::file_type(&st) == FileType::Directory {
            if recursive {
                tree::remove_tree(&dir.fd, name, &shown)
            } else {
                unlinkat(&dir.fd, name, UnlinkatFlags::RemoveDir)
                    .map_err(|e| path::path_error(e, &shown))
            }
        } else {
            unlinkat(&dir.fd, name, UnlinkatFlags::NoRemoveDir)
                .map_err(|e| path::path_error(e, &shown))
        }
    }

    /// Moves or renames an entry in one rename(2): the destination's parent must exist; an existing
    /// destination is PathExists unless `overwrite`. Links are moved, not followed.
    pub(crate) fn rename(
        &self,
        from: &WsPath,
        to: &WsPath,
        overwrite: bool,
    ) -> Result<FileInfo, Error> {
        let (Some((from_parent, from_name)), Some((to_parent, to_name))) =
            (from.split_last(), to.split_last())
        else {
            return Err(Error::InvalidArgument(
                "the workspace root itself cannot be moved, nor anything moved onto it".to_owned(),
            ));
        };
        let (from_shown, to_shown) = (from.display(), to.display());
        if to.parts().starts_with(from.parts()) && to.parts().len() > from.parts().len() {
            return Err(Error::InvalidArgument(format!(
                "{from_shown:?} cannot be moved into itself ({to_shown:?})"
            )));
        }
        let root = self.open_root()?;
        let from_dir = walk(&root, from_parent, None, &from_shown)?;
        let to_dir = walk(&root, to_parent, None, &to_shown)?;
        // The source must be there: its error names it, not the destination.
        fstatat(&from_dir.fd, from_name, AtFlags::AT_SYMLINK_NOFOLLOW)
            .map_err(|e| errno_error(e, &from_dir.fd, from_name, &from_shown))?;
        let flags = if overwrite {
            RenameFlags::empty()
        } else {
            RenameFlags::RENAME_NOREPLACE
        };
        match renameat2(&from_dir.fd, from_name, &to_dir.fd, to_name, flags) {
            Ok(()) => {}
            // A file system without RENAME_NOREPLACE (some overlay and gVisor versions): check, then move.
            Err(Errno::EINVAL) if !overwrite => {
                match fstatat(&to_dir.fd, to_name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(_) => return Err(path::path_error(Errno::EEXIST, &to_shown)),
                    Err(Errno::ENOENT) => {}
                    Err(e) => return Err(errno_error(e, &to_dir.fd, to_name, &to_shown)),
                }
                renameat2(
                    &from_dir.fd,
                    from_name,
                    &to_dir.fd,
                    to_name,
                    RenameFlags::empty(),
                )
                .map_err(|e| path::path_error(e, &to_shown))?;
            }
            Err(Errno::EEXIST) if !overwrite => {
                return Err(Error::PathExists(format!(
                    "{to_shown:?} already exists (set overwrite to replace it)"
                )));
            }
            Err(Errno::ENOTEMPTY | Errno::EEXIST) => {
                return Err(Error::FailedPrecondition(format!(
                    "{to_shown:?} is a directory that is not empty: a move replaces only an empty one"
                )));
            }
            Err(Errno::EISDIR) => {
                return Err(Error::InvalidArgument(format!(
                    "{to_shown:?} is a directory: a file or link does not replace one"
                )));
            }
            Err(Errno::ENOTDIR) if overwrite => {
                return Err(Error::InvalidArgument(format!(
                    "a directory does not replace {to_shown:?}, which is not one (or a component of a \
                     path is not a directory)"
                )));
            }
            Err(e) => return Err(path::path_error(e, &to_shown)),
        }
        info::stat_at(&to_dir.fd, to_name, to)
    }

    /// Creates a directory and its missing parents (`mode` 0 = 0755); an existing directory is fine.
    pub(crate) fn make_dir(&self, p: &WsPath, mode: u32) -> Result<FileInfo, Error> {
        let root = self.open_root()?;
        let mode = dir_mode(mode)?;
        let dir = walk(&root, p.parts(), Some(mode), &p.display())?;
        info::stat_fd(&dir.fd, p)
    }
}

/// A file mode from a request: permission bits only (0 = the default).
fn file_mode(mode: u32) -> Result<Mode, Error> {
    request_mode(mode, DEFAULT_FILE_MODE)
}

fn dir_mode(mode: u32) -> Result<Mode, Error> {
    request_mode(mode, DEFAULT_DIR_MODE)
}

fn request_mode(mode: u32, default: u32) -> Result<Mode, Error> {
    let mode = if mode == 0 { default } else { mode };
    // Set-id bits make no sense in a sandbox: permission bits and sticky only.
    if mode & !0o1777 != 0 {
        return Err(Error::InvalidArgument(format!(
            "mode {mode:#o} has bits beyond the permission bits (0777) and sticky bit"
        )));
    }
    Ok(Mode::from_bits_truncate(mode))
}
