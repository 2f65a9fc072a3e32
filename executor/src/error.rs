//! The crate's one error type, and the one place that turns it into a gRPC status: its code and, in a
//! `google.rpc.ErrorInfo`, the reason the control plane passes on to its clients (`mentis_model::Reason`).
//!
//! A command that fails (non-zero exit, bad work_dir, timeout) is *data* carried in `cmd_end`, never an
//! `Error`: these variants are for requests the executor refuses and for its own failures.

use std::collections::HashMap;

use mentis_model::reason::{DOMAIN, Reason};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// Everything that can go wrong in the executor outside of a command's own outcome.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Bad configuration; the binary exits with this message.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A malformed request.
    #[error("{0}")]
    InvalidArgument(String),
    /// No running action has this id.
    #[error("action {0:?} is not running")]
    NotFound(String),
    /// A running action already has this id.
    #[error("action {0:?} is already running")]
    AlreadyExists(String),
    /// The action exists but cannot do what was asked (e.g. stdin is not open).
    #[error("{0}")]
    FailedPrecondition(String),
    /// The bound on concurrently running actions is reached.
    #[error("too many running actions (limit {limit}); retry when one ends")]
    TooManyActions {
        /// The configured bound.
        limit: usize,
    },
    /// Too many IPython cells are waiting for the kernel.
    #[error(
        "too many IPython cells waiting for the kernel (limit {limit}); retry when some have run"
    )]
    QueueFull {
        /// The configured bound.
        limit: usize,
    },
    /// The kernel cannot serve the request now (it does not start, or is busy for too long).
    #[error("{0}")]
    Unavailable(String),
    /// The action kind exists in the API but this executor cannot run it yet.
    #[error("{0}")]
    Unimplemented(String),
    /// A workspace path that does not exist.
    #[error("{0}")]
    PathNotFound(String),
    /// A workspace path that exists where the request needs it not to.
    #[error("{0}")]
    PathExists(String),
    /// A write, upload or edit over its size cap.
    #[error("{0}")]
    TooLarge(String),
    /// No terminal has this id.
    #[error("no terminal {0:?} in this sandbox")]
    TerminalNotFound(String),
    /// No process has this pid.
    #[error("no process {0} in this sandbox")]
    ProcessNotFound(i32),
    /// The bound on running terminals is reached.
    #[error("too many terminals (limit {limit}); close one first")]
    TooManyTerminals {
        /// The bound the control plane sent.
        limit: usize,
    },
    /// The bound on shell sessions is reached.
    #[error("too many shell sessions (limit {limit}); `exit` in a session ends it")]
    TooManySessions {
        /// The bound.
        limit: usize,
    },
    /// A seq beyond the newest one.
    #[error("{0}")]
    OutOfRange(String),
    /// The workspace's disk is full.
    #[error("no space left in the workspace")]
    WorkspaceFull,
    /// The request carried no token or the wrong one.
    #[error("missing or invalid bearer token")]
    Unauthenticated,
    /// The executor is draining and takes no new work.
    #[error("the executor is shutting down")]
    ShuttingDown,
    /// The gRPC server itself failed.
    #[error("gRPC server failed")]
    Transport(#[from] tonic::transport::Error),
    /// An I/O failure of the executor (not of a command).
    #[error("{context}")]
    Io {
        /// What the executor was doing.
        context: String,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
}

/// A request that breaks a rule of the shared model (an action, an id, an env, a name).
impl From<mentis_model::Error> for Error {
    fn from(e: mentis_model::Error) -> Self {
        match e {
            mentis_model::Error::InvalidArgument { message, .. } => Self::InvalidArgument(message),
        }
    }
}

impl From<Error> for Status {
    fn from(err: Error) -> Self {
        let (code, reason) = match &err {
            Error::InvalidArgument(_) => (Code::InvalidArgument, Reason::InvalidArgument),
            Error::NotFound(_) => (Code::NotFound, Reason::ActionNotFound),
            Error::PathNotFound(_) => (Code::NotFound, Reason::PathNotFound),
            Error::AlreadyExists(_) => (Code::AlreadyExists, Reason::ActionIdReused),
            Error::PathExists(_) => (Code::AlreadyExists, Reason::PathExists),
            Error::TooLarge(_) => (Code::ResourceExhausted, Reason::FileTooLarge),
            Error::WorkspaceFull => (Code::ResourceExhausted, Reason::WorkspaceFull),
            Error::TerminalNotFound(_) => (Code::NotFound, Reason::TerminalNotFound),
            Error::ProcessNotFound(_) => (Code::NotFound, Reason::ProcessNotFound),
            Error::TooManyTerminals { .. } => (Code::ResourceExhausted, Reason::TooManyTerminals),
            Error::OutOfRange(_) => (Code::OutOfRange, Reason::SeqOutOfRange),
            Error::TooManySessions { .. } => (Code::ResourceExhausted, Reason::TooManySessions),
            Error::FailedPrecondition(_) => (Code::FailedPrecondition, Reason::FailedPrecondition),
            Error::TooManyActions { .. } => (Code::ResourceExhausted, Reason::TooManyActions),
            Error::QueueFull { .. } => (Code::ResourceExhausted, Reason::CellQueueFull),
            Error::Unavailable(_) | Error::ShuttingDown => {
                (Code::Unavailable, Reason::ExecutorUnavailable)
            }
            // No reason belongs to UNIMPLEMENTED; the control plane makes it FAILED_PRECONDITION.
            Error::Unimplemented(_) => return Status::unimplemented(err.to_string()),
            Error::Unauthenticated => (Code::Unauthenticated, Reason::Unauthenticated),
            Error::Config(_) | Error::Transport(_) | Error::Io { .. } => {
                // The caller gets a generic message; the chain stays in our log.
                tracing::error!(error = %ErrorChain(&err), "internal error");
                (Code::Internal, Reason::Internal)
            }
        };
        let message = match reason {
            Reason::Internal => "internal error in the executor".to_owned(),
            _ => err.to_string(),
        };
        let info = ErrorDetails::with_error_info(reason.as_str(), DOMAIN, HashMap::new());
        Status::with_error_details(code, message, info)
    }
}

/// Displays an error with its sources, for logs.
pub(crate) struct ErrorChain<'a>(pub(crate) &'a (dyn std::error::Error + 'static));

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_refusal_maps_to_its_code() {
        let cases = [
            (Error::InvalidArgument("x".into()), Code::InvalidArgument),
            (Error::NotFound("a".into()), Code::NotFound),
            (Error::AlreadyExists("a".into()), Code::AlreadyExists),
            (
                Error::FailedPrecondition("x".into()),
                Code::FailedPrecondition,
            ),
            (Error::TooManyActions { limit: 1 }, Code::ResourceExhausted),
            (Error::QueueFull { limit: 1 }, Code::ResourceExhausted),
            (Error::Unavailable("x".into()), Code::Unavailable),
            (Error::PathNotFound("p".into()), Code::NotFound),
            (Error::PathExists("p".into()), Code::AlreadyExists),
            (Error::TooLarge("p".into()), Code::ResourceExhausted),
            (Error::WorkspaceFull, Code::ResourceExhausted),
            (Error::Unimplemented("x".into()), Code::Unimplemented),
            (Error::Unauthenticated, Code::Unauthenticated),
            (Error::ShuttingDown, Code::Unavailable),
        ];
        for (err, code) in cases {
            assert_eq!(Status::from(err).code(), code);
        }
    }

    /// The reason of a status, as the control plane reads it.
    fn reason(s: &Status) -> Option<Reason> {
        let details = s.get_error_details();
        let info = details.error_info()?;
        assert_eq!(info.domain, DOMAIN);
        Reason::from_name(&info.reason)
    }

    #[test]
    fn each_refusal_names_a_reason_of_its_code() {
        let cases = [
            (Error::NotFound("a".into()), Reason::ActionNotFound),
            (Error::AlreadyExists("a".into()), Reason::ActionIdReused),
            (Error::TooManyActions { limit: 1 }, Reason::TooManyActions),
            (Error::QueueFull { limit: 1 }, Reason::CellQueueFull),
            (Error::PathNotFound("p".into()), Reason::PathNotFound),
            (Error::PathExists("p".into()), Reason::PathExists),
            (Error::TooLarge("p".into()), Reason::FileTooLarge),
            (Error::WorkspaceFull, Reason::WorkspaceFull),
            (
                Error::TerminalNotFound("t".into()),
                Reason::TerminalNotFound,
            ),
            (Error::ProcessNotFound(7), Reason::ProcessNotFound),
            (
                Error::TooManyTerminals { limit: 1 },
                Reason::TooManyTerminals,
            ),
            (Error::OutOfRange("s".into()), Reason::SeqOutOfRange),
            (Error::TooManySessions { limit: 1 }, Reason::TooManySessions),
            (Error::Unavailable("x".into()), Reason::ExecutorUnavailable),
            (Error::ShuttingDown, Reason::ExecutorUnavailable),
            (
                Error::FailedPrecondition("x".into()),
                Reason::FailedPrecondition,
            ),
        ];
        for (err, want) in cases {
            let s = Status::from(err);
            assert_eq!(reason(&s), Some(want), "{s:?}");
            assert_eq!(
                format!("{:?}", s.code()),
                format!("{:?}", want.code()),
                "{want} has another code than its status"
            );
        }
        assert_eq!(
            reason(&Status::from(Error::Unimplemented("x".into()))),
            None
        );
    }

    #[test]
    fn internal_errors_hide_their_details() {
        let err = Error::Io {
            context: "reading /secret/path".into(),
            source: std::io::Error::other("boom"),
        };
        let status = Status::from(err);
        assert_eq!(status.code(), Code::Internal);
        assert!(!status.message().contains("secret"));
        assert_eq!(reason(&status), Some(Reason::Internal));
    }
}
