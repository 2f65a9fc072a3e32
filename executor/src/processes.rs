//! The sandbox's processes for ListProcesses and SignalProcess: what `ps` inside the sandbox would show,
//! read from `/proc` (the container's own pid namespace), and signals to one of them without a shell.

use std::collections::HashMap;
use std::path::Path;
use std::str::FromStr as _;

use mentis_proto::executor::ProcessInfo;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::unistd::{Pid, SysconfVar, sysconf};

use crate::error::Error;

/// What a process is to the sandbox (`ProcessInfo.role`).
pub(crate) const INIT: &str = "init";
pub(crate) const EXECUTOR: &str = "executor";
pub(crate) const KERNEL: &str = "ipython-kernel";

/// The pids with a role: PID 1, this executor, and the kernel when one runs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Roles {
    pub(crate) executor: i32,
    pub(crate) kernel: Option<i32>,
}

impl Roles {
    fn of(&self, pid: i32) -> &'static str {
        if pid == 1 {
            INIT
        } else if pid == self.executor {
            EXECUTOR
        } else if Some(pid) == self.kernel {
            KERNEL
        } else {
            ""
        }
    }
}

/// Every process under `proc` (the real `/proc` in production), by pid; one that ends during the scan is
/// simply missing. Blocking: a few small reads per process.
pub(crate) fn list(proc: &Path, roles: Roles) -> Vec<ProcessInfo> {
    let clock = Clock::read(proc);
    let users = users(Path::new("/etc/passwd"));
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    let mut all: Vec<ProcessInfo> = entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let dir = entry.path();
            let stat = std::fs::read_to_string(dir.join("stat")).ok()?;
            let mut info = parse_stat(pid, &stat, &clock)?;
            info.command = std::fs::read(dir.join("cmdline"))
                .map(|raw| {
                    raw.split(|b| *b == 0)
                        .filter(|a| !a.is_empty())
                        .map(|a| String::from_utf8_lossy(a).into_owned())
                        .collect()
                })
                .unwrap_or_default();
            info.uid = std::fs::read_to_string(dir.join("status"))
                .ok()
                .and_then(|s| effective_uid(&s))
                .unwrap_or(u32::MAX);
            info.user = users
                .get(&info.uid)
                .cloned()
                .unwrap_or_else(|| info.uid.to_string());
            info.role = roles.of(pid).to_owned();
            Some(info)
        })
        .collect();
    all.sort_by_key(|p| p.pid);
    all
}

/// Sends the signal named `name` (checked by `mentis_model::process::signal_name`) to `pid`. Not to PID 1
/// or this executor, whose end would end the sandbox's service.
pub(crate) fn signal(pid: i32, name: &str, roles: Roles) -> Result<(), Error> {
    let pid = mentis_model::process::check_pid(pid)?;
    let name = mentis_model::process::signal_name(name)?;
    match roles.of(pid) {
        INIT | EXECUTOR => {
            return Err(Error::FailedPrecondition(format!(
                "process {pid} is the sandbox's {}: it is not signalled (delete or pause the sandbox \
                 instead)",
                roles.of(pid)
            )));
        }
        _ => {}
    }
    let signal = Signal::from_str(&format!("SIG{name}"))
        .map_err(|_| Error::InvalidArgument(format!("signal {name} is not known here")))?;
    match kill(Pid::from_raw(pid), signal) {
        Ok(()) => Ok(()),
        Err(Errno::ESRCH) => Err(Error::ProcessNotFound(pid)),
        Err(Errno::EPERM) => Err(Error::FailedPrecondition(format!(
            "process {pid} belongs to another user, whom the executor may not signal"
        ))),
        Err(e) => Err(Error::Io {
            context: format!("signalling process {pid}"),
            source: std::io::Error::from(e),
        }),
    }
}

/// The clock `/proc/PID/stat` counts in, and where "now" is on it.
struct Clock {
    /// Clock ticks per second (USER_HZ).
    ticks: f64,
    page_size: u64,
    /// Seconds since boot, now.
    uptime: f64,
    /// Now, seconds since the Unix epoch (read with `uptime`).
    now: f64,
}

