//! The control plane's client of one sandbox's executor: one HTTP/2 channel (with keepalives, so a dead peer
//! is noticed), every call carrying the sandbox's token, readiness through grpc.health.v1.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use mentis_core::process::ProcessInfo;
use mentis_core::{Action, ActionId, Endpoint, Error, Reason, VariableSummary};
use mentis_proto::executor::{
    AttachRequest, AttachResponse, CancelRequest, GetUsageRequest, InspectVariablesRequest,
    ListProcessesRequest, ResetKernelRequest, Resume, RunRequest, RunResponse,
    SignalProcessRequest, TakeSpansRequest, TakeSpansResponse, WriteStdinRequest, attach_request,
    executor_service_client::ExecutorServiceClient,
    workspace_service_client::WorkspaceServiceClient,
};
use tokio::sync::mpsc;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

use convert::{action_to_wire, summary_from_wire};

mod convert;
mod files;

/// What a watch's stream carries, as the executor says it (`ExecutorClient::watch_files`).
pub type WatchStream = std::pin::Pin<
    Box<dyn futures::Stream<Item = Result<mentis_core::files::WatchItem, Error>> + Send + 'static>,
>;
mod terminals;

pub(crate) use convert::kind_from_wire;

/// A file's or an archive's bytes as they come from the executor.
pub type ByteStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<Bytes, Error>> + Send + 'static>>;

/// A terminal stream's outputs as the executor sends them; it ends after `Exited`.
pub type TerminalOutputs = std::pin::Pin<
    Box<
        dyn futures::Stream<Item = Result<mentis_core::terminal::TerminalOutput, Error>>
            + Send
            + 'static,
    >,
>;

/// Adds `authorization: Bearer <token>` to every call, and the caller's trace context when traces are on.
#[derive(Clone)]
pub struct BearerToken(MetadataValue<Ascii>);

impl tonic::service::Interceptor for BearerToken {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        req.metadata_mut().insert("authorization", self.0.clone());
        mentis_telemetry::inject(req.metadata_mut());
        Ok(req)
    }
}

/// An action's events from the executor, which holds each one until it is acknowledged.
pub struct Attached {
    pub events: tonic::Streaming<AttachResponse>,
    acks: mpsc::UnboundedSender<AttachRequest>,
}

impl Attached {
    /// Tells the executor that every event up to `index` is safe with us (journaled): it may drop them.
    pub fn ack(&self, index: u64) {
        // A closed stream takes no acks; the next attach says where we are.
        let _ = self.acks.send(AttachRequest {
            kind: Some(attach_request::Kind::Ack(index)),
        });
    }
}

/// Client of one executor.
#[derive(Clone)]
pub struct ExecutorClient {
    rpc: ExecutorServiceClient<InterceptedService<Channel, BearerToken>>,
    files: WorkspaceServiceClient<InterceptedService<Channel, BearerToken>>,
    /// With the token too: an executor that is not this sandbox's (a reused address) refuses it.
    health: HealthClient<InterceptedService<Channel, BearerToken>>,
    call_timeout: Duration,
    /// One per connection made (clones share it): a health watch belongs to the client it was opened on.
    connection: Arc<()>,
    /// The host and port the executor answers at (the sandbox's address on the executor network).
    host: Arc<str>,
    port: u16,
    /// The sandbox's address on the egress gateway's network, when it is there.
    gateway_source: Option<std::net::IpAddr>,
}

impl std::fmt::Debug for ExecutorClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExecutorClient").finish_non_exhaustive()
    }
}

