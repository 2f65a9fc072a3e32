//! API authentication and authorization. Callers present `authorization: Bearer <key>`. The keyring knows
//! the admin key (from the config, a file, or made on first start) and the space-scoped keys, of which the
//! store holds only a SHA-256; it tells who a caller is ([`Caller`]), and the caller says what it may do.
//! Keys are 256 random bits, so a fast hash is enough: there is nothing to brute-force.

pub mod link;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use mentis_core::{Error, Reason, Resource, ResourceKind, Result, SpaceId};
use rand::RngCore;
use sha2::{Digest as _, Sha256};
use tokio::sync::watch;

use crate::store::Store;
pub use crate::store::{KeyDigest, KeyRecord};

/// Prefix of every key this runtime makes, so that a leaked one is easy to recognise (secret scanners).
pub const KEY_PREFIX: &str = "msk_";

/// The digest under which a key is stored.
pub fn digest(secret: &str) -> KeyDigest {
    Sha256::digest(secret.as_bytes()).into()
}

/// A new random key: the prefix and 256 random bits in hex.
pub fn new_secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    format!("{KEY_PREFIX}{}", hex::encode(bytes))
}

/// Who is calling, once authenticated.
#[derive(Debug, Clone, PartialEq)]
pub enum Caller {
    /// The admin key, or anybody when authentication is disabled: every call, every space.
    Admin,
    /// A key allowed in some spaces.
    Scoped {
        key_id: String,
        spaces: Arc<BTreeSet<SpaceId>>,
    },
}

impl Caller {
    /// PermissionDenied unless this is the admin.
    pub fn require_admin(&self, what: &str) -> Result<()> {
        match self {
            Self::Admin => Ok(()),
            Self::Scoped { key_id, .. } => Err(Error::new(
                Reason::AdminRequired,
                format!("{what} needs the admin key; key {key_id} is scoped to spaces"),
            )),
        }
    }

    /// PermissionDenied unless the caller may act in `space`.
    pub fn require_space(&self, space: &SpaceId) -> Result<()> {
        match self {
            Self::Admin => Ok(()),
            Self::Scoped { spaces, .. } if spaces.contains(space) => Ok(()),
            Self::Scoped { key_id, .. } => Err(Error::new(
                Reason::SpaceNotAllowed,
                format!("key {key_id} is not allowed in space {space}"),
            )
            .about(Resource::space(space))),
        }
    }

    /// PermissionDenied unless the caller may act in `space`, the space of an existing resource the caller
    /// named by id (`what`, say "sandbox <id>"; `resource`, its ErrorInfo): the refusal names the resource,
    /// never the space that owns it, which the caller has no business knowing.
    pub fn require_space_of(
        &self,
        space: &SpaceId,
        what: &str,
        resource: Option<Resource>,
    ) -> Result<()> {
        match self {
            Self::Admin => Ok(()),
            Self::Scoped { spaces, .. } if spaces.contains(space) => Ok(()),
            Self::Scoped { key_id, .. } => {
                let e = Error::new(
                    Reason::SpaceNotAllowed,
                    format!("key {key_id} may not use {what}: it is not in the key's spaces"),
                );
                Err(match resource {
                    Some(r) => e.about(r),
                    None => e,
                })
            }
        }
    }

    /// The scoped key calling; `None` for the admin.
    pub fn key_id(&self) -> Option<&str> {
        match self {
            Self::Admin => None,
            Self::Scoped { key_id, .. } => Some(key_id),
        }
    }

    /// The spaces the caller may see; `None` = all of them.
    pub fn spaces(&self) -> Option<&BTreeSet<SpaceId>> {
        match self {
            Self::Admin => None,
            Self::Scoped { spaces, .. } => Some(spaces),
        }
    }
}

