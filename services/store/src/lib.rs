//! mentis-store, the control plane's durable store: spaces and sandbox records in an embedded SQLite database under `MENTIS_DATA_DIR`, so
//! that the control plane's memory survives its own restart. The in-memory handles stay the source of truth
//! while the runtime runs; the store is written through on every change that matters after a crash
//! (create, pause, resume, delete, space changes) and flushed periodically for the rest (health state, last
//! activity, the newest seq).
//!
//! Calls are synchronous: each is one small statement on a WAL-mode database with `synchronous=NORMAL`
//! (no fsync per commit), well under a millisecond, made at control-plane rates. The connection sits
//! behind a mutex.
//!
//! The store holds no usable secret (`seal`): executor tokens are derived from the data folder's key, never
//! written (the `token` columns stay empty; rows of schema 5 and older keep theirs, see
//! [`Store::open`]), and each sandbox's env is sealed with it. The database file is made 0600, and SQLite
//! gives its `-wal` and `-shm` files the same mode.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mentis_core::{
    Error, Expiry, IdlePolicy, Limits, Result, Sandbox, SandboxId, SandboxState, SnapshotPolicy,
    Space, SpaceId, SpaceLimits,
};
use rusqlite::{Connection, OptionalExtension, params};

pub mod actions;
pub mod egress;
pub mod images;
mod keys;
pub mod links;
pub mod previews;
pub mod private;
pub mod seal;
pub mod secrets;
pub mod snapshots;
pub mod templates;

pub use seal::{KEY_FILE, MAX_SIGNED_LEN, Sealer, Signed};

/// SHA-256 of a key.
pub type KeyDigest = [u8; 32];

/// A space-scoped key as stored (never its secret).
#[derive(Debug, Clone, PartialEq)]
pub struct KeyRecord {
    pub id: String,
    pub name: String,
    pub spaces: BTreeSet<SpaceId>,
    /// The generation of each of `spaces` the key was made for (none: 0, a space made before generations):
    /// a space deleted and made again is another generation, which the key does not reach.
    pub generations: BTreeMap<SpaceId, u64>,
    pub digest: KeyDigest,
    pub created_at: SystemTime,
    pub revoked_at: Option<SystemTime>,
}

/// Schema version in `PRAGMA user_version` (7 added the images' owners and the spaces' generations: a
/// runtime that did not know them would let every space use every image and an old key reach a space made
/// again under its id, so it must not open a store that has them; 8 added egress rules, `egress` 2, which a
/// runtime before it would read as an open route out).
const SCHEMA_VERSION: i64 = 9;

/// The first schema whose tokens are derived and envs sealed: from it on, the key file must exist.
const SEALED_SCHEMA: i64 = 6;

/// Name of the database file in the data folder.
pub const DB_FILE: &str = "mentis.db";

/// What the migration to schema 6 leaves in the `token` column of a pool member made before it.
const LEGACY_MEMBER: &str = "replace";

/// The meta key holding the id of the key the store is sealed with.
const KEY_ID: &str = "key_id";

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS space_generations (
    id TEXT PRIMARY KEY,
    generation INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS spaces (
    id TEXT PRIMARY KEY,
    display_name TEXT NOT NULL,
    description TEXT NOT NULL,
    metadata TEXT NOT NULL,
    max_sandboxes INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    sandbox_limits TEXT NOT NULL DEFAULT '{}',
    snapshot_policy TEXT NOT NULL DEFAULT '{}',
    runtime_class TEXT NOT NULL DEFAULT '',
    egress INTEGER NOT NULL DEFAULT -1,
    egress_rules TEXT NOT NULL DEFAULT '[]',
    egress_cap INTEGER NOT NULL DEFAULT 1,
    egress_cap_rules TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS sandboxes (
    id TEXT PRIMARY KEY,
    space_id TEXT NOT NULL,
    state TEXT NOT NULL,
    state_reason TEXT NOT NULL,
    image TEXT NOT NULL,
    labels TEXT NOT NULL,
    env TEXT NOT NULL,
    cpu REAL NOT NULL,
    memory_mb INTEGER NOT NULL,
    pids INTEGER NOT NULL,
    token TEXT NOT NULL,
    external_key TEXT,
    idle_timeout_s INTEGER NOT NULL,
    idle_policy TEXT NOT NULL,
    max_lifetime_s INTEGER NOT NULL,
    auto_resume INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    activity_ms INTEGER NOT NULL,
    last_seq INTEGER NOT NULL,
    egress INTEGER NOT NULL DEFAULT 0,
    nofile INTEGER NOT NULL DEFAULT 0,
    read_only INTEGER NOT NULL DEFAULT 0,
    disk_mb INTEGER NOT NULL DEFAULT 0,
    template TEXT NOT NULL DEFAULT '',
    work_dir TEXT NOT NULL DEFAULT '',
    runtime_class TEXT NOT NULL DEFAULT '',
    egress_rules TEXT NOT NULL DEFAULT '[]'
);
CREATE INDEX IF NOT EXISTS sandboxes_by_space ON sandboxes(space_id);
CREATE TABLE IF NOT EXISTS pool (
    id TEXT PRIMARY KEY,
    image TEXT NOT NULL,
    token TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    template TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS api_keys (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    digest TEXT NOT NULL UNIQUE,
    spaces TEXT NOT NULL,
    created_ms INTEGER NOT NULL,
    revoked_ms INTEGER
);
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS actions (
    sandbox_id TEXT NOT NULL,
    action_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    fingerprint INTEGER NOT NULL,
    after_seq INTEGER NOT NULL,
    finished INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (sandbox_id, action_id)
);
";

/// A sandbox as stored: its record and what the runtime needs to take it over again.
#[derive(Clone)]
pub struct StoredSandbox {
    pub record: Sandbox,
    pub env: BTreeMap<String, String>,
    /// The executor's token: derived from the key, or the one a sandbox of schema 5 or older was made with.
    /// Never logged.
    pub token: String,
    pub last_seq: u64,
}

impl std::fmt::Debug for StoredSandbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredSandbox")
            .field("record", &self.record)
            .field("last_seq", &self.last_seq)
            .finish_non_exhaustive()
    }
}

/// A warm pool member as stored: a container made ahead, not yet any sandbox.
#[derive(Clone)]
pub struct StoredMember {
    pub id: SandboxId,
    pub image: String,
    /// The key of its template's pool (`SPACE/NAME@VERSION`); empty for an image's pool.
    pub template: String,
    /// Never logged.
    pub token: String,
    /// Made by a runtime of schema 5 or older, with a random token its container alone knows now (the
    /// migration removed it from the store, leaving [`LEGACY_MEMBER`]): replaced rather than taken over.
    pub legacy: bool,
}

impl std::fmt::Debug for StoredMember {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoredMember")
            .field("id", &self.id)
            .field("image", &self.image)
            .field("legacy", &self.legacy)
            .finish_non_exhaustive()
    }
}

