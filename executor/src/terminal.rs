//! Terminals (docs/ARCHITECTURE.md, "Terminals"): a program on a real pseudo-terminal, in its own session
//! and process group, started as user code like every user process (see `enter`). Its output goes into a bounded
//! scrollback ([`screen`]) that every attached stream follows from its own cursor; input, resize and
//! signals come from any attached stream. A terminal outlives its streams: it ends when its program exits,
//! when it is closed, when it has had no stream for its idle timeout, or when the executor shuts down.

pub(crate) mod screen;

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::str::FromStr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use bytes::BytesMut;
use mentis_model::terminal::{Size, TerminalSpec};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::TOKEN_ENV;
use crate::enter::{self, Priority};
use crate::error::Error;
use crate::reclaim::procfs;
use screen::Screen;
pub(crate) use screen::{Cursor, Event, Exit};

/// What a terminal reads from its pty at once (and so the largest output chunk).
const READ_CHUNK: usize = 32 * 1024;
/// After the program exits, how long output still written to the terminal (by the program's last writes,
/// or a background job holding the terminal) is read before the terminal is done.
const DRAIN_AFTER_EXIT: Duration = Duration::from_millis(300);
/// Between SIGHUP and SIGKILL when a terminal is closed.
const HANGUP_GRACE: Duration = Duration::from_secs(1);
/// How often a terminal looks at whether it has been idle too long.
const IDLE_CHECK: Duration = Duration::from_secs(1);
/// How long an exited terminal is kept for a client to attach and read its end.
const EXITED_KEPT: Duration = Duration::from_secs(300);

/// Settings the control plane sends with each start.
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// The sandbox's env, under the terminal's own.
    pub(crate) sandbox_env: HashMap<String, String>,
    pub(crate) max_terminals: usize,
    pub(crate) default_idle_timeout: Duration,
    pub(crate) scrollback_bytes: usize,
}

/// One terminal.
pub(crate) struct Terminal {
    pub(crate) id: String,
    pub(crate) command: Vec<String>,
    /// Its program's pid, which leads its session.
    pub(crate) pid: i32,
    pub(crate) created: SystemTime,
    screen: Arc<Screen>,
    /// The pty's writing half: input.
    input: tokio::sync::Mutex<pty_process::OwnedWritePty>,
    /// The pty itself (a second descriptor), for resize and the foreground group while input waits.
    control: OwnedFd,
    size: Mutex<Size>,
    /// Streams attached now.
    attached: AtomicU32,
    /// When the last stream left (or the terminal started).
    idle_since: Mutex<Instant>,
    idle_timeout: Duration,
    /// Cancelled to hang the terminal up (close, idle, executor shutdown).
    hangup: CancellationToken,
}

impl std::fmt::Debug for Terminal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminal")
            .field("id", &self.id)
            .field("pid", &self.pid)
            .finish_non_exhaustive()
    }
}

/// A stream attached to a terminal: reads its output from a cursor; counts as attached until dropped.
#[derive(Debug)]
pub(crate) struct Attached {
    pub(crate) terminal: Arc<Terminal>,
    pub(crate) cursor: Cursor,
}

