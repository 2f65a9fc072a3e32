//! The one place that turns a domain error into a gRPC status (docs/ARCHITECTURE.md, "Errors and
//! statuses"): the code, the message, and `google.rpc` details a program can act on — ErrorInfo (the
//! reason, the domain, the ids involved), BadRequest (the field at fault), RetryInfo (when a retry can
//! cure it) and ResourceInfo (the resource it is about). Internal and Unavailable errors go to the log
//! with their whole source chain.

use std::collections::HashMap;

use mentis_core::error::{Code as Class, DOMAIN};
use mentis_core::{Error, Reason};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, FieldViolation, StatusExt};

/// The key of an Internal error's id in `ErrorInfo.metadata` (the id its message quotes).
pub const ERROR_ID: &str = "error_id";

/// The gRPC code of an error.
pub fn code(e: &Error) -> Code {
    match e.code() {
        Class::InvalidArgument => Code::InvalidArgument,
        Class::NotFound => Code::NotFound,
        Class::AlreadyExists => Code::AlreadyExists,
        Class::FailedPrecondition => Code::FailedPrecondition,
        Class::ResourceExhausted => Code::ResourceExhausted,
        Class::Unavailable => Code::Unavailable,
        Class::Unauthenticated => Code::Unauthenticated,
        Class::PermissionDenied => Code::PermissionDenied,
        Class::OutOfRange => Code::OutOfRange,
        Class::Internal => Code::Internal,
    }
}

/// The canonical name of an error's code (`INVALID_ARGUMENT`, ...), for in-stream rejections.
pub fn code_name(e: &Error) -> &'static str {
    e.code().name()
}

/// The reason of an error (`SANDBOX_NOT_FOUND`, ...), for in-stream rejections: the same as its status's
/// ErrorInfo.
pub fn reason(e: &Error) -> &'static str {
    e.reason().as_str()
}

/// The message a client sees. Internal details go to the log under an id the client can quote.
pub fn client_message(e: &Error) -> String {
    told(e).0
}

/// The message a client sees and, for an Internal error, the id it was logged under.
fn told(e: &Error) -> (String, Option<String>) {
    match e {
        Error::Internal(_) => {
            let id = uuid::Uuid::new_v4();
            tracing::error!(error_id = %id, error = %e.chain(), "internal error");
            (
                format!("internal error (error id {id})"),
                Some(id.to_string()),
            )
        }
        Error::Unavailable(_) => {
            tracing::warn!(error = %e.chain(), "unavailable");
            (e.to_string(), None)
        }
        other => (other.to_string(), None),
    }
}

/// The gRPC status of an error, with its details.
pub fn to_status(e: Error) -> Status {
    let (message, error_id) = told(&e);
    let details = details(&e, &message, error_id);
    Status::with_error_details(code(&e), message, details)
}

/// The status of an error that is part of the runtime's normal work (a drain, a stalled client cut off),
/// with its details but nothing logged.
pub fn expected_status(e: &Error) -> Status {
    let message = e.to_string();
    Status::with_error_details(code(e), &message, details(e, &message, None))
}

/// The `google.rpc` details of an error whose client message is `message`.
fn details(e: &Error, message: &str, error_id: Option<String>) -> ErrorDetails {
    let reason = e.reason();
    let mut metadata: HashMap<String, String> = e
        .resources()
        .iter()
        .map(|r| (r.kind.id_key().to_owned(), r.name.clone()))
        .collect();
    if let Some(id) = error_id {
        metadata.insert(ERROR_ID.to_owned(), id);
    }
    let mut d = ErrorDetails::with_error_info(reason.as_str(), DOMAIN, metadata);
    if let (Error::InvalidArgument(_), Some(field)) = (e, e.field()) {
        d.set_bad_request(vec![FieldViolation {
            reason: reason.as_str().to_owned(),
            ..FieldViolation::new(field, message)
        }]);
    }
    if let Some(delay) = reason.retry_after() {
        d.set_retry_info(Some(delay));
    }
    if let Some(r) = e.resources().first() {
        d.set_resource_info(r.kind.type_name(), &r.name, "", message);
    }
    d
}