/// The generation of each space that exists now (kept by the spaces, read by the keyring): a key reaches a
/// space only while the space is the generation the key was made for.
#[derive(Debug, Default)]
pub struct SpaceGenerations(RwLock<HashMap<SpaceId, u64>>);

impl SpaceGenerations {
    /// The generation of `space` while it exists (not while it is being deleted).
    pub fn current(&self, space: &SpaceId) -> Option<u64> {
        self.0
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(space)
            .copied()
    }

    /// `space` exists, as `generation`.
    pub fn set(&self, space: &SpaceId, generation: u64) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .insert(space.clone(), generation);
    }

    /// `space` no longer exists (its deletion has begun).
    pub fn remove(&self, space: &SpaceId) {
        self.0
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .remove(space);
    }
}

/// The keys this runtime accepts.
pub struct Keyring {
    /// `None`: authentication is disabled (local development only).
    admin: Option<KeyDigest>,
    /// Every key by digest, revoked ones included (so that their callers hear "revoked").
    keys: RwLock<HashMap<KeyDigest, KeyRecord>>,
    store: Arc<Store>,
    /// Which spaces exist now, as which generation.
    generations: Arc<SpaceGenerations>,
    /// Told of every revocation, so that what a key made ends with it (terminal links: `link::Links`).
    revoked: watch::Sender<()>,
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("enabled", &self.admin.is_some())
            .finish_non_exhaustive()
    }
}

impl Keyring {
    /// A keyring that requires keys: the admin key and those in the store.
    pub fn new(
        admin_key: &str,
        store: Arc<Store>,
        generations: Arc<SpaceGenerations>,
    ) -> Result<Self> {
        let keys = store
            .api_keys()?
            .into_iter()
            .map(|k| (k.digest, k))
            .collect();
        Ok(Self {
            admin: Some(digest(admin_key)),
            keys: RwLock::new(keys),
            store,
            generations,
            revoked: watch::Sender::new(()),
        })
    }

    /// A keyring that lets every caller in as admin.
    pub fn disabled(store: Arc<Store>, generations: Arc<SpaceGenerations>) -> Self {
        Self {
            admin: None,
            keys: RwLock::new(HashMap::new()),
            store,
            generations,
            revoked: watch::Sender::new(()),
        }
    }

    pub fn enabled(&self) -> bool {
        self.admin.is_some()
    }

