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
mod write;

use std::os::fd::OwnedFd;
use std::path::PathBuf;

use mentis_proto::executor::{FileInfo, FileType};
use nix::fcntl::AtFlags;
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