impl Drop for Attached {
    fn drop(&mut self) {
        if self.terminal.attached.fetch_sub(1, Ordering::AcqRel) == 1 {
            *lock(&self.terminal.idle_since) = Instant::now();
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Terminal {
    /// Attaches a stream after `after_seq` (0 = the whole scrollback). Beyond the newest seq is OUT_OF_RANGE.
    pub(crate) fn attach(self: &Arc<Self>, after_seq: u64) -> Result<Attached, Error> {
        let last = self.screen.last_seq();
        if after_seq > last {
            return Err(Error::OutOfRange(format!(
                "after_seq {after_seq} is beyond terminal {}'s newest output seq {last}",
                self.id
            )));
        }
        self.attached.fetch_add(1, Ordering::AcqRel);
        Ok(Attached {
            terminal: Arc::clone(self),
            cursor: self.screen.follow(after_seq),
        })
    }

    pub(crate) fn last_seq(&self) -> u64 {
        self.screen.last_seq()
    }

    pub(crate) fn exited(&self) -> Option<Exit> {
        self.screen.exited()
    }

    pub(crate) fn size(&self) -> Size {
        *lock(&self.size)
    }

    pub(crate) fn attached(&self) -> u32 {
        self.attached.load(Ordering::Acquire)
    }

    /// Types `data` into the terminal. Waits while the program does not read (the pty's buffer is full);
    /// input to a terminal whose program ended goes nowhere.
    pub(crate) async fn input(&self, data: &[u8]) -> Result<(), Error> {
        if self.exited().is_some() {
            return Ok(());
        }
        let mut input = self.input.lock().await;
        match input.write_all(data).await {
            Ok(()) => Ok(()),
            // EIO: the other side is gone (the program ended while we wrote).
            Err(e) if e.raw_os_error() == Some(nix::libc::EIO) => Ok(()),
            Err(e) => Err(Error::Io {
                context: format!("writing to terminal {}", self.id),
                source: e,
            }),
        }
    }

    /// Sets the size; the kernel sends SIGWINCH to the terminal's foreground process group.
    pub(crate) fn resize(&self, size: Size) -> Result<(), Error> {
        let winsize = rustix::termios::Winsize {
            ws_row: size.rows,
            ws_col: size.cols,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        match rustix::termios::tcsetwinsize(self.control.as_fd(), winsize) {
            Ok(()) => {
                *lock(&self.size) = size;
                Ok(())
            }
            Err(e) if self.exited().is_some() => {
                tracing::debug!(error = %e, "resize of an ended terminal");
                Ok(())
            }
            Err(e) => Err(Error::Io {
                context: format!("resizing terminal {}", self.id),
                source: e.into(),
            }),
        }
    }

    /// Sends `name` (checked: see `mentis_model::terminal::signal_name`) to the terminal's foreground
    /// process group: what has the terminal now (the program, or a job the shell runs).
    pub(crate) fn signal(&self, name: &str) -> Result<(), Error> {
        let signal = Signal::from_str(&format!("SIG{name}"))
            .map_err(|_| Error::InvalidArgument(format!("unknown signal {name}")))?;
        if self.exited().is_some() {
            return Ok(());
        }
        let group = rustix::termios::tcgetpgrp(self.control.as_fd())
            .map(|pid| pid.as_raw_nonzero().get())
            .unwrap_or(self.pid);
        match killpg(Pid::from_raw(group), signal) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => Ok(()),
            Err(e) => Err(Error::Io {
                context: format!("signalling terminal {}", self.id),
                source: e.into(),
            }),
        }
    }

    fn idle_expired(&self) -> bool {
        self.attached() == 0 && lock(&self.idle_since).elapsed() >= self.idle_timeout
    }
}

/// Every terminal of the sandbox.
pub(crate) struct Terminals {
    by_id: Mutex<HashMap<String, Arc<Terminal>>>,
    workspace: Arc<Path>,
    /// Cancelled when the executor shuts down: every terminal hangs up.
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Terminals {
    pub(crate) fn new(workspace: Arc<Path>, shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(Self {
            by_id: Mutex::new(HashMap::new()),
            workspace,
            shutdown,
            tracker: TaskTracker::new(),
        })
    }

    /// Starts a terminal.
    pub(crate) async fn start(
        self: &Arc<Self>,
        spec: TerminalSpec,
        settings: Settings,
    ) -> Result<Arc<Terminal>, Error> {
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        let dir = crate::shell::work_dir(&self.workspace, &spec.work_dir)
            .map_err(Error::FailedPrecondition)?;
        // Counted and registered under one lock, so two starts cannot both take the last place.
        let mut by_id = lock(&self.by_id);
        let running = by_id.values().filter(|t| t.exited().is_none()).count();
        if running >= settings.max_terminals {
            return Err(Error::TooManyTerminals {
                limit: settings.max_terminals,
            });
        }
        let program = command(&spec, &settings, &dir)?;
        let (pty, pts) =
            pty_process::open().map_err(|e| pty_error("opening a pseudo-terminal", e))?;
        pty.resize(pty_process::Size::new(spec.size.rows, spec.size.cols))
            .map_err(|e| pty_error("sizing the pseudo-terminal", e))?;
        let control = pty
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| Error::Io {
                context: "duplicating the pseudo-terminal".to_owned(),
                source,
            })?;
        let child = program.spawn(pts).map_err(|e| match e {
            pty_process::Error::Io(e) => {
                Error::FailedPrecondition(format!("cannot start {}: {e}", spec.command[0]))
            }
            e => pty_error("starting the terminal's program", e),
        })?;
        let pid = child
            .id()
            .and_then(|pid| i32::try_from(pid).ok())
            .ok_or_else(|| Error::Unavailable("the terminal's program has no pid".to_owned()))?;
        let (reader, writer) = pty.into_split();
        let id = format!("term-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let terminal = Arc::new(Terminal {
            id: id.clone(),
            command: spec.command.clone(),
            pid,
            created: SystemTime::now(),
            screen: Screen::new(settings.scrollback_bytes.max(READ_CHUNK)),
            input: tokio::sync::Mutex::new(writer),
            control,
            size: Mutex::new(spec.size),
            attached: AtomicU32::new(0),
            idle_since: Mutex::new(Instant::now()),
            idle_timeout: spec.idle_timeout.unwrap_or(settings.default_idle_timeout),
            hangup: self.shutdown.child_token(),
        });
        // Exited terminals beyond as many as may run are forgotten, oldest first.
        let mut exited: Vec<_> = by_id
            .values()
            .filter(|t| t.exited().is_some())
            .map(|t| (t.created, t.id.clone()))
            .collect();
        exited.sort();
        let excess = exited.len().saturating_sub(settings.max_terminals);
        for (_, old) in exited.into_iter().take(excess) {
            by_id.remove(&old);
        }
        by_id.insert(id.clone(), Arc::clone(&terminal));
        drop(by_id);
        tracing::info!(terminal_id = %id, pid, command = ?spec.command, "terminal started");
        self.tracker
            .spawn(Arc::clone(self).supervise(Arc::clone(&terminal), child, reader));
        Ok(terminal)
    }

    pub(crate) fn get(&self, id: &str) -> Result<Arc<Terminal>, Error> {
        lock(&self.by_id)
            .get(id)
            .cloned()
            .ok_or_else(|| Error::TerminalNotFound(id.to_owned()))
    }

    /// Every terminal, oldest first.
    pub(crate) fn list(&self) -> Vec<Arc<Terminal>> {
        let mut all: Vec<_> = lock(&self.by_id).values().cloned().collect();
        all.sort_by_key(|t| t.created);
        all
    }

    /// Hangs a terminal up; one that already exited is forgotten.
    pub(crate) fn close(&self, id: &str) -> Result<(), Error> {
        let terminal = self.get(id)?;
        if terminal.exited().is_some() {
            lock(&self.by_id).remove(id);
        } else {
            terminal.hangup.cancel();
        }
        Ok(())
    }

    /// Waits (at most `grace`) for every terminal to end after the shutdown token was cancelled.
    pub(crate) async fn shutdown(&self, grace: Duration) {
        self.tracker.close();
        let _ = tokio::time::timeout(grace, self.tracker.wait()).await;
    }

    /// The terminal's life: output into the scrollback until the program exits, hang-up on close, idle or
    /// shutdown, then the exit recorded and, a while later, the terminal forgotten.
    async fn supervise(
        self: Arc<Self>,
        terminal: Arc<Terminal>,
        mut child: tokio::process::Child,
        mut reader: pty_process::OwnedReadPty,
    ) {
        let screen = Arc::clone(&terminal.screen);
        let pump = async move {
            let mut buf = BytesMut::with_capacity(READ_CHUNK);
            loop {
                buf.reserve(READ_CHUNK);
                match reader.read_buf(&mut buf).await {
                    // EOF, or EIO once no process holds the terminal any more.
                    Ok(0) | Err(_) => break,
                    Ok(_) => {
                        screen.push(buf.split().freeze());
                    }
                }
            }
        };
        tokio::pin!(pump);
        let mut pump_done = false;
        let mut idle = tokio::time::interval(IDLE_CHECK);
        let mut hung_up: Option<Instant> = None;
        let status = loop {
            let kill_at = hung_up.map(|at| at + HANGUP_GRACE);
            tokio::select! {
                status = child.wait() => break status,
                () = &mut pump, if !pump_done => pump_done = true,
                () = terminal.hangup.cancelled(), if hung_up.is_none() => {
                    tracing::info!(terminal_id = %terminal.id, "terminal hung up");
                    signal_session(terminal.pid, Signal::SIGHUP);
                    hung_up = Some(Instant::now());
                }
                () = async { tokio::time::sleep_until(kill_at.unwrap_or_else(Instant::now)).await },
                    if kill_at.is_some() => {
                    signal_session(terminal.pid, Signal::SIGKILL);
                    hung_up = Some(Instant::now() + Duration::from_secs(3600));
                }
                _ = idle.tick() => {
                    if terminal.idle_expired() && !terminal.hangup.is_cancelled() {
                        tracing::info!(terminal_id = %terminal.id, "terminal idle too long");
                        terminal.hangup.cancel();
                    }
                }
            }
        };
        if !pump_done {
            let _ = tokio::time::timeout(DRAIN_AFTER_EXIT, &mut pump).await;
        }
        if hung_up.is_some() {
            // Closed: nothing of its session stays behind.
            signal_session(terminal.pid, Signal::SIGKILL);
        }
        let exit = match status {
            Ok(status) => {
                let (code, signal) = crate::shell::process::code_and_signal(status);
                Exit { code, signal }
            }
            Err(e) => {
                tracing::warn!(terminal_id = %terminal.id, error = %e, "cannot read a terminal's exit status");
                Exit {
                    code: -1,
                    signal: 0,
                }
            }
        };
        tracing::info!(terminal_id = %terminal.id, code = exit.code, signal = exit.signal, "terminal exited");
        terminal.screen.exit(exit);
        // Kept a while for a client to come back and read the end; not past the executor's shutdown.
        tokio::select! {
            () = tokio::time::sleep(EXITED_KEPT) => {}
            () = self.shutdown.cancelled() => {}
        }
        let mut by_id = lock(&self.by_id);
        if by_id
            .get(&terminal.id)
            .is_some_and(|t| Arc::ptr_eq(t, &terminal))
        {
            by_id.remove(&terminal.id);
        }
    }
}

/// The terminal's program: its argv, env over the sandbox's, in its work dir, as user code (see `enter`);
/// pty-process makes it lead a new session whose controlling terminal is the pty.
fn command(
    spec: &TerminalSpec,
    settings: &Settings,
    dir: &Path,
) -> Result<pty_process::Command, Error> {
    let program = std::ffi::OsStr::new(&spec.command[0]);
    let path = enter::path_of([spec.env.get("PATH"), settings.sandbox_env.get("PATH")]);
    let mut command = enter::command(program, dir, path.as_deref(), Priority::Lowered)
        .map_err(|e| Error::FailedPrecondition(format!("cannot start {}: {e}", spec.command[0])))?;
    command
        .args(&spec.command[1..])
        .env_remove(TOKEN_ENV)
        .env("TERM", "xterm-256color")
        .envs(&settings.sandbox_env)
        .envs(&spec.env)
        .kill_on_drop(false);
    Ok(pty_process::Command::from(command))
}

/// `signal` to every process of the session `sid` leads (its process groups: the shell's jobs too).
fn signal_session(sid: i32, signal: Signal) {
    let _ = killpg(Pid::from_raw(sid), signal);
    for proc in procfs::scan(Path::new("/proc")) {
        if proc.session == sid && !proc.dead {
            let _ = kill(Pid::from_raw(proc.pid), signal);
        }
    }
}

fn pty_error(context: &str, e: pty_process::Error) -> Error {
    Error::Io {
        context: context.to_owned(),
        source: match e {
            pty_process::Error::Io(e) => e,
            pty_process::Error::Rustix(e) => e.into(),
            e => std::io::Error::other(e.to_string()),
        },
    }
}
