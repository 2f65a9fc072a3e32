//! Watching a directory of the workspace (WorkspaceService.WatchFiles): files and directories created,
//! modified and removed under it, from inotify, numbered and kept so that a client resumes after a cut.
//!
//! A watch lives in the executor, apart from the streams that read it: a stream that ends (the client or
//! the control plane went away) leaves it running, its events kept (the newest [`MAX_EVENTS`]), and a new
//! stream with its id and the seq of the last event received gets the rest, then live ones; a reader too
//! far behind is told which events are gone (a gap). A watch nobody reads for [`LINGER`] ends, and so does
//! the one read least recently when a sandbox with [`MAX_WATCHES`] starts another. Everything is bounded:
//! watches, [`MAX_DIRS`] directories each (a recursive watch follows the directories made under it), and
//! writes to one file (one MODIFIED at once, then at most one per [`COALESCE`] while they go on).
//!
//! Directories are watched through their descriptor (`/proc/self/fd/N` of a directory reached by the same
//! walk as every file call, see `path`): a symbolic link swapped in by a command never leads a watch out of
//! the workspace.

use std::collections::{HashMap, VecDeque};
use std::ffi::OsString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant, SystemTime};

use futures::{Stream, StreamExt as _};
use inotify::{EventMask, EventStream, Inotify, WatchDescriptor, WatchMask};
use nix::dir::{Dir, Type};
use nix::errno::Errno;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::Workspace;
use super::path::{self, WsPath};
use crate::error::Error;

/// Watches one sandbox may have at once.
pub(crate) const MAX_WATCHES: usize = 16;
/// Events a watch keeps for readers that resume.
pub(crate) const MAX_EVENTS: usize = 4096;
/// Directories one watch follows.
pub(crate) const MAX_DIRS: usize = 4096;
/// How long a watch nobody reads lives on.
pub(crate) const LINGER: Duration = Duration::from_secs(300);
/// Writes to one file closer together than this are one MODIFIED.
const COALESCE: Duration = Duration::from_millis(50);

/// What happened to a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Created,
    Modified,
    Removed,
    /// Events were lost (the kernel's queue overflowed), or a directory could not be followed: list the
    /// directory to catch up.
    Overflow,
}

/// One numbered event of a watch.
#[derive(Debug, Clone)]
pub(crate) struct Event {
    pub(crate) seq: u64,
    pub(crate) kind: Kind,
    /// Relative to the workspace, as FileInfo paths are.
    pub(crate) path: String,
    pub(crate) is_dir: bool,
    pub(crate) time: SystemTime,
}

/// What a reader of a watch gets.
#[derive(Debug, Clone)]
pub(crate) enum Item {
    Event(Event),
    /// The reader asked for events after `after_seq`, but the oldest kept is `first_available_seq`.
    Gap {
        after_seq: u64,
        first_available_seq: u64,
    },
}

