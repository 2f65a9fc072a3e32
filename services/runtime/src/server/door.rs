//! Every listener's door (docs/ARCHITECTURE.md, "Security"): what a connection must do to stay, before any
//! key is asked for. A listener admits at most `MENTIS_MAX_CONNECTIONS` open connections, and at most
//! `MENTIS_MAX_CONNECTIONS_PER_ADDRESS` from one client address (a connection above either is reset as soon
//! as it is accepted, costing a file descriptor for a moment only); a connection must bring its first
//! request within `MENTIS_FIRST_REQUEST_SECS` (headers, after TLS), and is closed once it has carried no byte
//! either way for `MENTIS_CONNECTION_IDLE_SECS`. When a listener is full, a new connection from an address
//! holding less than its fair share takes the place of the oldest connection that has not brought a request
//! yet from an address holding more (see `Open::make_room`): connections that only hold a place cannot keep
//! out clients that talk. So idle connections nobody authenticates cannot pile up until
//! the process runs out of file descriptors or memory, and one client address cannot take the place of all
//! the others.
//!
//! A request's arrival is told by [`MarkRequests`], a layer that finds the connection's [`Activity`] among
//! the request's extensions (tonic puts a connection's [`tonic::transport::server::Connected`] info there);
//! the HTTP listeners ([`serve_http`]) mark each request themselves and also enforce a header-read timeout
//! on every request.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, Sleep};

use crate::config::ConnectionLimits;
use crate::metrics::{kv, metrics};

/// How long accepting pauses after the process failed to accept (out of file descriptors, say), so a full
/// backlog does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// How many evicted connections may be closing at once, above a full listener's limit.
pub(crate) fn evicting_at_most(total: usize) -> usize {
    (total / 16).max(1)
}

/// One listener's count of open connections, in all and by client address.
#[derive(Debug)]
struct Door {
    name: &'static str,
    limits: ConnectionLimits,
    open: Mutex<Open>,
}

#[derive(Debug, Default)]
struct Open {
    /// Admitted and not yet dropped, evicted ones included.
    total: usize,
    /// Evicted and not yet dropped (their place is already someone else's).
    evicted: usize,
    by_address: HashMap<IpAddr, usize>,
    /// Connections in the order they came, to find the oldest that has brought no request (entries of
    /// connections gone or that brought one are skipped, and swept when there are many).
    arrivals: VecDeque<Weak<State>>,
}

/// Why a connection was turned away at the door.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
    /// The listener holds its most connections.
    Limit,
    /// The client address holds its share.
    PerAddress,
}

impl Refused {
    fn reason(self) -> &'static str {
        match self {
            Self::Limit => "limit",
            Self::PerAddress => "per_address",
        }
    }
}

impl Door {
    fn admit(self: &Arc<Self>, address: IpAddr) -> Result<Ticket, Refused> {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        if open.by_address.get(&address).copied().unwrap_or(0) >= self.limits.per_address {
            return Err(Refused::PerAddress);
        }
        if open.total.saturating_sub(open.evicted) >= self.limits.total {
            open.make_room(address, &self.limits)?;
        }
        *open.by_address.entry(address).or_insert(0) += 1;
        open.total += 1;
        let state = Arc::new(State::new(address));
        if open.arrivals.len() >= 2 * self.limits.total.max(16) {
            open.arrivals
                .retain(|w| w.upgrade().is_some_and(|s| !s.requested()));
        }
        open.arrivals.push_back(Arc::downgrade(&state));
        drop(open);
        metrics()
            .connections_open
            .add(1, &[kv("listener", self.name)]);
        Ok(Ticket {
            door: Arc::clone(self),
            state,
        })
    }

    /// (open connections, client addresses).
    fn open(&self) -> (usize, usize) {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        (open.total, open.by_address.len())
    }
}

