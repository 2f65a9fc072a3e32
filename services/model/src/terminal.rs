//! Terminals (mentis.v1.TerminalService): what a start, a resize and a signal may ask for. Both binaries
//! check with these, so a client gets the same answer from either.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::env::validate_env;
use crate::error::Error;
use crate::quote::quoted;

/// Size of a terminal that names none.
pub const DEFAULT_COLS: u16 = 80;
pub const DEFAULT_ROWS: u16 = 24;
/// Largest width or height.
pub const MAX_SIZE: u32 = 1000;
/// Most arguments of a terminal's command, and their total size.
pub const MAX_ARGS: usize = 256;
pub const MAX_COMMAND_BYTES: usize = 64 * 1024;
/// Longest idle timeout a start may ask for.
pub const MAX_IDLE_TIMEOUT: Duration = Duration::from_secs(7 * 24 * 3600);
/// Longest terminal id the API takes.
pub const MAX_TERMINAL_ID_LEN: usize = 64;
/// The program of a start that names none: a login bash.
pub const DEFAULT_COMMAND: [&str; 2] = ["/bin/bash", "-l"];
/// Signals a client may send, as `kill -l` names them without SIG.
pub const SIGNALS: [&str; 10] = [
    "INT", "TERM", "KILL", "HUP", "QUIT", "TSTP", "CONT", "USR1", "USR2", "WINCH",
];

/// A terminal's size, in character cells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub cols: u16,
    pub rows: u16,
}

impl Size {
    /// `cols` × `rows` as a client sent them: 0 takes the default, above [`MAX_SIZE`] is refused.
    pub fn validate(cols: u32, rows: u32, field: &str) -> Result<Self, Error> {
        let one = |n: u32, default: u16, name: &str| -> Result<u16, Error> {
            match n {
                0 => Ok(default),
                n if n <= MAX_SIZE => Ok(u16::try_from(n).unwrap_or(default)),
                n => Err(Error::invalid(
                    format!("{field}.{name}"),
                    format!("{field}.{name} is {n}; the most is {MAX_SIZE}"),
                )),
            }
        };
        Ok(Self {
            cols: one(cols, DEFAULT_COLS, "cols")?,
            rows: one(rows, DEFAULT_ROWS, "rows")?,
        })
    }
}

/// What the client of a terminal stream sends: first a start or an attach, then input, resizes and signals.
/// Fields are as the client sent them; [`TerminalSpec::validate`] and [`Size::validate`] check them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalInput {
    Start(TerminalStart),
    Attach { terminal_id: String, after_seq: u64 },
    Input(bytes::Bytes),
    Resize { cols: u32, rows: u32 },
    Signal(String),
}

/// A start as the client sent it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TerminalStart {
    pub command: Vec<String>,
    pub cols: u32,
    pub rows: u32,
    pub env: BTreeMap<String, String>,
    pub work_dir: String,
    pub idle_timeout_seconds: u32,
}

/// What a terminal stream says: its start, its output (numbered), and the program's end, last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TerminalOutput {
    Started {
        terminal_id: String,
        last_seq: u64,
        cols: u32,
        rows: u32,
    },
    Output {
        seq: u64,
        data: bytes::Bytes,
    },
    Exited {
        exit_code: i32,
        signal: i32,
    },
}

/// What the runtime adds to a start: the sandbox's env and its terminal policy.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TerminalSettings {
    /// The sandbox's env, under the terminal's own.
    pub env: BTreeMap<String, String>,
    /// A start that would make more running terminals than this is refused.
    pub max_terminals: u32,
    /// The idle timeout of a start that names none.
    pub default_idle_timeout: Duration,
    /// Output kept for re-attaching clients, per terminal.
    pub scrollback_bytes: u64,
}

/// One terminal of a sandbox, as ListTerminals describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalInfo {
    pub terminal_id: String,
    pub command: Vec<String>,
    pub cols: u32,
    pub rows: u32,
    pub pid: i32,
    pub created_at: Option<std::time::SystemTime>,
    pub last_seq: u64,
    /// Streams attached now.
    pub attached: u32,
    /// Set once the program ended.
    pub exit_code: Option<i32>,
}

/// A checked terminal start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TerminalSpec {
    /// argv; never empty.
    pub command: Vec<String>,
    pub size: Size,
    pub env: BTreeMap<String, String>,
    pub work_dir: String,
    /// None: the server's default.
    pub idle_timeout: Option<Duration>,
}