impl ExecutorClient {
    /// A lazily connecting client; nothing is sent until the first call.
    pub fn new(
        endpoint: &Endpoint,
        token: &str,
        call_timeout: Duration,
        keepalive: Duration,
    ) -> Result<Self, Error> {
        let uri: http::Uri = endpoint.uri.parse().map_err(|e| {
            Error::internal(format!("bad executor endpoint {}", endpoint.uri)).with_source(e)
        })?;
        let (host, port) = match (uri.host(), uri.port_u16()) {
            (Some(h), Some(p)) => (Arc::from(h.trim_matches(['[', ']'])), p),
            _ => {
                return Err(Error::internal(format!(
                    "executor endpoint {} has no host and port",
                    endpoint.uri
                )));
            }
        };
        let channel = tonic::transport::Endpoint::from_shared(endpoint.uri.clone())
            .map_err(|e| {
                Error::internal(format!("bad executor endpoint {}", endpoint.uri)).with_source(e)
            })?
            .connect_timeout(Duration::from_secs(5))
            .tcp_nodelay(true)
            // An executor that stops answering pings (killed, paused, network gone) fails its streams within
            // about two keepalive periods, and its actions then end LOST.
            .http2_keep_alive_interval(keepalive)
            .keep_alive_timeout(keepalive)
            .keep_alive_while_idle(true)
            .connect_lazy();
        let value: MetadataValue<Ascii> = format!("Bearer {token}")
            .parse()
            .map_err(|_| Error::internal("executor token is not valid metadata"))?;
        Ok(Self {
            rpc: ExecutorServiceClient::with_interceptor(
                channel.clone(),
                BearerToken(value.clone()),
            ),
            files: WorkspaceServiceClient::with_interceptor(
                channel.clone(),
                BearerToken(value.clone()),
            ),
            health: HealthClient::with_interceptor(channel, BearerToken(value)),
            call_timeout,
            connection: Arc::new(()),
            host,
            port,
            gateway_source: endpoint.gateway_source,
        })
    }

    /// The sandbox's address on the executor network (where its other ports are reached too).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The executor's own port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The sandbox's address on the egress gateway's network, when it is there.
    pub fn gateway_source(&self) -> Option<std::net::IpAddr> {
        self.gateway_source
    }

    /// The same client, for a sandbox that joined or left the gateway's network.
    pub fn set_gateway_source(&mut self, source: Option<std::net::IpAddr>) {
        self.gateway_source = source;
    }

    /// One health check, bounded by `within`.
    pub async fn check(&self, within: Duration) -> Result<(), Error> {
        let mut health = self.health.clone();
        let check = health.check(HealthCheckRequest {
            service: String::new(),
        });
        let answer = health_call(within, check).await?;
        serving(Some(answer.get_ref()))
    }

    /// Opens a watch of the executor's serving status (`grpc.health.v1` Watch), bounded by `within` until
    /// its first answer, the status now: Ok only when that is SERVING. Held open, it costs nothing on the
    /// wire until the status changes or the connection breaks (its HTTP/2 keepalive notices a peer that
    /// went silent), so an idle sandbox is not asked again and again.
    pub async fn watch_health(&self, within: Duration) -> Result<HealthWatch, Error> {
        let mut health = self.health.clone();
        let opened = async {
            let mut stream = health
                .watch(HealthCheckRequest {
                    service: String::new(),
                })
                .await?
                .into_inner();
            let first = stream.message().await?;
            Ok::<_, tonic::Status>((stream, first))
        };
        let (stream, first) = health_call(within, opened).await?;
        serving(first.as_ref())?;
        Ok(HealthWatch {
            stream,
            connection: Arc::clone(&self.connection),
        })
    }

    /// Waits until the executor reports SERVING, polling until `within` has passed.
    pub async fn wait_ready(&self, within: Duration) -> Result<(), Error> {
        let deadline = tokio::time::Instant::now() + within;
        let mut delay = Duration::from_millis(20);
        loop {
            let last = match self.check(Duration::from_secs(2)).await {
                Ok(()) => return Ok(()),
                Err(e) => e.to_string(),
            };
            if tokio::time::Instant::now() + delay > deadline {
                return Err(executor_unavailable(format!(
                    "the executor did not become ready within {}s: {last}",
                    within.as_secs()
                )));
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_millis(200));
        }
    }

    async fn timed<T>(
        &self,
        fut: impl std::future::Future<Output = Result<T, tonic::Status>>,
    ) -> Result<T, Error> {
        match tokio::time::timeout(self.call_timeout, fut).await {
            Ok(r) => r.map_err(status_to_error),
            Err(_) => Err(executor_unavailable("the executor did not answer in time")),
        }
    }

