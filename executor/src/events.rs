//! An action's events, numbered 1, 2, 3... as they happen and kept in its bounded outbox until the control
//! plane has them (ARCHITECTURE.md, "Durability and restart"). Still domain types here (the shared model's
//! [`ObservationKind`]); only the server turns them into proto.
//!
//! A reader attaches after the last index it holds and reads what follows. With `Run` the events are handed
//! over as they are read. With `Attach` they stay until the reader acknowledges them, so a control plane that
//! restarted attaches again and receives everything emitted while it was away. A full outbox makes the
//! action wait (backpressure, as a pipe does) while a reader is attached or may still come back; once nobody
//! has attached for [`Hold::Acked`]'s wait, the oldest events are dropped instead, so user code never blocks
//! for good on output nobody reads.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, SystemTime};

use mentis_model::ObservationKind;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::error::Error;

/// Events an outbox holds before the action waits for its reader.
pub(crate) const EVENT_BUFFER: usize = 64;
/// Ended outboxes nobody acknowledged are kept this long for a control plane to come back for them.
const ENDED_RETENTION: Duration = Duration::from_secs(3600);
/// At most this many ended, unacknowledged outboxes are kept (the oldest go first).
const MAX_ENDED: usize = 1024;

/// One event of an action: its place in the action's stream, when it happened, and what happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Event {
    /// 1, 2, 3... per action.
    pub(crate) index: u64,
    pub(crate) time: SystemTime,
    pub(crate) kind: ObservationKind,
}

/// How long an outbox keeps events.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Hold {
    /// Until read (`Run`): a reader that goes away is not waited for.
    Read,
    /// Until acknowledged (`Attach`); with no reader attached, output waits this long for one to come back.
    Acked { wait: Duration },
}

struct State {
    /// Unacknowledged events, by consecutive index.
    events: VecDeque<Event>,
    next_index: u64,
    /// The terminal event was sent.
    ended: Option<Instant>,
    /// Generation of the attached reader; `None` when nobody is attached.
    reader: Option<u64>,
    generations: u64,
    /// Since when nobody is attached.
    detached_since: Instant,
}

/// The events of one action, from its producer to whoever reads them.
pub(crate) struct Outbox {
    hold: Hold,
    state: Mutex<State>,
    /// Woken on a new event, an acknowledgement and a reader coming or going.
    changed: Notify,
}

impl Outbox {
    fn new(hold: Hold) -> Arc<Self> {
        Arc::new(Self {
            hold,
            state: Mutex::new(State {
                events: VecDeque::new(),
                next_index: 1,
                ended: None,
                reader: None,
                generations: 0,
                detached_since: Instant::now(),
            }),
            changed: Notify::new(),
        })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every critical section is a few field updates; a panic cannot leave them half done.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Attaches a reader that reads the events after `after_index`; an earlier reader ends.
    pub(crate) fn attach(self: &Arc<Self>, after_index: u64) -> Reader {
        let mut s = self.state();
        s.generations += 1;
        let generation = s.generations;
        s.reader = Some(generation);
        drop(s);
        self.changed.notify_waiters();
        Reader {
            outbox: Arc::clone(self),
            generation,
            cursor: after_index,
        }
    }

    /// Drops the events up to and including `index`: the reader has them safe.
    pub(crate) fn ack(&self, index: u64) {
        let mut s = self.state();
        while s.events.front().is_some_and(|e| e.index <= index) {
            s.events.pop_front();
        }
        drop(s);
        self.changed.notify_waiters();
    }

    /// The terminal event was sent and every event was handed over for good.
    pub(crate) fn is_done(&self) -> bool {
        let s = self.state();
        s.ended.is_some() && s.events.is_empty()
    }

    /// Ended, with nobody attached, since `at` (for retention).
    fn ended_unread_since(&self) -> Option<Instant> {
        let s = self.state();
        match (s.ended, s.reader) {
            (Some(ended), None) => Some(ended.max(s.detached_since)),
            _ => None,
        }
    }
}

/// Puts an action's outcome on its span (`shell_action` or `ipython_cell`), when traces are on.
fn record_end(kind: &ObservationKind) {
    if !mentis_telemetry::traces_on() {
        return;
    }
    let span = tracing::Span::current();
    match kind {
        ObservationKind::CmdEnd(end) => {
            span.record("exit_code", end.exit_code);
            span.record("reason", tracing::field::debug(end.reason));
        }
        ObservationKind::IPythonResult(result) => {
            span.record("status", tracing::field::debug(result.status));
            span.record("reason", result.reason.as_str());
            span.record("execution_count", result.execution_count);
        }
        _ => {}
    }
}

/// The producer's end: numbers events and puts them in the outbox.
pub(crate) struct EventSink {
    outbox: Arc<Outbox>,
}

impl EventSink {
    /// A sink with its reader attached, outside any registry (tests of the producers).
    #[cfg(test)]
    pub(crate) fn channel() -> (Self, Reader) {
        let outbox = Outbox::new(Hold::Read);
        let reader = outbox.attach(0);
        (Self { outbox }, reader)
    }

