//! A `SandboxBackend` without Docker: each sandbox is the real executor served in this process on
//! 127.0.0.1:0, behind a small TCP proxy the test controls. The proxy is the "container": it can freeze
//! (nothing is read or written, as in a frozen cgroup: connections stay open, calls hang), and the sandbox can
//! be killed (its executor stops and every connection drops; `ensure_running` starts it again on the same
//! workspace, like a restarted container) or lost (gone from the backend for good).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mentis_core::{
    BackendSandbox, BackendSpec, BackendState, Endpoint, Error, Limits, Reason, Result,
    SandboxBackend, SandboxId,
};
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// A fault the next call of some kind runs into.
#[derive(Debug, Clone, Default)]
pub struct Faults {
    /// `create` fails with Unavailable.
    pub create_fails: bool,
    /// `create` answers, but the executor never does (it is not started).
    pub create_never_ready: bool,
    /// `update_limits` fails.
    pub update_limits_fails: bool,
    /// `pause` fails with Unavailable.
    pub pause_fails: bool,
    /// `resume` fails with Unavailable.
    pub resume_fails: bool,
    /// `delete` fails with Unavailable (and removes nothing).
    pub delete_fails: bool,
    /// `pause` waits this long before it freezes (a real engine takes some milliseconds).
    pub pause_delay: Duration,
    /// The engine does not answer: `ping` fails with Unavailable.
    pub unreachable: bool,
}

/// One fake sandbox ("container").
struct Fake {
    spec: BackendSpec,
    workspace: Arc<TempDir>,
    state: BackendState,
    proxy: Proxy,
    executor: Option<CancellationToken>,
}

/// The fake backend; share it with the test through `Arc`.
#[derive(Default)]
pub struct FakeBackend {
    sandboxes: Mutex<HashMap<SandboxId, Fake>>,
    faults: Mutex<Faults>,
    /// Calls made, by name, for assertions.
    calls: Mutex<Vec<(String, SandboxId)>>,
    created: AtomicUsize,
}

impl std::fmt::Debug for FakeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FakeBackend").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Serves a real executor for `spec` on 127.0.0.1:0 over `workspace`; returns its address and its stop.
async fn start_executor(
    spec: &BackendSpec,
    workspace: &TempDir,
) -> (SocketAddr, CancellationToken) {
    let token = mentis_executor::Token::new(spec.token.clone()).expect("a valid token");
    let mut config = mentis_executor::Config::new(token, workspace.path());
    config.max_actions = 64;
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let stop = CancellationToken::new();
    tokio::spawn(mentis_executor::serve(config, listener, stop.clone()));
    (addr, stop)
}

impl FakeBackend {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Sets the faults later calls run into.
    pub fn set_faults(&self, f: Faults) {
        *lock(&self.faults) = f;
    }

    fn faults(&self) -> Faults {
        lock(&self.faults).clone()
    }

    fn record(&self, call: &str, id: SandboxId) {
        lock(&self.calls).push((call.to_owned(), id));
    }

    /// How often `call` was made for `id`.
    pub fn calls(&self, call: &str, id: SandboxId) -> usize {
        lock(&self.calls)
            .iter()
            .filter(|(c, i)| c == call && *i == id)
            .count()
    }

    /// Sandboxes created so far (pool members included).
    pub fn created(&self) -> usize {
        self.created.load(Ordering::Relaxed)
    }

    /// Ids the backend holds now.
    pub fn ids(&self) -> Vec<SandboxId> {
        lock(&self.sandboxes).keys().copied().collect()
    }

    /// The backend's state of `id`, `None` when it holds no such sandbox.
    pub fn state(&self, id: SandboxId) -> Option<BackendState> {
        lock(&self.sandboxes).get(&id).map(|f| f.state)
    }

    /// The limits the sandbox was created or updated with.
    /// The executor token a sandbox's container was made with.
    pub fn token(&self, id: SandboxId) -> Option<String> {
        lock(&self.sandboxes).get(&id).map(|f| f.spec.token.clone())
    }

    pub fn limits(&self, id: SandboxId) -> Option<Limits> {
        lock(&self.sandboxes).get(&id).map(|f| f.spec.limits)
    }

    /// Freezes the sandbox behind the runtime's back: its executor stops answering, connections stay open.
    pub fn freeze(&self, id: SandboxId) {
        if let Some(f) = lock(&self.sandboxes).get(&id) {
            f.proxy.set_frozen(true);
        }
    }

    /// Thaws a sandbox frozen by [`FakeBackend::freeze`].
    pub fn thaw(&self, id: SandboxId) {
        if let Some(f) = lock(&self.sandboxes).get(&id) {
            f.proxy.set_frozen(false);
        }
    }

