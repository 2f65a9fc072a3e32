//! WorkspaceService: confinement (traversal, links, tar entries), atomic writes, ranges, listing, edits,
//! the size cap; always checking what is (and is not) on disk afterwards.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;

use bytes::Bytes;
use mentis_proto::executor::FileType;
use mentis_proto::executor::workspace_service_client::WorkspaceServiceClient;
use mentis_proto::executor::{
    DeleteFileRequest, DownloadRequest, EditFileRequest, ListFilesRequest, MakeDirectoryRequest,
    MoveFileRequest, ReadFileRequest, StatFileRequest, UploadHeader, UploadRequest,
    WriteFileHeader, WriteFileRequest, upload_request, write_file_request,
};
use tonic::Code;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::support::*;

mod cut;
mod pages;

pub(super) type Files = WorkspaceServiceClient<InterceptedService<Channel, AddToken>>;

pub(super) async fn files(executor: &TestExecutor) -> Files {
    WorkspaceServiceClient::with_interceptor(executor.channel().await, AddToken::bearer(TOKEN))
}

/// A whole write, as the runtime sends it: the header, the chunks, then an empty data message that
/// commits.
async fn write(client: &mut Files, path: &str, chunks: Vec<Vec<u8>>) -> Result<(), tonic::Status> {
    let mut messages = vec![WriteFileRequest {
        kind: Some(write_file_request::Kind::Header(WriteFileHeader {
            path: path.to_owned(),
            mode: 0,
        })),
        commit: false,
    }];
    messages.extend(chunks.into_iter().map(|c| WriteFileRequest {
        kind: Some(write_file_request::Kind::Data(Bytes::from(c))),
        commit: false,
    }));
    messages.push(WriteFileRequest {
        kind: Some(write_file_request::Kind::Data(Bytes::new())),
        commit: true,
    });
    client
        .write_file(futures::stream::iter(messages))
        .await
        .map(drop)
}

