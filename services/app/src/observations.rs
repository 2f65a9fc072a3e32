//! The per-sandbox observation log: append-only, sequence-numbered, bounded by count and bytes, with replay
//! after any seq and live follow. Readers hold only a cursor, so a slow reader costs the log nothing: it
//! reads at its own pace and, if the log trimmed what it had not read yet, is told so with a gap. A durable
//! log also writes every observation to its journal (`journal`) before any reader can see it, and a
//! restarted runtime reopens it: replay after a restart returns what was there before.

mod journal;
mod memory;
mod record;

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::Stream;
use mentis_core::{ActionId, Observation, ObservationKind, SandboxId};
use tokio::sync::watch;

use journal::Journal;
pub use journal::Origin;
pub use memory::MemoryBudget;

/// Bounds of one sandbox's log, and the memory budget every durable log of the runtime shares.
#[derive(Debug, Clone)]
pub struct LogLimits {
    pub max_entries: usize,
    pub max_bytes: usize,
    pub memory: Arc<MemoryBudget>,
}

impl Default for LogLimits {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            max_bytes: 64 * 1024 * 1024,
            memory: Arc::new(MemoryBudget::new(256 * 1024 * 1024)),
        }
    }
}

/// What a reader gets next.
#[derive(Debug, Clone, PartialEq)]
pub enum LogItem {
    Observation(Arc<Observation>),
    /// Entries after `after_seq` were trimmed before they were read; reading resumes at `first_available_seq`.
    Gap {
        after_seq: u64,
        first_available_seq: u64,
    },
}

impl Inner {
    /// Applies the bounds. A log in memory only trims its oldest entries to them, but always keeps the
    /// newest one so followers can see it. A durable log trims whole journal segments to them and keeps in
    /// memory only a tail within its share of the budget (see `memory`): the rest is read from the journal.
    fn trim(&mut self, limits: &LogLimits) {
        let Some(j) = self.journal.as_mut() else {
            while self.entries.len() > 1
                && (self.entries.len() > limits.max_entries || self.bytes > limits.max_bytes)
            {
                self.evict_front(limits);
            }
            return;
        };
        // The count bound holds to the entry; the byte bound to a segment (the journal's bytes).
        let max_bytes = limits.max_bytes as u64;
        j.trim_while(self.next_seq, |_, bytes| bytes > max_bytes);
        let by_count = self.next_seq.saturating_sub(limits.max_entries as u64);
        j.trim_before(by_count);
        self.floor = self
            .floor
            .max(by_count)
            .max(j.first_seq().unwrap_or(self.next_seq));
        let first = self.floor;
        let cap = if self.closed { 0 } else { limits.memory.cap() };
        while let Some(front) = self.entries.front() {
            let below = front.seq < first;
            if !below && (self.entries.len() <= 1 || self.bytes <= cap) {
                break;
            }
            self.evict_front(limits);
        }
    }

    /// A durable log lets go of the entries in memory older than `cutoff` (but its newest): readers find
    /// them in the journal. A log that goes quiet thus holds next to nothing, however much it printed.
    fn shed_older_than(&mut self, cutoff: std::time::SystemTime, limits: &LogLimits) {
        if self.journal.is_none() {
            return;
        }
        while self.entries.len() > 1 && self.entries.front().is_some_and(|o| o.time < cutoff) {
            self.evict_front(limits);
        }
    }

    fn evict_front(&mut self, limits: &LogLimits) {
        if let Some(old) = self.entries.pop_front() {
            let size = old.kind.approx_bytes();
            self.bytes -= size;
            if self.journal.is_some() {
                limits.memory.sub(size);
            }
        }
    }

    /// The oldest seq the log holds (in memory or in its journal).
    fn first_seq(&self) -> u64 {
        let in_memory = self.next_seq - self.entries.len() as u64;
        match &self.journal {
            Some(j) => j
                .first_seq()
                .unwrap_or(in_memory)
                .max(self.floor)
                .min(in_memory),
            None => in_memory,
        }
    }
}