    /// Starts an action; the stream carries its events up to and including the terminal one.
    pub async fn run(
        &self,
        action_id: &ActionId,
        action: &Action,
        env: &BTreeMap<String, String>,
    ) -> Result<tonic::Streaming<RunResponse>, Error> {
        let req = RunRequest {
            action_id: action_id.to_string(),
            action: Some(action_to_wire(action)),
            env: env.clone().into_iter().collect(),
        };
        let mut rpc = self.rpc.clone();
        self.timed(rpc.run(req))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Starts an action whose events the executor holds until acknowledged.
    pub async fn attach_new(
        &self,
        action_id: &ActionId,
        action: &Action,
        env: &BTreeMap<String, String>,
    ) -> Result<Attached, Error> {
        self.attach(attach_request::Kind::Start(RunRequest {
            action_id: action_id.to_string(),
            action: Some(action_to_wire(action)),
            env: env.clone().into_iter().collect(),
        }))
        .await
    }

    /// Attaches again to an action the executor holds, after the event `after_index` (NotFound when it
    /// holds none such: the action never ran there, or the executor restarted).
    pub async fn attach_again(
        &self,
        action_id: &ActionId,
        after_index: u64,
    ) -> Result<Attached, Error> {
        self.attach(attach_request::Kind::Resume(Resume {
            action_id: action_id.to_string(),
            after_index,
        }))
        .await
    }

    async fn attach(&self, first: attach_request::Kind) -> Result<Attached, Error> {
        let (acks, requests) = mpsc::unbounded_channel();
        let _ = acks.send(AttachRequest { kind: Some(first) });
        let mut rpc = self.rpc.clone();
        let events = self
            .timed(
                rpc.attach(futures::stream::unfold(requests, |mut rx| async move {
                    rx.recv().await.map(|request| (request, rx))
                })),
            )
            .await?
            .into_inner();
        Ok(Attached { events, acks })
    }

    /// Asks the executor to cancel an action.
    pub async fn cancel(&self, action_id: &ActionId) -> Result<(), Error> {
        let mut rpc = self.rpc.clone();
        self.timed(rpc.cancel(CancelRequest {
            action_id: action_id.to_string(),
        }))
        .await
        .map(drop)
    }

    /// Writes to an action's stdin.
    pub async fn write_stdin(
        &self,
        action_id: &ActionId,
        data: Bytes,
        eof: bool,
    ) -> Result<(), Error> {
        let mut rpc = self.rpc.clone();
        self.timed(rpc.write_stdin(WriteStdinRequest {
            action_id: action_id.to_string(),
            data,
            eof,
        }))
        .await
        .map(drop)
    }
}

/// A sandbox's resource use, read from its cgroup by its executor.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// Memory in use, in bytes; None when the executor cannot tell.
    pub memory_bytes: Option<u64>,
    /// CPU time used since the container started, in microseconds; None when unknown.
    pub cpu_usec: Option<u64>,
}

impl ExecutorClient {
    /// The sandbox's memory and CPU time in use.
    pub async fn usage(&self) -> Result<Usage, Error> {
        let mut rpc = self.rpc.clone();
        let r = self
            .timed(rpc.get_usage(GetUsageRequest {}))
            .await?
            .into_inner();
        Ok(Usage {
            memory_bytes: r.memory_bytes,
            cpu_usec: r.cpu_usec,
        })
    }

    /// The sandbox's processes.
    pub async fn processes(&self) -> Result<Vec<ProcessInfo>, Error> {
        let mut rpc = self.rpc.clone();
        let r = self
            .timed(rpc.list_processes(ListProcessesRequest {}))
            .await?
            .into_inner();
        Ok(r.processes
            .into_iter()
            .map(|p| ProcessInfo {
                pid: p.pid,
                ppid: p.ppid,
                pgid: p.pgid,
                uid: p.uid,
                user: p.user,
                command: p.command,
                name: p.name,
                state: p.state,
                cpu_seconds: p.cpu_seconds,
                cpu_percent: p.cpu_percent,
                memory_bytes: p.memory_bytes,
                start_time: (p.start_time > 0.0)
                    .then(|| {
                        std::time::UNIX_EPOCH
                            .checked_add(std::time::Duration::from_secs_f64(p.start_time))
                    })
                    .flatten(),
                role: p.role,
            })
            .collect())
    }

