//! The gRPC server: grpc.health.v1 (open, but a wrong token is refused) and ExecutorService (behind the bearer token), with graceful
//! shutdown that kills running process groups and the kernel.

mod terminal;

use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use futures::Stream;
use mentis_model::action::MAX_REQUEST_BYTES;
use mentis_proto::executor::executor_service_server::{
    ExecutorService, ExecutorServiceServer, SERVICE_NAME,
};
use mentis_proto::executor::workspace_service_server::WorkspaceServiceServer;
use mentis_proto::executor::{
    AttachRequest, AttachResponse, CancelRequest, CancelResponse, CloseTerminalRequest,
    CloseTerminalResponse, GetUsageRequest, GetUsageResponse, InspectVariablesRequest,
    InspectVariablesResponse, ListProcessesRequest, ListProcessesResponse, ListTerminalsRequest,
    ResetKernelRequest, ResetKernelResponse, RunRequest, RunResponse, SignalProcessRequest,
    SignalProcessResponse, TakeSpansRequest, TakeSpansResponse, TerminalRequest, WriteStdinRequest,
    WriteStdinResponse, attach_request,
};
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};
use tonic_health::ServingStatus;
use tracing::Instrument as _;

use crate::actions::Actions;
use crate::auth::BearerAuth;
use crate::config::Config;
use crate::convert;
use crate::error::Error;
use crate::events::Hold;
use crate::files::Workspace;
use crate::files::service::WorkspaceApi;
use crate::terminal::Terminals;

/// After shutdown is requested, how long open streams may take to finish before connections are dropped.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How long action tasks may take to wind down once their process groups are killed.
const ACTIONS_GRACE: Duration = Duration::from_secs(5);

/// Serves the executor on `listener` until `shutdown` is cancelled, then kills running actions and returns.
///
/// `config.listen` is not used here (the caller bound `listener`, which lets tests use port 0).
pub async fn serve(
    config: Config,
    listener: TcpListener,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let local_addr = listener.local_addr().map_err(|source| Error::Io {
        context: "reading the listener's address".to_owned(),
        source,
    })?;
    // A child token: stopping our actions must not cancel the caller's token.
    let actions = Arc::new(Actions::new(&config, shutdown.child_token()));
    let terminals = Terminals::new(
        Arc::from(config.workspace.as_path()),
        shutdown.child_token(),
    );

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status(SERVICE_NAME, ServingStatus::Serving)
        .await;
    // The tasks beside the calls' streams, awaited after the server stops (they end with their streams).
    let streams = TaskTracker::new();
    let executor = ExecutorServiceServer::new(ExecutorApi {
        actions: Arc::clone(&actions),
        terminals: Arc::clone(&terminals),
        streams: streams.clone(),
        spans: config.spans.clone(),
    })
    .max_decoding_message_size(MAX_REQUEST_BYTES);
    let executor = tonic::service::interceptor::InterceptedService::new(
        executor,
        BearerAuth::new(config.token.clone()),
    );

    // File chunks are at most 256 KiB from our runtime; a client's own chunks may be larger, up to the
    // same bound as other requests.
    let watches = crate::files::watch::Watches::new(shutdown.child_token());
    let workspace = WorkspaceServiceServer::new(WorkspaceApi::new(
        Workspace::new(&config),
        streams.clone(),
        Arc::clone(&watches),
    ))
    .max_decoding_message_size(MAX_REQUEST_BYTES);
    let workspace = tonic::service::interceptor::InterceptedService::new(
        workspace,
        BearerAuth::new(config.token.clone()),
    );

    tracing::info!(%local_addr, workspace = %config.workspace.display(), max_actions = config.max_actions, "executor serving");
    let stop = shutdown.clone();
    let server = Server::builder()
        // Every call in a span continuing the runtime's trace (nothing when traces are off).
        .layer(mentis_telemetry::GrpcTraceLayer)
        .add_service(tonic::service::interceptor::InterceptedService::new(
            health_service,
            BearerAuth::optional(config.token.clone()),
        ))
        .add_service(executor)
        .add_service(workspace)
        .serve_with_incoming_shutdown(
            // No Nagle: output chunks are small and latency matters.
            TcpIncoming::from(listener).with_nodelay(Some(true)),
            async move {
                stop.cancelled().await;
                tracing::info!("shutting down: no new calls; killing running actions");
                health
                    .set_service_status("", ServingStatus::NotServing)
                    .await;
                health
                    .set_service_status(SERVICE_NAME, ServingStatus::NotServing)
                    .await;
            },
        );
    // Cancelled shutdown token -> actions are killed (child token) -> their streams end -> the graceful
    // shutdown completes. The timeout covers a reader that never drains its stream.
    let result = tokio::select! {
        result = server => result.map_err(Error::from),
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(DRAIN_TIMEOUT).await;
        } => {
            tracing::warn!("open streams did not finish in time; dropping connections");
            Ok(())
        }
    };
    streams.close();
    let streams_ended = async {
        if tokio::time::timeout(ACTIONS_GRACE, streams.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                "tasks of streams still open after the grace are left to the process's end"
            );
        }
    };
    tokio::join!(
        actions.shutdown(ACTIONS_GRACE),
        terminals.shutdown(ACTIONS_GRACE),
        watches.shutdown(ACTIONS_GRACE),
        streams_ended
    );
    tracing::info!("executor stopped");
    result
}

