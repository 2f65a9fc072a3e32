//! Preview URLs handed out, revoked and checked: what a token opens and how a URL is written.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mentis_core::{Error, Reason, Result, SandboxId};
use tokio::sync::watch;

use super::token::{Ticket, TicketError};
use crate::auth::link::unix;
use crate::config::RuntimeConfig;
use crate::store::Store;

/// A preview URL's lifetime when the request names none.
pub const DEFAULT_TTL: Duration = Duration::from_secs(3600);
/// The longest lifetime a preview URL may ask for.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);
/// The query parameter, header and cookie that carry a token.
pub const TOKEN_PARAM: &str = "mentis_preview_token";
pub const TOKEN_HEADER: &str = "x-mentis-preview-token";

/// Why a token does not open a preview.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("no preview token: open the URL GetPreviewUrl returned")]
    Missing,
    #[error(transparent)]
    Ticket(#[from] TicketError),
    #[error("the preview token is for another sandbox or port")]
    Elsewhere,
    #[error("the preview URL was revoked; ask for a new one (SandboxService.GetPreviewUrl)")]
    Revoked,
}

/// Where preview URLs lead and how they are written.
pub struct Previews {
    store: Arc<Store>,
    /// `scheme://host[:port]` of the HTTP listener as clients reach it; None: no listener, no previews.
    base: Option<String>,
    /// The base's scheme and `:port` (empty for none), around an app's own host in host-based URLs.
    scheme: String,
    port_part: String,
    /// Host-based URLs under this domain; path-based when None.
    domain: Option<String>,
    /// Revocation generations read so far (this runtime is their only writer).
    generations: Mutex<HashMap<(SandboxId, u16), u64>>,
    /// Told of every revocation, so that what a token opened ends with it ([`Previews::ended`]).
    revoked: watch::Sender<()>,
}

impl std::fmt::Debug for Previews {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Previews")
            .field("base", &self.base)
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

/// A preview URL handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Issued {
    pub url: String,
    pub path: String,
    pub token: String,
    pub expires_at: SystemTime,
}

