//! Web terminal links (docs/ARCHITECTURE.md, "Web terminal"): TerminalService.CreateTerminalLink mints a
//! short-lived token for one sandbox (and, to attach, one of its terminals); the HTTP listener takes it
//! instead of an API key, which never appears in a URL. A token is `base64url(payload).base64url(mac)`, the
//! payload `v2`, the sandbox id, the terminal id (may be empty), the expiry in Unix seconds, the id of the key
//! that made it (empty: the admin key) and the sandbox's link generation, one per line; the MAC is
//! HMAC-SHA256 keyed by a key derived from the data folder's key (`store::seal`).
//!
//! A link opens while it has not expired, the key that made it is not revoked, and its generation is the
//! sandbox's (RevokeTerminalLinks moves it on, in the store's `link_generations`): links and their
//! revocations outlive a restart of the runtime (not its data folder), and nothing is kept per link. What a
//! link opened, a page's socket, ends when it stops opening ([`Links::ended`]).

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mentis_core::{Error, Result, SandboxId};
use tokio::sync::watch;

use super::{Caller, Keyring};
use crate::store::{Sealer, Signed, Store};

/// A link's lifetime when the request names none: its page stays open that long (a link dies with the key
/// that made it and can be revoked, so it need not be short to be safe).
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);
/// The longest lifetime a link may ask for.
pub const MAX_TTL: Duration = Duration::from_secs(12 * 3600);
/// What a link opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub sandbox_id: SandboxId,
    /// Attach to this terminal; None = start a new one.
    pub terminal_id: Option<String>,
    /// Unix seconds after which the link no longer opens.
    pub expires_at: u64,
    /// The scoped key that made it (None: the admin key, or anybody with authentication disabled):
    /// revoking that key ends the link.
    pub key_id: Option<String>,
    /// The sandbox's link generation when it was made; revoking the sandbox's links moves it on.
    pub generation: u64,
}

/// Why a token does not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("the link's token is malformed or its signature is wrong")]
    Forged,
    #[error("the link has expired; ask for a new one (TerminalService.CreateTerminalLink)")]
    Expired,
    #[error(
        "the sandbox's terminal links were revoked (TerminalService.RevokeTerminalLinks); ask for a new one"
    )]
    Revoked,
    #[error("the API key that made the link was revoked")]
    KeyRevoked,
}

/// Makes, opens and revokes links with the data folder's key (the application's side of links: the API
/// and the web terminal never see the key).
#[derive(Debug, Clone)]
pub struct Links {
    store: Arc<Store>,
    keyring: Arc<Keyring>,
    /// Told of every revocation of links, so that what they opened ends with them ([`Links::ended`]).
    revoked: Arc<watch::Sender<()>>,
}

impl Links {
    pub fn new(store: Arc<Store>, keyring: Arc<Keyring>) -> Self {
        Self {
            store,
            keyring,
            revoked: Arc::new(watch::Sender::new(())),
        }
    }

    /// A link made by `caller` to `sandbox_id` (and `terminal_id`) living `ttl` (see [`ttl`]), and its
    /// signed token. The caller has checked that `caller` may use the sandbox and that it can open the
    /// terminal (`Manager::check_terminal_link`).
    pub fn create(
        &self,
        caller: &Caller,
        sandbox_id: SandboxId,
        terminal_id: Option<String>,
        ttl: Duration,
    ) -> Result<(Link, String)> {
        let link = Link {
            sandbox_id,
            terminal_id,
            expires_at: unix(crate::clock::now() + ttl),
            key_id: caller.key_id().map(str::to_owned),
            generation: self.store.link_generation(sandbox_id)?,
        };
        let token = link.token(self.store.sealer());
        Ok((link, token))
    }

    /// The link `token` stands for, if its signature holds and it opens now (not expired nor revoked).
    pub fn open(&self, token: &str) -> Result<Link, LinkError> {
        let link = Link::verify(self.store.sealer(), token, crate::clock::now())?;
        self.current(&link)?;
        Ok(link)
    }

    /// Revokes every link of `sandbox` made so far; what they opened ends at once ([`Links::ended`]).
    pub fn revoke(&self, sandbox: SandboxId) -> Result<()> {
        self.store.revoke_links(sandbox)?;
        self.revoked.send_replace(());
        Ok(())
    }

    /// Resolves when `link` stops opening: at once when the key that made it or the sandbox's links are
    /// revoked, else at its expiry. Checks the link first, so a revocation between [`Links::open`] and this
    /// call is not missed.
    pub async fn ended(&self, link: &Link) -> LinkError {
        let mut links = self.revoked.subscribe();
        let mut keys = self.keyring.revocations();
        let expiry = crate::clock::sleep_until(UNIX_EPOCH + Duration::from_secs(link.expires_at));
        tokio::pin!(expiry);
        loop {
            if let Err(e) = self.current(link) {
                return e;
            }
            // Both senders live as long as `self`: `changed` fails only when nothing is left to revoke.
            let told = tokio::select! {
                told = links.changed() => told,
                told = keys.changed() => told,
                () = &mut expiry => return LinkError::Expired,
            };
            if told.is_err() {
                (&mut expiry).await;
                return LinkError::Expired;
            }
        }
    }