enum Read {
    Items(Vec<Arc<Observation>>),
    /// Evicted from memory, still in the journal: read these segment files, up to `before_seq`.
    Disk {
        segments: Vec<PathBuf>,
        before_seq: u64,
    },
    Gap {
        first_available_seq: u64,
    },
    /// Nothing new; `closed` says whether anything ever will be.
    Empty {
        closed: bool,
    },
}

struct Inner {
    entries: VecDeque<Arc<Observation>>,
    bytes: usize,
    /// Seq the next append gets; entries hold `next_seq - entries.len() .. next_seq`.
    next_seq: u64,
    closed: bool,
    /// Where a durable log writes; `None` for a log kept in memory only.
    journal: Option<Journal>,
    progress: Progress,
    /// Actions whose terminal observation the journal held when the log was reopened.
    ended_before: HashSet<ActionId>,
    /// A durable log's oldest seq by its bounds: older records may still sit in a journal segment, but are
    /// not read.
    floor: u64,
}

/// The newest event index held of each action that has not ended.
#[derive(Debug, Default)]
struct Progress(HashMap<ActionId, u64>);

impl Progress {
    fn note(&mut self, origin: &Origin, o: &Observation) {
        if o.kind.is_terminal() && o.action_id.as_ref() == Some(&origin.action) {
            self.0.remove(&origin.action);
        } else {
            self.0.insert(origin.action.clone(), origin.index);
        }
    }
}

/// What a reopened journal leaves in memory, gathered record by record.
#[derive(Default)]
struct Reopened {
    /// The newest entries, within the memory bounds.
    entries: VecDeque<Arc<Observation>>,
    bytes: usize,
    last_seq: u64,
    progress: Progress,
    /// Unfinished actions (by the store) whose terminal observation the journal holds.
    ended: HashSet<ActionId>,
}

impl Reopened {
    fn take(
        &mut self,
        o: Observation,
        origin: Option<Origin>,
        unfinished: &HashSet<ActionId>,
        cap: usize,
        max_entries: usize,
    ) {
        if self.last_seq != 0 && o.seq != self.last_seq + 1 {
            // Only a run of consecutive seqs lines up in memory: after a damaged record in the middle, the
            // newest run is kept (readers asking for older seqs get a gap).
            *self = Self::default();
        }
        self.last_seq = o.seq;
        if let Some(origin) = &origin {
            self.progress.note(origin, &o);
        }
        if o.kind.is_terminal()
            && let Some(a) = &o.action_id
            && unfinished.contains(a)
        {
            self.ended.insert(a.clone());
        }
        self.bytes += o.kind.approx_bytes();
        self.entries.push_back(Arc::new(o));
        while self.entries.len() > 1 && (self.bytes > cap || self.entries.len() > max_entries) {
            if let Some(old) = self.entries.pop_front() {
                self.bytes -= old.kind.approx_bytes();
            }
        }
    }
}

/// One sandbox's log.
pub struct ObservationLog {
    sandbox_id: SandboxId,
    limits: LogLimits,
    inner: Mutex<Inner>,
    /// Carries the newest seq; followers wait on it.
    newest: watch::Sender<u64>,
    /// Whether the log has a journal (read without the lock, to encode a record before taking it).
    journaled: AtomicBool,
}

impl Drop for ObservationLog {
    fn drop(&mut self) {
        let inner = self.inner.get_mut().unwrap_or_else(|p| p.into_inner());
        if inner.journal.is_some() {
            self.limits.memory.sub(inner.bytes);
        }
    }
}

impl std::fmt::Debug for ObservationLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObservationLog")
            .field("sandbox_id", &self.sandbox_id)
            .field("last_seq", &self.last_seq())
            .finish()
    }
}

/// How many entries a follower takes per lock.
const READ_BATCH: usize = 256;

impl ObservationLog {
    /// A log kept in memory only.
    pub fn new(sandbox_id: SandboxId, limits: LogLimits) -> Arc<Self> {
        Self::starting_after(sandbox_id, limits, 0)
    }