    /// Who sends this `authorization` header value.
    pub fn authenticate(&self, header: Option<&[u8]>) -> Result<Caller> {
        let Some(admin) = self.admin else {
            return Ok(Caller::Admin);
        };
        let header = header.ok_or_else(|| {
            Error::new(
                Reason::ApiKeyMissing,
                "missing credentials: send `authorization: Bearer <key>`",
            )
        })?;
        let secret = std::str::from_utf8(header)
            .ok()
            .and_then(|h| {
                let (scheme, rest) = h.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim())
            })
            .filter(|s| !s.is_empty())
            .ok_or_else(|| {
                Error::new(
                    Reason::ApiKeyMissing,
                    "the authorization header must be `Bearer <key>`",
                )
            })?;
        let d = digest(secret);
        if constant_time_eq(&d, &admin) {
            return Ok(Caller::Admin);
        }
        match self.read().get(&d) {
            Some(k) if k.revoked_at.is_some() => Err(Error::new(
                Reason::ApiKeyRevoked,
                format!("key {} has been revoked", k.id),
            )),
            // Only the spaces that are still the generation the key was made for: one deleted, or deleted
            // and made again, is not the key's.
            Some(k) => Ok(Caller::Scoped {
                key_id: k.id.clone(),
                spaces: Arc::new(
                    k.spaces
                        .iter()
                        .filter(|s| {
                            self.generations.current(s)
                                == Some(k.generations.get(*s).copied().unwrap_or(0))
                        })
                        .cloned()
                        .collect(),
                ),
            }),
            None => Err(Error::new(Reason::ApiKeyUnknown, "unknown API key")),
        }
    }

    /// Makes a key for `spaces`, bound to their generations now; returns it and its secret. NOT_FOUND when
    /// one of them does not exist.
    pub fn create(&self, name: &str, spaces: BTreeSet<SpaceId>) -> Result<(KeyRecord, String)> {
        if spaces.is_empty() {
            return Err(Error::invalid("a key needs at least one space"));
        }
        let generations = spaces
            .iter()
            .map(|s| {
                let g = self
                    .generations
                    .current(s)
                    .ok_or_else(|| Error::space_not_found(s))?;
                Ok((s.clone(), g))
            })
            .collect::<Result<BTreeMap<_, _>>>()?;
        if name.len() > 200 {
            return Err(Error::invalid("a key's name has at most 200 bytes"));
        }
        let secret = new_secret();
        let mut id = [0u8; 8];
        rand::rng().fill_bytes(&mut id);
        let record = KeyRecord {
            id: format!("key-{}", hex::encode(id)),
            name: name.to_owned(),
            spaces,
            generations,
            digest: digest(&secret),
            created_at: now_ms(),
            revoked_at: None,
        };
        self.store.put_api_key(&record)?;
        self.write().insert(record.digest, record.clone());
        tracing::info!(key_id = %record.id, spaces = ?record.spaces, "API key created");
        Ok((record, secret))
    }

    /// Every key, in id order.
    pub fn list(&self) -> Vec<KeyRecord> {
        let mut all: Vec<KeyRecord> = self.read().values().cloned().collect();
        all.sort_by(|a, b| a.id.cmp(&b.id));
        all
    }

    /// Revokes a key (idempotent) and returns it.
    pub fn revoke(&self, id: &str) -> Result<KeyRecord> {
        let mut keys = self.write();
        let key = keys.values_mut().find(|k| k.id == id).ok_or_else(|| {
            Error::new(Reason::ApiKeyNotFound, format!("API key {id} not found"))
                .about(Resource::new(ResourceKind::ApiKey, id))
        })?;
        if key.revoked_at.is_none() {
            let mut revoked = key.clone();
            revoked.revoked_at = Some(now_ms());
            self.store.put_api_key(&revoked)?;
            *key = revoked;
            tracing::info!(key_id = %id, "API key revoked");
            self.revoked.send_replace(());
        }
        Ok(key.clone())
    }

    /// Whether the scoped key `id` is known and not revoked.
    pub fn is_live(&self, id: &str) -> bool {
        self.read()
            .values()
            .any(|k| k.id == id && k.revoked_at.is_none())
    }

    /// Changes with every revocation (see [`Keyring::is_live`] for whose).
    pub fn revocations(&self) -> watch::Receiver<()> {
        self.revoked.subscribe()
    }

    /// Takes a deleted space out of every key's scope; a key left with no space is revoked.
    pub fn forget_space(&self, space: &SpaceId) -> Result<()> {
        let mut keys = self.write();
        for key in keys.values_mut().filter(|k| k.spaces.contains(space)) {
            let mut changed = key.clone();
            changed.spaces.remove(space);
            changed.generations.remove(space);
            if changed.spaces.is_empty() && changed.revoked_at.is_none() {
                changed.revoked_at = Some(now_ms());
                tracing::info!(key_id = %key.id, %space, "API key revoked: its last space was deleted");
            }
            self.store.put_api_key(&changed)?;
            *key = changed;
        }
        // A key revoked here ends what it made, as RevokeApiKey does.
        self.revoked.send_replace(());
        Ok(())
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, HashMap<KeyDigest, KeyRecord>> {
        self.keys.read().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<KeyDigest, KeyRecord>> {
        self.keys.write().unwrap_or_else(|p| p.into_inner())
    }
}

/// Now, to the millisecond the store keeps (so a key reads back as it was made).
fn now_ms() -> SystemTime {
    crate::store::time(crate::store::ms(SystemTime::now()))
}

/// Equality that takes the same time wherever the first difference is.
fn constant_time_eq(a: &KeyDigest, b: &KeyDigest) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The admin key: the configured one, else the one in `DATA_DIR/admin.key`, made (mode 0600) on first start.
pub fn admin_key(configured: Option<&str>, data_dir: &std::path::Path) -> Result<String> {
    if let Some(k) = configured {
        return Ok(k.to_owned());
    }
    let path = data_dir.join(ADMIN_KEY_FILE);
    match std::fs::read_to_string(&path) {
        Ok(k) if !k.trim().is_empty() => return Ok(k.trim().to_owned()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Error::internal(format!(
                "cannot read {}: {e}",
                path.display()
            )));
        }
    }
    let key = new_secret();
    write_private(&path, &format!("{key}\n"))
        .map_err(|e| Error::internal(format!("cannot write {}", path.display())).with_source(e))?;
    tracing::warn!(path = %path.display(), "made an admin key; callers send it as `authorization: Bearer <key>`");
    Ok(key)
}

