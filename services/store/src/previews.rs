//! Preview URL revocations in the store: a generation per sandbox (port 0) and per sandbox port. A token
//! carries the generations it was issued under and opens only while both are still current, so revoking
//! is one increment, and nothing is kept per token.

use mentis_core::{Result, SandboxId};
use rusqlite::{OptionalExtension, params};

use super::{Store, db_err};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS preview_generations (
    sandbox_id TEXT NOT NULL,
    port INTEGER NOT NULL,
    generation INTEGER NOT NULL,
    PRIMARY KEY (sandbox_id, port)
);
";

impl Store {
    /// The revocation generation of `port` of `sandbox` (0: the sandbox's own); 0 until first revoked.
    pub fn preview_generation(&self, sandbox: SandboxId, port: u16) -> Result<u64> {
        let found: Option<i64> = self
            .conn()
            .query_row(
                "SELECT generation FROM preview_generations WHERE sandbox_id = ?1 AND port = ?2",
                params![sandbox.to_string(), port],
                |r| r.get(0),
            )
            .optional()
            .map_err(db_err("read a preview generation"))?;
        Ok(found.map_or(0, |g| u64::try_from(g).unwrap_or(0)))
    }

    /// Moves the generation of `port` of `sandbox` (0: the sandbox's own) on; the new one.
    pub fn revoke_previews(&self, sandbox: SandboxId, port: u16) -> Result<u64> {
        self.conn()
            .query_row(
                "INSERT INTO preview_generations (sandbox_id, port, generation) VALUES (?1, ?2, 1)
                 ON CONFLICT (sandbox_id, port) DO UPDATE SET generation = generation + 1
                 RETURNING generation",
                params![sandbox.to_string(), port],
                |r| r.get::<_, i64>(0),
            )
            .map(|g| u64::try_from(g).unwrap_or(0))
            .map_err(db_err("revoke preview URLs"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn generations_start_at_zero_move_on_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let id = SandboxId::new();
        {
            let store = Store::open(dir.path()).unwrap();
            assert_eq!(store.preview_generation(id, 8000).unwrap(), 0);
            assert_eq!(store.revoke_previews(id, 8000).unwrap(), 1);
            assert_eq!(store.revoke_previews(id, 8000).unwrap(), 2);
            assert_eq!(store.revoke_previews(id, 0).unwrap(), 1);
        }
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.preview_generation(id, 8000).unwrap(), 2);
        assert_eq!(store.preview_generation(id, 0).unwrap(), 1);
        assert_eq!(store.preview_generation(id, 9000).unwrap(), 0);
        // A sandbox forgotten takes its generations along.
        store.delete_sandbox(id).unwrap();
        assert_eq!(store.preview_generation(id, 8000).unwrap(), 0);
    }
}