/// The database.
pub struct Store {
    conn: Mutex<Connection>,
    sealer: Sealer,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").finish_non_exhaustive()
    }
}

fn db_err(what: &str) -> impl FnOnce(rusqlite::Error) -> Error + '_ {
    move |e| Error::internal(format!("store: {what}")).with_source(e)
}

pub fn ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub fn time(ms: i64) -> SystemTime {
    UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

fn to_json(map: &BTreeMap<String, String>) -> String {
    serde_json::to_string(map).unwrap_or_else(|_| "{}".to_owned())
}

fn from_json(text: &str) -> BTreeMap<String, String> {
    serde_json::from_str(text).unwrap_or_default()
}

/// The name of a state in the store.
pub fn state_key(s: SandboxState) -> &'static str {
    match s {
        SandboxState::Creating => "creating",
        SandboxState::Running => "running",
        SandboxState::Paused => "paused",
        SandboxState::Terminating => "terminating",
        SandboxState::Terminated => "terminated",
        SandboxState::Failed => "failed",
        SandboxState::Unhealthy => "unhealthy",
        SandboxState::Pausing => "pausing",
        SandboxState::Resuming => "resuming",
    }
}

fn parse_state(s: &str) -> SandboxState {
    match s {
        "creating" => SandboxState::Creating,
        "running" => SandboxState::Running,
        "paused" => SandboxState::Paused,
        "terminating" => SandboxState::Terminating,
        "terminated" => SandboxState::Terminated,
        "unhealthy" => SandboxState::Unhealthy,
        "pausing" => SandboxState::Pausing,
        "resuming" => SandboxState::Resuming,
        _ => SandboxState::Failed,
    }
}

impl Store {
    /// Opens (creating when missing) the database `mentis.db` in `dir` with the key `mentis.key` beside it.
    /// The key is made with a new store, and with a store of schema 5 or older, which is then migrated: its
    /// plain envs are sealed, ended sandboxes lose their stored tokens, and live ones keep theirs (their
    /// containers know no other), so a running sandbox survives the upgrade; no token is written again. From
    /// schema 6 on, a missing key, or another key than the store's, is an error naming the file.
    pub fn open(dir: &Path) -> Result<Self> {
        crate::private::create_dir(dir).map_err(|e| {
            Error::internal(format!(
                "store: cannot create the data folder {}: {e}",
                dir.display()
            ))
        })?;
        let db = dir.join(DB_FILE);
        // Made 0600 before SQLite opens it: SQLite gives the -wal and -shm files the database's mode.
        crate::private::file_options()
            .append(true)
            .create(true)
            .open(&db)
            .map_err(|e| Error::internal(format!("store: cannot create {}: {e}", db.display())))?;
        let conn = Connection::open(&db).map_err(db_err("open"))?;
        let version = schema_version(&conn)?;
        let key_file = dir.join(KEY_FILE);
        let sealer = Sealer::load(&key_file, version < SEALED_SCHEMA)?;
        Self::init(conn, sealer, &key_file.display().to_string())
    }

    /// A database in memory with a key of its own (unit tests).
    pub fn in_memory() -> Result<Self> {
        Self::init(
            Connection::open_in_memory().map_err(db_err("open"))?,
            Sealer::random(),
            "(in memory)",
        )
    }

