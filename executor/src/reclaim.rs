//! Taking the pids limit back from user code: when the executor cannot start a process it needs (a
//! command's bash, the kernel) because the sandbox's pids limit is full, it kills leftovers and tries again,
//! and the action's stream says what it did.
//!
//! A fork bomb started in the background (`:(){ :|:& };:` then exit) ends its command at once but fills the
//! limit for as long as its processes keep retrying their forks (bash gives up after about 15 s), and every
//! action in between failed with "cannot start /bin/bash: Resource temporarily unavailable". Leftovers are
//! killed in two steps, the second only when the first did not free enough:
//!
//! 1. the process groups of shell actions that have ended (what they left running in the background) and
//!    their descendants;
//! 2. every other process but PID 1 (tini), the executor and the kernel, also those of running actions:
//!    only when the executor is its container's service (`Config::reclaim_all`), where every other process
//!    is user code. An executor running on a developer's machine (the component tests) never does this.
//!
//! Spawns go one at a time through here, so a reclaim never mistakes a group being started for an ended one
//! whose number was reused.

pub(crate) mod procfs;

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use mentis_model::ObservationKind;
use nix::errno::Errno;
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::cgroup::Cgroup;
use procfs::Spared;

/// Ended actions' groups remembered; the oldest are forgotten first (most are empty long before).
const MAX_ENDED: usize = 4096;
/// Pauses before each new try of a refused spawn after a reclaim: a killed process gives its pid back
/// only once reaped (by tini, or by its parent), a moment after the kill. About 0.4 s in all.
const RETRY_AFTER: [Duration; 7] = [
    Duration::from_millis(1),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(200),
];
/// A reclaim scans and kills until a scan finds nothing more to kill, at most this many times (a process
/// forked between a scan and the kills is found by the next scan).
const KILL_ROUNDS: usize = 20;
const KILL_ROUND_PAUSE: Duration = Duration::from_millis(2);
/// The message of the `agent_state` that reports a reclaim.
pub(crate) const RECLAIMED: &str = "reclaimed processes at the pids limit";

/// Which leftovers a reclaim kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Tier {
    /// The groups of ended shell actions and their descendants.
    EndedActions,
    /// Every process but PID 1, the executor and the kernel.
    AllOthers,
}

impl Tier {
    fn name(self) -> &'static str {
        match self {
            Self::EndedActions => "ended actions",
            Self::AllOthers => "all other user processes",
        }
    }
}

/// What a spawned process is to the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// A shell action's bash, leader of the action's process group.
    Action,
    /// The IPython kernel, which reclaims spare.
    Kernel,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Self::Action => "a command's shell",
            Self::Kernel => "the kernel",
        }
    }
}

/// What the executor started, to tell leftovers from what it needs. Shared by the shell and IPython sides.
pub(crate) struct Processes {
    state: Mutex<State>,
    /// One spawn (with its reclaims) at a time.
    spawning: tokio::sync::Mutex<()>,
    reclaim_all: bool,
    /// `/proc`.
    proc_root: PathBuf,
}

#[derive(Default)]
struct State {
    /// Process groups of ended shell actions, oldest first, each once.
    ended: VecDeque<i32>,
    /// The running kernel's pid.
    kernel: Option<i32>,
}

/// A process [`Processes::spawn`] started, known to the executor until this is dropped: then an action's
/// group counts as ended (its leftovers are reclaimable), and a kernel is no longer spared.
pub(crate) struct Tracked {
    processes: Arc<Processes>,
    pid: i32,
    role: Role,
}

impl Drop for Tracked {
    fn drop(&mut self) {
        let mut state = self.processes.state();
        match self.role {
            Role::Action => {
                state.ended.retain(|&g| g != self.pid);
                state.ended.push_back(self.pid);
                if state.ended.len() > MAX_ENDED {
                    state.ended.pop_front();
                }
            }
            Role::Kernel => {
                if state.kernel == Some(self.pid) {
                    state.kernel = None;
                }
            }
        }
    }
}

/// The outcome of [`Processes::spawn`].
pub(crate) struct Spawned {
    pub(crate) result: io::Result<(Child, Tracked)>,
    /// What was reclaimed for it, to report; `None` when nothing was killed.
    pub(crate) reclaimed: Option<Reclaimed>,
}

/// What a reclaim did, for the action's stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reclaimed {
    role: Role,
    /// Processes killed, by tier, in the order the tiers ran.
    killed: Vec<(Tier, usize)>,
    /// Whether the spawn succeeded afterwards.
    started: bool,
    pids_limit: Option<u64>,
}

impl Reclaimed {
    pub(crate) fn total(&self) -> usize {
        self.killed.iter().map(|(_, n)| n).sum()
    }

