//! The registry: every sandbox this runtime holds, by id. Admission (limits, get-or-create by key, the
//! record in the store) happens under its lock, so two creates never both take the last place or both make
//! a sandbox for one key. It also forgets ended sandboxes after their retention and flushes changed records.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, SystemTime};

use mentis_core::{
    Error, Reason, Resource, ResourceKind, Result, Sandbox, SandboxId, SandboxState, Space,
    SpaceId, quoted,
};

use super::handle::SandboxHandle;
use crate::store::Store;

/// Ended sandboxes kept for Get and log replay before the oldest are forgotten.
const KEPT_ENDED: usize = 256;

/// Filter and page of a listing.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub space_id: Option<String>,
    /// Only sandboxes of these spaces (the caller's); `None` = any space.
    pub allowed: Option<BTreeSet<SpaceId>>,
    pub labels: Vec<(String, String)>,
    /// Any of these states; empty = any state.
    pub states: Vec<SandboxState>,
    pub page_size: usize,
    /// Id of the last sandbox of the previous page.
    pub after: Option<SandboxId>,
}

/// The outcome of admitting a create request.
#[derive(Debug)]
pub enum Admission {
    /// Recorded and registered: bring it up.
    Admitted,
    /// A live sandbox already carries the request's key in its space: that is the answer.
    Existing(Box<Sandbox>),
}

/// How a new sandbox is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recording {
    /// A new row.
    New,
    /// A pool member's row becomes the sandbox's, in one transaction.
    Claim,
}

/// Every sandbox of this runtime.
pub struct Registry {
    map: RwLock<HashMap<SandboxId, Arc<SandboxHandle>>>,
    store: Arc<Store>,
    max_sandboxes: usize,
    ended_retention: Duration,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

impl Registry {
    pub fn new(store: Arc<Store>, max_sandboxes: usize, ended_retention: Duration) -> Self {
        Self {
            map: RwLock::new(HashMap::new()),
            store,
            max_sandboxes,
            ended_retention,
        }
    }

    fn read(&self) -> RwLockReadGuard<'_, HashMap<SandboxId, Arc<SandboxHandle>>> {
        // Inserts and removals only: a poisoned map is still consistent.
        self.map.read().unwrap_or_else(|p| p.into_inner())
    }

