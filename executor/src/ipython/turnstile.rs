//! A first-come first-served line for one resource (the kernel): a waiter gets the resource itself with its
//! turn and hands it on when the turn ends; a waiter that gives up (its cell was cancelled) leaves the line.
//!
//! Why not a tokio Mutex: its queue position is taken when the lock future is first polled, which for
//! spawned tasks need not be the order the Run calls came in. Here the place is taken synchronously in
//! `enqueue`, inside the Run call, so cells run in submission order.

use std::collections::VecDeque;
use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::oneshot;

/// Where a new waiter stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    /// Behind everyone (cells, inspect).
    Back,
    /// Before everyone waiting (a kernel reset must come before queued cells).
    Front,
}

/// The line is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full {
    pub(crate) limit: usize,
}

pub(crate) struct Turnstile<T> {
    state: Mutex<State<T>>,
    limit: usize,
}

struct State<T> {
    /// The resource while nobody holds the turn.
    idle: Option<T>,
    waiting: VecDeque<Waiter<T>>,
    next_id: u64,
}

struct Waiter<T> {
    id: u64,
    grant: oneshot::Sender<T>,
}

impl<T> Turnstile<T> {
    /// A line for `resource`; `limit` bounds the waiters enqueued with `bounded`.
    pub(crate) fn new(resource: T, limit: usize) -> Arc<Self> {
        Arc::new(Self {
            state: Mutex::new(State {
                idle: Some(resource),
                waiting: VecDeque::new(),
                next_id: 0,
            }),
            limit,
        })
    }

    fn state(&self) -> MutexGuard<'_, State<T>> {
        // Every critical section is a queue operation that cannot be left half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a place in line now. With `bounded`, refuses when `limit` waiters are already waiting.
    pub(crate) fn enqueue(
        self: &Arc<Self>,
        place: Place,
        bounded: bool,
    ) -> Result<Ticket<T>, Full> {
        let mut state = self.state();
        if bounded && state.waiting.len() >= self.limit {
            return Err(Full { limit: self.limit });
        }
        let id = state.next_id;
        state.next_id += 1;
        let (grant, granted) = oneshot::channel();
        match state.idle.take() {
            // Nobody holds the turn (so nobody waits either): it is ours at once. The receiver is alive.
            Some(resource) => {
                let _ = grant.send(resource);
            }
            None => {
                let waiter = Waiter { id, grant };
                match place {
                    Place::Back => state.waiting.push_back(waiter),
                    Place::Front => state.waiting.push_front(waiter),
                }
            }
        }
        Ok(Ticket {
            turnstile: Arc::clone(self),
            id,
            granted: Some(granted),
        })
    }

    /// How many wait (not counting the holder).
    #[cfg(test)]
    pub(crate) fn waiting(&self) -> usize {
        self.state().waiting.len()
    }

    /// Hands the resource to the next waiter still waiting, or parks it.
    fn pass_on(state: &mut State<T>, mut resource: T) {
        while let Some(waiter) = state.waiting.pop_front() {
            match waiter.grant.send(resource) {
                Ok(()) => return,
                // Cannot happen (a ticket leaves the line before its receiver goes), but stay correct.
                Err(back) => resource = back,
            }
        }
        state.idle = Some(resource);
    }
}

/// A place in line.
pub(crate) struct Ticket<T> {
    turnstile: Arc<Turnstile<T>>,
    id: u64,
    /// None once the turn was taken.
    granted: Option<oneshot::Receiver<T>>,
}

impl<T> Ticket<T> {
    /// Waits for the turn. Cancel-safe: dropping the future keeps the place; dropping the ticket leaves
    /// the line (or passes the turn on if it had just been granted).
    pub(crate) async fn wait(&mut self) -> Turn<T> {
        let Some(granted) = self.granted.as_mut() else {
            // Taken already: a caller bug; never resolve rather than hand out the resource twice.
            return std::future::pending().await;
        };
        match granted.await {
            Ok(resource) => {
                self.granted = None;
                Turn {
                    turnstile: Arc::clone(&self.turnstile),
                    resource: Some(resource),
                }
            }
            // The sender lives in the line until it is used; it is never dropped unused.
            Err(_) => std::future::pending().await,
        }
    }
}

impl<T> Drop for Ticket<T> {
    fn drop(&mut self) {
        let Some(mut granted) = self.granted.take() else {
            return;
        };
        let mut state = self.turnstile.state();
        if let Some(at) = state.waiting.iter().position(|w| w.id == self.id) {
            state.waiting.remove(at);
        } else if let Ok(resource) = granted.try_recv() {
            // Granted but never taken: pass it on. Grants happen under the lock we hold, so this is exact.
            Turnstile::pass_on(&mut state, resource);
        }
    }
}

/// The turn: exclusive use of the resource until dropped.
pub(crate) struct Turn<T> {
    turnstile: Arc<Turnstile<T>>,
    resource: Option<T>,
}

impl<T> Deref for Turn<T> {
    type Target = T;
    fn deref(&self) -> &T {
        // Some until drop.
        self.resource.as_ref().unwrap_or_else(|| unreachable!())
    }
}

impl<T> DerefMut for Turn<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.resource.as_mut().unwrap_or_else(|| unreachable!())
    }
}

impl<T> Drop for Turn<T> {
    fn drop(&mut self) {
        if let Some(resource) = self.resource.take() {
            let mut state = self.turnstile.state();
            Turnstile::pass_on(&mut state, resource);
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::time::Duration;

    async fn soon<F: std::future::Future>(f: F) -> Option<F::Output> {
        tokio::time::timeout(Duration::from_millis(50), f)
            .await
            .ok()
    }

    #[tokio::test]
    async fn turns_follow_enqueue_order_and_carry_the_resource() {
        let line = Turnstile::new(0u32, 10);
        let mut a = line.enqueue(Place::Back, true).unwrap();
        let mut b = line.enqueue(Place::Back, true).unwrap();
        let mut c = line.enqueue(Place::Back, true).unwrap();
        // Poll in reverse order: the order of enqueue decides, not the order of polling.
        assert!(soon(c.wait()).await.is_none());
        assert!(soon(b.wait()).await.is_none());
        let mut turn = a.wait().await;
        *turn += 1;
        drop(turn);
        assert!(soon(c.wait()).await.is_none());
        let mut turn = b.wait().await;
        assert_eq!(*turn, 1);
        *turn += 1;
        drop(turn);
        assert_eq!(*c.wait().await, 2);
    }

    #[tokio::test]
    async fn a_dropped_ticket_leaves_the_line_and_front_jumps_it() {
        let line = Turnstile::new((), 2);
        let mut holder = line.enqueue(Place::Back, true).unwrap();
        let turn = holder.wait().await;
        let gone = line.enqueue(Place::Back, true).unwrap();
        let mut back = line.enqueue(Place::Back, true).unwrap();
        assert_eq!(
            line.enqueue(Place::Back, true).err(),
            Some(Full { limit: 2 })
        );
        let mut front = line.enqueue(Place::Front, false).unwrap();
        drop(gone);
        assert_eq!(line.waiting(), 2);
        drop(turn);
        let first = front.wait().await;
        assert!(soon(back.wait()).await.is_none());
        drop(first);
        back.wait().await;
    }

    #[tokio::test]
    async fn a_granted_but_untaken_turn_is_passed_on() {
        let line = Turnstile::new(7u8, 4);
        let granted = line.enqueue(Place::Back, true).unwrap();
        let mut next = line.enqueue(Place::Back, true).unwrap();
        drop(granted);
        assert_eq!(*next.wait().await, 7);
    }
}
