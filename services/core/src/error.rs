//! The error enum that crosses crate boundaries. Each variant is one row of the table in
//! docs/ARCHITECTURE.md, "Errors and statuses"; the API layer is the only place that turns it into a gRPC
//! status.

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
    /// Docker or the executor is unreachable, or the service is shutting down.
    #[error("{0}")]
    Unavailable(String),
    /// No credentials, or credentials the runtime does not know (or has revoked).
    #[error("{0}")]
    Unauthenticated(String),
    /// Known credentials that do not allow this call (another space, an admin-only call).
    #[error("{0}")]
    PermissionDenied(String),
    /// Anything else. The message is for the log, not for the client.
    #[error("{0}")]
    Internal(String),
}

/// Result with the shared [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidArgument(msg.into())
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
