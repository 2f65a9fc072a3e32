//! ActionService: Execute (one action, streamed to its end), StreamObservations (replay + follow), Connect
//! (see `connect`) and CancelAction.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use mentis_core::{ActionId, Error};
use mentis_proto::api::{self, action_service_server::ActionService};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use super::access::{self, caller};
use super::outbound::{self, Guarded, Outgoing, StreamPolicy};
use super::status::to_status;
use super::streams::only_action;
use crate::convert::{action_from_proto, observation_to_proto, summary_to_proto};
use crate::observations::LogItem;
use crate::sandboxes::{Manager, SandboxHandle};

/// Implementation of `mentis.v1.ActionService`.
#[derive(Debug, Clone)]
pub struct ActionApi {
    pub(super) manager: Arc<Manager>,
    /// Ends every open stream when the runtime shuts down, so the server can drain.
    pub(super) shutdown: CancellationToken,
    /// Owns the Connect session tasks and the stream tasks.
    pub(super) sessions: TaskTracker,
    /// Keepalive and stall timing of outgoing streams.
    pub(super) policy: StreamPolicy,
}

impl ActionApi {
    pub fn new(
        manager: Arc<Manager>,
        shutdown: CancellationToken,
        sessions: TaskTracker,
        policy: StreamPolicy,
    ) -> Self {
        Self {
            manager,
            shutdown,
            sessions,
            policy,
        }
    }
}

impl ActionApi {
    /// Streams log items to the client through a guarded channel (keepalives, stall cut-off).
    fn follow<T, S, F>(&self, items: S, handle: &SandboxHandle, map: F) -> Guarded<T>
    where
        T: Send + 'static,
        S: Stream<Item = LogItem> + Send + 'static,
        F: Fn(Outgoing) -> T + Send + 'static,
    {
        outbound::follow(
            items,
            Arc::clone(&handle.log),
            self.policy,
            &self.sessions,
            self.shutdown.clone(),
            map,
        )
    }
}

/// A keepalive of the public API.
pub(super) fn keepalive(last_seq: u64) -> api::Keepalive {
    api::Keepalive {
        last_seq,
        time: Some(crate::convert::timestamp(std::time::SystemTime::now())),
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
    type ConnectStream = Guarded<api::ConnectResponse>;
    type ExecuteStream = Guarded<api::ExecuteResponse>;
    type StreamObservationsStream = Guarded<api::StreamObservationsResponse>;

    async fn connect(
        &self,
        req: Request<Streaming<api::ConnectRequest>>,
    ) -> Result<Response<Self::ConnectStream>, Status> {
        let caller = caller(&req)?;
        Ok(Response::new(self.start_session(req.into_inner(), caller)))
    }

    async fn execute(
        &self,
        req: Request<api::ExecuteRequest>,
    ) -> Result<Response<Self::ExecuteStream>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        let action = action_from_proto(r.action).map_err(to_status)?;
        let action_id = parse_action_id(&r.action_id).map_err(to_status)?;
        let handle = self.manager.handle(sandbox).map_err(to_status)?;
        let sub = self
            .manager
            .submit(sandbox, action_id, action)
            .await
            .map_err(to_status)?;
        // A retry of an accepted submission replays the same action's observations from its start.
        let items = only_action(handle.log.follow(sub.after_seq), sub.id);
        let stream = self.follow(items, &handle, |out| {
            use api::execute_response::Kind as K;
            let kind = match out {
                Outgoing::Item(LogItem::Observation(o)) => K::Observation(observation_to_proto(&o)),
                Outgoing::Item(LogItem::Gap {
                    after_seq,
                    first_available_seq,
                }) => K::Gap(gap(after_seq, first_available_seq)),
                Outgoing::Keepalive { last_seq } => K::Keepalive(keepalive(last_seq)),
            };
            api::ExecuteResponse { kind: Some(kind) }
        });
        Ok(Response::new(stream))
    }

    async fn stream_observations(
        &self,
        req: Request<api::StreamObservationsRequest>,
    ) -> Result<Response<Self::StreamObservationsStream>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        let action = parse_action_id(&r.action_id).map_err(to_status)?;
        let handle = self.manager.handle(sandbox).map_err(to_status)?;
        let items = handle.log.follow(r.after_seq);
        let items: Pin<Box<dyn Stream<Item = LogItem> + Send>> = match action {
            Some(id) => Box::pin(only_action(items, id)),
            None => Box::pin(items),
        };
        let stream = self.follow(items, &handle, |out| {
            use api::stream_observations_response::Kind as K;
            let kind = match out {
                Outgoing::Item(LogItem::Observation(o)) => K::Observation(observation_to_proto(&o)),
                Outgoing::Item(LogItem::Gap {
                    after_seq,
                    first_available_seq,
                }) => K::Gap(gap(after_seq, first_available_seq)),
                Outgoing::Keepalive { last_seq } => K::Keepalive(keepalive(last_seq)),
            };
            api::StreamObservationsResponse { kind: Some(kind) }
        });
        Ok(Response::new(stream))
    }

    async fn cancel_action(
        &self,
        req: Request<api::CancelActionRequest>,
    ) -> Result<Response<api::CancelActionResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
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
        let caller = caller(&req)?;
        let sandbox = access::sandbox(&caller, &self.manager, &req.into_inner().sandbox_id)?;
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
        let caller = caller(&req)?;
        let r = req.into_inner();
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
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
