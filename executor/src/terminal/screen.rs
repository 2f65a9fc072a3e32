//! A terminal's output as clients see it: numbered chunks in a bounded scrollback, how the program ended,
//! and a cursor per attached stream that replays what is kept and then follows.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use bytes::Bytes;
use tokio::sync::watch;

/// How the terminal's program ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Exit {
    /// The exit code; 128 + N when killed by signal N.
    pub(crate) code: i32,
    /// The signal that killed it; 0 when it exited.
    pub(crate) signal: i32,
}

/// What a follower reads next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Event {
    Output { seq: u64, data: Bytes },
    Exited(Exit),
}

#[derive(Debug)]
struct Kept {
    chunks: VecDeque<(u64, Bytes)>,
    bytes: usize,
    last_seq: u64,
    exit: Option<Exit>,
}

/// The scrollback of one terminal: at most `cap` bytes of its newest output (and always its newest chunk).
#[derive(Debug)]
pub(crate) struct Screen {
    kept: Mutex<Kept>,
    cap: usize,
    /// Bumped at every change (output, exit), for followers to wait on.
    changed: watch::Sender<u64>,
}

impl Screen {
    pub(crate) fn new(cap: usize) -> Arc<Self> {
        Arc::new(Self {
            kept: Mutex::new(Kept {
                chunks: VecDeque::new(),
                bytes: 0,
                last_seq: 0,
                exit: None,
            }),
            cap,
            changed: watch::channel(0).0,
        })
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        // Every critical section is a few assignments; a panic cannot leave one half done.
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Appends a chunk of output; returns its seq.
    pub(crate) fn push(&self, data: Bytes) -> u64 {
        let seq = {
            let mut kept = self.kept();
            kept.last_seq += 1;
            let seq = kept.last_seq;
            kept.bytes += data.len();
            kept.chunks.push_back((seq, data));
            while kept.bytes > self.cap && kept.chunks.len() > 1 {
                if let Some((_, old)) = kept.chunks.pop_front() {
                    kept.bytes -= old.len();
                }
            }
            seq
        };
        self.changed.send_modify(|v| *v += 1);
        seq
    }

    /// Records how the program ended (once; later calls change nothing).
    pub(crate) fn exit(&self, exit: Exit) {
        {
            let mut kept = self.kept();
            if kept.exit.is_some() {
                return;
            }
            kept.exit = Some(exit);
        }
        self.changed.send_modify(|v| *v += 1);
    }

    pub(crate) fn last_seq(&self) -> u64 {
        self.kept().last_seq
    }

    pub(crate) fn exited(&self) -> Option<Exit> {
        self.kept().exit
    }

    /// A cursor after `after_seq`: it reads the kept chunks with higher seqs, then follows, and the exit
    /// last.
    pub(crate) fn follow(self: &Arc<Self>, after_seq: u64) -> Cursor {
        Cursor {
            screen: Arc::clone(self),
            after: after_seq,
            changed: self.changed.subscribe(),
            exit_sent: false,
        }
    }

    /// The next event after `after`, if there is one now.
    fn next_after(&self, after: u64) -> Option<Event> {
        let kept = self.kept();
        // Chunks are in seq order: the first one above the cursor (a gap when older ones were dropped).
        let first = kept.chunks.front().map_or(u64::MAX, |(seq, _)| *seq);
        if after < kept.last_seq {
            let index = usize::try_from(after.saturating_sub(first).saturating_add(1))
                .unwrap_or(usize::MAX);
            let index = if after < first { 0 } else { index };
            if let Some((seq, data)) = kept.chunks.get(index) {
                return Some(Event::Output {
                    seq: *seq,
                    data: data.clone(),
                });
            }
        }
        kept.exit.map(Event::Exited)
    }
}

/// One stream's place in a terminal's output.
#[derive(Debug)]
pub(crate) struct Cursor {
    screen: Arc<Screen>,
    after: u64,
    changed: watch::Receiver<u64>,
    exit_sent: bool,
}

impl Cursor {
    /// The next output chunk, then the exit once everything before it was read; None after the exit.
    pub(crate) async fn next(&mut self) -> Option<Event> {
        loop {
            // Marked seen before looking, so a change after the look wakes the wait below.
            self.changed.borrow_and_update();
            match self.screen.next_after(self.after) {
                Some(Event::Output { seq, data }) => {
                    self.after = seq;
                    return Some(Event::Output { seq, data });
                }
                Some(Event::Exited(exit)) => {
                    if self.exit_sent {
                        return None;
                    }
                    self.exit_sent = true;
                    return Some(Event::Exited(exit));
                }
                None => {
                    if self.changed.changed().await.is_err() {
                        return None;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn out(seq: u64, data: &'static str) -> Option<Event> {
        Some(Event::Output {
            seq,
            data: Bytes::from_static(data.as_bytes()),
        })
    }

    #[tokio::test]
    async fn a_cursor_replays_what_is_kept_then_follows_and_ends_with_the_exit() {
        let screen = Screen::new(8);
        screen.push(Bytes::from_static(b"abcd"));
        screen.push(Bytes::from_static(b"efgh"));
        screen.push(Bytes::from_static(b"ij"));
        // 10 bytes over a cap of 8: the first chunk went.
        let mut from_start = screen.follow(0);
        assert_eq!(from_start.next().await, out(2, "efgh"));
        assert_eq!(from_start.next().await, out(3, "ij"));
        let mut from_two = screen.follow(2);
        assert_eq!(from_two.next().await, out(3, "ij"));
        let waiting = tokio::spawn(async move {
            let next = from_two.next().await;
            (next, from_two.next().await, from_two.next().await)
        });
        tokio::task::yield_now().await;
        screen.push(Bytes::from_static(b"k"));
        screen.exit(Exit { code: 3, signal: 0 });
        let (a, b, c) = waiting.await.unwrap();
        assert_eq!(a, out(4, "k"));
        assert_eq!(b, Some(Event::Exited(Exit { code: 3, signal: 0 })));
        assert_eq!(c, None);
        assert_eq!(screen.last_seq(), 4);
        // A chunk larger than the cap is kept alone.
        screen.push(Bytes::from(vec![b'x'; 20]));
        let mut tail = screen.follow(4);
        assert!(matches!(
            tail.next().await,
            Some(Event::Output { seq: 5, .. })
        ));
    }
}