    fn init(conn: Connection, sealer: Sealer, key_file: &str) -> Result<Self> {
        conn.busy_timeout(Duration::from_secs(5))
            .map_err(db_err("busy timeout"))?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(db_err("journal mode"))?;
        conn.pragma_update(None, "synchronous", "NORMAL")
            .map_err(db_err("synchronous"))?;
        // What is deleted or overwritten (an env sealed in place of its plain text) is zeroed in the file.
        conn.pragma_update(None, "secure_delete", "ON")
            .map_err(db_err("secure delete"))?;
        let version = schema_version(&conn)?;
        if version > SCHEMA_VERSION {
            return Err(Error::internal(format!(
                "store: the database has schema {version}, newer than this runtime's {SCHEMA_VERSION}"
            )));
        }
        match conn
            .query_row(
                "SELECT value FROM meta WHERE key = ?1",
                params![KEY_ID],
                |r| r.get::<_, String>(0),
            )
            .optional()
        {
            Ok(Some(id)) if id != sealer.key_id() => {
                return Err(Error::internal(format!(
                    "the store's key {key_file} is not the key the store was sealed with (key id {}, \
                     the store's is {id}): put the right file back, or start on an empty MENTIS_DATA_DIR \
                     (this instance's existing sandboxes are then removed)",
                    sealer.key_id()
                )));
            }
            // A new database has no meta table yet.
            Ok(_) | Err(_) => {}
        }
        conn.execute_batch(SCHEMA).map_err(db_err("schema"))?;
        conn.execute_batch(snapshots::SCHEMA)
            .map_err(db_err("schema"))?;
        conn.execute_batch(previews::SCHEMA)
            .map_err(db_err("schema"))?;
        conn.execute_batch(links::SCHEMA)
            .map_err(db_err("schema"))?;
        conn.execute_batch(templates::SCHEMA)
            .map_err(db_err("schema"))?;
        conn.execute_batch(images::SCHEMA)
            .map_err(db_err("schema"))?;
        conn.execute_batch(secrets::SCHEMA)
            .map_err(db_err("schema"))?;
        // CREATE TABLE IF NOT EXISTS leaves an older table as it was: add what later versions added
        // (2: egress; 3: nofile, read_only, the spaces' sandbox limits; 3 also added api_keys; 4 added
        // actions; 5: disk_mb, 0 for older sandboxes, whose workspaces have no disk limit; 6: the spaces'
        // snapshot policies, none for older spaces; the sandboxes' template and work_dir, none for older
        // sandboxes; the pool members' template, none for older members; the spaces' generation and
        // deletion mark, and the keys' generations of their spaces: 0 and none for older ones; the runtime
        // classes of sandboxes, spaces and templates: the default for older ones).
        for (table, column, decl) in [
            ("sandboxes", "egress", "INTEGER NOT NULL DEFAULT 0"),
            ("sandboxes", "nofile", "INTEGER NOT NULL DEFAULT 0"),
            ("sandboxes", "read_only", "INTEGER NOT NULL DEFAULT 0"),
            ("sandboxes", "disk_mb", "INTEGER NOT NULL DEFAULT 0"),
            ("sandboxes", "template", "TEXT NOT NULL DEFAULT ''"),
            ("sandboxes", "work_dir", "TEXT NOT NULL DEFAULT ''"),
            ("pool", "template", "TEXT NOT NULL DEFAULT ''"),
            ("spaces", "sandbox_limits", "TEXT NOT NULL DEFAULT '{}'"),
            ("spaces", "snapshot_policy", "TEXT NOT NULL DEFAULT '{}'"),
            ("spaces", "generation", "INTEGER NOT NULL DEFAULT 0"),
            ("spaces", "deleting", "INTEGER NOT NULL DEFAULT 0"),
            ("spaces", "runtime_class", "TEXT NOT NULL DEFAULT ''"),
            ("sandboxes", "runtime_class", "TEXT NOT NULL DEFAULT ''"),
            ("templates", "runtime_class", "TEXT NOT NULL DEFAULT ''"),
            ("sandboxes", "egress_rules", "TEXT NOT NULL DEFAULT '[]'"),
            ("templates", "egress", "INTEGER NOT NULL DEFAULT -1"),
            ("templates", "egress_rules", "TEXT NOT NULL DEFAULT '[]'"),
            ("spaces", "egress", "INTEGER NOT NULL DEFAULT -1"),
            ("spaces", "egress_rules", "TEXT NOT NULL DEFAULT '[]'"),
            ("spaces", "egress_cap", "INTEGER NOT NULL DEFAULT 1"),
            ("spaces", "egress_cap_rules", "TEXT NOT NULL DEFAULT '[]'"),
            (
                "api_keys",
                "space_generations",
                "TEXT NOT NULL DEFAULT '{}'",
            ),
        ] {
            add_column_if_missing(&conn, table, column, decl)?;
        }
        if version > 0 && version < SEALED_SCHEMA {
            seal_rows(&conn, &sealer)?;
        }
        conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
            params![KEY_ID, sealer.key_id()],
        )
        .map_err(db_err("write the key id"))?;
        conn.pragma_update(None, "user_version", SCHEMA_VERSION)
            .map_err(db_err("schema version"))?;
        Ok(Self {
            conn: Mutex::new(conn),
            sealer,
        })
    }

    /// The executor token of sandbox (or pool member) `id`, derived from the key.
    pub fn executor_token(&self, id: SandboxId) -> String {
        self.sealer.executor_token(id)
    }

    /// The key derived from the data folder's key that signs web terminal links.
    pub fn sealer(&self) -> &Sealer {
        &self.sealer
    }

    fn conn(&self) -> std::sync::MutexGuard<'_, Connection> {
        // A panic mid-statement leaves SQLite consistent (each statement is atomic).
        self.conn.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Inserts or replaces a space.
    pub fn put_space(&self, s: &Space) -> Result<()> {
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO spaces
                 (id, display_name, description, metadata, max_sandboxes, created_ms, updated_ms,
                  sandbox_limits, snapshot_policy, generation, runtime_class, egress, egress_rules,
                  egress_cap, egress_cap_rules)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                params![
                    s.id.as_str(),
                    s.display_name,
                    s.description,
                    to_json(&s.metadata),
                    s.limits.max_sandboxes,
                    ms(s.created_at),
                    ms(s.updated_at),
                    space_limits_json(&s.limits),
                    policy_json(&s.snapshot_policy),
                    i64::try_from(s.generation).unwrap_or(i64::MAX),
                    s.runtime_class,
                    s.egress.as_ref().map_or(-1, egress::mode_to_sql),
                    s.egress
                        .as_ref()
                        .map_or_else(|| "[]".to_owned(), egress::rules_to_sql),
                    egress::mode_to_sql(&s.egress_cap.to_egress()),
                    egress::rules_to_sql(&s.egress_cap.to_egress()),
                ],
            )
            .map_err(db_err("write a space"))?;
        Ok(())
    }

    /// The generation of the next space made under `id`: one more than any before it, deleted ones
    /// included (their count outlives them).
    pub fn next_space_generation(&self, id: &SpaceId) -> Result<u64> {
        let next: i64 = self
            .conn()
            .query_row(
                "INSERT INTO space_generations (id, generation) VALUES (?1, 1)
                 ON CONFLICT(id) DO UPDATE SET generation = generation + 1
                 RETURNING generation",
                params![id.as_str()],
                |r| r.get(0),
            )
            .map_err(db_err("count a space's generations"))?;
        Ok(u64::try_from(next).unwrap_or(0))
    }

    /// Marks a space as being deleted: a restart finishes the deletion.
    pub fn mark_space_deleting(&self, id: &SpaceId) -> Result<()> {
        self.conn()
            .execute(
                "UPDATE spaces SET deleting = 1 WHERE id = ?1",
                params![id.as_str()],
            )
            .map_err(db_err("mark a space deleted"))?;
        Ok(())
    }

    /// The spaces whose deletion began and did not finish.
    pub fn spaces_being_deleted(&self) -> Result<Vec<SpaceId>> {
        self.ids(
            "SELECT id FROM spaces WHERE deleting = 1 ORDER BY id",
            "read spaces being deleted",
            |id| SpaceId::parse(id).ok(),
        )
    }

    /// The first column of `sql`'s rows (text), as `parse` reads them (rows it cannot read are skipped);
    /// `what` names them in errors.
    fn ids<T>(
        &self,
        sql: &str,
        what: &'static str,
        parse: impl Fn(&str) -> Option<T>,
    ) -> Result<Vec<T>> {
        let conn = self.conn();
        let mut stmt = conn.prepare(sql).map_err(db_err(what))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(db_err(what))?;
        let mut out = Vec::new();
        for row in rows {
            if let Some(id) = parse(&row.map_err(db_err(what))?) {
                out.push(id);
            }
        }
        Ok(out)
    }

    /// Deletes a space; its images become no space's (a space made again under its id gets none of them;
    /// one the admin shared stays shared).
    pub fn delete_space(&self, id: &SpaceId) -> Result<()> {
        let conn = self.conn();
        conn.execute("DELETE FROM spaces WHERE id = ?1", params![id.as_str()])
            .map_err(db_err("delete a space"))?;
        // Its secrets go with it: a space made again under the id starts with none.
        conn.execute(
            "DELETE FROM space_secrets WHERE space_id = ?1",
            params![id.as_str()],
        )
        .map_err(db_err("delete a space's secrets"))?;
        conn.execute(
            "UPDATE images SET space_id = NULL WHERE space_id = ?1",
            params![id.as_str()],
        )
        .map_err(db_err("disown a deleted space's images"))?;
        Ok(())
    }

    /// Every space.
    pub fn spaces(&self) -> Result<Vec<Space>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT id, display_name, description, metadata, max_sandboxes, created_ms, updated_ms,
                 sandbox_limits, snapshot_policy, generation, runtime_class, egress, egress_rules,
                 egress_cap, egress_cap_rules FROM spaces ORDER BY id",
            )
            .map_err(db_err("read spaces"))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                    r.get::<_, u32>(4)?,
                    r.get::<_, i64>(5)?,
                    r.get::<_, i64>(6)?,
                    r.get::<_, String>(7)?,
                    r.get::<_, String>(8)?,
                    r.get::<_, i64>(9)?,
                    r.get::<_, String>(10)?,
                    (
                        r.get::<_, i64>(11)?,
                        r.get::<_, String>(12)?,
                        r.get::<_, i64>(13)?,
                        r.get::<_, String>(14)?,
                    ),
                ))
            })
            .map_err(db_err("read spaces"))?;
        let mut out = Vec::new();
        for row in rows {
            let (
                id,
                display_name,
                description,
                metadata,
                max,
                created,
                updated,
                sandbox_limits,
                policy,
                generation,
                runtime_class,
                (egress_mode, egress_rules, cap_mode, cap_rules),
            ) = row.map_err(db_err("read a space"))?;
            let Ok(id) = SpaceId::parse(&id) else {
                tracing::warn!(%id, "store: skipping a space with an invalid id");
                continue;
            };
            out.push(Space {
                id,
                display_name,
                description,
                metadata: from_json(&metadata),
                limits: space_limits_from_json(max, &sandbox_limits),
                snapshot_policy: policy_from_json(&policy),
                runtime_class,
                egress: (egress_mode >= 0).then(|| egress::from_sql(egress_mode, &egress_rules)),
                egress_cap: egress::cap_from_sql(cap_mode, &cap_rules),
                created_at: time(created),
                updated_at: time(updated),
                generation: u64::try_from(generation).unwrap_or(0),
            });
        }
        Ok(out)
    }

    /// Inserts or replaces a sandbox record.
    pub fn put_sandbox(
        &self,
        s: &Sandbox,
        env: &BTreeMap<String, String>,
        last_seq: u64,
    ) -> Result<()> {
        insert_sandbox(&self.conn(), &self.sealer, s, env, last_seq)
    }

    /// Records a pool member before its container is made (a crash then leaves a row to clean up, never an
    /// unknown container taken for a sandbox).
    /// `template` is the key of a template's pool (`SPACE/NAME@VERSION`), empty for an image's pool.
    pub fn put_member(&self, id: SandboxId, image: &str, template: &str) -> Result<()> {
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO pool (id, image, token, created_ms, template)
                 VALUES (?1, ?2, '', ?3, ?4)",
                params![id.to_string(), image, ms(SystemTime::now()), template],
            )
            .map_err(db_err("write a pool member"))?;
        Ok(())
    }

    pub fn delete_member(&self, id: SandboxId) -> Result<()> {
        self.conn()
            .execute("DELETE FROM pool WHERE id = ?1", params![id.to_string()])
            .map_err(db_err("delete a pool member"))?;
        Ok(())
    }

    /// Every pool member.
    pub fn members(&self) -> Result<Vec<StoredMember>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare("SELECT id, image, token, template FROM pool ORDER BY created_ms")
            .map_err(db_err("read the pool"))?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, String>(1)?,
                    r.get::<_, String>(2)?,
                    r.get::<_, String>(3)?,
                ))
            })
            .map_err(db_err("read the pool"))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, image, stored, template) = row.map_err(db_err("read a pool member"))?;
            match SandboxId::parse(&id) {
                Ok(id) => out.push(StoredMember {
                    id,
                    image,
                    template,
                    legacy: !stored.is_empty(),
                    token: self.executor_token(id),
                }),
                Err(_) => tracing::warn!(%id, "store: skipping a pool member with an invalid id"),
            }
        }
        Ok(out)
    }

    /// Turns a pool member into a sandbox in one transaction: after a crash the container is either still
    /// an idle member or the claimed sandbox, never both or neither.
    pub fn claim(&self, s: &Sandbox, env: &BTreeMap<String, String>) -> Result<()> {
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(db_err("begin a claim"))?;
        let removed = tx
            .execute("DELETE FROM pool WHERE id = ?1", params![s.id.to_string()])
            .map_err(db_err("claim a pool member"))?;
        if removed != 1 {
            return Err(Error::internal(format!(
                "store: pool member {} is not recorded",
                s.id
            )));
        }
        insert_sandbox(&tx, &self.sealer, s, env, 0)?;
        tx.commit().map_err(db_err("commit a claim"))?;
        Ok(())
    }

    /// Updates the parts of a record that change while it lives.
    pub fn update_sandbox(&self, s: &Sandbox, last_seq: u64) -> Result<()> {
        self.update_sandboxes(&[(s, last_seq)])
    }

    /// [`Store::update_sandbox`] for many records, in one transaction (one commit, however many).
    pub fn update_sandboxes(&self, records: &[(&Sandbox, u64)]) -> Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut conn = self.conn();
        let tx = conn.transaction().map_err(db_err("update sandboxes"))?;
        {
            let mut stmt = tx
                .prepare_cached(
                    "UPDATE sandboxes SET state = ?2, state_reason = ?3, updated_ms = ?4, activity_ms = ?5,
                     last_seq = ?6 WHERE id = ?1",
                )
                .map_err(db_err("update sandboxes"))?;
            for (s, last_seq) in records {
                stmt.execute(params![
                    s.id.to_string(),
                    state_key(s.state),
                    s.state_reason,
                    ms(s.updated_at),
                    ms(s.last_activity),
                    i64::try_from(*last_seq).unwrap_or(i64::MAX),
                ])
                .map_err(db_err("update a sandbox"))?;
            }
        }
        tx.commit().map_err(db_err("update sandboxes"))
    }

    pub fn delete_sandbox(&self, id: SandboxId) -> Result<()> {
        let conn = self.conn();
        conn.execute(
            "DELETE FROM sandboxes WHERE id = ?1",
            params![id.to_string()],
        )
        .map_err(db_err("delete a sandbox"))?;
        conn.execute(
            "DELETE FROM actions WHERE sandbox_id = ?1",
            params![id.to_string()],
        )
        .map_err(db_err("delete a sandbox's actions"))?;
        conn.execute(
            "DELETE FROM preview_generations WHERE sandbox_id = ?1",
            params![id.to_string()],
        )
        .map_err(db_err("delete a sandbox's preview generations"))?;
        conn.execute(
            "DELETE FROM link_generations WHERE sandbox_id = ?1",
            params![id.to_string()],
        )
        .map_err(db_err("delete a sandbox's link generation"))?;
        Ok(())
    }

    /// Every sandbox record.
    pub fn sandboxes(&self) -> Result<Vec<StoredSandbox>> {
        let conn = self.conn();
        let mut stmt = conn
            .prepare(
                "SELECT id, space_id, state, state_reason, image, labels, env, cpu, memory_mb, pids, token,
                 external_key, idle_timeout_s, idle_policy, max_lifetime_s, auto_resume, created_ms,
                 updated_ms, activity_ms, last_seq, egress, nofile, read_only, disk_mb, template, work_dir,
                 runtime_class, egress_rules FROM sandboxes ORDER BY created_ms, id",
            )
            .map_err(db_err("read sandboxes"))?;
        let rows = stmt
            .query_map([], |r| {
                let id: String = r.get(0)?;
                let space: String = r.get(1)?;
                let state: String = r.get(2)?;
                let policy: String = r.get(13)?;
                let env: String = r.get(6)?;
                let token: String = r.get(10)?;
                Ok((
                    id,
                    space,
                    env,
                    token,
                    StoredSandbox {
                        record: Sandbox {
                            id: SandboxId::new(),
                            space_id: SpaceId::default_space(),
                            state: parse_state(&state),
                            state_reason: r.get(3)?,
                            image: r.get(4)?,
                            labels: from_json(&r.get::<_, String>(5)?),
                            limits: Limits {
                                cpu: r.get(7)?,
                                memory_mb: r.get(8)?,
                                pids: r.get(9)?,
                                nofile: r.get(21)?,
                                disk_mb: r.get(23)?,
                            },
                            external_key: r.get(11)?,
                            expiry: Expiry {
                                idle_timeout: Duration::from_secs(r.get(12)?),
                                idle_policy: IdlePolicy::parse(&policy).unwrap_or_default(),
                                max_lifetime: Duration::from_secs(r.get(14)?),
                                auto_resume: r.get(15)?,
                            },
                            created_at: time(r.get(16)?),
                            updated_at: time(r.get(17)?),
                            last_activity: time(r.get(18)?),
                            egress: egress::from_sql(r.get(20)?, &r.get::<_, String>(27)?),
                            read_only_rootfs: r.get(22)?,
                            template: r.get(24)?,
                            work_dir: r.get(25)?,
                            runtime_class: r.get(26)?,
                        },
                        // Opened below, once the id is known.
                        env: BTreeMap::new(),
                        token: String::new(),
                        last_seq: u64::try_from(r.get::<_, i64>(19)?).unwrap_or(0),
                    },
                ))
            })
            .map_err(db_err("read sandboxes"))?;
        let mut out = Vec::new();
        for row in rows {
            let (id, space, env, token, mut stored) = row.map_err(db_err("read a sandbox"))?;
            match (SandboxId::parse(&id), SpaceId::parse(&space)) {
                (Ok(id), Ok(space)) => {
                    stored.record.id = id;
                    stored.record.space_id = space;
                    stored.env = self.sealer.open_env(id, &env).unwrap_or_else(|| {
                        tracing::warn!(sandbox_id = %id, "store: a sandbox's env does not open (damaged): it has none now");
                        BTreeMap::new()
                    });
                    // A stored token is a sandbox of schema 5 or older, whose container knows only it.
                    stored.token = if token.is_empty() {
                        self.executor_token(id)
                    } else {
                        token
                    };
                    out.push(stored);
                }
                _ => tracing::warn!(%id, "store: skipping a sandbox with an invalid id"),
            }
        }
        Ok(out)
    }

    /// A value of the meta table.
    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        self.conn()
            .query_row("SELECT value FROM meta WHERE key = ?1", params![key], |r| {
                r.get(0)
            })
            .optional()
            .map_err(db_err("read meta"))
    }

    pub fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        self.conn()
            .execute(
                "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
                params![key, value],
            )
            .map_err(db_err("write meta"))?;
        Ok(())
    }
}

