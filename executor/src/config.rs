//! Executor configuration: read once from the environment into a typed, validated struct.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::error::Error;

/// Address the gRPC server listens on.
pub const LISTEN_ENV: &str = "MENTIS_EXECUTOR_LISTEN";
/// The per-sandbox bearer token the control plane presents (required).
pub const TOKEN_ENV: &str = "MENTIS_EXECUTOR_TOKEN";
/// Root of the sandbox's workspace volume.
pub const WORKSPACE_ENV: &str = "MENTIS_WORKSPACE";
/// The egress gateway's CA (PEM) for a sandbox with EGRESS_RULES: `launch` adds it to the trust store.
pub const EGRESS_CA_ENV: &str = "MENTIS_EGRESS_CA";
/// Where `launch` writes that CA (`ca.pem`) and the image's trust store with it (`bundle.pem`).
pub const EGRESS_CA_DIR: &str = "/tmp/.mentis-ca";
/// Upper bound on actions running at the same time.
pub const MAX_ACTIONS_ENV: &str = "MENTIS_EXECUTOR_MAX_ACTIONS";
/// The python that runs the Jupyter kernel (`python -m ipykernel_launcher`).
pub const KERNEL_PYTHON_ENV: &str = "MENTIS_KERNEL_PYTHON";
/// `1` starts the kernel when the executor starts instead of at the first cell.
pub const KERNEL_EAGER_ENV: &str = "MENTIS_KERNEL_EAGER";

/// `1` keeps this executor's trace spans for the runtime to relay (`TakeSpans`); the runtime sets it when
/// it exports traces.
pub const TRACES_ENV: &str = "MENTIS_EXECUTOR_TRACES";
/// Spans an executor keeps for the runtime at most (the oldest go first).
pub const SPAN_BUFFER: usize = 4096;

/// Most bytes one WriteFile or Upload may write.
pub const MAX_WRITE_BYTES_ENV: &str = "MENTIS_EXECUTOR_MAX_WRITE_BYTES";

/// Default listen address: every interface, because the control plane reaches us over the sandbox network.
pub const DEFAULT_LISTEN: &str = "0.0.0.0:50052";
/// Default workspace root, where the sandbox's volume is mounted.
pub const DEFAULT_WORKSPACE: &str = "/workspace";
/// Default bound on concurrently running actions.
pub const DEFAULT_MAX_ACTIONS: usize = 64;
/// Default kernel python: the image's `python3`, found on PATH.
pub const DEFAULT_KERNEL_PYTHON: &str = "python3";
/// Default cap on the bytes one WriteFile or Upload may write: 1 GiB.
pub const DEFAULT_MAX_WRITE_BYTES: u64 = 1 << 30;
/// Cells waiting for the kernel beyond this many are refused with ResourceExhausted.
pub const DEFAULT_KERNEL_QUEUE: usize = 256;

/// How the executor runs its Jupyter kernel.
#[derive(Debug, Clone)]
pub struct KernelConfig {
    /// Program run as `PYTHON -m ipykernel_launcher -f CONNECTION_FILE`.
    pub python: PathBuf,
    /// Start the kernel with the executor rather than at the first cell.
    pub eager: bool,
    /// Bound on cells waiting for their turn.
    pub queue_limit: usize,
    /// How long a starting kernel may take to answer before it is killed.
    pub start_timeout: Duration,
    /// After an interrupt (timeout, cancel), how long the kernel may take to finish the cell before it is
    /// killed and replaced (a cell blocked in C code may ignore SIGINT).
    pub interrupt_grace: Duration,
    /// How long InspectVariables waits for its turn between cells.
    pub inspect_wait: Duration,
}

impl Default for KernelConfig {
    fn default() -> Self {
        Self {
            python: PathBuf::from(DEFAULT_KERNEL_PYTHON),
            eager: false,
            queue_limit: DEFAULT_KERNEL_QUEUE,
            start_timeout: Duration::from_secs(60),
            interrupt_grace: Duration::from_secs(5),
            inspect_wait: Duration::from_secs(30),
        }
    }
}

/// The executor's settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where `main` binds the gRPC server (`serve` takes an already bound listener).
    pub listen: SocketAddr,
    /// Bearer token every ExecutorService call must carry.
    pub token: Token,
    /// Workspace root: empty and relative `work_dir`s are resolved against it.
    pub workspace: PathBuf,
    /// Running actions beyond this many are refused with ResourceExhausted.
    pub max_actions: usize,
    /// The Jupyter kernel that runs IPython cells.
    pub kernel: KernelConfig,
    /// A WriteFile or Upload that would write more than this many bytes is refused (ResourceExhausted)
    /// and leaves nothing behind.
    pub max_write_bytes: u64,
    /// Whether, at the pids limit, the executor may kill every process but PID 1, itself and the kernel
    /// when killing what ended actions left was not enough (`reclaim`). Only where every other process is
    /// user code: `main` sets it when the executor is its container's service (started by `launch`, a
    /// child of tini as PID 1). Off by default, so an executor served in-process by tests never kills its
    /// host's processes.
    pub reclaim_all: bool,
    /// Where this executor's finished spans wait for the runtime (`TakeSpans`); None when traces are off.
    /// `main` sets it when [`TRACES_ENV`] is 1, with the tracer provider that fills it.
    pub spans: Option<mentis_telemetry::SpanBuffer>,
    /// Whether [`TRACES_ENV`] asks for traces.
    pub traces: bool,
}

