//! What every backend gives a sandbox, whatever it runs on (docs/ARCHITECTURE.md, "Any image"): where the
//! executor is mounted and how it is started, what its launcher reads from the environment, the port it
//! serves on, and the labels every object of ours carries (Invariants: nothing leaks).

use crate::{SandboxId, SpaceId};

/// Where the executor's files are mounted in every sandbox (read-only).
pub const MOUNT: &str = "/.mentis";

/// The port the executor serves on, in its sandbox.
pub const EXECUTOR_PORT: u16 = 50052;

/// The environment variable that hands the executor its token (the launcher takes it out before any user
/// code runs).
pub const TOKEN_ENV: &str = "MENTIS_EXECUTOR_TOKEN";

/// The environment variable naming the sandbox user (`uid:gid`).
pub const SANDBOX_USER_ENV: &str = "MENTIS_SANDBOX_USER";

pub const LABEL_MANAGED: &str = "io.mentis.managed";
pub const LABEL_SANDBOX_ID: &str = "io.mentis.sandbox-id";
pub const LABEL_SPACE_ID: &str = "io.mentis.space-id";
pub const LABEL_INSTANCE: &str = "io.mentis.instance";
/// On objects made for a warm pool: which sandbox they became is in the store, not in labels.
pub const LABEL_POOL: &str = "io.mentis.pool";
/// On a sandbox's pod: whether it may reach out (`true`, `false`), which network policies select on.
pub const LABEL_EGRESS: &str = "io.mentis.egress";

/// The egress gateway's CA (PEM), given to a sandbox with EGRESS_RULES: its launcher adds it to the trust
/// store (the executor's `launch`).
pub const EGRESS_CA_ENV: &str = "MENTIS_EGRESS_CA";
/// Where the launcher writes the CA (`ca.pem`) and the image's trust store with it (`bundle.pem`).
pub const EGRESS_CA_DIR: &str = "/tmp/.mentis-ca";

/// The env of a sandbox with EGRESS_RULES: the gateway's CA for the launcher, and the variables that point
/// OpenSSL, Python (ssl, requests, httplib2), pip, curl, git, the AWS SDKs, gRPC and Node at the trust store
/// with it.
pub fn egress_ca_env(ca_pem: &str) -> Vec<String> {
    let bundle = format!("{EGRESS_CA_DIR}/bundle.pem");
    let mut env = vec![format!("{EGRESS_CA_ENV}={ca_pem}")];
    for var in [
        "SSL_CERT_FILE",
        "REQUESTS_CA_BUNDLE",
        "CURL_CA_BUNDLE",
        "PIP_CERT",
        "GIT_SSL_CAINFO",
        "AWS_CA_BUNDLE",
        "HTTPLIB2_CA_CERTS",
        "GRPC_DEFAULT_SSL_ROOTS_FILE_PATH",
    ] {
        env.push(format!("{var}={bundle}"));
    }
    env.push(format!("NODE_EXTRA_CA_CERTS={EGRESS_CA_DIR}/ca.pem"));
    env
}

/// The entrypoint of every sandbox: the launcher readies the sandbox and execs tini (PID 1), which starts
/// the executor.
pub fn entrypoint() -> Vec<String> {
    [
        "bin/mentis-executor",
        "launch",
        "--",
        "bin/tini",
        "--",
        "bin/mentis-executor",
    ]
    .iter()
    .map(|part| {
        if part.starts_with("bin/") {
            format!("{MOUNT}/{part}")
        } else {
            (*part).to_owned()
        }
    })
    .collect()
}

/// The labels of a sandbox's objects (`space` is `None` for a warm pool member: bound when it is claimed,
/// in the store, as labels cannot change).
pub fn labels_of(instance: &str, id: SandboxId, space: Option<&SpaceId>) -> Vec<(String, String)> {
    let mut labels = vec![
        (LABEL_MANAGED.to_owned(), "true".to_owned()),
        (LABEL_SANDBOX_ID.to_owned(), id.to_string()),
        (
            LABEL_SPACE_ID.to_owned(),
            space.map(ToString::to_string).unwrap_or_default(),
        ),
        (LABEL_INSTANCE.to_owned(), instance.to_owned()),
    ];
    if space.is_none() {
        labels.push((LABEL_POOL.to_owned(), "true".to_owned()));
    }
    labels
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entrypoint_runs_the_mounted_executor_under_tini() {
        assert_eq!(
            entrypoint(),
            [
                "/.mentis/bin/mentis-executor",
                "launch",
                "--",
                "/.mentis/bin/tini",
                "--",
                "/.mentis/bin/mentis-executor"
            ]
        );
    }
}
