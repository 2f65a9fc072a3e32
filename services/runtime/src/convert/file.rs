//! Workspace files: domain → public proto.

use mentis_core::files::{FileInfo, FileType, Unpacked};
use mentis_proto::api;

use super::timestamp;

pub fn file_to_proto(f: FileInfo) -> api::FileInfo {
    let file_type = match f.file_type {
        FileType::File => api::FileType::File,
        FileType::Directory => api::FileType::Directory,
        FileType::Symlink => api::FileType::Symlink,
        FileType::Other => api::FileType::Other,
    };
    api::FileInfo {
        path: f.path,
        r#type: file_type as i32,
        size: f.size,
        mode: f.mode,
        modify_time: f.modified.map(timestamp),
        symlink_target: f.symlink_target,
    }
}

pub fn unpacked_to_proto(u: Unpacked) -> api::UploadResponse {
    api::UploadResponse {
        files: u.files,
        directories: u.directories,
        links: u.links,
        bytes: u.bytes,
    }
}