/// The reason a status names in its ErrorInfo, when it is one of ours (an executor's status names its
/// reason the same way).
pub fn reason_of(s: &Status) -> Option<Reason> {
    Reason::from_name(&mentis_proto::error_reason(s, DOMAIN)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mentis_core::{Resource, SandboxId};
    use std::time::Duration;

    #[test]
    fn internal_details_stay_in_the_log() {
        let s = to_status(Error::internal("secret path /x/y"));
        assert_eq!(s.code(), Code::Internal);
        assert!(!s.message().contains("secret"));
        let d = s.get_error_details();
        let info = d.error_info().expect("ErrorInfo");
        assert_eq!(info.reason, "INTERNAL");
        // The id the message quotes is in the metadata, for a program to report.
        let id = &info.metadata[ERROR_ID];
        assert!(s.message().contains(id.as_str()), "{}", s.message());
        assert!(d.retry_info().is_none() && d.resource_info().is_none());
        let s = to_status(Error::sandbox_not_found("x"));
        assert_eq!(
            (s.code(), s.message()),
            (Code::NotFound, "sandbox x not found")
        );
    }

    #[test]
    fn an_unknown_sandbox_names_the_reason_the_domain_and_the_resource() {
        let id = SandboxId::new();
        let s = to_status(Error::sandbox_not_found(id));
        assert_eq!(s.code(), Code::NotFound);
        let d = s.get_error_details();
        let info = d.error_info().expect("ErrorInfo");
        assert_eq!(
            (info.reason.as_str(), info.domain.as_str()),
            ("SANDBOX_NOT_FOUND", "mentis.dev")
        );
        assert_eq!(
            info.metadata,
            HashMap::from([("sandbox_id".to_owned(), id.to_string())])
        );
        let r = d.resource_info().expect("ResourceInfo");
        assert_eq!(
            (r.resource_type.as_str(), r.resource_name.as_str()),
            ("sandbox", id.to_string().as_str())
        );
        assert_eq!(r.description, s.message());
        assert!(d.bad_request().is_none() && d.retry_info().is_none());
        assert_eq!(reason_of(&s), Some(Reason::SandboxNotFound));
    }

    #[test]
    fn an_invalid_field_is_a_field_violation() {
        let e = Error::invalid("memory_limit_mb -1 is out of range")
            .at("memory_limit_mb")
            .within("spec")
            .with_reason(Reason::InvalidSpec);
        let s = to_status(e);
        assert_eq!(s.code(), Code::InvalidArgument);
        let d = s.get_error_details();
        assert_eq!(d.error_info().expect("ErrorInfo").reason, "INVALID_SPEC");
        let v = &d.bad_request().expect("BadRequest").field_violations;
        assert_eq!(v.len(), 1);
        assert_eq!(
            (
                v[0].field.as_str(),
                v[0].description.as_str(),
                v[0].reason.as_str()
            ),
            (
                "spec.memory_limit_mb",
                "memory_limit_mb -1 is out of range",
                "INVALID_SPEC"
            )
        );
        // No field known: no BadRequest, the reason all the same.
        let d = to_status(Error::invalid("bad")).get_error_details();
        assert!(d.bad_request().is_none());
        assert_eq!(
            d.error_info().expect("ErrorInfo").reason,
            "INVALID_ARGUMENT"
        );
    }

    #[test]
    fn waits_a_retry_can_end_say_how_long() {
        let retry = |e: Error| {
            let s = to_status(e);
            assert!(
                matches!(s.code(), Code::ResourceExhausted | Code::Unavailable),
                "{s:?}"
            );
            s.get_error_details()
                .retry_info()
                .and_then(|r| r.retry_delay)
        };
        assert_eq!(
            retry(Error::new(Reason::TooManyActions, "busy").about(Resource::sandbox("s"))),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            retry(Error::new(Reason::SpaceQuotaExceeded, "full")),
            Some(Duration::from_secs(10))
        );
        assert_eq!(
            retry(Error::new(Reason::ShuttingDown, "bye")),
            Some(Duration::from_secs(5))
        );
        // Untouched sites get their code's generic reason, and its delay.
        assert_eq!(
            retry(Error::unavailable("down")),
            Some(Duration::from_secs(1))
        );
        // Retrying a write over the cap cannot help.
        assert_eq!(retry(Error::new(Reason::FileTooLarge, "big")), None);
        // Other codes never carry one.
        let d = to_status(Error::new(Reason::SandboxPaused, "paused")).get_error_details();
        assert!(d.retry_info().is_none());
    }

    #[test]
    fn the_details_travel_in_the_trailers() {
        let s = to_status(Error::new(Reason::ActionIdReused, "taken").about(Resource::action("a")));
        // As the auth layer sends a refusal: a trailers-only HTTP response.
        let http = s.into_http::<()>();
        let back = Status::from_header_map(http.headers()).expect("a status");
        assert_eq!(reason_of(&back), Some(Reason::ActionIdReused));
        assert_eq!(
            back.get_error_details()
                .resource_info()
                .map(|r| r.resource_name.clone()),
            Some("a".to_owned())
        );
    }
}
