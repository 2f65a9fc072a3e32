//! The Kubernetes API's errors as the control plane's: a client's mistake never comes back INTERNAL, and
//! what the operator must fix (the runtime's Role) says so.

use mentis_core::{Error, Reason};

/// `e`, from trying to `what` (an infinitive: "create the sandbox's pod").
pub fn to_core(what: &str, e: kube::Error) -> Error {
    match e {
        kube::Error::Api(status) => {
            let message = if status.message.is_empty() {
                status.reason.clone()
            } else {
                status.message.clone()
            };
            match status.code {
                // Forbidden by an admission controller (a RuntimeClass the cluster does not have, a Pod
                // Security level the namespace enforces), not by the runtime's Role: no user "cannot" here.
                403 if !message.contains(" cannot ") => Error::new(
                    Reason::FailedPrecondition,
                    format!("the cluster refused to {what}: {message}"),
                ),
                403 => Error::new(
                    Reason::FailedPrecondition,
                    format!(
                        "the cluster forbids the runtime to {what}: {message} (its service account's Role must \
                         allow it: the Helm chart's backend: kubernetes makes one)"
                    ),
                ),
                404 => Error::new(Reason::NotFound, format!("cannot {what}: {message}")),
                409 => Error::new(Reason::AlreadyExists, format!("cannot {what}: {message}")),
                // An object the API refuses is ours (the shapes are checked against the schema in the
                // tests) or a value a client gave that the cluster reads otherwise (an image name).
                400 | 422 => Error::new(
                    Reason::FailedPrecondition,
                    format!("the cluster refused to {what}: {message}"),
                ),
                // Gone (a watch's resource version too old), throttled, or the API server in trouble.
                410 | 429 | 500..=599 => Error::new(
                    Reason::EngineUnavailable,
                    format!("the Kubernetes API could not {what}: {message}"),
                ),
                code => Error::internal(format!(
                    "cannot {what}: the Kubernetes API answered {code}: {message}"
                )),
            }
        }
        other => Error::new(
            Reason::EngineUnavailable,
            format!("the Kubernetes API is unreachable, so the runtime cannot {what}: {other}"),
        ),
    }
}

/// Whether `e` is the API's 404.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}
