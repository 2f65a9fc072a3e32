//! A sandbox's processes, as the executor reads them from the sandbox's `/proc` (ListProcesses).

use std::time::SystemTime;

pub use mentis_model::process::{SIGNALS, check_pid, signal_name};

/// One process of a sandbox at the moment it was listed.
#[derive(Debug, Clone, PartialEq)]
pub struct ProcessInfo {
    pub pid: i32,
    pub ppid: i32,
    /// Its process group (a shell action's processes are in its CmdStart pid's group).
    pub pgid: i32,
    /// Effective user id, and its name in the sandbox's /etc/passwd (the number when it has none).
    pub uid: u32,
    pub user: String,
    /// argv; empty for a process with none to show.
    pub command: Vec<String>,
    /// The kernel's name for it (comm).
    pub name: String,
    /// One letter, as `ps` shows it (R, S, D, T, Z, ...).
    pub state: String,
    /// CPU time used so far, in seconds.
    pub cpu_seconds: f64,
    /// CPU used over its life, in percent of one CPU.
    pub cpu_percent: f64,
    /// Resident memory, in bytes.
    pub memory_bytes: u64,
    pub start_time: Option<SystemTime>,
    /// "init", "executor", "ipython-kernel", or empty.
    pub role: String,
}
