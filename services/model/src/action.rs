//! Actions: what a client asks a sandbox to run (a shell command, an IPython cell), the rules a request
//! must follow and the limits on its size and timeout. The control plane checks them before it forwards an
//! action; the executor checks them again on what it receives, with the same numbers.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;

use crate::env::validate_env;
use crate::error::Error;

/// Timeout of an action whose request says 0 (the proto's "0 = default (300 s)").
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest timeout a client may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Largest shell command or IPython cell, in bytes.
pub const MAX_CODE_BYTES: usize = 4 * 1024 * 1024;
/// Largest initial stdin accepted inline (bigger inputs belong in a file).
pub const MAX_INLINE_STDIN: usize = 4 * 1024 * 1024;
/// Longest action id.
pub const MAX_ACTION_ID_LEN: usize = 128;
/// Room in one request beside the code and the inline stdin: ids, work_dir, the envs and the proto framing.
/// 2 MiB is about as much env as Linux starts a process with (a quarter of the default 8 MiB stack).
pub const REQUEST_ALLOWANCE_BYTES: usize = 2 * 1024 * 1024;
/// Largest request message the gRPC servers decode (the control plane's ActionService, the executor's
/// services): an action with the largest code and inline stdin fits, with [`REQUEST_ALLOWANCE_BYTES`] to
/// spare. gRPC's usual default (4 MiB) would refuse such an action before it could be checked.
pub const MAX_REQUEST_BYTES: usize = MAX_CODE_BYTES + MAX_INLINE_STDIN + REQUEST_ALLOWANCE_BYTES;

/// One unit of work for a sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Action {
    Shell(ShellAction),
    IPython(IPythonAction),
}

impl Action {
    /// A digest of the whole request, to tell a retry of the same submission from a different action that
    /// reuses its id.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::{Hash, Hasher};
        // FNV-1a, not the std hasher: the runtime keeps fingerprints across restarts (and upgrades), so the
        // function must not change between builds.
        struct Fnv(u64);
        impl Hasher for Fnv {
            fn finish(&self) -> u64 {
                self.0
            }
            fn write(&mut self, bytes: &[u8]) {
                for b in bytes {
                    self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
                }
            }
        }
        let mut h = Fnv(0xcbf2_9ce4_8422_2325);
        self.hash(&mut h);
        h.finish()
    }

    /// Short name for logs and metrics.
    pub fn kind_name(&self) -> &'static str {
        match self {
            Self::Shell(_) => "shell",
            Self::IPython(_) => "ipython",
        }
    }

    /// The kind of this action.
    pub fn kind(&self) -> ActionKind {
        ActionKind::from(self)
    }
}

/// The kind of an action, without its payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionKind {
    Shell,
    IPython,
}

impl From<&Action> for ActionKind {
    fn from(a: &Action) -> Self {
        match a {
            Action::Shell(_) => Self::Shell,
            Action::IPython(_) => Self::IPython,
        }
    }
}

/// `/bin/bash -c command` in the sandbox, or the next command of a persistent session's bash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellAction {
    pub command: String,
    /// Empty = the workspace root; relative paths are taken from it.
    pub work_dir: String,
    /// Over the image's and the sandbox's env.
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
    /// Written to stdin first.
    pub stdin: Bytes,
    /// Keep stdin open after `stdin`, for later writes, until one says eof.
    pub keep_stdin_open: bool,
    /// The persistent session to run in (its bash keeps cwd, env and variables); None = a fresh bash.
    pub session: Option<String>,
}

/// Longest session name.
pub const MAX_SESSION_NAME_LEN: usize = 64;

/// As derived, field by field, with the session only when there is one: fingerprints of actions without
/// a session are what they were before sessions existed (the runtime keeps them across upgrades).
impl std::hash::Hash for ShellAction {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.command.hash(state);
        self.work_dir.hash(state);
        self.env.hash(state);
        self.timeout.hash(state);
        self.stdin.hash(state);
        self.keep_stdin_open.hash(state);
        if let Some(session) = &self.session {
            session.hash(state);
        }
    }
}

/// A cell for the sandbox's Jupyter kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IPythonAction {
    pub code: String,
    pub timeout: Duration,
    /// Remove the names a failing cell created.
    pub rollback_on_error: bool,
}

/// Turns a client's timeout (0 = default) into a duration, rejecting absurd ones (`field` names it).
pub fn resolve_timeout(seconds: u32, field: &str) -> Result<Duration, Error> {
    if seconds == 0 {
        return Ok(DEFAULT_TIMEOUT);
    }
    let t = Duration::from_secs(u64::from(seconds));
    if t > MAX_TIMEOUT {
        return Err(Error::invalid(
            field,
            format!(
                "timeout_seconds {seconds} is above the maximum of {}",
                MAX_TIMEOUT.as_secs()
            ),
        ));
    }
    Ok(t)
}

