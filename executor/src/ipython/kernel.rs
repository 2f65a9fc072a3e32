//! One started kernel: its process and wire, started so that no early output is lost (iopub proven live
//! before the first execute), with the executor's helpers installed; and silent helper runs on it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use jupyter_protocol::ConnectionInfo;
use serde_json::Value;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::process::{Exit, KernelProcess, Launch};
use super::wire::Wire;
use crate::reclaim::Processes;

/// Installed silently at every start (rollback and inspect helpers).
const HELPERS: &str = include_str!("helpers.py");
/// How often the connection file is looked for while the kernel starts.
const POLL: Duration = Duration::from_millis(25);
/// How often kernel_info_request is repeated until iopub carries traffic.
const WARM_UP_EVERY: Duration = Duration::from_millis(250);

/// What starting a kernel needs, besides the env.
pub(crate) struct KernelSetup<'a> {
    pub(crate) python: &'a Path,
    pub(crate) workspace: &'a Path,
    pub(crate) start_timeout: Duration,
    pub(crate) tracker: &'a TaskTracker,
    pub(crate) shutdown: &'a CancellationToken,
    pub(crate) processes: &'a Arc<Processes>,
}

pub(crate) struct Kernel {
    pub(crate) process: KernelProcess,
    pub(crate) wire: Wire,
    /// Whether helpers.py installed (rollback and inspect need it).
    pub(crate) helpers: bool,
    /// The sandbox env the kernel's `os.environ` carries (what it was started with, or last given).
    pub(crate) env: HashMap<String, String>,
}

/// Why a silent run gave no reply.
#[derive(Debug)]
pub(crate) enum SilentError {
    TimedOut,
    Died(Exit),
    Wire(String),
}

impl std::fmt::Display for SilentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::TimedOut => f.write_str("the kernel did not answer in time"),
            Self::Died(exit) => write!(f, "the kernel {exit}"),
            Self::Wire(e) => f.write_str(e),
        }
    }
}

impl Kernel {
    /// Starts a kernel and waits until it is ready to run cells; on failure nothing is left running.
    pub(crate) async fn start(
        setup: &KernelSetup<'_>,
        env: &HashMap<String, String>,
    ) -> Result<Self, String> {
        let started = Instant::now();
        let deadline = started + setup.start_timeout;
        let process = KernelProcess::spawn(&Launch {
            python: setup.python,
            workspace: setup.workspace,
            env,
            tracker: setup.tracker,
            shutdown: setup.shutdown,
            processes: setup.processes,
        })
        .await?;
        let pid = process.pid();
        // At shutdown the half-started kernel is dropped, and dropping its process kills it.
        let ready = tokio::select! {
            ready = Self::connect(process, setup, deadline) => ready,
            () = setup.shutdown.cancelled() => return Err("the executor is shutting down".to_owned()),
        };
        let mut kernel = match ready {
            Ok(kernel) => kernel,
            Err((mut process, e)) => {
                let exit = process.kill().await;
                let tail = process.stderr_tail();
                tracing::warn!(pid, error = %e, %exit, stderr = %tail, "the kernel did not start");
                if let Some(why) = super::process::explain_start_failure(setup.python, &tail) {
                    return Err(why);
                }
                return Err(if tail.is_empty() {
                    e
                } else {
                    format!("{e}; its stderr ends with:\n{tail}")
                });
            }
        };
        match kernel.run_silent(HELPERS, None, setup.start_timeout).await {
            Ok(reply) if status(&reply) == "ok" => kernel.helpers = true,
            Ok(reply) => tracing::warn!(
                error = %error_text(&reply),
                "the executor's helpers did not install: rollback and inspect are off for this kernel"
            ),
            Err(e) => {
                kernel.process.kill().await;
                return Err(format!("the kernel did not run its setup: {e}"));
            }
        }
        kernel.env = env.clone();
        tracing::info!(pid, ready_after = ?started.elapsed(), "kernel ready");
        Ok(kernel)
    }

    /// Reads the connection file the kernel writes, connects, and proves iopub live. On failure the
    /// process is handed back, to be killed.
    async fn connect(
        process: KernelProcess,
        setup: &KernelSetup<'_>,
        deadline: Instant,
    ) -> Result<Self, (KernelProcess, String)> {
        let info = loop {
            if let Some(exit) = process.exited() {
                return Err((process, format!("the kernel {exit} while starting")));
            }
            if Instant::now() >= deadline {
                let e = format!(
                    "the kernel did not start within {} s",
                    setup.start_timeout.as_secs()
                );
                return Err((process, e));
            }
            // The kernel writes the file non-atomically: a partial file fails to parse and is read again.
            if let Ok(text) = tokio::fs::read_to_string(process.connection_file()).await
                && let Ok(info) = serde_json::from_str::<ConnectionInfo>(&text)
            {
                break info;
            }
            tokio::time::sleep(POLL).await;
        };
        let wire = match Wire::connect(&info, setup.tracker, setup.shutdown).await {
            Ok(wire) => wire,
            Err(e) => return Err((process, e)),
        };
        let mut kernel = Self {
            process,
            wire,
            helpers: false,
            env: HashMap::new(),
        };
        match kernel.warm_up(deadline).await {
            Ok(()) => Ok(kernel),
            Err(e) => Err((kernel.process, e)),
        }
    }

