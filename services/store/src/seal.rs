//! The store's key, so that the store holds no usable secret (docs/ARCHITECTURE.md, "Security model"): a
//! random 256-bit key in `MENTIS_DATA_DIR/mentis.key` (0600, 64 hex digits), made at the first start. From it,
//! by HMAC-SHA256 with a label each: every sandbox's executor token (HMAC over the sandbox id, so it is never
//! stored: a pool member's id becomes its sandbox's, and a container made again for the same sandbox gets the
//! same token), the key that seals each sandbox's env (ChaCha20-Poly1305, a random nonce per record, the
//! sandbox id as associated data, so a sealed env moved to another row does not open), and the key's id kept in
//! the store's meta table, so a store opened with another key is refused instead of losing its sandboxes.

use std::collections::BTreeMap;
use std::path::Path;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{ChaCha20Poly1305, Nonce};
use hmac::{Hmac, Mac};
use mentis_core::{Error, Result, SandboxId};
use sha2::Sha256;

/// Name of the key file in the data folder.
pub const KEY_FILE: &str = "mentis.key";

/// What a sealed env starts with; anything else is the plain JSON of schemas before 6.
const SEALED: &str = "sealed1:";
const NONCE_LEN: usize = 12;

/// A signed token longer than this is refused unread.
pub const MAX_SIGNED_LEN: usize = 512;

/// What a signed token is for: each purpose has a key of its own, so a token made for one never passes
/// for another.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signed {
    /// A web terminal link (`auth::link`).
    TerminalLink,
    /// A preview URL (`preview::token`).
    PreviewUrl,
}

/// The key and what is derived from it. Never logged.
pub struct Sealer {
    tokens: [u8; 32],
    links: [u8; 32],
    previews: [u8; 32],
    env: ChaCha20Poly1305,
    id: String,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("key_id", &self.id)
            .finish_non_exhaustive()
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    // HMAC takes a key of any length.
    let Ok(mut mac) = <Hmac<Sha256> as Mac>::new_from_slice(key) else {
        unreachable!("HMAC accepts every key length")
    };
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().into()
}

fn random_key() -> [u8; 32] {
    use rand::RngCore;
    let mut key = [0u8; 32];
    rand::rng().fill_bytes(&mut key);
    key
}

impl Sealer {
    pub fn new(key: &[u8; 32]) -> Self {
        let env = hmac(key, &[b"mentis/v1/env"]);
        Self {
            tokens: hmac(key, &[b"mentis/v1/executor-token"]),
            links: hmac(key, &[b"mentis/v1/terminal-link"]),
            previews: hmac(key, &[b"mentis/v1/preview-url"]),
            env: ChaCha20Poly1305::new(&env.into()),
            id: hex::encode(&hmac(key, &[b"mentis/v1/key-id"])[..8]),
        }
    }

    /// A key of its own (a store in memory).
    pub fn random() -> Self {
        Self::new(&random_key())
    }