impl Clock {
    fn read(proc: &Path) -> Self {
        let ticks = sysconf(SysconfVar::CLK_TCK)
            .ok()
            .flatten()
            .filter(|t| *t > 0)
            .map_or(100.0, |t| t as f64);
        let page_size = sysconf(SysconfVar::PAGE_SIZE)
            .ok()
            .flatten()
            .and_then(|p| u64::try_from(p).ok())
            .unwrap_or(4096);
        let uptime = std::fs::read_to_string(proc.join("uptime"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64());
        Self {
            ticks,
            page_size,
            uptime,
            now,
        }
    }
}

/// Parses `/proc/PID/stat` (`pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt
/// cmajflt utime stime cutime cstime priority nice threads itrealvalue starttime vsize rss ...`). The name
/// may hold spaces and parentheses: the fields are read after the last `)`.
fn parse_stat(pid: i32, stat: &str, clock: &Clock) -> Option<ProcessInfo> {
    let (head, rest) = stat.rsplit_once(')')?;
    let name = head.split_once('(')?.1.to_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| -> Option<f64> { fields.get(i)?.parse().ok() };
    let cpu_ticks = field(11)? + field(12)?;
    let start_ticks = field(19)?;
    let cpu_seconds = cpu_ticks / clock.ticks;
    let started = start_ticks / clock.ticks;
    let alive = (clock.uptime - started).max(0.0);
    // From now back by its age: the boot time the kernel gives is in whole seconds, the age is not.
    let cpu_percent = if alive > 0.0 {
        (cpu_seconds / alive * 100.0 * 10.0).round() / 10.0
    } else {
        0.0
    };
    let rss_pages: u64 = fields.get(21)?.parse().ok()?;
    Some(ProcessInfo {
        pid,
        ppid: fields.get(1)?.parse().ok()?,
        pgid: fields.get(2)?.parse().ok()?,
        name,
        state: (*fields.first()?).to_owned(),
        cpu_seconds,
        cpu_percent,
        memory_bytes: rss_pages.saturating_mul(clock.page_size),
        start_time: clock.now - alive,
        ..Default::default()
    })
}

/// The effective uid of `/proc/PID/status` (`Uid:\treal\teffective\tsaved\tfs`).
fn effective_uid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// User names by uid, from a passwd file (`name:x:uid:...`); a file that cannot be read gives none.
fn users(passwd: &Path) -> HashMap<u32, String> {
    std::fs::read_to_string(passwd)
        .map(|s| {
            s.lines()
                .filter_map(|l| {
                    let mut f = l.split(':');
                    let name = f.next()?;
                    let uid = f.nth(1)?.parse().ok()?;
                    Some((uid, name.to_owned()))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn stat_lines_parse_whatever_the_name() {
        let clock = Clock {
            ticks: 100.0,
            page_size: 4096,
            uptime: 1000.0,
            now: 1_700_001_000.0,
        };
        let stat = "42 (a (weird) name) S 7 42 42 0 -1 4194560 10 0 0 0 150 50 0 0 20 0 1 0 50000 1000 256 \
                    18446744073709551615";
        let p = parse_stat(42, stat, &clock).unwrap();
        assert_eq!((p.pid, p.ppid, p.pgid), (42, 7, 42));
        assert_eq!((p.name.as_str(), p.state.as_str()), ("a (weird) name", "S"));
        assert!((p.cpu_seconds - 2.0).abs() < 1e-9);
        // Started 500 s after boot, alive 500 s, 2 s of CPU: 0.4 %.
        assert!((p.cpu_percent - 0.4).abs() < 1e-9, "{}", p.cpu_percent);
        assert_eq!(p.memory_bytes, 256 * 4096);
        assert!((p.start_time - 1_700_000_500.0).abs() < 1e-9);
        assert!(parse_stat(1, "1 (x) S 0", &clock).is_none());
    }

    #[test]
    fn uids_and_names_come_from_status_and_passwd() {
        assert_eq!(
            effective_uid("Name:\tx\nUid:\t1000\t1001\t1000\t1000\nGid:\t0\n"),
            Some(1001)
        );
        let dir = tempfile::tempdir().unwrap();
        let passwd = dir.path().join("passwd");
        std::fs::write(
            &passwd,
            "root:x:0:0:root:/root:/bin/bash\nuser:x:1000:1000::/home/user:/bin/sh\nbad\n",
        )
        .unwrap();
        let u = users(&passwd);
        assert_eq!((u[&0].as_str(), u[&1000].as_str()), ("root", "user"));
        assert_eq!(u.len(), 2);
    }

    #[test]
    fn this_process_is_listed_with_its_role_and_pid_1_and_itself_are_not_signalled() {
        let me = i32::try_from(std::process::id()).unwrap();
        let roles = Roles {
            executor: me,
            kernel: None,
        };
        let all = list(Path::new("/proc"), roles);
        let p = all.iter().find(|p| p.pid == me).unwrap();
        assert_eq!(p.role, EXECUTOR);
        assert!(!p.command.is_empty() && p.memory_bytes > 0 && p.start_time > 0.0);
        for pid in [1, me] {
            assert!(matches!(
                signal(pid, "TERM", roles),
                Err(Error::FailedPrecondition(_))
            ));
        }
        assert!(matches!(
            signal(0, "TERM", roles),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            signal(me + 1_000_000, "", roles),
            Err(Error::ProcessNotFound(_))
        ));
        assert!(matches!(
            signal(2, "SEGV", roles),
            Err(Error::InvalidArgument(_))
        ));
    }
}
