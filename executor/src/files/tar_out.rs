//! Download: write a workspace directory (or one file) as a tar stream, walking by descriptor and
//! archiving links as links.

use std::ffi::OsStr;
use std::io::{Read as _, Write};
use std::os::fd::OwnedFd;
use std::path::PathBuf;

use mentis_proto::executor::FileType;
use nix::fcntl::{OFlag, openat, readlinkat};
use nix::sys::stat::Mode;
use tar::{EntryType, Header};

use super::path::{WsPath, errno_error, open_dir_at, walk};
use super::tree::names;
use super::write::io_error;
use super::{Workspace, info};
use crate::error::Error;

/// How deep Download goes: a directory holds its descriptor while its subdirectories are archived, so a
/// deeper tree (thousands of levels are easy to make) would run out of descriptors midway. Refused instead,
/// naming where; real trees are far shallower (node_modules nests a few dozen levels).
pub(crate) const MAX_DOWNLOAD_DEPTH: usize = 128;

impl Workspace {
    /// Writes `p` as a tar archive to `out`, entry names relative to `p` (a file is archived under its
    /// own name). Blocking.
    pub(crate) fn archive(&self, p: &WsPath, out: impl Write) -> Result<(), Error> {
        let shown = p.display();
        let root = self.open_root()?;
        let mut builder = tar::Builder::new(out);
        match p.split_last() {
            None => add_dir_contents(&mut builder, &root, &PathBuf::new(), 0)?,
            Some((parent, name)) => {
                let dir = walk(&root, parent, None, &shown)?;
                let meta = info::stat_at(&dir.fd, name, p)?;
                if meta.r#type == FileType::Directory as i32 {
                    let sub = open_dir_at(&dir.fd, name)
                        .map_err(|e| errno_error(e, &dir.fd, name, &shown))?;
                    add_dir_contents(&mut builder, &sub, &PathBuf::new(), 0)?;
                } else {
                    add_entry(&mut builder, &dir.fd, name, &PathBuf::from(name), 0)?;
                }
            }
        }
        let mut out = builder.into_inner().map_err(|e| io_error(e, &shown))?;
        out.flush().map_err(|e| io_error(e, &shown))
    }
}

/// Adds every entry below `dir` (whose archive name is `prefix`, `depth` levels below the archived
/// directory), depth first.
fn add_dir_contents<W: Write>(
    builder: &mut tar::Builder<W>,
    dir: &OwnedFd,
    prefix: &std::path::Path,
    depth: usize,
) -> Result<(), Error> {
    if depth >= MAX_DOWNLOAD_DEPTH {
        let shown = prefix.display().to_string();
        let mut at: String = shown.chars().take(120).collect();
        if at.len() < shown.len() {
            at.push('…');
        }
        return Err(Error::FailedPrecondition(format!(
            "the directory tree is deeper than {MAX_DOWNLOAD_DEPTH} levels (at {at:?}); download a \
             subdirectory, or pack it in the sandbox (tar) and read the file"
        )));
    }
    let mut entries = names(dir, &prefix.display().to_string())?;
    entries.sort();
    for name in entries {
        add_entry(builder, dir, &name, &prefix.join(&name), depth)?;
    }
    Ok(())
}

/// Adds the entry `name` of `dir` as `archived`; directories with their content.
fn add_entry<W: Write>(
    builder: &mut tar::Builder<W>,
    dir: &OwnedFd,
    name: &OsStr,
    archived: &std::path::Path,
    depth: usize,
) -> Result<(), Error> {
    let shown = archived.display().to_string();
    let meta = match info::stat_at(dir, name, &WsPath::root()) {
        Ok(m) => m,
        // Removed while we archive: leave it out.
        Err(Error::PathNotFound(_)) => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut header = Header::new_gnu();
    header.set_mode(meta.mode);
    header.set_mtime(u64::try_from(meta.modify_time.map_or(0, |t| t.seconds)).unwrap_or(0));
    let io = |e: std::io::Error| io_error(e, &shown);
    match FileType::try_from(meta.r#type).unwrap_or(FileType::Other) {
        FileType::Directory => {
            header.set_entry_type(EntryType::Directory);
            header.set_size(0);
            builder
                .append_data(&mut header, archived, std::io::empty())
                .map_err(io)?;
            let sub = match open_dir_at(dir, name) {
                Ok(sub) => sub,
                // Swapped for something else since the stat: leave it out rather than follow it.
                Err(_) => return Ok(()),
            };
            add_dir_contents(builder, &sub, archived, depth + 1)
        }
        FileType::File => {
            let fd = match openat(
                dir,
                name,
                OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(nix::errno::Errno::ENOENT | nix::errno::Errno::ELOOP) => return Ok(()),
                Err(e) => return Err(errno_error(e, dir, name, &shown)),
            };
            let file = std::fs::File::from(fd);
            // The size read now is the size archived: a file that grows or shrinks meanwhile is cut or
            // padded with zeros, so the archive stays well-formed.
            let size = file.metadata().map_err(io)?.len();
            header.set_entry_type(EntryType::Regular);
            header.set_size(size);
            let body = file.take(size).chain(std::io::repeat(0)).take(size);
            builder.append_data(&mut header, archived, body).map_err(io)
        }
        FileType::Symlink => {
            let target = readlinkat(dir, name).map_err(|e| errno_error(e, dir, name, &shown))?;
            header.set_entry_type(EntryType::Symlink);
            header.set_size(0);
            builder
                .append_link(&mut header, archived, PathBuf::from(target))
                .map_err(io)
        }
        // Fifos, sockets and devices have no content to carry.
        FileType::Other | FileType::Unspecified => Ok(()),
    }
}
