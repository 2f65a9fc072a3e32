//! Docker errors, classified into the shared error enum.

use mentis_core::{Error, Reason};

/// Whether the engine answered 404.
pub(crate) fn is_not_found(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404,
            ..
        }
    )
}

/// Classifies a Docker error: transport problems are Unavailable, the rest Internal (with context for the log).
pub(crate) fn to_core(what: &str, e: bollard::errors::Error) -> Error {
    use bollard::errors::Error as B;
    let classified = match &e {
        B::DockerResponseServerError {
            status_code,
            message,
        } if *status_code >= 500 => Error::new(
            Reason::EngineUnavailable,
            format!("Docker failed to {what}: {message}"),
        ),
        B::DockerResponseServerError {
            status_code,
            message,
        } => Error::internal(format!(
            "Docker refused to {what} ({status_code}): {message}"
        )),
        B::RequestTimeoutError => Error::new(
            Reason::EngineUnavailable,
            format!("Docker did not {what} in time"),
        ),
        B::IOError { .. } | B::HyperResponseError { .. } | B::HyperLegacyError { .. } => {
            Error::new(
                Reason::EngineUnavailable,
                format!("cannot reach the Docker engine to {what}"),
            )
        }
        _ => Error::internal(format!("failed to {what}")),
    };
    // The engine's error and its causes stay under ours, for the log.
    classified.with_source(e)
}

/// Adds context to a Docker result.
pub(crate) trait DockerCallExt<T> {
    fn docker_ctx(self, what: &str) -> Result<T, Error>;
}

impl<T> DockerCallExt<T> for Result<T, bollard::errors::Error> {
    fn docker_ctx(self, what: &str) -> Result<T, Error> {
        self.map_err(|e| to_core(what, e))
    }
}
