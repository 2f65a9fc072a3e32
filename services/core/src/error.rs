//! The error enum that crosses crate boundaries. Each variant is one row of the table in
//! docs/ARCHITECTURE.md, "Errors and statuses"; the API layer is the only place that turns it into a gRPC
//! status.

use std::fmt;
use std::sync::Arc;

/// What went wrong, classified by what the caller can do about it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Malformed request, unknown action kind, bad spec.
    #[error("{0}")]
    InvalidArgument(String),
    /// Unknown sandbox, space or action.
    #[error("{0}")]
    NotFound(String),
    /// A client-chosen id is already used.
    #[error("{0}")]
    AlreadyExists(String),
    /// The target is in the wrong state (sandbox not RUNNING, ...).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A configured limit was reached.
    #[error("{0}")]
    ResourceExhausted(String),
    /// Docker or the executor is unreachable, or the service is shutting down. Keeps the error it came
    /// from, for the log.
    #[error("{0}")]
    Unavailable(#[source] Detail),
    /// No credentials, or credentials the runtime does not know (or has revoked).
    #[error("{0}")]
    Unauthenticated(String),
    /// Known credentials that do not allow this call (another space, an admin-only call).
    #[error("{0}")]
    PermissionDenied(String),
    /// Anything else. The message and the error it came from are for the log, not for the client.
    #[error("{0}")]
    Internal(#[source] Detail),
}

/// The message of an Unavailable or Internal error, and the error it came from.
#[derive(Clone)]
pub struct Detail {
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl Detail {
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.source {
            Some(s) => write!(f, "{:?} (from {s:?})", self.message),
            None => write!(f, "{:?}", self.message),
        }
    }
}

impl std::error::Error for Detail {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// Two details are the same when they say the same (sources are for the log).
impl PartialEq for Detail {
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message
    }
}

impl Eq for Detail {}

impl From<String> for Detail {
    fn from(message: String) -> Self {
        Self {
            message,
            source: None,
        }
    }
}

impl From<&str> for Detail {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

/// An error and every error under it, `: `-separated, leaving out a cause whose text the level above
/// already includes: what the log shows.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            let text = e.to_string();
            if !shown.contains(&text) {
                write!(f, ": {text}")?;
                shown = text;
            }
            next = e.source();
        }
        Ok(())
    }
}

/// Result with the shared [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidArgument(msg.into())
    }

    /// [`Error::Unavailable`] with `message`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::Unavailable(Detail::from(message.into()))
    }

    /// [`Error::Internal`] with `message`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::Internal(Detail::from(message.into()))
    }

    /// Keeps `source` under an Unavailable or Internal error (other kinds are the client's to act on and
    /// carry their whole story in their message).
    pub fn with_source(self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        let keep = |d: Detail| Detail {
            message: d.message,
            source: Some(Arc::new(source)),
        };
        match self {
            Self::Unavailable(d) => Self::Unavailable(keep(d)),
            Self::Internal(d) => Self::Internal(keep(d)),
            other => other,
        }
    }

    /// This error and its causes, for the log.
    pub fn chain(&self) -> Chain<'_> {
        Chain(self)
    }
}

/// A request that breaks a rule of the shared model (an action, an id, an env, a name) is the client's to fix.
impl From<mentis_model::Error> for Error {
    fn from(e: mentis_model::Error) -> Self {
        match e {
            mentis_model::Error::InvalidArgument(msg) => Self::InvalidArgument(msg),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connection refused")]
    struct Refused;

    #[derive(Debug, thiserror::Error)]
    #[error("transport error")]
    struct Transport(#[source] Refused);

    #[test]
    fn the_chain_keeps_every_cause_once() {
        let e = Error::unavailable("the executor does not answer").with_source(Transport(Refused));
        assert_eq!(e.to_string(), "the executor does not answer");
        assert_eq!(
            e.chain().to_string(),
            "the executor does not answer: transport error: connection refused"
        );
        // A cause already in the message is not repeated.
        let e = Error::unavailable("cannot reach Docker: transport error")
            .with_source(Transport(Refused));
        assert_eq!(
            e.chain().to_string(),
            "cannot reach Docker: transport error: connection refused"
        );
        // Other kinds carry no source.
        let e = Error::invalid("bad").with_source(Refused);
        assert!(std::error::Error::source(&e).is_none());
    }
}
