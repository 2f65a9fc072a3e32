//! The secrets of spaces (docs/EGRESS.md, "Secrets"): one row per space, its secrets sealed together like a
//! sandbox's env, bound to the space (a row moved to another space does not open). The egress gateway reads
//! them; no API returns a value. A space's row goes with the space.

use std::collections::BTreeMap;

use mentis_core::{Result, SpaceId};
use rusqlite::{OptionalExtension, params};

use super::{Store, db_err};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS space_secrets (
    space_id TEXT PRIMARY KEY,
    secrets TEXT NOT NULL
);
";

/// What a space's secrets are sealed for.
fn owner(space: &SpaceId) -> String {
    format!("secrets:{space}")
}

/// A space's sealed row, when it has one.
fn sealed(conn: &rusqlite::Connection, space: &SpaceId) -> Result<Option<String>> {
    conn.query_row(
        "SELECT secrets FROM space_secrets WHERE space_id = ?1",
        params![space.as_str()],
        |r| r.get(0),
    )
    .optional()
    .map_err(db_err("read a space's secrets"))
}

impl Store {
    /// Every secret of a space, by name (empty when it has none, or its row does not open).
    pub fn secrets(&self, space: &SpaceId) -> Result<BTreeMap<String, String>> {
        let sealed = sealed(&self.conn(), space)?;
        Ok(sealed
            .and_then(|s| {
                let opened = self.sealer().open_env_of(&owner(space), &s);
                if opened.is_none() {
                    tracing::warn!(space_id = %space, "store: a space's secrets do not open (damaged)");
                }
                opened
            })
            .unwrap_or_default())
    }

    /// Changes a space's secrets with `change` (in one transaction); returns what `change` returned.
    pub fn change_secrets<T>(
        &self,
        space: &SpaceId,
        change: impl FnOnce(&mut BTreeMap<String, String>) -> T,
    ) -> Result<T> {
        let mut conn = self.conn();
        let tx = conn
            .transaction()
            .map_err(db_err("change a space's secrets"))?;
        let mut secrets = sealed(&tx, space)?
            .and_then(|s| self.sealer().open_env_of(&owner(space), &s))
            .unwrap_or_default();
        let out = change(&mut secrets);
        if secrets.is_empty() {
            tx.execute(
                "DELETE FROM space_secrets WHERE space_id = ?1",
                params![space.as_str()],
            )
        } else {
            tx.execute(
                "INSERT OR REPLACE INTO space_secrets (space_id, secrets) VALUES (?1, ?2)",
                params![
                    space.as_str(),
                    self.sealer().seal_env_of(&owner(space), &secrets)
                ],
            )
        }
        .map_err(db_err("write a space's secrets"))?;
        tx.commit().map_err(db_err("change a space's secrets"))?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn secrets_are_sealed_per_space_and_go_with_it() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let (a, b) = (
            SpaceId::parse("team-a").unwrap(),
            SpaceId::parse("team-b").unwrap(),
        );
        store
            .change_secrets(&a, |s| s.insert("TOKEN".into(), "tok-value-123".into()))
            .unwrap();
        assert_eq!(store.secrets(&a).unwrap()["TOKEN"], "tok-value-123");
        assert!(store.secrets(&b).unwrap().is_empty());
        // Not in the database file as it was given.
        drop(store);
        let raw = std::fs::read(dir.path().join(crate::DB_FILE)).unwrap();
        let wal = std::fs::read(dir.path().join("mentis.db-wal")).unwrap_or_default();
        for bytes in [raw, wal] {
            assert!(!bytes.windows(13).any(|w| w == b"tok-value-123"));
        }
        let store = Store::open(dir.path()).unwrap();
        // A row moved to another space does not open there.
        store
            .conn()
            .execute(
                "UPDATE space_secrets SET space_id = 'team-b' WHERE space_id = 'team-a'",
                [],
            )
            .unwrap();
        assert!(store.secrets(&b).unwrap().is_empty());
        store
            .conn()
            .execute(
                "UPDATE space_secrets SET space_id = 'team-a' WHERE space_id = 'team-b'",
                [],
            )
            .unwrap();
        assert!(
            store
                .change_secrets(&a, |s| s.remove("TOKEN").is_some())
                .unwrap()
        );
        assert!(store.secrets(&a).unwrap().is_empty());
        store
            .change_secrets(&a, |s| s.insert("X".into(), "y".into()))
            .unwrap();
        store.delete_space(&a).unwrap();
        assert!(store.secrets(&a).unwrap().is_empty());
    }
}
