//! Templates in the store (docs/ARCHITECTURE.md, "Templates"): one row per space and name, the env sealed
//! like a sandbox's (it may hold secrets), bound to its space and name.

use mentis_core::{Error, Limits, Reason, Resource, Result, SpaceId, Template};
use rusqlite::{OptionalExtension, params};

use super::{Store, db_err, ms, time};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS templates (
    space_id TEXT NOT NULL,
    name TEXT NOT NULL,
    description TEXT NOT NULL,
    image TEXT NOT NULL,
    limits TEXT NOT NULL,
    env TEXT NOT NULL,
    work_dir TEXT NOT NULL,
    setup TEXT NOT NULL,
    pool_size INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    runtime_class TEXT NOT NULL DEFAULT '',
    egress INTEGER NOT NULL DEFAULT -1,
    egress_rules TEXT NOT NULL DEFAULT '[]',
    PRIMARY KEY (space_id, name)
);
";

const COLUMNS: &str = "space_id, name, description, image, limits, env, work_dir, setup, pool_size, \
    created_ms, updated_ms, runtime_class, egress, egress_rules";

/// What a template's env is sealed for.
fn owner(space: &SpaceId, name: &str) -> String {
    format!("template:{space}/{name}")
}

fn limits_json(l: &Limits) -> String {
    serde_json::json!({"cpu": l.cpu, "memory_mb": l.memory_mb, "pids": l.pids, "nofile": l.nofile,
        "disk_mb": l.disk_mb})
    .to_string()
}

fn limits_from_json(text: &str) -> Limits {
    let l: serde_json::Value = serde_json::from_str(text).unwrap_or_default();
    Limits {
        cpu: l["cpu"].as_f64().unwrap_or(0.0),
        memory_mb: l["memory_mb"].as_i64().unwrap_or(0),
        pids: l["pids"].as_i64().unwrap_or(0),
        nofile: l["nofile"].as_i64().unwrap_or(0),
        disk_mb: l["disk_mb"].as_i64().unwrap_or(0),
    }
}

impl Store {
    /// Adds a template; ALREADY_EXISTS when its space has one of that name.
    pub fn create_template(&self, t: &Template) -> Result<()> {
        let inserted = self
            .conn()
            .execute(
                &format!(
                    "INSERT OR IGNORE INTO templates ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
                ),
                self.template_row(t),
            )
            .map_err(db_err("write a template"))?;
        if inserted == 0 {
            return Err(Error::new(
                Reason::AlreadyExists,
                format!("space {} already has a template {}", t.space_id, t.name),
            )
            .about(Resource::template(&t.space_id, &t.name)));
        }
        Ok(())
    }

    /// Replaces a template that exists.
    pub fn put_template(&self, t: &Template) -> Result<()> {
        self.conn()
            .execute(
                &format!(
                    "INSERT OR REPLACE INTO templates ({COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)"
                ),
                self.template_row(t),
            )
            .map_err(db_err("write a template"))?;
        Ok(())
    }

    fn template_row(&self, t: &Template) -> Row {
        (
            t.space_id.to_string(),
            t.name.clone(),
            t.description.clone(),
            t.image.clone(),
            limits_json(&t.limits),
            self.sealer()
                .seal_env_of(&owner(&t.space_id, &t.name), &t.env),
            t.work_dir.clone(),
            serde_json::to_string(&t.setup).unwrap_or_else(|_| "[]".to_owned()),
            t.pool_size,
            ms(t.created_at),
            ms(t.updated_at),
            t.runtime_class.clone(),
            t.egress.as_ref().map_or(-1, crate::egress::mode_to_sql),
            t.egress
                .as_ref()
                .map_or_else(|| "[]".to_owned(), crate::egress::rules_to_sql),
        )
    }

    /// The template `name` of `space`, when there is one.
    pub fn template(&self, space: &SpaceId, name: &str) -> Result<Option<Template>> {
        let row = self
            .conn()
            .query_row(
                &format!("SELECT {COLUMNS} FROM templates WHERE space_id = ?1 AND name = ?2"),
                params![space.as_str(), name],
                row,
            )
            .optional()
            .map_err(db_err("read a template"))?;
        row.map(|r| self.template_of(r)).transpose()
    }

