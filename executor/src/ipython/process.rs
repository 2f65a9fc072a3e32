//! The kernel's process: started in its own process group with a private connection directory, watched
//! until it exits (so a death is noticed even between cells), interrupted with SIGINT, killed as a group.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid};
use nix::unistd::Pid;
use tempfile::TempDir;
use tokio::io::AsyncReadExt;
use tokio::process::{Child, ChildStderr, Command};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::config::TOKEN_ENV;
use crate::enter::{self, Priority};
use crate::reclaim::{Processes, Reclaimed, Role, Tracked};
use crate::shell::process::ProcessGroup;

/// How much of the kernel's own stderr is kept, to explain a kernel that fails to start.
const STDERR_TAIL: usize = 4 * 1024;
/// Bound on waiting for a SIGKILLed kernel to be reaped.
const REAP_TIMEOUT: Duration = Duration::from_secs(10);

/// How the kernel process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Exit {
    Code(i32),
    Signal(i32),
    /// The exit status could not be read.
    Unknown,
}

impl Exit {
    fn from_status(status: std::io::Result<ExitStatus>) -> Self {
        match status {
            Ok(status) => match (status.code(), status.signal()) {
                (Some(code), _) => Self::Code(code),
                (None, Some(signal)) => Self::Signal(signal),
                (None, None) => Self::Unknown,
            },
            Err(_) => Self::Unknown,
        }
    }

    /// Details for the `agent_state` event.
    pub(crate) fn details(self, details: &mut BTreeMap<String, String>) {
        details.insert("exit".to_owned(), self.to_string());
        match self {
            Self::Code(code) => {
                details.insert("exit_code".to_owned(), code.to_string());
            }
            Self::Signal(signal) => {
                details.insert("signal".to_owned(), signal.to_string());
            }
            Self::Unknown => {}
        }
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::Code(code) => write!(f, "exited with status {code}"),
            Self::Signal(signal) => match Signal::try_from(signal) {
                Ok(name) => write!(f, "was killed by signal {signal} ({name})"),
                Err(_) => write!(f, "was killed by signal {signal}"),
            },
            Self::Unknown => f.write_str("exited (status unknown)"),
        }
    }
}

/// What starting a kernel needs.
pub(crate) struct Launch<'a> {
    pub(crate) python: &'a Path,
    pub(crate) workspace: &'a Path,
    /// The sandbox env, over the executor's own.
    pub(crate) env: &'a HashMap<String, String>,
    pub(crate) tracker: &'a TaskTracker,
    /// Executor shutdown: the watcher kills the kernel then.
    pub(crate) shutdown: &'a CancellationToken,
    /// Spawns the kernel (reclaiming the pids limit when it is full) and spares it in reclaims.
    pub(crate) processes: &'a Arc<Processes>,
}

/// A running (or exited, not yet replaced) kernel process.
pub(crate) struct KernelProcess {
    pid: i32,
    exit: watch::Receiver<Option<Exit>>,
    /// Tells the watcher to SIGKILL the group (also on drop).
    kill: CancellationToken,
    stderr_tail: Arc<Mutex<String>>,
    /// Cancelled when the kernel's stderr reached its end (or will never be read again).
    stderr_done: CancellationToken,
    /// The private directory of the connection file; removed on drop.
    dir: TempDir,
    /// Spared by reclaims while this lives.
    _tracked: Tracked,
    /// What was reclaimed to start it, until reported.
    reclaimed: Option<Reclaimed>,
}