    /// Sends the signal named `signal` to process `pid` of the sandbox.
    pub async fn signal_process(&self, pid: i32, signal: String) -> Result<(), Error> {
        let mut rpc = self.rpc.clone();
        self.timed(rpc.signal_process(SignalProcessRequest { pid, signal }))
            .await
            .map(drop)
    }

    /// The executor's finished trace spans (see `telemetry::SpanRelay`).
    pub async fn take_spans(&self) -> Result<TakeSpansResponse, Error> {
        let mut rpc = self.rpc.clone();
        self.timed(rpc.take_spans(TakeSpansRequest {}))
            .await
            .map(tonic::Response::into_inner)
    }

    /// Replaces the sandbox's kernel with a fresh one.
    pub async fn reset_kernel(&self) -> Result<(), Error> {
        let mut rpc = self.rpc.clone();
        self.timed(rpc.reset_kernel(ResetKernelRequest {}))
            .await
            .map(drop)
    }

    /// Summarises kernel variables. It waits for its turn between cells, so it gets more time than other
    /// unary calls.
    pub async fn inspect_variables(
        &self,
        names: Vec<String>,
    ) -> Result<Vec<VariableSummary>, Error> {
        let mut rpc = self.rpc.clone();
        let call = rpc.inspect_variables(InspectVariablesRequest { names });
        match tokio::time::timeout(self.call_timeout * 2, call).await {
            Ok(Ok(r)) => Ok(r
                .into_inner()
                .variables
                .into_iter()
                .map(summary_from_wire)
                .collect()),
            Ok(Err(s)) => Err(status_to_error(s)),
            Err(_) => Err(executor_unavailable("the executor did not answer in time")),
        }
    }
}

/// An open watch of one executor's serving status ([`ExecutorClient::watch_health`]).
pub struct HealthWatch {
    stream: tonic::Streaming<tonic_health::pb::HealthCheckResponse>,
    connection: Arc<()>,
}

impl HealthWatch {
    /// Whether it was opened on `client`'s connection (a sandbox's client is replaced when its executor
    /// is reached again).
    pub fn is_of(&self, client: &ExecutorClient) -> bool {
        Arc::ptr_eq(&self.connection, &client.connection)
    }

    /// The next change: Ok while the executor says SERVING; anything else (another status, the stream's
    /// end or error) is the error a failed check gives. Cancel-safe.
    pub async fn changed(&mut self) -> Result<(), Error> {
        match self.stream.message().await {
            Ok(answer) => serving(answer.as_ref()),
            Err(s) => Err(executor_unavailable(format!(
                "the executor's health watch broke: {}",
                s.message()
            ))
            .with_source(s)),
        }
    }
}

/// A health call bounded by `within`: its answer, or the executor's unavailability.
async fn health_call<T>(
    within: Duration,
    call: impl std::future::Future<Output = Result<T, tonic::Status>>,
) -> Result<T, Error> {
    match tokio::time::timeout(within, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(s)) => Err(executor_unavailable(format!(
            "the executor does not answer: {}",
            s.message()
        ))
        .with_source(s)),
        Err(_) => Err(executor_unavailable(
            "the executor's health check timed out",
        )),
    }
}

/// Ok for a SERVING answer; a watch that ended gave none.
fn serving(answer: Option<&tonic_health::pb::HealthCheckResponse>) -> Result<(), Error> {
    match answer {
        Some(r) if r.status == ServingStatus::Serving as i32 => Ok(()),
        Some(r) => Err(executor_unavailable(format!(
            "the executor reports status {}",
            r.status
        ))),
        None => Err(executor_unavailable("the executor's health watch ended")),
    }
}