/// Checks an action id: 1 to [`MAX_ACTION_ID_LEN`] printable ASCII characters without spaces, so it is safe
/// in logs, labels and metadata (a UUID is recommended).
pub fn validate_action_id(s: &str) -> Result<(), Error> {
    if s.is_empty() {
        return Err(Error::invalid("action_id", "action_id is empty"));
    }
    if s.len() > MAX_ACTION_ID_LEN {
        return Err(Error::invalid(
            "action_id",
            format!("action_id is longer than {MAX_ACTION_ID_LEN} characters"),
        ));
    }
    if !s.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(Error::invalid(
            "action_id",
            "action_id may contain only printable ASCII characters without spaces",
        ));
    }
    Ok(())
}

/// Refuses code (a command, a cell) above [`MAX_CODE_BYTES`].
fn check_code_size(field: &str, code: &str) -> Result<(), Error> {
    if code.len() > MAX_CODE_BYTES {
        return Err(Error::invalid(
            field,
            format!(
                "{field} is {} bytes; the limit is {MAX_CODE_BYTES} (write large data to a file instead)",
                code.len()
            ),
        ));
    }
    Ok(())
}

impl ShellAction {
    /// Validates a shell action as a client sent it.
    pub fn validate(
        command: String,
        work_dir: String,
        env: BTreeMap<String, String>,
        timeout_seconds: u32,
        stdin: Bytes,
        keep_stdin_open: bool,
        session: String,
    ) -> Result<Self, Error> {
        if command.trim().is_empty() {
            return Err(Error::invalid("shell.command", "shell.command is empty"));
        }
        check_code_size("shell.command", &command)?;
        // A NUL cannot cross execve; say so now rather than report a confusing spawn failure.
        if command.contains('\0') || work_dir.contains('\0') {
            let field = if command.contains('\0') {
                "shell.command"
            } else {
                "shell.work_dir"
            };
            return Err(Error::invalid(
                field,
                "shell.command and shell.work_dir may not contain NUL",
            ));
        }
        if stdin.len() > MAX_INLINE_STDIN {
            return Err(Error::invalid(
                "shell.stdin",
                format!(
                    "shell.stdin is {} bytes; the limit is {MAX_INLINE_STDIN} (write big inputs to a file)",
                    stdin.len()
                ),
            ));
        }
        validate_env(&env, "shell.env")?;
        let session = if session.is_empty() {
            None
        } else {
            validate_session(&session)?;
            if !stdin.is_empty() || keep_stdin_open {
                return Err(Error::invalid(
                    "shell.stdin",
                    "a command in a session reads no stdin (stdin and keep_stdin_open need a command of its own)",
                ));
            }
            Some(session)
        };
        Ok(Self {
            command,
            work_dir,
            env,
            timeout: resolve_timeout(timeout_seconds, "shell.timeout_seconds")?,
            stdin,
            keep_stdin_open,
            session,
        })
    }
}

/// A session name: 1 to [`MAX_SESSION_NAME_LEN`] letters, digits, `.`, `_` or `-`.
fn validate_session(name: &str) -> Result<(), Error> {
    if name.len() > MAX_SESSION_NAME_LEN
        || !name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    {
        return Err(Error::invalid(
            "shell.session",
            format!(
                "shell.session {} is not a session name (1 to {MAX_SESSION_NAME_LEN} letters, digits, '.', '_' or '-')",
                crate::quote::quoted(name)
            ),
        ));
    }
    Ok(())
}

