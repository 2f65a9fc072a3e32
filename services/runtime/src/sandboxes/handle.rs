//! One sandbox as the runtime holds it: its record, its observation log, its executor client and the
//! table of its actions.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use mentis_core::{ActionId, Error, ObservationKind, Sandbox, SandboxId, SandboxState, SpaceId};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::executor_client::ExecutorClient;
use crate::observations::ObservationLog;

/// Finished action ids remembered for duplicate detection, per sandbox.
const REMEMBERED_FINISHED: usize = 10_000;

#[derive(Debug)]
struct ActionEntry {
    running: bool,
    /// Digest of the submitted action: a retry must match it.
    fingerprint: u64,
    /// The action's observations come after this seq.
    after_seq: u64,
}

#[derive(Debug, Default)]
struct ActionTable {
    entries: HashMap<ActionId, ActionEntry>,
    finished: VecDeque<ActionId>,
    running: usize,
}

/// Outcome of registering a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reserved {
    /// A new action: start it.
    New { after_seq: u64 },
    /// A retry of an accepted submission: do not run it again, follow its observations.
    Known { after_seq: u64 },
}

/// What the table knows of an action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActionStatus {
    Unknown,
    Running,
    Finished,
}

/// A sandbox held by the runtime.
pub struct SandboxHandle {
    pub id: SandboxId,
    record: Mutex<Sandbox>,
    /// The sandbox's env, applied to every action.
    pub env: BTreeMap<String, String>,
    pub log: Arc<ObservationLog>,
    /// The executor's client; replaced when the executor comes back at a new address.
    executor: Mutex<Option<ExecutorClient>>,
    /// The secret the executor requires (kept to reconnect after a restart). Never logged.
    pub(crate) token: String,
    actions: Mutex<ActionTable>,
    /// Owns the action pumps of this sandbox.
    pub tasks: TaskTracker,
    /// Cancelled when the sandbox is deleted: every pump then writes its LOST terminal and stops.
    pub cancel: CancellationToken,
    /// The record changed since the store last saw it.
    dirty: AtomicBool,
    /// The newest seq the store has.
    pub(crate) stored_seq: AtomicU64,
    /// Serialises pause, resume and delete of this sandbox.
    pub(crate) lifecycle: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for SandboxHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxHandle")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // Every critical section here is a few field updates that cannot leave the data half-written.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl SandboxHandle {
    pub fn new(
        record: Sandbox,
        env: BTreeMap<String, String>,
        log: Arc<ObservationLog>,
        token: String,
    ) -> Self {
        Self {
            id: record.id,
            record: Mutex::new(record),
            env,
            log,
            executor: Mutex::new(None),
            token,
            actions: Mutex::new(ActionTable::default()),
            tasks: TaskTracker::new(),
            cancel: CancellationToken::new(),
            dirty: AtomicBool::new(false),
            stored_seq: AtomicU64::new(0),
            lifecycle: tokio::sync::Mutex::new(()),
        }
    }

    /// Logs a sandbox-level `agent_state` observation (no action id).
    pub fn agent_state(&self, message: impl Into<String>, details: &[(&str, &str)]) {
        self.log.append(
            None,
            ObservationKind::AgentState {
                message: message.into(),
                details: details
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            },
        );
    }