impl Previews {
    /// Previews as `config` writes them; `http` is the HTTP listener's address (None: no listener).
    pub fn new(config: &RuntimeConfig, http: Option<SocketAddr>, store: Arc<Store>) -> Self {
        let base = http.map(|addr| {
            config.preview_base_url.clone().unwrap_or_else(|| {
                let mut addr = addr;
                if addr.ip().is_unspecified() {
                    addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                format!("http://{addr}")
            })
        });
        // A base is either checked by the config (`config::preview::base_url`) or made just above.
        let uri = base.as_deref().and_then(|b| b.parse::<http::Uri>().ok());
        let scheme = uri
            .as_ref()
            .and_then(|u| u.scheme_str())
            .unwrap_or("http")
            .to_owned();
        let port_part = uri
            .and_then(|u| u.port_u16())
            .map(|p| format!(":{p}"))
            .unwrap_or_default();
        Self {
            store,
            base,
            scheme,
            port_part,
            domain: config.preview_domain.clone(),
            generations: Mutex::new(HashMap::new()),
            revoked: watch::Sender::new(()),
        }
    }

    /// The scheme, host and port clients reach the HTTP listener at (`http://127.0.0.1:8080`), put in front
    /// of the paths of previews and web terminal links; None without a listener.
    pub fn base(&self) -> Option<&str> {
        self.base.as_deref()
    }

    /// The domain of host-based previews, if any.
    pub fn domain(&self) -> Option<&str> {
        self.domain.as_deref()
    }

    /// Whether the listener is reached over HTTPS (the cookie is then `Secure`).
    pub fn secure(&self) -> bool {
        self.scheme == "https"
    }

    fn generation(&self, sandbox: SandboxId, port: u16) -> Result<u64> {
        let mut cache = self.generations.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(g) = cache.get(&(sandbox, port)) {
            return Ok(*g);
        }
        let g = self.store.preview_generation(sandbox, port)?;
        cache.insert((sandbox, port), g);
        Ok(g)
    }

    /// A URL for `port` of `sandbox` that opens for `ttl` (0: [`DEFAULT_TTL`]; more than [`MAX_TTL`] is
    /// refused by the caller).
    pub fn issue(&self, sandbox: SandboxId, port: u16, ttl: Duration) -> Result<Issued> {
        let Some(base) = &self.base else {
            return Err(Error::new(
                Reason::FailedPrecondition,
                "preview URLs need the runtime's HTTP listener: set MENTIS_HTTP_LISTEN",
            ));
        };
        let ttl = if ttl.is_zero() { DEFAULT_TTL } else { ttl };
        let expires_at = crate::clock::now() + ttl;
        let ticket = Ticket {
            sandbox_id: sandbox,
            port,
            expires_at: unix(expires_at),
            sandbox_generation: self.generation(sandbox, 0)?,
            port_generation: self.generation(sandbox, port)?,
        };
        let token = ticket.token(self.store.sealer());
        let path = format!("/preview/{sandbox}/{port}/?{TOKEN_PARAM}={token}");
        let url = match &self.domain {
            // The base's scheme and port, on the app's own host.
            Some(domain) => format!(
                "{}://{port}-{sandbox}.{domain}{}/?{TOKEN_PARAM}={token}",
                self.scheme, self.port_part
            ),
            None => format!("{base}{path}"),
        };
        Ok(Issued {
            url,
            path,
            token,
            expires_at: UNIX_EPOCH + Duration::from_secs(ticket.expires_at),
        })
    }

    /// Revokes every URL of `port` of `sandbox` handed out so far (0: of every port); what they opened
    /// ends at once ([`Previews::ended`]).
    pub fn revoke(&self, sandbox: SandboxId, port: u16) -> Result<()> {
        let g = self.store.revoke_previews(sandbox, port)?;
        self.generations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((sandbox, port), g);
        self.revoked.send_replace(());
        Ok(())
    }

    /// Whether `ticket`'s generations are still those of its sandbox and port.
    fn current(&self, ticket: &Ticket) -> std::result::Result<(), Refusal> {
        let current = |p| {
            self.generation(ticket.sandbox_id, p)
                .map_err(|_| Refusal::Revoked)
        };
        if ticket.sandbox_generation != current(0)?
            || ticket.port_generation != current(ticket.port)?
        {
            return Err(Refusal::Revoked);
        }
        Ok(())
    }

    /// Resolves when `ticket` stops opening: at once when its URLs are revoked, else at its expiry (what
    /// it opened, a connection to the app or a WebSocket tunnel, ends then). Checks the ticket first, so a
    /// revocation between [`Previews::check`] and this call is not missed.
    pub async fn ended(&self, ticket: &Ticket) -> Refusal {
        let mut revoked = self.revoked.subscribe();
        let expiry = crate::clock::sleep_until(UNIX_EPOCH + Duration::from_secs(ticket.expires_at));
        tokio::pin!(expiry);
        loop {
            if let Err(r) = self.current(ticket) {
                return r;
            }
            tokio::select! {
                // The sender lives in `self`: `changed` fails only when nothing is left to revoke.
                changed = revoked.changed() => if changed.is_err() {
                    (&mut expiry).await;
                    return Refusal::Ticket(TicketError::Expired);
                },
                () = &mut expiry => return Refusal::Ticket(TicketError::Expired),
            }
        }
    }

    /// The ticket of `token` when it opens `port` of `sandbox` now.
    pub fn check(
        &self,
        token: Option<&str>,
        sandbox: SandboxId,
        port: u16,
    ) -> std::result::Result<Ticket, Refusal> {
        let token = token.ok_or(Refusal::Missing)?;
        let ticket = Ticket::verify(self.store.sealer(), token, unix(crate::clock::now()))?;
        if ticket.sandbox_id != sandbox || ticket.port != port {
            return Err(Refusal::Elsewhere);
        }
        self.current(&ticket)?;
        Ok(ticket)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn previews() -> Previews {
        let http = SocketAddr::from(([127, 0, 0, 1], 8080));
        Previews::new(
            &RuntimeConfig::default(),
            Some(http),
            Arc::new(Store::in_memory().unwrap()),
        )
    }

    fn ticket(p: &Previews, sandbox: SandboxId, port: u16, ttl: Duration) -> Ticket {
        let issued = p.issue(sandbox, port, ttl).unwrap();
        p.check(Some(&issued.token), sandbox, port).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn what_a_url_opened_ends_at_its_revocation_or_expiry() {
        let p = previews();
        let (a, b) = (SandboxId::new(), SandboxId::new());
        let hour = Duration::from_secs(3600);
        let port = ticket(&p, a, 8000, hour);
        let other_port = ticket(&p, a, 8001, hour);
        let every_port = ticket(&p, a, 8002, hour);
        let elsewhere = ticket(&p, b, 8000, hour);
        let (port_ended, other_ended, every_ended, elsewhere_ended) = (
            p.ended(&port),
            p.ended(&other_port),
            p.ended(&every_port),
            p.ended(&elsewhere),
        );
        tokio::pin!(port_ended, other_ended, every_ended, elsewhere_ended);
        tokio::select! {
            _ = &mut port_ended => panic!("ended unrevoked"),
            _ = &mut other_ended => panic!("ended unrevoked"),
            _ = &mut every_ended => panic!("ended unrevoked"),
            _ = &mut elsewhere_ended => panic!("ended unrevoked"),
            () = tokio::time::sleep(Duration::from_secs(60)) => {}
        }
        // One port's revocation ends that port's only; the sandbox's every port's; another sandbox's none.
        p.revoke(a, 8000).unwrap();
        assert_eq!(port_ended.await, Refusal::Revoked);
        tokio::select! {
            _ = &mut other_ended => panic!("another port's ended"),
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        p.revoke(a, 0).unwrap();
        assert_eq!(other_ended.await, Refusal::Revoked);
        assert_eq!(every_ended.await, Refusal::Revoked);
        tokio::select! {
            _ = &mut elsewhere_ended => panic!("another sandbox's ended"),
            () = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
        // A revocation before `ended` is called is not missed.
        let late = ticket(&p, b, 9000, hour);
        p.revoke(b, 9000).unwrap();
        assert_eq!(p.ended(&late).await, Refusal::Revoked);
        // Expiry: Unix seconds, so between 4 and 5 s of this clock.
        let short = ticket(&p, b, 8000, Duration::from_secs(5));
        let start = tokio::time::Instant::now();
        assert_eq!(p.ended(&short).await, Refusal::Ticket(TicketError::Expired));
        assert!(
            start.elapsed() <= Duration::from_secs(5),
            "{:?}",
            start.elapsed()
        );
    }
}
