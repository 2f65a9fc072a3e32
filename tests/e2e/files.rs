//! FileService through the runtime into a real sandbox: a 50 MiB round trip byte for byte, tar upload then
//! listing, traversal attempts refused with nothing changed on disk, edits, unknown sandboxes; cut writes
//! that change nothing (`cut`).

use bytes::Bytes;
use mentis_e2e::*;
use mentis_proto::api::{self, file_service_client::FileServiceClient};
use tonic::Code;

mod cut;
mod pages;

pub(super) fn files(h: &Harness) -> FileServiceClient<ApiChannel> {
    FileServiceClient::new(h.channel.clone())
}

pub(super) async fn write(
    client: &mut FileServiceClient<ApiChannel>,
    sandbox: &str,
    path: &str,
    chunks: Vec<Bytes>,
) -> Result<api::FileInfo, tonic::Status> {
    let mut messages = vec![api::WriteFileRequest {
        kind: Some(api::write_file_request::Kind::Header(
            api::WriteFileHeader {
                sandbox_id: sandbox.to_owned(),
                path: path.to_owned(),
                mode: 0,
            },
        )),
    }];
    messages.extend(chunks.into_iter().map(|data| api::WriteFileRequest {
        kind: Some(api::write_file_request::Kind::Data(data)),
    }));
    Ok(client
        .write_file(futures::stream::iter(messages))
        .await?
        .into_inner()
        .file
        .unwrap_or_default())
}

