//! The executor's own threads: a tokio runtime whose every thread is started up front and kept, so that
//! user code filling the sandbox's pids limit (a fork bomb) cannot starve the executor.
//!
//! Threads count against the pids limit like processes. Tokio starts its workers when the runtime is built,
//! but blocking threads (behind `tokio::fs`, used by shell actions, the kernel's start and file calls) only
//! on demand, and lets an idle one go after 10 s. With the limit full, a `spawn_blocking` that finds no
//! blocking thread alive cannot start one and panics ("OS can't spawn worker thread"): the action's task
//! died, its stream ended without a terminal, and file calls failed with h2 errors. So a few blocking
//! threads start with the runtime and never retire. Beyond them tokio still adds threads while the limit
//! allows; when it does not, a task waits in the queue for a started thread, because one exists.

use std::io;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use tokio::runtime::Runtime;

/// Scheduler threads. The executor's work is I/O and waiting; two keep one slow poll from stalling every
/// other call, and a fixed number keeps its share of a small pids limit small whatever the host's size.
pub const WORKER_THREADS: usize = 2;
/// Blocking threads started with the runtime and kept for its whole life. Blocking work is short (small
/// reads, metadata, file chunks): two keep it moving, and the executor's 1 + 2 + 2 threads leave most
/// of the smallest pids limit (16) to user code.
pub const WARM_BLOCKING_THREADS: usize = 2;
/// At most this many blocking threads (tokio's default, 512, would be a pids limit's worth).
pub const MAX_BLOCKING_THREADS: usize = 16;
/// How long an idle blocking thread is kept: for the executor's life (about a century).
const KEEP_ALIVE: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
/// The name of every runtime thread (at most 15 bytes: the kernel's limit for a thread's name).
pub const THREAD_NAME: &str = "mentis-rt";
/// Bound on waiting for the warm threads to start (a full pids limit at start must not hang it).
const WARM_UP_TIMEOUT: Duration = Duration::from_secs(5);

/// The executor's tokio runtime, with [`WARM_BLOCKING_THREADS`] blocking threads already running.
pub fn runtime() -> io::Result<Runtime> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .thread_name(THREAD_NAME)
        .worker_threads(WORKER_THREADS)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        .thread_keep_alive(KEEP_ALIVE)
        .enable_all()
        .build()?;
    let started = warm_up(&runtime, WARM_BLOCKING_THREADS);
    if started < WARM_BLOCKING_THREADS {
        tracing::warn!(
            started,
            wanted = WARM_BLOCKING_THREADS,
            "not every blocking thread started (the pids limit?); serving with fewer"
        );
    }
    Ok(runtime)
}

/// Starts `count` blocking threads: `count` tasks that each wait until all of them run, so each holds its
/// own thread. Returns how many met (fewer when a thread could not start within the bound).
fn warm_up(runtime: &Runtime, count: usize) -> usize {
    let met = Arc::new((Mutex::new(0usize), Condvar::new()));
    // Joined below: none outlives this call.
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..count {
        let met = Arc::clone(&met);
        tasks.spawn_blocking_on(
            move || {
                let (arrived, all) = &*met;
                let mut arrived = arrived.lock().unwrap_or_else(PoisonError::into_inner);
                *arrived += 1;
                all.notify_all();
                let (arrived, _) = all
                    .wait_timeout_while(arrived, WARM_UP_TIMEOUT, |n| *n < count)
                    .unwrap_or_else(PoisonError::into_inner);
                *arrived
            },
            runtime.handle(),
        );
    }
    runtime.block_on(async {
        let mut met = 0;
        while let Some(task) = tasks.join_next().await {
            met = met.max(task.unwrap_or(0));
        }
        met
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// Threads of this process named like the runtime's (no other test builds this runtime).
    fn runtime_threads() -> usize {
        std::fs::read_dir("/proc/self/task")
            .unwrap()
            .filter(|t| {
                let comm = std::fs::read_to_string(t.as_ref().unwrap().path().join("comm"));
                comm.is_ok_and(|c| c.trim_end() == THREAD_NAME)
            })
            .count()
    }

    #[test]
    fn every_thread_is_started_up_front() {
        let runtime = runtime().unwrap();
        // Exact: the warm-up's tasks all ran at once, so each holds a thread of its own. (Whether a later
        // task reuses a warm thread is tokio's business and racy: a thread counts as idle again only after
        // its task's waiter woke, so a task sent right after may start one more, which a loaded CI saw.)
        assert_eq!(runtime_threads(), WORKER_THREADS + WARM_BLOCKING_THREADS);
        drop(runtime);
    }
}