fn schema_version(conn: &Connection) -> Result<i64> {
    conn.pragma_query_value(None, "user_version", |r| r.get(0))
        .map_err(db_err("schema version"))
}

/// The migration to schema 6, in one transaction: every plain env sealed, the stored tokens of ended
/// sandboxes emptied (nothing calls their executors again) and those of pool members replaced by
/// [`LEGACY_MEMBER`] (such a member is replaced at start, see [`StoredMember`]). Live sandboxes keep theirs:
/// their containers know no other token. The WAL is then emptied, so the plain text it held of the old rows
/// goes too.
fn seal_rows(conn: &Connection, sealer: &Sealer) -> Result<()> {
    let rows: Vec<(String, String, String)> = {
        let mut stmt = conn
            .prepare("SELECT id, env, state FROM sandboxes")
            .map_err(db_err("read sandboxes to seal"))?;
        stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
            .map_err(db_err("read sandboxes to seal"))?
            .collect::<rusqlite::Result<_>>()
            .map_err(db_err("read a sandbox to seal"))?
    };
    conn.execute_batch("BEGIN IMMEDIATE")
        .map_err(db_err("begin sealing"))?;
    let sealed = (|| {
        for (id, env, state) in &rows {
            let Ok(sid) = SandboxId::parse(id) else {
                continue;
            };
            if !Sealer::is_sealed(env) {
                conn.execute(
                    "UPDATE sandboxes SET env = ?2 WHERE id = ?1",
                    params![id, sealer.seal_env(sid, &from_json(env))],
                )?;
            }
            if parse_state(state).is_final() {
                conn.execute("UPDATE sandboxes SET token = '' WHERE id = ?1", params![id])?;
            }
        }
        conn.execute(
            "UPDATE pool SET token = ?1 WHERE token <> ''",
            params![LEGACY_MEMBER],
        )?;
        Ok::<_, rusqlite::Error>(())
    })();
    match sealed {
        Ok(()) => conn
            .execute_batch("COMMIT")
            .map_err(db_err("commit sealing"))?,
        Err(e) => {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(db_err("seal the sandboxes' env")(e));
        }
    }
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .map_err(db_err("checkpoint after sealing"))?;
    tracing::info!(
        sandboxes = rows.len(),
        "store: migrated to schema 6: envs sealed, tokens of ended sandboxes removed"
    );
    Ok(())
}