pub(super) async fn read(
    client: &mut FileServiceClient<ApiChannel>,
    sandbox: &str,
    path: &str,
) -> Result<Vec<u8>, tonic::Status> {
    let mut stream = client
        .read_file(api::ReadFileRequest {
            sandbox_id: sandbox.to_owned(),
            path: path.to_owned(),
            offset: 0,
            length: 0,
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await? {
        out.extend_from_slice(&chunk.data);
    }
    Ok(out)
}

/// What `find` shows of the workspace: every path with its type and size (the state on disk).
async fn disk_state(h: &mut Harness, sandbox: &str) -> String {
    let obs = h
        .sh(
            sandbox,
            "cd /workspace && find . -printf '%p %y %s\\n' | sort && md5sum /etc/passwd",
        )
        .await
        .unwrap();
    stdout(&obs)
}

#[tokio::test]
async fn a_50_mib_file_round_trips_byte_exact() {
    let mut h = Harness::start().await.unwrap();
    let sandbox = h.create_default().await.unwrap().sandbox_id;
    let mut client = files(&h);
    // Deterministic, not compressible, not periodic within a chunk.
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let data: Vec<u8> = (0..50 * 1024 * 1024)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    let chunks: Vec<Bytes> = data
        .chunks(256 * 1024)
        .map(Bytes::copy_from_slice)
        .collect();
    let info = write(&mut client, &sandbox, "big/data.bin", chunks)
        .await
        .unwrap();
    assert_eq!(info.size, data.len() as u64);
    assert_eq!(info.path, "big/data.bin");
    // The sandbox sees the same bytes (its own sha256 of what landed on disk) ...
    let obs = h
        .sh(
            &sandbox,
            "stat -c %s /workspace/big/data.bin && stat -c %U /workspace/big/data.bin",
        )
        .await
        .unwrap();
    let out = stdout(&obs);
    assert!(out.starts_with(&format!("{}\n", data.len())), "{out}");
    assert_ne!(
        out.lines().nth(1),
        Some("root"),
        "files belong to the sandbox user"
    );
    // ... and reading it back gives them, byte for byte.
    let back = read(&mut client, &sandbox, "/workspace/big/data.bin")
        .await
        .unwrap();
    assert_eq!(back.len(), data.len());
    assert!(back == data, "the round trip changed bytes");
    h.stop().await.unwrap();
}

#[tokio::test]
async fn a_tar_upload_is_listed_and_downloads_again() {
    let mut h = Harness::start().await.unwrap();
    let sandbox = h.create_default().await.unwrap().sandbox_id;
    let mut client = files(&h);
    let mut builder = tar::Builder::new(Vec::new());
    for (name, body) in [
        ("proj/main.py", "print('hi')\n"),
        ("proj/pkg/mod.py", "X = 1\n"),
    ] {
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(0o644);
        header.set_cksum();
        builder
            .append_data(&mut header, name, body.as_bytes())
            .unwrap();
    }
    let archive = builder.into_inner().unwrap();
    let mut messages = vec![api::UploadRequest {
        kind: Some(api::upload_request::Kind::Header(api::UploadHeader {
            sandbox_id: sandbox.clone(),
            path: "up".into(),
        })),
    }];
    messages.extend(archive.chunks(4096).map(|c| api::UploadRequest {
        kind: Some(api::upload_request::Kind::Data(Bytes::copy_from_slice(c))),
    }));
    let summary = client
        .upload(futures::stream::iter(messages))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((summary.files, summary.bytes), (2, 18));

    let listed = client
        .list_files(api::ListFilesRequest {
            sandbox_id: sandbox.clone(),
            path: "up".into(),
            recursive: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let names: Vec<(&str, i32, u64)> = listed
        .files
        .iter()
        .filter(|f| f.r#type != api::FileType::Directory as i32)
        .map(|f| (f.path.as_str(), f.r#type, f.size))
        .collect();
    assert_eq!(
        names,
        [
            ("up/proj/main.py", api::FileType::File as i32, 12),
            ("up/proj/pkg/mod.py", api::FileType::File as i32, 6)
        ]
    );
    let obs = h
        .sh(&sandbox, "python3 /workspace/up/proj/main.py")
        .await
        .unwrap();
    assert_eq!(stdout(&obs), "hi\n");

    let mut stream = client
        .download(api::DownloadRequest {
            sandbox_id: sandbox.clone(),
            path: "up/proj".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let mut tarball = Vec::new();
    while let Some(chunk) = stream.message().await.unwrap() {
        tarball.extend_from_slice(&chunk.data);
    }
    let mut names = Vec::new();
    for entry in tar::Archive::new(&tarball[..]).entries().unwrap() {
        names.push(entry.unwrap().path().unwrap().display().to_string());
    }
    assert_eq!(names, ["main.py", "pkg", "pkg/mod.py"]);
    h.stop().await.unwrap();
}

#[tokio::test]
async fn every_traversal_attempt_is_refused_and_changes_nothing() {
    let mut h = Harness::start().await.unwrap();
    let sandbox = h.create_default().await.unwrap().sandbox_id;
    let mut client = files(&h);
    let obs = h
        .sh(
            &sandbox,
            "cd /workspace && ln -s / root && ln -s /etc/passwd pw && mkdir d && echo keep > d/f",
        )
        .await
        .unwrap();
    assert_eq!(cmd_end(&obs).unwrap().exit_code, 0);
    let before = disk_state(&mut h, &sandbox).await;

    for path in [
        "../../etc/passwd",
        "/etc/passwd",
        "d/../../etc/passwd",
        "/workspace/../etc/passwd",
        "root/etc/passwd",
        "pw",
    ] {
        let status = read(&mut client, &sandbox, path).await.unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "read {path}: {status:?}"
        );
        let status = write(&mut client, &sandbox, path, vec![Bytes::from_static(b"x")])
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "write {path}: {status:?}"
        );
        let status = client
            .edit_file(api::EditFileRequest {
                sandbox_id: sandbox.clone(),
                path: path.to_owned(),
                old_string: "root".into(),
                new_string: "x".into(),
                replace_all: true,
            })
            .await
            .unwrap_err();
        assert_eq!(
            status.code(),
            Code::InvalidArgument,
            "edit {path}: {status:?}"
        );
        let status = client
            .delete_file(api::DeleteFileRequest {
                sandbox_id: sandbox.clone(),
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
    }
    for path in ["../tmp", "/tmp", "root/tmp"] {
        let status = client
            .make_directory(api::MakeDirectoryRequest {
                sandbox_id: sandbox.clone(),
                path: format!("{path}/new"),
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
            .list_files(api::ListFilesRequest {
                sandbox_id: sandbox.clone(),
                path: path.to_owned(),
                recursive: false,
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
    assert_eq!(disk_state(&mut h, &sandbox).await, before);
    let obs = h.sh(&sandbox, "ls /tmp/new /new 2>&1; true").await.unwrap();
    assert!(stdout(&obs).contains("No such file"), "{}", stdout(&obs));
    h.stop().await.unwrap();
}

#[tokio::test]
async fn edits_need_exactly_one_match_and_unknown_sandboxes_are_not_found() {
    let mut h = Harness::start().await.unwrap();
    let sandbox = h.create_default().await.unwrap().sandbox_id;
    let mut client = files(&h);
    write(
        &mut client,
        &sandbox,
        "f.txt",
        vec![Bytes::from_static(b"a=1\nb=1\n")],
    )
    .await
    .unwrap();
    let edit = |old: &str, all: bool| api::EditFileRequest {
        sandbox_id: sandbox.clone(),
        path: "f.txt".into(),
        old_string: old.into(),
        new_string: "=2".into(),
        replace_all: all,
    };
    let status = client.edit_file(edit("=3", false)).await.unwrap_err();
    assert_eq!(
        status.code(),
        Code::FailedPrecondition,
        "absent: {status:?}"
    );
    let status = client.edit_file(edit("=1", false)).await.unwrap_err();
    assert_eq!(
        status.code(),
        Code::FailedPrecondition,
        "ambiguous: {status:?}"
    );
    let obs = h.sh(&sandbox, "cat /workspace/f.txt").await.unwrap();
    assert_eq!(stdout(&obs), "a=1\nb=1\n");
    let r = client
        .edit_file(edit("=1", true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(r.replacements, 2);
    let obs = h.sh(&sandbox, "cat /workspace/f.txt").await.unwrap();
    assert_eq!(stdout(&obs), "a=2\nb=2\n");

    let unknown = uuid::Uuid::new_v4().to_string();
    let status = client
        .stat_file(api::StatFileRequest {
            sandbox_id: unknown.clone(),
            path: "f.txt".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let status = write(&mut client, &unknown, "x", vec![Bytes::from_static(b"x")])
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let status = read(&mut client, "not-a-uuid", "x").await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    h.stop().await.unwrap();
}

/// An edit whose result would pass the write cap is refused before anything is built (RESOURCE_EXHAUSTED,
/// the file unchanged, the sandbox's processes untouched); a large one within the cap is written without
/// holding copies of the file, in a sandbox of 256 MiB.
#[tokio::test]
async fn an_edit_past_the_write_cap_is_refused_and_changes_nothing() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sandbox = h
        .create(api::SandboxSpec {
            memory_limit_mb: 256,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    let mut client = files(&h);
    h.py(&sandbox, "kept = 41").await?;
    let made = h
        .sh(
            &sandbox,
            "head -c 3000000 /dev/zero | tr '\\0' x > big.txt; md5sum big.txt",
        )
        .await?;
    let digest = stdout(&made);
    let edit = |new: usize| api::EditFileRequest {
        sandbox_id: sandbox.clone(),
        path: "big.txt".into(),
        old_string: "x".into(),
        new_string: "x".repeat(new),
        replace_all: true,
    };
    // 3 MB, each byte a thousand: 3 GB, over the 1 GiB cap.
    let status = client.edit_file(edit(1000)).await.unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("3000000000 bytes"), "{status:?}");
    assert_eq!(stdout(&h.sh(&sandbox, "md5sum big.txt").await?), digest);
    let cell = h.py(&sandbox, "print(kept)").await?;
    assert_eq!(cell_stdout(&cell), "41\n", "the kernel lives on: {cell:?}");
    // Each byte ten: 30 MB, within the cap, written in chunks.
    let r = client.edit_file(edit(10)).await?.into_inner();
    assert_eq!(r.replacements, 3_000_000);
    assert_eq!(
        stdout(
            &h.sh(&sandbox, "stat -c %s big.txt; tr -d x < big.txt | wc -c")
                .await?
        ),
        "30000000\n0\n"
    );
    assert_eq!(cell_stdout(&h.py(&sandbox, "print(kept)").await?), "41\n");
    h.stop().await?;
    Ok(())
}

/// Far offsets read nothing (past the end, as documented, up to 2^64 - 1), and a tree too deep to
/// download (3000 levels) is refused with FAILED_PRECONDITION naming the limit, never INTERNAL; a tree of
/// 100 levels downloads.
#[tokio::test]
async fn far_offsets_read_nothing_and_a_too_deep_tree_is_refused() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sandbox = h.create_default().await?.sandbox_id;
    let mut client = files(&h);
    h.sh(
        &sandbox,
        "echo hello > f.txt; python3 -c \"import os\nfor _ in range(3000): os.mkdir('d'); os.chdir('d')\"; \
         mkdir -p \"$(printf 's/%.0s' $(seq 100))\" && echo leaf > \"$(printf 's/%.0s' $(seq 100))leaf.txt\"",
    )
    .await?;
    for offset in [5, 6, 1 << 40, 1 << 62, 1 << 63, u64::MAX] {
        let mut stream = client
            .read_file(api::ReadFileRequest {
                sandbox_id: sandbox.clone(),
                path: "f.txt".into(),
                offset,
                length: 0,
            })
            .await?
            .into_inner();
        let mut got = Vec::new();
        while let Some(chunk) = stream.message().await? {
            got.extend_from_slice(&chunk.data);
        }
        let want: &[u8] = if offset == 5 { b"\n" } else { b"" };
        assert_eq!(got, want, "offset {offset}");
    }
    let download = |path: &str| api::DownloadRequest {
        sandbox_id: sandbox.clone(),
        path: path.into(),
    };
    let mut fetch = async |path: &str| -> Result<usize, tonic::Status> {
        let mut stream = client.download(download(path)).await?.into_inner();
        let mut n = 0;
        while let Some(chunk) = stream.message().await? {
            n += chunk.data.len();
        }
        Ok(n)
    };
    let status = fetch("d").await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("deeper than 128 levels"),
        "{status:?}"
    );
    // 100 levels down the deep tree, 2900 remain below: still refused.
    let lower = ["d"; 100].join("/");
    assert_eq!(
        fetch(&lower).await.unwrap_err().code(),
        Code::FailedPrecondition
    );
    // A path past PATH_MAX names nothing: refused before it reaches the executor.
    let too_long = ["d"; 2950].join("/");
    assert_eq!(
        fetch(&too_long).await.unwrap_err().code(),
        Code::InvalidArgument
    );
    // A tree of 100 levels downloads whole.
    assert!(fetch("s").await? > 0, "100 levels download");
    h.stop().await?;
    Ok(())
}

#[tokio::test]
async fn file_calls_on_a_paused_sandbox_fail_or_resume_it() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let mut client = files(&h);
    let id = h.create_default().await?.sandbox_id;
    write(
        &mut client,
        &id,
        "kept.txt",
        vec![Bytes::from_static(b"before")],
    )
    .await?;
    h.sandboxes
        .pause_sandbox(api::PauseSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    let r = write(
        &mut client,
        &id,
        "kept.txt",
        vec![Bytes::from_static(b"after")],
    )
    .await;
    assert_eq!(r.unwrap_err().code(), Code::FailedPrecondition);
    h.sandboxes
        .resume_sandbox(api::ResumeSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    assert_eq!(read(&mut client, &id, "kept.txt").await?, b"before");

    // With auto_resume, a file call wakes the sandbox.
    let auto = h
        .create(api::SandboxSpec {
            auto_resume: true,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    h.sandboxes
        .pause_sandbox(api::PauseSandboxRequest {
            sandbox_id: auto.clone(),
        })
        .await?;
    write(
        &mut client,
        &auto,
        "woke.txt",
        vec![Bytes::from_static(b"hi")],
    )
    .await?;
    assert_eq!(read(&mut client, &auto, "woke.txt").await?, b"hi");
    h.stop().await
}

#[tokio::test]
async fn a_write_over_the_configured_cap_is_refused_and_leaves_nothing() -> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| {
        c.docker
            .executor_env
            .push("MENTIS_EXECUTOR_MAX_WRITE_BYTES=1000".into());
    })
    .await?;
    let mut client = files(&h);
    let id = h.create_default().await?.sandbox_id;
    let r = write(
        &mut client,
        &id,
        "big.bin",
        vec![Bytes::from(vec![b'x'; 2000])],
    )
    .await;
    assert_eq!(r.unwrap_err().code(), Code::ResourceExhausted);
    assert_eq!(stdout(&h.sh(&id, "ls -A /workspace").await?), "");
    write(
        &mut client,
        &id,
        "small.bin",
        vec![Bytes::from(vec![b'x'; 1000])],
    )
    .await?;
    h.stop().await
}