    /// The templates of `space` named after `after`, in name order, at most `limit`.
    pub fn templates(&self, space: &SpaceId, after: &str, limit: usize) -> Result<Vec<Template>> {
        let rows: Vec<Row> = {
            let conn = self.conn();
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {COLUMNS} FROM templates WHERE space_id = ?1 AND name > ?2 ORDER BY name LIMIT ?3"
                ))
                .map_err(db_err("read templates"))?;
            stmt.query_map(
                params![
                    space.as_str(),
                    after,
                    i64::try_from(limit).unwrap_or(i64::MAX)
                ],
                row,
            )
            .map_err(db_err("read templates"))?
            .collect::<rusqlite::Result<_>>()
            .map_err(db_err("read templates"))?
        };
        rows.into_iter().map(|r| self.template_of(r)).collect()
    }

    /// Every template with a pool (they are made at start).
    pub fn pooled_templates(&self) -> Result<Vec<Template>> {
        let rows: Vec<Row> = {
            let conn = self.conn();
            let mut stmt = conn
                .prepare(&format!(
                    "SELECT {COLUMNS} FROM templates WHERE pool_size > 0 ORDER BY space_id, name"
                ))
                .map_err(db_err("read templates"))?;
            stmt.query_map([], row)
                .map_err(db_err("read templates"))?
                .collect::<rusqlite::Result<_>>()
                .map_err(db_err("read templates"))?
        };
        rows.into_iter().map(|r| self.template_of(r)).collect()
    }

    /// Removes a template; false when there was none.
    pub fn delete_template(&self, space: &SpaceId, name: &str) -> Result<bool> {
        let n = self
            .conn()
            .execute(
                "DELETE FROM templates WHERE space_id = ?1 AND name = ?2",
                params![space.as_str(), name],
            )
            .map_err(db_err("delete a template"))?;
        Ok(n > 0)
    }

    /// Removes every template of a space (the space is deleted).
    pub fn delete_templates_of(&self, space: &SpaceId) -> Result<()> {
        self.conn()
            .execute(
                "DELETE FROM templates WHERE space_id = ?1",
                params![space.as_str()],
            )
            .map_err(db_err("delete a space's templates"))?;
        Ok(())
    }

    fn template_of(&self, r: Row) -> Result<Template> {
        let space_id = SpaceId::parse_or_default(&r.0)?;
        let env = self
            .sealer()
            .open_env_of(&owner(&space_id, &r.1), &r.5)
            .ok_or_else(|| {
                Error::internal(format!(
                    "store: the env of template {}/{} does not open with this store's key",
                    r.0, r.1
                ))
            })?;
        Ok(Template {
            space_id,
            name: r.1,
            description: r.2,
            image: r.3,
            limits: limits_from_json(&r.4),
            env,
            work_dir: r.6,
            setup: serde_json::from_str(&r.7).unwrap_or_default(),
            pool_size: r.8,
            created_at: time(r.9),
            updated_at: time(r.10),
            runtime_class: r.11,
            // -1: none (the runtime's default).
            egress: (r.12 >= 0).then(|| crate::egress::from_sql(r.12, &r.13)),
        })
    }
}

type Row = (
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    u32,
    i64,
    i64,
    String,
    i64,
    String,
);

fn row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Row> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
        r.get(10)?,
        r.get(11)?,
        r.get(12)?,
        r.get(13)?,
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::SystemTime;

    use super::*;

    fn template(space: &str, name: &str) -> Template {
        Template {
            space_id: SpaceId::parse_or_default(space).unwrap(),
            name: name.to_owned(),
            description: "d".to_owned(),
            image: "img:1".to_owned(),
            limits: Limits {
                cpu: 1.5,
                memory_mb: 300,
                ..Limits::default()
            },
            env: [("TOKEN".to_owned(), "s3cret".to_owned())].into(),
            work_dir: "app".to_owned(),
            setup: vec!["echo one".to_owned(), "echo two".to_owned()],
            pool_size: if name == "b" { 2 } else { 0 },
            runtime_class: if name == "b" { "runsc" } else { "" }.to_owned(),
            egress: (name == "b").then_some(mentis_core::egress::Egress::Allow),
            created_at: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(5),
            updated_at: SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(6),
        }
    }

    #[test]
    fn templates_round_trip_page_by_space_and_keep_their_env_sealed() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            store.create_template(&template("", "b")).unwrap();
            store.create_template(&template("", "a")).unwrap();
            store.create_template(&template("team", "a")).unwrap();
            let again = store.create_template(&template("", "a")).unwrap_err();
            assert_eq!(again.reason(), Reason::AlreadyExists);
        }
        let store = Store::open(dir.path()).unwrap();
        let default = SpaceId::default_space();
        assert_eq!(
            store.template(&default, "a").unwrap(),
            Some(template("", "a"))
        );
        let names = |after: &str, n| {
            store
                .templates(&default, after, n)
                .unwrap()
                .into_iter()
                .map(|t| t.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(names("", 10), ["a", "b"]);
        assert_eq!(names("a", 10), ["b"]);
        assert_eq!(names("", 1), ["a"]);
        let pooled = store.pooled_templates().unwrap();
        assert_eq!(pooled.len(), 1);
        assert_eq!((pooled[0].name.as_str(), pooled[0].pool_size), ("b", 2));
        // The env is not in the file as text.
        let db = std::fs::read(dir.path().join("mentis.db")).unwrap();
        assert!(!db.windows(6).any(|w| w == b"s3cret"));
        assert!(store.delete_template(&default, "a").unwrap());
        assert!(!store.delete_template(&default, "a").unwrap());
        store
            .delete_templates_of(&SpaceId::parse("team").unwrap())
            .unwrap();
        assert_eq!(
            store
                .template(&SpaceId::parse("team").unwrap(), "a")
                .unwrap(),
            None
        );
    }
}