    /// An empty log in memory only whose first observation gets seq `last_seq + 1`: the log of a sandbox
    /// taken over after a restart whose journal is gone (a reader asking for older seqs gets a gap).
    pub fn starting_after(sandbox_id: SandboxId, limits: LogLimits, last_seq: u64) -> Arc<Self> {
        Self::with(sandbox_id, limits, last_seq, VecDeque::new(), None)
    }

    /// A new durable log with its journal in `dir`. When the journal cannot be made, the log is kept in
    /// memory only (and says so in the runtime's log).
    pub fn durable(sandbox_id: SandboxId, limits: LogLimits, dir: &Path) -> Arc<Self> {
        let journal = Journal::create(dir)
            .inspect_err(|e| {
                tracing::error!(%sandbox_id, dir = %dir.display(), error = %e,
                    "cannot make the observation journal: this log is kept in memory only")
            })
            .ok();
        Self::with(sandbox_id, limits, 0, VecDeque::new(), journal)
    }

    /// The durable log of a sandbox after a restart: its journal in `dir` with what it held (within the
    /// bounds); without a journal, an empty log starting after `fallback_last_seq`. `unfinished`: the actions
    /// the store has not seen end, whose terminal observations the log notes (see [`Self::has_terminal`]).
    ///
    /// The journal is read one segment at a time and only the newest entries within the memory bounds are
    /// kept, so reopening many full journals costs no more memory than the logs hold afterwards.
    pub fn reopen(
        sandbox_id: SandboxId,
        limits: LogLimits,
        dir: &Path,
        fallback_last_seq: u64,
        unfinished: &HashSet<ActionId>,
    ) -> Arc<Self> {
        let mut read = Reopened::default();
        let cap = limits.memory.cap();
        let opened = Journal::open_with(dir, |o, origin| {
            read.take(o, origin, unfinished, cap, limits.max_entries);
        });
        match opened {
            Ok(Some(journal)) => {
                let last = read.last_seq;
                if last < fallback_last_seq {
                    // The store saw later seqs than the journal holds (a write to it failed): start afresh
                    // after what the store saw, so no seq is handed out twice.
                    if let Err(e) = journal.remove() {
                        tracing::warn!(%sandbox_id, error = %e, "could not remove a stale journal");
                    }
                    let log = Self::durable(sandbox_id, limits, dir);
                    let mut inner = log.lock();
                    inner.next_seq = fallback_last_seq + 1;
                    drop(inner);
                    log.newest.send_replace(fallback_last_seq);
                    return log;
                }
                let log = Self::with(
                    sandbox_id,
                    limits.clone(),
                    last,
                    read.entries,
                    Some(journal),
                );
                let mut inner = log.lock();
                inner.progress = read.progress;
                inner.ended_before = read.ended;
                inner.trim(&limits);
                drop(inner);
                log
            }
            Ok(None) => Self::starting_after(sandbox_id, limits, fallback_last_seq),
            Err(e) => {
                tracing::error!(%sandbox_id, dir = %dir.display(), error = %e,
                    "cannot read the observation journal: the log starts empty");
                Self::starting_after(sandbox_id, limits, fallback_last_seq)
            }
        }
    }

    fn with(
        sandbox_id: SandboxId,
        limits: LogLimits,
        last_seq: u64,
        entries: VecDeque<Arc<Observation>>,
        journal: Option<Journal>,
    ) -> Arc<Self> {
        // Entries hold `next_seq - len .. next_seq`: they end at `last_seq`.
        let bytes = entries.iter().map(|o| o.kind.approx_bytes()).sum();
        let journaled = journal.is_some();
        if journaled {
            limits.memory.add(bytes);
        }
        Arc::new(Self {
            sandbox_id,
            limits,
            inner: Mutex::new(Inner {
                entries,
                bytes,
                next_seq: last_seq + 1,
                closed: false,
                journal,
                progress: Progress::default(),
                ended_before: HashSet::new(),
                floor: 0,
            }),
            newest: watch::channel(last_seq).0,
            journaled: AtomicBool::new(journaled),
        })
    }

