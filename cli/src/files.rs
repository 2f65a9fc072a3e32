//! `mentis cp` and `mentis files ...`: FileService.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Subcommand};
use futures::StreamExt;
use mentis_proto::api::{self, write_file_request};
use serde_json::{Value, json};

use crate::client::Conn;
use crate::error::{Failure, Result, Status};
use crate::output::{self, Format};

/// Bytes per WriteFile message (the server reads at most 256 KiB a chunk too).
const CHUNK: usize = 256 * 1024;

#[derive(Args, Debug)]
pub struct CpArgs {
    /// `SANDBOX:PATH` or a local path (`-`: stdin or stdout).
    src: String,
    /// `SANDBOX:PATH` or a local path (`-`: stdin or stdout).
    dst: String,
}

#[derive(Subcommand, Debug)]
pub enum FilesCommand {
    /// List a directory of the workspace (default: /workspace itself).
    Ls {
        sandbox: String,
        #[arg(default_value = "", hide_default_value = true)]
        path: String,
        /// Everything under the directory.
        #[arg(long, short = 'R')]
        recursive: bool,
    },
    /// Remove a file, link or empty directory of the workspace (`-r`: a directory and everything in it).
    Rm {
        sandbox: String,
        path: String,
        /// A directory with everything in it.
        #[arg(long, short = 'r')]
        recursive: bool,
    },
    /// Print what is created, modified and removed under a directory of the workspace as it happens, until
    /// Ctrl-C (a cut stream is resumed where it stopped).
    Watch {
        sandbox: String,
        #[arg(default_value = "", hide_default_value = true)]
        path: String,
        /// Also every directory under it (those made later too).
        #[arg(long, short = 'r')]
        recursive: bool,
    },
    /// Move or rename a file, link or directory of the workspace (the destination's folder must exist).
    Mv {
        sandbox: String,
        source: String,
        destination: String,
        /// Replace what is at the destination (a directory only when it is empty).
        #[arg(long, short = 'f')]
        force: bool,
    },
    /// Make a directory of the workspace, and the missing ones above it (like `mkdir -p`).
    Mkdir {
        sandbox: String,
        path: String,
        /// Permission bits, in octal (default 755).
        #[arg(long, short = 'm', value_parser = octal_mode)]
        mode: Option<u32>,
    },
}

fn octal_mode(s: &str) -> std::result::Result<u32, String> {
    u32::from_str_radix(s, 8)
        .ok()
        .filter(|m| *m <= 0o7777)
        .ok_or_else(|| format!("{s:?} is not an octal mode such as 750"))
}

/// `SANDBOX:PATH` split, or None for a local path. A local path with a colon in it is written `./a:b`.
fn remote(arg: &str) -> Option<(&str, &str)> {
    let (sandbox, path) = arg.split_once(':')?;
    if sandbox.is_empty() || sandbox.contains('/') || sandbox.starts_with('.') {
        return None;
    }
    Some((sandbox, path))
}

fn base_name(path: &str) -> Option<&str> {
    path.rsplit('/').find(|s| !s.is_empty())
}

pub async fn cp(conn: &Conn, a: CpArgs) -> Result<Status> {
    match (remote(&a.src), remote(&a.dst)) {
        (Some((sandbox, path)), None) => {
            let sandbox = conn.sandbox_id(sandbox).await?;
            download(conn, &sandbox, path, &a.dst).await
        }
        (None, Some((sandbox, path))) => {
            let sandbox = conn.sandbox_id(sandbox).await?;
            upload(conn, &a.src, &sandbox, path).await
        }
        (Some(_), Some(_)) => Err(Failure::Usage(
            "copy between two sandboxes is not supported: one side must be local".into(),
        )),
        (None, None) => Err(Failure::Usage(
            "one side must be SANDBOX:PATH (a local path with a colon: ./a:b)".into(),
        )),
    }
}

