//! One sandbox as the runtime holds it: its record, its observation log, its executor client and the
//! table of its actions.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use mentis_core::egress::Egress;
use mentis_core::lifecycle;
use mentis_core::observation::ActionKind;
use mentis_core::{
    ActionId, BackendSpec, Error, ObservationKind, Reason, Resource, Sandbox, SandboxId,
    SandboxState, SpaceId,
};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::executor_client::{ExecutorClient, Usage};
use crate::observations::ObservationLog;
use crate::store::Store;
use crate::store::actions::StoredAction;

/// How long an ending sandbox waits for its action pumps to write their terminal observations.
const PUMP_DRAIN: std::time::Duration = std::time::Duration::from_secs(10);

/// Finished actions remembered for duplicate detection, per sandbox, in the store: a retry of any of them
/// replays it, and another action under one of their ids is ALREADY_EXISTS.
const REMEMBERED_FINISHED: usize = 10_000;
/// The newest of those also kept in memory; the older ones are looked up in the store, so a sandbox that
/// runs actions for days holds no more memory than one that ran a few hundred.
const CACHED_FINISHED: usize = 128;
/// The store is trimmed back to `REMEMBERED_FINISHED` once it holds this many more.
const TRIM_SLACK: usize = 500;

#[derive(Debug)]
struct ActionEntry {
    running: bool,
    /// Digest of the submitted action: a retry must match it.
    fingerprint: u64,
    /// The action's observations come after this seq.
    after_seq: u64,
}

/// The running actions and the newest finished ones (the store has the rest).
#[derive(Debug, Default)]
struct ActionTable {
    entries: HashMap<ActionId, ActionEntry>,
    /// Finished actions in memory, oldest first.
    finished: VecDeque<ActionId>,
    running: usize,
    /// Finished actions the store holds for this sandbox (as far as this table knows).
    stored_finished: usize,
}

impl ActionTable {
    /// Moves an action to the finished ones, dropping the oldest beyond `CACHED_FINISHED` from memory.
    /// True when the store is due to be trimmed.
    fn finished(&mut self, id: ActionId) -> bool {
        self.finished.push_back(id);
        while self.finished.len() > CACHED_FINISHED {
            if let Some(old) = self.finished.pop_front() {
                self.entries.remove(&old);
            }
        }
        self.stored_finished += 1;
        if self.stored_finished > REMEMBERED_FINISHED + TRIM_SLACK {
            self.stored_finished = REMEMBERED_FINISHED;
            return true;
        }
        false
    }
}

/// How a submission relates to a known action.
fn known(
    sandbox: SandboxId,
    id: &ActionId,
    fingerprint: u64,
    known: u64,
    after_seq: u64,
) -> Result<Reserved, Error> {
    if known == fingerprint {
        return Ok(Reserved::Known { after_seq });
    }
    Err(Error::new(
        Reason::ActionIdReused,
        format!("action id {id} is already used in this sandbox by another action"),
    )
    .about(Resource::action(id))
    .about(Resource::sandbox(sandbox)))
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
    /// The record and the action table under one lock: a state change and the start of an action never
    /// interleave (a pause cannot begin while a submission is being admitted, nor the other way round).
    inner: Mutex<Inner>,
    /// The sandbox's env, applied to every action.
    pub(crate) env: BTreeMap<String, String>,
    pub(crate) log: Arc<ObservationLog>,
    /// The executor's client; replaced when the executor comes back at a new address.
    executor: Mutex<Option<ExecutorClient>>,
    /// The secret the executor requires (kept to reconnect after a restart). Never logged.
    pub(crate) token: String,
    /// Owns the action pumps of this sandbox.
    pub(crate) tasks: TaskTracker,
    /// Cancelled when the sandbox is deleted: every pump then writes its LOST terminal and stops.
    pub(crate) cancel: CancellationToken,
    /// The record changed since the store last saw it.
    dirty: AtomicBool,
    /// The newest seq the store has.
    pub(crate) stored_seq: AtomicU64,
    /// Serialises create, pause, resume and delete of this sandbox.
    pub(crate) lifecycle: Arc<tokio::sync::Mutex<()>>,
    /// Every state change is written through to it.
    store: Arc<Store>,
    /// Memory and CPU time in use at the last health check (read only with metrics on).
    usage: Mutex<Option<Usage>>,
    /// Woken when the backend says the sandbox's container or pod went: its health watch checks at once.
    pub(crate) gone_hint: tokio::sync::Notify,
}

