//! Snapshots in the store: what each is (its sandbox, space, labels, size, checksum, where its archive is);
//! the archives themselves are in the snapshot store (`crate::snapshots`).

use std::collections::BTreeMap;
use std::time::SystemTime;

use mentis_core::{Result, SandboxId};
use rusqlite::{OptionalExtension, params};

use super::{Store, db_err, from_json, ms, time, to_json};

/// One snapshot's record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotRecord {
    /// A UUID v7: ids sort by creation time.
    pub id: String,
    pub sandbox_id: String,
    pub space_id: String,
    pub labels: BTreeMap<String, String>,
    pub created_at: SystemTime,
    /// Bytes of the compressed archive.
    pub size: u64,
    /// Bytes of the tar archive before compression.
    pub archive_bytes: u64,
    /// SHA-256 of the compressed archive, hex.
    pub sha256: String,
    /// The store holding the archive ("local", "s3").
    pub store: String,
}

/// Which snapshots a listing wants.
#[derive(Debug, Default)]
pub struct SnapshotFilter<'a> {
    pub sandbox_id: Option<&'a str>,
    /// Only these spaces (None: all).
    pub spaces: Option<Vec<String>>,
    /// Only snapshots carrying all of these labels.
    pub labels: Option<&'a BTreeMap<String, String>>,
    /// Ids below this one (the page token: the last id of the page before).
    pub before: Option<&'a str>,
    pub limit: usize,
}

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS snapshots (
    id TEXT PRIMARY KEY,
    sandbox_id TEXT NOT NULL,
    space_id TEXT NOT NULL,
    labels TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    size INTEGER NOT NULL,
    archive_bytes INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    store TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS restores (
    sandbox_id TEXT PRIMARY KEY,
    snapshot_id TEXT NOT NULL
);
";

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Store {
    /// A restore into new sandbox `sandbox` begins: until [`Store::end_restore`], a restart finds it
    /// unfinished (and discards the sandbox, whose workspace is not the snapshot's).
    pub fn begin_restore(&self, sandbox: SandboxId, snapshot: &str) -> Result<()> {
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO restores (sandbox_id, snapshot_id) VALUES (?1, ?2)",
                params![sandbox.to_string(), snapshot],
            )
            .map_err(db_err("record a restore"))?;
        Ok(())
    }

    /// The restore into `sandbox` ended (done, or its sandbox deleted).
    pub fn end_restore(&self, sandbox: SandboxId) -> Result<()> {
        self.conn()
            .execute(
                "DELETE FROM restores WHERE sandbox_id = ?1",
                params![sandbox.to_string()],
            )
            .map_err(db_err("end a restore"))?;
        Ok(())
    }

    /// The sandboxes whose restore began and never ended.
    pub fn unfinished_restores(&self) -> Result<Vec<SandboxId>> {
        self.ids(
            "SELECT sandbox_id FROM restores ORDER BY sandbox_id",
            "read restores",
            |id| SandboxId::parse(id).ok(),
        )
    }

    /// Records a complete snapshot.
    pub fn put_snapshot(&self, s: &SnapshotRecord) -> Result<()> {
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO snapshots
                 (id, sandbox_id, space_id, labels, created_ms, size, archive_bytes, sha256, store)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    s.id,
                    s.sandbox_id,
                    s.space_id,
                    to_json(&s.labels),
                    ms(s.created_at),
                    count(s.size),
                    count(s.archive_bytes),
                    s.sha256,
                    s.store,
                ],
            )
            .map_err(db_err("write a snapshot"))?;
        Ok(())
    }

    /// The snapshot `id`, if recorded.
    pub fn snapshot(&self, id: &str) -> Result<Option<SnapshotRecord>> {
        let conn = self.conn();
        conn.query_row(
            "SELECT id, sandbox_id, space_id, labels, created_ms, size, archive_bytes, sha256, store
             FROM snapshots WHERE id = ?1",
            params![id],
            row,
        )
        .optional()
        .map_err(db_err("read a snapshot"))
    }

    /// Snapshots matching `f`, newest first, at most `f.limit` (the labels are matched here, after the query).
    pub fn snapshots(&self, f: &SnapshotFilter<'_>) -> Result<Vec<SnapshotRecord>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT id, sandbox_id, space_id, labels, created_ms, size, archive_bytes, sha256, store
                 FROM snapshots
                 WHERE (?1 IS NULL OR sandbox_id = ?1) AND (?2 IS NULL OR id < ?2)
                 ORDER BY id DESC",
            )
            .map_err(db_err("list snapshots"))?;
        let rows = stmt
            .query_map(params![f.sandbox_id, f.before], row)
            .map_err(db_err("list snapshots"))?;
        let mut out = Vec::new();
        for r in rows {
            let s = r.map_err(db_err("read a snapshot"))?;
            if let Some(spaces) = &f.spaces
                && !spaces.contains(&s.space_id)
            {
                continue;
            }
            if let Some(labels) = f.labels
                && labels.iter().any(|(k, v)| s.labels.get(k) != Some(v))
            {
                continue;
            }
            out.push(s);
            if out.len() >= f.limit {
                break;
            }
        }
        Ok(out)
    }

    /// Forgets snapshot `id` (nothing when unknown).
    pub fn delete_snapshot(&self, id: &str) -> Result<()> {
        self.conn()
            .execute("DELETE FROM snapshots WHERE id = ?1", params![id])
            .map_err(db_err("delete a snapshot"))?;
        Ok(())
    }
}

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<SnapshotRecord> {
    let size: i64 = r.get(5)?;
    let archive: i64 = r.get(6)?;
    Ok(SnapshotRecord {
        id: r.get(0)?,
        sandbox_id: r.get(1)?,
        space_id: r.get(2)?,
        labels: from_json(&r.get::<_, String>(3)?),
        created_at: time(r.get(4)?),
        size: u64::try_from(size).unwrap_or(0),
        archive_bytes: u64::try_from(archive).unwrap_or(0),
        sha256: r.get(7)?,
        store: r.get(8)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, sandbox: &str, space: &str, labels: &[(&str, &str)]) -> SnapshotRecord {
        SnapshotRecord {
            id: id.into(),
            sandbox_id: sandbox.into(),
            space_id: space.into(),
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
            created_at: time(1_700_000_000_000),
            size: 10,
            archive_bytes: 20,
            sha256: "ab".repeat(32),
            store: "local".into(),
        }
    }

    #[test]
    fn snapshots_are_kept_listed_newest_first_filtered_and_deleted() -> Result<()> {
        let store = Store::in_memory()?;
        store.put_snapshot(&record("01", "a", "default", &[("k", "v")]))?;
        store.put_snapshot(&record("02", "b", "default", &[]))?;
        store.put_snapshot(&record("03", "a", "other", &[("k", "v")]))?;
        assert_eq!(
            store.snapshot("02")?,
            Some(record("02", "b", "default", &[]))
        );
        assert_eq!(store.snapshot("04")?, None);
        let ids = |f: &SnapshotFilter<'_>| -> Result<Vec<String>> {
            Ok(store.snapshots(f)?.into_iter().map(|s| s.id).collect())
        };
        let all = SnapshotFilter {
            limit: 10,
            ..Default::default()
        };
        assert_eq!(ids(&all)?, ["03", "02", "01"]);
        let page = SnapshotFilter {
            limit: 2,
            before: Some("03"),
            ..Default::default()
        };
        assert_eq!(ids(&page)?, ["02", "01"]);
        let of_a = SnapshotFilter {
            sandbox_id: Some("a"),
            limit: 10,
            ..Default::default()
        };
        assert_eq!(ids(&of_a)?, ["03", "01"]);
        let labelled: BTreeMap<String, String> = [("k".to_owned(), "v".to_owned())].into();
        let spaces = SnapshotFilter {
            spaces: Some(vec!["default".into()]),
            labels: Some(&labelled),
            limit: 10,
            ..Default::default()
        };
        assert_eq!(ids(&spaces)?, ["01"]);
        store.delete_snapshot("01")?;
        store.delete_snapshot("01")?;
        assert_eq!(ids(&all)?, ["03", "02"]);
        Ok(())
    }
}