impl KernelProcess {
    /// Spawns `python -m ipykernel_launcher -f DIR/kernel.json`; the kernel writes the file (ports it
    /// bound itself, so there is no race for ports, and a fresh key) in a directory only we can read.
    pub(crate) async fn spawn(launch: &Launch<'_>) -> Result<Self, String> {
        let dir = tempfile::Builder::new()
            .prefix("mentis-kernel-")
            .tempdir()
            .map_err(|e| format!("cannot create the kernel's private directory: {e}"))?;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot restrict the kernel's private directory: {e}"))?;
        let mut command = command(launch, &dir.path().join("kernel.json")).map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                no_python(launch.python)
            } else {
                format!("cannot run {}: {e}", launch.python.display())
            }
        })?;
        let spawned = launch.processes.spawn(Role::Kernel, &mut command).await;
        let (mut child, tracked) = spawned.result.map_err(|e| {
            let mut message = format!("cannot run {}: {e}", launch.python.display());
            if let Some(reclaimed) = &spawned.reclaimed {
                message = format!("{message}; {} and tried again", reclaimed.summary());
            }
            message
        })?;
        let Some(pid) = child.id().and_then(|pid| i32::try_from(pid).ok()) else {
            return Err("the started kernel has no pid".to_owned());
        };
        let stderr_tail = Arc::new(Mutex::new(String::new()));
        let stderr_done = CancellationToken::new();
        if let Some(stderr) = child.stderr.take() {
            let done = stderr_done.clone().drop_guard();
            let drain = drain_stderr(stderr, Arc::clone(&stderr_tail), launch.shutdown.clone());
            launch.tracker.spawn(
                async move {
                    drain.await;
                    drop(done);
                }
                .instrument(tracing::debug_span!(parent: None, "kernel_stderr", pid)),
            );
        } else {
            stderr_done.cancel();
        }
        let (exit_tx, exit) = watch::channel(None);
        let kill = CancellationToken::new();
        launch.tracker.spawn(
            watch_exit(child, pid, kill.clone(), launch.shutdown.clone(), exit_tx)
                .instrument(tracing::info_span!(target: mentis_telemetry::UNTRACED, parent: None, "kernel_process", pid)),
        );
        Ok(Self {
            pid,
            exit,
            kill,
            stderr_tail,
            stderr_done,
            dir,
            _tracked: tracked,
            reclaimed: spawned.reclaimed,
        })
    }

    pub(crate) fn pid(&self) -> i32 {
        self.pid
    }

    /// What was reclaimed to start it, once (to report in the stream of the cell that needed it).
    pub(crate) fn take_reclaimed(&mut self) -> Option<Reclaimed> {
        self.reclaimed.take()
    }

    pub(crate) fn connection_file(&self) -> PathBuf {
        self.dir.path().join("kernel.json")
    }

    /// How it ended, if it did (as reported by the watcher, which may lag the death by a moment).
    pub(crate) fn exited(&self) -> Option<Exit> {
        *self.exit.borrow()
    }

    /// Whether the process has ended, asked of the kernel (not the watcher) so that a death just before a
    /// cell is seen before the cell is sent. Does not reap: that stays the watcher's job.
    pub(crate) fn has_ended(&self) -> bool {
        if self.exited().is_some() {
            return true;
        }
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        match waitid(Id::Pid(Pid::from_raw(self.pid)), flags) {
            Ok(WaitStatus::StillAlive) => false,
            // Exited (a zombie not reaped yet), or already reaped (ECHILD): ended either way.
            Ok(_) | Err(Errno::ECHILD) => true,
            Err(_) => false,
        }
    }

    /// Resolves when the process has exited (and was reaped).
    pub(crate) async fn wait_exit(&mut self) -> Exit {
        match self.exit.wait_for(Option::is_some).await {
            Ok(exit) => exit.unwrap_or(Exit::Unknown),
            // The watcher always reports before it ends; a vanished watcher means the runtime is going.
            Err(_) => Exit::Unknown,
        }
    }

    /// SIGINT to the kernel's process group, like Ctrl-C in a terminal (jupyter_client does the same):
    /// the kernel raises KeyboardInterrupt in the cell, and subprocesses the cell started are interrupted
    /// too. Between cells ipykernel ignores SIGINT, so a late interrupt is harmless.
    pub(crate) fn interrupt(&self) {
        if self.exited().is_some() {
            return;
        }
        match killpg(Pid::from_raw(self.pid), Signal::SIGINT) {
            Ok(()) | Err(Errno::ESRCH) => {}
            Err(e) => tracing::warn!(pid = self.pid, error = %e, "cannot interrupt the kernel"),
        }
    }

    /// Kills the whole group and waits (bounded) until the kernel is reaped.
    /// Kills the kernel's group and reaps it; by then what it wrote to stderr has been read (or a moment
    /// was given for it), so [`Self::stderr_tail`] tells why a kernel that died at start did.
    pub(crate) async fn kill(&mut self) -> Exit {
        self.kill.cancel();
        let exit = match tokio::time::timeout(REAP_TIMEOUT, self.wait_exit()).await {
            Ok(exit) => exit,
            Err(_) => {
                tracing::warn!(pid = self.pid, "the killed kernel was not reaped in time");
                Exit::Unknown
            }
        };
        let _ = tokio::time::timeout(STDERR_SETTLE, self.stderr_done.cancelled()).await;
        exit
    }

    /// The last lines the kernel wrote to its own stderr (startup errors land there).
    pub(crate) fn stderr_tail(&self) -> String {
        self.stderr_tail
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .trim()
            .to_owned()
    }
}

impl Drop for KernelProcess {
    fn drop(&mut self) {
        // Replaced or dropped at shutdown: nothing of this kernel may outlive its handle.
        self.kill.cancel();
    }
}

/// After the kernel is reaped, how long its stderr may take to be read to its end (a process it started
/// may still hold the pipe open).
const STDERR_SETTLE: Duration = Duration::from_millis(500);

/// How to add what IPython needs to an image (the end of both errors below).
const HOW_TO_ADD: &str = "add it to the image (Debian, Ubuntu: apt-get install python3-ipykernel; \
    elsewhere: pip install ipykernel), or point MENTIS_KERNEL_PYTHON at a python that has it";

/// The error of an image with no python to run the kernel.
pub(crate) fn no_python(python: &Path) -> String {
    format!(
        "IPython cells need python3 with the ipykernel module, and this image has no {} on its PATH: \
         {HOW_TO_ADD}",
        python.display()
    )
}