impl Config {
    /// A config with defaults for everything but the two things that have none in tests.
    pub fn new(token: Token, workspace: impl Into<PathBuf>) -> Self {
        Self {
            // The default is a valid literal; parse cannot fail, but avoid unwrap all the same.
            listen: DEFAULT_LISTEN
                .parse()
                .unwrap_or(SocketAddr::from(([0, 0, 0, 0], 50052))),
            token,
            workspace: workspace.into(),
            max_actions: DEFAULT_MAX_ACTIONS,
            kernel: KernelConfig::default(),
            max_write_bytes: DEFAULT_MAX_WRITE_BYTES,
            reclaim_all: false,
            spans: None,
            traces: false,
        }
    }

    /// Reads the process environment. The caller is expected to remove [`TOKEN_ENV`] afterwards.
    pub fn from_env() -> Result<Self, Error> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Reads settings through `lookup` (the environment in production, a map in tests) and validates them.
    pub fn from_lookup(lookup: impl Fn(&str) -> Option<String>) -> Result<Self, Error> {
        let listen_raw = lookup(LISTEN_ENV).unwrap_or_else(|| DEFAULT_LISTEN.to_owned());
        let listen = listen_raw.trim().parse::<SocketAddr>().map_err(|e| {
            Error::Config(format!(
                "{LISTEN_ENV}={listen_raw:?} is not a socket address (like {DEFAULT_LISTEN}): {e}"
            ))
        })?;

        let token = match lookup(TOKEN_ENV) {
            Some(raw) => Token::new(raw).map_err(|e| Error::Config(format!("{TOKEN_ENV}: {e}")))?,
            None => return Err(Error::Config(format!("{TOKEN_ENV} is required"))),
        };

        let workspace =
            PathBuf::from(lookup(WORKSPACE_ENV).unwrap_or_else(|| DEFAULT_WORKSPACE.to_owned()));
        if !workspace.is_absolute() {
            return Err(Error::Config(format!(
                "{WORKSPACE_ENV}={} must be an absolute path",
                workspace.display()
            )));
        }
        // Fail at start rather than have every action fail with FAILED_TO_START later.
        if !workspace.is_dir() {
            return Err(Error::Config(format!(
                "{WORKSPACE_ENV}={} is not an existing directory",
                workspace.display()
            )));
        }

        let max_actions = match lookup(MAX_ACTIONS_ENV) {
            None => DEFAULT_MAX_ACTIONS,
            Some(raw) => match raw.trim().parse::<usize>() {
                Ok(n) if n > 0 => n,
                _ => {
                    return Err(Error::Config(format!(
                        "{MAX_ACTIONS_ENV}={raw:?} must be a positive integer"
                    )));
                }
            },
        };

        let max_write_bytes = match lookup(MAX_WRITE_BYTES_ENV) {
            None => DEFAULT_MAX_WRITE_BYTES,
            Some(raw) => match raw.trim().parse::<u64>() {
                Ok(n) if n > 0 => n,
                _ => {
                    return Err(Error::Config(format!(
                        "{MAX_WRITE_BYTES_ENV}={raw:?} must be a positive number of bytes"
                    )));
                }
            },
        };

        let mut kernel = KernelConfig::default();
        if let Some(raw) = lookup(KERNEL_PYTHON_ENV) {
            if raw.trim().is_empty() || raw.contains('\0') {
                return Err(Error::Config(format!(
                    "{KERNEL_PYTHON_ENV}={raw:?} must name a python (a path or a program on PATH)"
                )));
            }
            kernel.python = PathBuf::from(raw.trim());
        }
        if let Some(raw) = lookup(KERNEL_EAGER_ENV) {
            kernel.eager = match raw.trim() {
                "1" | "true" => true,
                "0" | "false" | "" => false,
                _ => {
                    return Err(Error::Config(format!(
                        "{KERNEL_EAGER_ENV}={raw:?} must be 1 or 0"
                    )));
                }
            };
        }

        let traces = match lookup(TRACES_ENV).as_deref().map(str::trim) {
            None | Some("0" | "false" | "") => false,
            Some("1" | "true") => true,
            Some(raw) => {
                return Err(Error::Config(format!(
                    "{TRACES_ENV}={raw:?} must be 1 or 0"
                )));
            }
        };

        Ok(Self {
            listen,
            token,
            workspace,
            max_actions,
            kernel,
            max_write_bytes,
            reclaim_all: false,
            spans: None,
            traces,
        })
    }
}