fn add_column_if_missing(conn: &Connection, table: &str, column: &str, decl: &str) -> Result<()> {
    let present: bool = conn
        .query_row(
            &format!("SELECT COUNT(*) > 0 FROM pragma_table_info('{table}') WHERE name = ?1"),
            params![column],
            |r| r.get(0),
        )
        .map_err(db_err("read the schema"))?;
    if !present {
        conn.execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))
            .map_err(db_err("migrate the schema"))?;
    }
    Ok(())
}

/// A space's sandbox limits as JSON (zero fields are "not set").
fn space_limits_json(l: &SpaceLimits) -> String {
    let limits = |l: &Limits| {
        serde_json::json!({"cpu": l.cpu, "memory_mb": l.memory_mb, "pids": l.pids, "nofile": l.nofile,
            "disk_mb": l.disk_mb})
    };
    serde_json::json!({
        "default": limits(&l.sandbox_default),
        "max": limits(&l.sandbox_max),
        "read_only_rootfs": l.read_only_rootfs,
    })
    .to_string()
}

fn space_limits_from_json(max_sandboxes: u32, text: &str) -> SpaceLimits {
    let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
    let limits = |l: &serde_json::Value| Limits {
        cpu: l["cpu"].as_f64().unwrap_or(0.0),
        memory_mb: l["memory_mb"].as_i64().unwrap_or(0),
        pids: l["pids"].as_i64().unwrap_or(0),
        nofile: l["nofile"].as_i64().unwrap_or(0),
        disk_mb: l["disk_mb"].as_i64().unwrap_or(0),
    };
    SpaceLimits {
        max_sandboxes,
        sandbox_default: limits(&v["default"]),
        sandbox_max: limits(&v["max"]),
        read_only_rootfs: v["read_only_rootfs"].as_bool(),
    }
}

