//! User code yields to the executor: every process that runs user code (a shell command's bash, the
//! IPython kernel) is made the OOM killer's first choice and given a lower CPU priority, so a memory hog or
//! a CPU spinner hurts only itself and the executor keeps answering.

use std::path::Path;

/// The highest OOM score adjustment: with a memory limit reached, the kernel kills user processes (the
/// biggest first) before it would consider the executor (left at the container's default, 0).
const OOM_SCORE_ADJ: &str = "1000";
/// Niceness of user processes: within the container's CPU quota the executor (nice 0) gets about three
/// times a busy user process's share, enough to keep answering; user code alone still gets all of it.
const NICE: i32 = 5;

/// Lowers the standing of the just-spawned process `pid` (and so of everything it starts afterwards).
///
/// Done from outside, right after spawn, because doing it in the child between fork and exec needs
/// `pre_exec`, which is unsafe. A process the child forks before this runs keeps the executor's values;
/// that window is negligible: bash spends about a millisecond starting up (python far longer) before it
/// forks anything, and this runs microseconds after spawn returned. No capability is needed: a process may
/// raise the OOM score and the niceness of processes of its own user. A failure (an unusual runtime, the
/// process already gone) is logged and ignored: the command runs as before.
pub(crate) fn demote(pid: u32) {
    let path = Path::new("/proc")
        .join(pid.to_string())
        .join("oom_score_adj");
    if let Err(e) = std::fs::write(&path, OOM_SCORE_ADJ) {
        tracing::debug!(pid, error = %e, "cannot raise the OOM score of a user process");
    }
    let nice = i32::try_from(pid)
        .ok()
        .and_then(rustix::process::Pid::from_raw)
        .map(|pid| rustix::process::setpriority_process(Some(pid), NICE));
    match nice {
        Some(Ok(())) => {}
        Some(Err(e)) => {
            tracing::debug!(pid, error = %e, "cannot lower the priority of a user process")
        }
        None => tracing::debug!(pid, "not a process id"),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn read(pid: u32, file: &str) -> String {
        std::fs::read_to_string(format!("/proc/{pid}/{file}")).unwrap()
    }

    /// Works without privileges on a child of ours; the child's children inherit both values.
    #[test]
    fn children_get_the_top_oom_score_and_a_lower_priority() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        demote(child.id());
        let score = read(child.id(), "oom_score_adj");
        // Field 19 of /proc/PID/stat is the nice value (after the command in parentheses).
        let stat = read(child.id(), "stat");
        let nice = stat
            .rsplit(") ")
            .next()
            .unwrap()
            .split(' ')
            .nth(16)
            .unwrap()
            .to_owned();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(score.trim(), "1000");
        assert_eq!(nice, NICE.to_string());
    }

    #[test]
    fn a_gone_process_is_no_error() {
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        demote(pid);
    }
}