    /// Whether `link` is still current: its key live, its generation the sandbox's.
    fn current(&self, link: &Link) -> Result<(), LinkError> {
        if let Some(key) = &link.key_id
            && !self.keyring.is_live(key)
        {
            return Err(LinkError::KeyRevoked);
        }
        // A store that cannot be read opens nothing.
        let generation = self
            .store
            .link_generation(link.sandbox_id)
            .map_err(|_| LinkError::Revoked)?;
        if generation != link.generation {
            return Err(LinkError::Revoked);
        }
        Ok(())
    }
}

/// A link's lifetime from a request's `ttl_seconds`: 0 is [`DEFAULT_TTL`], more than [`MAX_TTL`] is
/// INVALID_ARGUMENT.
pub fn ttl(seconds: u32) -> Result<Duration> {
    match Duration::from_secs(seconds.into()) {
        t if t.is_zero() => Ok(DEFAULT_TTL),
        t if t > MAX_TTL => Err(Error::invalid(format!(
            "ttl_seconds is {seconds}; a link lives at most {} seconds",
            MAX_TTL.as_secs()
        ))
        .at("ttl_seconds")),
        t => Ok(t),
    }
}

/// Unix seconds of `t` (0 before the epoch).
pub fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Link {
    fn payload(&self) -> String {
        format!(
            "v2\n{}\n{}\n{}\n{}\n{}",
            self.sandbox_id,
            self.terminal_id.as_deref().unwrap_or(""),
            self.expires_at,
            self.key_id.as_deref().unwrap_or(""),
            self.generation
        )
    }

    /// The signed token of this link.
    pub fn token(&self, sealer: &Sealer) -> String {
        sealer.sign(Signed::TerminalLink, self.payload().as_bytes())
    }

    /// The link `token` stands for, if its signature holds and it has not expired at `now` (revocations are
    /// [`Links::open`]'s). A `v1` token (made before links carried their key) is refused as forged.
    pub fn verify(sealer: &Sealer, token: &str, now: SystemTime) -> Result<Self, LinkError> {
        let payload = sealer
            .open(Signed::TerminalLink, token)
            .ok_or(LinkError::Forged)?;
        let text = String::from_utf8(payload).map_err(|_| LinkError::Forged)?;
        let fields: Vec<&str> = text.split('\n').collect();
        let ["v2", sandbox, terminal, expires, key, generation] = fields[..] else {
            return Err(LinkError::Forged);
        };
        let link = Self {
            sandbox_id: SandboxId::parse(sandbox).map_err(|_| LinkError::Forged)?,
            terminal_id: (!terminal.is_empty()).then(|| terminal.to_string()),
            expires_at: expires.parse().map_err(|_| LinkError::Forged)?,
            key_id: (!key.is_empty()).then(|| key.to_string()),
            generation: generation.parse().map_err(|_| LinkError::Forged)?,
        };
        if unix(now) >= link.expires_at {
            return Err(LinkError::Expired);
        }
        Ok(link)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::BTreeSet;

    use super::*;

    fn link(expires_at: u64) -> Link {
        Link {
            sandbox_id: SandboxId::new(),
            terminal_id: Some("t-1".into()),
            expires_at,
            key_id: Some("key-0123456789abcdef".into()),
            generation: 2,
        }
    }

    #[test]
    fn a_token_opens_until_it_expires() {
        let sealer = Sealer::random();
        let now = SystemTime::now();
        let l = link(unix(now) + 60);
        let token = l.token(&sealer);
        assert_eq!(Link::verify(&sealer, &token, now), Ok(l));
        assert_eq!(
            Link::verify(&sealer, &token, now + Duration::from_secs(61)),
            Err(LinkError::Expired)
        );
    }

    #[test]
    fn forged_tokens_do_not_open() {
        let sealer = Sealer::random();
        let now = SystemTime::now();
        let token = link(unix(now) + 60).token(&sealer);
        // Another data folder's key.
        assert_eq!(
            Link::verify(&Sealer::random(), &token, now),
            Err(LinkError::Forged)
        );
        // The payload changed (a later expiry) with the old signature.
        let (_, mac) = token.split_once('.').unwrap_or_default();
        let longer = link(unix(now) + 6000).token(&sealer);
        let (payload, _) = longer.split_once('.').unwrap_or_default();
        assert_eq!(
            Link::verify(&sealer, &format!("{payload}.{mac}"), now),
            Err(LinkError::Forged)
        );
        // A v1 token, well signed: it names no key, so it is refused.
        let v1 = format!("v1\n{}\n\n{}", SandboxId::new(), unix(now) + 60);
        let old = sealer.sign(Signed::TerminalLink, v1.as_bytes());
        assert_eq!(Link::verify(&sealer, &old, now), Err(LinkError::Forged));
        for junk in [
            "",
            ".",
            "abc",
            "a.b.c",
            &"x".repeat(crate::store::MAX_SIGNED_LEN + 1),
        ] {
            assert_eq!(Link::verify(&sealer, junk, now), Err(LinkError::Forged));
        }
    }

    fn links() -> (Links, Arc<Keyring>) {
        let store = Arc::new(Store::in_memory().unwrap());
        let generations = Arc::new(crate::auth::SpaceGenerations::default());
        generations.set(&mentis_core::SpaceId::parse("team-a").unwrap(), 1);
        let keyring =
            Arc::new(Keyring::new("admin-secret", Arc::clone(&store), generations).unwrap());
        (Links::new(store, Arc::clone(&keyring)), keyring)
    }

    #[test]
    fn a_link_dies_with_its_key_and_its_sandboxs_revocation() {
        let (links, keyring) = links();
        let space = mentis_core::SpaceId::parse("team-a").unwrap();
        let (key, secret) = keyring.create("ci", BTreeSet::from([space])).unwrap();
        let scoped = keyring
            .authenticate(Some(format!("Bearer {secret}").as_bytes()))
            .unwrap();
        let sandbox = SandboxId::new();
        let (made, by_key) = links
            .create(&scoped, sandbox, None, ttl(0).unwrap())
            .unwrap();
        assert_eq!(made.key_id.as_deref(), Some(key.id.as_str()));
        let (_, by_admin) = links
            .create(&Caller::Admin, sandbox, None, Duration::from_secs(60))
            .unwrap();
        assert_eq!(links.open(&by_key), Ok(made));
        keyring.revoke(&key.id).unwrap();
        assert_eq!(links.open(&by_key), Err(LinkError::KeyRevoked));
        assert!(links.open(&by_admin).is_ok());

        // Revoking the sandbox's links ends those made so far, there only.
        let (_, elsewhere) = links
            .create(&Caller::Admin, SandboxId::new(), None, DEFAULT_TTL)
            .unwrap();
        links.revoke(sandbox).unwrap();
        assert_eq!(links.open(&by_admin), Err(LinkError::Revoked));
        assert!(links.open(&elsewhere).is_ok());
        let (_, later) = links
            .create(&Caller::Admin, sandbox, None, DEFAULT_TTL)
            .unwrap();
        assert!(links.open(&later).is_ok());

        assert_eq!(ttl(0).unwrap(), DEFAULT_TTL);
        assert_eq!(ttl(12 * 3600).unwrap(), MAX_TTL);
        let e = ttl(12 * 3600 + 1).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e}");
        assert_eq!(e.field(), Some("ttl_seconds"));
    }

    #[tokio::test(start_paused = true)]
    async fn what_a_link_opened_ends_at_its_revocation_or_expiry() {
        let (links, keyring) = links();
        let space = mentis_core::SpaceId::parse("team-a").unwrap();
        let (key, secret) = keyring.create("ci", BTreeSet::from([space])).unwrap();
        let scoped = keyring
            .authenticate(Some(format!("Bearer {secret}").as_bytes()))
            .unwrap();
        let sandbox = SandboxId::new();
        let (by_key, _) = links
            .create(&scoped, sandbox, None, Duration::from_secs(600))
            .unwrap();
        let (by_admin, _) = links
            .create(&Caller::Admin, sandbox, None, Duration::from_secs(600))
            .unwrap();
        let ended = links.ended(&by_key);
        tokio::pin!(ended);
        let admins = links.ended(&by_admin);
        tokio::pin!(admins);
        // Nothing ends on its own before the expiry.
        tokio::select! {
            _ = &mut ended => panic!("ended unrevoked"),
            _ = &mut admins => panic!("ended unrevoked"),
            () = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
        keyring.revoke(&key.id).unwrap();
        assert_eq!(ended.await, LinkError::KeyRevoked);
        links.revoke(sandbox).unwrap();
        assert_eq!(admins.await, LinkError::Revoked);
        // Expiry: Unix seconds, so between 4 and 5 s of this clock.
        let (short, _) = links
            .create(
                &Caller::Admin,
                SandboxId::new(),
                None,
                Duration::from_secs(5),
            )
            .unwrap();
        let start = tokio::time::Instant::now();
        assert_eq!(links.ended(&short).await, LinkError::Expired);
        assert!(
            start.elapsed() <= Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }
}