/// ExecutorService: translates requests and hands them to [`Actions`].
struct ExecutorApi {
    actions: Arc<Actions>,
    terminals: Arc<Terminals>,
    /// Owns the tasks beside a call's stream (Attach's acknowledgements, a terminal's relay).
    streams: TaskTracker,
    /// Finished spans for TakeSpans (None when traces are off).
    spans: Option<mentis_telemetry::SpanBuffer>,
}

type RunStream = Pin<Box<dyn Stream<Item = Result<RunResponse, Status>> + Send + 'static>>;
type AttachStream = Pin<Box<dyn Stream<Item = Result<AttachResponse, Status>> + Send + 'static>>;

/// How long a held action's output waits for a control plane that went away before its oldest events are
/// dropped (ARCHITECTURE.md, "Durability and restart").
const HOLD_WAIT: Duration = Duration::from_secs(600);

impl ExecutorApi {
    /// The events of `outbox` after the reader's cursor, as they come; the outbox is forgotten once done.
    fn events(
        &self,
        action_id: String,
        reader: crate::events::Reader,
    ) -> impl Stream<Item = RunResponse> + Send + 'static {
        let actions = Arc::clone(&self.actions);
        futures::stream::unfold(Some((reader, actions, action_id)), |state| async move {
            let (mut reader, actions, id) = state?;
            match reader.next().await {
                Some(event) => Some((convert::run_response(event), Some((reader, actions, id)))),
                None => {
                    actions.release_if_done(&id, reader.outbox());
                    None
                }
            }
        })
    }
}

#[tonic::async_trait]
impl ExecutorService for ExecutorApi {
    type RunStream = RunStream;
    type AttachStream = AttachStream;
    type TerminalStream = terminal::TerminalStream;

    async fn run(&self, request: Request<RunRequest>) -> Result<Response<RunStream>, Status> {
        let (action_id, spec) = convert::run_request(request.into_inner())?;
        let outbox = self.actions.start(action_id.clone(), spec, Hold::Read)?;
        // The events are domain types up to here: each becomes its proto as it leaves.
        let responses = self.events(action_id, outbox.attach(0)).map(Ok);
        Ok(Response::new(Box::pin(responses)))
    }

    async fn attach(
        &self,
        request: Request<Streaming<AttachRequest>>,
    ) -> Result<Response<AttachStream>, Status> {
        let mut requests = request.into_inner();
        let first = requests
            .message()
            .await?
            .and_then(|r| r.kind)
            .ok_or_else(|| {
                Status::invalid_argument("the first AttachRequest must be start or resume")
            })?;
        let (action_id, outbox, after) = match first {
            attach_request::Kind::Start(run) => {
                let (action_id, spec) = convert::run_request(run)?;
                let hold = Hold::Acked { wait: HOLD_WAIT };
                let outbox = self.actions.start(action_id.clone(), spec, hold)?;
                (action_id, outbox, 0)
            }
            attach_request::Kind::Resume(resume) => {
                let action_id = convert::action_id_arg(resume.action_id)?;
                let outbox = self.actions.outbox(&action_id)?;
                (action_id, outbox, resume.after_index)
            }
            attach_request::Kind::Ack(_) => {
                return Err(Status::invalid_argument(
                    "the first AttachRequest must be start or resume, not ack",
                ));
            }
        };
        // The reader's acknowledgements, as they come; a broken request stream only stops them.
        let reader = outbox.attach(after);
        let acks = Arc::clone(&outbox);
        let actions = Arc::clone(&self.actions);
        let id = action_id.clone();
        let span = tracing::debug_span!("attach acknowledgements", action_id = %id);
        let acknowledging = async move {
            while let Ok(Some(request)) = requests.message().await {
                if let Some(attach_request::Kind::Ack(index)) = request.kind {
                    acks.ack(index);
                    actions.release_if_done(&id, &acks);
                }
            }
        };
        self.streams.spawn(acknowledging.instrument(span));
        let responses = self
            .events(action_id, reader)
            .map(|event| Ok(AttachResponse { event: Some(event) }));
        Ok(Response::new(Box::pin(responses)))
    }

