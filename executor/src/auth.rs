//! Bearer-token check for every ExecutorService and WorkspaceService call. Health stays open for
//! readiness probes, which cannot send headers, but a health call that presents a token must present ours:
//! the control plane always does, so an executor that took over a vanished sandbox's address (Docker
//! reuses IPs) answers it UNAUTHENTICATED instead of passing for the old sandbox.

use tonic::service::Interceptor;
use tonic::{Request, Status};

use crate::config::Token;
use crate::error::Error;

/// Interceptor that admits only requests carrying `authorization: Bearer <token>`.
#[derive(Clone)]
pub(crate) struct BearerAuth {
    token: Token,
    /// Calls without an `authorization` header are admitted (health).
    anonymous: bool,
}

impl BearerAuth {
    pub(crate) fn new(token: Token) -> Self {
        Self {
            token,
            anonymous: false,
        }
    }

    /// For health: open to callers without credentials, closed to wrong ones.
    pub(crate) fn optional(token: Token) -> Self {
        Self {
            token,
            anonymous: true,
        }
    }

    fn admits(&self, header: Option<&[u8]>) -> bool {
        let Some(header) = header else {
            return self.anonymous;
        };
        let Some(presented) = bearer_credentials(header) else {
            return false;
        };
        constant_time_eq(presented, self.token.as_bytes())
    }
}

impl Interceptor for BearerAuth {
    fn call(&mut self, request: Request<()>) -> Result<Request<()>, Status> {
        let header = request
            .metadata()
            .get("authorization")
            .map(|value| value.as_bytes());
        if self.admits(header) {
            Ok(request)
        } else {
            // Never log what was presented: a near-miss could be the real token with a typo.
            tracing::warn!("rejected a call without a valid bearer token");
            Err(Error::Unauthenticated.into())
        }
    }
}

/// The credentials of an `Authorization: Bearer ...` header; the scheme is case-insensitive (RFC 7235).
fn bearer_credentials(header: &[u8]) -> Option<&[u8]> {
    const SCHEME: &[u8] = b"bearer ";
    if header.len() <= SCHEME.len() || !header[..SCHEME.len()].eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    Some(header[SCHEME.len()..].trim_ascii())
}

/// Compares without returning early on the first differing byte, so response time does not reveal how
/// much of a guessed token is right. (Only the length can leak, which is not secret enough to matter.)
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn auth() -> BearerAuth {
        BearerAuth::new(Token::new("tok-123").unwrap())
    }

    #[test]
    fn admits_only_the_right_bearer_token() {
        let auth = auth();
        assert!(auth.admits(Some(b"Bearer tok-123")));
        assert!(auth.admits(Some(b"bearer tok-123")));
        assert!(!auth.admits(None));
        assert!(!auth.admits(Some(b"Bearer ")));
        assert!(!auth.admits(Some(b"Bearer tok-12")));
        assert!(!auth.admits(Some(b"Bearer tok-1234")));
        assert!(!auth.admits(Some(b"Basic tok-123")));
        assert!(!auth.admits(Some(b"tok-123")));
    }

    #[test]
    fn health_admits_no_token_but_not_a_wrong_one() {
        let auth = BearerAuth::optional(Token::new("tok-123").unwrap());
        assert!(auth.admits(None));
        assert!(auth.admits(Some(b"Bearer tok-123")));
        assert!(!auth.admits(Some(b"Bearer another-sandbox")));
        assert!(!auth.admits(Some(b"")));
    }

    #[test]
    fn constant_time_eq_is_plain_equality() {
        assert!(constant_time_eq(b"", b""));
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(!constant_time_eq(b"", b"a"));
    }

    #[test]
    fn interceptor_answers_unauthenticated() {
        let mut auth = auth();
        let status = auth.call(Request::new(())).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unauthenticated);

        let mut request = Request::new(());
        request
            .metadata_mut()
            .insert("authorization", "Bearer tok-123".parse().unwrap());
        assert!(auth.call(request).is_ok());
    }
}