impl IPythonAction {
    /// Validates a cell as a client sent it.
    pub fn validate(
        code: String,
        timeout_seconds: u32,
        rollback_on_error: bool,
    ) -> Result<Self, Error> {
        if code.trim().is_empty() {
            return Err(Error::invalid("ipython.code", "ipython.code is empty"));
        }
        check_code_size("ipython.code", &code)?;
        Ok(Self {
            code,
            timeout: resolve_timeout(timeout_seconds, "ipython.timeout_seconds")?,
            rollback_on_error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::{MAX_ENV_NAME_LEN, MAX_ENV_VALUE_BYTES};

    fn shell(cmd: &str, timeout: u32) -> Result<ShellAction, Error> {
        ShellAction::validate(
            cmd.into(),
            String::new(),
            BTreeMap::new(),
            timeout,
            Bytes::new(),
            false,
            String::new(),
        )
    }

    #[test]
    fn shell_validation() {
        assert!(
            matches!(shell("", 0), Err(Error::InvalidArgument { field, .. }) if field == "shell.command")
        );
        assert!(matches!(
            shell("   \n", 0),
            Err(Error::InvalidArgument { .. })
        ));
        assert!(shell("echo \0", 0).is_err());
        assert_eq!(shell("true", 0).map(|a| a.timeout), Ok(DEFAULT_TIMEOUT));
        assert_eq!(
            shell("true", 5).map(|a| a.timeout),
            Ok(Duration::from_secs(5))
        );
        assert_eq!(
            shell("true", u32::MAX).map_err(|e| e.field().to_owned()),
            Err("shell.timeout_seconds".to_owned())
        );
        assert!(shell(&"x".repeat(MAX_CODE_BYTES), 0).is_ok());
        assert!(shell(&"x".repeat(MAX_CODE_BYTES + 1), 0).is_err());
        let stdin = |n: usize| {
            ShellAction::validate(
                "cat".into(),
                String::new(),
                BTreeMap::new(),
                0,
                Bytes::from(vec![b'x'; n]),
                false,
                String::new(),
            )
        };
        assert!(stdin(MAX_INLINE_STDIN).is_ok());
        assert!(stdin(MAX_INLINE_STDIN + 1).is_err());
        let env = |k: &str| {
            ShellAction::validate(
                "true".into(),
                String::new(),
                [(k.to_owned(), "v".to_owned())].into(),
                0,
                Bytes::new(),
                false,
                String::new(),
            )
        };
        assert!(env("A").is_ok());
        assert!(env("A=B").is_err());
    }

    #[test]
    fn ipython_validation() {
        assert!(IPythonAction::validate(String::new(), 0, true).is_err());
        assert!(IPythonAction::validate("1+1".into(), 0, true).is_ok());
        let too_big = IPythonAction::validate("x".repeat(MAX_CODE_BYTES + 1), 0, true);
        assert!(
            matches!(&too_big, Err(e) if e.to_string().contains("limit") && e.field() == "ipython.code"),
            "{too_big:?}"
        );
    }

    #[test]
    fn action_id_rules() {
        assert!(validate_action_id("a-b_c.1").is_ok());
        assert!(validate_action_id(&"x".repeat(MAX_ACTION_ID_LEN)).is_ok());
        for bad in ["", "has space", "a\nb", "é"] {
            assert!(validate_action_id(bad).is_err(), "{bad:?}");
        }
        assert!(validate_action_id(&"x".repeat(MAX_ACTION_ID_LEN + 1)).is_err());
    }

    #[test]
    fn the_request_cap_admits_the_largest_action() {
        // The largest code and inline stdin together, with room for the rest of the request: a proto
        // message adds a few bytes of framing per field, and an env entry at its largest must fit too.
        let largest = MAX_CODE_BYTES + MAX_INLINE_STDIN;
        assert!(MAX_REQUEST_BYTES > largest);
        let spare = MAX_REQUEST_BYTES - largest;
        assert!(spare >= 1024 * 1024, "{spare}");
        assert!(spare > MAX_ENV_NAME_LEN + MAX_ENV_VALUE_BYTES + MAX_ACTION_ID_LEN + 1024);
        assert!(MAX_TIMEOUT > DEFAULT_TIMEOUT);
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn sessions_are_named_take_no_stdin_and_leave_old_fingerprints_alone() {
        let in_session = |name: &str, stdin: &'static [u8]| {
            ShellAction::validate(
                "cd /tmp".into(),
                String::new(),
                BTreeMap::new(),
                0,
                Bytes::from_static(stdin),
                false,
                name.into(),
            )
        };
        assert_eq!(
            in_session("work-1.a_b", b"").unwrap().session.as_deref(),
            Some("work-1.a_b")
        );
        assert_eq!(in_session("", b"").unwrap().session, None);
        for bad in ["a b", "a/b", &"x".repeat(65)] {
            assert_eq!(
                in_session(bad, b"").unwrap_err().field(),
                "shell.session",
                "{bad:?}"
            );
        }
        assert_eq!(in_session("s", b"x").unwrap_err().field(), "shell.stdin");
        // The fingerprint of an action without a session is the one the derived Hash gave before sessions
        // existed (stored fingerprints stay valid across the upgrade).
        let plain = Action::Shell(shell("echo hi", 0).unwrap());
        assert_eq!(plain.fingerprint(), 0xbef3_a59b_56b0_8eb2);
        let mut named = shell("echo hi", 0).unwrap();
        named.session = Some("s".into());
        assert_ne!(Action::Shell(named).fingerprint(), plain.fingerprint());
    }
}