impl Open {
    /// At a full listener, evicts a connection for a newcomer from `address`, or says why not. Only a
    /// newcomer whose address holds less than its fair share of the listener (the limit shared among the
    /// addresses present) may take a place, and only from an address holding more than the newcomer's would
    /// then: so a client that comes rarely gets in, while a flood's own newcomers cannot keep evicting each
    /// other. The place taken is that of the oldest connection of such an address that has brought no
    /// request; none, or too many evicted still closing (each holds its descriptor until its server reads
    /// again): refused.
    fn make_room(&mut self, address: IpAddr, limits: &ConnectionLimits) -> Result<(), Refused> {
        if self.evicted >= evicting_at_most(limits.total) {
            return Err(Refused::Limit);
        }
        let mine = self.by_address.get(&address).copied().unwrap_or(0);
        let addresses = self.by_address.len() + usize::from(mine == 0);
        if mine >= (limits.total / addresses.max(1)).max(1) {
            return Err(Refused::Limit);
        }
        let by_address = &self.by_address;
        let victim = self.arrivals.iter().position(|w| {
            w.upgrade().is_some_and(|s| {
                !s.requested()
                    && !s.evicted.load(Ordering::Relaxed)
                    && by_address.get(&s.address).copied().unwrap_or(0) > mine + 1
            })
        });
        let state = victim
            .and_then(|i| self.arrivals.remove(i))
            .and_then(|w| w.upgrade());
        match state {
            Some(state) if state.evict() => {
                self.evicted += 1;
                Ok(())
            }
            _ => Err(Refused::Limit),
        }
    }
}

/// An admitted connection's place, given back when the connection is dropped.
#[derive(Debug)]
struct Ticket {
    door: Arc<Door>,
    state: Arc<State>,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut open = self
            .door
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        open.total = open.total.saturating_sub(1);
        // Marked evicted as it goes, under the lock `make_room` evicts under: its state may outlive it (a
        // request's or a service's `Activity`), and an eviction then would count a closing connection that
        // never gives its count back.
        if self.state.evicted.swap(true, Ordering::Relaxed) {
            open.evicted = open.evicted.saturating_sub(1);
        }
        if let Some(n) = open.by_address.get_mut(&self.state.address) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                open.by_address.remove(&self.state.address);
            }
        }
        drop(open);
        metrics()
            .connections_open
            .add(-1, &[kv("listener", self.door.name)]);
    }
}

/// A listener behind its door.
#[derive(Debug)]
pub struct Guarded {
    listener: TcpListener,
    door: Arc<Door>,
}

impl Guarded {
    /// `listener` admitting what `limits` allow; `name` labels its metrics and logs (api, http, health,
    /// metrics).
    pub fn new(listener: TcpListener, name: &'static str, limits: ConnectionLimits) -> Self {
        Self {
            listener,
            door: Arc::new(Door {
                name,
                limits,
                open: Mutex::new(Open::default()),
            }),
        }
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.listener.local_addr()
    }

    /// The next connection the door admits. Those it refuses are reset at once; failures to accept are
    /// logged and retried after a pause.
    pub async fn accept(&self) -> (Conn, SocketAddr) {
        let mut last_warning: Option<Instant> = None;
        loop {
            match self.listener.accept().await {
                Ok((stream, peer)) => match self.door.admit(peer.ip()) {
                    Ok(ticket) => {
                        // No Nagle: observations are small messages, and Nagle with delayed ACKs adds
                        // ~40 ms to every round trip.
                        if let Err(e) = stream.set_nodelay(true) {
                            tracing::debug!(error = %e, "cannot set TCP_NODELAY");
                        }
                        return (Conn::new(stream, ticket, self.door.limits), peer);
                    }
                    Err(refused) => {
                        metrics().connections_refused.add(
                            1,
                            &[
                                kv("listener", self.door.name),
                                kv("reason", refused.reason()),
                            ],
                        );
                        if last_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                            let (open, addresses) = self.door.open();
                            tracing::warn!(
                                listener = self.door.name,
                                %peer,
                                reason = refused.reason(),
                                open,
                                addresses,
                                limit = self.door.limits.total,
                                per_address = self.door.limits.per_address,
                                "connections refused at the door (MENTIS_MAX_CONNECTIONS, MENTIS_MAX_CONNECTIONS_PER_ADDRESS); \
                                 this warning repeats at most every 10 s"
                            );
                            last_warning = Some(Instant::now());
                        }
                        // A reset, not a close: the descriptor and the socket go at once (no TIME_WAIT).
                        let _ = stream.set_zero_linger();
                        drop(stream);
                    }
                },
                // The peer gave up before we took it: nothing to wait for.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::ConnectionAborted | io::ErrorKind::ConnectionReset
                    ) => {}
                Err(e) => {
                    if last_warning.is_none_or(|at| at.elapsed() >= Duration::from_secs(10)) {
                        tracing::warn!(listener = self.door.name, error = %e, "cannot accept connections; retrying");
                        last_warning = Some(Instant::now());
                    }
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            }
        }
    }

    /// The admitted connections as a stream (for tonic's `serve_with_incoming`); it never ends by itself.
    pub fn incoming(self) -> impl futures::Stream<Item = io::Result<Conn>> + Send + 'static {
        futures::stream::unfold(self, |guarded| async move {
            let (conn, _) = guarded.accept().await;
            Some((Ok(conn), guarded))
        })
    }
}