/// A space's snapshot policy as JSON.
fn policy_json(p: &SnapshotPolicy) -> String {
    serde_json::json!({"on_pause": p.on_pause, "on_delete": p.on_delete, "on_expiry": p.on_expiry})
        .to_string()
}

fn policy_from_json(text: &str) -> SnapshotPolicy {
    let v: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
    let flag = |k: &str| v[k].as_bool().unwrap_or(false);
    SnapshotPolicy {
        on_pause: flag("on_pause"),
        on_delete: flag("on_delete"),
        on_expiry: flag("on_expiry"),
    }
}

/// Writes a new record: its env sealed, no token (it is derived).
fn insert_sandbox(
    conn: &Connection,
    sealer: &Sealer,
    s: &Sandbox,
    env: &BTreeMap<String, String>,
    last_seq: u64,
) -> Result<()> {
    conn.execute(
        "INSERT OR REPLACE INTO sandboxes
         (id, space_id, state, state_reason, image, labels, env, cpu, memory_mb, pids, token,
          external_key, idle_timeout_s, idle_policy, max_lifetime_s, auto_resume, created_ms,
          updated_ms, activity_ms, last_seq, egress, nofile, read_only, disk_mb, template, work_dir,
          runtime_class, egress_rules)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
          ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27, ?28)",
        params![
            s.id.to_string(),
            s.space_id.as_str(),
            state_key(s.state),
            s.state_reason,
            s.image,
            to_json(&s.labels),
            sealer.seal_env(s.id, env),
            s.limits.cpu,
            s.limits.memory_mb,
            s.limits.pids,
            "",
            s.external_key,
            s.expiry.idle_timeout.as_secs(),
            s.expiry.idle_policy.as_str(),
            s.expiry.max_lifetime.as_secs(),
            s.expiry.auto_resume,
            ms(s.created_at),
            ms(s.updated_at),
            ms(s.last_activity),
            i64::try_from(last_seq).unwrap_or(i64::MAX),
            egress::mode_to_sql(&s.egress),
            s.limits.nofile,
            s.read_only_rootfs,
            s.limits.disk_mb,
            s.template,
            s.work_dir,
            s.runtime_class,
            egress::rules_to_sql(&s.egress),
        ],
    )
    .map_err(db_err("write a sandbox"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn sandbox() -> Sandbox {
        let now = time(ms(SystemTime::now()));
        Sandbox {
            id: SandboxId::new(),
            space_id: SpaceId::parse("team-a").unwrap(),
            state: SandboxState::Paused,
            image: "img:1".into(),
            labels: [("k".to_owned(), "v".to_owned())].into(),
            limits: Limits {
                cpu: 0.5,
                memory_mb: 256,
                pids: 64,
                nofile: 128,
                disk_mb: 64,
            },
            created_at: now,
            updated_at: now,
            state_reason: "idle".into(),
            external_key: Some("chat-1".into()),
            expiry: Expiry {
                idle_timeout: Duration::from_secs(60),
                idle_policy: IdlePolicy::Delete,
                max_lifetime: Duration::ZERO,
                auto_resume: true,
            },
            last_activity: now,
            egress: mentis_core::egress::Egress::Allow,
            read_only_rootfs: true,
            template: String::new(),
            work_dir: String::new(),
            runtime_class: "kata".into(),
        }
    }

    fn cap() -> mentis_core::egress::EgressCap {
        let rule = |domain: &str, cidr: &str| mentis_core::egress::RuleRequest {
            domain: domain.into(),
            cidr: cidr.into(),
            ports: vec![443],
            headers: Vec::new(),
        };
        mentis_core::egress::EgressCap::validate(
            Some(mentis_core::egress::EgressMode::Rules),
            vec![rule("*.example.com", ""), rule("", "10.0.0.0/8")],
            "egress_cap",
        )
        .unwrap()
    }

    #[test]
    fn sandboxes_and_spaces_round_trip_and_survive_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let s = sandbox();
        let env: BTreeMap<String, String> = [("A".to_owned(), "1".to_owned())].into();
        {
            let store = Store::open(dir.path()).unwrap();
            store.put_sandbox(&s, &env, 41).unwrap();
            let mut space = Space::default_space(s.created_at);
            space.metadata.insert("team".into(), "a".into());
            space.snapshot_policy.on_delete = true;
            space.runtime_class = "runsc".into();
            space.egress = Some(mentis_core::egress::Egress::Deny);
            space.egress_cap = cap();
            store.put_space(&space).unwrap();
            store.set_meta("clean", "1").unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let all = store.sandboxes().unwrap();
        assert_eq!(all.len(), 1);
        assert_eq!(all[0].record, s);
        assert_eq!(
            (all[0].env.clone(), all[0].token.clone(), all[0].last_seq),
            (env.clone(), store.executor_token(s.id), 41)
        );
        let mut changed = s.clone();
        changed.state = SandboxState::Running;
        changed.state_reason.clear();
        store.update_sandbox(&changed, 50).unwrap();
        // Many at once, in one transaction: each gets its own values; none is no call at all.
        let mut other = sandbox();
        store.put_sandbox(&other, &env, 1).unwrap();
        other.state = SandboxState::Running;
        let mut again = changed.clone();
        again.state = SandboxState::Paused;
        store
            .update_sandboxes(&[(&again, 60), (&other, 7)])
            .unwrap();
        store.update_sandboxes(&[]).unwrap();
        let all = store.sandboxes().unwrap();
        let of = |id| all.iter().find(|x| x.record.id == id).unwrap();
        assert_eq!(
            (of(s.id).record.state, of(s.id).last_seq),
            (SandboxState::Paused, 60)
        );
        assert_eq!(
            (of(other.id).record.state, of(other.id).last_seq),
            (SandboxState::Running, 7)
        );
        store.delete_sandbox(other.id).unwrap();
        store.update_sandbox(&changed, 50).unwrap();
        let all = store.sandboxes().unwrap();
        assert_eq!(
            (all[0].record.state, all[0].last_seq),
            (SandboxState::Running, 50)
        );
        let spaces = store.spaces().unwrap();
        assert_eq!(spaces[0].metadata["team"], "a");
        assert!(spaces[0].snapshot_policy.on_delete && !spaces[0].snapshot_policy.on_pause);
        assert_eq!(spaces[0].runtime_class, "runsc");
        assert_eq!(
            (spaces[0].egress.clone(), spaces[0].egress_cap.clone()),
            (Some(mentis_core::egress::Egress::Deny), cap())
        );
        assert_eq!(store.meta("clean").unwrap().as_deref(), Some("1"));
        assert_eq!(store.meta("other").unwrap(), None);
        store.delete_sandbox(s.id).unwrap();
        assert!(store.sandboxes().unwrap().is_empty());
    }

    #[test]
    fn a_schema_1_database_is_migrated() {
        let dir = tempfile::tempdir().unwrap();
        {
            // Schema 1: without what versions 2 (egress), 3 (nofile, read_only, sandbox_limits), 5
            // (disk_mb) and 6 (snapshot_policy) added.
            let conn = Connection::open(dir.path().join("mentis.db")).unwrap();
            let v1 = SCHEMA
                .replace(
                    ",\n    egress INTEGER NOT NULL DEFAULT 0,\n    nofile INTEGER NOT NULL DEFAULT 0,\n    read_only INTEGER NOT NULL DEFAULT 0,\n    disk_mb INTEGER NOT NULL DEFAULT 0",
                    "",
                )
                .replace(
                    ",\n    sandbox_limits TEXT NOT NULL DEFAULT '{}',\n    snapshot_policy TEXT NOT NULL DEFAULT '{}'",
                    "",
                );
            assert_eq!(SCHEMA.len() - v1.len(), 255, "both parts were removed");
            conn.execute_batch(&v1).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let s = sandbox();
        store.put_sandbox(&s, &BTreeMap::new(), 1).unwrap();
        assert_eq!(store.sandboxes().unwrap()[0].record, s);
        let mut space = Space::default_space(time(ms(SystemTime::now())));
        space.limits.sandbox_max.memory_mb = 512;
        space.limits.sandbox_max.disk_mb = 1024;
        space.limits.read_only_rootfs = Some(true);
        store.put_space(&space).unwrap();
        assert_eq!(store.spaces().unwrap(), vec![space]);
        drop(store);
        // Opening again does not migrate twice.
        assert!(Store::open(dir.path()).is_ok());
    }

    #[test]
    fn a_schema_4_sandbox_has_no_disk_limit_after_the_migration() {
        let dir = tempfile::tempdir().unwrap();
        let s = sandbox();
        {
            let store = Store::open(dir.path()).unwrap();
            store.put_sandbox(&s, &BTreeMap::new(), 1).unwrap();
            let conn = store.conn();
            conn.execute_batch("ALTER TABLE sandboxes DROP COLUMN disk_mb")
                .unwrap();
            conn.pragma_update(None, "user_version", 4).unwrap();
        }
        let store = Store::open(dir.path()).unwrap();
        let mut want = s;
        want.limits.disk_mb = 0;
        assert_eq!(store.sandboxes().unwrap()[0].record, want);
    }

    #[test]
    fn a_claim_moves_a_member_to_the_sandboxes_once() {
        let store = Store::in_memory().unwrap();
        let s = sandbox();
        store.put_member(s.id, "img:1", "").unwrap();
        let members = store.members().unwrap();
        assert_eq!(members.len(), 1);
        assert_eq!(
            (members[0].token.clone(), members[0].legacy),
            (store.executor_token(s.id), false)
        );
        store.claim(&s, &BTreeMap::new()).unwrap();
        assert!(store.members().unwrap().is_empty());
        // The claimed sandbox has the member's token: both are derived from the same id.
        let claimed = &store.sandboxes().unwrap()[0];
        assert_eq!(claimed.record.id, s.id);
        assert_eq!(claimed.token, members[0].token);
        // The same member cannot be claimed twice.
        assert!(store.claim(&s, &BTreeMap::new()).is_err());
        assert_eq!(store.sandboxes().unwrap().len(), 1);
    }

    fn file_bytes(dir: &Path) -> Vec<u8> {
        let mut all = Vec::new();
        for name in [DB_FILE, "mentis.db-wal"] {
            all.extend(std::fs::read(dir.join(name)).unwrap_or_default());
        }
        all
    }

    fn holds(hay: &[u8], needle: &str) -> bool {
        hay.windows(needle.len()).any(|w| w == needle.as_bytes())
    }

    #[test]
    fn the_files_hold_neither_tokens_nor_env_values() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path()).unwrap();
        let s = sandbox();
        let env: BTreeMap<String, String> =
            [("API_KEY".to_owned(), "env-secret-4711".to_owned())].into();
        store.put_sandbox(&s, &env, 1).unwrap();
        store.put_member(SandboxId::new(), "img:1", "").unwrap();
        let token = store.executor_token(s.id);
        let bytes = file_bytes(dir.path());
        assert!(!bytes.is_empty());
        assert!(!holds(&bytes, &token) && !holds(&bytes, "env-secret-4711"));
        for m in store.members().unwrap() {
            assert!(!holds(&bytes, &m.token));
        }
        assert_eq!(store.sandboxes().unwrap()[0].env, env);
        // 0600, the WAL and the shared memory file too.
        for name in [DB_FILE, "mentis.db-wal", "mentis.db-shm", KEY_FILE] {
            let mode = std::os::unix::fs::PermissionsExt::mode(
                &std::fs::metadata(dir.path().join(name))
                    .unwrap()
                    .permissions(),
            );
            assert_eq!(mode & 0o777, 0o600, "{name}");
        }
    }

    #[test]
    fn a_schema_5_store_keeps_the_tokens_of_live_sandboxes_and_seals_every_env() {
        let dir = tempfile::tempdir().unwrap();
        let (live, ended, member) = (sandbox(), sandbox(), SandboxId::new());
        {
            // A store as schema 5 wrote it: tokens and plain envs, no key file.
            let conn = Connection::open(dir.path().join(DB_FILE)).unwrap();
            conn.execute_batch(SCHEMA).unwrap();
            conn.pragma_update(None, "user_version", 5).unwrap();
            let plain = Sealer::random();
            for (s, state, token) in [
                (&live, SandboxState::Running, "live-token-1"),
                (&ended, SandboxState::Terminated, "ended-token-2"),
            ] {
                let mut s = s.clone();
                s.state = state;
                insert_sandbox(&conn, &plain, &s, &BTreeMap::new(), 3).unwrap();
                conn.execute(
                    "UPDATE sandboxes SET token = ?2, env = ?3 WHERE id = ?1",
                    params![s.id.to_string(), token, r#"{"PASSWORD":"plain-value-9"}"#],
                )
                .unwrap();
            }
            conn.execute(
                "INSERT INTO pool (id, image, token, created_ms) VALUES (?1, 'img', 'member-token-3', 0)",
                params![member.to_string()],
            )
            .unwrap();
        }
        assert!(!dir.path().join(KEY_FILE).exists());
        let store = Store::open(dir.path()).unwrap();
        assert!(dir.path().join(KEY_FILE).exists(), "the key is made");
        let all = store.sandboxes().unwrap();
        let get = |id: SandboxId| all.iter().find(|s| s.record.id == id).unwrap();
        assert_eq!(
            get(live.id).token,
            "live-token-1",
            "a live sandbox keeps its token"
        );
        assert_eq!(get(ended.id).token, store.executor_token(ended.id));
        for id in [live.id, ended.id] {
            assert_eq!(get(id).env["PASSWORD"], "plain-value-9");
        }
        let members = store.members().unwrap();
        assert_eq!((members[0].id, members[0].legacy), (member, true));
        drop(store);
        let bytes = file_bytes(dir.path());
        for gone in ["plain-value-9", "ended-token-2", "member-token-3"] {
            assert!(!holds(&bytes, gone), "{gone}");
        }
        // Opened again: nothing migrates twice, and the key is required from now on.
        let store = Store::open(dir.path()).unwrap();
        assert_eq!(store.sandboxes().unwrap().len(), 2);
        drop(store);
        std::fs::rename(dir.path().join(KEY_FILE), dir.path().join("moved")).unwrap();
        let err = Store::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("mentis.key") && err.contains("missing"),
            "{err}"
        );
    }

    #[test]
    fn a_store_refuses_another_key() {
        let dir = tempfile::tempdir().unwrap();
        drop(Store::open(dir.path()).unwrap());
        std::fs::write(dir.path().join(KEY_FILE), format!("{}\n", "ab".repeat(32))).unwrap();
        let err = Store::open(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("not the key the store was sealed with"),
            "{err}"
        );
    }
}