/// The bearer token. Its `Debug` never shows the value, so a logged config cannot leak it.
#[derive(Clone)]
pub struct Token(Arc<str>);

impl Token {
    /// Accepts a non-empty token of visible ASCII: it travels in an HTTP/2 header after `Bearer `.
    pub fn new(value: impl Into<String>) -> Result<Self, Error> {
        let value = value.into();
        if value.is_empty() {
            return Err(Error::Config("the token must not be empty".to_owned()));
        }
        if !value.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Error::Config(
                "the token must be visible ASCII without spaces".to_owned(),
            ));
        }
        Ok(Self(value.into()))
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::collections::HashMap;

    fn lookup(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        move |name| map.get(name).cloned()
    }

    fn tmp() -> String {
        std::env::temp_dir().display().to_string()
    }

    #[test]
    fn defaults_apply_when_only_token_and_workspace_are_set() {
        let ws = tmp();
        let config =
            Config::from_lookup(lookup(&[(TOKEN_ENV, "s3cret"), (WORKSPACE_ENV, &ws)])).unwrap();
        assert_eq!(config.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(config.max_actions, DEFAULT_MAX_ACTIONS);
        assert_eq!(config.workspace, PathBuf::from(ws));
        assert_eq!(config.token.as_bytes(), b"s3cret");
        assert_eq!(config.kernel.python, PathBuf::from(DEFAULT_KERNEL_PYTHON));
        assert!(!config.kernel.eager);
        assert_eq!(config.max_write_bytes, DEFAULT_MAX_WRITE_BYTES);
    }

    #[test]
    fn write_cap_is_read_and_validated() {
        let ws = tmp();
        let config = Config::from_lookup(lookup(&[
            (TOKEN_ENV, "t"),
            (WORKSPACE_ENV, &ws),
            (MAX_WRITE_BYTES_ENV, "1024"),
        ]))
        .unwrap();
        assert_eq!(config.max_write_bytes, 1024);
        for bad in ["0", "-1", "1G"] {
            let err = Config::from_lookup(lookup(&[
                (TOKEN_ENV, "t"),
                (WORKSPACE_ENV, &ws),
                (MAX_WRITE_BYTES_ENV, bad),
            ]))
            .unwrap_err();
            assert!(err.to_string().contains(MAX_WRITE_BYTES_ENV), "{err}");
        }
    }

    #[test]
    fn kernel_settings_are_read() {
        let ws = tmp();
        let config = Config::from_lookup(lookup(&[
            (TOKEN_ENV, "t"),
            (WORKSPACE_ENV, &ws),
            (KERNEL_PYTHON_ENV, "/opt/py/bin/python"),
            (KERNEL_EAGER_ENV, "1"),
        ]))
        .unwrap();
        assert_eq!(config.kernel.python, PathBuf::from("/opt/py/bin/python"));
        assert!(config.kernel.eager);
    }

    #[test]
    fn token_is_required_and_non_empty() {
        let ws = tmp();
        let err = Config::from_lookup(lookup(&[(WORKSPACE_ENV, &ws)])).unwrap_err();
        assert!(err.to_string().contains(TOKEN_ENV), "{err}");
        let err =
            Config::from_lookup(lookup(&[(TOKEN_ENV, ""), (WORKSPACE_ENV, &ws)])).unwrap_err();
        assert!(err.to_string().contains("empty"), "{err}");
        let err =
            Config::from_lookup(lookup(&[(TOKEN_ENV, "a b"), (WORKSPACE_ENV, &ws)])).unwrap_err();
        assert!(err.to_string().contains(TOKEN_ENV), "{err}");
    }

    #[test]
    fn bad_values_are_rejected_with_the_variable_name() {
        let ws = tmp();
        let cases = [
            (LISTEN_ENV, "not-an-address"),
            (WORKSPACE_ENV, "relative/dir"),
            (WORKSPACE_ENV, "/definitely/not/here/mentis"),
            (MAX_ACTIONS_ENV, "0"),
            (MAX_ACTIONS_ENV, "many"),
            (KERNEL_PYTHON_ENV, " "),
            (KERNEL_EAGER_ENV, "yes"),
        ];
        for (name, value) in cases {
            let mut pairs = vec![(TOKEN_ENV, "t"), (WORKSPACE_ENV, ws.as_str())];
            pairs.retain(|(k, _)| *k != name);
            pairs.push((name, value));
            let err = Config::from_lookup(lookup(&pairs)).unwrap_err();
            assert!(err.to_string().contains(name), "{name}={value}: {err}");
        }
    }

    #[test]
    fn debug_never_shows_the_token() {
        let config = Config::new(Token::new("top-secret-value").unwrap(), "/workspace");
        let shown = format!("{config:?}");
        assert!(!shown.contains("top-secret-value"), "{shown}");
        assert!(shown.contains("redacted"));
    }
}