/// Name of the admin key file in the data folder.
pub const ADMIN_KEY_FILE: &str = "admin.key";

fn write_private(path: &std::path::Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        crate::private::create_dir(dir)?;
    }
    let mut f = crate::private::file_options()
        .write(true)
        .create_new(true)
        .open(path)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn space(s: &str) -> SpaceId {
        SpaceId::parse(s).unwrap()
    }

    fn ring() -> Keyring {
        Keyring::new(
            "admin-secret",
            Arc::new(Store::in_memory().unwrap()),
            Arc::default(),
        )
        .unwrap()
    }

    fn bearer(k: &str) -> Vec<u8> {
        format!("Bearer {k}").into_bytes()
    }

    #[test]
    fn the_admin_key_is_admin_and_nothing_else_gets_in() {
        let r = ring();
        assert_eq!(
            r.authenticate(Some(&bearer("admin-secret"))).unwrap(),
            Caller::Admin
        );
        assert_eq!(
            r.authenticate(Some(b"bearer admin-secret")).unwrap(),
            Caller::Admin
        );
        for (bad, reason) in [
            (None, Reason::ApiKeyMissing),
            (Some(&b"admin-secret"[..]), Reason::ApiKeyMissing),
            (Some(b"Basic admin-secret"), Reason::ApiKeyMissing),
            (Some(b"Bearer "), Reason::ApiKeyMissing),
            (Some(b"Bearer nope"), Reason::ApiKeyUnknown),
        ] {
            let e = r.authenticate(bad).unwrap_err();
            assert!(matches!(e, Error::Unauthenticated(_)), "{bad:?}");
            assert_eq!(e.reason(), reason, "{bad:?}");
        }
    }

    #[test]
    fn a_scoped_key_is_allowed_in_its_spaces_only_until_revoked() {
        let store = Arc::new(Store::in_memory().unwrap());
        let generations = Arc::new(SpaceGenerations::default());
        generations.set(&space("team-a"), 1);
        generations.set(&space("team-b"), 1);
        let r = Keyring::new("admin-secret", Arc::clone(&store), Arc::clone(&generations)).unwrap();
        let (key, secret) = r.create("ci", BTreeSet::from([space("team-a")])).unwrap();
        assert!(secret.starts_with(KEY_PREFIX) && secret.len() == KEY_PREFIX.len() + 64);
        let caller = r.authenticate(Some(&bearer(&secret))).unwrap();
        caller.require_space(&space("team-a")).unwrap();
        let e = caller.require_space(&space("team-b")).unwrap_err();
        assert!(matches!(e, Error::PermissionDenied(_)));
        assert_eq!(
            (e.reason(), e.resources()),
            (
                Reason::SpaceNotAllowed,
                [Resource::space("team-b")].as_slice()
            )
        );
        let e = caller.require_admin("x").unwrap_err();
        assert!(matches!(e, Error::PermissionDenied(_)));
        assert_eq!(e.reason(), Reason::AdminRequired);

        // The store keeps it, hashed: a new keyring on the same store knows it.
        let again =
            Keyring::new("admin-secret", Arc::clone(&store), Arc::clone(&generations)).unwrap();
        assert_eq!(again.authenticate(Some(&bearer(&secret))).unwrap(), caller);
        assert_eq!(store.api_keys().unwrap(), vec![key.clone()]);

        r.revoke(&key.id).unwrap();
        assert!(r.revoke(&key.id).unwrap().revoked_at.is_some());
        assert!(
            matches!(r.authenticate(Some(&bearer(&secret))), Err(e @ Error::Unauthenticated(_)) if e.reason() == Reason::ApiKeyRevoked)
        );
        let again = Keyring::new("admin-secret", store, generations).unwrap();
        assert!(again.authenticate(Some(&bearer(&secret))).is_err());
        assert!(matches!(r.revoke("key-nope"), Err(Error::NotFound(_))));
    }

    #[test]
    fn a_key_reaches_only_the_generation_of_a_space_it_was_made_for_and_dies_with_its_last_space() {
        let store = Arc::new(Store::in_memory().unwrap());
        let generations = Arc::new(SpaceGenerations::default());
        let r = Keyring::new("admin-secret", Arc::clone(&store), Arc::clone(&generations)).unwrap();
        assert!(matches!(
            r.create("x", BTreeSet::from([space("tz")])),
            Err(Error::NotFound(_))
        ));
        generations.set(&space("tz"), 1);
        generations.set(&space("other"), 1);
        let (_, k1) = r.create("k1", BTreeSet::from([space("tz")])).unwrap();
        let (both, k2) = r
            .create("k2", BTreeSet::from([space("tz"), space("other")]))
            .unwrap();
        assert_eq!(both.generations[&space("tz")], 1);
        // tz deleted and made again: the keys made for the first do not reach the second, even before
        // their scope is cleaned up.
        generations.remove(&space("tz"));
        generations.set(&space("tz"), 2);
        let caller = r.authenticate(Some(&bearer(&k1))).unwrap();
        assert!(caller.require_space(&space("tz")).is_err());
        let caller = r.authenticate(Some(&bearer(&k2))).unwrap();
        assert!(caller.require_space(&space("tz")).is_err());
        caller.require_space(&space("other")).unwrap();
        // The deletion's clean-up: k1 had only tz and is revoked; k2 keeps `other`.
        r.forget_space(&space("tz")).unwrap();
        assert!(matches!(
            r.authenticate(Some(&bearer(&k1))),
            Err(e @ Error::Unauthenticated(_)) if e.reason() == Reason::ApiKeyRevoked
        ));
        let kept = Keyring::new("admin-secret", store, generations).unwrap();
        let caller = kept.authenticate(Some(&bearer(&k2))).unwrap();
        assert_eq!(caller.spaces(), Some(&BTreeSet::from([space("other")])));
    }

    #[test]
    fn a_key_needs_a_space() {
        assert!(matches!(
            ring().create("x", BTreeSet::new()),
            Err(Error::InvalidArgument(_))
        ));
    }

    #[test]
    fn disabled_lets_everybody_in_as_admin() {
        let r = Keyring::disabled(Arc::new(Store::in_memory().unwrap()), Arc::default());
        assert_eq!(r.authenticate(None).unwrap(), Caller::Admin);
    }

    #[test]
    fn the_admin_key_file_is_made_once_and_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let k1 = admin_key(None, dir.path()).unwrap();
        let k2 = admin_key(None, dir.path()).unwrap();
        assert_eq!(k1, k2);
        let mode = std::fs::metadata(dir.path().join(ADMIN_KEY_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(admin_key(Some("given"), dir.path()).unwrap(), "given");
    }
}