    /// ipykernel 6 publishes iopub on a PUB socket: messages sent before our subscription has reached it
    /// are dropped (the slow-joiner problem), and it sends no welcome. So ask for kernel_info until some
    /// iopub message arrives (its busy/idle status, or ipykernel 7's iopub_welcome): from then on nothing
    /// the kernel publishes is lost.
    async fn warm_up(&mut self, deadline: Instant) -> Result<(), String> {
        let mut ticks = tokio::time::interval(WARM_UP_EVERY);
        loop {
            tokio::select! {
                _ = ticks.tick() => {
                    self.wire.kernel_info().await?;
                }
                message = self.wire.iopub.recv() => {
                    return match message {
                        Some(_) => {
                            self.wire.discard_stale();
                            Ok(())
                        }
                        None => Err("the kernel's iopub channel closed".to_owned()),
                    };
                }
                exit = self.process.wait_exit() => {
                    return Err(format!("the kernel {exit} while starting"));
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err("the kernel did not answer on its sockets in time".to_owned());
                }
            }
        }
    }

    /// Whether the kernel still answers on both of its sockets: a kernel_info_request gets its reply on
    /// shell and its busy/idle status on iopub within `timeout`.
    pub(crate) async fn answers(&mut self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        self.wire.discard_stale();
        let msg_id = match tokio::time::timeout_at(deadline, self.wire.kernel_info()).await {
            Ok(Ok(msg_id)) => msg_id,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, "the kernel's shell socket refuses requests");
                return false;
            }
            Err(_) => return false,
        };
        let (mut replied, mut published) = (false, false);
        while !(replied && published) {
            tokio::select! {
                reply = self.wire.replies.recv() => match reply {
                    Some(reply) => replied |= reply.is_child_of(&msg_id),
                    None => return false,
                },
                message = self.wire.iopub.recv() => match message {
                    Some(message) => published |= message.is_child_of(&msg_id),
                    None => return false,
                },
                _ = self.process.wait_exit() => return false,
                () = tokio::time::sleep_until(deadline) => {
                    tracing::warn!(replied, published, "the kernel did not answer on both sockets");
                    return false;
                }
            }
        }
        true
    }

    /// Runs `code` silently (no execution count, no history, no pre/post_run_cell) and returns the
    /// execute_reply's content (user_expressions included).
    pub(crate) async fn run_silent(
        &mut self,
        code: &str,
        user_expressions: Option<HashMap<String, String>>,
        timeout: Duration,
    ) -> Result<Value, SilentError> {
        self.wire.discard_stale();
        let msg_id = self
            .wire
            .execute(code, true, user_expressions)
            .await
            .map_err(SilentError::Wire)?;
        let deadline = Instant::now() + timeout;
        loop {
            tokio::select! {
                reply = self.wire.replies.recv() => match reply {
                    Some(reply) if reply.msg_type == "execute_reply" && reply.is_child_of(&msg_id) => {
                        return Ok(reply.content);
                    }
                    Some(_) => {}
                    None => return Err(SilentError::Wire("the kernel's shell channel closed".to_owned())),
                },
                // Its iopub traffic (busy, idle) is not needed; keep the channel from filling up.
                Some(_) = self.wire.iopub.recv() => {}
                exit = self.process.wait_exit() => return Err(SilentError::Died(exit)),
                () = tokio::time::sleep_until(deadline) => return Err(SilentError::TimedOut),
            }
        }
    }
}

/// Python that makes the kernel's `os.environ` carry `new` instead of `old` (names of `old` missing from
/// `new` are removed), without leaving any name in the user's namespace. JSON string literals are valid
/// Python string literals, so the values need no other quoting.
pub(crate) fn env_sync_code(
    old: &HashMap<String, String>,
    new: &HashMap<String, String>,
) -> String {
    let removed: Vec<&String> = old.keys().filter(|k| !new.contains_key(*k)).collect();
    let literal = |json: String| serde_json::to_string(&json).unwrap_or_else(|_| "'[]'".into());
    let set = literal(serde_json::to_string(new).unwrap_or_else(|_| "{}".into()));
    let del = literal(serde_json::to_string(&removed).unwrap_or_else(|_| "[]".into()));
    format!(
        "(lambda o, j: ([o.environ.pop(k, None) for k in j.loads({del})], \
         o.environ.update(j.loads({set}))))(__import__('os'), __import__('json'))"
    )
}

/// A reply's status ("ok", "error", "aborted").
pub(crate) fn status(reply: &Value) -> &str {
    reply.get("status").and_then(Value::as_str).unwrap_or("")
}

/// "ename: evalue" of an error reply.
pub(crate) fn error_text(reply: &Value) -> String {
    let field = |name| reply.get(name).and_then(Value::as_str).unwrap_or("");
    format!("{}: {}", field("ename"), field("evalue"))
}