    /// The write lock; spaces take theirs after this one (see [`super::spaces`]).
    pub(super) fn write(&self) -> RwLockWriteGuard<'_, HashMap<SandboxId, Arc<SandboxHandle>>> {
        self.map.write().unwrap_or_else(|p| p.into_inner())
    }

    /// Checks the runtime's and the space's limits and the key, records the sandbox and registers its
    /// handle, all under the registry's lock.
    /// `space` reads the space's record under that lock: a space deleted meanwhile (which takes this lock
    /// first, see [`super::spaces::Spaces::remove_if_empty`]) is NotFound here.
    pub fn admit(
        &self,
        handle: &Arc<SandboxHandle>,
        space: impl FnOnce() -> Result<Space>,
        env: &BTreeMap<String, String>,
        recording: Recording,
    ) -> Result<Admission> {
        let record = handle.snapshot();
        let mut map = self.write();
        let space = space()?;
        if let Some(key) = &record.external_key
            && let Some(existing) = map
                .values()
                .find(|h| h.is_live_with_key(&record.space_id, key))
        {
            return Ok(Admission::Existing(Box::new(existing.snapshot())));
        }
        let live = map.values().filter(|h| !h.state().is_final()).count();
        if live >= self.max_sandboxes {
            return Err(Error::new(
                Reason::RuntimeQuotaExceeded,
                format!("this runtime already holds {live} sandboxes (MENTIS_MAX_SANDBOXES)"),
            ));
        }
        let in_space = map
            .values()
            .filter(|h| h.is_live_in(&record.space_id))
            .count();
        let max = space.limits.max_sandboxes as usize;
        if max > 0 && in_space >= max {
            return Err(Error::new(
                Reason::SpaceQuotaExceeded,
                format!(
                    "space {} already holds {in_space} sandboxes, its limit",
                    record.space_id
                ),
            )
            .about(Resource::space(&record.space_id)));
        }
        match recording {
            Recording::Claim => self.store.claim(&record, env)?,
            Recording::New => self.store.put_sandbox(&record, env, 0)?,
        }
        map.insert(record.id, Arc::clone(handle));
        Ok(Admission::Admitted)
    }

    /// Registers a handle restored from the store.
    pub fn insert(&self, handle: Arc<SandboxHandle>) {
        self.write().insert(handle.id, handle);
    }

    /// The handle of a sandbox; NotFound when unknown.
    pub fn handle(&self, id: SandboxId) -> Result<Arc<SandboxHandle>> {
        self.read()
            .get(&id)
            .cloned()
            .ok_or_else(|| Error::sandbox_not_found(id))
    }

    /// The handle of a sandbox, when known.
    pub fn find(&self, id: SandboxId) -> Option<Arc<SandboxHandle>> {
        self.read().get(&id).cloned()
    }

    /// Every handle.
    pub fn handles(&self) -> Vec<Arc<SandboxHandle>> {
        self.read().values().cloned().collect()
    }

    /// Live sandboxes in `space`.
    pub fn live_in(&self, space: &SpaceId) -> u32 {
        let n = self.read().values().filter(|h| h.is_live_in(space)).count();
        u32::try_from(n).unwrap_or(u32::MAX)
    }

    /// The live sandbox carrying `key` in `space`, and its newest seq.
    pub fn get_by_key(&self, space: &SpaceId, key: &str) -> Result<(Sandbox, u64)> {
        mentis_core::sandbox::validate_external_key(key)?;
        self.read()
            .values()
            .find(|h| h.is_live_with_key(space, key))
            .map(|h| (h.snapshot(), h.log.last_seq()))
            .ok_or_else(|| {
                Error::new(
                    Reason::ExternalKeyNotFound,
                    format!("no live sandbox with key {} in space {space}", quoted(key)),
                )
                .about(Resource::new(ResourceKind::ExternalKey, key))
                .about(Resource::space(space))
            })
    }

    /// One page of sandboxes, oldest first, and whether more follow.
    pub fn list(&self, q: &ListQuery) -> (Vec<(Sandbox, u64)>, bool) {
        let mut all: Vec<(Sandbox, u64)> = self
            .read()
            .values()
            .map(|h| (h.snapshot(), h.log.last_seq()))
            .filter(|(s, _)| {
                q.space_id
                    .as_deref()
                    .is_none_or(|sp| s.space_id.as_str() == sp)
            })
            .filter(|(s, _)| q.allowed.as_ref().is_none_or(|a| a.contains(&s.space_id)))
            .filter(|(s, _)| q.labels.iter().all(|(k, v)| s.labels.get(k) == Some(v)))
            .filter(|(s, _)| q.states.is_empty() || q.states.contains(&s.state))
            .collect();
        all.sort_by(|(a, _), (b, _)| a.created_at.cmp(&b.created_at).then(a.id.cmp(&b.id)));
        let start = match q.after {
            Some(after) => match all.iter().position(|(s, _)| s.id == after) {
                Some(i) => i + 1,
                // The cursor's sandbox is gone: resume after where it would sort.
                None => all
                    .iter()
                    .position(|(s, _)| s.id > after)
                    .unwrap_or(all.len()),
            },
            None => 0,
        };
        let mut page: Vec<_> = all.into_iter().skip(start).collect();
        let more = page.len() > q.page_size;
        page.truncate(q.page_size);
        (page, more)
    }

    /// Makes every journal's newest writes durable (blocking: call it off the runtime's threads).
    pub fn sync_logs(&self) {
        for h in self.handles() {
            h.log.sync();
        }
    }

    /// Forgets ended sandboxes (and their logs) once they have been ended for the retention time, and the
    /// oldest ones beyond a count bound.
    pub fn forget_old_ended(&self) {
        let mut map = self.write();
        let mut ended: Vec<(SystemTime, SandboxId)> = map
            .values()
            .map(|h| h.snapshot())
            .filter(|s| s.state.is_final())
            .map(|s| (s.updated_at, s.id))
            .collect();
        ended.sort();
        let now = crate::clock::now();
        let expired = ended
            .iter()
            .filter(|(t, _)| now.duration_since(*t).unwrap_or_default() > self.ended_retention)
            .count();
        let excess = ended.len().saturating_sub(KEPT_ENDED);
        for (_, id) in ended.iter().take(expired.max(excess)) {
            self.forget(&mut map, *id);
        }
    }

    /// Forgets the ended sandboxes of a deleted space now (records, logs and journals), whatever their
    /// retention.
    pub fn forget_ended_in(&self, space: &SpaceId) {
        let mut map = self.write();
        let ended: Vec<SandboxId> = map
            .values()
            .map(|h| h.snapshot())
            .filter(|s| s.state.is_final() && &s.space_id == space)
            .map(|s| s.id)
            .collect();
        for id in ended {
            self.forget(&mut map, id);
        }
    }

    /// Forgets an ended sandbox: its handle, its log (and journal), its record.
    fn forget(&self, map: &mut HashMap<SandboxId, Arc<SandboxHandle>>, id: SandboxId) {
        if let Some(h) = map.remove(&id) {
            h.log.discard();
        }
        if let Err(e) = self.store.delete_sandbox(id) {
            tracing::warn!(sandbox_id = %id, error = %e.chain(), "could not forget a sandbox in the store");
        }
    }

    /// Writes every changed record (last activity, newest seq) to the store, in one transaction: with
    /// hundreds of busy sandboxes, one commit a second rather than one per sandbox holding the store's lock
    /// in turn. State changes are written at once by `enter`; this catches the rest. It blocks on the
    /// store: the sweeper calls it off the runtime's threads.
    pub fn flush(&self) {
        use std::sync::atomic::Ordering;
        let changed: Vec<(Arc<SandboxHandle>, u64)> = self
            .handles()
            .into_iter()
            .filter_map(|h| {
                let seq = h.log.last_seq();
                let seq_changed = seq != h.stored_seq.load(Ordering::Relaxed);
                (h.take_dirty() || seq_changed).then_some((h, seq))
            })
            .collect();
        let records: Vec<mentis_core::Sandbox> =
            changed.iter().map(|(h, _)| h.snapshot()).collect();
        let rows: Vec<(&mentis_core::Sandbox, u64)> = records
            .iter()
            .zip(changed.iter().map(|(_, seq)| *seq))
            .collect();
        match self.store.update_sandboxes(&rows) {
            Ok(()) => {
                for (h, seq) in &changed {
                    h.stored_seq.store(*seq, Ordering::Relaxed);
                }
            }
            Err(e) => {
                tracing::warn!(sandboxes = records.len(), error = %e.chain(), "could not write sandboxes to the store");
                // Written again at the next round.
                for (h, _) in &changed {
                    h.mark_dirty();
                }
            }
        }
    }
}