    /// Sends `kind` as the next event, waiting while the outbox is full and a reader is attached or may
    /// still come back (see [`Hold`]).
    pub(crate) async fn send(&mut self, kind: ObservationKind) {
        let terminal = kind.is_terminal();
        if terminal {
            record_end(&kind);
        }
        let outbox = &self.outbox;
        loop {
            let notified = outbox.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let wait_until = {
                let mut s = outbox.state();
                // Before the first reader attaches, the action waits for it as for an attached one.
                let detached = s.reader.is_none() && s.generations > 0;
                if detached && outbox.hold == Hold::Read {
                    // Nobody reads a `Run` stream again once its reader left: the event goes nowhere.
                    s.events.clear();
                    s.next_index += 1;
                    if terminal {
                        s.ended = Some(Instant::now());
                    }
                    return;
                }
                let give_up = match outbox.hold {
                    Hold::Acked { wait } if detached => Some(s.detached_since + wait),
                    _ => None,
                };
                let abandoned = give_up.is_some_and(|t| t <= Instant::now());
                // The terminal event always goes in (one past the bound), so every action ends.
                if s.events.len() < EVENT_BUFFER || terminal || abandoned {
                    if abandoned && !terminal {
                        while s.events.len() >= EVENT_BUFFER {
                            s.events.pop_front();
                        }
                    }
                    let index = s.next_index;
                    s.next_index += 1;
                    s.events.push_back(Event {
                        index,
                        time: SystemTime::now(),
                        kind,
                    });
                    if terminal {
                        s.ended = Some(Instant::now());
                    }
                    drop(s);
                    outbox.changed.notify_waiters();
                    return;
                }
                give_up
            };
            match wait_until {
                Some(t) => {
                    tokio::select! {
                        () = notified => {}
                        () = tokio::time::sleep_until(t) => {}
                    }
                }
                None => notified.await,
            }
        }
    }
}

impl Drop for EventSink {
    /// A producer that stops without its terminal event (a panic) still ends its readers' streams, which
    /// the control plane reports as a lost end.
    fn drop(&mut self) {
        let mut s = self.outbox.state();
        if s.ended.is_none() {
            s.ended = Some(Instant::now());
        }
        drop(s);
        self.outbox.changed.notify_waiters();
    }
}

/// A reader of one outbox, from its cursor on. Dropping it detaches.
pub(crate) struct Reader {
    outbox: Arc<Outbox>,
    generation: u64,
    cursor: u64,
}

impl Reader {
    /// The next event after the cursor; `None` after the terminal one (once every held event is
    /// acknowledged), or when a newer reader attached.
    pub(crate) async fn next(&mut self) -> Option<Event> {
        let outbox = &self.outbox;
        loop {
            let notified = outbox.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = outbox.state();
                if s.reader != Some(self.generation) {
                    return None;
                }
                let next = match s.events.iter().position(|e| e.index > self.cursor) {
                    Some(0) if outbox.hold == Hold::Read => s.events.pop_front(),
                    Some(i) => s.events.get(i).cloned(),
                    None => None,
                };
                if let Some(e) = next {
                    self.cursor = e.index;
                    drop(s);
                    if outbox.hold == Hold::Read {
                        outbox.changed.notify_waiters();
                    }
                    return Some(e);
                }
                // The end: everything read, and (held events) acknowledged, so the reader's last
                // acknowledgement is in before its stream ends and the outbox is forgotten.
                if s.ended.is_some() && self.cursor + 1 >= s.next_index && s.events.is_empty() {
                    return None;
                }
            }
            notified.await;
        }
    }