    /// Whether the sandbox is frozen now (paused by the runtime or by [`FakeBackend::freeze`]).
    pub fn is_frozen(&self, id: SandboxId) -> bool {
        lock(&self.sandboxes)
            .get(&id)
            .is_some_and(|f| f.proxy.is_frozen())
    }

    /// Kills the sandbox's executor, as when its container dies: every connection drops, the container is
    /// stopped (and `ensure_running` starts it again).
    pub fn kill(&self, id: SandboxId) {
        let mut map = lock(&self.sandboxes);
        if let Some(f) = map.get_mut(&id) {
            if let Some(stop) = f.executor.take() {
                stop.cancel();
            }
            f.proxy.cut();
            // A process that died is not frozen any more; the next one starts thawed.
            f.proxy.set_frozen(false);
            f.state = BackendState::Stopped;
        }
    }

    /// Loses the sandbox: its container and workspace are gone from the backend.
    pub fn lose(&self, id: SandboxId) {
        if let Some(f) = lock(&self.sandboxes).remove(&id) {
            if let Some(stop) = f.executor {
                stop.cancel();
            }
            f.proxy.close();
        }
    }
}

#[async_trait::async_trait]
impl SandboxBackend for FakeBackend {
    async fn prepare(&self) -> Result<()> {
        Ok(())
    }

    async fn ping(&self) -> Result<()> {
        if self.faults().unreachable {
            return Err(Error::Unavailable("the fake engine does not answer".into()));
        }
        Ok(())
    }

    async fn create(&self, spec: &BackendSpec) -> Result<Endpoint> {
        self.record("create", spec.id);
        let faults = self.faults();
        if faults.create_fails {
            return Err(Error::Unavailable(
                "the fake engine refuses to create".into(),
            ));
        }
        let workspace = Arc::new(tempfile::tempdir().map_err(|e| Error::internal(e.to_string()))?);
        let (target, executor) = if faults.create_never_ready {
            (None, None)
        } else {
            let (addr, stop) = start_executor(spec, &workspace).await;
            (Some(addr), Some(stop))
        };
        let proxy = Proxy::start(target).await;
        let endpoint = proxy.endpoint();
        self.created.fetch_add(1, Ordering::Relaxed);
        lock(&self.sandboxes).insert(
            spec.id,
            Fake {
                spec: spec.clone(),
                workspace,
                state: BackendState::Running,
                proxy,
                executor,
            },
        );
        Ok(endpoint)
    }

    async fn delete(&self, id: SandboxId) -> Result<()> {
        self.record("delete", id);
        if self.faults().delete_fails {
            return Err(Error::unavailable("the fake engine cannot delete"));
        }
        self.lose(id);
        Ok(())
    }

    async fn ensure_running(&self, id: SandboxId) -> Result<Endpoint> {
        self.record("ensure_running", id);
        let (spec, workspace) = {
            let map = lock(&self.sandboxes);
            let f = map.get(&id).ok_or_else(|| {
                Error::new(
                    Reason::ContainerGone,
                    format!("sandbox {id} is gone from the fake"),
                )
            })?;
            match f.state {
                BackendState::Running => return Ok(f.proxy.endpoint()),
                BackendState::Paused => {
                    return Err(Error::new(
                        Reason::SandboxPaused,
                        format!("sandbox {id} is paused"),
                    ));
                }
                BackendState::Stopped | BackendState::Missing => {}
            }
            (f.spec.clone(), Arc::clone(&f.workspace))
        };
        let (addr, stop) = start_executor(&spec, &workspace).await;
        let mut map = lock(&self.sandboxes);
        let f = map.get_mut(&id).ok_or_else(|| {
            Error::new(
                Reason::ContainerGone,
                format!("sandbox {id} is gone from the fake"),
            )
        })?;
        f.executor = Some(stop);
        f.state = BackendState::Running;
        f.proxy.retarget(Some(addr));
        Ok(f.proxy.endpoint())
    }

    async fn restart(&self, id: SandboxId) -> Result<Endpoint> {
        self.record("restart", id);
        if self.state(id).is_none() {
            return Err(Error::new(
                Reason::ContainerGone,
                format!("sandbox {id} is gone from the fake"),
            ));
        }
        self.kill(id);
        self.ensure_running(id).await
    }

    async fn update_limits(&self, id: SandboxId, limits: Limits) -> Result<()> {
        self.record("update_limits", id);
        if self.faults().update_limits_fails {
            return Err(Error::Unavailable(
                "the fake engine cannot update limits".into(),
            ));
        }
        let mut map = lock(&self.sandboxes);
        let f = map.get_mut(&id).ok_or_else(|| {
            Error::new(
                Reason::ContainerGone,
                format!("sandbox {id} is gone from the fake"),
            )
        })?;
        f.spec.limits = limits;
        Ok(())
    }

