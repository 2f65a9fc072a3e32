//! ReadFile: open a regular file without following links, then stream a byte range of it in chunks.

use std::io::{Read as _, Seek as _, SeekFrom};

use bytes::{Bytes, BytesMut};
use mentis_proto::executor::{FileInfo, FileType};
use nix::fcntl::{OFlag, openat};
use nix::sys::stat::Mode;
use tokio::sync::mpsc;

use super::path::{WsPath, errno_error, walk};
use super::write::io_error;
use super::{CHUNK, Workspace, info};
use crate::error::Error;

impl Workspace {
    /// Opens a regular file for reading; a link, a directory or a special file is InvalidArgument.
    pub(crate) fn open_read(&self, p: &WsPath) -> Result<(std::fs::File, FileInfo), Error> {
        let shown = p.display();
        let Some((parent, name)) = p.split_last() else {
            return Err(Error::InvalidArgument(
                "the workspace root is a directory, not a file".to_owned(),
            ));
        };
        let root = self.open_root()?;
        let dir = walk(&root, parent, None, &shown)?;
        // O_NONBLOCK: opening a fifo for reading would otherwise wait for a writer forever. It does not
        // change reads of regular files, the only kind we go on with.
        let fd = openat(
            &dir.fd,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| errno_error(e, &dir.fd, name, &shown))?;
        let meta = info::stat_fd(&fd, p)?;
        if meta.r#type != FileType::File as i32 {
            return Err(Error::InvalidArgument(format!(
                "{shown:?} is not a regular file"
            )));
        }
        Ok((std::fs::File::from(fd), meta))
    }
}

/// Sends `length` bytes (0 = to the end) of `file` from `offset` to `tx` in chunks of at most [`CHUNK`].
/// Blocking: run it on a blocking thread. Stops early when the receiver is gone.
pub(crate) fn send_range(
    mut file: std::fs::File,
    shown: &str,
    offset: u64,
    length: u64,
    tx: &mpsc::Sender<Result<Bytes, Error>>,
) {
    // Past the end reads nothing (the API's contract), also past what lseek takes (2^63 - 1).
    match file.metadata() {
        Ok(meta) if offset >= meta.len() && meta.is_file() => return,
        _ => {}
    }
    if let Err(e) = file.seek(SeekFrom::Start(offset)) {
        let _ = tx.blocking_send(Err(io_error(e, shown)));
        return;
    }
    let mut left = if length == 0 { u64::MAX } else { length };
    while left > 0 {
        let want = usize::try_from(left.min(CHUNK as u64)).unwrap_or(CHUNK);
        let mut buf = BytesMut::zeroed(want);
        let n = match file.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let _ = tx.blocking_send(Err(io_error(e, shown)));
                return;
            }
        };
        buf.truncate(n);
        left -= n as u64;
        if tx.blocking_send(Ok(buf.freeze())).is_err() {
            return;
        }
    }
}