    async fn cancel(
        &self,
        request: Request<CancelRequest>,
    ) -> Result<Response<CancelResponse>, Status> {
        let action_id = convert::action_id_arg(request.into_inner().action_id)?;
        self.actions.cancel(&action_id)?;
        Ok(Response::new(CancelResponse {}))
    }

    async fn write_stdin(
        &self,
        request: Request<WriteStdinRequest>,
    ) -> Result<Response<WriteStdinResponse>, Status> {
        let WriteStdinRequest {
            action_id,
            data,
            eof,
        } = request.into_inner();
        let action_id = convert::action_id_arg(action_id)?;
        self.actions.write_stdin(&action_id, data, eof).await?;
        Ok(Response::new(WriteStdinResponse {}))
    }

    async fn reset_kernel(
        &self,
        _request: Request<ResetKernelRequest>,
    ) -> Result<Response<ResetKernelResponse>, Status> {
        self.actions.reset_kernel().await?;
        Ok(Response::new(ResetKernelResponse {}))
    }

    async fn inspect_variables(
        &self,
        request: Request<InspectVariablesRequest>,
    ) -> Result<Response<InspectVariablesResponse>, Status> {
        let names = convert::inspect_names(request.into_inner().names)?;
        let answer = self.actions.inspect_variables(names).await?;
        Ok(Response::new(InspectVariablesResponse {
            variables: convert::variable_summaries(answer),
        }))
    }

    async fn get_usage(
        &self,
        _request: Request<GetUsageRequest>,
    ) -> Result<Response<GetUsageResponse>, Status> {
        let usage = crate::cgroup::Cgroup::get().usage().await;
        Ok(Response::new(GetUsageResponse {
            memory_bytes: usage.memory_bytes,
            cpu_usec: usage.cpu_usec,
        }))
    }

    async fn list_processes(
        &self,
        _request: Request<ListProcessesRequest>,
    ) -> Result<Response<ListProcessesResponse>, Status> {
        let roles = self.actions.roles();
        let processes =
            tokio::task::spawn_blocking(move || crate::processes::list(Path::new("/proc"), roles))
                .await
                .map_err(|e| Status::internal(format!("listing processes: {e}")))?;
        Ok(Response::new(ListProcessesResponse { processes }))
    }

    async fn signal_process(
        &self,
        request: Request<SignalProcessRequest>,
    ) -> Result<Response<SignalProcessResponse>, Status> {
        let SignalProcessRequest { pid, signal } = request.into_inner();
        crate::processes::signal(pid, &signal, self.actions.roles())?;
        tracing::info!(pid, signal, "process signalled");
        Ok(Response::new(SignalProcessResponse {}))
    }

    async fn take_spans(
        &self,
        _request: Request<TakeSpansRequest>,
    ) -> Result<Response<TakeSpansResponse>, Status> {
        let taken = self
            .spans
            .as_ref()
            .map(mentis_telemetry::SpanBuffer::take)
            .unwrap_or_default();
        Ok(Response::new(TakeSpansResponse {
            export_trace_service_request: taken.request.into(),
            dropped_spans: taken.dropped,
        }))
    }

    async fn terminal(
        &self,
        request: Request<Streaming<TerminalRequest>>,
    ) -> Result<Response<Self::TerminalStream>, Status> {
        let stream = terminal::open(&self.terminals, request.into_inner(), &self.streams).await?;
        Ok(Response::new(stream))
    }

    async fn list_terminals(
        &self,
        _request: Request<ListTerminalsRequest>,
    ) -> Result<Response<mentis_proto::executor::ListTerminalsResponse>, Status> {
        Ok(Response::new(terminal::list(&self.terminals)))
    }

    async fn close_terminal(
        &self,
        request: Request<CloseTerminalRequest>,
    ) -> Result<Response<CloseTerminalResponse>, Status> {
        terminal::close(&self.terminals, &request.into_inner().terminal_id)?;
        Ok(Response::new(CloseTerminalResponse {}))
    }
}
