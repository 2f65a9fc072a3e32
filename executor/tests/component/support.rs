//! Test harness: an in-process executor, clients with or without the token, and helpers to read streams
//! and inspect processes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use mentis_executor::{Config, Error, Token};
use mentis_proto::executor::executor_service_client::ExecutorServiceClient;
use mentis_proto::executor::{self as api, action};
use mentis_proto::executor::{RunRequest, RunResponse, run_response};
use tempfile::TempDir;
use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, DropGuard};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic::{Request, Status, Streaming};

/// Upper bound for anything a test waits on; far above what a loaded machine needs.
pub const PATIENCE: Duration = Duration::from_secs(60);

pub const TOKEN: &str = "test-token-0123456789";

pub type Client = ExecutorServiceClient<InterceptedService<Channel, AddToken>>;

/// An executor serving in this process; dropping it shuts the executor down.
pub struct TestExecutor {
    pub addr: SocketAddr,
    pub workspace: TempDir,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), Error>>>,
    _stop_on_drop: DropGuard,
}

impl TestExecutor {
    pub async fn start() -> Self {
        Self::start_with(|_| {}).await
    }

    pub async fn start_with(adjust: impl FnOnce(&mut Config)) -> Self {
        // The executor's log, shown with a failing test's output (RUST_LOG picks the level).
        let _ = tracing_subscriber::fmt()
            .with_env_filter(
                tracing_subscriber::EnvFilter::try_from_default_env()
                    .unwrap_or_else(|_| "mentis_executor=debug".into()),
            )
            .with_test_writer()
            .try_init();
        let workspace = tempfile::tempdir().expect("temp workspace");
        let mut config = Config::new(Token::new(TOKEN).unwrap(), workspace.path());
        adjust(&mut config);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(mentis_executor::serve(config, listener, shutdown.clone()));
        Self {
            addr,
            workspace,
            _stop_on_drop: shutdown.clone().drop_guard(),
            shutdown,
            task: Some(task),
        }
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.workspace.path().join(name)
    }

    pub async fn channel(&self) -> Channel {
        channel(self.addr).await
    }

    pub async fn client(&self) -> Client {
        self.client_with(Some(TOKEN)).await
    }

    /// A client sending `authorization: Bearer <token>`, or no authorization at all.
    pub async fn client_with(&self, token: Option<&str>) -> Client {
        let value = token.map(|t| format!("Bearer {t}").parse().unwrap());
        ExecutorServiceClient::with_interceptor(self.channel().await, AddToken(value))
    }

    /// Cancels the executor's shutdown token and waits for `serve` to return.
    pub async fn stop(mut self) -> Result<(), Error> {
        self.shutdown.cancel();
        let task = self.task.take().unwrap();
        tokio::time::timeout(PATIENCE, task)
            .await
            .expect("serve returns after shutdown")
            .unwrap()
    }
}

pub async fn channel(addr: SocketAddr) -> Channel {
    Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_timeout(Duration::from_secs(10))
        .connect()
        .await
        .expect("connect to the executor")
}

/// Adds the authorization header, if any.
#[derive(Clone)]
pub struct AddToken(Option<MetadataValue<Ascii>>);

impl AddToken {
    /// Sends `authorization: Bearer <token>`.
    pub fn bearer(token: &str) -> Self {
        Self(Some(format!("Bearer {token}").parse().unwrap()))
    }

    /// Sends no authorization.
    pub fn none() -> Self {
        Self(None)
    }
}

