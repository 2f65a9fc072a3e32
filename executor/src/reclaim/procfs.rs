//! The sandbox's processes as `/proc` shows them, and which of them a reclaim kills.
//!
//! Read with plain `std::fs`, on purpose: this runs when the pids limit is full, when a blocking thread might
//! not be had, and a scan is a few hundred reads of small kernel files (a millisecond or two).

use std::collections::{HashMap, HashSet};
use std::path::Path;

/// One process (a thread group) at the moment of the scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Proc {
    pub(crate) pid: i32,
    pub(crate) ppid: i32,
    pub(crate) pgrp: i32,
    /// Its session (a terminal's program leads one).
    pub(crate) session: i32,
    /// Dead already, waiting to be reaped: nothing to kill (its pid comes back when its parent or tini
    /// reaps it).
    pub(crate) dead: bool,
}

/// Every process under `proc` (the real `/proc` in production) that could be read; one that ends during
/// the scan is simply missing.
pub(crate) fn scan(proc: &Path) -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir(proc) else {
        return Vec::new();
    };
    entries
        .filter_map(|entry| {
            let entry = entry.ok()?;
            let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
            let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
            parse_stat(pid, &stat)
        })
        .collect()
}

/// Parses `/proc/PID/stat`: `pid (comm) state ppid pgrp ...`. The command name may hold spaces and
/// parentheses, so the fields are read after the last `)`.
fn parse_stat(pid: i32, stat: &str) -> Option<Proc> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace();
    let state = fields.next()?;
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    let session = fields.next()?.parse().ok()?;
    Some(Proc {
        pid,
        ppid,
        pgrp,
        session,
        // Z: zombie, X: dead.
        dead: matches!(state, "Z" | "X"),
    })
}

/// Processes a reclaim must never kill.
#[derive(Debug, Clone, Default)]
pub(crate) struct Spared {
    pub(crate) pids: HashSet<i32>,
}

impl Spared {
    fn spares(&self, proc: &Proc) -> bool {
        proc.dead || self.pids.contains(&proc.pid)
    }
}

/// The live, unspared members of the groups in `groups` and their descendants (by parent, as far as the
/// scan shows them: a process whose parent died was handed to PID 1 and is no longer found this way).
pub(crate) fn in_groups(procs: &[Proc], groups: &HashSet<i32>, spared: &Spared) -> Vec<i32> {
    let mut children: HashMap<i32, Vec<&Proc>> = HashMap::new();
    for proc in procs {
        children.entry(proc.ppid).or_default().push(proc);
    }
    let mut found: HashSet<i32> = HashSet::new();
    let mut stack: Vec<&Proc> = procs.iter().filter(|p| groups.contains(&p.pgrp)).collect();
    while let Some(proc) = stack.pop() {
        if spared.spares(proc) || !found.insert(proc.pid) {
            continue;
        }
        if let Some(kids) = children.get(&proc.pid) {
            stack.extend(kids.iter().copied());
        }
    }
    let mut found: Vec<i32> = found.into_iter().collect();
    found.sort_unstable();
    found
}

/// Every live process that is not spared.
pub(crate) fn all_but(procs: &[Proc], spared: &Spared) -> Vec<i32> {
    procs
        .iter()
        .filter(|p| !spared.spares(p))
        .map(|p| p.pid)
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn p(pid: i32, ppid: i32, pgrp: i32) -> Proc {
        Proc {
            pid,
            ppid,
            pgrp,
            session: 4100,
            dead: false,
        }
    }

    #[test]
    fn stat_lines_parse_whatever_the_command_name() {
        let stat = "4242 (a) b (c) S 17 4200 4100 0 -1 4194560 115 0 0 0 0 0 0 0 20 0 1 0";
        assert_eq!(parse_stat(4242, stat), Some(p(4242, 17, 4200)));
        let zombie = parse_stat(7, "7 (bash) Z 1 5 5 0").unwrap();
        assert_eq!(zombie.session, 5);
        assert!(zombie.dead);
        assert_eq!(parse_stat(7, "7 (bash"), None);
        assert_eq!(parse_stat(7, "7 (bash) S x 5"), None);
    }

    #[test]
    fn the_real_proc_shows_this_process() {
        let me = i32::try_from(std::process::id()).unwrap();
        let procs = scan(Path::new("/proc"));
        let found = procs.iter().find(|p| p.pid == me).unwrap();
        assert_eq!(found.ppid, nix::unistd::getppid().as_raw());
        assert_eq!(found.pgrp, nix::unistd::getpgrp().as_raw());
        assert_eq!(found.session, nix::unistd::getsid(None).unwrap().as_raw());
        assert!(!found.dead);
    }

    #[test]
    fn groups_take_their_descendants_but_nothing_spared() {
        // 1 tini; 10 the executor; 20 an ended action's bash (group 20) with a child 21 that moved to its
        // own group 21 and a grandchild 22; 30 a process of group 20 whose parent died (now PID 1's);
        // 40 a running action (group 40); 50 the kernel, spared, with a child 51; 23 a zombie of group 20.
        let procs = [
            p(1, 0, 1),
            p(10, 1, 10),
            p(20, 10, 20),
            p(21, 20, 21),
            p(22, 21, 21),
            Proc {
                dead: true,
                ..p(23, 20, 20)
            },
            p(30, 1, 20),
            p(40, 10, 40),
            p(41, 40, 40),
            p(50, 10, 50),
            p(51, 50, 50),
        ];
        let spared = Spared {
            pids: [1, 10, 50].into(),
        };
        assert_eq!(in_groups(&procs, &[20].into(), &spared), [20, 21, 22, 30]);
        assert_eq!(in_groups(&procs, &[99].into(), &spared), Vec::<i32>::new());
        // A spared process is not killed even in a named group; the rest of its group is.
        assert_eq!(in_groups(&procs, &[50].into(), &spared), [51]);
        let mut all = all_but(&procs, &spared);
        all.sort_unstable();
        assert_eq!(all, [20, 21, 22, 30, 40, 41, 51]);
    }
}
