//! Accepted actions in the store: their id, a digest of the request and where their observations start, so
//! a retry after a restart replays the action instead of running it again, and the same id with another
//! action is still ALREADY_EXISTS. Written when an action is accepted and when it ends.

use mentis_core::observation::ActionKind;
use mentis_core::{ActionId, Result, SandboxId};
use rusqlite::params;

use super::{Store, db_err};

/// An accepted action as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredAction {
    pub id: ActionId,
    /// Which terminal observation ends it (cmd_end or ipython_result).
    pub kind: ActionKind,
    pub fingerprint: u64,
    pub after_seq: u64,
    pub finished: bool,
}

/// SQLite integers are signed: the fingerprint's bits are kept as they are.
fn to_sql(v: u64) -> i64 {
    i64::from_ne_bytes(v.to_ne_bytes())
}

fn from_sql(v: i64) -> u64 {
    u64::from_ne_bytes(v.to_ne_bytes())
}

/// The columns of an action, as read.
type Row = (String, String, i64, i64, bool);

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?))
}

fn stored((id, kind, fingerprint, after_seq, finished): Row) -> Option<StoredAction> {
    let Ok(id) = ActionId::parse(&id) else {
        tracing::warn!(%id, "store: skipping an action with an invalid id");
        return None;
    };
    Some(StoredAction {
        id,
        kind: if kind == "ipython" {
            ActionKind::IPython
        } else {
            ActionKind::Shell
        },
        fingerprint: from_sql(fingerprint),
        after_seq: from_sql(after_seq),
        finished,
    })
}

impl Store {
    /// Records an accepted action (running).
    pub fn put_action(&self, sandbox: SandboxId, a: &StoredAction) -> Result<()> {
        // Cached statements (here and in finish_action): every action runs them, and preparing one (parsing
        // its SQL) cost as much as running it.
        self.conn()
            .prepare_cached(
                "INSERT OR REPLACE INTO actions
                 (sandbox_id, action_id, kind, fingerprint, after_seq, finished)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )
            .and_then(|mut stmt| {
                stmt.execute(params![
                    sandbox.to_string(),
                    a.id.to_string(),
                    match a.kind {
                        ActionKind::Shell => "shell",
                        ActionKind::IPython => "ipython",
                    },
                    to_sql(a.fingerprint),
                    to_sql(a.after_seq),
                    a.finished,
                ])
            })
            .map_err(db_err("write an action"))?;
        Ok(())
    }

    /// Marks an action ended. With `keep`, also forgets the oldest finished actions of the sandbox beyond
    /// the newest `keep` (a retry of a forgotten one would run again).
    pub fn finish_action(
        &self,
        sandbox: SandboxId,
        id: &ActionId,
        keep: Option<usize>,
    ) -> Result<()> {
        const FINISH: &str =
            "UPDATE actions SET finished = 1 WHERE sandbox_id = ?1 AND action_id = ?2";
        let mut conn = self.conn();
        let sandbox = sandbox.to_string();
        let Some(keep) = keep else {
            // One statement is a transaction of its own.
            conn.prepare_cached(FINISH)
                .and_then(|mut stmt| stmt.execute(params![sandbox, id.to_string()]))
                .map_err(db_err("end an action"))?;
            return Ok(());
        };
        let tx = conn.transaction().map_err(db_err("end an action"))?;
        tx.prepare_cached(FINISH)
            .and_then(|mut stmt| stmt.execute(params![sandbox, id.to_string()]))
            .map_err(db_err("end an action"))?;
        tx.prepare_cached(
            "DELETE FROM actions WHERE rowid IN (
                 SELECT rowid FROM actions WHERE sandbox_id = ?1 AND finished = 1
                 ORDER BY after_seq DESC, rowid DESC LIMIT -1 OFFSET ?2)",
        )
        .and_then(|mut stmt| {
            stmt.execute(params![sandbox, i64::try_from(keep).unwrap_or(i64::MAX)])
        })
        .map_err(db_err("forget old actions"))?;
        tx.commit().map_err(db_err("end an action"))?;
        Ok(())
    }

    /// One stored action of a sandbox.
    pub fn action(&self, sandbox: SandboxId, id: &ActionId) -> Result<Option<StoredAction>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare_cached(
                "SELECT action_id, kind, fingerprint, after_seq, finished FROM actions
                 WHERE sandbox_id = ?1 AND action_id = ?2",
            )
            .map_err(db_err("read an action"))?;
        let mut rows = stmt
            .query_map(params![sandbox.to_string(), id.to_string()], row)
            .map_err(db_err("read an action"))?;
        match rows.next() {
            None => Ok(None),
            Some(r) => Ok(stored(r.map_err(db_err("read an action"))?)),
        }
    }

    /// Forgets an action that was never accepted after all.
    pub fn forget_action(&self, sandbox: SandboxId, id: &ActionId) -> Result<()> {
        self.conn()
            .execute(
                "DELETE FROM actions WHERE sandbox_id = ?1 AND action_id = ?2",
                params![sandbox.to_string(), id.to_string()],
            )
            .map_err(db_err("forget an action"))?;
        Ok(())
    }

    /// Every stored action of a sandbox, in the order they were accepted.
    pub fn actions(&self, sandbox: SandboxId) -> Result<Vec<StoredAction>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT action_id, kind, fingerprint, after_seq, finished FROM actions
                 WHERE sandbox_id = ?1 ORDER BY after_seq, rowid",
            )
            .map_err(db_err("read actions"))?;
        let rows = stmt
            .query_map(params![sandbox.to_string()], row)
            .map_err(db_err("read actions"))?;
        let mut out = Vec::new();
        for r in rows {
            out.extend(stored(r.map_err(db_err("read an action"))?));
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actions_round_trip_end_and_go_with_their_sandbox() -> Result<()> {
        let store = Store::in_memory()?;
        let sandbox = SandboxId::new();
        let a = StoredAction {
            id: ActionId::parse("a-1")?,
            kind: ActionKind::IPython,
            fingerprint: u64::MAX - 7,
            after_seq: 3,
            finished: false,
        };
        let b = StoredAction {
            id: ActionId::parse("b-2")?,
            kind: ActionKind::Shell,
            fingerprint: 42,
            after_seq: 9,
            finished: false,
        };
        store.put_action(sandbox, &a)?;
        store.put_action(sandbox, &b)?;
        store.finish_action(sandbox, &a.id, None)?;
        let read = store.actions(sandbox)?;
        assert_eq!(
            read[0],
            StoredAction {
                finished: true,
                ..a.clone()
            }
        );
        assert_eq!(read[1], b);
        assert_eq!(store.action(sandbox, &b.id)?, Some(b.clone()));
        assert_eq!(store.action(SandboxId::new(), &b.id)?, None);
        store.finish_action(sandbox, &b.id, Some(1))?;
        assert_eq!(
            store.actions(sandbox)?,
            vec![StoredAction {
                finished: true,
                ..b.clone()
            }],
            "beyond the newest finished action kept, the older ones are forgotten"
        );
        store.forget_action(sandbox, &b.id)?;
        assert!(store.actions(sandbox)?.is_empty());
        store.put_action(sandbox, &a)?;
        store.delete_sandbox(sandbox)?;
        assert!(store.actions(sandbox)?.is_empty());
        Ok(())
    }
}