/// Whether the remote `path` is a directory (None: it does not exist).
async fn remote_is_dir(conn: &Conn, sandbox: &str, path: &str) -> Result<Option<bool>> {
    match conn
        .files()
        .stat_file(api::StatFileRequest {
            sandbox_id: sandbox.to_owned(),
            path: path.to_owned(),
        })
        .await
    {
        Ok(r) => Ok(Some(
            r.into_inner()
                .file
                .is_some_and(|f| f.r#type() == api::FileType::Directory),
        )),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(s.into()),
    }
}

async fn download(conn: &Conn, sandbox: &str, path: &str, local: &str) -> Result<Status> {
    if local != "-" && remote_is_dir(conn, sandbox, path).await? == Some(true) {
        return download_dir(conn, sandbox, path, local).await;
    }
    let mut stream = conn
        .files()
        .read_file(api::ReadFileRequest {
            sandbox_id: sandbox.to_owned(),
            path: path.to_owned(),
            ..Default::default()
        })
        .await?
        .into_inner();
    if local == "-" {
        let mut out = std::io::stdout().lock();
        while let Some(chunk) = stream.next().await {
            out.write_all(&chunk?.data)?;
        }
        out.flush()?;
        return Ok(0);
    }
    let mut target = PathBuf::from(local);
    if target.is_dir() {
        let name = base_name(path).context("the remote path has no file name")?;
        target.push(name);
    }
    // Into a temporary file beside the target, renamed over it once complete.
    let dir = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_owned(),
        _ => PathBuf::from("."),
    };
    let tmp = dir.join(format!(
        ".{}.mentis-cp-{}",
        target
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        std::process::id()
    ));
    let written = async {
        let mut f =
            std::fs::File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
        while let Some(chunk) = stream.next().await {
            f.write_all(&chunk?.data)
                .with_context(|| format!("writing {}", tmp.display()))?;
        }
        f.sync_all()?;
        std::fs::rename(&tmp, &target)
            .with_context(|| format!("renaming into {}", target.display()))?;
        Ok::<_, Failure>(())
    }
    .await;
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map(|()| 0)
}

/// A remote directory into a local one (Download, a tar archive): into `local` when it does not exist,
/// else into `local/<the remote directory's name>`, as `cp -r` does.
async fn download_dir(conn: &Conn, sandbox: &str, path: &str, local: &str) -> Result<Status> {
    let mut target = PathBuf::from(local);
    if target.is_dir()
        && let Some(name) = base_name(path)
    {
        target.push(name);
    }
    let mut stream = conn
        .files()
        .download(api::DownloadRequest {
            sandbox_id: sandbox.to_owned(),
            path: path.to_owned(),
        })
        .await?
        .into_inner();
    let mut archive = Vec::new();
    while let Some(chunk) = stream.next().await {
        archive.extend_from_slice(&chunk?.data);
    }
    std::fs::create_dir_all(&target).with_context(|| format!("creating {}", target.display()))?;
    // tar's unpack keeps every entry inside `target` (no "..", no writing through links).
    tar::Archive::new(archive.as_slice())
        .unpack(&target)
        .with_context(|| format!("unpacking into {}", target.display()))?;
    Ok(0)
}

/// A local directory into the sandbox (Upload, a tar archive): into `path` when it does not exist, else
/// into `path/<the local directory's name>`, as `cp -r` does. Links are sent as links.
async fn upload_dir(conn: &Conn, local: &Path, sandbox: &str, path: &str) -> Result<Status> {
    let mut path = path.trim_end_matches('/').to_owned();
    if remote_is_dir(conn, sandbox, &path).await? == Some(true)
        && let Some(name) = local.file_name()
    {
        if !path.is_empty() {
            path.push('/');
        }
        path.push_str(&name.to_string_lossy());
    }
    let mut builder = tar::Builder::new(Vec::new());
    builder.follow_symlinks(false);
    let mut names: Vec<_> = std::fs::read_dir(local)
        .with_context(|| format!("reading {}", local.display()))?
        .collect::<std::io::Result<_>>()?;
    names.sort_by_key(|e| e.file_name());
    for entry in names {
        let (from, name) = (entry.path(), entry.file_name());
        let added = if entry.file_type()?.is_dir() {
            builder.append_dir_all(&name, &from)
        } else {
            builder.append_path_with_name(&from, &name)
        };
        added.with_context(|| format!("archiving {}", from.display()))?;
    }
    let archive = builder.into_inner().context("archiving")?;
    let mut msgs = vec![api::UploadRequest {
        kind: Some(api::upload_request::Kind::Header(api::UploadHeader {
            sandbox_id: sandbox.to_owned(),
            path,
        })),
    }];
    msgs.extend(archive.chunks(CHUNK).map(|c| api::UploadRequest {
        kind: Some(api::upload_request::Kind::Data(c.to_vec().into())),
    }));
    conn.files().upload(futures::stream::iter(msgs)).await?;
    Ok(0)
}

