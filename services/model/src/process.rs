//! Rules for signalling a sandbox's processes (ActionService.SignalProcess), shared by the runtime, which
//! checks a request before it goes on, and the executor, which sends the signal.

use crate::error::Error;
use crate::quote::quoted;

/// Signals a client may send to a process, as `kill -l` names them without SIG.
pub const SIGNALS: [&str; 11] = [
    "TERM", "KILL", "INT", "HUP", "QUIT", "USR1", "USR2", "STOP", "CONT", "TSTP", "WINCH",
];

/// The signal a client named (`TERM` or `SIGTERM`, any case; empty is TERM), as its name without SIG.
pub fn signal_name(name: &str) -> Result<&'static str, Error> {
    let upper = name.trim().to_ascii_uppercase();
    if upper.is_empty() {
        return Ok("TERM");
    }
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    SIGNALS.iter().copied().find(|s| *s == bare).ok_or_else(|| {
        Error::invalid(
            "signal",
            format!(
                "signal {} is not one of {}",
                quoted(name),
                SIGNALS.join(", ")
            ),
        )
    })
}

/// A pid a request may name: positive (0 and negative numbers name groups to `kill`, not one process).
pub fn check_pid(pid: i32) -> Result<i32, Error> {
    if pid <= 0 {
        return Err(Error::invalid(
            "pid",
            format!("pid {pid} names no process (a pid is positive)"),
        ));
    }
    Ok(pid)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn signal_names_are_taken_with_or_without_sig_and_in_any_case() {
        assert_eq!(signal_name("").unwrap(), "TERM");
        assert_eq!(signal_name("kill").unwrap(), "KILL");
        assert_eq!(signal_name("SIGSTOP").unwrap(), "STOP");
        assert_eq!(signal_name(" cont ").unwrap(), "CONT");
        assert_eq!(signal_name("SEGV").unwrap_err().field(), "signal");
        assert_eq!(signal_name("9").unwrap_err().field(), "signal");
        assert_eq!(check_pid(0).unwrap_err().field(), "pid");
        assert_eq!(check_pid(-1).unwrap_err().field(), "pid");
        assert_eq!(check_pid(42).unwrap(), 42);
    }
}