/// An executor's status as a domain error: its verdicts on the request pass through with the reason it
/// names (`google.rpc.ErrorInfo`, the same vocabulary), transport trouble is EXECUTOR_UNAVAILABLE, and
/// anything odd is Internal. The executor names a reason on every status it answers; an INTERNAL or
/// UNKNOWN without one is the client's transport speaking (an HTTP/2 stream or connection that broke, as
/// when the executor or its container is killed mid-call), so it is the executor's unavailability too.
pub fn status_to_error(s: tonic::Status) -> Error {
    use tonic::Code;
    // The executor may quote a request's field whole; the client gets a bounded message.
    let msg = mentis_core::quote::bounded(s.message());
    let named = mentis_proto::error_reason(&s, mentis_core::error::DOMAIN);
    let from_transport = named.is_none() && matches!(s.code(), Code::Internal | Code::Unknown);
    let told = named.and_then(|name| Reason::from_name(&name));
    if from_transport {
        return executor_unavailable(format!("the connection to the executor broke: {msg}"))
            .with_source(s);
    }
    let e = match s.code() {
        Code::InvalidArgument => Error::invalid(msg),
        Code::OutOfRange => Error::new(Reason::OutOfRange, msg),
        Code::NotFound => Error::new(Reason::NotFound, msg),
        Code::AlreadyExists => Error::new(Reason::AlreadyExists, msg),
        Code::FailedPrecondition | Code::Unimplemented => {
            Error::new(Reason::FailedPrecondition, msg)
        }
        Code::ResourceExhausted => Error::new(Reason::ResourceExhausted, msg),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Aborted => {
            executor_unavailable(format!("executor unreachable: {msg}")).with_source(s)
        }
        code => Error::internal(format!("executor answered {code:?}: {msg}")).with_source(s),
    };
    match told {
        Some(r) if !r.is_generic() => e.with_reason(r),
        _ => e,
    }
}

/// EXECUTOR_UNAVAILABLE with `message`.
fn executor_unavailable(message: impl Into<String>) -> Error {
    Error::new(Reason::ExecutorUnavailable, message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use mentis_core::error::DOMAIN;
    use std::collections::HashMap;
    use tonic::Code;
    use tonic_types::{ErrorDetails, StatusExt};

    fn told(code: Code, reason: &str, domain: &str) -> tonic::Status {
        let info = ErrorDetails::with_error_info(reason, domain, HashMap::new());
        tonic::Status::with_error_details(code, "m", info)
    }

    #[test]
    fn an_executors_reason_passes_through_when_it_is_ours_and_fits_the_code() {
        let e = status_to_error(told(Code::ResourceExhausted, "CELL_QUEUE_FULL", DOMAIN));
        assert!(matches!(e, Error::ResourceExhausted(_)));
        assert_eq!(e.reason(), Reason::CellQueueFull);
        let e = status_to_error(told(Code::NotFound, "PATH_NOT_FOUND", DOMAIN));
        assert_eq!(e.reason(), Reason::PathNotFound);
        // Another domain, an unknown name or a reason of another code: the code's own reason.
        for s in [
            told(Code::NotFound, "PATH_NOT_FOUND", "elsewhere"),
            told(Code::NotFound, "NO_SUCH_REASON", DOMAIN),
            told(Code::NotFound, "CELL_QUEUE_FULL", DOMAIN),
        ] {
            assert_eq!(status_to_error(s).reason(), Reason::NotFound);
        }
        // Transport trouble is the executor's unavailability, whatever the status names.
        let e = status_to_error(tonic::Status::unavailable("refused"));
        assert_eq!(e.reason(), Reason::ExecutorUnavailable);
        let e = status_to_error(told(Code::Unavailable, "UNAVAILABLE", DOMAIN));
        assert_eq!(e.reason(), Reason::ExecutorUnavailable);
    }

    #[test]
    fn a_broken_connection_is_the_executors_unavailability_and_its_own_internal_stays_internal() {
        // What tonic makes of an HTTP/2 stream reset or a connection cut mid-call: no reason of ours.
        for s in [
            tonic::Status::internal("h2 protocol error: stream no longer needed"),
            tonic::Status::unknown("transport error"),
        ] {
            let e = status_to_error(s);
            assert_eq!(e.reason(), Reason::ExecutorUnavailable, "{e}");
            assert!(
                e.to_string().contains("connection to the executor broke"),
                "{e}"
            );
        }
        // The executor's own INTERNAL names its reason: it stays INTERNAL.
        let e = status_to_error(told(Code::Internal, "INTERNAL", DOMAIN));
        assert!(matches!(e, Error::Internal(_)), "{e:?}");
        let e = status_to_error(told(Code::Unknown, "INTERNAL", DOMAIN));
        assert!(matches!(e, Error::Internal(_)), "{e:?}");
    }
}