async fn read(
    client: &mut Files,
    path: &str,
    offset: u64,
    length: u64,
) -> Result<Vec<u8>, tonic::Status> {
    let mut stream = client
        .read_file(ReadFileRequest {
            path: path.to_owned(),
            offset,
            length,
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await? {
        assert!(chunk.data.len() <= 256 * 1024, "chunks are bounded");
        out.extend_from_slice(&chunk.data);
    }
    Ok(out)
}

/// A whole upload, as the runtime sends it: the header, the archive in chunks, then an empty data message
/// that commits.
async fn upload(client: &mut Files, path: &str, archive: Vec<u8>) -> Result<(), tonic::Status> {
    let mut messages = vec![UploadRequest {
        kind: Some(upload_request::Kind::Header(UploadHeader {
            path: path.to_owned(),
        })),
        commit: false,
    }];
    messages.extend(archive.chunks(1000).map(|c| UploadRequest {
        kind: Some(upload_request::Kind::Data(Bytes::copy_from_slice(c))),
        commit: false,
    }));
    messages.push(UploadRequest {
        kind: Some(upload_request::Kind::Data(Bytes::new())),
        commit: true,
    });
    client
        .upload(futures::stream::iter(messages))
        .await
        .map(drop)
}

/// Every name below `dir`, sorted, `/`-separated (what is on disk, seen directly).
fn tree(dir: &Path) -> Vec<String> {
    fn walk(base: &Path, dir: &Path, out: &mut Vec<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let entry = entry.unwrap();
            let path = entry.path();
            out.push(path.strip_prefix(base).unwrap().display().to_string());
            if entry.file_type().unwrap().is_dir() {
                walk(base, &path, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

/// A tar archive with raw entry names (the tar crate's builder refuses `..`, so headers are set by hand).
fn raw_tar(entries: &[(&str, tar::EntryType, &str, &[u8])]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, link, data) in entries {
        let mut header = tar::Header::new_old();
        {
            let bytes = header.as_old_mut();
            bytes.name[..name.len()].copy_from_slice(name.as_bytes());
            bytes.linkname[..link.len()].copy_from_slice(link.as_bytes());
        }
        header.set_entry_type(*kind);
        header.set_mode(0o644);
        header.set_size(data.len() as u64);
        header.set_cksum();
        out.extend_from_slice(header.as_bytes());
        out.extend_from_slice(data);
        out.resize(out.len().div_ceil(512) * 512, 0);
    }
    out.resize(out.len() + 1024, 0);
    out
}

#[tokio::test]
async fn traversal_attempts_are_invalid_arguments_and_change_nothing() {
    let executor = TestExecutor::start().await;
    let mut client = files(&executor).await;
    std::os::unix::fs::symlink("/", executor.path("root-link")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", executor.path("passwd-link")).unwrap();
    std::fs::create_dir(executor.path("sub")).unwrap();
    let before = tree(executor.workspace.path());
    let outside = tempfile::tempdir().unwrap();
    let outside_target = outside.path().join("victim");
    std::os::unix::fs::symlink(outside.path(), executor.path("sub/out")).unwrap();
    let before_with_out = tree(executor.workspace.path());
    assert_ne!(before, before_with_out);

    for path in [
        "../../etc/passwd",
        "/etc/passwd",
        "sub/../../etc/passwd",
        "root-link/etc/passwd",
        "passwd-link",
        "sub/out/victim",
    ] {
        let status = read(&mut client, path, 0, 0).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "read {path}: {status:?}"
        );
        let status = write(&mut client, path, vec![b"pwned".to_vec()])
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "write {path}: {status:?}"
        );
        let status = client
            .edit_file(EditFileRequest {
                path: path.to_owned(),
                old_string: "root".into(),
                new_string: "pwned".into(),
                replace_all: true,
            })
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "edit {path}: {status:?}"
        );
    }
    for path in ["../x", "/tmp", "root-link/tmp/x", "sub/out/newdir"] {
        let status = client
            .make_directory(MakeDirectoryRequest {
                path: path.to_owned(),
                mode: 0,
            })
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "mkdir {path}: {status:?}"
        );
        let status = client
            .delete_file(DeleteFileRequest {
                path: format!("{path}/x"),
                recursive: true,
            })
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "delete {path}: {status:?}"
        );
        let status = client
            .list_files(ListFilesRequest {
                path: path.to_owned(),
                recursive: true,
                ..Default::default()
            })
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "list {path}: {status:?}"
        );
    }
    for path in ["root-link", "../"] {
        let status = client
            .download(DownloadRequest {
                path: format!("{path}/etc"),
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "download {path}");
        let status = upload(
            &mut client,
            &format!("{path}/tmp"),
            raw_tar(&[("a", tar::EntryType::Regular, "", b"x")]),
        )
        .await
        .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "upload {path}");
    }
    assert_eq!(tree(executor.workspace.path()), before_with_out);
    assert!(!outside_target.exists());
    assert!(std::fs::read_dir(outside.path()).unwrap().next().is_none());
}

