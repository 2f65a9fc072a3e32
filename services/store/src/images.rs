//! Who may use an image (docs/ARCHITECTURE.md, Security model, "Images belong to a space"): one row per
//! image the engine made for this runtime (by its id, which every name of it shares), with the space it
//! was built or imported for and whether the admin shared it with every space. An image with no row is
//! none of this runtime's builds (an operator's, or one made before owners were kept).

use mentis_core::{Result, SpaceId};
use rusqlite::{OptionalExtension, params};

use super::{Store, db_err, ms};

pub(super) const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS images (
    image_id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    space_id TEXT,
    shared INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
";

/// Who may use an image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageOwner {
    /// The engine's id (`sha256:...`).
    pub image_id: String,
    /// The name it was made or last shared under.
    pub name: String,
    /// The space it was made for; None: no space's (its space was deleted, or an image no build of this
    /// runtime made that the admin marked).
    pub space_id: Option<SpaceId>,
    /// Every space may use it.
    pub shared: bool,
}

fn owner_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<(String, String, Option<String>, bool)> {
    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?))
}

fn to_owner((image_id, name, space, shared): (String, String, Option<String>, bool)) -> ImageOwner {
    ImageOwner {
        image_id,
        name,
        // A stored id was parsed before it was written; one that no longer parses is no space's.
        space_id: space.and_then(|s| SpaceId::parse(&s).ok()),
        shared,
    }
}

impl Store {
    /// Records that `image_id` was built or imported as `name` for `space`. The same image made again for
    /// the same space stays shared if it was; made for another space, it is that space's alone.
    pub fn put_image_owner(
        &self,
        image_id: &str,
        name: &str,
        space: &SpaceId,
    ) -> Result<ImageOwner> {
        self.conn()
            .execute(
                "INSERT INTO images (image_id, name, space_id, shared, updated_ms) VALUES (?1, ?2, ?3, 0, ?4)
                 ON CONFLICT (image_id) DO UPDATE SET name = excluded.name, space_id = excluded.space_id,
                 shared = CASE WHEN images.space_id IS excluded.space_id THEN images.shared ELSE 0 END,
                 updated_ms = excluded.updated_ms",
                params![image_id, name, space.as_str(), ms(std::time::SystemTime::now())],
            )
            .map_err(db_err("write an image's owner"))?;
        self.image_owner(image_id)?.ok_or_else(|| {
            mentis_core::Error::internal("store: the image's owner just written is gone")
        })
    }

    /// Marks `image_id` (known as `name`) shared with every space or not; an image with no row gets one of
    /// no space.
    pub fn set_image_shared(&self, image_id: &str, name: &str, shared: bool) -> Result<ImageOwner> {
        self.conn()
            .execute(
                "INSERT INTO images (image_id, name, space_id, shared, updated_ms) VALUES (?1, ?2, NULL, ?3, ?4)
                 ON CONFLICT (image_id) DO UPDATE SET shared = excluded.shared,
                 updated_ms = excluded.updated_ms",
                params![image_id, name, shared, ms(std::time::SystemTime::now())],
            )
            .map_err(db_err("share an image"))?;
        self.image_owner(image_id)?.ok_or_else(|| {
            mentis_core::Error::internal("store: the image's owner just written is gone")
        })
    }

    /// Who may use `image_id`; None when no build or import of this runtime made it and the admin never
    /// marked it.
    pub fn image_owner(&self, image_id: &str) -> Result<Option<ImageOwner>> {
        self.conn()
            .query_row(
                "SELECT image_id, name, space_id, shared FROM images WHERE image_id = ?1",
                params![image_id],
                owner_row,
            )
            .optional()
            .map(|row| row.map(to_owner))
            .map_err(db_err("read an image's owner"))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn space(s: &str) -> SpaceId {
        SpaceId::parse(s).unwrap()
    }

    #[test]
    fn images_keep_their_space_and_their_share_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        {
            let store = Store::open(dir.path()).unwrap();
            assert_eq!(store.image_owner("sha256:a").unwrap(), None);
            let a = store
                .put_image_owner("sha256:a", "team/a:1", &space("a"))
                .unwrap();
            assert_eq!(
                a,
                ImageOwner {
                    image_id: "sha256:a".into(),
                    name: "team/a:1".into(),
                    space_id: Some(space("a")),
                    shared: false,
                }
            );
            assert!(
                store
                    .set_image_shared("sha256:a", "team/a:1", true)
                    .unwrap()
                    .shared
            );
            // Made again for the same space: still shared.
            assert!(
                store
                    .put_image_owner("sha256:a", "team/a:2", &space("a"))
                    .unwrap()
                    .shared
            );
            // An operator's image the admin marks: no space's.
            let op = store
                .set_image_shared("sha256:op", "python:3", false)
                .unwrap();
            assert_eq!((op.space_id, op.shared), (None, false));
        }
        let store = Store::open(dir.path()).unwrap();
        let a = store.image_owner("sha256:a").unwrap().unwrap();
        assert_eq!((a.name.as_str(), a.shared), ("team/a:2", true));
        // Made for another space: that space's alone.
        let b = store
            .put_image_owner("sha256:a", "team/a:2", &space("b"))
            .unwrap();
        assert_eq!((b.space_id, b.shared), (Some(space("b")), false));
        // A deleted space's images are no space's: nobody inherits them with its name.
        store.delete_space(&space("b")).unwrap();
        let gone = store.image_owner("sha256:a").unwrap().unwrap();
        assert_eq!((gone.space_id, gone.shared), (None, false));
    }
}
