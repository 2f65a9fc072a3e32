//! Atomic writes: a temporary file beside the target, renamed over it only when complete; and EditFile,
//! which is a read, a replace and such a write.

use std::ffi::{OsStr, OsString};
use std::io::{Read as _, Write as _};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStringExt as _;

use mentis_proto::executor::{FileInfo, FileType};
use nix::fcntl::{AtFlags, OFlag, openat, renameat};
use nix::sys::stat::{Mode, fchmod, fstatat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use super::path::{WsPath, errno_error, name_bytes, path_error, undo_created, walk};
use super::{CHUNK, MAX_EDIT_BYTES, Workspace, dir_mode, file_mode, info};
use crate::error::Error;

/// A file being written: the temporary file, its directory and the name it will take. Dropped without
/// [`AtomicFile::commit`], it removes the temporary file (and the directories it created), so a failed or
/// cancelled write leaves nothing behind and the old file untouched.
pub(crate) struct AtomicFile {
    root: OwnedFd,
    dir: OwnedFd,
    created_parents: Option<(WsPath, usize)>,
    temp: OsString,
    name: OsString,
    path: WsPath,
    file: Option<std::fs::File>,
    mode: Mode,
    written: u64,
    limit: u64,
}

impl Workspace {
    /// Starts an atomic write of `p` (`mode` 0 = 0644), creating missing parent directories.
    pub(crate) fn create_atomic(&self, p: &WsPath, mode: u32) -> Result<AtomicFile, Error> {
        let shown = p.display();
        let Some((parent, name)) = p.split_last() else {
            return Err(Error::InvalidArgument(
                "the workspace root is a directory, not a file".to_owned(),
            ));
        };
        let mode = file_mode(mode)?;
        let root = self.open_root()?;
        let walked = walk(&root, parent, Some(dir_mode(0)?), &shown)?;
        let created_parents = walked
            .first_created
            .map(|i| (WsPath::from_parts(parent), i));
        // Refuse (before writing anything) what the rename would do wrong: replace a link (whose target the
        // caller may have meant) or fail late on a directory.
        let refusal = match fstatat(&walked.fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => match info::file_type(&st) {
                FileType::Symlink => Some(Error::InvalidArgument(format!(
                    "{shown:?} is a symbolic link; links are not followed"
                ))),
                FileType::Directory => {
                    Some(Error::InvalidArgument(format!("{shown:?} is a directory")))
                }
                _ => None,
            },
            Err(nix::errno::Errno::ENOENT) => None,
            Err(e) => Some(errno_error(e, &walked.fd, name, &shown)),
        };
        if let Some(e) = refusal {
            if let Some((parts, first)) = &created_parents {
                undo_created(&root, parts.parts(), *first);
            }
            return Err(e);
        }
        let temp = temp_name(name);
        let fd = match openat(
            &walked.fd,
            temp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        ) {
            Ok(fd) => fd,
            Err(e) => {
                if let Some((parts, first)) = &created_parents {
                    undo_created(&root, parts.parts(), *first);
                }
                return Err(path_error(e, &shown));
            }
        };
        Ok(AtomicFile {
            root,
            dir: walked.fd,
            created_parents,
            temp,
            name: name.to_owned(),
            path: p.clone(),
            file: Some(std::fs::File::from(fd)),
            mode,
            written: 0,
            limit: self.max_write_bytes,
        })
    }

    /// Replaces `old` by `new` in `p` (once, or everywhere with `all`); returns the count and the new info.
    pub(crate) fn edit(
        &self,
        p: &WsPath,
        old: &str,
        new: &str,
        all: bool,
    ) -> Result<(u32, FileInfo), Error> {
        if old.is_empty() {
            return Err(Error::InvalidArgument(
                "old_string must not be empty".to_owned(),
            ));
        }
        let shown = p.display();
        let (mut file, before) = self.open_read(p)?;
        if before.size > MAX_EDIT_BYTES {
            return Err(Error::TooLarge(format!(
                "{shown:?} has {} bytes; EditFile works on files up to {MAX_EDIT_BYTES} bytes",
                before.size
            )));
        }
        let mut content = Vec::new();
        (&mut file)
            .take(MAX_EDIT_BYTES + 1)
            .read_to_end(&mut content)
            .map_err(|source| Error::Io {
                context: format!("reading {shown:?}"),
                source,
            })?;
        let found = count(&content, old.as_bytes());
        if found == 0 {
            return Err(Error::FailedPrecondition(format!(
                "old_string was not found in {shown:?}; the file is unchanged"
            )));
        }
        if found > 1 && !all {
            return Err(Error::FailedPrecondition(format!(
                "old_string occurs {found} times in {shown:?}; give more context to make it unique, \
                 or set replace_all; the file is unchanged"
            )));
        }
        // The result's size is known before anything is built: past the write cap, refuse with the file
        // unchanged (a 3 MB file whose every byte becomes a thousand would otherwise be built whole in
        // memory, and the OOM killer would take the sandbox's processes).
        let size = result_size(content.len(), found, old.len(), new.len());
        if size.is_none_or(|size| size > self.max_write_bytes) {
            return Err(Error::TooLarge(format!(
                "editing {shown:?} would make it {} bytes, over the cap of {} bytes per write \
                 (MENTIS_EXECUTOR_MAX_WRITE_BYTES); the file is unchanged",
                size.map_or_else(|| "more than 2^64".to_owned(), |s| s.to_string()),
                self.max_write_bytes
            )));
        }
        // Streamed into the new file through one chunk-sized buffer: memory holds the old content and a
        // chunk, never a second copy of the file.
        let mut out = self.create_atomic(p, before.mode & 0o1777)?;
        let mut buffer = Vec::with_capacity(CHUNK);
        replace_into(&content, old.as_bytes(), new.as_bytes(), |piece| {
            if buffer.len() + piece.len() > CHUNK && !buffer.is_empty() {
                out.write(&buffer)?;
                buffer.clear();
            }
            if piece.len() >= CHUNK {
                out.write(piece)
            } else {
                buffer.extend_from_slice(piece);
                Ok(())
            }
        })?;
        out.write(&buffer)?;
        let info = out.commit()?;
        Ok((u32::try_from(found).unwrap_or(u32::MAX), info))
    }
}

impl AtomicFile {
    /// Appends bytes; TooLarge (and, once dropped, nothing on disk) past the size cap.
    pub(crate) fn write(&mut self, data: &[u8]) -> Result<(), Error> {
        self.written = self.written.saturating_add(data.len() as u64);
        if self.written > self.limit {
            return Err(Error::TooLarge(format!(
                "{:?} would exceed the cap of {} bytes per write (MENTIS_EXECUTOR_MAX_WRITE_BYTES); \
                 nothing was written",
                self.path.display(),
                self.limit
            )));
        }
        let Some(file) = self.file.as_mut() else {
            return Err(Error::FailedPrecondition(
                "the write is finished".to_owned(),
            ));
        };
        file.write_all(data)
            .map_err(|e| io_error(e, &self.path.display()))
    }

    /// Sets the mode, flushes to disk and renames the temporary file over the target.
    pub(crate) fn commit(mut self) -> Result<FileInfo, Error> {
        let shown = self.path.display();
        let Some(file) = self.file.take() else {
            return Err(Error::FailedPrecondition(
                "the write is finished".to_owned(),
            ));
        };
        // Explicit, because the create mode was narrowed by the umask and by our 0600.
        fchmod(&file, self.mode).map_err(|e| path_error(e, &shown))?;
        // Durable before visible: after a crash the target is the old file or the complete new one.
        file.sync_all().map_err(|e| io_error(e, &shown))?;
        drop(file);
        renameat(
            &self.dir,
            self.temp.as_os_str(),
            &self.dir,
            self.name.as_os_str(),
        )
        .map_err(|e| path_error(e, &shown))?;
        // Committed: nothing for Drop to clean up.
        self.temp.clear();
        self.created_parents = None;
        info::stat_at(&self.dir, &self.name, &self.path)
    }
}

impl Drop for AtomicFile {
    fn drop(&mut self) {
        if self.temp.is_empty() {
            return;
        }
        self.file.take();
        let _ = unlinkat(&self.dir, self.temp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        if let Some((parts, first)) = &self.created_parents {
            undo_created(&self.root, parts.parts(), *first);
        }
    }
}

/// A hidden, unique name beside `name`.
pub(crate) fn temp_name(name: &OsStr) -> OsString {
    let mut bytes = b".".to_vec();
    // Keep it under NAME_MAX (255) whatever the target's length.
    bytes.extend(name_bytes(name).iter().take(160));
    bytes.extend(format!(".mentis-tmp-{}", uuid::Uuid::new_v4().simple()).as_bytes());
    OsString::from_vec(bytes)
}

/// An I/O error while writing or reading `shown`.
pub(crate) fn io_error(e: std::io::Error, shown: &str) -> Error {
    match e.raw_os_error() {
        Some(code) => path_error(nix::errno::Errno::from_raw(code), shown),
        None => Error::Io {
            context: format!("file I/O on {shown:?}"),
            source: e,
        },
    }
}

/// Non-overlapping occurrences of `needle` (not empty) in `hay`.
fn count(hay: &[u8], needle: &[u8]) -> usize {
    let mut n = 0;
    let mut i = 0;
    while let Some(at) = find(&hay[i..], needle) {
        n += 1;
        i += at + needle.len();
    }
    n
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// The size of `len` bytes once `found` occurrences of `old_len` bytes become `new_len` bytes; None past
/// u64.
fn result_size(len: usize, found: usize, old_len: usize, new_len: usize) -> Option<u64> {
    let (len, found) = (len as u64, found as u64);
    let removed = found.checked_mul(old_len as u64)?;
    let added = found.checked_mul(new_len as u64)?;
    len.checked_sub(removed)?.checked_add(added)
}

/// `hay` with every non-overlapping occurrence of `needle` replaced by `with`, handed to `sink` piece by
/// piece (the first error stops it).
fn replace_into(
    hay: &[u8],
    needle: &[u8],
    with: &[u8],
    mut sink: impl FnMut(&[u8]) -> Result<(), Error>,
) -> Result<(), Error> {
    let mut i = 0;
    while let Some(at) = find(&hay[i..], needle) {
        sink(&hay[i..i + at])?;
        sink(with)?;
        i += at + needle.len();
    }
    sink(&hay[i..])
}

#[cfg(test)]
fn replace(hay: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    replace_into(hay, needle, with, |piece| {
        out.extend_from_slice(piece);
        Ok(())
    })
    .ok();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_and_replace_are_non_overlapping() {
        assert_eq!(count(b"aaaa", b"aa"), 2);
        assert_eq!(count(b"abc", b"x"), 0);
        assert_eq!(replace(b"a-b-c", b"-", b"+="), b"a+=b+=c".to_vec());
        assert_eq!(replace(b"aaa", b"aa", b"b"), b"ba".to_vec());
        assert_eq!(result_size(5, 2, 1, 2), Some(7));
        assert_eq!(result_size(3, 1, 2, 1), Some(2));
        assert_eq!(
            result_size(3_000_000, 3_000_000, 1, 1000),
            Some(3_000_000_000)
        );
        assert_eq!(result_size(usize::MAX, usize::MAX, 1, usize::MAX), None);
    }

    #[test]
    fn temp_names_are_hidden_unique_and_short() {
        let long = OsString::from("x".repeat(255));
        let t = temp_name(&long);
        assert!(t.len() < 255);
        assert!(name_bytes(&t).starts_with(b"."));
        assert_ne!(temp_name(&long), t);
    }
}