/// The error of a kernel that could not start, when its stderr says why in a way we can explain: a python
/// without ipykernel.
pub(crate) fn explain_start_failure(python: &Path, stderr: &str) -> Option<String> {
    stderr.contains("No module named ipykernel").then(|| {
        format!(
            "IPython cells need python3 with the ipykernel module, and {} has no ipykernel: {HOW_TO_ADD}",
            python.display()
        )
    })
}

/// The kernel as user code (see `enter`): the OOM killer's first choice, as the sandbox user, at the
/// executor's priority (it must answer the executor's messages and interrupts promptly; CPU fairness already
/// leaves the executor its share next to one busy kernel).
fn command(launch: &Launch<'_>, connection_file: &Path) -> std::io::Result<Command> {
    let path = enter::path_of([launch.env.get("PATH")]);
    let mut command = enter::command(
        launch.python.as_os_str(),
        launch.workspace,
        path.as_deref(),
        Priority::Kept,
    )?;
    command
        .arg("-m")
        .arg("ipykernel_launcher")
        .arg("-f")
        .arg(connection_file)
        // History in memory: no sqlite file in a home directory that may be read-only or shared.
        .arg("--HistoryManager.hist_file=:memory:")
        .env_remove(TOKEN_ENV)
        // debugpy (loaded by ipykernel) otherwise warns about frozen modules at every start.
        .env("PYDEVD_DISABLE_FILE_VALIDATION", "1")
        // The image sets MPLBACKEND=Agg for headless scripts; in a cell a plot should come back as
        // display_data (image/png), which is what the inline backend does. A sandbox env may override.
        .env("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        .envs(launch.env)
        // Its own group: SIGINT and SIGKILL reach everything the kernel started.
        .process_group(0)
        // Nothing may wait on a terminal: input() in a cell fails at once (allow_stdin is off).
        .stdin(Stdio::null())
        // Cell output travels over iopub (ipykernel captures fds 1 and 2 itself); what reaches the
        // real fds is the kernel's own logging.
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    Ok(command)
}

/// Waits for the kernel to exit (or kills its group when asked or at shutdown), reaps it, and reports.
async fn watch_exit(
    mut child: Child,
    pgid: i32,
    kill: CancellationToken,
    shutdown: CancellationToken,
    report: watch::Sender<Option<Exit>>,
) {
    // Armed until the kernel is reaped: if this task is dropped first (the runtime torn down without a
    // graceful shutdown), the guard kills the group, so no kernel outlives the executor.
    let mut group = ProcessGroup::new(pgid);
    let killed = tokio::select! {
        status = child.wait() => {
            let exit = Exit::from_status(status);
            tracing::warn!(%exit, "the kernel process ended");
            // The rest of its group (forked children, subprocesses) goes with it. The group id cannot have
            // been handed out again: Linux keeps a pid reserved while it names a live group, and pids are
            // allocated cyclically, so the just-freed leader pid is not reused in this instant.
            group.kill();
            group.disarm();
            let _ = report.send(Some(exit));
            return;
        }
        () = kill.cancelled() => "replaced",
        () = shutdown.cancelled() => "executor shutdown",
    };
    // The leader is not reaped yet, so the group id is certainly still ours.
    group.kill();
    let exit = Exit::from_status(child.wait().await);
    group.disarm();
    tracing::info!(%exit, why = killed, "kernel killed");
    let _ = report.send(Some(exit));
}

/// Logs the kernel's stderr and keeps its tail; stops at EOF or shutdown (a process that escaped the group
/// may hold the pipe open forever). Reads bytes, not lines: the kernel must never block on (or get EPIPE
/// from) its stderr because of a long line or invalid UTF-8.
async fn drain_stderr(
    mut stderr: ChildStderr,
    tail: Arc<Mutex<String>>,
    shutdown: CancellationToken,
) {
    let mut buf = vec![0u8; 8 * 1024];
    loop {
        let read = tokio::select! {
            read = stderr.read(&mut buf) => read,
            () = shutdown.cancelled() => return,
        };
        let n = match read {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let text = String::from_utf8_lossy(&buf[..n]);
        tracing::debug!(output = %text.trim_end(), "kernel stderr");
        let mut tail = tail.lock().unwrap_or_else(PoisonError::into_inner);
        tail.push_str(&text);
        if tail.len() > STDERR_TAIL {
            let mut cut = tail.len() - STDERR_TAIL;
            while !tail.is_char_boundary(cut) {
                cut += 1;
            }
            tail.drain(..cut);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exits_name_their_signal() {
        assert_eq!(
            Exit::Signal(9).to_string(),
            "was killed by signal 9 (SIGKILL)"
        );
        assert_eq!(Exit::Code(1).to_string(), "exited with status 1");
        let mut details = BTreeMap::new();
        Exit::Signal(11).details(&mut details);
        assert_eq!(details["signal"], "11");
        assert!(details["exit"].contains("SIGSEGV"));
    }
}