    /// Makes what the journal holds survive a power loss (the sweeper calls it every second, off the
    /// runtime's threads), and lets the memory go of entries older than [`memory::CACHE_AGE`] (the
    /// journal has them). Appends go on meanwhile: the sync works on a second handle.
    pub fn sync(&self) {
        let unsynced = {
            let mut inner = self.lock();
            if let Some(cutoff) = crate::clock::now().checked_sub(memory::CACHE_AGE) {
                inner.shed_older_than(cutoff, &self.limits);
            }
            inner
                .journal
                .as_mut()
                .map(|j| j.take_unsynced())
                .transpose()
        };
        let synced =
            unsynced.and_then(|files| files.into_iter().flatten().try_for_each(|f| f.sync_data()));
        if let Err(e) = synced {
            tracing::warn!(sandbox_id = %self.sandbox_id, error = %e, "could not sync the observation journal");
        }
    }

    /// Removes the journal (the sandbox is forgotten); the log keeps answering from memory.
    pub fn discard(&self) {
        let journal = {
            let mut inner = self.lock();
            let journal = inner.journal.take();
            self.journaled.store(false, Ordering::Relaxed);
            if journal.is_some() {
                self.limits.memory.sub(inner.bytes);
            }
            journal
        };
        if let Some(j) = journal
            && let Err(e) = j.remove()
        {
            tracing::warn!(sandbox_id = %self.sandbox_id, error = %e, "could not remove the observation journal");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves the deque consistent (every mutation is a single push or
        // pop), so a poisoned lock is still safe to use.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends an observation and returns its seq; `None` once the log is closed.
    pub fn append(&self, action_id: Option<ActionId>, kind: ObservationKind) -> Option<u64> {
        self.append_from(action_id, kind, None)
    }

    /// Appends an observation that came from an executor's event (`origin`) and returns its seq; `None`
    /// once the log is closed.
    pub fn append_from(
        &self,
        action_id: Option<ActionId>,
        kind: ObservationKind,
        origin: Option<&Origin>,
    ) -> Option<u64> {
        let size = kind.approx_bytes();
        let m = crate::metrics::metrics();
        m.observations.add(1, &[]);
        m.observation_bytes.add(size as u64, &[]);
        // A durable log's record is encoded before the lock is taken; only its head is encoded under it.
        let prepared = if self.journaled.load(Ordering::Relaxed) {
            match journal::Prepared::new(&kind, origin) {
                Ok(p) => Some(p),
                Err(e) => {
                    tracing::error!(sandbox_id = %self.sandbox_id, error = %e,
                        "could not encode an observation for the journal");
                    None
                }
            }
        } else {
            None
        };
        let seq = {
            let mut inner = self.lock();
            if inner.closed {
                return None;
            }
            let seq = inner.next_seq;
            inner.next_seq += 1;
            let o = Arc::new(Observation {
                seq,
                sandbox_id: self.sandbox_id,
                action_id,
                time: crate::clock::now(),
                kind,
            });
            // Written before any reader can see it (the seq is published below).
            if let Some(j) = inner.journal.as_mut()
                && let Err(e) = prepared
                    .map_or_else(|| journal::Prepared::new(&o.kind, origin), Ok)
                    .and_then(|p| j.append_prepared(&o, p))
            {
                tracing::error!(sandbox_id = %self.sandbox_id, seq, error = %e,
                    "could not write an observation to the journal: it is kept in memory only");
            }
            if let Some(origin) = origin {
                inner.progress.note(origin, &o);
            }
            if inner.journal.is_some() {
                self.limits.memory.add(size);
            }
            inner.entries.push_back(o);
            inner.bytes += size;
            inner.trim(&self.limits);
            seq
        };
        self.newest.send_replace(seq);
        Some(seq)
    }

    /// The newest event index of `action` the log holds (0 when none, or when the action ended).
    pub fn progress(&self, action: &ActionId) -> u64 {
        self.lock().progress.0.get(action).copied().unwrap_or(0)
    }

    /// Whether the log (what it still holds in memory) has the terminal observation of `action` after
    /// `after_seq`.
    pub fn has_terminal(&self, action: &ActionId, after_seq: u64) -> bool {
        let inner = self.lock();
        inner.ended_before.contains(action)
            || inner.entries.iter().any(|o| {
                o.seq > after_seq && o.action_id.as_ref() == Some(action) && o.kind.is_terminal()
            })
    }

    /// Seq of the newest observation (0 when none).
    pub fn last_seq(&self) -> u64 {
        self.lock().next_seq - 1
    }

    /// Refuses further appends and ends every follower once it has read what is there.
    pub fn close(&self) {
        let mut inner = self.lock();
        inner.closed = true;
        // A closed durable log keeps only its newest entry in memory: replay reads the journal.
        inner.trim(&self.limits);
        if let Some(j) = inner.journal.as_mut()
            && let Err(e) = j.sync()
        {
            tracing::warn!(sandbox_id = %self.sandbox_id, error = %e, "could not sync the observation journal");
        }
        drop(inner);
        // Wake followers so they notice.
        self.newest.send_modify(|_| {});
    }

    fn read_after(&self, after_seq: u64) -> Read {
        let inner = self.lock();
        let in_memory = inner.next_seq - inner.entries.len() as u64;
        if after_seq + 1 < in_memory {
            let first = inner.first_seq();
            return match &inner.journal {
                Some(j) if after_seq + 1 >= first => Read::Disk {
                    segments: j.reader(after_seq),
                    before_seq: in_memory,
                },
                _ => Read::Gap {
                    first_available_seq: in_memory.min(first.max(after_seq + 2)),
                },
            };
        }
        let start = usize::try_from(after_seq + 1 - in_memory).unwrap_or(usize::MAX);
        if start >= inner.entries.len() {
            return Read::Empty {
                closed: inner.closed,
            };
        }
        Read::Items(
            inner
                .entries
                .range(start..)
                .take(READ_BATCH)
                .cloned()
                .collect(),
        )
    }

    /// Observations after `after_seq` from the journal's files (off the runtime's threads); a gap when
    /// they are no longer there (trimmed meanwhile).
    async fn read_disk(&self, segments: Vec<PathBuf>, after_seq: u64, before_seq: u64) -> Read {
        let read = tokio::task::spawn_blocking(move || {
            journal::read_after(&segments, after_seq, before_seq, READ_BATCH)
        })
        .await;
        let items = match read {
            Ok(Ok(items)) => items,
            Ok(Err(e)) => {
                tracing::warn!(sandbox_id = %self.sandbox_id, error = %e, "could not read the observation journal");
                Vec::new()
            }
            Err(e) => {
                tracing::warn!(sandbox_id = %self.sandbox_id, error = %e, "the journal reader failed");
                Vec::new()
            }
        };
        match items.first().map(|o| o.seq) {
            Some(seq) if seq == after_seq + 1 => {
                Read::Items(items.into_iter().map(Arc::new).collect())
            }
            // Trimmed (or unreadable) meanwhile: a gap up to what is there, always forward.
            Some(seq) => Read::Gap {
                first_available_seq: seq,
            },
            None => {
                let first = self.lock().first_seq();
                Read::Gap {
                    first_available_seq: if first > after_seq + 1 {
                        first
                    } else {
                        before_seq
                    },
                }
            }
        }
    }

    /// Every observation with seq > `after_seq` (or a gap first, when some were trimmed), then live ones,
    /// until the log closes.
    pub fn follow(
        self: &Arc<Self>,
        after_seq: u64,
    ) -> impl Stream<Item = LogItem> + Send + 'static {
        struct State {
            log: Arc<ObservationLog>,
            cursor: u64,
            rx: watch::Receiver<u64>,
            batch: VecDeque<Arc<Observation>>,
        }
        let state = State {
            log: Arc::clone(self),
            cursor: after_seq,
            rx: self.newest.subscribe(),
            batch: VecDeque::new(),
        };
        futures::stream::unfold(state, |mut st| async move {
            loop {
                if let Some(obs) = st.batch.pop_front() {
                    st.cursor = obs.seq;
                    return Some((LogItem::Observation(obs), st));
                }
                // Mark the current value seen *before* reading, so an append between the read and the wait
                // still wakes us.
                st.rx.borrow_and_update();
                let mut read = st.log.read_after(st.cursor);
                if let Read::Disk {
                    segments,
                    before_seq,
                } = read
                {
                    read = st.log.read_disk(segments, st.cursor, before_seq).await;
                }
                match read {
                    Read::Items(items) => st.batch.extend(items),
                    Read::Disk { .. } => {}
                    Read::Gap {
                        first_available_seq,
                    } => {
                        let after_seq = st.cursor;
                        st.cursor = first_available_seq - 1;
                        return Some((
                            LogItem::Gap {
                                after_seq,
                                first_available_seq,
                            },
                            st,
                        ));
                    }
                    Read::Empty { closed: true } => return None,
                    Read::Empty { closed: false } => {
                        if st.rx.changed().await.is_err() {
                            // The log itself is gone; whatever it held was read above.
                            return None;
                        }
                    }
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use futures::StreamExt;
    use mentis_core::OutputStream;

    fn out(n: usize) -> ObservationKind {
        ObservationKind::CmdOutput {
            stream: OutputStream::Stdout,
            data: Bytes::from(vec![b'x'; n]),
        }
    }

    fn seqs(items: &[LogItem]) -> Vec<u64> {
        items
            .iter()
            .filter_map(|i| match i {
                LogItem::Observation(o) => Some(o.seq),
                LogItem::Gap { .. } => None,
            })
            .collect()
    }

    #[tokio::test]
    async fn replay_after_seq_then_close() {
        let log = ObservationLog::new(SandboxId::new(), LogLimits::default());
        for _ in 0..5 {
            log.append(None, out(1));
        }
        assert_eq!(log.last_seq(), 5);
        log.close();
        let items: Vec<_> = log.follow(2).collect().await;
        assert_eq!(seqs(&items), vec![3, 4, 5]);
        assert_eq!(log.append(None, out(1)), None, "closed log refuses appends");
    }

    #[tokio::test]
    async fn follows_live_appends() {
        let log = ObservationLog::new(SandboxId::new(), LogLimits::default());
        let mut stream = Box::pin(log.follow(0));
        let writer = {
            let log = Arc::clone(&log);
            tokio::spawn(async move {
                for _ in 0..1000 {
                    log.append(None, out(3));
                    tokio::task::yield_now().await;
                }
                log.close();
            })
        };
        let mut got = Vec::new();
        while let Some(item) = stream.next().await {
            got.push(item);
        }
        writer.await.expect("writer");
        assert_eq!(seqs(&got), (1..=1000).collect::<Vec<_>>());
    }

    #[tokio::test]
    async fn trimmed_log_reports_a_gap() {
        let limits = LogLimits {
            max_entries: 3,
            max_bytes: usize::MAX,
            ..Default::default()
        };
        let log = ObservationLog::new(SandboxId::new(), limits);
        for _ in 0..10 {
            log.append(None, out(1));
        }
        log.close();
        let items: Vec<_> = log.follow(2).collect().await;
        assert_eq!(
            items.first(),
            Some(&LogItem::Gap {
                after_seq: 2,
                first_available_seq: 8
            })
        );
        assert_eq!(seqs(&items), vec![8, 9, 10]);
        // A reader that is not behind sees no gap.
        let items: Vec<_> = log.follow(8).collect().await;
        assert_eq!(seqs(&items), vec![9, 10]);
        assert_eq!(items.len(), 2);
    }

    #[tokio::test]
    async fn byte_bound_trims_but_keeps_newest() {
        let limits = LogLimits {
            max_entries: 1000,
            max_bytes: 10_000,
            ..Default::default()
        };
        let log = ObservationLog::new(SandboxId::new(), limits);
        for _ in 0..100 {
            log.append(None, out(1000));
        }
        let inner = log.lock();
        assert!(inner.bytes <= 10_000, "bytes {}", inner.bytes);
        assert!(!inner.entries.is_empty());
        drop(inner);
        // One entry bigger than the whole bound is still kept.
        log.append(None, out(50_000));
        assert_eq!(log.lock().entries.len(), 1);
    }

    fn replayed(items: &[LogItem]) -> Vec<(u64, usize)> {
        items
            .iter()
            .filter_map(|i| match i {
                LogItem::Observation(o) => Some((o.seq, o.kind.approx_bytes())),
                LogItem::Gap { .. } => None,
            })
            .collect()
    }

    /// A durable log keeps only a tail in memory (within the budget); replay reads the rest from the
    /// journal, across segments, in order and byte for byte, and a closed log keeps only its newest entry.
    #[tokio::test]
    async fn a_durable_log_replays_from_its_journal_what_memory_evicted() {
        let dir = tempfile::tempdir().expect("tempdir");
        let budget = Arc::new(MemoryBudget::new(1024 * 1024));
        let limits = LogLimits {
            memory: Arc::clone(&budget),
            ..Default::default()
        };
        let log = ObservationLog::durable(SandboxId::new(), limits, &dir.path().join("log"));
        // 40 MiB in 64 KiB outputs: five segments, far beyond one log's share of memory.
        for _ in 0..640 {
            log.append(None, out(64 * 1024));
        }
        let held = log.lock().bytes;
        assert!(held <= memory::PER_LOG, "{held}");
        assert!(budget.used() <= memory::PER_LOG);
        let all: Vec<_> = log.follow(0).take(640).collect().await;
        assert_eq!(
            replayed(&all),
            (1..=640)
                .map(|s| (s, out(64 * 1024).approx_bytes()))
                .collect::<Vec<_>>(),
            "every entry, in order, none missing"
        );
        // From the middle of a segment, too.
        let mid: Vec<_> = log.follow(333).take(3).collect().await;
        assert_eq!(seqs(&mid), [334, 335, 336]);
        log.close();
        assert_eq!(
            log.lock().entries.len(),
            1,
            "closed: only the newest stays in memory"
        );
        let after_close: Vec<_> = log.follow(0).collect().await;
        assert_eq!(after_close.len(), 640);
        drop((all, mid, after_close));
        drop(log);
        assert_eq!(budget.used(), 0, "a dropped log gives its share back");
    }

    /// Entries older than the cache age leave memory (the newest stays); replay still reads them all.
    #[tokio::test]
    async fn a_durable_log_lets_old_entries_go_from_memory() {
        let dir = tempfile::tempdir().expect("tempdir");
        let budget = Arc::new(MemoryBudget::new(64 * 1024 * 1024));
        let limits = LogLimits {
            memory: Arc::clone(&budget),
            ..Default::default()
        };
        let log =
            ObservationLog::durable(SandboxId::new(), limits.clone(), &dir.path().join("log"));
        for _ in 0..100 {
            log.append(None, out(1000));
        }
        let before = budget.used();
        let oldest = log.lock().entries.front().map(|o| o.time).expect("entries");
        log.lock().shed_older_than(oldest, &limits);
        assert_eq!(
            log.lock().entries.len(),
            100,
            "nothing is older than the oldest"
        );
        let later = crate::clock::now() + std::time::Duration::from_secs(1);
        log.lock().shed_older_than(later, &limits);
        assert_eq!(log.lock().entries.len(), 1, "all but the newest go");
        assert_eq!(budget.used(), before - 99 * out(1000).approx_bytes());
        let all: Vec<_> = log.follow(0).take(100).collect().await;
        assert_eq!(seqs(&all), (1..=100).collect::<Vec<_>>());
        // A log in memory only has nowhere else to read from: it keeps its entries.
        let plain = ObservationLog::new(SandboxId::new(), limits.clone());
        plain.append(None, out(1));
        plain.append(None, out(1));
        plain.lock().shed_older_than(later, &limits);
        assert_eq!(plain.lock().entries.len(), 2);
    }

    /// A restarted runtime reads a journal far bigger than a log's share of memory without holding it: what
    /// it keeps is within the share, replay still reads everything, and what it learns of actions is exact.
    #[tokio::test]
    async fn a_reopened_journal_keeps_only_its_share_in_memory() {
        use mentis_core::observation::ActionKind;
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("log");
        let budget = Arc::new(MemoryBudget::new(1024 * 1024));
        let limits = LogLimits {
            memory: Arc::clone(&budget),
            ..Default::default()
        };
        let (ended, unended, other) = (
            ActionId::generate(),
            ActionId::generate(),
            ActionId::generate(),
        );
        let log = ObservationLog::durable(SandboxId::new(), limits.clone(), &path);
        let origin = |action: &ActionId, index| Origin {
            action: action.clone(),
            index,
        };
        for i in 1..=300 {
            log.append_from(
                Some(ended.clone()),
                out(64 * 1024),
                Some(&origin(&ended, i)),
            );
        }
        let end = ObservationKind::lost(ActionKind::Shell, "test", std::time::Duration::ZERO);
        log.append_from(Some(ended.clone()), end.clone(), Some(&origin(&ended, 301)));
        log.append_from(Some(other.clone()), end, Some(&origin(&other, 1)));
        for i in 1..=340 {
            log.append_from(
                Some(unended.clone()),
                out(64 * 1024),
                Some(&origin(&unended, i)),
            );
        }
        drop(log); // as a crash leaves it: not closed
        assert_eq!(budget.used(), 0);

        let unfinished: HashSet<_> = [ended.clone(), unended.clone()].into();
        let log = ObservationLog::reopen(SandboxId::new(), limits, &path, 0, &unfinished);
        let held = log.lock().bytes;
        assert!(held <= memory::PER_LOG, "{held}");
        assert_eq!(log.last_seq(), 642);
        assert_eq!(log.progress(&unended), 340);
        assert_eq!(log.progress(&ended), 0, "ended: no progress kept");
        assert!(log.has_terminal(&ended, 0));
        assert!(!log.has_terminal(&unended, 0));
        assert!(
            !log.lock().ended_before.contains(&other),
            "only what the store has unfinished is noted"
        );
        let all: Vec<_> = log.follow(0).take(642).collect().await;
        assert_eq!(seqs(&all), (1..=642).collect::<Vec<_>>());
    }

    /// Past the budget, every durable log keeps only a small floor; what the logical bounds trimmed is a gap.
    #[tokio::test]
    async fn over_the_budget_logs_shrink_and_trimmed_entries_are_a_gap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let budget = Arc::new(MemoryBudget::new(2 * 1024 * 1024));
        let limits = LogLimits {
            max_entries: 1000,
            max_bytes: 16 * 1024 * 1024,
            memory: Arc::clone(&budget),
        };
        let logs: Vec<_> = (0..4)
            .map(|i| {
                ObservationLog::durable(
                    SandboxId::new(),
                    limits.clone(),
                    &dir.path().join(i.to_string()),
                )
            })
            .collect();
        for _ in 0..100 {
            for log in &logs {
                log.append(None, out(16 * 1024));
            }
        }
        assert!(
            budget.used() <= budget.limit() + 4 * memory::FLOOR,
            "{} > {}",
            budget.used(),
            budget.limit()
        );
        // 3000 entries against a bound of 1000: the oldest 2000 are a gap (though still in the segment).
        let small = ObservationLog::durable(SandboxId::new(), limits, &dir.path().join("small"));
        for _ in 0..3000 {
            small.append(None, out(1024));
        }
        let items: Vec<_> = small.follow(0).take(3).collect().await;
        assert_eq!(
            items[0],
            LogItem::Gap {
                after_seq: 0,
                first_available_seq: 2001
            }
        );
        assert_eq!(seqs(&items[1..]), [2001, 2002]);
    }
}
