//! The gRPC server: grpc.health.v1 (open, but a wrong token is refused) and ExecutorService (behind the bearer token), with graceful
//! shutdown that kills running process groups and the kernel.

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
    CancelRequest, CancelResponse, InspectVariablesRequest, InspectVariablesResponse,
    ResetKernelRequest, ResetKernelResponse, RunRequest, RunResponse, WriteStdinRequest,
    WriteStdinResponse,
};
use tokio::net::TcpListener;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use tonic_health::ServingStatus;

use crate::actions::Actions;
use crate::auth::BearerAuth;
use crate::config::Config;
use crate::convert;
use crate::error::Error;
use crate::files::Workspace;
use crate::files::service::WorkspaceApi;

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

    let (health, health_service) = tonic_health::server::health_reporter();
    health
        .set_service_status(SERVICE_NAME, ServingStatus::Serving)
        .await;
    let executor = ExecutorServiceServer::new(ExecutorApi {
        actions: Arc::clone(&actions),
    })
    .max_decoding_message_size(MAX_REQUEST_BYTES);
    let executor = tonic::service::interceptor::InterceptedService::new(
        executor,
        BearerAuth::new(config.token.clone()),
    );

    // File chunks are at most 256 KiB from our runtime; a client's own chunks may be larger, up to the
    // same bound as other requests.
    let workspace = WorkspaceServiceServer::new(WorkspaceApi::new(Workspace::new(&config)))
        .max_decoding_message_size(MAX_REQUEST_BYTES);
    let workspace = tonic::service::interceptor::InterceptedService::new(
        workspace,
        BearerAuth::new(config.token.clone()),
    );

    tracing::info!(%local_addr, workspace = %config.workspace.display(), max_actions = config.max_actions, "executor serving");
    let stop = shutdown.clone();
    let server = Server::builder()
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
    actions.shutdown(ACTIONS_GRACE).await;
    tracing::info!("executor stopped");
    result
}

/// ExecutorService: translates requests and hands them to [`Actions`].
struct ExecutorApi {
    actions: Arc<Actions>,
}

type RunStream = Pin<Box<dyn Stream<Item = Result<RunResponse, Status>> + Send + 'static>>;

#[tonic::async_trait]
impl ExecutorService for ExecutorApi {
    type RunStream = RunStream;

    async fn run(&self, request: Request<RunRequest>) -> Result<Response<RunStream>, Status> {
        let (action_id, spec) = convert::run_request(request.into_inner())?;
        let events = self.actions.start(action_id, spec)?;
        // The events are domain types up to here: each becomes its proto as it leaves.
        let responses = ReceiverStream::new(events).map(|event| Ok(convert::run_response(event)));
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
}