/// What a connection's server, its door and [`MarkRequests`] share.
#[derive(Debug)]
struct State {
    /// Its client's address.
    address: IpAddr,
    /// A request arrived on it.
    requested: AtomicBool,
    /// The door gave its place to a newcomer.
    evicted: AtomicBool,
    /// Its reader, woken when it is evicted.
    reader: AtomicWaker,
}

impl State {
    fn new(address: IpAddr) -> Self {
        Self {
            address,
            requested: AtomicBool::new(false),
            evicted: AtomicBool::new(false),
            reader: AtomicWaker::new(),
        }
    }

    fn requested(&self) -> bool {
        self.requested.load(Ordering::Relaxed)
    }

    /// Evicts it if it has brought no request and is not evicted already; whether it did.
    fn evict(&self) -> bool {
        if self.requested() || self.evicted.swap(true, Ordering::Relaxed) {
            return false;
        }
        self.reader.wake();
        true
    }
}

/// Whether a connection has brought a request: set by [`MarkRequests`], read by the connection's timers
/// and its door.
#[derive(Debug, Clone)]
pub struct Activity(Arc<State>);

impl Activity {
    /// A request arrived on the connection.
    pub fn request(&self) {
        self.0.requested.store(true, Ordering::Relaxed);
    }
}

/// An admitted connection: the socket, its place at the door, and its timers (the first request's deadline,
/// idleness). Reading fails with `TimedOut` once a timer ran out, which ends the connection's server.
#[derive(Debug)]
pub struct Conn {
    stream: TcpStream,
    /// Until the first request has arrived.
    first_request: Option<Pin<Box<Sleep>>>,
    /// After how long without a byte, and the timer (reset lazily: it fires, then looks at `last`).
    idle: Option<(Duration, Pin<Box<Sleep>>)>,
    /// When a byte last went either way.
    last: Instant,
    ticket: Ticket,
}

impl Conn {
    fn new(stream: TcpStream, ticket: Ticket, limits: ConnectionLimits) -> Self {
        let now = Instant::now();
        Self {
            stream,
            first_request: Some(Box::pin(tokio::time::sleep_until(
                now + limits.first_request,
            ))),
            idle: limits
                .idle
                .map(|after| (after, Box::pin(tokio::time::sleep_until(now + after)))),
            last: now,
            ticket,
        }
    }

    /// What [`MarkRequests`] marks when a request arrives on this connection.
    pub fn activity(&self) -> Activity {
        Activity(Arc::clone(&self.ticket.state))
    }

