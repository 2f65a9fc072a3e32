//! API keys in the store: their SHA-256, never the keys themselves.

use std::collections::{BTreeMap, BTreeSet};

use mentis_core::{Error, Result, SpaceId};
use rusqlite::params;

use super::{KeyDigest, KeyRecord, Store, db_err, ms, time};

impl Store {
    /// Inserts or replaces a key.
    pub fn put_api_key(&self, k: &KeyRecord) -> Result<()> {
        let spaces: Vec<&str> = k.spaces.iter().map(SpaceId::as_str).collect();
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO api_keys
                 (id, name, digest, spaces, created_ms, revoked_ms, space_generations)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![
                    k.id,
                    k.name,
                    hex::encode(k.digest),
                    serde_json::to_string(&spaces).unwrap_or_else(|_| "[]".into()),
                    ms(k.created_at),
                    k.revoked_at.map(ms),
                    serde_json::to_string(
                        &k.generations
                            .iter()
                            .map(|(s, g)| (s.as_str(), *g))
                            .collect::<BTreeMap<_, _>>()
                    )
                    .unwrap_or_else(|_| "{}".into()),
                ],
            )
            .map_err(db_err("write an API key"))?;
        Ok(())
    }

    /// Every key, in id order.
    pub fn api_keys(&self) -> Result<Vec<KeyRecord>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT id, name, digest, spaces, created_ms, revoked_ms, space_generations
                 FROM api_keys ORDER BY id",
            )
            .map_err(db_err("read API keys"))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, i64>(4)?,
                    r.get::<_, Option<i64>>(5)?,
                    r.get::<_, String>(6)?,
                ))
            })
            .map_err(db_err("read API keys"))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, name, digest, spaces, created, revoked, generations) =
                row.map_err(db_err("read an API key"))?;
            let bad = |what: &str| Error::internal(format!("store: API key {id}: bad {what}"));
            let digest: KeyDigest = hex::decode(&digest)
                .ok()
                .and_then(|d| d.try_into().ok())
                .ok_or_else(|| bad("digest"))?;
            let spaces: Vec<String> = serde_json::from_str(&spaces).map_err(|_| bad("spaces"))?;
            let spaces = spaces
                .iter()
                .map(|s| SpaceId::parse(s))
                .collect::<Result<BTreeSet<_>>>()
                .map_err(|_| bad("spaces"))?;
            let generations: BTreeMap<String, u64> =
                serde_json::from_str(&generations).map_err(|_| bad("space generations"))?;
            let generations = generations
                .into_iter()
                .filter_map(|(s, g)| Some((SpaceId::parse(&s).ok()?, g)))
                .collect();
            out.push(KeyRecord {
                id,
                name,
                spaces,
                generations,
                digest,
                created_at: time(created),
                revoked_at: revoked.map(time),
            });
        }
        Ok(out)
    }
}
