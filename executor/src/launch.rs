//! `mentis-executor launch -- PROGRAM ARGS...`: the container's entrypoint. It moves the token out of the
//! environment into a pipe and execs PROGRAM (tini, which starts the executor) without it.
//!
//! Why: Docker hands the token to the container's first process in its environment, and
//! `/proc/PID/environ` keeps a process's initial environment for its whole life, readable by every process
//! of the same user. The executor hides itself (it is non-dumpable), but tini, PID 1, cannot, so user code
//! could read the token from `/proc/1/environ`. After this exec PID 1's environment no longer holds it: the
//! token waits in a pipe whose descriptor PROGRAM passes down, and the executor drains and closes it at start
//! (`MENTIS_EXECUTOR_TOKEN_FD`). Nothing can read it again: the write end was closed before the exec, so
//! once drained the pipe only gives end-of-file.

use std::io::{Read as _, Write as _};
use std::os::fd::{FromRawFd as _, IntoRawFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::Command;

use nix::fcntl::{FcntlArg, FdFlag, fcntl};

use crate::config::TOKEN_ENV;

/// The descriptor number holding the token, set by `launch` for the executor.
pub const TOKEN_FD_ENV: &str = "MENTIS_EXECUTOR_TOKEN_FD";

/// Execs `program` with `args`, the token moved from the environment into an inherited pipe. Returns only
/// on failure.
pub fn launch(program: &str, args: &[String]) -> std::io::Error {
    let Ok(token) = std::env::var(TOKEN_ENV) else {
        return std::io::Error::other(format!("{TOKEN_ENV} is required"));
    };
    let (reader, mut writer) = match std::io::pipe() {
        Ok(pipe) => pipe,
        Err(e) => return e,
    };
    // A token is far smaller than a pipe's buffer, so this does not block without a reader.
    if let Err(e) = writer.write_all(token.as_bytes()) {
        return e;
    }
    drop(writer);
    let reader = OwnedFd::from(reader);
    // std makes descriptors close-on-exec; this one must survive the exec (and tini's into the executor).
    if let Err(e) = fcntl(&reader, FcntlArg::F_SETFD(FdFlag::empty())) {
        return e.into();
    }
    // Kept open past this function: it is the exec'd program's now.
    let fd = reader.into_raw_fd();
    Command::new(program)
        .args(args)
        .env_remove(TOKEN_ENV)
        .env(TOKEN_FD_ENV, fd.to_string())
        .exec()
}

/// When `launch` started us: reads the token from the descriptor in [`TOKEN_FD_ENV`] and closes it.
/// Call before any thread starts and before anything is spawned.
pub fn take_token_from_fd() -> Result<Option<String>, String> {
    let Ok(raw) = std::env::var(TOKEN_FD_ENV) else {
        return Ok(None);
    };
    let fd: i32 = raw
        .trim()
        .parse()
        .ok()
        .filter(|fd| *fd > 2)
        .ok_or_else(|| format!("{TOKEN_FD_ENV}={raw:?} is not a descriptor number above 2"))?;
    // /proc/self/fd lists exactly the open descriptors (its entries are links: do not follow them).
    if std::fs::symlink_metadata(format!("/proc/self/fd/{fd}")).is_err() {
        return Err(format!("{TOKEN_FD_ENV}={fd}: not an open descriptor"));
    }
    // SAFETY: the descriptor is open (checked above), was made for us by `launch`, and nothing else in this
    // process knows of it, so taking ownership (and closing it when done) cannot close someone else's file.
    #[allow(unsafe_code)]
    let mut pipe = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
    let mut token = String::new();
    pipe.read_to_string(&mut token)
        .map_err(|e| format!("reading the token from descriptor {fd}: {e}"))?;
    Ok(Some(token))
}