async fn upload(conn: &Conn, local: &str, sandbox: &str, path: &str) -> Result<Status> {
    let (data, mode) = if local == "-" {
        let mut data = Vec::new();
        std::io::stdin().read_to_end(&mut data)?;
        (data, 0)
    } else {
        let p = Path::new(local);
        let meta = std::fs::metadata(p).with_context(|| format!("reading {local}"))?;
        if meta.is_dir() {
            return upload_dir(conn, p, sandbox, path).await;
        }
        use std::os::unix::fs::PermissionsExt;
        let data = std::fs::read(p).with_context(|| format!("reading {local}"))?;
        (data, meta.permissions().mode() & 0o7777)
    };
    let mut path = path.to_owned();
    if path.is_empty()
        || path.ends_with('/')
        || remote_is_dir(conn, sandbox, &path).await? == Some(true)
    {
        if !path.is_empty() && !path.ends_with('/') {
            path.push('/');
        }
        let name = base_name(local)
            .filter(|_| local != "-")
            .context("give the remote file's name: SANDBOX:PATH/NAME")?;
        path.push_str(name);
    }
    let mut msgs = vec![api::WriteFileRequest {
        kind: Some(write_file_request::Kind::Header(api::WriteFileHeader {
            sandbox_id: sandbox.to_owned(),
            path,
            mode,
        })),
    }];
    msgs.extend(data.chunks(CHUNK).map(|c| api::WriteFileRequest {
        kind: Some(write_file_request::Kind::Data(c.to_vec().into())),
    }));
    conn.files().write_file(futures::stream::iter(msgs)).await?;
    Ok(0)
}

pub async fn run(conn: &Conn, cmd: FilesCommand, format: Format) -> Result<Status> {
    match cmd {
        FilesCommand::Rm {
            sandbox,
            path,
            recursive,
        } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            conn.files()
                .delete_file(api::DeleteFileRequest {
                    sandbox_id: sandbox.clone(),
                    path: path.clone(),
                    recursive,
                })
                .await?;
            if format == Format::Json {
                output::print_json(
                    &json!({ "sandbox_id": sandbox, "path": path, "removed": true }),
                );
            }
            Ok(0)
        }
        FilesCommand::Watch {
            sandbox,
            path,
            recursive,
        } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            watch(conn, sandbox, path, recursive, format).await
        }
        FilesCommand::Mv {
            sandbox,
            source,
            destination,
            force,
        } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            let file = conn
                .files()
                .move_file(api::MoveFileRequest {
                    sandbox_id: sandbox,
                    source,
                    destination,
                    overwrite: force,
                })
                .await?
                .into_inner()
                .file
                .unwrap_or_default();
            match format {
                Format::Json => output::print_json(&file_json(&file)),
                Format::Text => println!("{}", file.path),
            }
            Ok(0)
        }
        FilesCommand::Mkdir {
            sandbox,
            path,
            mode,
        } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            let dir = conn
                .files()
                .make_directory(api::MakeDirectoryRequest {
                    sandbox_id: sandbox,
                    path,
                    mode: mode.unwrap_or(0),
                })
                .await?
                .into_inner()
                .directory
                .unwrap_or_default();
            match format {
                Format::Json => output::print_json(&file_json(&dir)),
                Format::Text => println!("{}", dir.path),
            }
            Ok(0)
        }
        FilesCommand::Ls {
            sandbox,
            path,
            recursive,
        } => {
            let sandbox = conn.sandbox_id(&sandbox).await?;
            let mut files = Vec::new();
            let mut page_token = String::new();
            loop {
                let r = conn
                    .files()
                    .list_files(api::ListFilesRequest {
                        sandbox_id: sandbox.clone(),
                        path: path.clone(),
                        recursive,
                        page_token: page_token.clone(),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                files.extend(r.files);
                if r.next_page_token.is_empty() {
                    break;
                }
                page_token = r.next_page_token;
            }
            match format {
                Format::Json => {
                    output::print_json(&Value::Array(files.iter().map(file_json).collect()))
                }
                Format::Text => {
                    let rows: Vec<Vec<String>> = files
                        .iter()
                        .map(|f| {
                            let mut name = f.path.clone();
                            match f.r#type() {
                                api::FileType::Directory => name.push('/'),
                                api::FileType::Symlink => {
                                    name.push_str(&format!(" -> {}", f.symlink_target));
                                }
                                _ => {}
                            }
                            vec![
                                format!("{}{:04o}", type_char(f), f.mode),
                                f.size.to_string(),
                                f.modify_time
                                    .as_ref()
                                    .map(output::rfc3339)
                                    .unwrap_or_default(),
                                name,
                            ]
                        })
                        .collect();
                    output::table(&["MODE", "SIZE", "MODIFIED", "PATH"], &rows);
                }
            }
            Ok(0)
        }
    }
}

