//! ActionService: Execute (one action, streamed to its end), StreamObservations (replay + follow), Connect
//! (see `connect`) and CancelAction.

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use mentis_core::{ActionId, Error, SandboxId};
use mentis_proto::api::{self, action_service_server::ActionService};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use super::status::to_status;
use super::streams::only_action;
use crate::convert::{action_from_proto, observation_to_proto, summary_to_proto};
use crate::observations::LogItem;
use crate::sandboxes::Manager;

pub(super) type BoxStreamPub<T> = BoxStream<T>;
type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// Implementation of `mentis.v1.ActionService`.
#[derive(Debug, Clone)]
pub struct ActionApi {
    pub(super) manager: Arc<Manager>,
    /// Ends every open stream when the runtime shuts down, so the server can drain.
    pub(super) shutdown: CancellationToken,
    /// Owns the Connect session tasks.
    pub(super) sessions: TaskTracker,
}

impl ActionApi {
    pub fn new(manager: Arc<Manager>, shutdown: CancellationToken, sessions: TaskTracker) -> Self {
        Self {
            manager,
            shutdown,
            sessions,
        }
    }
}

/// The gap marker of the public API.
pub(super) fn gap(after_seq: u64, first_available_seq: u64) -> api::LogGap {
    api::LogGap {
        after_seq,
        first_available_seq,
    }
}

/// An optional client-chosen action id.
pub(super) fn parse_action_id(s: &str) -> Result<Option<ActionId>, Error> {
    if s.is_empty() {
        Ok(None)
    } else {
        ActionId::parse(s).map(Some)
    }
}

#[tonic::async_trait]
impl ActionService for ActionApi {
    type ConnectStream = BoxStream<api::ConnectResponse>;
    type ExecuteStream = BoxStream<api::ExecuteResponse>;
    type StreamObservationsStream = BoxStream<api::StreamObservationsResponse>;

    async fn connect(
        &self,
        req: Request<Streaming<api::ConnectRequest>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        Ok(Response::new(self.start_session(req.into_inner())))
    }

    async fn execute(
        &self,
        req: Request<api::ExecuteRequest>,
    ) -> Result<Response<Self::ExecuteStream>, Status> {
        let r = req.into_inner();
        let sandbox = SandboxId::parse(&r.sandbox_id).map_err(to_status)?;
        let action = action_from_proto(r.action).map_err(to_status)?;
        let action_id = parse_action_id(&r.action_id).map_err(to_status)?;
        let handle = self.manager.handle(sandbox).map_err(to_status)?;
        let sub = self
            .manager
            .submit(sandbox, action_id, action)
            .await
            .map_err(to_status)?;
        // A retry of an accepted submission replays the same action's observations from its start.
        let stream = only_action(handle.log.follow(sub.after_seq), sub.id)
            .map(|item| {
                let kind = match item {
                    LogItem::Observation(o) => {
                        api::execute_response::Kind::Observation(observation_to_proto(&o))
                    }
                    LogItem::Gap {
                        after_seq,
                        first_available_seq,
                    } => api::execute_response::Kind::Gap(gap(after_seq, first_available_seq)),
                };
                Ok(api::ExecuteResponse { kind: Some(kind) })
            })
            .take_until(self.shutdown.clone().cancelled_owned());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn stream_observations(
        &self,
        req: Request<api::StreamObservationsRequest>,
    ) -> Result<Response<Self::StreamObservationsStream>, Status> {
        let r = req.into_inner();
        let sandbox = SandboxId::parse(&r.sandbox_id).map_err(to_status)?;
        let action = parse_action_id(&r.action_id).map_err(to_status)?;
        let handle = self.manager.handle(sandbox).map_err(to_status)?;
        let items = handle.log.follow(r.after_seq);
        let items: Pin<Box<dyn Stream<Item = LogItem> + Send>> = match action {
            Some(id) => Box::pin(only_action(items, id)),
            None => Box::pin(items),
        };
        let stream = items
            .map(|item| {
                let kind = match item {
                    LogItem::Observation(o) => {
                        api::stream_observations_response::Kind::Observation(observation_to_proto(
                            &o,
                        ))
                    }
                    LogItem::Gap {
                        after_seq,
                        first_available_seq,
                    } => api::stream_observations_response::Kind::Gap(gap(
                        after_seq,
                        first_available_seq,
                    )),
                };
                Ok(api::StreamObservationsResponse { kind: Some(kind) })
            })
            .take_until(self.shutdown.clone().cancelled_owned());
        Ok(Response::new(Box::pin(stream)))
    }

    async fn cancel_action(
        &self,
        req: Request<api::CancelActionRequest>,
    ) -> Result<Response<api::CancelActionResponse>, Status> {
        let r = req.into_inner();
        let sandbox = SandboxId::parse(&r.sandbox_id).map_err(to_status)?;
        let action = ActionId::parse(&r.action_id).map_err(to_status)?;
        self.manager
            .cancel(sandbox, &action)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::CancelActionResponse {}))
    }

    async fn reset_kernel(
        &self,
        req: Request<api::ResetKernelRequest>,
    ) -> Result<Response<api::ResetKernelResponse>, Status> {
        let sandbox = SandboxId::parse(&req.into_inner().sandbox_id).map_err(to_status)?;
        self.manager
            .reset_kernel(sandbox)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::ResetKernelResponse {}))
    }

    async fn inspect_variables(
        &self,
        req: Request<api::InspectVariablesRequest>,
    ) -> Result<Response<api::InspectVariablesResponse>, Status> {
        let r = req.into_inner();
        let sandbox = SandboxId::parse(&r.sandbox_id).map_err(to_status)?;
        let vars = self
            .manager
            .inspect_variables(sandbox, r.names)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::InspectVariablesResponse {
            variables: vars.iter().map(summary_to_proto).collect(),
        }))
    }
}