impl Interceptor for AddToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(value) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// A fresh action id.
pub fn action_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("action-{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

pub fn shell(command: &str) -> api::ShellAction {
    api::ShellAction {
        command: command.to_owned(),
        ..Default::default()
    }
}

pub fn request(action_id: &str, shell: api::ShellAction) -> RunRequest {
    RunRequest {
        action_id: action_id.to_owned(),
        action: Some(api::Action {
            kind: Some(action::Kind::Shell(shell)),
        }),
        env: HashMap::new(),
    }
}

/// Starts an action and returns its stream.
pub async fn start(client: &mut Client, request: RunRequest) -> Streaming<RunResponse> {
    client
        .run(request)
        .await
        .expect("Run accepted")
        .into_inner()
}

/// Runs a shell command to its end and returns every event.
pub async fn run(client: &mut Client, shell: api::ShellAction) -> Events {
    let stream = start(client, request(&action_id(), shell)).await;
    collect(stream).await
}

/// Reads a stream to its end.
pub async fn collect(mut stream: Streaming<RunResponse>) -> Events {
    let mut events = Vec::new();
    tokio::time::timeout(PATIENCE, async {
        while let Some(event) = stream.message().await.expect("stream ok") {
            events.push(event);
        }
    })
    .await
    .expect("the action ends in time");
    Events(events)
}

/// The next event of a stream.
pub async fn next(stream: &mut Streaming<RunResponse>) -> RunResponse {
    tokio::time::timeout(PATIENCE, stream.message())
        .await
        .expect("an event in time")
        .expect("stream ok")
        .expect("stream not ended")
}

/// The `cmd_start` that must come first.
pub async fn expect_start(stream: &mut Streaming<RunResponse>) -> api::CmdStart {
    let event = next(stream).await;
    assert_eq!(event.index, 1);
    match event.kind {
        Some(run_response::Kind::CmdStart(start)) => start,
        other => panic!("expected cmd_start, got {other:?}"),
    }
}

/// The events of one action.
#[derive(Debug)]
pub struct Events(pub Vec<RunResponse>);

impl Events {
    pub fn output(&self, stream: api::OutputStream) -> Vec<u8> {
        self.chunks(stream).concat()
    }

    pub fn chunks(&self, stream: api::OutputStream) -> Vec<Vec<u8>> {
        self.0
            .iter()
            .filter_map(|e| match &e.kind {
                Some(run_response::Kind::CmdOutput(out)) if out.stream == stream as i32 => {
                    Some(out.data.to_vec())
                }
                _ => None,
            })
            .collect()
    }

    pub fn stdout(&self) -> Vec<u8> {
        self.output(api::OutputStream::Stdout)
    }

    pub fn stderr(&self) -> Vec<u8> {
        self.output(api::OutputStream::Stderr)
    }

    /// The terminal event, after checking the stream's shape: consecutive indexes (from 1 unless the test
    /// read the first events itself) and exactly one `cmd_end`, last.
    pub fn end(&self) -> api::CmdEnd {
        let first = self.0.first().map_or(1, |e| e.index);
        for (i, event) in self.0.iter().enumerate() {
            assert_eq!(event.index, first + i as u64, "indexes count up by one");
            assert!(event.time.is_some(), "every event has a time");
        }
        let ends: Vec<_> = self
            .0
            .iter()
            .filter_map(|e| match &e.kind {
                Some(run_response::Kind::CmdEnd(end)) => Some(end.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(ends.len(), 1, "exactly one cmd_end: {self:?}");
        assert!(
            matches!(
                self.0.last().and_then(|e| e.kind.as_ref()),
                Some(run_response::Kind::CmdEnd(_))
            ),
            "cmd_end is last"
        );
        ends[0].clone()
    }
}

pub fn reason(end: &api::CmdEnd) -> api::EndReason {
    api::EndReason::try_from(end.reason).expect("known reason")
}

/// Live (non-zombie) processes whose process group is `pgid`, found by scanning /proc.
pub fn live_in_group(pgid: i32) -> Vec<i32> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) state ppid pgrp ...": comm may hold spaces and parens, so split after the last ')'.
        let Some(rest) = stat.rsplit_once(')').map(|(_, rest)| rest) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[0] != "X" && fields[2] == pgid.to_string()
        {
            found.push(pid);
        }
    }
    found
}

/// Whether `pid` is a live (non-zombie) process.
pub fn is_alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

/// Polls `condition` until it holds or PATIENCE runs out.
pub async fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !condition() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Reads a pid a command wrote to a file in the workspace.
pub fn read_pid(path: &Path) -> i32 {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
        .trim()
        .parse()
        .unwrap()
}