    /// Err once the connection was evicted or a timer ran out; otherwise registers the wake-ups with `cx`.
    fn timers(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        let state = &self.ticket.state;
        state.reader.register(cx.waker());
        if state.evicted.load(Ordering::Relaxed) {
            return Err(self.timed_out("evicted", "evicted by a newcomer: the listener is full"));
        }
        if let Some(deadline) = &mut self.first_request {
            if state.requested() {
                self.first_request = None;
            } else if deadline.as_mut().poll(cx).is_ready() {
                return Err(self.timed_out("first_request", "no request arrived in time"));
            }
        }
        if let Some((after, timer)) = &mut self.idle {
            while timer.as_mut().poll(cx).is_ready() {
                let due = self.last + *after;
                if due <= Instant::now() {
                    return Err(self.timed_out("idle", "idle for too long"));
                }
                timer.as_mut().reset(due);
            }
        }
        Ok(())
    }

    fn timed_out(&self, reason: &'static str, why: &'static str) -> io::Error {
        metrics().connections_timed_out.add(
            1,
            &[kv("listener", self.ticket.door.name), kv("reason", reason)],
        );
        tracing::debug!(
            listener = self.ticket.door.name,
            reason,
            "connection closed"
        );
        io::Error::new(io::ErrorKind::TimedOut, why)
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.timers(cx)?;
        let before = buf.filled().len();
        let read = Pin::new(&mut this.stream).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            this.last = Instant::now();
        }
        read
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write(cx, buf);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.last = Instant::now();
        }
        written
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let written = Pin::new(&mut this.stream).poll_write_vectored(cx, bufs);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            this.last = Instant::now();
        }
        written
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

/// tonic puts this in each request's extensions, where [`MarkRequests`] finds it.
impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = Activity;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.activity()
    }
}

/// Marks the connection of each request as having brought one (see [`Conn`]'s first-request deadline).
#[derive(Debug, Clone, Copy, Default)]
pub struct MarkRequests;

impl<S> tower::Layer<S> for MarkRequests {
    type Service = Marking<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Marking { inner }
    }
}

/// The service of [`MarkRequests`].
#[derive(Debug, Clone)]
pub struct Marking<S> {
    inner: S,
}

impl<S, B> tower::Service<http::Request<B>> for Marking<S>
where
    S: tower::Service<http::Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        if let Some(activity) = request.extensions().get::<Activity>() {
            activity.request();
        }
        self.inner.call(request)
    }
}