    /// The key in `path`; when the file is missing and `may_create`, a new one written there (0600). A file
    /// that cannot be read or does not hold a key is an error naming it.
    pub fn load(path: &Path, may_create: bool) -> Result<Self> {
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && may_create => {
                let key = random_key();
                write_key(path, &key).map_err(|e| {
                    Error::internal(format!("cannot write the store's key {}", path.display()))
                        .with_source(e)
                })?;
                tracing::info!(path = %path.display(), "made the store's key; keep it with the data folder");
                return Ok(Self::new(&key));
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(Error::internal(format!(
                    "the store's key {} is missing: the store was sealed with it, and without it the \
                     runtime cannot reach its sandboxes. Put the file back, or start on an empty \
                     MENTIS_DATA_DIR (this instance's existing sandboxes are then removed)",
                    path.display()
                )));
            }
            Err(e) => {
                return Err(Error::internal(format!(
                    "cannot read the store's key {}",
                    path.display()
                ))
                .with_source(e));
            }
        };
        let key: [u8; 32] = hex::decode(text.trim())
            .ok()
            .and_then(|k| k.try_into().ok())
            .ok_or_else(|| {
                Error::internal(format!(
                    "the store's key {} is corrupt: it must hold 64 hex digits (32 bytes)",
                    path.display()
                ))
            })?;
        Ok(Self::new(&key))
    }

    /// A short public name of the key (kept in the store to recognise it).
    pub fn key_id(&self) -> &str {
        &self.id
    }

    /// The executor token of sandbox `id`: 32 bytes, hex.
    pub fn executor_token(&self, id: SandboxId) -> String {
        hex::encode(hmac(
            &self.tokens,
            &[b"sandbox:", id.to_string().as_bytes()],
        ))
    }

    fn signing_key(&self, purpose: Signed) -> (&[u8; 32], &'static [u8]) {
        match purpose {
            Signed::TerminalLink => (&self.links, b"link:"),
            Signed::PreviewUrl => (&self.previews, b"preview:"),
        }
    }

    /// `payload` signed for `purpose`: `base64url(payload).base64url(mac)`, the MAC an HMAC-SHA256 with
    /// that purpose's key.
    pub fn sign(&self, purpose: Signed, payload: &[u8]) -> String {
        let (key, label) = self.signing_key(purpose);
        format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(payload),
            URL_SAFE_NO_PAD.encode(hmac(key, &[label, payload]))
        )
    }

    /// The payload of a token [`Self::sign`] made for `purpose`, when its MAC holds (compared in constant
    /// time); None for anything else, a token of another purpose or one over [`MAX_SIGNED_LEN`] included.
    pub fn open(&self, purpose: Signed, token: &str) -> Option<Vec<u8>> {
        if token.len() > MAX_SIGNED_LEN {
            return None;
        }
        let (payload, mac) = token.split_once('.')?;
        let payload = URL_SAFE_NO_PAD.decode(payload).ok()?;
        let mac = URL_SAFE_NO_PAD.decode(mac).ok()?;
        let (key, label) = self.signing_key(purpose);
        let mut m = <Hmac<Sha256> as Mac>::new_from_slice(key).ok()?;
        m.update(label);
        m.update(&payload);
        m.verify_slice(&mac).is_ok().then_some(payload)
    }

    /// `env` of sandbox `id`, sealed: `sealed1:` and the hex of nonce and ciphertext.
    pub fn seal_env(&self, id: SandboxId, env: &BTreeMap<String, String>) -> String {
        self.seal_env_of(&id.to_string(), env)
    }

    /// `env` of what `owner` names (a sandbox id, a template's `template:SPACE/NAME`), sealed: it opens
    /// only for the same owner.
    pub fn seal_env_of(&self, owner: &str, env: &BTreeMap<String, String>) -> String {
        let plain = serde_json::to_vec(env).unwrap_or_else(|_| b"{}".to_vec());
        let nonce: [u8; NONCE_LEN] = {
            use rand::RngCore;
            let mut n = [0u8; NONCE_LEN];
            rand::rng().fill_bytes(&mut n);
            n
        };
        let sealed = self.env.encrypt(
            Nonce::from_slice(&nonce),
            Payload {
                msg: &plain,
                aad: owner.as_bytes(),
            },
        );
        match sealed {
            Ok(ct) => format!("{SEALED}{}{}", hex::encode(nonce), hex::encode(ct)),
            // ChaCha20-Poly1305 fails only past 256 GiB of message.
            Err(_) => unreachable!("an env is far below the cipher's limit"),
        }
    }

    /// The env of sandbox `id` from what [`Sealer::seal_env`] made, or from the plain JSON of older schemas.
    /// `None` when it does not open (damaged, or sealed for another sandbox or with another key).
    pub fn open_env(&self, id: SandboxId, text: &str) -> Option<BTreeMap<String, String>> {
        self.open_env_of(&id.to_string(), text)
    }

    /// What [`Sealer::seal_env_of`] sealed for `owner`.
    pub fn open_env_of(&self, owner: &str, text: &str) -> Option<BTreeMap<String, String>> {
        let Some(sealed) = text.strip_prefix(SEALED) else {
            return serde_json::from_str(text).ok();
        };
        let bytes = hex::decode(sealed).ok()?;
        if bytes.len() < NONCE_LEN {
            return None;
        }
        let (nonce, ct) = bytes.split_at(NONCE_LEN);
        let plain = self
            .env
            .decrypt(
                Nonce::from_slice(nonce),
                Payload {
                    msg: ct,
                    aad: owner.as_bytes(),
                },
            )
            .ok()?;
        serde_json::from_slice(&plain).ok()
    }

    /// Whether `text` is a sealed env (not the plain JSON of older schemas).
    pub fn is_sealed(text: &str) -> bool {
        text.starts_with(SEALED)
    }
}

