//! Web terminal links (docs/ARCHITECTURE.md, "Web terminal"): TerminalService.CreateTerminalLink mints a
//! short-lived token for one sandbox (and, to attach, one of its terminals); the HTTP listener takes it
//! instead of an API key, which never appears in a URL. A token is `base64url(payload).base64url(mac)`, the
//! payload `v1`, the sandbox id, the terminal id (may be empty) and the expiry in Unix seconds, one per line;
//! the MAC is HMAC-SHA256 keyed by a key derived from the data folder's key (`store::seal`), so links outlive
//! a restart of the runtime but not its data folder, and nothing about them is stored.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use std::sync::Arc;

use mentis_core::SandboxId;

use crate::store::{Sealer, Signed, Store};

/// A link's lifetime when the request names none.
pub const DEFAULT_TTL: Duration = Duration::from_secs(300);
/// The longest lifetime a link may ask for.
pub const MAX_TTL: Duration = Duration::from_secs(3600);
/// What a link opens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub sandbox_id: SandboxId,
    /// Attach to this terminal; None = start a new one.
    pub terminal_id: Option<String>,
    /// Unix seconds after which the link no longer opens.
    pub expires_at: u64,
}

/// Why a token does not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum LinkError {
    #[error("the link's token is malformed or its signature is wrong")]
    Forged,
    #[error("the link has expired; ask for a new one (TerminalService.CreateTerminalLink)")]
    Expired,
}

/// Signs links and opens their tokens with the data folder's key (the application's side of links: the API
/// and the web terminal never see the key).
#[derive(Debug, Clone)]
pub struct Links {
    store: Arc<Store>,
}

impl Links {
    pub fn new(store: Arc<Store>) -> Self {
        Self { store }
    }

    /// The signed token of `link`.
    pub fn sign(&self, link: &Link) -> String {
        link.token(self.store.sealer())
    }

    /// The link `token` stands for, if its signature holds and it has not expired now.
    pub fn open(&self, token: &str) -> Result<Link, LinkError> {
        Link::verify(self.store.sealer(), token, crate::clock::now())
    }
}

/// Unix seconds of `t` (0 before the epoch).
pub fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Link {
    fn payload(&self) -> String {
        format!(
            "v1\n{}\n{}\n{}",
            self.sandbox_id,
            self.terminal_id.as_deref().unwrap_or(""),
            self.expires_at
        )
    }

    /// The signed token of this link.
    pub fn token(&self, sealer: &Sealer) -> String {
        sealer.sign(Signed::TerminalLink, self.payload().as_bytes())
    }

    /// The link `token` stands for, if its signature holds and it has not expired at `now`.
    pub fn verify(sealer: &Sealer, token: &str, now: SystemTime) -> Result<Self, LinkError> {
        let payload = sealer
            .open(Signed::TerminalLink, token)
            .ok_or(LinkError::Forged)?;
        let text = String::from_utf8(payload).map_err(|_| LinkError::Forged)?;
        let mut lines = text.split('\n');
        let (Some("v1"), Some(sandbox), Some(terminal), Some(expires), None) = (
            lines.next(),
            lines.next(),
            lines.next(),
            lines.next(),
            lines.next(),
        ) else {
            return Err(LinkError::Forged);
        };
        let link = Self {
            sandbox_id: SandboxId::parse(sandbox).map_err(|_| LinkError::Forged)?,
            terminal_id: (!terminal.is_empty()).then(|| terminal.to_string()),
            expires_at: expires.parse().map_err(|_| LinkError::Forged)?,
        };
        if unix(now) >= link.expires_at {
            return Err(LinkError::Expired);
        }
        Ok(link)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(expires_at: u64) -> Link {
        Link {
            sandbox_id: SandboxId::new(),
            terminal_id: Some("t-1".into()),
            expires_at,
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
}
