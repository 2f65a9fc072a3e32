//! The per-sandbox observation log: append-only, sequence-numbered, bounded by count and bytes, with replay
//! after any seq and live follow. Readers hold only a cursor, so a slow reader costs the log nothing: it
//! reads at its own pace and, if the log trimmed what it had not read yet, is told so with a gap.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use futures::Stream;
use mentis_core::{ActionId, Observation, ObservationKind, SandboxId};
use tokio::sync::watch;

/// Bounds of one sandbox's log.
#[derive(Debug, Clone, Copy)]
pub struct LogLimits {
    pub max_entries: usize,
    pub max_bytes: usize,
}

impl Default for LogLimits {
    fn default() -> Self {
        Self {
            max_entries: 100_000,
            max_bytes: 64 * 1024 * 1024,
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

enum Read {
    Items(Vec<Arc<Observation>>),
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
}

/// One sandbox's log.
pub struct ObservationLog {
    sandbox_id: SandboxId,
    limits: LogLimits,
    inner: Mutex<Inner>,
    /// Carries the newest seq; followers wait on it.
    newest: watch::Sender<u64>,
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
    pub fn new(sandbox_id: SandboxId, limits: LogLimits) -> Arc<Self> {
        Self::starting_after(sandbox_id, limits, 0)
    }

    /// An empty log whose first observation gets seq `last_seq + 1`: the log of a sandbox taken over after
    /// a restart, whose earlier observations are gone (a reader asking for them is told so with a gap).
    pub fn starting_after(sandbox_id: SandboxId, limits: LogLimits, last_seq: u64) -> Arc<Self> {
        Arc::new(Self {
            sandbox_id,
            limits,
            inner: Mutex::new(Inner {
                entries: VecDeque::new(),
                bytes: 0,
                next_seq: last_seq + 1,
                closed: false,
            }),
            newest: watch::channel(last_seq).0,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding this lock leaves the deque consistent (every mutation is a single push or
        // pop), so a poisoned lock is still safe to use.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Appends an observation and returns its seq; `None` once the log is closed.
    pub fn append(&self, action_id: Option<ActionId>, kind: ObservationKind) -> Option<u64> {
        let size = kind.approx_bytes();
        let seq = {
            let mut inner = self.lock();
            if inner.closed {
                return None;
            }
            let seq = inner.next_seq;
            inner.next_seq += 1;
            inner.entries.push_back(Arc::new(Observation {
                seq,
                sandbox_id: self.sandbox_id,
                action_id,
                time: crate::clock::now(),
                kind,
            }));
            inner.bytes += size;
            // Trim the oldest entries, but always keep the newest one so followers can see it.
            while inner.entries.len() > 1
                && (inner.entries.len() > self.limits.max_entries
                    || inner.bytes > self.limits.max_bytes)
            {
                if let Some(old) = inner.entries.pop_front() {
                    inner.bytes -= old.kind.approx_bytes();
                }
            }
            seq
        };
        self.newest.send_replace(seq);
        Some(seq)
    }

    /// Seq of the newest observation (0 when none).
    pub fn last_seq(&self) -> u64 {
        self.lock().next_seq - 1
    }

    /// Refuses further appends and ends every follower once it has read what is there.
    pub fn close(&self) {
        self.lock().closed = true;
        // Wake followers so they notice.
        self.newest.send_modify(|_| {});
    }

    fn read_after(&self, after_seq: u64) -> Read {
        let inner = self.lock();
        let first = inner.next_seq - inner.entries.len() as u64;
        if after_seq + 1 < first {
            return Read::Gap {
                first_available_seq: first,
            };
        }
        let start = usize::try_from(after_seq + 1 - first).unwrap_or(usize::MAX);
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
                match st.log.read_after(st.cursor) {
                    Read::Items(items) => st.batch.extend(items),
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
}