    /// Marks activity now (an action, a file call): the idle timeout starts again.
    pub fn touch(&self) {
        lock(&self.record).last_activity = SystemTime::now();
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// Whether the record changed since the last call (and clears the mark).
    pub(crate) fn take_dirty(&self) -> bool {
        self.dirty.swap(false, Ordering::AcqRel)
    }

    /// A copy of the record.
    pub fn snapshot(&self) -> Sandbox {
        lock(&self.record).clone()
    }

    /// The space the sandbox belongs to.
    pub fn space_id(&self) -> SpaceId {
        lock(&self.record).space_id.clone()
    }

    /// Whether the sandbox is live (not TERMINATED or FAILED) and in `space`.
    pub fn is_live_in(&self, space: &SpaceId) -> bool {
        let r = lock(&self.record);
        !r.state.is_final() && &r.space_id == space
    }

    /// Whether the sandbox is live, in `space`, and carries the client key `key`.
    pub fn is_live_with_key(&self, space: &SpaceId, key: &str) -> bool {
        let r = lock(&self.record);
        !r.state.is_final() && &r.space_id == space && r.external_key.as_deref() == Some(key)
    }

    pub fn state(&self) -> SandboxState {
        lock(&self.record).state
    }

    /// Moves to `state`, with a reason when there is one worth telling.
    pub fn set_state(&self, state: SandboxState, reason: impl Into<String>) {
        let mut r = lock(&self.record);
        r.state = state;
        r.state_reason = reason.into();
        r.updated_at = SystemTime::now();
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// Moves to TERMINATING unless already final; returns the state it was in.
    pub fn begin_termination(&self) -> SandboxState {
        let mut r = lock(&self.record);
        let before = r.state;
        if !before.is_final() {
            r.state = SandboxState::Terminating;
            r.updated_at = SystemTime::now();
            self.dirty.store(true, Ordering::Relaxed);
        }
        before
    }

    pub fn set_executor(&self, client: ExecutorClient) {
        *lock(&self.executor) = Some(client);
    }

    /// The executor's client, whatever the state.
    pub fn executor(&self) -> Option<ExecutorClient> {
        lock(&self.executor).clone()
    }

    /// Moves from one of `from` to `to`; false (and no change) when the sandbox is in another state.
    pub fn transition(
        &self,
        from: &[SandboxState],
        to: SandboxState,
        reason: impl Into<String>,
    ) -> bool {
        let mut r = lock(&self.record);
        if !from.contains(&r.state) {
            return false;
        }
        r.state = to;
        r.state_reason = reason.into();
        r.updated_at = SystemTime::now();
        self.dirty.store(true, Ordering::Relaxed);
        true
    }

    /// The executor client of a RUNNING sandbox; FailedPrecondition in any other state.
    pub fn running_executor(&self) -> Result<ExecutorClient, Error> {
        let state = self.state();
        if state == SandboxState::Unhealthy {
            return Err(Error::Unavailable(format!(
                "the executor of sandbox {} does not answer; the runtime is bringing it back",
                self.id
            )));
        }
        if state != SandboxState::Running {
            return Err(Error::FailedPrecondition(format!(
                "sandbox {} is {}, not RUNNING",
                self.id,
                state_name(state)
            )));
        }
        self.executor().ok_or_else(|| {
            Error::Internal(format!(
                "sandbox {} is RUNNING without an executor",
                self.id
            ))
        })
    }

    /// Registers a new action and returns the seq after which its observations appear. A retry of a known
    /// submission (same id, same action) is not registered again: `Reserved::Known` tells where its
    /// observations start. The same id with another action is AlreadyExists.
    pub fn reserve_action(
        &self,
        id: &ActionId,
        fingerprint: u64,
        max_running: usize,
    ) -> Result<Reserved, Error> {
        let mut t = lock(&self.actions);
        if let Some(e) = t.entries.get(id) {
            if e.fingerprint == fingerprint {
                return Ok(Reserved::Known {
                    after_seq: e.after_seq,
                });
            }
            return Err(Error::AlreadyExists(format!(
                "action id {id} is already used in this sandbox by another action"
            )));
        }
        if t.running >= max_running {
            return Err(Error::ResourceExhausted(format!(
                "sandbox {} already runs {max_running} actions (MENTIS_MAX_ACTIONS_PER_SANDBOX)",
                self.id
            )));
        }
        // Taken under the table's lock, so no observation of this action can precede it.
        let after_seq = self.log.last_seq();
        t.entries.insert(
            id.clone(),
            ActionEntry {
                running: true,
                fingerprint,
                after_seq,
            },
        );
        t.running += 1;
        Ok(Reserved::New { after_seq })
    }

    /// Forgets an action that was never accepted.
    pub fn unreserve_action(&self, id: &ActionId) {
        let mut t = lock(&self.actions);
        if let Some(e) = t.entries.remove(id)
            && e.running
        {
            t.running -= 1;
        }
    }

    /// Marks an action finished (its terminal observation is in the log).
    /// Actions running now.
    pub fn running_actions(&self) -> usize {
        lock(&self.actions).running
    }

    pub fn finish_action(&self, id: &ActionId) {
        // The end of an action is activity too: the idle timeout counts from here.
        self.touch();
        let mut t = lock(&self.actions);
        let was_running = match t.entries.get_mut(id) {
            Some(e) if e.running => {
                e.running = false;
                true
            }
            _ => false,
        };
        if was_running {
            t.running -= 1;
            t.finished.push_back(id.clone());
            while t.finished.len() > REMEMBERED_FINISHED {
                if let Some(old) = t.finished.pop_front() {
                    t.entries.remove(&old);
                }
            }
        }
    }

    /// Where a known submission's observations start, when `fingerprint` matches it.
    pub fn known_action(&self, id: &ActionId, fingerprint: u64) -> Option<u64> {
        lock(&self.actions)
            .entries
            .get(id)
            .filter(|e| e.fingerprint == fingerprint)
            .map(|e| e.after_seq)
    }

    pub fn action_status(&self, id: &ActionId) -> ActionStatus {
        match lock(&self.actions).entries.get(id) {
            None => ActionStatus::Unknown,
            Some(e) if e.running => ActionStatus::Running,
            Some(_) => ActionStatus::Finished,
        }
    }
}

/// The public name of a state, for messages.
pub fn state_name(s: SandboxState) -> &'static str {
    match s {
        SandboxState::Creating => "CREATING",
        SandboxState::Running => "RUNNING",
        SandboxState::Paused => "PAUSED",
        SandboxState::Terminating => "TERMINATING",
        SandboxState::Terminated => "TERMINATED",
        SandboxState::Failed => "FAILED",
        SandboxState::Unhealthy => "UNHEALTHY",
    }
}
