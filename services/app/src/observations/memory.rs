//! The memory every durable log of a runtime holds, under one budget. A durable log keeps only a recent
//! tail in memory (at most [`PER_LOG`] and [`CACHE_AGE`], less when the budget is spent, nothing but its
//! newest entry once it is closed); what it evicts stays in its journal, where readers find it.

use std::sync::atomic::{AtomicUsize, Ordering};

/// The most one open durable log keeps in memory.
pub const PER_LOG: usize = 8 * 1024 * 1024;
/// Entries older than this leave memory (the sweeper looks once a second): live followers and clients that
/// resume within it read from memory, older replays from the journal.
pub const CACHE_AGE: std::time::Duration = std::time::Duration::from_secs(60);
/// What an open log keeps while the budget is spent.
pub const FLOOR: usize = 256 * 1024;

/// Bytes held in memory by the durable logs of one runtime, and their limit.
#[derive(Debug)]
pub struct MemoryBudget {
    limit: usize,
    used: AtomicUsize,
}

impl MemoryBudget {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            used: AtomicUsize::new(0),
        }
    }

    pub(super) fn add(&self, n: usize) {
        self.used.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn sub(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// How much an open log may keep now.
    pub(super) fn cap(&self) -> usize {
        if self.used() > self.limit {
            FLOOR
        } else {
            PER_LOG
        }
    }
}
