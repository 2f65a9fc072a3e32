//! The component tier's harness: a real runtime (`Runtime::start_with`) on the fake backend, reached over real
//! gRPC on 127.0.0.1, and helpers to drive it.
//!
//! Time: tests of what time drives (the reaper, health checks, grace periods, retention) run on tokio's
//! paused clock (`#[tokio::test(start_paused = true)]`), which jumps to the next timer whenever the runtime
//! has nothing to do. Waiting on a real process (bash in the executor) looks like nothing to do, so every
//! helper that waits on one holds a [`Busy`] guard, which stops those jumps while it lives; time then
//! passes only when the test sleeps without one.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use mentis_core::SandboxId;
use mentis_proto::api::{
    self, action_service_client::ActionServiceClient, sandbox_service_client::SandboxServiceClient,
    space_service_client::SpaceServiceClient,
};
use mentis_runtime::config::AuthConfig;
use mentis_runtime::{Runtime, RuntimeConfig};
use tonic::transport::Channel;

pub use crate::fake::{FakeBackend, Faults};
pub use mentis_proto::api::observation::Kind;

/// Upper bound of anything a test waits for in real time.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// While it lives, a paused clock runs at the pace of the real one instead of jumping ahead to the next
/// timer whenever the runtime waits (for a real process, say): short timers (output coalescing, retries)
/// still fire, long ones (health checks, expiry) do not come early. On a clock that is not paused it does
/// nothing. Several guards at once pace the clock once.
pub struct Busy {
    paced: bool,
}

thread_local! {
    /// Guards alive on this thread (a paused clock means a current-thread runtime: one thread).
    static HOLDERS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// Whether tokio's clock is paused here: it does not move on its own while this thread sleeps.
fn clock_paused() -> bool {
    let before = tokio::time::Instant::now();
    std::thread::sleep(Duration::from_micros(200));
    tokio::time::Instant::now() == before
}

impl Busy {
    pub fn hold() -> Self {
        if !clock_paused() {
            return Self { paced: false };
        }
        let first = HOLDERS.with(|h| {
            h.set(h.get() + 1);
            h.get() == 1
        });
        if first {
            tokio::spawn(async {
                while HOLDERS.with(|h| h.get()) > 0 {
                    // While a blocking task runs, the clock does not jump; then move it as far as real
                    // time went.
                    let real = std::time::Instant::now();
                    let _ = tokio::task::spawn_blocking(|| {
                        std::thread::sleep(Duration::from_millis(2))
                    })
                    .await;
                    tokio::time::advance(real.elapsed()).await;
                }
            });
        }
        Self { paced: true }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        if self.paced {
            HOLDERS.with(|h| h.set(h.get().saturating_sub(1)));
        }
    }
}

/// A runtime on a fake backend, and clients of it.
pub struct TestRuntime {
    pub runtime: Option<Runtime>,
    pub backend: Arc<FakeBackend>,
    pub sandboxes: SandboxServiceClient<Channel>,
    pub actions: ActionServiceClient<Channel>,
    pub spaces: SpaceServiceClient<Channel>,
    /// The channel of the clients above, for clients of other services (health, ...).
    pub channel: Channel,
    pub config: RuntimeConfig,
    pub data_dir: Arc<tempfile::TempDir>,
}

/// The configuration the tier starts from: no auth (the auth layer has its own tests), quick health checks.
pub fn base_config(data_dir: &std::path::Path) -> RuntimeConfig {
    let mut config = RuntimeConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: data_dir.to_owned(),
        auth: AuthConfig::Disabled,
        ..RuntimeConfig::default()
    };
    config.stream.keepalive = Duration::from_secs(600);
    config
}

impl TestRuntime {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(tweak: impl FnOnce(&mut RuntimeConfig)) -> Self {
        let data_dir = Arc::new(tempfile::tempdir().unwrap());
        let mut config = base_config(data_dir.path());
        tweak(&mut config);
        Self::start_on(FakeBackend::new(), config, data_dir).await
    }

