//! Preview URLs handed out, revoked and checked: what a token opens and how a URL is written.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use mentis_core::{Error, Reason, Result, SandboxId};

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
        }
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

    /// Revokes every URL of `port` of `sandbox` handed out so far (0: of every port).
    pub fn revoke(&self, sandbox: SandboxId, port: u16) -> Result<()> {
        let g = self.store.revoke_previews(sandbox, port)?;
        self.generations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert((sandbox, port), g);
        Ok(())
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
        let current = |p| self.generation(sandbox, p).map_err(|_| Refusal::Revoked);
        if ticket.sandbox_generation != current(0)? || ticket.port_generation != current(port)? {
            return Err(Refusal::Revoked);
        }
        Ok(ticket)
    }
}