/// What the lock of a handle guards.
#[derive(Debug)]
struct Inner {
    record: Sandbox,
    actions: ActionTable,
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
        store: Arc<Store>,
    ) -> Self {
        Self {
            id: record.id,
            inner: Mutex::new(Inner {
                record,
                actions: ActionTable::default(),
            }),
            env,
            log,
            executor: Mutex::new(None),
            token,
            tasks: TaskTracker::new(),
            cancel: CancellationToken::new(),
            dirty: AtomicBool::new(false),
            stored_seq: AtomicU64::new(0),
            lifecycle: Arc::new(tokio::sync::Mutex::new(())),
            store,
            usage: Mutex::new(None),
            gone_hint: tokio::sync::Notify::new(),
        }
    }

    /// Memory and CPU time in use at the last health check, when metrics asked for it.
    pub fn usage(&self) -> Option<Usage> {
        *lock(&self.usage)
    }

    /// Keeps what the last health check read.
    pub fn set_usage(&self, usage: Usage) {
        *lock(&self.usage) = Some(usage);
    }

    /// Moves the sandbox to `to` through the lifecycle table (FailedPrecondition naming the state when the
    /// table has no such move): stamps the time, records `reason`, appends the `agent_state` observation,
    /// writes the record through to the store and, on a final state, closes the log. Returns the state it
    /// left.
    pub fn enter(&self, to: SandboxState, reason: &str) -> Result<SandboxState, Error> {
        self.enter_if(to, reason, |_| Ok(()))
    }

    /// [`SandboxHandle::enter`], when `precondition` (given the state and the number of running actions,
    /// under the same lock that admits actions) agrees.
    pub fn enter_if(
        &self,
        to: SandboxState,
        reason: &str,
        precondition: impl FnOnce(&Now) -> Result<(), Error>,
    ) -> Result<SandboxState, Error> {
        let (from, message) = {
            let mut inner = lock(&self.inner);
            let from = inner.record.state;
            let m = lifecycle::check(self.id, from, to)?;
            precondition(&Now {
                state: from,
                running_actions: inner.actions.running,
            })?;
            let r = &mut inner.record;
            r.state = to;
            r.state_reason = reason.to_owned();
            r.updated_at = crate::clock::now();
            (from, m.message)
        };
        self.announce(message, to, reason);
        Ok(from)
    }

    /// Sets the state a restarted runtime found the sandbox in, outside the table (reconciliation: the
    /// record may say anything, the backend is the truth), and announces it like a move.
    pub(crate) fn reconcile(&self, to: SandboxState, reason: &str, message: &str) {
        {
            let mut inner = lock(&self.inner);
            let r = &mut inner.record;
            r.state = to;
            r.state_reason = reason.to_owned();
            r.updated_at = crate::clock::now();
        }
        self.announce(message, to, reason);
    }

    fn announce(&self, message: &str, to: SandboxState, reason: &str) {
        let mut details = vec![("state", to.name())];
        if !reason.is_empty() {
            details.push(("reason", reason));
        }
        self.agent_state(message, &details);
        self.persist();
        if to.is_final() {
            self.log.close();
        }
    }

    /// Tells every task of the sandbox (its action pumps, its health watch) to stop: each pump writes its
    /// LOST terminal. No new task starts after this.
    pub(crate) fn stop_tasks(&self) {
        self.cancel.cancel();
        self.tasks.close();
    }

    /// Waits (bounded) until the tasks told to stop by [`SandboxHandle::stop_tasks`] have, so their
    /// terminal observations are in the log before it closes.
    pub(crate) async fn tasks_stopped(&self) {
        if tokio::time::timeout(PUMP_DRAIN, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(sandbox_id = %self.id, "action pumps did not finish in time");
        }
    }

    /// Sets the sandbox's policy (the gateway reads it at its next connection or question). Another mode
    /// needs its networks changed first (`Sandboxes::update_egress`).
    pub fn set_egress(&self, egress: Egress) -> Result<Sandbox, Error> {
        {
            let mut inner = lock(&self.inner);
            let record = &mut inner.record;
            if record.state.is_final() {
                return Err(lifecycle::refuse(
                    self.id,
                    record.state,
                    "an update",
                    &[SandboxState::Running, SandboxState::Paused],
                ));
            }
            record.egress = egress;
            record.updated_at = crate::clock::now();
        }
        self.persist();
        Ok(self.snapshot())
    }

    /// Its address on the gateway's network changed (it joined or left it).
    pub fn set_gateway_source(&self, source: Option<std::net::IpAddr>) {
        if let Some(client) = lock(&self.executor).as_mut() {
            client.set_gateway_source(source);
        }
    }

    /// Writes the record to the store now, with the newest seq.
    pub(crate) fn persist(&self) {
        self.take_dirty();
        let seq = self.log.last_seq();
        match self.store.update_sandbox(&self.snapshot(), seq) {
            Ok(()) => self.stored_seq.store(seq, Ordering::Relaxed),
            Err(e) => {
                tracing::warn!(sandbox_id = %self.id, error = %e.chain(), "could not write a sandbox to the store")
            }
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
        lock(&self.inner).record.last_activity = crate::clock::now();
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// Whether the record changed since the last call (and clears the mark).
    pub(crate) fn take_dirty(&self) -> bool {
        self.dirty.swap(false, Ordering::AcqRel)
    }

    /// Marks the record changed (a write of it failed: the next flush tries again).
    pub(crate) fn mark_dirty(&self) {
        self.dirty.store(true, Ordering::Relaxed);
    }

    /// A copy of the record.
    pub fn snapshot(&self) -> Sandbox {
        lock(&self.inner).record.clone()
    }

    /// Where shell actions that name no directory start (its template's); empty: the workspace.
    pub fn work_dir(&self) -> String {
        lock(&self.inner).record.work_dir.clone()
    }

    /// The space the sandbox belongs to.
    pub fn space_id(&self) -> SpaceId {
        lock(&self.inner).record.space_id.clone()
    }

    /// Whether the sandbox is live (not TERMINATED or FAILED) and in `space`.
    pub fn is_live_in(&self, space: &SpaceId) -> bool {
        let r = &lock(&self.inner).record;
        !r.state.is_final() && &r.space_id == space
    }

    /// Whether the sandbox is live, in `space`, and carries the client key `key`.
    pub fn is_live_with_key(&self, space: &SpaceId, key: &str) -> bool {
        let r = &lock(&self.inner).record;
        !r.state.is_final() && &r.space_id == space && r.external_key.as_deref() == Some(key)
    }

    pub fn state(&self) -> SandboxState {
        lock(&self.inner).record.state
    }

    pub fn set_executor(&self, client: ExecutorClient) {
        *lock(&self.executor) = Some(client);
    }

    /// What the backend needs to make this sandbox (its create, or a resume by snapshot making it again).
    pub(crate) fn backend_spec(&self, config: &crate::config::RuntimeConfig) -> BackendSpec {
        let record = self.snapshot();
        BackendSpec {
            id: self.id,
            data_mounts: config.mounts_for(record.space_id.as_str()),
            space_id: Some(record.space_id),
            image: record.image,
            limits: record.limits,
            token: self.token.clone(),
            executor_env: Vec::new(),
            egress: record.egress.is_allow(),
            gateway: record.egress.mode() == mentis_core::egress::EgressMode::Rules,
            read_only_rootfs: record.read_only_rootfs,
            runtime_class: Some(record.runtime_class).filter(|c| !c.is_empty()),
        }
    }

    /// Forgets the executor's client (its sandbox no longer runs: paused by snapshot).
    pub fn clear_executor(&self) {
        *lock(&self.executor) = None;
    }

    /// The executor's client, whatever the state.
    pub fn executor(&self) -> Option<ExecutorClient> {
        lock(&self.executor).clone()
    }

    /// The executor client of a RUNNING sandbox; UNAVAILABLE while UNHEALTHY, FailedPrecondition in any
    /// other state.
    pub fn running_executor(&self) -> Result<ExecutorClient, Error> {
        not_running(self.id, self.state(), "this call")?;
        self.executor().ok_or_else(|| {
            Error::internal(format!(
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
        kind: ActionKind,
        fingerprint: u64,
        max_running: usize,
    ) -> Result<Reserved, Error> {
        let after_seq = self.reserve_in_table(id, fingerprint, max_running)?;
        let Reserved::New { after_seq } = after_seq else {
            return Ok(after_seq);
        };
        // Kept in the store, so a retry after a restart replays instead of running again.
        let stored = StoredAction {
            id: id.clone(),
            kind,
            fingerprint,
            after_seq,
            finished: false,
        };
        if let Err(e) = self.store.put_action(self.id, &stored) {
            self.unreserve_action(id);
            return Err(e);
        }
        Ok(Reserved::New { after_seq })
    }

    fn reserve_in_table(
        &self,
        id: &ActionId,
        fingerprint: u64,
        max_running: usize,
    ) -> Result<Reserved, Error> {
        // A retry is answered from the log whatever the state (the sandbox may have ended since).
        if let Some(e) = lock(&self.inner).actions.entries.get(id) {
            return known(self.id, id, fingerprint, e.fingerprint, e.after_seq);
        }
        // Not in memory: a finished action only the store still remembers? (Entries leave memory only
        // when they are finished and stored, or never accepted: nothing slips between the two looks.)
        if let Some(a) = self.store.action(self.id, id)? {
            return known(self.id, id, fingerprint, a.fingerprint, a.after_seq);
        }
        let mut inner = lock(&self.inner);
        let state = inner.record.state;
        let t = &mut inner.actions;
        if let Some(e) = t.entries.get(id) {
            return known(self.id, id, fingerprint, e.fingerprint, e.after_seq);
        }
        // Checked under the lock a pause takes to leave RUNNING: no action starts once a pause has begun.
        not_running(self.id, state, "an action")?;
        if t.running >= max_running {
            return Err(Error::new(
                Reason::TooManyActions,
                format!(
                    "sandbox {} already runs {max_running} actions (MENTIS_MAX_ACTIONS_PER_SANDBOX)",
                    self.id
                ),
            )
            .about(Resource::sandbox(self.id)));
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
        // The store first: a retry that finds the action in neither place is right to run it.
        if let Err(e) = self.store.forget_action(self.id, id) {
            tracing::warn!(sandbox_id = %self.id, error = %e.chain(), "could not forget an action in the store");
        }
        let mut inner = lock(&self.inner);
        let t = &mut inner.actions;
        if let Some(e) = t.entries.remove(id)
            && e.running
        {
            t.running -= 1;
        }
    }

    /// Fills the table from the store after a restart (`stored` in the order they were accepted). Every
    /// action there has ended or is ended now: the ones the store still had running whose terminal
    /// observation is not in the log (they ran across the restart, and their end was not observed) get a
    /// LOST one, so each has exactly one end. Memory keeps the running ones and the newest finished ones.
    pub(crate) fn restore_actions(&self, stored: Vec<StoredAction>) -> Vec<(ActionId, ActionKind)> {
        let mut unended = Vec::new();
        let mut inner = lock(&self.inner);
        let t = &mut inner.actions;
        let finished = stored
            .iter()
            .filter(|a| a.finished || self.log.has_terminal(&a.id, a.after_seq))
            .count();
        let mut skip = finished.saturating_sub(CACHED_FINISHED);
        for a in stored {
            let running = !a.finished && !self.log.has_terminal(&a.id, a.after_seq);
            if running {
                unended.push((a.id.clone(), a.kind));
                t.running += 1;
            } else if skip > 0 {
                skip -= 1;
                continue;
            } else {
                t.finished.push_back(a.id.clone());
            }
            t.entries.insert(
                a.id,
                ActionEntry {
                    running,
                    fingerprint: a.fingerprint,
                    after_seq: a.after_seq,
                },
            );
        }
        t.stored_finished = finished;
        unended
    }

    /// Ends an action the runtime cannot follow any more with a synthesized LOST terminal observation.
    pub(crate) fn end_lost(&self, id: &ActionId, kind: ActionKind, reason: &str) {
        self.log.append(
            Some(id.clone()),
            ObservationKind::lost(kind, reason, std::time::Duration::ZERO),
        );
        self.finish_action(id);
    }

    /// Actions running now.
    pub fn running_actions(&self) -> usize {
        lock(&self.inner).actions.running
    }

    /// Marks an action finished (its terminal observation is in the log).
    pub fn finish_action(&self, id: &ActionId) {
        // The end of an action is activity too: the idle timeout counts from here.
        self.touch();
        let trim = {
            let mut inner = lock(&self.inner);
            let t = &mut inner.actions;
            let was_running = match t.entries.get_mut(id) {
                Some(e) if e.running => {
                    e.running = false;
                    true
                }
                _ => false,
            };
            if !was_running {
                return;
            }
            t.running -= 1;
            t.finished(id.clone())
        };
        let keep = trim.then_some(REMEMBERED_FINISHED);
        if let Err(e) = self.store.finish_action(self.id, id, keep) {
            tracing::warn!(sandbox_id = %self.id, error = %e.chain(), "could not end an action in the store");
        }
    }

    pub fn action_status(&self, id: &ActionId) -> Result<ActionStatus, Error> {
        match lock(&self.inner).actions.entries.get(id) {
            Some(e) if e.running => return Ok(ActionStatus::Running),
            Some(_) => return Ok(ActionStatus::Finished),
            None => {}
        }
        // Older finished actions are only in the store.
        Ok(match self.store.action(self.id, id)? {
            Some(_) => ActionStatus::Finished,
            None => ActionStatus::Unknown,
        })
    }
}

/// What a precondition of [`SandboxHandle::enter_if`] sees.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    pub state: SandboxState,
    pub running_actions: usize,
}

/// Ok for RUNNING; UNAVAILABLE while UNHEALTHY (the runtime is bringing the executor back: retry);
/// FailedPrecondition naming the state otherwise.
pub fn not_running(id: SandboxId, state: SandboxState, call: &str) -> Result<(), Error> {
    match state {
        SandboxState::Running => Ok(()),
        SandboxState::Unhealthy => Err(Error::new(
            Reason::SandboxUnhealthy,
            format!(
                "the executor of sandbox {id} does not answer; the runtime is bringing it back"
            ),
        )
        .about(Resource::sandbox(id))),
        other => Err(lifecycle::refuse(id, other, call, &[SandboxState::Running])),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observations::LogLimits;
    use mentis_core::Limits;
    use std::time::SystemTime;

    fn handle(store: &Arc<Store>) -> SandboxHandle {
        let now = SystemTime::now();
        let record = Sandbox {
            id: SandboxId::new(),
            space_id: SpaceId::default_space(),
            state: SandboxState::Running,
            image: "img".into(),
            labels: BTreeMap::new(),
            limits: Limits::default(),
            created_at: now,
            updated_at: now,
            state_reason: String::new(),
            external_key: None,
            expiry: Default::default(),
            last_activity: now,
            egress: mentis_core::egress::Egress::Deny,
            read_only_rootfs: true,
            template: String::new(),
            work_dir: String::new(),
            runtime_class: String::new(),
        };
        let log = ObservationLog::new(record.id, LogLimits::default());
        SandboxHandle::new(record, BTreeMap::new(), log, "t".into(), Arc::clone(store))
    }

    fn run(h: &SandboxHandle, id: &ActionId, fingerprint: u64) -> Result<Reserved, Error> {
        let r = h.reserve_action(id, ActionKind::Shell, fingerprint, 8)?;
        if let Reserved::New { .. } = r {
            h.log.append(
                Some(id.clone()),
                ObservationKind::lost(ActionKind::Shell, "test", std::time::Duration::ZERO),
            );
            h.finish_action(id);
        }
        Ok(r)
    }

    #[test]
    fn memory_keeps_the_newest_finished_actions_and_the_store_the_rest() -> Result<(), Error> {
        let store = Arc::new(Store::in_memory()?);
        let h = handle(&store);
        let n = REMEMBERED_FINISHED + TRIM_SLACK + 2;
        let id = |i: usize| ActionId::parse(&format!("a-{i}"));
        let first = run(&h, &id(0)?, 0)?;
        assert_eq!(first, Reserved::New { after_seq: 0 });
        for i in 1..n {
            run(&h, &id(i)?, i as u64)?;
            let entries = lock(&h.inner).actions.entries.len();
            assert!(entries <= CACHED_FINISHED, "{entries} actions in memory");
        }
        // Known from memory and from the store alike: a retry replays, another action is refused.
        for i in [n - 1, n - CACHED_FINISHED - 10, n - REMEMBERED_FINISHED] {
            // One observation per action: action i comes after seq i.
            let after_seq = i as u64;
            assert_eq!(
                run(&h, &id(i)?, i as u64)?,
                Reserved::Known { after_seq },
                "{i}"
            );
            assert!(matches!(run(&h, &id(i)?, 7), Err(Error::AlreadyExists(_))));
            assert_eq!(h.action_status(&id(i)?)?, ActionStatus::Finished);
        }
        // The store forgot the oldest beyond what it remembers; a forgotten id is new again.
        let stored = store.actions(h.id)?.len();
        assert!(
            (REMEMBERED_FINISHED..=REMEMBERED_FINISHED + TRIM_SLACK).contains(&stored),
            "{stored} stored"
        );
        assert_eq!(h.action_status(&id(0)?)?, ActionStatus::Unknown);
        assert!(matches!(run(&h, &id(0)?, 0)?, Reserved::New { .. }));

        // After a restart, memory holds the newest only, and the rest is still known.
        let again = handle(&store);
        let again = SandboxHandle { id: h.id, ..again };
        assert!(again.restore_actions(store.actions(h.id)?).is_empty());
        assert_eq!(lock(&again.inner).actions.entries.len(), CACHED_FINISHED);
        let i = n - REMEMBERED_FINISHED + 5;
        assert_eq!(
            again.reserve_action(&id(i)?, ActionKind::Shell, i as u64, 8)?,
            Reserved::Known {
                after_seq: i as u64
            }
        );
        Ok(())
    }
}