/// Serves `app` (HTTP/1.1, WebSocket upgrades) on `listener` behind its door until `shutdown`, in a task of
/// `tasks` spanned `name`: connections still open `grace` after the shutdown (a stream) are cut.
///
/// Each request's headers must arrive within the door's first-request time of the connection being ready
/// for them (hyper's header-read timeout): a client that dribbles a request's headers, the first or a
/// later one on a kept-alive connection, is cut then, and so is a kept-alive connection that brings no
/// next request (the door's idle timeout alone would let it trickle a byte just often enough).
pub fn serve_http(
    listener: Guarded,
    app: axum::Router,
    name: &'static str,
    grace: Duration,
    shutdown: tokio_util::sync::CancellationToken,
    tasks: &tokio_util::task::TaskTracker,
) {
    use tracing::Instrument as _;
    let header_read = listener.door.limits.first_request;
    let serving = async move {
        let connections = tokio_util::task::TaskTracker::new();
        // Cancelled `grace` after the shutdown: what is still open is cut.
        let cut = tokio_util::sync::CancellationToken::new();
        loop {
            let (conn, _) = tokio::select! {
                accepted = listener.accept() => accepted,
                () = shutdown.cancelled() => break,
            };
            let activity = conn.activity();
            // A request marks its connection: the first-request deadline ends.
            let service = tower::ServiceExt::map_request(
                app.clone(),
                move |request: http::Request<hyper::body::Incoming>| {
                    activity.request();
                    request
                },
            );
            let service = hyper_util::service::TowerToHyperService::new(service);
            let (stopping, cut) = (shutdown.clone(), cut.clone());
            connections.spawn(async move {
                let mut builder = hyper::server::conn::http1::Builder::new();
                builder
                    .timer(hyper_util::rt::TokioTimer::new())
                    .header_read_timeout(header_read);
                let connection = builder
                    .serve_connection(hyper_util::rt::TokioIo::new(conn), service)
                    .with_upgrades();
                tokio::pin!(connection);
                let served = tokio::select! {
                    served = connection.as_mut() => served,
                    () = stopping.cancelled() => {
                        connection.as_mut().graceful_shutdown();
                        tokio::select! {
                            served = connection.as_mut() => served,
                            () = cut.cancelled() => Ok(()),
                        }
                    }
                };
                if let Err(e) = served {
                    tracing::debug!(error = %e, listener = name, "connection ended");
                }
            });
        }
        connections.close();
        if tokio::time::timeout(grace, connections.wait())
            .await
            .is_err()
        {
            cut.cancel();
            connections.wait().await;
        }
    };
    tasks.spawn(serving.instrument(
        tracing::info_span!(target: mentis_telemetry::UNTRACED, parent: None, "listener", name),
    ));
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    fn limits(total: usize, per_address: usize) -> ConnectionLimits {
        ConnectionLimits {
            total,
            per_address,
            first_request: Duration::from_secs(10),
            idle: Some(Duration::from_secs(300)),
        }
    }

    async fn guarded(limits: ConnectionLimits) -> (Guarded, SocketAddr) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let at = listener.local_addr().expect("address");
        (Guarded::new(listener, "test", limits), at)
    }

    /// A client connected from `from` (any address of 127.0.0.0/8 works on Linux's loopback).
    async fn connect(at: SocketAddr, from: [u8; 4]) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket
            .bind(SocketAddr::from((from, 0)))
            .expect("bind the client");
        socket.connect(at).await.expect("connect")
    }

    /// Reads until the server closes or resets (Ok(0) or an error), or `within` passes (None).
    async fn closed_within(client: &mut TcpStream, within: Duration) -> Option<()> {
        let mut buf = [0_u8; 64];
        tokio::time::timeout(within, async {
            loop {
                match client.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await
        .ok()
    }

    #[tokio::test]
    async fn the_door_refuses_above_the_total_and_above_an_address_share_and_gives_places_back() {
        let (door, at) = guarded(limits(3, 2)).await;
        let door = Arc::new(door);
        let accepting = {
            let door = Arc::clone(&door);
            tokio::spawn(async move {
                let mut admitted = Vec::new();
                loop {
                    let (conn, _) = door.accept().await;
                    admitted.push(conn);
                    if admitted.len() == 3 {
                        return admitted;
                    }
                }
            })
        };
        let _a1 = connect(at, [127, 0, 0, 1]).await;
        let _a2 = connect(at, [127, 0, 0, 1]).await;
        // The third from the same address is over its share: reset.
        let mut a3 = connect(at, [127, 0, 0, 1]).await;
        assert!(
            closed_within(&mut a3, Duration::from_secs(5))
                .await
                .is_some(),
            "a third connection from one address is refused"
        );
        let _b1 = connect(at, [127, 0, 0, 2]).await;
        let admitted = tokio::time::timeout(Duration::from_secs(5), accepting)
            .await
            .expect("three admitted")
            .expect("accepting");
        assert_eq!(door.door.open(), (3, 2));
        // At the total, with every connection talking: a fourth address is refused too.
        for conn in &admitted {
            conn.activity().request();
        }
        let mut c1 = connect(at, [127, 0, 0, 3]).await;
        let refusing = {
            let door = Arc::clone(&door);
            tokio::spawn(async move { door.accept().await })
        };
        assert!(
            closed_within(&mut c1, Duration::from_secs(5))
                .await
                .is_some(),
            "a connection above the total is refused"
        );
        // Places come back with the connections.
        drop(admitted);
        assert_eq!(door.door.open(), (0, 0));
        let _c2 = connect(at, [127, 0, 0, 3]).await;
        let (conn, peer) = tokio::time::timeout(Duration::from_secs(5), refusing)
            .await
            .expect("admitted once there is room")
            .expect("accepting");
        assert_eq!(peer.ip(), IpAddr::from([127, 0, 0, 3]));
        drop(conn);
    }

    #[tokio::test]
    async fn at_a_full_listener_a_newcomer_takes_the_place_of_the_oldest_connection_without_a_request()
     {
        let (door, at) = guarded(limits(2, 10)).await;
        let mut silent = connect(at, [127, 0, 0, 2]).await;
        let (mut silent_conn, _) = door.accept().await;
        let mut talking = connect(at, [127, 0, 0, 2]).await;
        let (talking_conn, _) = door.accept().await;
        talking_conn.activity().request();
        let silent_server = tokio::spawn(async move {
            let mut buf = [0_u8; 16];
            silent_conn.read(&mut buf).await
        });
        // Full: the newcomer is admitted, the silent one is closed, the talking one stays.
        let _newcomer = connect(at, [127, 0, 0, 1]).await;
        let (newcomer_conn, peer) = tokio::time::timeout(Duration::from_secs(5), door.accept())
            .await
            .expect("the newcomer is admitted");
        assert_eq!(peer.ip(), IpAddr::from([127, 0, 0, 1]));
        let ended = tokio::time::timeout(Duration::from_secs(5), silent_server)
            .await
            .expect("the silent connection's server ends")
            .expect("served");
        assert!(ended.is_err(), "{ended:?}");
        assert!(
            closed_within(&mut silent, Duration::from_secs(5))
                .await
                .is_some()
        );
        assert_eq!(
            door.door.open(),
            (2, 2),
            "the evicted one's place is given back"
        );
        // Full again, and nobody left to evict: the next one is refused.
        newcomer_conn.activity().request();
        let mut refused = connect(at, [127, 0, 0, 3]).await;
        let door = Arc::new(door);
        let accepting = {
            let door = Arc::clone(&door);
            tokio::spawn(async move { door.accept().await })
        };
        assert!(
            closed_within(&mut refused, Duration::from_secs(5))
                .await
                .is_some()
        );
        accepting.abort();
        talking.write_all(b"still here").await.expect("kept");
        drop((talking_conn, newcomer_conn));
    }

    #[tokio::test]
    async fn a_connection_without_a_request_is_closed_at_the_deadline_and_one_with_a_request_is_not()
     {
        let mut limits = limits(10, 10);
        limits.first_request = Duration::from_millis(300);
        limits.idle = None;
        let (door, at) = guarded(limits).await;
        let mut silent = connect(at, [127, 0, 0, 1]).await;
        let (mut conn, _) = door.accept().await;
        let serving = tokio::spawn(async move {
            let mut buf = [0_u8; 16];
            conn.read(&mut buf).await
        });
        assert!(
            closed_within(&mut silent, Duration::from_secs(5))
                .await
                .is_some(),
            "closed for bringing no request"
        );
        let ended = serving.await.expect("served");
        assert_eq!(
            ended.expect_err("timed out").kind(),
            io::ErrorKind::TimedOut
        );

        let mut talking = connect(at, [127, 0, 0, 1]).await;
        let (mut conn, _) = door.accept().await;
        conn.activity().request();
        let serving = tokio::spawn(async move {
            let mut buf = [0_u8; 16];
            let n = conn.read(&mut buf).await?;
            conn.write_all(&buf[..n]).await?;
            Ok::<_, io::Error>(conn)
        });
        tokio::time::sleep(Duration::from_millis(600)).await;
        talking.write_all(b"ping").await.expect("write");
        let mut buf = [0_u8; 4];
        talking.read_exact(&mut buf).await.expect("echoed");
        assert_eq!(&buf, b"ping");
        serving
            .await
            .expect("served")
            .expect("kept past the deadline");
    }

    #[tokio::test]
    async fn a_connection_is_closed_once_no_byte_went_either_way_for_the_idle_time() {
        let mut limits = limits(10, 10);
        limits.idle = Some(Duration::from_millis(400));
        let (door, at) = guarded(limits).await;
        let mut client = connect(at, [127, 0, 0, 1]).await;
        let (mut conn, _) = door.accept().await;
        conn.activity().request();
        let serving = tokio::spawn(async move {
            let mut buf = [0_u8; 16];
            loop {
                let n = conn.read(&mut buf).await?;
                if n == 0 {
                    return Ok::<(), io::Error>(());
                }
            }
        });
        // Bytes every 200 ms keep it open past the idle time...
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_millis(200)).await;
            client.write_all(b"x").await.expect("still open");
        }
        // ...silence closes it.
        let ended = tokio::time::timeout(Duration::from_secs(5), serving)
            .await
            .expect("closed for idleness")
            .expect("served");
        assert_eq!(
            ended.expect_err("timed out").kind(),
            io::ErrorKind::TimedOut
        );
    }

    /// A connection's state may outlive it (an `Activity` in a request or a connection's service): the
    /// e2e flood once evicted such a gone connection, whose count of evicted ones then never came back and
    /// overflowed. A gone connection is never a victim, and the counts return to nothing.
    #[tokio::test]
    async fn a_connection_gone_while_its_state_lives_on_is_never_evicted() {
        let (door, at) = guarded(limits(3, 10)).await;
        let mut clients = Vec::new();
        let mut conns = Vec::new();
        for _ in 0..3 {
            clients.push(connect(at, [127, 0, 0, 2]).await);
            conns.push(door.accept().await.0);
        }
        let lingering = conns.remove(0).activity();
        clients.push(connect(at, [127, 0, 0, 2]).await);
        conns.push(door.accept().await.0);
        // Full, and the oldest arrival is the gone one: the newcomer takes a live one's place.
        clients.push(connect(at, [127, 0, 0, 3]).await);
        let (newcomer, peer) = tokio::time::timeout(Duration::from_secs(5), door.accept())
            .await
            .expect("the newcomer is admitted");
        assert_eq!(peer.ip(), IpAddr::from([127, 0, 0, 3]));
        let evicted: Vec<bool> = conns
            .iter()
            .map(|c| c.ticket.state.evicted.load(Ordering::Relaxed))
            .collect();
        assert_eq!(evicted, [true, false, false], "the oldest live one");
        drop((conns, newcomer, lingering));
        let open = door
            .door
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        assert_eq!((open.total, open.evicted, open.by_address.len()), (0, 0, 0));
    }

    /// Issue 40: after its first request, an HTTP/1 connection could dribble the next request's headers a
    /// byte at a time, held open by the idle timeout alone. Each request's headers now have the door's
    /// first-request time: a later request that stalls half-way is cut, while whole requests are served
    /// on the same kept-alive connection.
    #[tokio::test]
    async fn an_http_connection_that_stalls_in_a_later_request_s_headers_is_cut() {
        let mut limits = limits(10, 10);
        limits.first_request = Duration::from_millis(500);
        let (door, at) = guarded(limits).await;
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "hello" }));
        let shutdown = tokio_util::sync::CancellationToken::new();
        let tasks = tokio_util::task::TaskTracker::new();
        serve_http(
            door,
            app,
            "test",
            Duration::from_secs(1),
            shutdown.clone(),
            &tasks,
        );

        let mut client = connect(at, [127, 0, 0, 1]).await;
        let mut response = Vec::new();
        for _ in 0..2 {
            client
                .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .expect("write");
            let mut buf = [0_u8; 256];
            let n = client.read(&mut buf).await.expect("answered");
            response = buf[..n].to_vec();
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let response = String::from_utf8_lossy(&response);
        assert!(
            response.starts_with("HTTP/1.1 200") && response.ends_with("hello"),
            "{response}"
        );
        // Half a request's headers, then a byte now and then: well within the idle time, never done.
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n")
            .await
            .expect("write");
        let started = Instant::now();
        let dribbling = async {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                if client.write_all(b"X").await.is_err() {
                    return;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), dribbling).await;
        assert!(
            closed_within(&mut client, Duration::from_secs(1))
                .await
                .is_some(),
            "cut for stalling in its headers"
        );
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "{:?}",
            started.elapsed()
        );
        shutdown.cancel();
        tasks.close();
        tasks.wait().await;
    }
}