/// The executor's watches, by id.
pub(crate) struct Watches {
    all: Mutex<HashMap<String, Arc<Watch>>>,
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl Watches {
    pub(crate) fn new(shutdown: CancellationToken) -> Arc<Self> {
        Arc::new(Self {
            all: Mutex::new(HashMap::new()),
            tasks: TaskTracker::new(),
            shutdown,
        })
    }

    fn all(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Watch>>> {
        self.all.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts watching the directory `p` (and, with `recursive`, every directory under it).
    pub(crate) fn start(
        self: &Arc<Self>,
        ws: &Workspace,
        p: &WsPath,
        recursive: bool,
    ) -> Result<Arc<Watch>, Error> {
        if self.shutdown.is_cancelled() {
            return Err(Error::ShuttingDown);
        }
        {
            let mut all = self.all();
            if all.len() >= MAX_WATCHES {
                // The one nobody has read for longest makes room; when every one has a reader, none.
                let idle = all
                    .values()
                    .filter(|w| w.readers.load(Ordering::SeqCst) == 0)
                    .min_by_key(|w| *w.idle_since.lock().unwrap_or_else(PoisonError::into_inner))
                    .map(|w| w.id.clone());
                let Some(idle) = idle else {
                    return Err(Error::FailedPrecondition(format!(
                        "this sandbox has {MAX_WATCHES} watches, each with a reader; close one first"
                    )));
                };
                if let Some(w) = all.remove(&idle) {
                    w.cancel.cancel();
                    tracing::info!(watch_id = %w.id, "watch ended: a new one needed its place");
                }
            }
        }
        let root = ws.open_root()?;
        let dir = path::walk(&root, p.parts(), None, &p.display())?;
        let inotify = Inotify::init().map_err(|e| {
            Error::FailedPrecondition(format!(
                "the sandbox can watch no more directories ({e}; the host's fs.inotify.max_user_instances)"
            ))
        })?;
        // Read through the reactor; the stream owns the descriptor, `watches` adds to it.
        let events = inotify
            .into_event_stream(vec![0u8; 64 * 1024])
            .map_err(|source| Error::Io {
                context: "registering the watch with the reactor".to_owned(),
                source,
            })?;
        let id = format!("watch-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
        let watch = Arc::new(Watch {
            id: id.clone(),
            ring: Mutex::new(Ring::default()),
            notify: tokio::sync::watch::Sender::new(0),
            readers: AtomicUsize::new(0),
            idle_since: Mutex::new(Instant::now()),
            cancel: self.shutdown.child_token(),
        });
        let mut tree = Tree {
            watches: events.watches(),
            dirs: HashMap::new(),
            root,
            recursive,
        };
        // The directories there now, without events (a reader asks for what changes from here on).
        tree.follow(dir.fd, p.clone(), None)?;
        self.all().insert(id, Arc::clone(&watch));
        let owner = Arc::downgrade(self);
        self.tasks
            .spawn(run(Arc::clone(&watch), tree, events, owner));
        tracing::info!(watch_id = %watch.id, path = %p.display(), recursive, "watch started");
        Ok(watch)
    }

    /// The watch with this id (NotFound when it ended, or never was).
    pub(crate) fn get(&self, id: &str) -> Result<Arc<Watch>, Error> {
        self.all().get(id).cloned().ok_or_else(|| {
            Error::PathNotFound(format!(
                "no watch {id:?} in this sandbox (it ended: nobody read it for {} s, or the sandbox \
                 restarted); start a new one",
                LINGER.as_secs()
            ))
        })
    }

    fn forget(&self, id: &str) {
        self.all().remove(id);
    }

    /// Ends every watch and waits for their tasks, at most `grace`.
    pub(crate) async fn shutdown(&self, grace: Duration) {
        self.shutdown.cancel();
        self.tasks.close();
        let _ = tokio::time::timeout(grace, self.tasks.wait()).await;
    }
}

/// One watch: its events, and the readers waiting for more.
pub(crate) struct Watch {
    pub(crate) id: String,
    ring: Mutex<Ring>,
    /// The newest seq, for readers waiting.
    notify: tokio::sync::watch::Sender<u64>,
    readers: AtomicUsize,
    /// Since when nobody reads it (meaningful while `readers` is 0).
    idle_since: Mutex<Instant>,
    cancel: CancellationToken,
}

#[derive(Default)]
struct Ring {
    events: VecDeque<Event>,
    /// The seq of the newest event (0: none yet).
    last: u64,
    /// Files written to lately: when their last MODIFIED went out, and whether a write came after it
    /// (sent when [`COALESCE`] is over, so the last write of a burst is always reported).
    written: HashMap<String, Written>,
}

struct Written {
    at: Instant,
    is_dir: bool,
    pending: bool,
}

impl Ring {
    fn append(&mut self, kind: Kind, path: String, is_dir: bool) {
        self.last += 1;
        self.events.push_back(Event {
            seq: self.last,
            kind,
            path,
            is_dir,
            time: SystemTime::now(),
        });
        if self.events.len() > MAX_EVENTS {
            self.events.pop_front();
        }
    }
}

impl Watch {
    /// The newest seq.
    pub(crate) fn last_seq(&self) -> u64 {
        self.ring().last
    }

    fn ring(&self) -> std::sync::MutexGuard<'_, Ring> {
        self.ring.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records an event. Writes to one file are throttled: the first goes out at once, those within
    /// [`COALESCE`] after it become one MODIFIED when that time is over ([`Watch::flush`]); any other event
    /// of the file sends a held MODIFIED first, so the order stays true.
    fn push(&self, kind: Kind, path: String, is_dir: bool) {
        let now = Instant::now();
        let last = {
            let mut ring = self.ring();
            if kind == Kind::Modified {
                match ring.written.get_mut(&path) {
                    Some(w) if now.duration_since(w.at) < COALESCE => {
                        w.pending = true;
                        return;
                    }
                    _ => {
                        ring.written.insert(
                            path.clone(),
                            Written {
                                at: now,
                                is_dir,
                                pending: false,
                            },
                        );
                    }
                }
            } else if let Some(w) = ring.written.remove(&path)
                && w.pending
            {
                ring.append(Kind::Modified, path.clone(), w.is_dir);
            }
            ring.append(kind, path, is_dir);
            ring.last
        };
        self.notify.send_replace(last);
    }

    /// Whether writes are held for their MODIFIED.
    fn holds_writes(&self) -> bool {
        self.ring().written.values().any(|w| w.pending)
    }

    /// Sends the MODIFIED of files whose writes were held and whose [`COALESCE`] is over, and forgets
    /// files not written to lately (the map stays as small as the burst).
    fn flush(&self) {
        let now = Instant::now();
        let last = {
            let mut ring = self.ring();
            let due: Vec<(String, bool)> = ring
                .written
                .iter()
                .filter(|(_, w)| w.pending && now.duration_since(w.at) >= COALESCE)
                .map(|(p, w)| (p.clone(), w.is_dir))
                .collect();
            for (path, is_dir) in &due {
                if let Some(w) = ring.written.get_mut(path) {
                    w.at = now;
                    w.pending = false;
                }
                ring.append(Kind::Modified, path.clone(), *is_dir);
            }
            ring.written
                .retain(|_, w| w.pending || now.duration_since(w.at) < COALESCE);
            if due.is_empty() {
                return;
            }
            ring.last
        };
        self.notify.send_replace(last);
    }

    /// The events after `after_seq` (a gap first when some are gone), then live ones until the watch ends.
    /// OutOfRange for a seq the watch never gave.
    pub(crate) fn read(
        self: &Arc<Self>,
        after_seq: u64,
    ) -> Result<impl Stream<Item = Item> + Send + 'static, Error> {
        let last = self.last_seq();
        if after_seq > last {
            return Err(Error::OutOfRange(format!(
                "after_seq {after_seq} is beyond the watch's newest event ({last})"
            )));
        }
        let reader = Reader::new(Arc::clone(self));
        let changes = self.notify.subscribe();
        Ok(futures::stream::unfold(
            (reader, changes, after_seq, VecDeque::new()),
            |(reader, mut changes, mut cursor, mut pending)| async move {
                loop {
                    if let Some(item) = pending.pop_front() {
                        return Some((item, (reader, changes, cursor, pending)));
                    }
                    {
                        let ring = reader.watch.ring();
                        if let Some(first) = ring.events.front().map(|e| e.seq)
                            && first > cursor + 1
                        {
                            pending.push_back(Item::Gap {
                                after_seq: cursor,
                                first_available_seq: first,
                            });
                            cursor = first - 1;
                        }
                        let after = cursor;
                        for e in ring.events.iter().filter(|e| e.seq > after) {
                            pending.push_back(Item::Event(e.clone()));
                            cursor = e.seq;
                        }
                    }
                    if !pending.is_empty() {
                        continue;
                    }
                    tokio::select! {
                        changed = changes.changed() => {
                            if changed.is_err() {
                                return None;
                            }
                        }
                        () = reader.watch.cancel.cancelled() => return None,
                    }
                }
            },
        ))
    }
}

/// A reader of a watch while it lives: the watch counts it, and lingers from its end.
struct Reader {
    watch: Arc<Watch>,
}

impl Reader {
    fn new(watch: Arc<Watch>) -> Self {
        watch.readers.fetch_add(1, Ordering::SeqCst);
        Self { watch }
    }
}

impl Drop for Reader {
    fn drop(&mut self) {
        *self
            .watch
            .idle_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Instant::now();
        self.watch.readers.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The directories a watch follows, by watch descriptor.
struct Tree {
    /// Adds and removes the watch's inotify watches (the event stream owns the instance).
    watches: inotify::Watches,
    dirs: HashMap<WatchDescriptor, WsPath>,
    /// The workspace root, to reach new directories from.
    root: OwnedFd,
    recursive: bool,
}

const MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::MODIFY)
    .union(WatchMask::DELETE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::ONLYDIR);

impl Tree {
    /// Follows the directory `fd` at `at` (and, when recursive, those under it). With `events`, what is
    /// found under it is reported CREATED (a directory made, or moved in, after the watch started: what it
    /// holds may have come before its watch).
    fn follow(&mut self, fd: OwnedFd, at: WsPath, events: Option<&Watch>) -> Result<(), Error> {
        let mut stack = vec![(fd, at)];
        while let Some((fd, at)) = stack.pop() {
            if self.dirs.len() >= MAX_DIRS {
                if let Some(w) = events {
                    w.push(Kind::Overflow, at.display(), true);
                }
                tracing::warn!(path = %at.display(), "a watch follows {MAX_DIRS} directories: no more");
                continue;
            }
            let wd = match self
                .watches
                .add(format!("/proc/self/fd/{}", fd.as_raw_fd()), MASK)
            {
                Ok(wd) => wd,
                Err(e) if e.raw_os_error() == Some(Errno::ENOSPC as i32) => {
                    if let Some(w) = events {
                        w.push(Kind::Overflow, at.display(), true);
                    }
                    if events.is_none() {
                        return Err(Error::FailedPrecondition(
                            "the host allows no more watched directories (fs.inotify.max_user_watches)"
                                .to_owned(),
                        ));
                    }
                    continue;
                }
                Err(e) => {
                    return Err(Error::Io {
                        context: format!("watching {}", at.display()),
                        source: e,
                    });
                }
            };
            self.dirs.insert(wd, at.clone());
            if !self.recursive && events.is_none() {
                continue;
            }
            let Ok(mut dir) = Dir::from_fd(fd) else {
                continue;
            };
            let mut subdirs = Vec::new();
            for entry in dir.iter().flatten() {
                let name = entry.file_name().to_bytes();
                if name == b"." || name == b".." {
                    continue;
                }
                let name = OsString::from(std::ffi::OsStr::from_bytes(name));
                let is_dir = entry.file_type() == Some(Type::Directory);
                if let Some(w) = events {
                    w.push(Kind::Created, at.join(&name).display(), is_dir);
                }
                if is_dir && self.recursive {
                    subdirs.push(name);
                }
            }
            for name in subdirs {
                if let Ok(sub) = path::open_dir_at(&dir, &name) {
                    stack.push((sub, at.join(&name)));
                }
            }
        }
        Ok(())
    }

    /// Stops following `at` and everything under it (it was moved away or removed).
    fn unfollow(&mut self, at: &WsPath) {
        let gone: Vec<WatchDescriptor> = self
            .dirs
            .iter()
            .filter(|(_, p)| p.parts().starts_with(at.parts()))
            .map(|(wd, _)| wd.clone())
            .collect();
        for wd in gone {
            self.dirs.remove(&wd);
            let _ = self.watches.remove(wd);
        }
    }

    /// Turns one inotify event into the watch's, following new directories.
    fn handle(&mut self, watch: &Watch, e: inotify::EventOwned) {
        {
            if e.mask.contains(EventMask::Q_OVERFLOW) {
                watch.push(Kind::Overflow, String::new(), false);
                return;
            }
            if e.mask.contains(EventMask::IGNORED) {
                self.dirs.remove(&e.wd);
                return;
            }
            let (Some(dir), Some(name)) = (self.dirs.get(&e.wd).cloned(), e.name) else {
                return;
            };
            // The executor's own temporary files (a write lands in one, renamed over its target): the
            // rename is the target's CREATED, the rest is not the sandbox's doing.
            if is_temporary(&name) {
                return;
            }
            let at = dir.join(&name);
            let is_dir = e.mask.contains(EventMask::ISDIR);
            let kind = if e.mask.intersects(EventMask::CREATE | EventMask::MOVED_TO) {
                Kind::Created
            } else if e.mask.contains(EventMask::MODIFY) {
                Kind::Modified
            } else {
                Kind::Removed
            };
            watch.push(kind, at.display(), is_dir);
            if is_dir && self.recursive {
                match kind {
                    Kind::Created => {
                        if let Ok(walked) = path::walk(&self.root, at.parts(), None, &at.display())
                        {
                            let _ = self.follow(walked.fd, at, Some(watch));
                        }
                    }
                    Kind::Removed => self.unfollow(&at),
                    _ => {}
                }
            }
        }
    }
}

/// Whether `name` is one of the executor's temporary files (`write::temp_name`).
fn is_temporary(name: &std::ffi::OsStr) -> bool {
    let b = name.as_bytes();
    b.first() == Some(&b'.')
        && b.len() > 44
        && b[b.len() - 44..].starts_with(b".mentis-tmp-")
        && b[b.len() - 32..].iter().all(u8::is_ascii_hexdigit)
}

/// A watch's task: reads inotify until the watch ends (the executor stops, or nobody read it for
/// [`LINGER`]), then forgets it.
async fn run(
    watch: Arc<Watch>,
    mut tree: Tree,
    mut events: EventStream<Vec<u8>>,
    owner: Weak<Watches>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        let holding = watch.holds_writes();
        tokio::select! {
            () = watch.cancel.cancelled() => break,
            () = tokio::time::sleep(COALESCE), if holding => watch.flush(),
            _ = tick.tick() => {
                let idle = *watch.idle_since.lock().unwrap_or_else(PoisonError::into_inner);
                if watch.readers.load(Ordering::SeqCst) == 0 && idle.elapsed() >= LINGER {
                    tracing::info!(watch_id = %watch.id, "watch ended: nobody read it");
                    break;
                }
            }
            event = events.next() => match event {
                Some(Ok(event)) => tree.handle(&watch, event),
                Some(Err(e)) => {
                    tracing::warn!(watch_id = %watch.id, error = %e, "reading inotify failed: the watch ends");
                    break;
                }
                None => break,
            },
        }
    }
    watch.cancel.cancel();
    if let Some(owner) = owner.upgrade() {
        owner.forget(&watch.id);
    }
    // The stream owns the inotify descriptor: it closes with it.
    drop(events);
    drop(tree);
}
