//! Actions: what a client asks a sandbox to run, validated before anything is forwarded to an executor.

use std::collections::BTreeMap;
use std::time::Duration;

use bytes::Bytes;

use crate::error::Error;
use crate::sandbox::validate_env;

/// Default action timeout when the client gives none (DESIGN.md section 5).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest timeout a client may ask for.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// Largest shell command or IPython cell we accept.
pub const MAX_CODE_BYTES: usize = 4 * 1024 * 1024;
/// Largest initial stdin we accept inline (bigger inputs belong in a file).
pub const MAX_INLINE_STDIN: usize = 4 * 1024 * 1024;

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
        let mut h = std::collections::hash_map::DefaultHasher::new();
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
}

/// `/bin/bash -c command` in the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ShellAction {
    pub command: String,
    /// Empty = the workspace root.
    pub work_dir: String,
    pub env: BTreeMap<String, String>,
    pub timeout: Duration,
    pub stdin: Bytes,
    pub keep_stdin_open: bool,
}

/// A cell for the sandbox's Jupyter kernel.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IPythonAction {
    pub code: String,
    pub timeout: Duration,
    /// Remove the names a failing cell created.
    pub rollback_on_error: bool,
}

/// Turns a client's timeout (0 = default) into a duration, rejecting absurd ones.
pub fn resolve_timeout(seconds: u32) -> Result<Duration, Error> {
    if seconds == 0 {
        return Ok(DEFAULT_TIMEOUT);
    }
    let t = Duration::from_secs(u64::from(seconds));
    if t > MAX_TIMEOUT {
        return Err(Error::invalid(format!(
            "timeout_seconds {seconds} is above the maximum of {}",
            MAX_TIMEOUT.as_secs()
        )));
    }
    Ok(t)
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
    ) -> Result<Self, Error> {
        if command.trim().is_empty() {
            return Err(Error::invalid("shell.command is empty"));
        }
        if command.len() > MAX_CODE_BYTES {
            return Err(Error::invalid(format!(
                "shell.command is larger than {MAX_CODE_BYTES} bytes"
            )));
        }
        if command.contains('\0') || work_dir.contains('\0') {
            return Err(Error::invalid(
                "shell.command and shell.work_dir may not contain NUL",
            ));
        }
        if stdin.len() > MAX_INLINE_STDIN {
            return Err(Error::invalid(format!(
                "shell.stdin is larger than {MAX_INLINE_STDIN} bytes; write big inputs to a file"
            )));
        }
        validate_env(&env, "shell.env")?;
        Ok(Self {
            command,
            work_dir,
            env,
            timeout: resolve_timeout(timeout_seconds)?,
            stdin,
            keep_stdin_open,
        })
    }
}

impl IPythonAction {
    /// Validates a cell as a client sent it.
    pub fn validate(
        code: String,
        timeout_seconds: u32,
        rollback_on_error: bool,
    ) -> Result<Self, Error> {
        if code.trim().is_empty() {
            return Err(Error::invalid("ipython.code is empty"));
        }
        if code.len() > MAX_CODE_BYTES {
            return Err(Error::invalid(format!(
                "ipython.code is larger than {MAX_CODE_BYTES} bytes"
            )));
        }
        Ok(Self {
            code,
            timeout: resolve_timeout(timeout_seconds)?,
            rollback_on_error,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shell(cmd: &str, timeout: u32) -> Result<ShellAction, Error> {
        ShellAction::validate(
            cmd.into(),
            String::new(),
            BTreeMap::new(),
            timeout,
            Bytes::new(),
            false,
        )
    }

    #[test]
    fn shell_validation() {
        assert!(matches!(shell("", 0), Err(Error::InvalidArgument(_))));
        assert!(matches!(shell("   \n", 0), Err(Error::InvalidArgument(_))));
        assert_eq!(shell("true", 0).map(|a| a.timeout), Ok(DEFAULT_TIMEOUT));
        assert_eq!(
            shell("true", 5).map(|a| a.timeout),
            Ok(Duration::from_secs(5))
        );
        assert!(shell("true", u32::MAX).is_err());
        assert!(shell(&"x".repeat(MAX_CODE_BYTES + 1), 0).is_err());
    }

    #[test]
    fn ipython_validation() {
        assert!(IPythonAction::validate(String::new(), 0, true).is_err());
        assert!(IPythonAction::validate("1+1".into(), 0, true).is_ok());
    }
}
