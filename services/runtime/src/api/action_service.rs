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
use super::follow::{self, FollowMessage, only_action};
use super::outbound::{Guarded, StreamPolicy};
use super::status::to_status;
use crate::convert::{action_from_proto, process_to_proto, summary_to_proto};
use crate::observations::{LogItem, ObservationLog};
use crate::sandboxes::Manager;

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
    /// Follows `items` of `log` to the client (see `follow`).
    fn follow<T, S>(&self, items: S, log: &Arc<ObservationLog>) -> Guarded<T>
    where
        T: FollowMessage,
        S: Stream<Item = LogItem> + Send + 'static,
    {
        follow::spawn(
            items,
            Arc::clone(log),
            self.policy,
            &self.sessions,
            self.shutdown.clone(),
        )
    }
}

/// The names of `asked` that are not among `found`, in the order asked, each once. The executor's answer
/// leaves out exactly the names that are not defined, so these are they.
fn missing_names<'a>(asked: &[String], found: impl Iterator<Item = &'a str>) -> Vec<String> {
    let found: std::collections::HashSet<&str> = found.collect();
    let mut seen = std::collections::HashSet::new();
    asked
        .iter()
        .filter(|n| !found.contains(n.as_str()) && seen.insert(n.as_str()))
        .cloned()
        .collect()
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
        let log = self.manager.log(sandbox).map_err(to_status)?;
        let sub = self
            .manager
            .submit(sandbox, action_id, action)
            .await
            .map_err(to_status)?;
        // A retry of an accepted submission replays the same action's observations from its start.
        let items = only_action(log.follow(sub.after_seq), sub.id);
        Ok(Response::new(self.follow(items, &log)))
    }

    async fn stream_observations(
        &self,
        req: Request<api::StreamObservationsRequest>,
    ) -> Result<Response<Self::StreamObservationsStream>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        let action = parse_action_id(&r.action_id).map_err(to_status)?;
        let log = self.manager.log(sandbox).map_err(to_status)?;
        follow::check_after_seq(&log, r.after_seq).map_err(to_status)?;
        if let Some(id) = &action {
            self.manager
                .require_action(sandbox, id)
                .map_err(to_status)?;
        }
        let items = log.follow(r.after_seq);
        let items: Pin<Box<dyn Stream<Item = LogItem> + Send>> = match action {
            Some(id) => Box::pin(only_action(items, id)),
            None => Box::pin(items),
        };
        Ok(Response::new(self.follow(items, &log)))
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
            .inspect_variables(sandbox, r.names.clone())
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::InspectVariablesResponse {
            missing_names: missing_names(&r.names, vars.iter().map(|v| v.name.as_str())),
            variables: vars.iter().map(summary_to_proto).collect(),
        }))
    }

    async fn list_processes(
        &self,
        req: Request<api::ListProcessesRequest>,
    ) -> Result<Response<api::ListProcessesResponse>, Status> {
        let caller = caller(&req)?;
        let sandbox = access::sandbox(&caller, &self.manager, &req.get_ref().sandbox_id)?;
        let processes = self
            .manager
            .list_processes(sandbox)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::ListProcessesResponse {
            processes: processes.into_iter().map(process_to_proto).collect(),
        }))
    }

    async fn signal_process(
        &self,
        req: Request<api::SignalProcessRequest>,
    ) -> Result<Response<api::SignalProcessResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        // A client's mistake is said here, before the sandbox is woken for it.
        let pid = mentis_core::process::check_pid(r.pid).map_err(|e| to_status(Error::from(e)))?;
        let signal =
            mentis_core::process::signal_name(&r.signal).map_err(|e| to_status(Error::from(e)))?;
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        self.manager
            .signal_process(sandbox, pid, signal.to_owned())
            .await
            .map_err(to_status)?;
        tracing::info!(sandbox_id = %sandbox, pid, signal, "process signalled");
        Ok(Response::new(api::SignalProcessResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_names_are_the_asked_ones_not_found_in_order_once() {
        let asked = ["b", "a", "c", "b", "d"].map(str::to_owned);
        assert_eq!(
            missing_names(&asked, ["a", "d"].into_iter()),
            ["b", "c"].map(str::to_owned)
        );
        assert!(missing_names(&[], ["a"].into_iter()).is_empty());
    }
}