    async fn pause(&self, id: SandboxId) -> Result<()> {
        self.record("pause", id);
        let faults = self.faults();
        if !faults.pause_delay.is_zero() {
            tokio::time::sleep(faults.pause_delay).await;
        }
        if faults.pause_fails {
            return Err(Error::unavailable("the fake engine cannot pause"));
        }
        let mut map = lock(&self.sandboxes);
        let f = map.get_mut(&id).ok_or_else(|| {
            Error::new(
                Reason::ContainerGone,
                format!("sandbox {id} is gone from the fake"),
            )
        })?;
        f.proxy.set_frozen(true);
        f.state = BackendState::Paused;
        Ok(())
    }

    async fn resume(&self, id: SandboxId) -> Result<()> {
        self.record("resume", id);
        if self.faults().resume_fails {
            return Err(Error::unavailable("the fake engine cannot resume"));
        }
        let mut map = lock(&self.sandboxes);
        let f = map.get_mut(&id).ok_or_else(|| {
            Error::new(
                Reason::ContainerGone,
                format!("sandbox {id} is gone from the fake"),
            )
        })?;
        if f.state == BackendState::Paused {
            f.proxy.set_frozen(false);
            f.state = BackendState::Running;
        }
        Ok(())
    }

    async fn list(&self) -> Result<Vec<BackendSandbox>> {
        Ok(lock(&self.sandboxes)
            .iter()
            .map(|(id, f)| BackendSandbox {
                id: *id,
                state: f.state,
            })
            .collect())
    }
}

/// The sandbox's network face: forwards connections to its executor, unless frozen, cut or closed.
struct Proxy {
    addr: SocketAddr,
    target: watch::Sender<Option<SocketAddr>>,
    frozen: watch::Sender<bool>,
    /// Cancelled to drop every open connection (the executor died); replaced for the next ones.
    conns: Arc<Mutex<CancellationToken>>,
    /// Cancelled when the sandbox is gone: the listener closes.
    closed: CancellationToken,
}

impl Proxy {
    async fn start(target: Option<SocketAddr>) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let (target, _) = watch::channel(target);
        let (frozen, _) = watch::channel(false);
        let conns = Arc::new(Mutex::new(CancellationToken::new()));
        let closed = CancellationToken::new();
        let proxy = Self {
            addr,
            target,
            frozen,
            conns,
            closed,
        };
        let (target, frozen, conns, closed) = (
            proxy.target.subscribe(),
            proxy.frozen.subscribe(),
            Arc::clone(&proxy.conns),
            proxy.closed.clone(),
        );
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    () = closed.cancelled() => return,
                    a = listener.accept() => a,
                };
                let Ok((inbound, _)) = accepted else { continue };
                let _ = inbound.set_nodelay(true);
                let cut = lock(&conns).clone();
                let target = *target.borrow();
                let frozen = frozen.clone();
                let closed = closed.clone();
                tokio::spawn(async move {
                    // A stopped container refuses connections: drop it at once.
                    let Some(target) = target else { return };
                    let Ok(outbound) = TcpStream::connect(target).await else {
                        return;
                    };
                    let _ = outbound.set_nodelay(true);
                    let (ri, wi) = inbound.into_split();
                    let (ro, wo) = outbound.into_split();
                    tokio::select! {
                        () = cut.cancelled() => {}
                        () = closed.cancelled() => {}
                        () = pipe(ri, wo, frozen.clone()) => {}
                        () = pipe(ro, wi, frozen) => {}
                    }
                });
            }
        });
        proxy
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint {
            uri: format!("http://{}", self.addr),
            gateway_source: None,
        }
    }

    fn set_frozen(&self, frozen: bool) {
        self.frozen.send_replace(frozen);
    }

    fn is_frozen(&self) -> bool {
        *self.frozen.borrow()
    }

    /// Drops every open connection; new ones find no executor until [`Proxy::retarget`].
    fn cut(&self) {
        self.target.send_replace(None);
        let mut conns = lock(&self.conns);
        conns.cancel();
        *conns = CancellationToken::new();
    }

    fn retarget(&self, target: Option<SocketAddr>) {
        self.target.send_replace(target);
    }

    fn close(&self) {
        self.cut();
        self.closed.cancel();
    }
}

/// Copies `from` to `to` while not frozen (a frozen process neither reads nor writes).
async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: watch::Receiver<bool>,
) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if frozen.wait_for(|f| !f).await.is_err() {
            return;
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            },
            // Frozen while waiting: stop reading until thawed.
            _ = frozen.wait_for(|f| *f) => continue,
        };
        // Bytes read just before a freeze are written after the thaw.
        if frozen.wait_for(|f| !f).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}
