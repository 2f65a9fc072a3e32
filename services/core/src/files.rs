//! Workspace files as the control plane sees them (FileService; the executor's WorkspaceService): what a
//! file is, a page of a listing, what an edit and an unpacked archive did, and the chunks of a write.

use std::time::SystemTime;

use bytes::Bytes;

/// The type of a workspace entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileType {
    File,
    Directory,
    Symlink,
    /// Fifos, sockets, devices.
    Other,
}

/// One workspace entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileInfo {
    /// Relative to the workspace.
    pub path: String,
    pub file_type: FileType,
    pub size: u64,
    /// Permission bits.
    pub mode: u32,
    pub modified: Option<SystemTime>,
    /// Where a symlink points (empty for anything else).
    pub symlink_target: String,
}

/// What a listing asks for.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ListFiles {
    pub path: String,
    pub recursive: bool,
    /// 0: the executor's default.
    pub page_size: u32,
    /// The opaque token of the page before (empty: the first page).
    pub page_token: String,
}

/// One page of a listing.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FilePage {
    pub files: Vec<FileInfo>,
    /// The listing stopped at its bounds (more entries exist than were walked).
    pub truncated: bool,
    /// Empty on the last page.
    pub next_page_token: String,
}

/// A string replaced in a file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edit {
    pub path: String,
    pub old_string: String,
    pub new_string: String,
    pub replace_all: bool,
}

/// What an edit did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Edited {
    pub replacements: u32,
    pub file: Option<FileInfo>,
}

/// What an uploaded tar stream made.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Unpacked {
    pub files: u64,
    pub directories: u64,
    pub links: u64,
    pub bytes: u64,
}

/// A chunk of a write or an upload. The executor keeps what it received only after `Commit` and the clean
/// end of the chunks; a stream that ends without it writes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Chunk {
    Data(Bytes),
    Commit,
}

/// A watch to start (no `watch_id`) or to read again after `after_seq` (FileService.WatchFiles).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchFiles {
    pub path: String,
    pub recursive: bool,
    pub watch_id: Option<String>,
    pub after_seq: u64,
}

/// What happened to a path under a watched directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FileEventKind {
    Created,
    Modified,
    Removed,
    /// Events were lost, or a directory could not be followed: list the directory to catch up.
    Overflow,
}

/// One event of a watch.
#[derive(Debug, Clone, PartialEq)]
pub struct FileEvent {
    pub seq: u64,
    pub kind: FileEventKind,
    /// Relative to the workspace, as [`FileInfo::path`].
    pub path: String,
    pub is_dir: bool,
    pub time: Option<SystemTime>,
}

/// What a watch's stream carries.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchItem {
    /// First: the watch's id (to resume with) and its newest seq.
    Started {
        watch_id: String,
        last_seq: u64,
    },
    Event(FileEvent),
    /// Events after `after_seq` are gone; the stream goes on from `first_available_seq`.
    Gap {
        after_seq: u64,
        first_available_seq: u64,
    },
}
