//! The running actions by id: enforces unique ids and the concurrency bound, and finds an action to cancel
//! or to write to. IPython cells are registered too (for unique ids and Cancel) but do not count against
//! the bound: only one runs at a time, and their queue has its own bound.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_util::sync::CancellationToken;

use crate::error::Error;
use crate::shell::stdin::StdinSender;

/// What the RPCs need to reach a running action.
struct Entry {
    /// Cancelling it kills the action (its process group, for shell).
    cancel: CancellationToken,
    /// Present while the action accepts WriteStdin (started with keep_stdin_open, no eof yet).
    stdin: Option<StdinSender>,
    /// Counts against the concurrency bound (shell actions).
    counted: bool,
}

/// The running actions. A std mutex is enough: every critical section is a map operation, never an await.
pub(crate) struct Registry {
    limit: usize,
    running: Mutex<HashMap<String, Entry>>,
}

impl Registry {
    pub(crate) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            running: Mutex::new(HashMap::new()),
        })
    }

    fn running(&self) -> MutexGuard<'_, HashMap<String, Entry>> {
        // A panic while holding the lock cannot leave a map operation half done: keep going.
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Claims `id` for a new action; the returned guard releases it when dropped.
    pub(crate) fn register(
        self: &Arc<Self>,
        id: &str,
        cancel: CancellationToken,
        stdin: Option<StdinSender>,
    ) -> Result<Registration, Error> {
        self.insert(id, cancel, stdin, true)
    }

    /// Claims `id` for an IPython cell, outside the concurrency bound.
    pub(crate) fn register_cell(
        self: &Arc<Self>,
        id: &str,
        cancel: CancellationToken,
    ) -> Result<Registration, Error> {
        self.insert(id, cancel, None, false)
    }

    fn insert(
        self: &Arc<Self>,
        id: &str,
        cancel: CancellationToken,
        stdin: Option<StdinSender>,
        counted: bool,
    ) -> Result<Registration, Error> {
        let mut running = self.running();
        if running.contains_key(id) {
            return Err(Error::AlreadyExists(id.to_owned()));
        }
        if counted && running.values().filter(|e| e.counted).count() >= self.limit {
            return Err(Error::TooManyActions { limit: self.limit });
        }
        running.insert(
            id.to_owned(),
            Entry {
                cancel,
                stdin,
                counted,
            },
        );
        Ok(Registration {
            registry: Arc::clone(self),
            id: id.to_owned(),
        })
    }

    /// Triggers the kill of a running action; its stream then ends with reason CANCELLED.
    pub(crate) fn cancel(&self, id: &str) -> Result<(), Error> {
        let running = self.running();
        let entry = running
            .get(id)
            .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        entry.cancel.cancel();
        Ok(())
    }

    /// The stdin of a running action. With `eof` the handle is taken out, so later writes are refused.
    pub(crate) fn stdin(&self, id: &str, eof: bool) -> Result<StdinSender, Error> {
        let mut running = self.running();
        let entry = running
            .get_mut(id)
            .ok_or_else(|| Error::NotFound(id.to_owned()))?;
        let closed = || {
            Error::FailedPrecondition(format!(
                "action {id:?} has no open stdin (it needs keep_stdin_open, and stdin closes at eof)"
            ))
        };
        if eof {
            entry.stdin.take().ok_or_else(closed)
        } else {
            entry.stdin.clone().ok_or_else(closed)
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.running().len()
    }
}

/// Owns an action's place in the registry; dropping it frees the id and the concurrency slot.
pub(crate) struct Registration {
    registry: Arc<Registry>,
    id: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.registry.running().remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokio::sync::mpsc;

    #[test]
    fn ids_are_unique_while_running_and_free_after() {
        let registry = Registry::new(4);
        let first = registry
            .register("a", CancellationToken::new(), None)
            .unwrap();
        assert!(matches!(
            registry.register("a", CancellationToken::new(), None),
            Err(Error::AlreadyExists(_))
        ));
        drop(first);
        assert_eq!(registry.len(), 0);
        assert!(
            registry
                .register("a", CancellationToken::new(), None)
                .is_ok()
        );
    }

    #[test]
    fn the_limit_is_enforced() {
        let registry = Registry::new(1);
        let _held = registry
            .register("a", CancellationToken::new(), None)
            .unwrap();
        assert!(matches!(
            registry.register("b", CancellationToken::new(), None),
            Err(Error::TooManyActions { limit: 1 })
        ));
    }

    #[test]
    fn cells_do_not_count_against_the_limit() {
        let registry = Registry::new(1);
        let _cell = registry
            .register_cell("c", CancellationToken::new())
            .unwrap();
        let _shell = registry
            .register("a", CancellationToken::new(), None)
            .unwrap();
        assert!(matches!(
            registry.register_cell("a", CancellationToken::new()),
            Err(Error::AlreadyExists(_))
        ));
    }

    #[test]
    fn cancel_reaches_the_token() {
        let registry = Registry::new(1);
        let token = CancellationToken::new();
        let _held = registry.register("a", token.clone(), None).unwrap();
        registry.cancel("a").unwrap();
        assert!(token.is_cancelled());
        assert!(matches!(registry.cancel("b"), Err(Error::NotFound(_))));
    }

    #[test]
    fn stdin_closes_at_eof() {
        let registry = Registry::new(2);
        let (tx, _rx) = mpsc::channel(1);
        let _with = registry
            .register("a", CancellationToken::new(), Some(tx))
            .unwrap();
        let _without = registry
            .register("b", CancellationToken::new(), None)
            .unwrap();
        assert!(registry.stdin("a", false).is_ok());
        assert!(registry.stdin("a", true).is_ok());
        assert!(matches!(
            registry.stdin("a", false),
            Err(Error::FailedPrecondition(_))
        ));
        assert!(matches!(
            registry.stdin("b", false),
            Err(Error::FailedPrecondition(_))
        ));
        assert!(matches!(
            registry.stdin("c", false),
            Err(Error::NotFound(_))
        ));
    }
}
