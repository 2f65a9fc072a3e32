//! Preview URL tokens: `base64url(payload).base64url(mac)`, the payload `preview1`, the sandbox id, the
//! port, the expiry in Unix seconds and the two revocation generations it was issued under (the sandbox's
//! and the port's), one per line; the MAC is HMAC-SHA256 keyed by a key derived from the data folder's key
//! for previews alone (`store::seal`), so a terminal link never passes for a preview token nor the other
//! way round, and tokens outlive a restart of the runtime but not its data folder.

use mentis_core::SandboxId;

use crate::store::{Sealer, Signed};

/// What a token opens, and until when.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ticket {
    pub sandbox_id: SandboxId,
    pub port: u16,
    /// Unix seconds after which it no longer opens.
    pub expires_at: u64,
    /// The sandbox's revocation generation when it was issued (revoking every port bumps it).
    pub sandbox_generation: u64,
    /// The port's revocation generation when it was issued.
    pub port_generation: u64,
}

/// Why a token does not open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum TicketError {
    #[error("the preview token is malformed or its signature is wrong")]
    Forged,
    #[error("the preview URL has expired; ask for a new one (SandboxService.GetPreviewUrl)")]
    Expired,
}

impl Ticket {
    fn payload(&self) -> String {
        format!(
            "preview1\n{}\n{}\n{}\n{}\n{}",
            self.sandbox_id,
            self.port,
            self.expires_at,
            self.sandbox_generation,
            self.port_generation
        )
    }

    /// The signed token of this ticket.
    pub fn token(&self, sealer: &Sealer) -> String {
        sealer.sign(Signed::PreviewUrl, self.payload().as_bytes())
    }

    /// The ticket `token` stands for, if its signature holds and it has not expired at `now` (Unix
    /// seconds).
    pub fn verify(sealer: &Sealer, token: &str, now: u64) -> Result<Self, TicketError> {
        let payload = sealer
            .open(Signed::PreviewUrl, token)
            .ok_or(TicketError::Forged)?;
        let text = String::from_utf8(payload).map_err(|_| TicketError::Forged)?;
        let fields: Vec<&str> = text.split('\n').collect();
        let ["preview1", sandbox, port, expires, gen_sandbox, gen_port] = fields[..] else {
            return Err(TicketError::Forged);
        };
        let ticket = Self {
            sandbox_id: SandboxId::parse(sandbox).map_err(|_| TicketError::Forged)?,
            port: port.parse().map_err(|_| TicketError::Forged)?,
            expires_at: expires.parse().map_err(|_| TicketError::Forged)?,
            sandbox_generation: gen_sandbox.parse().map_err(|_| TicketError::Forged)?,
            port_generation: gen_port.parse().map_err(|_| TicketError::Forged)?,
        };
        if now >= ticket.expires_at {
            return Err(TicketError::Expired);
        }
        Ok(ticket)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use base64::Engine as _;
    use base64::engine::general_purpose::URL_SAFE_NO_PAD;

    use super::*;

    fn ticket() -> Ticket {
        Ticket {
            sandbox_id: SandboxId::new(),
            port: 8000,
            expires_at: 2_000,
            sandbox_generation: 1,
            port_generation: 3,
        }
    }

    #[test]
    fn a_token_opens_until_it_expires_and_only_with_its_own_key() {
        let sealer = Sealer::new(&[7; 32]);
        let t = ticket();
        let token = t.token(&sealer);
        assert_eq!(Ticket::verify(&sealer, &token, 1_999), Ok(t.clone()));
        assert_eq!(
            Ticket::verify(&sealer, &token, 2_000),
            Err(TicketError::Expired)
        );
        let other = Sealer::new(&[8; 32]);
        assert_eq!(
            Ticket::verify(&other, &token, 1_000),
            Err(TicketError::Forged)
        );
    }

    #[test]
    fn a_changed_payload_or_a_terminal_link_is_forged() {
        let sealer = Sealer::new(&[7; 32]);
        let t = ticket();
        let token = t.token(&sealer);
        let (_, mac) = token.split_once('.').unwrap();
        let other_port = Ticket { port: 8001, ..t };
        let swapped = format!(
            "{}.{mac}",
            URL_SAFE_NO_PAD.encode(other_port.payload().as_bytes())
        );
        assert_eq!(
            Ticket::verify(&sealer, &swapped, 1_000),
            Err(TicketError::Forged)
        );
        // A terminal link's token, signed with the same data folder key, is no preview token.
        let link = crate::auth::link::Link {
            sandbox_id: SandboxId::new(),
            terminal_id: None,
            expires_at: 2_000,
            key_id: None,
            generation: 0,
        }
        .token(&sealer);
        assert_eq!(
            Ticket::verify(&sealer, &link, 1_000),
            Err(TicketError::Forged)
        );
        let long = "x".repeat(600);
        for junk in ["", ".", "a.b", long.as_str()] {
            assert_eq!(
                Ticket::verify(&sealer, junk, 1_000),
                Err(TicketError::Forged)
            );
        }
    }
}