    /// A runtime over `backend` and the store in `data_dir` (a restart keeps both).
    pub async fn start_on(
        backend: Arc<FakeBackend>,
        config: RuntimeConfig,
        data_dir: Arc<tempfile::TempDir>,
    ) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "mentis_runtime=debug,mentis_app=debug".into()),
            )
            .with_test_writer()
            .try_init();
        let _busy = Busy::hold();
        let runtime = Runtime::start_with(config.clone(), backend.clone())
            .await
            .expect("the runtime starts");
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", runtime.addr))
            .unwrap()
            .tcp_nodelay(true)
            .connect()
            .await
            .unwrap();
        Self {
            runtime: Some(runtime),
            backend,
            sandboxes: SandboxServiceClient::new(channel.clone()),
            actions: ActionServiceClient::new(channel.clone()),
            spaces: SpaceServiceClient::new(channel.clone()),
            channel,
            config,
            data_dir,
        }
    }

    /// CreateSandbox.
    pub async fn create(&mut self, spec: api::SandboxSpec) -> Result<api::Sandbox, tonic::Status> {
        let _busy = Busy::hold();
        let r = self
            .sandboxes
            .create_sandbox(api::CreateSandboxRequest { spec: Some(spec) })
            .await?;
        Ok(r.into_inner().sandbox.expect("a sandbox"))
    }

    pub async fn create_default(&mut self) -> api::Sandbox {
        self.create(api::SandboxSpec::default()).await.unwrap()
    }

    pub async fn get(&mut self, id: &str) -> Result<api::Sandbox, tonic::Status> {
        let _busy = Busy::hold();
        let r = self
            .sandboxes
            .get_sandbox(api::GetSandboxRequest {
                sandbox_id: id.to_owned(),
            })
            .await?;
        Ok(r.into_inner().sandbox.expect("a sandbox"))
    }

    pub async fn state(&mut self, id: &str) -> api::SandboxState {
        let s = self.get(id).await.unwrap();
        api::SandboxState::try_from(s.state).unwrap()
    }

    pub async fn delete(&mut self, id: &str) -> Result<(), tonic::Status> {
        let _busy = Busy::hold();
        self.sandboxes
            .delete_sandbox(api::DeleteSandboxRequest {
                sandbox_id: id.to_owned(),
            })
            .await
            .map(|_| ())
    }

    pub async fn pause(&mut self, id: &str) -> Result<api::Sandbox, tonic::Status> {
        let _busy = Busy::hold();
        let r = self
            .sandboxes
            .pause_sandbox(api::PauseSandboxRequest {
                sandbox_id: id.to_owned(),
            })
            .await?;
        Ok(r.into_inner().sandbox.expect("a sandbox"))
    }

    pub async fn resume(&mut self, id: &str) -> Result<api::Sandbox, tonic::Status> {
        let _busy = Busy::hold();
        let r = self
            .sandboxes
            .resume_sandbox(api::ResumeSandboxRequest {
                sandbox_id: id.to_owned(),
            })
            .await?;
        Ok(r.into_inner().sandbox.expect("a sandbox"))
    }

    /// Runs a shell command with Execute and returns every observation of its stream.
    pub async fn sh(
        &mut self,
        id: &str,
        command: &str,
    ) -> Result<Vec<api::Observation>, tonic::Status> {
        self.exec(id, shell(command), "").await
    }

    /// Execute with an optional client-chosen action id; every observation of the stream.
    pub async fn exec(
        &mut self,
        id: &str,
        action: api::Action,
        action_id: &str,
    ) -> Result<Vec<api::Observation>, tonic::Status> {
        let _busy = Busy::hold();
        let mut stream = self
            .actions
            .execute(api::ExecuteRequest {
                sandbox_id: id.to_owned(),
                action: Some(action),
                action_id: action_id.to_owned(),
            })
            .await?
            .into_inner();
        let mut out = Vec::new();
        loop {
            match tokio::time::timeout(PATIENCE, stream.next()).await {
                Err(_) => panic!("Execute sent nothing for {PATIENCE:?}; so far: {out:?}"),
                Ok(None) => return Ok(out),
                Ok(Some(Err(s))) => return Err(s),
                Ok(Some(Ok(r))) => {
                    if let Some(api::execute_response::Kind::Observation(o)) = r.kind {
                        out.push(o);
                    }
                }
            }
        }
    }

    /// Every observation of a sandbox after `after_seq` that exists now (replay, without following).
    pub async fn log(&mut self, id: &str, after_seq: u64) -> Vec<api::Observation> {
        let last = self.get(id).await.unwrap().last_seq;
        let _busy = Busy::hold();
        let mut out = Vec::new();
        if last <= after_seq {
            return out;
        }
        let mut stream = self
            .actions
            .stream_observations(api::StreamObservationsRequest {
                sandbox_id: id.to_owned(),
                after_seq,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        loop {
            match tokio::time::timeout(PATIENCE, stream.next()).await {
                Err(_) => panic!("the log stopped before seq {last}; so far: {out:?}"),
                Ok(None) => return out,
                Ok(Some(Err(s))) => panic!("StreamObservations failed: {s}"),
                Ok(Some(Ok(r))) => {
                    if let Some(api::stream_observations_response::Kind::Observation(o)) = r.kind {
                        let seq = o.seq;
                        out.push(o);
                        if seq >= last {
                            return out;
                        }
                    }
                }
            }
        }
    }

    /// Waits (on whatever clock runs) until the sandbox is in `state`, checking every 100 ms.
    pub async fn wait_state(&mut self, id: &str, state: api::SandboxState, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let now = self.state(id).await;
            if now == state {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "sandbox {id} is {now:?}, not {state:?}, after {within:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// An action started with Execute in a task of its own, which collects its observations.
pub struct Running {
    started: Option<tokio::sync::oneshot::Receiver<()>>,
    task: tokio::task::JoinHandle<Vec<api::Observation>>,
}

impl TestRuntime {
    /// Starts `action` with Execute. Until it prints something, a paused clock runs at real pace.
    pub fn start_action(&self, id: &str, action: api::Action) -> Running {
        let mut actions = self.actions.clone();
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let id = id.to_owned();
        let task = tokio::spawn(async move {
            let busy = Busy::hold();
            let mut stream = actions
                .execute(api::ExecuteRequest {
                    sandbox_id: id,
                    action: Some(action),
                    action_id: String::new(),
                })
                .await
                .expect("the action is accepted")
                .into_inner();
            let mut started = Some((started_tx, busy));
            let mut obs = Vec::new();
            while let Some(Ok(r)) = stream.next().await {
                if let Some(api::execute_response::Kind::Observation(o)) = r.kind {
                    if matches!(o.kind, Some(Kind::CmdOutput(_)))
                        && let Some((tx, busy)) = started.take()
                    {
                        drop(busy);
                        let _ = tx.send(());
                    }
                    obs.push(o);
                }
            }
            obs
        });
        Running {
            started: Some(started_rx),
            task,
        }
    }

    /// ListSandboxes, every sandbox.
    pub async fn list(&mut self) -> Vec<api::Sandbox> {
        let _busy = Busy::hold();
        self.sandboxes
            .list_sandboxes(api::ListSandboxesRequest::default())
            .await
            .unwrap()
            .into_inner()
            .sandboxes
    }
}

impl Running {
    /// Waits until the action has printed something: it runs.
    pub async fn started(&mut self) {
        let _busy = Busy::hold();
        let started = self.started.take().expect("started() once");
        tokio::time::timeout(PATIENCE, started)
            .await
            .expect("the action prints within PATIENCE")
            .expect("the action prints before it ends");
    }

    /// Every observation of its stream, once the stream ends.
    pub async fn end(self) -> Vec<api::Observation> {
        self.task.await.unwrap()
    }
}

/// The status a stream ends with, reading past its messages; `None` when it ends without one (OK).
pub async fn end_status<T>(stream: &mut tonic::Streaming<T>) -> Option<tonic::Status> {
    while let Some(item) = tokio::time::timeout(PATIENCE, stream.next())
        .await
        .expect("the stream moves within PATIENCE")
    {
        if let Err(status) = item {
            return Some(status);
        }
    }
    None
}

/// A shell action.
pub fn shell(command: &str) -> api::Action {
    api::Action {
        kind: Some(api::action::Kind::Shell(api::ShellAction {
            command: command.to_owned(),
            ..Default::default()
        })),
    }
}

/// The sandbox id as the domain type.
pub fn sid(s: &api::Sandbox) -> SandboxId {
    SandboxId::parse(&s.sandbox_id).unwrap()
}

/// Whether an observation ends an action.
pub fn is_terminal(o: &api::Observation) -> bool {
    matches!(o.kind, Some(Kind::CmdEnd(_)) | Some(Kind::IpythonResult(_)))
}

/// The `cmd_end` of a list of observations (the last one).
pub fn cmd_end(obs: &[api::Observation]) -> api::CmdEnd {
    match obs.last().and_then(|o| o.kind.clone()) {
        Some(Kind::CmdEnd(e)) => e,
        other => panic!("the last observation is not cmd_end: {other:?} (all: {obs:?})"),
    }
}

/// Stdout of a list of observations.
pub fn stdout(obs: &[api::Observation]) -> String {
    obs.iter()
        .filter_map(|o| match &o.kind {
            Some(Kind::CmdOutput(c)) if c.stream == api::OutputStream::Stdout as i32 => {
                Some(String::from_utf8_lossy(&c.data).into_owned())
            }
            _ => None,
        })
        .collect()
}

/// The `state` detail of each `agent_state` observation, in order.
pub fn states_in(obs: &[api::Observation]) -> Vec<String> {
    obs.iter()
        .filter_map(|o| match &o.kind {
            Some(Kind::AgentState(a)) => a.details.get("state").cloned(),
            _ => None,
        })
        .collect()
}

/// A Health/Watch of the server as a whole (""), its first answer (SERVING) read.
pub async fn watch_server_health(
    rt: &TestRuntime,
) -> tonic::Streaming<tonic_health::pb::HealthCheckResponse> {
    use tonic_health::pb::health_check_response::ServingStatus;
    let mut watch = tonic_health::pb::health_client::HealthClient::new(rt.channel.clone())
        .watch(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let first = watch.next().await.unwrap().unwrap();
    assert_eq!(first.status, ServingStatus::Serving as i32);
    watch
}
