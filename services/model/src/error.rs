//! The model's one error: a request that breaks one of its rules. Each binary turns it into its own
//! InvalidArgument (`mentis_core::Error`, the executor's `Error`), which is what the client sees.

/// What is wrong with a request, in words meant for the client.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A malformed action, action id, env or name. `field` is its path in the checked message
    /// (`shell.command`, `action_id`), which the caller places in its request.
    #[error("{message}")]
    InvalidArgument { field: String, message: String },
}

impl Error {
    /// [`Error::InvalidArgument`] of `field`.
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidArgument {
            field: field.into(),
            message: message.into(),
        }
    }

    /// The path of the offending field.
    pub fn field(&self) -> &str {
        match self {
            Self::InvalidArgument { field, .. } => field,
        }
    }
}
