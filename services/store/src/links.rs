//! Web terminal link revocations in the store: a generation per sandbox. A link carries the generation it was
//! made under and opens only while it is still current, so revoking a sandbox's links is one increment, and
//! nothing is kept per link (the same scheme as the preview URLs').

use mentis_core::{Result, SandboxId};
use rusqlite::{OptionalExtension, params};

use super::{Store, db_err};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS link_generations (
    sandbox_id TEXT PRIMARY KEY NOT NULL,
    generation INTEGER NOT NULL
);
";

impl Store {
    /// The link revocation generation of `sandbox`; 0 until first revoked.
    pub fn link_generation(&self, sandbox: SandboxId) -> Result<u64> {
        let found: Option<i64> = self
            .conn()
            .query_row(
                "SELECT generation FROM link_generations WHERE sandbox_id = ?1",
                params![sandbox.to_string()],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_err("read a link generation"))?;
        Ok(found.map_or(0, |g| u64::try_from(g).unwrap_or(0)))
    }

    /// Moves the link generation of `sandbox` on; the new one.
    pub fn revoke_links(&self, sandbox: SandboxId) -> Result<u64> {
        self.conn()
            .query_row(
                "INSERT INTO link_generations (sandbox_id, generation) VALUES (?1, 1)
                 ON CONFLICT (sandbox_id) DO UPDATE SET generation = generation + 1
                 RETURNING generation",
                params![sandbox.to_string()],
                |r| r.get::<_, i64>(0),
            )
            .map(|g| u64::try_from(g).unwrap_or(0))
            .map_err(db_err("revoke terminal links"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn link_generations_start_at_zero_move_on_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let (id, other) = (SandboxId::new(), SandboxId::new());
        {
            let store = Store::open(dir.path()).unwrap();
            assert_eq!(store.link_generation(id).unwrap(), 0);
            assert_eq!(store.revoke_links(id).unwrap(), 1);
            assert_eq!(store.revoke_links(id).unwrap(), 2);
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.link_generation(id).unwrap(), 2);
        assert_eq!(store.link_generation(other).unwrap(), 0);
        // A sandbox forgotten takes its generation along.
        store.delete_sandbox(id).unwrap();
        assert_eq!(store.link_generation(id).unwrap(), 0);
    }
}