    pub(crate) fn outbox(&self) -> &Arc<Outbox> {
        &self.outbox
    }

    /// Alias of [`Reader::next`], as a channel's receiver reads.
    #[cfg(test)]
    pub(crate) async fn recv(&mut self) -> Option<Event> {
        self.next().await
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        let mut s = self.outbox.state();
        if s.reader == Some(self.generation) {
            s.reader = None;
            s.detached_since = Instant::now();
            if self.outbox.hold == Hold::Read {
                s.events.clear();
            }
        }
        drop(s);
        self.outbox.changed.notify_waiters();
    }
}

/// Every outbox by action id, until its events are handed over (or its retention passes).
#[derive(Default)]
pub(crate) struct Outboxes {
    map: Mutex<HashMap<String, Arc<Outbox>>>,
}

impl Outboxes {
    fn map(&self) -> MutexGuard<'_, HashMap<String, Arc<Outbox>>> {
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new outbox for `id`, with its sink. An id whose action still runs is refused; an ended one's
    /// outbox is replaced.
    pub(crate) fn open(&self, id: &str, hold: Hold) -> Result<(EventSink, Arc<Outbox>), Error> {
        let mut map = self.map();
        if map.get(id).is_some_and(|o| o.state().ended.is_none()) {
            return Err(Error::AlreadyExists(id.to_owned()));
        }
        Self::expire(&mut map);
        let outbox = Outbox::new(hold);
        map.insert(id.to_owned(), Arc::clone(&outbox));
        Ok((
            EventSink {
                outbox: Arc::clone(&outbox),
            },
            outbox,
        ))
    }

    /// The outbox of `id`, to attach to.
    pub(crate) fn get(&self, id: &str) -> Result<Arc<Outbox>, Error> {
        self.map()
            .get(id)
            .cloned()
            .ok_or_else(|| Error::NotFound(format!("action {id:?} is not held by this executor")))
    }

    /// Forgets `id` if its outbox is done (everything handed over).
    pub(crate) fn release_if_done(&self, id: &str, outbox: &Arc<Outbox>) {
        let mut map = self.map();
        if outbox.is_done() && map.get(id).is_some_and(|o| Arc::ptr_eq(o, outbox)) {
            map.remove(id);
        }
    }

    /// Drops ended outboxes nobody came back for: past the retention, and beyond the count bound.
    fn expire(map: &mut HashMap<String, Arc<Outbox>>) {
        let now = Instant::now();
        map.retain(|_, o| {
            o.ended_unread_since()
                .is_none_or(|t| !o.is_done() && now.duration_since(t) < ENDED_RETENTION)
        });
        let mut ended: Vec<(Instant, String)> = map
            .iter()
            .filter_map(|(id, o)| o.ended_unread_since().map(|t| (t, id.clone())))
            .collect();
        if ended.len() > MAX_ENDED {
            ended.sort();
            for (_, id) in ended.iter().take(ended.len() - MAX_ENDED) {
                map.remove(id);
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map().len()
    }
}

#[cfg(test)]
mod tests;
