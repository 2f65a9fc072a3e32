//! Descriptions of workspace entries (`FileInfo`), read without following links.

use std::ffi::OsStr;
use std::os::fd::AsFd;

use mentis_proto::executor::{FileInfo, FileType};
use nix::fcntl::{AtFlags, readlinkat};
use nix::sys::stat::{FileStat, SFlag, fstat, fstatat};

use super::path::{WsPath, errno_error};
use crate::error::Error;

/// The type of a stat result.
pub(crate) fn file_type(st: &FileStat) -> FileType {
    let fmt = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
    if fmt == SFlag::S_IFREG {
        FileType::File
    } else if fmt == SFlag::S_IFDIR {
        FileType::Directory
    } else if fmt == SFlag::S_IFLNK {
        FileType::Symlink
    } else {
        FileType::Other
    }
}

/// Describes a stat result found at `path`; `link_target` for symbolic links.
pub(crate) fn from_stat(path: &WsPath, st: &FileStat, link_target: String) -> FileInfo {
    FileInfo {
        path: path.display(),
        r#type: file_type(st) as i32,
        size: u64::try_from(st.st_size).unwrap_or(0),
        mode: st.st_mode & 0o7777,
        modify_time: Some(prost_types::Timestamp {
            seconds: st.st_mtime,
            nanos: i32::try_from(st.st_mtime_nsec).unwrap_or(0),
        }),
        symlink_target: link_target,
    }
}

/// Describes the entry `name` of `dir` (a link is described, not followed).
pub(crate) fn stat_at(dir: impl AsFd, name: &OsStr, path: &WsPath) -> Result<FileInfo, Error> {
    let shown = path.display();
    let st = fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
        .map_err(|e| errno_error(e, dir.as_fd(), name, &shown))?;
    let target = if file_type(&st) == FileType::Symlink {
        readlinkat(dir.as_fd(), name)
            .map(|t| t.to_string_lossy().into_owned())
            .unwrap_or_default()
    } else {
        String::new()
    };
    Ok(from_stat(path, &st, target))
}

/// Describes an open file or directory.
pub(crate) fn stat_fd(fd: impl AsFd, path: &WsPath) -> Result<FileInfo, Error> {
    let st = fstat(fd).map_err(|e| super::path::path_error(e, &path.display()))?;
    Ok(from_stat(path, &st, String::new()))
}
