//! User code yields to the executor: every process that runs user code (a shell command's bash, the
//! IPython kernel) is the OOM killer's first choice, and shell commands run at a lower CPU priority, so a
//! memory hog or a CPU spinner hurts only itself and the executor keeps answering.

use std::io;
use std::path::Path;
use std::time::Duration;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::unistd::Uid;
use tokio::process::Command;
use tokio::time::Instant;

/// The highest OOM score adjustment: when the memory limit is reached, the kernel kills user processes
/// (the biggest first) before it would consider the executor (left at the container's value, normally 0).
const USER_OOM_SCORE_ADJ: &str = "1000";
/// Niceness of shell commands and terminals: within the container's CPU quota the executor (nice 0) gets
/// about three times a busy command's share, enough to keep answering; user code alone still gets all of it.
const USER_NICE: i32 = 5;
/// How long a refused OOM score write is retried (an exec finishes in well under a millisecond).
const RAISE_PATIENCE: Duration = Duration::from_millis(250);
const RAISE_RETRY: Duration = Duration::from_millis(2);

/// Makes `command` start with OOM score adjustment 1000, nice 5 and every signal at its default action, set
/// in the child between fork and exec,
/// so both hold before the program can fork anything (both are inherited at fork). Call before
/// [`crate::identity::user_process`]: this runs first.
///
/// The executor is non-dumpable (see main.rs), and so is the forked child until its exec: its
/// /proc/self files belong to root, and the supervisor's effective uid (the sandbox user) cannot write
/// them. The child takes its saved root uid as effective uid for the write and puts it back (its ids are
/// then changed for good by `user_process`). Raising the score and the niceness needs no capability. A
/// refused write (an unusual runtime) leaves the command at the executor's score, as nice leaves it at its
/// priority: neither stops the command. This costs two system calls, where a first bash that raised its own
/// score and exec'd `nice` cost a second bash start (about 1.5 ms a command).
pub(crate) fn demote(command: &mut Command) {
    // SAFETY: the closure runs in the child between fork and exec, where only async-signal-safe calls are
    // allowed: it makes system calls only (getresuid, setresuid, open, write, close, setpriority; nix's and
    // rustix's wrappers allocate nothing for a C string path), and ignores or converts errnos.
    #[allow(unsafe_code)]
    unsafe {
        command.pre_exec(demote_self);
    }
}

fn demote_self() -> io::Result<()> {
    let ids = nix::unistd::getresuid()?;
    let root = Uid::from_raw(0);
    let lift = !ids.effective.is_root() && (ids.real.is_root() || ids.saved.is_root());
    if lift {
        nix::unistd::setresuid(ids.real, root, ids.saved)?;
    }
    if let Ok(fd) = nix::fcntl::open(
        c"/proc/self/oom_score_adj",
        OFlag::O_WRONLY | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) {
        let _ = nix::unistd::write(&fd, USER_OOM_SCORE_ADJ.as_bytes());
    }
    if lift {
        nix::unistd::setresuid(ids.real, ids.effective, ids.saved)?;
    }
    let _ = rustix::process::setpriority_process(None, USER_NICE);
    default_signals();
    Ok(())
}

/// Every signal back to its default action. Handlers are reset by exec anyway, but an ignored signal stays
/// ignored across it: an executor started with SIGINT ignored (by a shell's background job, say) would give
/// user code a Ctrl-C, a timeout's SIGINT or a terminal's signal that does nothing.
fn default_signals() {
    use nix::sys::signal::{SigHandler, Signal, signal};
    for sig in Signal::iterator() {
        if matches!(sig, Signal::SIGKILL | Signal::SIGSTOP) {
            continue;
        }
        // SAFETY: between fork and exec in the child (see `demote`): sigaction is async-signal-safe, and
        // the default action installs no handler of ours.
        #[allow(unsafe_code)]
        let _ = unsafe { signal(sig, SigHandler::SigDfl) };
    }
}

/// Raises the OOM score of the just-spawned `pid` from the outside, for a program that starts nothing
/// until the caller lets it: the kernel runs no cell before it has been started, which waits for this.
///
/// Right after spawn the write can be refused for a moment: spawn returns when the child's exec has closed
/// its close-on-exec descriptors, a little before the kernel makes it dumpable again, and until then its
/// /proc files belong to root like the non-dumpable executor's. So a refusal is retried, for a bounded time.
pub(crate) async fn raise_oom_score(pid: u32) {
    let path = Path::new("/proc")
        .join(pid.to_string())
        .join("oom_score_adj");
    let give_up = Instant::now() + RAISE_PATIENCE;
    loop {
        match std::fs::write(&path, USER_OOM_SCORE_ADJ) {
            Ok(()) => return,
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied && Instant::now() < give_up => {
                tokio::time::sleep(RAISE_RETRY).await;
            }
            Err(e) => {
                tracing::debug!(pid, error = %e, "cannot raise the OOM score of a user process");
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn own_score() -> String {
        std::fs::read_to_string("/proc/self/oom_score_adj").unwrap()
    }

    #[tokio::test]
    async fn commands_start_with_the_top_oom_score_and_keep_their_env() {
        // The first thing the command does is fork, and the child already has the score and the nice value
        // (field 19 of /proc/PID/stat).
        let own = own_score();
        let mut command = Command::new("/bin/bash");
        demote(&mut command);
        command
            .arg("-c")
            .arg("cat /proc/self/oom_score_adj; cut -d' ' -f19 /proc/self/stat; env")
            .env("odd-name.x", "kept")
            .stdout(std::process::Stdio::piped());
        let child = command.spawn().unwrap();
        let out = child.wait_with_output().await.unwrap();
        let out = String::from_utf8(out.stdout).unwrap();
        assert!(out.starts_with("1000\n5\n"), "{out}");
        assert!(out.contains("\nodd-name.x=kept\n"), "{out}");
        assert!(!out.contains("POSIXLY_CORRECT"), "{out}");
        assert_eq!(own_score(), own, "the executor's own score is untouched");
    }

    #[tokio::test]
    async fn a_kernel_is_demoted_from_the_outside_and_a_gone_one_is_no_error() {
        let mut child = std::process::Command::new("sleep")
            .arg("10")
            .spawn()
            .unwrap();
        raise_oom_score(child.id()).await;
        let score = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", child.id())).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        assert_eq!(score.trim(), "1000");
        // Beyond any pid_max: no such process.
        let gone = i32::MAX.unsigned_abs();
        raise_oom_score(gone).await;
    }
}
