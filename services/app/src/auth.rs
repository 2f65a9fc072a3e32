//! API authentication and authorization. Callers present `authorization: Bearer <key>`. The keyring knows
//! the admin key (from the config, a file, or made on first start) and the space-scoped keys, of which the
//! store holds only a SHA-256; it tells who a caller is ([`Caller`]), and the caller says what it may do.
//! Keys are 256 random bits, so a fast hash is enough: there is nothing to brute-force.

pub mod link;

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use mentis_core::{Error, Reason, Resource, ResourceKind, Result, SpaceId};
use rand::RngCore;
use sha2::{Digest as _, Sha256};

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

    /// The spaces the caller may see; `None` = all of them.
    pub fn spaces(&self) -> Option<&BTreeSet<SpaceId>> {
        match self {
            Self::Admin => None,
            Self::Scoped { spaces, .. } => Some(spaces),
        }
    }
}

/// The keys this runtime accepts.
pub struct Keyring {
    /// `None`: authentication is disabled (local development only).
    admin: Option<KeyDigest>,
    /// Every key by digest, revoked ones included (so that their callers hear "revoked").
    keys: RwLock<HashMap<KeyDigest, KeyRecord>>,
    store: Arc<Store>,
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
    pub fn new(admin_key: &str, store: Arc<Store>) -> Result<Self> {
        let keys = store
            .api_keys()?
            .into_iter()
            .map(|k| (k.digest, k))
            .collect();
        Ok(Self {
            admin: Some(digest(admin_key)),
            keys: RwLock::new(keys),
            store,
        })
    }

    /// A keyring that lets every caller in as admin.
    pub fn disabled(store: Arc<Store>) -> Self {
        Self {
            admin: None,
            keys: RwLock::new(HashMap::new()),
            store,
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
            Some(k) => Ok(Caller::Scoped {
                key_id: k.id.clone(),
                spaces: Arc::new(k.spaces.clone()),
            }),
            None => Err(Error::new(Reason::ApiKeyUnknown, "unknown API key")),
        }
    }

    /// Makes a key for `spaces` (which the caller has checked exist); returns it and its secret.
    pub fn create(&self, name: &str, spaces: BTreeSet<SpaceId>) -> Result<(KeyRecord, String)> {
        if spaces.is_empty() {
            return Err(Error::invalid("a key needs at least one space"));
        }
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
        }
        Ok(key.clone())
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
        Keyring::new("admin-secret", Arc::new(Store::in_memory().unwrap())).unwrap()
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
        let r = Keyring::new("admin-secret", Arc::clone(&store)).unwrap();
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
        let again = Keyring::new("admin-secret", Arc::clone(&store)).unwrap();
        assert_eq!(again.authenticate(Some(&bearer(&secret))).unwrap(), caller);
        assert_eq!(store.api_keys().unwrap(), vec![key.clone()]);

        r.revoke(&key.id).unwrap();
        assert!(r.revoke(&key.id).unwrap().revoked_at.is_some());
        assert!(
            matches!(r.authenticate(Some(&bearer(&secret))), Err(e @ Error::Unauthenticated(_)) if e.reason() == Reason::ApiKeyRevoked)
        );
        let again = Keyring::new("admin-secret", store).unwrap();
        assert!(again.authenticate(Some(&bearer(&secret))).is_err());
        assert!(matches!(r.revoke("key-nope"), Err(Error::NotFound(_))));
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
        let r = Keyring::disabled(Arc::new(Store::in_memory().unwrap()));
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