fn type_char(f: &api::FileInfo) -> char {
    match f.r#type() {
        api::FileType::Directory => 'd',
        api::FileType::Symlink => 'l',
        api::FileType::File => '-',
        _ => '?',
    }
}

/// Follows a watch, one line per event, resuming it (its id, after the last seq) when the stream is cut.
async fn watch(
    conn: &Conn,
    sandbox: String,
    path: String,
    recursive: bool,
    format: Format,
) -> Result<Status> {
    use api::watch_files_response::Kind;
    let mut watch_id = String::new();
    let mut last = 0u64;
    let mut cuts = 0u32;
    loop {
        let opened = conn
            .files()
            .watch_files(api::WatchFilesRequest {
                sandbox_id: sandbox.clone(),
                path: path.clone(),
                recursive,
                watch_id: watch_id.clone(),
                after_seq: last,
            })
            .await;
        let mut stream = match opened {
            Ok(s) => s.into_inner(),
            Err(s) if resumable(&s) && !watch_id.is_empty() && cuts < 30 => {
                cuts += 1;
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
            Err(s) => return Err(s.into()),
        };
        let cut = loop {
            match stream.message().await {
                Ok(Some(m)) => match m.kind {
                    Some(Kind::Started(s)) => {
                        if watch_id.is_empty() {
                            eprintln!("mentis: watching (watch id {})", s.watch_id);
                        }
                        watch_id = s.watch_id;
                        cuts = 0;
                    }
                    Some(Kind::Event(e)) => {
                        last = e.seq;
                        let kind = output::enum_name(e.r#type().as_str_name(), "FILE_EVENT_TYPE_");
                        match format {
                            Format::Json => println!(
                                "{}",
                                json!({
                                    "seq": e.seq,
                                    "type": kind,
                                    "path": e.path,
                                    "is_dir": e.is_dir,
                                    "time": output::time(e.time.as_ref()),
                                })
                            ),
                            Format::Text => {
                                let slash = if e.is_dir { "/" } else { "" };
                                println!("{kind:<9}{}{slash}", e.path);
                            }
                        }
                    }
                    Some(Kind::Gap(g)) => eprintln!(
                        "mentis: events {}..{} are gone (the watch keeps its newest 4096)",
                        g.after_seq + 1,
                        g.first_available_seq.saturating_sub(1)
                    ),
                    Some(Kind::Keepalive(_)) | None => {}
                },
                Ok(None) => break None,
                Err(s) => break Some(s),
            }
        };
        match cut {
            Some(s) if resumable(&s) && cuts < 30 => {
                cuts += 1;
                tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            }
            Some(s) => return Err(s.into()),
            None => return Ok(0),
        }
    }
}

/// Whether a cut stream is worth resuming (the runtime restarting or draining, the connection lost).
fn resumable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        tonic::Code::Unavailable | tonic::Code::Internal | tonic::Code::Unknown
    )
}

fn file_json(f: &api::FileInfo) -> Value {
    json!({
        "path": f.path,
        "type": output::enum_name(f.r#type().as_str_name(), "FILE_TYPE_"),
        "size": f.size,
        "mode": f.mode,
        "modify_time": output::time(f.modify_time.as_ref()),
        "symlink_target": f.symlink_target,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_colon_path_is_remote_and_the_rest_is_local() {
        assert_eq!(remote("sb:a/b.txt"), Some(("sb", "a/b.txt")));
        assert_eq!(remote("sb:"), Some(("sb", "")));
        assert_eq!(remote("./a:b"), None);
        assert_eq!(remote("/tmp/a:b"), None);
        assert_eq!(remote("dir/a:b"), None);
        assert_eq!(remote(":x"), None);
        assert_eq!(remote("plain.txt"), None);
        assert_eq!(base_name("a/b/"), Some("b"));
        assert_eq!(base_name(""), None);
    }
}