impl TerminalSpec {
    /// Checks a start as a client sent it (fields under `start.`).
    pub fn validate(
        command: Vec<String>,
        cols: u32,
        rows: u32,
        env: BTreeMap<String, String>,
        work_dir: String,
        idle_timeout_seconds: u32,
    ) -> Result<Self, Error> {
        let command = if command.is_empty() {
            DEFAULT_COMMAND.iter().map(|s| (*s).to_owned()).collect()
        } else {
            command
        };
        if command.len() > MAX_ARGS {
            return Err(Error::invalid(
                "start.command",
                format!(
                    "start.command has {} arguments; the most is {MAX_ARGS}",
                    command.len()
                ),
            ));
        }
        let bytes: usize = command.iter().map(String::len).sum();
        if bytes > MAX_COMMAND_BYTES {
            return Err(Error::invalid(
                "start.command",
                format!("start.command is {bytes} bytes; the limit is {MAX_COMMAND_BYTES}"),
            ));
        }
        if command[0].is_empty() {
            return Err(Error::invalid(
                "start.command",
                "start.command names no program (its first argument is empty)",
            ));
        }
        if command.iter().any(|a| a.contains('\0')) || work_dir.contains('\0') {
            let field = if work_dir.contains('\0') {
                "start.work_dir"
            } else {
                "start.command"
            };
            return Err(Error::invalid(
                field,
                "start.command and start.work_dir may not contain NUL",
            ));
        }
        if work_dir.len() > 4096 {
            return Err(Error::invalid(
                "start.work_dir",
                "start.work_dir is longer than PATH_MAX (4096 bytes)",
            ));
        }
        validate_env(&env, "start.env")?;
        let idle_timeout = match idle_timeout_seconds {
            0 => None,
            s => {
                let t = Duration::from_secs(u64::from(s));
                if t > MAX_IDLE_TIMEOUT {
                    return Err(Error::invalid(
                        "start.idle_timeout_seconds",
                        format!(
                            "start.idle_timeout_seconds is {s}; the most is {}",
                            MAX_IDLE_TIMEOUT.as_secs()
                        ),
                    ));
                }
                Some(t)
            }
        };
        Ok(Self {
            command,
            size: Size::validate(cols, rows, "start")?,
            env,
            work_dir,
            idle_timeout,
        })
    }
}

/// Checks a terminal id as a client sent it (`field` names it).
pub fn validate_terminal_id(id: &str, field: &str) -> Result<(), Error> {
    if id.is_empty() {
        return Err(Error::invalid(field, format!("{field} is empty")));
    }
    if id.len() > MAX_TERMINAL_ID_LEN
        || !id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Err(Error::invalid(
            field,
            format!("{field} {} is not a terminal id", quoted(id)),
        ));
    }
    Ok(())
}

/// The signal a client named (`INT` or `SIGINT`, any case), as its name without SIG.
pub fn signal_name(name: &str) -> Result<&'static str, Error> {
    let upper = name.trim().to_ascii_uppercase();
    let bare = upper.strip_prefix("SIG").unwrap_or(&upper);
    SIGNALS.iter().copied().find(|s| *s == bare).ok_or_else(|| {
        Error::invalid(
            "signal.name",
            format!(
                "signal.name {} is not one of {}",
                quoted(name),
                SIGNALS.join(", ")
            ),
        )
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn start(command: &[&str], cols: u32, rows: u32) -> Result<TerminalSpec, Error> {
        TerminalSpec::validate(
            command.iter().map(|s| (*s).to_owned()).collect(),
            cols,
            rows,
            BTreeMap::new(),
            String::new(),
            0,
        )
    }

    #[test]
    fn a_start_takes_defaults_and_refuses_what_cannot_run() {
        let spec = start(&[], 0, 0).unwrap();
        assert_eq!(spec.command, ["/bin/bash", "-l"]);
        assert_eq!(spec.size, Size { cols: 80, rows: 24 });
        assert_eq!(spec.idle_timeout, None);
        assert_eq!(start(&["top"], 120, 40).unwrap().size.cols, 120);
        assert_eq!(start(&["top"], 1001, 40).unwrap_err().field(), "start.cols");
        assert_eq!(start(&["top"], 10, 5000).unwrap_err().field(), "start.rows");
        assert_eq!(start(&[""], 0, 0).unwrap_err().field(), "start.command");
        assert_eq!(start(&["a\0b"], 0, 0).unwrap_err().field(), "start.command");
        let many: Vec<&str> = vec!["x"; MAX_ARGS + 1];
        assert_eq!(start(&many, 0, 0).unwrap_err().field(), "start.command");
        let idle = TerminalSpec::validate(vec![], 0, 0, BTreeMap::new(), String::new(), u32::MAX);
        assert_eq!(idle.unwrap_err().field(), "start.idle_timeout_seconds");
        let env = BTreeMap::from([("A=B".to_owned(), "1".to_owned())]);
        let bad_env = TerminalSpec::validate(vec![], 0, 0, env, String::new(), 0);
        assert_eq!(bad_env.unwrap_err().field(), "start.env");
    }

    #[test]
    fn ids_and_signals() {
        assert!(validate_terminal_id("term-0123abcd", "terminal_id").is_ok());
        for bad in ["", "a/b", "x y", &"x".repeat(65)] {
            assert!(validate_terminal_id(bad, "terminal_id").is_err(), "{bad:?}");
        }
        assert_eq!(signal_name("SIGINT").unwrap(), "INT");
        assert_eq!(signal_name("int").unwrap(), "INT");
        assert_eq!(signal_name("Winch").unwrap(), "WINCH");
        assert!(signal_name("SEGV").is_err());
        assert!(signal_name("").is_err());
    }
}
