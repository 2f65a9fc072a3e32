//! Generated code for the MentisSandbox protos, one schema per role: the public `mentis.v1` API, the internal
//! `mentis.executor.v1` API spoken between the control plane and each sandbox's executor, and
//! `mentis.journal.v1`, the record of the observation journal on disk.
#![allow(clippy::all, missing_docs, unreachable_pub)]

pub mod mentis {
    pub mod v1 {
        tonic::include_proto!("mentis.v1");
    }
    pub mod executor {
        pub mod v1 {
            tonic::include_proto!("mentis.executor.v1");
        }
    }
    pub mod journal {
        pub mod v1 {
            tonic::include_proto!("mentis.journal.v1");
        }
    }
}

pub use mentis::executor::v1 as executor;
pub use mentis::journal::v1 as journal;
pub use mentis::v1 as api;

/// Encoded FileDescriptorSet of the public `mentis.v1` protos (with their imports), for server reflection.
pub const PUBLIC_FILE_DESCRIPTOR_SET: &[u8] =
    tonic::include_file_descriptor_set!("mentis_v1_descriptor");

/// The reason a status names in its `google.rpc.ErrorInfo`, when that is of `domain`: the one reading of
/// error details, for the runtime's clients of the executor and of its own API alike.
pub fn error_reason(s: &tonic::Status, domain: &str) -> Option<String> {
    use tonic_types::StatusExt;
    let details = s.get_error_details();
    let info = details.error_info()?;
    (info.domain == domain).then(|| info.reason.clone())
}

/// The name of a status code as the gRPC specification spells it (`NOT_FOUND`, ...), for messages people read.
pub fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