#[tokio::test]
async fn tar_entries_that_escape_refuse_the_whole_upload() {
    let executor = TestExecutor::start().await;
    let mut client = files(&executor).await;
    std::fs::create_dir(executor.path("dest")).unwrap();
    std::fs::write(executor.path("dest/keep"), b"old").unwrap();
    let before = tree(executor.workspace.path());
    use tar::EntryType::{Link, Regular, Symlink};
    let cases: Vec<(&str, Vec<u8>)> = vec![
        (
            "dot-dot",
            raw_tar(&[("ok", Regular, "", b"1"), ("../escape", Regular, "", b"x")]),
        ),
        (
            "deep dot-dot",
            raw_tar(&[("a/../../escape", Regular, "", b"x")]),
        ),
        (
            "absolute",
            raw_tar(&[
                ("ok", Regular, "", b"1"),
                ("/tmp/escape", Regular, "", b"x"),
            ]),
        ),
        ("symlink to /", raw_tar(&[("link", Symlink, "/", b"")])),
        (
            "symlink climbing",
            raw_tar(&[("a/link", Symlink, "../../..", b"")]),
        ),
        (
            "hardlink outside",
            raw_tar(&[("hard", Link, "../keep", b"")]),
        ),
        (
            "hardlink absolute",
            raw_tar(&[("hard", Link, "/etc/passwd", b"")]),
        ),
        (
            "write through an archive link",
            raw_tar(&[
                ("l", Symlink, "sub", b""),
                ("sub/", tar::EntryType::Directory, "", b""),
                ("l/x", Regular, "", b"x"),
            ]),
        ),
        (
            "a fifo",
            raw_tar(&[("fifo", tar::EntryType::Fifo, "", b"")]),
        ),
        (
            "overwrite keep then escape",
            raw_tar(&[("keep", Regular, "", b"new"), ("../x", Regular, "", b"x")]),
        ),
        ("not a tar", b"this is not a tar archive at all".repeat(40)),
    ];
    for (what, archive) in cases {
        let status = upload(&mut client, "dest", archive).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{what}: {status:?}");
        assert_eq!(
            tree(executor.workspace.path()),
            before,
            "{what} changed the workspace"
        );
    }
    assert_eq!(std::fs::read(executor.path("dest/keep")).unwrap(), b"old");
    // Into a directory that does not exist yet: refused, and not left behind either.
    let status = upload(
        &mut client,
        "new/dir",
        raw_tar(&[("../x", Regular, "", b"x")]),
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(tree(executor.workspace.path()), before);
}

#[tokio::test]
async fn upload_merges_links_stay_inside_and_download_round_trips() {
    let executor = TestExecutor::start().await;
    let mut client = files(&executor).await;
    std::fs::create_dir_all(executor.path("dest/old")).unwrap();
    std::fs::write(executor.path("dest/old/kept"), b"kept").unwrap();
    std::fs::write(executor.path("dest/replaced"), b"before").unwrap();
    use tar::EntryType::{Directory, Link, Regular, Symlink};
    let archive = raw_tar(&[
        ("src/", Directory, "", b""),
        ("src/main.py", Regular, "", b"print('hi')\n"),
        ("src/lib/util.py", Regular, "", b"X = 1\n"),
        ("replaced", Regular, "", b"after"),
        ("old/new", Regular, "", b"new"),
        ("src/link", Symlink, "lib/util.py", b""),
        ("src/up", Symlink, "../replaced", b""),
        ("hard", Link, "src/main.py", b""),
    ]);
    upload(&mut client, "dest", archive).await.unwrap();
    assert_eq!(
        tree(&executor.path("dest")),
        [
            "hard",
            "old",
            "old/kept",
            "old/new",
            "replaced",
            "src",
            "src/lib",
            "src/lib/util.py",
            "src/link",
            "src/main.py",
            "src/up"
        ]
    );
    assert_eq!(
        std::fs::read(executor.path("dest/replaced")).unwrap(),
        b"after"
    );
    assert_eq!(
        std::fs::read(executor.path("dest/hard")).unwrap(),
        b"print('hi')\n"
    );
    assert_eq!(
        std::fs::read_link(executor.path("dest/src/link")).unwrap(),
        Path::new("lib/util.py")
    );

    let listed = client
        .list_files(ListFilesRequest {
            path: "dest".into(),
            recursive: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let names: Vec<_> = listed.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(
        names,
        [
            "dest/hard",
            "dest/old",
            "dest/old/kept",
            "dest/old/new",
            "dest/replaced",
            "dest/src",
            "dest/src/lib",
            "dest/src/lib/util.py",
            "dest/src/link",
            "dest/src/main.py",
            "dest/src/up"
        ]
    );
    let link = listed
        .files
        .iter()
        .find(|f| f.path == "dest/src/link")
        .unwrap();
    assert_eq!(link.r#type, FileType::Symlink as i32);
    assert_eq!(link.symlink_target, "lib/util.py");
    let flat = client
        .list_files(ListFilesRequest {
            path: "dest".into(),
            recursive: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(flat.files.len(), 4, "hard, old, replaced, src");
    assert!(!flat.truncated);

    // Download and unpack with the tar crate: the same tree and contents.
    let mut stream = client
        .download(DownloadRequest {
            path: "dest".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut archive = Vec::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        archive.extend_from_slice(&chunk.data);
    }
    let out = tempfile::tempdir().unwrap();
    tar::Archive::new(&archive[..]).unpack(out.path()).unwrap();
    assert_eq!(tree(out.path()), tree(&executor.path("dest")));
    assert_eq!(
        std::fs::read(out.path().join("src/lib/util.py")).unwrap(),
        b"X = 1\n"
    );
    assert_eq!(
        std::fs::read_link(out.path().join("src/up")).unwrap(),
        Path::new("../replaced")
    );
}

#[tokio::test]
async fn writes_are_atomic_create_parents_and_respect_the_mode() {
    let executor = TestExecutor::start().await;
    let mut client = files(&executor).await;
    write(
        &mut client,
        "a/b/c.txt",
        vec![b"hello ".to_vec(), b"world".to_vec()],
    )
    .await
    .unwrap();
    assert_eq!(
        std::fs::read(executor.path("a/b/c.txt")).unwrap(),
        b"hello world"
    );
    let mode = std::fs::metadata(executor.path("a/b/c.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o644);

    // A reader holding the old file keeps seeing the old content: the new one arrived by rename.
    let mut old = std::fs::File::open(executor.path("a/b/c.txt")).unwrap();
    let mut messages = vec![WriteFileRequest {
        kind: Some(write_file_request::Kind::Header(WriteFileHeader {
            path: "/a/b/c.txt".replace("/a", &format!("{}/a", executor.workspace.path().display())),
            mode: 0o755,
        })),
        commit: false,
    }];
    // The last data message may carry the commit itself.
    messages.push(WriteFileRequest {
        kind: Some(write_file_request::Kind::Data(Bytes::from_static(
            b"replaced",
        ))),
        commit: true,
    });
    let file = client
        .write_file(futures::stream::iter(messages))
        .await
        .unwrap()
        .into_inner()
        .file
        .unwrap();
    assert_eq!(
        (file.path.as_str(), file.size, file.mode),
        ("a/b/c.txt", 8, 0o755)
    );
    let mut seen = String::new();
    std::io::Read::read_to_string(&mut old, &mut seen).unwrap();
    assert_eq!(seen, "hello world");
    assert_eq!(
        std::fs::read(executor.path("a/b/c.txt")).unwrap(),
        b"replaced"
    );
    // No temporary file is left beside it.
    assert_eq!(tree(&executor.path("a/b")), ["c.txt"]);

    // A stream without a header, or onto a directory, is refused.
    let status = client
        .write_file(futures::stream::iter(vec![WriteFileRequest {
            kind: Some(write_file_request::Kind::Data(Bytes::from_static(b"x"))),
            commit: true,
        }]))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = write(&mut client, "a/b", vec![b"x".to_vec()])
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(tree(&executor.path("a")), ["b", "b/c.txt"]);
}

#[tokio::test]
async fn the_size_cap_refuses_writes_and_uploads_and_leaves_nothing() {
    let executor = TestExecutor::start_with(|c| c.max_write_bytes = 1000).await;
    let mut client = files(&executor).await;
    std::fs::write(executor.path("existing"), b"old").unwrap();
    let status = write(
        &mut client,
        "new/dir/big",
        vec![vec![7u8; 600], vec![7u8; 600]],
    )
    .await
    .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    let status = write(&mut client, "existing", vec![vec![7u8; 1001]])
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted);
    let archive = raw_tar(&[("big", tar::EntryType::Regular, "", &[1u8; 1500])]);
    let status = upload(&mut client, "up", archive).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert_eq!(tree(executor.workspace.path()), ["existing"]);
    assert_eq!(std::fs::read(executor.path("existing")).unwrap(), b"old");
    // Exactly at the cap is fine.
    write(&mut client, "exact", vec![vec![1u8; 1000]])
        .await
        .unwrap();
}

#[tokio::test]
async fn reads_take_offset_and_length_in_bounded_chunks() {
    let executor = TestExecutor::start().await;
    let mut client = files(&executor).await;
    let data: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(executor.path("data"), &data).unwrap();
    assert_eq!(read(&mut client, "data", 0, 0).await.unwrap(), data);
    assert_eq!(
        read(&mut client, "data", 10, 5).await.unwrap(),
        &data[10..15]
    );
    assert_eq!(
        read(&mut client, "data", 300_000, 0).await.unwrap(),
        &data[300_000..]
    );
    assert_eq!(
        read(&mut client, "data", 599_990, 100).await.unwrap(),
        &data[599_990..]
    );
    assert!(
        read(&mut client, "data", 10_000_000, 0)
            .await
            .unwrap()
            .is_empty()
    );
    let status = read(&mut client, "missing", 0, 0).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    std::fs::create_dir(executor.path("dir")).unwrap();
    let status = read(&mut client, "dir", 0, 0).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn edits_replace_exactly_one_occurrence_unless_asked_for_all() {
    let executor = TestExecutor::start().await;
    let mut client = files(&executor).await;
    std::fs::write(executor.path("f.py"), "x = 1\ny = 1\nz = 2\n").unwrap();
    let edit = |old: &str, new: &str, all: bool| EditFileRequest {
        path: "f.py".into(),
        old_string: old.into(),
        new_string: new.into(),
        replace_all: all,
    };
    let status = client
        .edit_file(edit("w = 1", "w = 3", false))
        .await
        .unwrap_err();
    assert_eq!(
        status.code(),
        Code::FailedPrecondition,
        "absent: {status:?}"
    );
    let status = client
        .edit_file(edit("= 1", "= 3", false))
        .await
        .unwrap_err();
    assert_eq!(
        status.code(),
        Code::FailedPrecondition,
        "ambiguous: {status:?}"
    );
    assert!(status.message().contains("2 times"), "{status:?}");
    let status = client.edit_file(edit("", "x", false)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(
        std::fs::read_to_string(executor.path("f.py")).unwrap(),
        "x = 1\ny = 1\nz = 2\n"
    );

    let r = client
        .edit_file(edit("z = 2", "z = 20", false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.replacements, 1);
    let r = client
        .edit_file(edit("= 1", "= 9", true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.replacements, 2);
    assert_eq!(
        std::fs::read_to_string(executor.path("f.py")).unwrap(),
        "x = 9\ny = 9\nz = 20\n"
    );
    let status = client
        .edit_file(EditFileRequest {
            path: "nope".into(),
            ..edit("a", "b", false)
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
}

#[tokio::test]
async fn stat_mkdir_and_delete() {
    let executor = TestExecutor::start().await;
    let mut client = files(&executor).await;
    let dir = client
        .make_directory(MakeDirectoryRequest {
            path: "x/y/z".into(),
            mode: 0,
        })
        .await
        .unwrap()
        .into_inner()
        .directory
        .unwrap();
    assert_eq!(
        (dir.path.as_str(), dir.r#type),
        ("x/y/z", FileType::Directory as i32)
    );
    // Again: an existing directory is fine.
    client
        .make_directory(MakeDirectoryRequest {
            path: "x/y/z".into(),
            mode: 0,
        })
        .await
        .unwrap();
    std::fs::write(executor.path("x/y/z/f"), b"12345").unwrap();
    std::os::unix::fs::symlink("/etc", executor.path("x/etc")).unwrap();
    let stat = |path: &str| StatFileRequest { path: path.into() };
    let f = client
        .stat_file(stat("x/y/z/f"))
        .await
        .unwrap()
        .into_inner()
        .file
        .unwrap();
    assert_eq!((f.size, f.r#type), (5, FileType::File as i32));
    assert!(f.modify_time.unwrap().seconds > 0);
    let l = client
        .stat_file(stat("x/etc"))
        .await
        .unwrap()
        .into_inner()
        .file
        .unwrap();
    assert_eq!(
        (l.r#type, l.symlink_target.as_str()),
        (FileType::Symlink as i32, "/etc")
    );
    let root = client
        .stat_file(stat(""))
        .await
        .unwrap()
        .into_inner()
        .file
        .unwrap();
    assert_eq!(root.r#type, FileType::Directory as i32);

    let delete = |path: &str, recursive: bool| DeleteFileRequest {
        path: path.into(),
        recursive,
    };
    let status = client.delete_file(delete("x/y", false)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    let status = client.delete_file(delete("", true)).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = client.delete_file(delete("nope", false)).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    // Deleting a link removes the link, not /etc.
    client.delete_file(delete("x/etc", false)).await.unwrap();
    assert!(Path::new("/etc/passwd").exists());
    client.delete_file(delete("x/y", true)).await.unwrap();
    assert_eq!(tree(&executor.path("x")), Vec::<String>::new());
}

#[tokio::test]
async fn file_calls_need_the_token() {
    let executor = TestExecutor::start().await;
    let mut client =
        WorkspaceServiceClient::with_interceptor(executor.channel().await, AddToken::none());
    let status = client
        .stat_file(StatFileRequest {
            path: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);
}

#[tokio::test]
async fn move_renames_files_links_and_directories_and_replaces_only_when_asked() {
    let executor = TestExecutor::start().await;
    let mut client = files(&executor).await;
    let mv = |source: &str, destination: &str, overwrite: bool| MoveFileRequest {
        source: source.into(),
        destination: destination.into(),
        overwrite,
    };
    std::fs::create_dir_all(executor.path("d/sub")).unwrap();
    std::fs::write(executor.path("d/sub/f"), b"12345").unwrap();
    std::fs::write(executor.path("a.txt"), b"a").unwrap();
    std::fs::write(executor.path("b.txt"), b"b").unwrap();
    std::os::unix::fs::symlink("/etc", executor.path("link")).unwrap();

    // A file, renamed: what is at the destination is described.
    let moved = client
        .move_file(mv("a.txt", "c.txt", false))
        .await
        .unwrap()
        .into_inner()
        .file
        .unwrap();
    assert_eq!((moved.path.as_str(), moved.size), ("c.txt", 1));
    assert!(!executor.path("a.txt").exists());
    // Onto an existing file: refused unless asked, then replaced.
    let refused = client
        .move_file(mv("c.txt", "b.txt", false))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::AlreadyExists, "{refused:?}");
    assert_eq!(std::fs::read(executor.path("b.txt")).unwrap(), b"b");
    client.move_file(mv("c.txt", "b.txt", true)).await.unwrap();
    assert_eq!(std::fs::read(executor.path("b.txt")).unwrap(), b"a");
    // A directory with what is in it, into another directory.
    client.move_file(mv("d/sub", "moved", false)).await.unwrap();
    assert_eq!(std::fs::read(executor.path("moved/f")).unwrap(), b"12345");
    // A link is moved, not followed.
    let link = client
        .move_file(mv("link", "d/link2", false))
        .await
        .unwrap()
        .into_inner()
        .file
        .unwrap();
    assert_eq!(link.r#type, FileType::Symlink as i32);
    assert_eq!(
        std::fs::read_link(executor.path("d/link2")).unwrap(),
        Path::new("/etc")
    );
    // What cannot be: a missing source, a missing destination folder, a directory into itself, over a
    // directory that is not empty, out of the workspace, the root; nothing changes.
    for (req, code) in [
        (mv("nothing", "x", false), Code::NotFound),
        (mv("b.txt", "no/such/dir/b.txt", false), Code::NotFound),
        (mv("moved", "moved/inner", false), Code::InvalidArgument),
        (mv("d", "moved", true), Code::FailedPrecondition),
        (mv("b.txt", "d", true), Code::InvalidArgument),
        (mv("b.txt", "../b.txt", false), Code::InvalidArgument),
        (mv("/etc/passwd", "p", false), Code::InvalidArgument),
        (mv("", "x", false), Code::InvalidArgument),
        (mv("d/link2/passwd", "p", false), Code::InvalidArgument),
    ] {
        let shown = format!("{req:?}");
        let err = client.move_file(req).await.unwrap_err();
        assert_eq!(err.code(), code, "{shown}: {err:?}");
    }
    assert_eq!(std::fs::read(executor.path("b.txt")).unwrap(), b"a");
    assert!(executor.path("moved/f").exists() && executor.path("d/link2").is_symlink());
}
