//! Watching a folder (FileService.WatchFiles) against a real sandbox: what commands do under a watched
//! directory arrives as CREATED, MODIFIED and REMOVED events with increasing seqs, directories made later
//! included when recursive; a stream that ends leaves the watch running, and a new one with its id and the
//! last seq gets the rest (all of it from 0, a gap when some are gone); a watch that is not recursive sees its
//! own directory only; what cannot be watched is refused with its reason; and a sandbox has at most 16.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use mentis_e2e::*;
use mentis_proto::api::{self, file_service_client::FileServiceClient, watch_files_response};

type Watch = tonic::Streaming<api::WatchFilesResponse>;

async fn watch(
    h: &Harness,
    sandbox: &str,
    req: api::WatchFilesRequest,
) -> std::result::Result<(String, u64, Watch), tonic::Status> {
    let mut files = FileServiceClient::new(h.channel.clone());
    let mut stream = files
        .watch_files(api::WatchFilesRequest {
            sandbox_id: sandbox.to_owned(),
            ..req
        })
        .await?
        .into_inner();
    match stream.message().await?.and_then(|m| m.kind) {
        Some(watch_files_response::Kind::Started(s)) => Ok((s.watch_id, s.last_seq, stream)),
        other => Err(tonic::Status::internal(format!(
            "expected started, got {other:?}"
        ))),
    }
}

/// (type, path, is_dir) of each event, and the seqs, until `until` is seen (within 30 s).
async fn events_until(
    stream: &mut Watch,
    until: (api::FileEventType, &str),
) -> Result<Vec<(api::FileEventType, String, bool, u64)>> {
    let mut seen = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(m) = stream.message().await? {
            match m.kind {
                Some(watch_files_response::Kind::Event(e)) => {
                    let t = e.r#type();
                    let done = t == until.0 && e.path == until.1;
                    seen.push((t, e.path, e.is_dir, e.seq));
                    if done {
                        return Ok(());
                    }
                }
                Some(watch_files_response::Kind::Keepalive(_)) => {}
                other => bail!("unexpected {other:?} after {seen:?}"),
            }
        }
        bail!("the stream ended: {seen:?}")
    })
    .await
    .with_context(|| format!("{until:?} never came"))??;
    Ok(seen)
}

