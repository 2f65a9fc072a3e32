//! `mentis snapshot ...`: SnapshotService (the restore is `mentis sandbox create --snapshot ID`).

use clap::{Args, Subcommand};
use mentis_proto::api;
use serde_json::{Value, json};

use crate::client::{Conn, pairs};
use crate::error::{Result, Status};
use crate::output::{self, Format};

#[derive(Subcommand, Debug)]
pub enum SnapshotCommand {
    /// Take a snapshot of a sandbox's workspace and print it once it is complete (text: its id only).
    Create(CreateArgs),
    /// List snapshots, newest first.
    List(ListArgs),
    /// Show one snapshot.
    Get { snapshot: String },
    /// Delete a snapshot and its archive (one already gone is no error).
    Delete { snapshot: String },
}

#[derive(Args, Debug)]
pub struct CreateArgs {
    /// The sandbox whose workspace is taken (RUNNING, or PAUSED with auto-resume).
    sandbox: String,
    /// Label (repeatable).
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    labels: Vec<String>,
}

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Only this sandbox's snapshots.
    #[arg(long, default_value = "", hide_default_value = true)]
    sandbox: String,
    /// Only this space's snapshots.
    #[arg(long, default_value = "", hide_default_value = true)]
    space: String,
    /// Only snapshots with this label (repeatable; all must match).
    #[arg(long = "label", short = 'l', value_name = "KEY=VALUE")]
    labels: Vec<String>,
    /// At most this many, the newest (0: all).
    #[arg(long, default_value_t = 0)]
    limit: usize,
}

pub async fn run(conn: &Conn, cmd: SnapshotCommand, format: Format) -> Result<Status> {
    let mut c = conn.snapshots();
    match cmd {
        SnapshotCommand::Create(mut a) => {
            a.sandbox = conn.sandbox_id(&a.sandbox).await?;
            let labels = pairs(&a.labels, "--label")?;
            let s = c
                .create_snapshot(api::CreateSnapshotRequest {
                    sandbox_id: a.sandbox,
                    labels,
                })
                .await?
                .into_inner()
                .snapshot
                .unwrap_or_default();
            match format {
                Format::Json => output::print_json(&snapshot_json(&s)),
                Format::Text => println!("{}", s.snapshot_id),
            }
        }
        SnapshotCommand::List(mut a) => {
            if !a.sandbox.is_empty() {
                a.sandbox = conn.sandbox_id(&a.sandbox).await?;
            }
            let labels = pairs(&a.labels, "--label")?;
            // A limit fetches pages of its size (the runtime's cap is 1000).
            let page_size = i32::try_from(a.limit.min(1000)).unwrap_or(1000);
            let mut all = Vec::new();
            let mut page_token = String::new();
            loop {
                let r = c
                    .list_snapshots(api::ListSnapshotsRequest {
                        sandbox_id: a.sandbox.clone(),
                        space_id: a.space.clone(),
                        labels: labels.clone(),
                        page_size,
                        page_token: page_token.clone(),
                    })
                    .await?
                    .into_inner();
                all.extend(r.snapshots);
                if a.limit > 0 && all.len() >= a.limit {
                    all.truncate(a.limit);
                    break;
                }
                if r.next_page_token.is_empty() {
                    break;
                }
                page_token = r.next_page_token;
            }
            match format {
                Format::Json => {
                    output::print_json(&Value::Array(all.iter().map(snapshot_json).collect()))
                }
                Format::Text => output::table(
                    &["SNAPSHOT", "SANDBOX", "CREATED", "SIZE", "SPACE", "LABELS"],
                    &all.iter()
                        .map(|s| {
                            vec![
                                s.snapshot_id.clone(),
                                s.sandbox_id.clone(),
                                s.create_time
                                    .as_ref()
                                    .map(output::rfc3339)
                                    .unwrap_or_default(),
                                s.size_bytes.to_string(),
                                s.space_id.clone(),
                                labels_text(s),
                            ]
                        })
                        .collect::<Vec<_>>(),
                ),
            }
        }
        SnapshotCommand::Get { snapshot } => {
            let s = c
                .get_snapshot(api::GetSnapshotRequest {
                    snapshot_id: snapshot,
                })
                .await?
                .into_inner()
                .snapshot
                .unwrap_or_default();
            match format {
                Format::Json => output::print_json(&snapshot_json(&s)),
                Format::Text => output::fields(&snapshot_json(&s)),
            }
        }
        SnapshotCommand::Delete { snapshot } => {
            c.delete_snapshot(api::DeleteSnapshotRequest {
                snapshot_id: snapshot.clone(),
            })
            .await?;
            match format {
                Format::Json => {
                    output::print_json(&json!({ "snapshot_id": snapshot, "deleted": true }))
                }
                Format::Text => println!("{snapshot}"),
            }
        }
    }
    Ok(0)
}

/// Labels as `k=v,k2=v2`, sorted by key.
fn labels_text(s: &api::Snapshot) -> String {
    let sorted: std::collections::BTreeMap<_, _> = s.labels.iter().collect();
    sorted
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// A snapshot as JSON: the proto's field names.
pub fn snapshot_json(s: &api::Snapshot) -> Value {
    json!({
        "snapshot_id": s.snapshot_id,
        "sandbox_id": s.sandbox_id,
        "space_id": s.space_id,
        "labels": output::map(&s.labels),
        "create_time": output::time(s.create_time.as_ref()),
        "size_bytes": s.size_bytes,
        "archive_bytes": s.archive_bytes,
        "sha256": s.sha256,
        "store": s.store,
    })
}