    /// The `agent_state` that tells of it (the control plane logs it sandbox-wide).
    pub(crate) fn observation(&self) -> ObservationKind {
        let mut details = BTreeMap::new();
        details.insert("killed".to_owned(), self.total().to_string());
        let from: Vec<&str> = self
            .killed
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(tier, _)| tier.name())
            .collect();
        details.insert("from".to_owned(), from.join(", "));
        for (tier, n) in &self.killed {
            details.insert(format!("killed from {}", tier.name()), n.to_string());
        }
        details.insert("for".to_owned(), self.role.name().to_owned());
        details.insert("started".to_owned(), self.started.to_string());
        if let Some(limit) = self.pids_limit {
            details.insert("pids_limit".to_owned(), limit.to_string());
        }
        ObservationKind::AgentState {
            message: RECLAIMED.to_owned(),
            details,
        }
    }

    /// "killed 57 processes (ended actions)", for logs and error messages.
    pub(crate) fn summary(&self) -> String {
        let from: Vec<String> = self
            .killed
            .iter()
            .map(|(tier, n)| format!("{n} of {}", tier.name()))
            .collect();
        format!(
            "killed {} processes at the pids limit ({})",
            self.total(),
            from.join(", ")
        )
    }
}

/// Whether a spawn failed on the pids limit (fork and clone say EAGAIN).
pub(crate) fn at_pids_limit(e: &io::Error) -> bool {
    e.raw_os_error() == Some(Errno::EAGAIN as i32)
}

