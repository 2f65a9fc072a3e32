//! The model's one error: a request that breaks one of its rules. Each binary turns it into its own
//! InvalidArgument (`mentis_core::Error`, the executor's `Error`), which is what the client sees.

/// What is wrong with a request, in words meant for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A malformed action, action id, env or name.
    #[error("{0}")]
    InvalidArgument(String),
}

impl Error {
    /// Shorthand for [`Error::InvalidArgument`].
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidArgument(msg.into())
    }
}
