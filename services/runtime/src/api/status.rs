//! The one place that turns a domain error into a gRPC status (docs/ARCHITECTURE.md, "Errors and
//! statuses"). Internal and Unavailable errors go to the log with their whole source chain.

use mentis_core::Error;
use tonic::{Code, Status};

/// The gRPC code of an error.
pub fn code(e: &Error) -> Code {
    match e {
        Error::InvalidArgument(_) => Code::InvalidArgument,
        Error::NotFound(_) => Code::NotFound,
        Error::AlreadyExists(_) => Code::AlreadyExists,
        Error::FailedPrecondition(_) => Code::FailedPrecondition,
        Error::ResourceExhausted(_) => Code::ResourceExhausted,
        Error::Unavailable(_) => Code::Unavailable,
        Error::Unauthenticated(_) => Code::Unauthenticated,
        Error::PermissionDenied(_) => Code::PermissionDenied,
        Error::Internal(_) => Code::Internal,
    }
}

/// The canonical name of an error's code (`INVALID_ARGUMENT`, ...), for in-stream rejections.
pub fn code_name(e: &Error) -> &'static str {
    match e {
        Error::InvalidArgument(_) => "INVALID_ARGUMENT",
        Error::NotFound(_) => "NOT_FOUND",
        Error::AlreadyExists(_) => "ALREADY_EXISTS",
        Error::FailedPrecondition(_) => "FAILED_PRECONDITION",
        Error::ResourceExhausted(_) => "RESOURCE_EXHAUSTED",
        Error::Unavailable(_) => "UNAVAILABLE",
        Error::Unauthenticated(_) => "UNAUTHENTICATED",
        Error::PermissionDenied(_) => "PERMISSION_DENIED",
        Error::Internal(_) => "INTERNAL",
    }
}

/// The message a client sees. Internal details go to the log under an id the client can quote.
pub fn client_message(e: &Error) -> String {
    match e {
        Error::Internal(_) => {
            let id = uuid::Uuid::new_v4();
            tracing::error!(error_id = %id, error = %e.chain(), "internal error");
            format!("internal error (error id {id})")
        }
        Error::Unavailable(_) => {
            tracing::warn!(error = %e.chain(), "unavailable");
            e.to_string()
        }
        other => other.to_string(),
    }
}

/// The gRPC status of an error.
pub fn to_status(e: Error) -> Status {
    Status::new(code(&e), client_message(&e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn internal_details_stay_in_the_log() {
        let s = to_status(Error::internal("secret path /x/y"));
        assert_eq!(s.code(), Code::Internal);
        assert!(!s.message().contains("secret"));
        let s = to_status(Error::NotFound("sandbox x not found".into()));
        assert_eq!(
            (s.code(), s.message()),
            (Code::NotFound, "sandbox x not found")
        );
    }
}