impl Processes {
    /// `reclaim_all`: whether the second tier may run (see the module's doc).
    pub(crate) fn new(reclaim_all: bool) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State::default()),
            spawning: tokio::sync::Mutex::new(()),
            reclaim_all,
            proc_root: PathBuf::from("/proc"),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section is a few assignments; a panic cannot leave one half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Spawns `command` (set up with its own process group), reclaiming at the pids limit and trying again
    /// a bounded number of times. The child is tracked as `role` until the returned [`Tracked`] is dropped.
    pub(crate) async fn spawn(self: &Arc<Self>, role: Role, command: &mut Command) -> Spawned {
        let _one_at_a_time = self.spawning.lock().await;
        let mut result = command.spawn();
        let mut killed = Vec::new();
        for tier in [Tier::EndedActions, Tier::AllOthers] {
            match &result {
                Err(e) if at_pids_limit(e) => {}
                _ => break,
            }
            if tier == Tier::AllOthers && !self.reclaim_all {
                break;
            }
            let n = self.reclaim(tier).await;
            killed.push((tier, n));
            if n == 0 {
                continue;
            }
            for pause in RETRY_AFTER {
                tokio::time::sleep(pause).await;
                result = command.spawn();
                if !matches!(&result, Err(e) if at_pids_limit(e)) {
                    break;
                }
            }
        }
        let result = result.map(|child| {
            let pid = child
                .id()
                .and_then(|pid| i32::try_from(pid).ok())
                .unwrap_or(0);
            (child, self.track(role, pid))
        });
        let reclaimed = if killed.iter().any(|(_, n)| *n > 0) {
            let reclaimed = Reclaimed {
                role,
                killed,
                started: result.is_ok(),
                pids_limit: Cgroup::get().pids_limit().await,
            };
            tracing::warn!(summary = %reclaimed.summary(), started = reclaimed.started, "reclaimed processes for {}", role.name());
            Some(reclaimed)
        } else {
            None
        };
        Spawned { result, reclaimed }
    }

    fn track(self: &Arc<Self>, role: Role, pid: i32) -> Tracked {
        let mut state = self.state();
        // A new group (or the kernel) may have the number of an ended group: it is not that group.
        state.ended.retain(|&g| g != pid);
        if role == Role::Kernel {
            state.kernel = Some(pid);
        }
        Tracked {
            processes: Arc::clone(self),
            pid,
            role,
        }
    }

    /// The running kernel's pid.
    pub(crate) fn kernel(&self) -> Option<i32> {
        self.state().kernel
    }

    /// PID 1, the executor and the kernel.
    fn spared(&self) -> Spared {
        let mut pids: HashSet<i32> = [1, std::process::id().cast_signed()].into();
        pids.extend(self.state().kernel);
        Spared { pids }
    }

    /// Kills the leftovers of `tier`; returns how many processes it killed.
    pub(crate) async fn reclaim(&self, tier: Tier) -> usize {
        let spared = self.spared();
        let groups: HashSet<i32> = self.state().ended.iter().copied().collect();
        let mut killed = HashSet::new();
        let mut live_groups = HashSet::new();
        for _ in 0..KILL_ROUNDS {
            let procs = procfs::scan(&self.proc_root);
            // Sorted, for the lookups below.
            let mut targets = match tier {
                Tier::EndedActions => procfs::in_groups(&procs, &groups, &spared),
                Tier::AllOthers => procfs::all_but(&procs, &spared),
            };
            targets.sort_unstable();
            live_groups = procs
                .iter()
                .filter(|p| !p.dead && groups.contains(&p.pgrp))
                .map(|p| p.pgrp)
                .collect();
            if targets.is_empty() {
                break;
            }
            let mut killed_groups = HashSet::new();
            if tier == Tier::EndedActions {
                // One signal reaches the whole group at once, also a child forked while we scanned (the
                // kernel fails a fork that races with a signal to the group). Not a group with a spared
                // member (its number reused by the kernel's group, say): that one goes process by process.
                let holds_spared: HashSet<i32> = procs
                    .iter()
                    .filter(|p| spared.pids.contains(&p.pid))
                    .map(|p| p.pgrp)
                    .collect();
                for &group in live_groups.difference(&holds_spared) {
                    match killpg(Pid::from_raw(group), Signal::SIGKILL) {
                        Ok(()) => {
                            killed_groups.insert(group);
                        }
                        Err(Errno::ESRCH) => {}
                        Err(e) => {
                            tracing::debug!(group, error = %e, "cannot kill a leftover group")
                        }
                    }
                }
            }
            for proc in procs
                .iter()
                .filter(|p| targets.binary_search(&p.pid).is_ok())
            {
                // Killed with its group (and perhaps reaped already); otherwise one by one. EPERM: not
                // ours (a `docker exec` as root); ESRCH: gone already.
                if killed_groups.contains(&proc.pgrp)
                    || kill(Pid::from_raw(proc.pid), Signal::SIGKILL).is_ok()
                {
                    killed.insert(proc.pid);
                }
            }
            tokio::time::sleep(KILL_ROUND_PAUSE).await;
        }
        // Forget ended groups with nobody left in them.
        self.state()
            .ended
            .retain(|g| !groups.contains(g) || live_groups.contains(g));
        killed.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn alive(pid: i32) -> bool {
        // A zombie waiting for its parent is not alive.
        procfs::scan(std::path::Path::new("/proc"))
            .iter()
            .any(|p| p.pid == pid && !p.dead)
    }

    async fn shell(processes: &Arc<Processes>, script: &str) -> (Child, Tracked) {
        let mut command = Command::new("/bin/bash");
        command
            .arg("-c")
            .arg(script)
            .process_group(0)
            .stdout(std::process::Stdio::piped());
        processes
            .spawn(Role::Action, &mut command)
            .await
            .result
            .unwrap()
    }

    /// Reads one pid per line from the child's stdout.
    async fn pids(child: &mut Child, count: usize) -> Vec<i32> {
        use tokio::io::AsyncBufReadExt;
        let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let mut pids = Vec::new();
        while pids.len() < count {
            pids.push(
                lines
                    .next_line()
                    .await
                    .unwrap()
                    .unwrap()
                    .trim()
                    .parse()
                    .unwrap(),
            );
        }
        pids
    }

    #[tokio::test]
    async fn ended_actions_lose_their_leftovers_and_running_ones_keep_theirs() {
        let processes = Processes::new(false);
        // An action that ended, leaving a background sleeper, and one whose child moved to a group of its
        // own (setsid), still found as a descendant while its parent lives.
        let (mut ended, tracked) = shell(
            &processes,
            "sleep 300 & echo $!; setsid bash -c 'echo $$; sleep 300' & sleep 300 & echo $!; wait",
        )
        .await;
        let leftovers = pids(&mut ended, 3).await;
        // The action's bash lives on in this test (a real one exits); what matters is that its action
        // ended. A running action, with a background sleeper of its own.
        let (mut running, _running) = shell(&processes, "sleep 300 & echo $!; wait").await;
        let kept = pids(&mut running, 1).await;
        drop(tracked);
        let killed = processes.reclaim(Tier::EndedActions).await;
        ended.wait().await.unwrap();
        // bash, two sleepers, and the setsid'd bash (with its sleeper, unless bash exec'd it).
        assert!(killed >= 4, "{killed}: {leftovers:?}");
        for pid in &leftovers {
            assert!(!alive(*pid), "{pid} survived");
        }
        assert!(alive(kept[0]), "a running action's process was killed");
        // Nothing left to take: the ended group is forgotten.
        assert_eq!(processes.reclaim(Tier::EndedActions).await, 0);
        assert!(processes.state().ended.is_empty());
        running.start_kill().unwrap();
        kill(Pid::from_raw(kept[0]), Signal::SIGKILL).unwrap();
        running.wait().await.unwrap();
    }

    #[test]
    fn the_report_says_what_was_killed_from_where() {
        let reclaimed = Reclaimed {
            role: Role::Action,
            killed: vec![(Tier::EndedActions, 50), (Tier::AllOthers, 3)],
            started: true,
            pids_limit: Some(64),
        };
        let ObservationKind::AgentState { message, details } = reclaimed.observation() else {
            panic!("not an agent_state");
        };
        assert_eq!(message, RECLAIMED);
        assert_eq!(details["killed"], "53");
        assert_eq!(details["from"], "ended actions, all other user processes");
        assert_eq!(details["killed from ended actions"], "50");
        assert_eq!(details["pids_limit"], "64");
        assert_eq!(details["started"], "true");
        assert_eq!(
            reclaimed.summary(),
            "killed 53 processes at the pids limit (50 of ended actions, 3 of all other user processes)"
        );
    }
}