fn write_key(path: &Path, key: &[u8; 32]) -> std::io::Result<()> {
    use std::io::Write;
    if let Some(dir) = path.parent() {
        crate::private::create_dir(dir)?;
    }
    let mut f = crate::private::file_options()
        .write(true)
        .create_new(true)
        .open(path)?;
    f.write_all(format!("{}\n", hex::encode(key)).as_bytes())?;
    f.sync_all()?;
    // The file's name is durable once its folder is.
    if let Some(dir) = path.parent() {
        std::fs::File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn tokens_are_per_sandbox_and_per_key_and_stable() {
        let key = random_key();
        let (a, b) = (Sealer::new(&key), Sealer::new(&key));
        let (x, y) = (SandboxId::new(), SandboxId::new());
        assert_eq!(a.executor_token(x), b.executor_token(x));
        assert_ne!(a.executor_token(x), a.executor_token(y));
        assert_ne!(a.executor_token(x), Sealer::random().executor_token(x));
        assert_eq!(a.executor_token(x).len(), 64);
        assert_eq!(a.key_id(), b.key_id());
        assert_ne!(a.key_id(), Sealer::random().key_id());
    }

    #[test]
    fn env_is_sealed_to_its_sandbox_and_key_and_plain_json_still_reads() {
        let s = Sealer::random();
        let id = SandboxId::new();
        let env: BTreeMap<String, String> = [("SECRET".to_owned(), "hunter2".to_owned())].into();
        let sealed = s.seal_env(id, &env);
        assert!(Sealer::is_sealed(&sealed));
        assert!(!sealed.contains("hunter2") && !sealed.contains("SECRET"));
        assert_ne!(sealed, s.seal_env(id, &env), "a fresh nonce each time");
        assert_eq!(s.open_env(id, &sealed), Some(env.clone()));
        assert_eq!(
            s.open_env(SandboxId::new(), &sealed),
            None,
            "another sandbox"
        );
        assert_eq!(Sealer::random().open_env(id, &sealed), None, "another key");
        let mut damaged = sealed.clone();
        damaged.pop();
        damaged.push('0');
        assert_eq!(
            s.open_env(id, &damaged.replace("sealed1:", "sealed1:00")),
            None
        );
        assert_eq!(s.open_env(id, r#"{"SECRET":"hunter2"}"#), Some(env));
    }

    #[test]
    fn the_key_file_is_made_once_0600_and_a_missing_or_corrupt_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(KEY_FILE);
        let err = Sealer::load(&path, false).unwrap_err().to_string();
        assert!(
            err.contains("is missing") && err.contains("mentis.key"),
            "{err}"
        );
        let made = Sealer::load(&path, true).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(Sealer::load(&path, false).unwrap().key_id(), made.key_id());
        assert_eq!(Sealer::load(&path, true).unwrap().key_id(), made.key_id());
        for bad in ["", "zz", "00112233"] {
            std::fs::write(&path, bad).unwrap();
            let err = Sealer::load(&path, true).unwrap_err().to_string();
            assert!(
                err.contains("is corrupt") && err.contains("mentis.key"),
                "{err}"
            );
        }
        std::fs::remove_file(&path).unwrap();
        std::fs::create_dir(&path).unwrap();
        let err = Sealer::load(&path, true).unwrap_err();
        assert!(err.to_string().contains("cannot read"), "{err}");
    }
}