fn short(events: &[(api::FileEventType, String, bool, u64)]) -> Vec<String> {
    events
        .iter()
        .map(|(t, p, d, _)| {
            let t = t.as_str_name().trim_start_matches("FILE_EVENT_TYPE_");
            format!("{t} {p}{}", if *d { "/" } else { "" })
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_reports_changes_live_and_resumes_after_a_cut() -> Result<()> {
    use api::FileEventType::*;
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?.sandbox_id;
    h.sh(&sb, "mkdir -p proj").await?;
    let (id, last, mut stream) = watch(
        &h,
        &sb,
        api::WatchFilesRequest {
            path: "proj".into(),
            recursive: true,
            ..Default::default()
        },
    )
    .await?;
    assert!(id.starts_with("watch-"), "{id}");
    assert_eq!(last, 0);

    h.sh(
        &sb,
        "mkdir proj/sub && sleep 0.5 && echo a > proj/sub/f.txt && sleep 0.1 && echo b >> proj/sub/f.txt && \
         mv proj/sub/f.txt proj/g.txt && rm proj/g.txt",
    )
    .await?;
    let seen = events_until(&mut stream, (Removed, "proj/g.txt")).await?;
    let seqs: Vec<u64> = seen.iter().map(|e| e.3).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as u64).collect::<Vec<_>>(),
        "{seen:?}"
    );
    let s = short(&seen);
    for want in [
        "CREATED proj/sub/",
        "CREATED proj/sub/f.txt",
        "MODIFIED proj/sub/f.txt",
        "REMOVED proj/sub/f.txt",
        "CREATED proj/g.txt",
        "REMOVED proj/g.txt",
    ] {
        assert!(s.contains(&want.to_owned()), "no {want}: {s:?}");
    }
    // In the order they happened.
    let at = |w: &str| s.iter().position(|x| x == w).unwrap_or(usize::MAX);
    assert!(
        at("CREATED proj/sub/") < at("CREATED proj/sub/f.txt"),
        "{s:?}"
    );
    assert!(
        at("REMOVED proj/sub/f.txt") < at("CREATED proj/g.txt"),
        "{s:?}"
    );
    let last = *seqs.last().context("no event")?;

    // The stream goes; the watch stays. Later changes come to a stream that resumes after the last seq.
    drop(stream);
    h.sh(&sb, "echo later > proj/sub/later.txt").await?;
    let (again, _, mut stream) = watch(
        &h,
        &sb,
        api::WatchFilesRequest {
            watch_id: id.clone(),
            after_seq: last,
            ..Default::default()
        },
    )
    .await?;
    assert_eq!(again, id);
    let resumed = events_until(&mut stream, (Created, "proj/sub/later.txt")).await?;
    assert_eq!(resumed[0].3, last + 1, "{resumed:?}");
    assert_eq!(short(&resumed)[0], "CREATED proj/sub/later.txt");
    drop(stream);
    // From 0: everything kept, from seq 1.
    let (_, _, mut stream) = watch(
        &h,
        &sb,
        api::WatchFilesRequest {
            watch_id: id.clone(),
            ..Default::default()
        },
    )
    .await?;
    let all = events_until(&mut stream, (Created, "proj/sub/later.txt")).await?;
    assert_eq!(all[0].3, 1);
    assert_eq!(short(&all[..seen.len()]), s);
    drop(stream);

    // A burst of writes to one file: one MODIFIED at once and one when 50 ms are over, never one a write;
    // a file replaced whole through WriteFile is CREATED, without the executor's temporary file. (One
    // MODIFIED alone is right too: inotify merges a file's identical events while the reader is behind, so a
    // loaded machine can see the whole burst as one, which still comes after its last write.)
    let (_, _, mut burst) = watch(
        &h,
        &sb,
        api::WatchFilesRequest {
            watch_id: id.clone(),
            after_seq: all.last().map_or(0, |e| e.3),
            ..Default::default()
        },
    )
    .await?;
    h.sh(
        &sb,
        "for i in $(seq 1 200); do echo $i >> proj/burst.txt; done; sleep 0.3; touch proj/after-burst",
    )
    .await?;
    let seen = events_until(&mut burst, (Created, "proj/after-burst")).await?;
    let modified = seen
        .iter()
        .filter(|e| e.0 == Modified && e.1 == "proj/burst.txt")
        .count();
    assert!(
        (1..=40).contains(&modified),
        "{modified}: {:?}",
        short(&seen)
    );
    let mut files = FileServiceClient::new(h.channel.clone());
    for content in ["one", "two"] {
        files
            .write_file(futures::stream::iter([
                api::WriteFileRequest {
                    kind: Some(api::write_file_request::Kind::Header(
                        api::WriteFileHeader {
                            sandbox_id: sb.clone(),
                            path: "proj/written.txt".into(),
                            mode: 0,
                        },
                    )),
                },
                api::WriteFileRequest {
                    kind: Some(api::write_file_request::Kind::Data(
                        content.as_bytes().to_vec().into(),
                    )),
                },
            ]))
            .await?;
    }
    h.sh(&sb, "touch proj/after-writes").await?;
    let seen = events_until(&mut burst, (Created, "proj/after-writes")).await?;
    assert_eq!(
        short(&seen),
        [
            "CREATED proj/written.txt",
            "CREATED proj/written.txt",
            "CREATED proj/after-writes"
        ],
    );
    drop(burst);

    // A watch that is not recursive: its own directory's entries only.
    let (_, _, mut flat) = watch(
        &h,
        &sb,
        api::WatchFilesRequest {
            path: "/workspace".into(),
            ..Default::default()
        },
    )
    .await?;
    h.sh(&sb, "touch proj/deep.txt && touch top.txt").await?;
    let top = events_until(&mut flat, (Created, "top.txt")).await?;
    assert_eq!(short(&top), ["CREATED top.txt"], "{top:?}");

    // Too many events for the watch to keep: a reader from 0 is told which are gone.
    let (gid, _, g) = watch(
        &h,
        &sb,
        api::WatchFilesRequest {
            path: "proj".into(),
            ..Default::default()
        },
    )
    .await?;
    drop(g);
    h.sh(
        &sb,
        "cd proj && for i in $(seq 1 2100); do : > f$i; rm f$i; done; touch end.txt",
    )
    .await?;
    let (_, newest, mut g) = watch(
        &h,
        &sb,
        api::WatchFilesRequest {
            watch_id: gid,
            ..Default::default()
        },
    )
    .await?;
    assert!(newest > 4096, "{newest}");
    match g.message().await?.and_then(|m| m.kind) {
        Some(watch_files_response::Kind::Gap(gap)) => {
            assert_eq!(gap.after_seq, 0);
            assert_eq!(gap.first_available_seq, newest - 4096 + 1, "{gap:?}");
        }
        other => bail!("expected a gap first, got {other:?}"),
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_watched_is_refused_with_its_reason() -> Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?.sandbox_id;
    h.sh(&sb, "echo x > file.txt && ln -s /etc link").await?;
    let refused =
        |r: std::result::Result<(String, u64, Watch), tonic::Status>| refusal(r.map(drop));
    for (req, code, reason) in [
        (
            api::WatchFilesRequest {
                path: "file.txt".into(),
                ..Default::default()
            },
            tonic::Code::InvalidArgument,
            "INVALID_ARGUMENT",
        ),
        (
            api::WatchFilesRequest {
                path: "nothing".into(),
                ..Default::default()
            },
            tonic::Code::NotFound,
            "PATH_NOT_FOUND",
        ),
        (
            api::WatchFilesRequest {
                path: "/etc".into(),
                ..Default::default()
            },
            tonic::Code::InvalidArgument,
            "INVALID_ARGUMENT",
        ),
        (
            api::WatchFilesRequest {
                path: "link".into(),
                ..Default::default()
            },
            tonic::Code::InvalidArgument,
            "INVALID_ARGUMENT",
        ),
        (
            api::WatchFilesRequest {
                watch_id: "watch-000000000000".into(),
                ..Default::default()
            },
            tonic::Code::NotFound,
            "PATH_NOT_FOUND",
        ),
        (
            api::WatchFilesRequest {
                watch_id: "not a watch".into(),
                ..Default::default()
            },
            tonic::Code::InvalidArgument,
            "INVALID_ARGUMENT",
        ),
    ] {
        let shown = format!("{req:?}");
        let (got, why, _) = refused(watch(&h, &sb, req).await);
        assert_eq!((got, why.as_str()), (code, reason), "{shown}");
    }
    // after_seq beyond the newest event.
    let (id, _, first) = watch(&h, &sb, api::WatchFilesRequest::default()).await?;
    let (got, why, _) = refused(
        watch(
            &h,
            &sb,
            api::WatchFilesRequest {
                watch_id: id.clone(),
                after_seq: 10,
                ..Default::default()
            },
        )
        .await,
    );
    assert_eq!(
        (got, why.as_str()),
        (tonic::Code::OutOfRange, "SEQ_OUT_OF_RANGE")
    );
    // 16 watches at most (the one above is the first): while each has a reader, a 17th is refused.
    let mut kept = vec![(id, first)];
    for _ in 0..15 {
        let (id, _, s) = watch(&h, &sb, api::WatchFilesRequest::default()).await?;
        kept.push((id, s));
    }
    let (got, _, _) = refused(watch(&h, &sb, api::WatchFilesRequest::default()).await);
    assert_eq!(got, tonic::Code::FailedPrecondition);
    // Readers gone, the watches stay; a new one takes the place of the one read least recently.
    let ids: Vec<String> = kept.iter().map(|(id, _)| id.clone()).collect();
    for (_, stream) in kept {
        drop(stream);
        // Apart, so that their readers' ends are in order.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    let _newest = loop {
        match watch(&h, &sb, api::WatchFilesRequest::default()).await {
            Ok(w) => break w,
            Err(s) if s.code() == tonic::Code::FailedPrecondition => {
                anyhow::ensure!(
                    tokio::time::Instant::now() < deadline,
                    "no place for a new watch: {s:?}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(s) => bail!("{s:?}"),
        }
    };
    let (got, why, _) = refused(
        watch(
            &h,
            &sb,
            api::WatchFilesRequest {
                watch_id: ids[0].clone(),
                ..Default::default()
            },
        )
        .await,
    );
    assert_eq!(
        (got, why.as_str()),
        (tonic::Code::NotFound, "PATH_NOT_FOUND"),
        "the watch read least recently ended"
    );
    for id in &ids[1..] {
        let (_, _, s) = watch(
            &h,
            &sb,
            api::WatchFilesRequest {
                watch_id: id.clone(),
                ..Default::default()
            },
        )
        .await?;
        drop(s);
    }
    Ok(())
}
