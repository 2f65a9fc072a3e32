//! TerminalService: a client's terminal stream passed on to the sandbox's executor, which owns the terminal
//! (its pty, scrollback and idle timer; docs/ARCHITECTURE.md, "Terminals"). The runtime checks who may
//! touch the sandbox and what the first request asks, resumes a paused sandbox, adds the settings and the
//! sandbox env, counts the traffic as activity and keeps the stream alive through proxies.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt as _};

use mentis_core::terminal::{TerminalSpec, validate_terminal_id};
use mentis_core::{Error, Reason, SandboxId};
use mentis_proto::api::{self, open_request, open_response, terminal_service_server};
use mentis_proto::executor::{TerminalRequest, TerminalSettings};
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Request, Response, Status, Streaming};

use super::access::{self, caller};
use super::decode;
use super::follow;
use super::outbound::{Guarded, Outbound, StreamPolicy};
use super::status::to_status;
use crate::auth::Caller;
use crate::auth::link::{self, Link, Links};
use crate::config::TerminalPolicy;
use crate::sandboxes::{Manager, SandboxHandle};

/// Client requests waiting for the executor.
const INBOUND: usize = 16;

/// Implementation of `mentis.v1.TerminalService`.
#[derive(Debug, Clone)]
pub struct TerminalApi {
    manager: Arc<Manager>,
    /// Ends every open stream when the runtime shuts down.
    shutdown: CancellationToken,
    sessions: TaskTracker,
    policy: StreamPolicy,
    terminals: TerminalPolicy,
    links: Links,
}

impl TerminalApi {
    pub fn new(
        manager: Arc<Manager>,
        shutdown: CancellationToken,
        sessions: TaskTracker,
        policy: StreamPolicy,
        links: Links,
    ) -> Self {
        let terminals = manager.config().terminals;
        Self {
            manager,
            shutdown,
            sessions,
            policy,
            terminals,
            links,
        }
    }

    fn settings(&self, handle: &SandboxHandle) -> TerminalSettings {
        TerminalSettings {
            env: handle.env.clone().into_iter().collect(),
            max_terminals: u32::try_from(self.terminals.max_per_sandbox).unwrap_or(u32::MAX),
            default_idle_timeout_seconds: u32::try_from(self.terminals.idle_timeout.as_secs())
                .unwrap_or(u32::MAX),
            scrollback_bytes: self.terminals.scrollback_bytes as u64,
        }
    }

    /// One stream: the first request checked and sent on with the settings, then both ways until either
    /// side ends.
    async fn session(
        &self,
        mut inbound: impl Stream<Item = Result<api::OpenRequest, Status>> + Unpin,
        tx: &Outbound<api::OpenResponse>,
        caller: &Caller,
    ) {
        let first = tokio::select! {
            m = inbound.next() => m.transpose(),
            () = tx.closed() => return,
        };
        let first = match first {
            Ok(Some(first)) => first,
            Ok(None) => return,
            Err(status) => {
                tx.send(Err(decode::inbound(status))).await;
                return;
            }
        };
        let (handle, client) = match self.admit(&first, caller).await {
            Ok(admitted) => admitted,
            Err(status) => {
                tx.send(Err(status)).await;
                return;
            }
        };
        let (to_executor, requests) = mpsc::channel(INBOUND);
        let _ = to_executor.try_send(TerminalRequest {
            request: Some(first),
            settings: Some(self.settings(&handle)),
        });
        let mut to_executor = Some(to_executor);
        let mut outputs = match client
            .terminal(futures::stream::unfold(requests, |mut rx| async move {
                rx.recv().await.map(|request| (request, rx))
            }))
            .await
        {
            Ok(outputs) => outputs,
            Err(e) => {
                tx.send(Err(to_status(e))).await;
                return;
            }
        };
        let keepalive = self.policy.keepalive;
        let mut quiet_since = Instant::now();
        loop {
            let sent = tokio::select! {
                m = inbound.next(), if to_executor.is_some() => match m.transpose() {
                    Ok(Some(request)) => {
                        tracing::debug!(?request, "terminal request from the client");
                        handle.touch();
                        let forward = TerminalRequest { request: Some(request), settings: None };
                        // The executor stops taking requests once the program's end is on its way: the
                        // request is moot then, and the stream goes on until `exited` has been passed on.
                        if let Some(to) = to_executor.as_ref()
                            && to.send(forward).await.is_err()
                        {
                            to_executor = None;
                        }
                        true
                    }
                    // The client closed its side: the terminal runs on and its output still comes.
                    Ok(None) => { to_executor = None; true }
                    Err(status) => {
                        tx.send(Err(decode::inbound(status))).await;
                        return;
                    }
                },
                out = outputs.message() => match out {
                    Ok(Some(mentis_proto::executor::TerminalResponse { response: Some(response) })) => {
                        if matches!(response.kind, Some(open_response::Kind::Output(_))) {
                            handle.touch();
                        }
                        quiet_since = Instant::now();
                        tx.send(Ok(response)).await
                    }
                    Ok(Some(_)) => true,
                    // `exited` was sent: the stream ends OK.
                    Ok(None) => return,
                    Err(status) => {
                        let e = crate::executor_client::status_to_error(status);
                        let e = if handle.cancel.is_cancelled() {
                            Error::new(Reason::SandboxEnded, format!("sandbox {} was deleted", handle.id))
                        } else {
                            e
                        };
                        tx.send(Err(to_status(e))).await;
                        return;
                    }
                },
                () = tokio::time::sleep_until(quiet_since + keepalive) => {
                    quiet_since = Instant::now();
                    tx.send(Ok(api::OpenResponse {
                        kind: Some(open_response::Kind::Keepalive(api::TerminalKeepalive {
                            time: Some(crate::convert::timestamp(crate::clock::now())),
                        })),
                    }))
                    .await
                }
                () = handle.cancel.cancelled() => {
                    tx.send(Err(to_status(Error::new(
                        Reason::SandboxEnded,
                        format!("sandbox {} was deleted", handle.id),
                    ))))
                    .await;
                    return;
                }
                () = tx.closed() => return,
            };
            if !sent {
                return;
            }
        }
    }

    /// Checks the first request and reaches the sandbox's executor (resuming a paused sandbox).
    async fn admit(
        &self,
        first: &api::OpenRequest,
        caller: &Caller,
    ) -> Result<(Arc<SandboxHandle>, crate::executor_client::ExecutorClient), Status> {
        let sandbox_id = match &first.kind {
            Some(open_request::Kind::Start(start)) => {
                TerminalSpec::validate(
                    start.command.clone(),
                    start.cols,
                    start.rows,
                    start.env.clone().into_iter().collect(),
                    start.work_dir.clone(),
                    start.idle_timeout_seconds,
                )
                .map_err(|e| to_status(invalid_terminal(e)))?;
                &start.sandbox_id
            }
            Some(open_request::Kind::Attach(attach)) => {
                validate_terminal_id(&attach.terminal_id, "attach.terminal_id")
                    .map_err(|e| to_status(invalid_terminal(e)))?;
                &attach.sandbox_id
            }
            _ => {
                return Err(to_status(
                    Error::new(
                        Reason::InvalidTerminal,
                        "the first OpenRequest must be start or attach",
                    )
                    .at("start"),
                ));
            }
        };
        let sandbox = access::sandbox(caller, &self.manager, sandbox_id)?;
        let handle = self.manager.handle(sandbox).map_err(to_status)?;
        let client = self
            .manager
            .executor_for(sandbox)
            .await
            .map_err(to_status)?;
        Ok((handle, client))
    }

    async fn executor(
        &self,
        caller: &Caller,
        sandbox_id: &str,
    ) -> Result<(SandboxId, crate::executor_client::ExecutorClient), Status> {
        let sandbox = access::sandbox(caller, &self.manager, sandbox_id)?;
        let client = self
            .manager
            .executor_for(sandbox)
            .await
            .map_err(to_status)?;
        Ok((sandbox, client))
    }
}

impl TerminalApi {
    /// One terminal stream for `caller`: `inbound` is the client's side (start or attach first), the
    /// stream returned the server's. The gRPC `Open` and the web terminal's WebSocket (`web`) both come
    /// here.
    pub fn bridge(
        &self,
        inbound: impl Stream<Item = Result<api::OpenRequest, Status>> + Send + Unpin + 'static,
        caller: Caller,
    ) -> Guarded<api::OpenResponse> {
        let api = self.clone();
        follow::spawn_session(
            self.policy,
            &self.sessions,
            self.shutdown.clone(),
            move |tx| async move { api.session(inbound, &tx, &caller).await },
        )
    }

    /// The link of CreateTerminalLink, checked: the caller may use the sandbox, the terminal id is one, the
    /// lifetime within bounds.
    fn link(&self, caller: &Caller, r: &api::CreateTerminalLinkRequest) -> Result<Link, Status> {
        if self.manager.config().http_listen.is_none() {
            return Err(to_status(Error::new(
                Reason::FailedPrecondition,
                "this runtime serves no web terminal: set MENTIS_HTTP_LISTEN",
            )));
        }
        let terminal_id = if r.terminal_id.is_empty() {
            None
        } else {
            validate_terminal_id(&r.terminal_id, "terminal_id")
                .map_err(|e| to_status(invalid_terminal(e)))?;
            Some(r.terminal_id.clone())
        };
        let ttl = match r.ttl_seconds {
            0 => link::DEFAULT_TTL,
            s if Duration::from_secs(s.into()) > link::MAX_TTL => {
                return Err(to_status(
                    Error::new(
                        Reason::InvalidArgument,
                        format!(
                            "ttl_seconds is {s}; a link lives at most {} seconds",
                            link::MAX_TTL.as_secs()
                        ),
                    )
                    .at("ttl_seconds"),
                ));
            }
            s => Duration::from_secs(s.into()),
        };
        let sandbox_id = access::sandbox(caller, &self.manager, &r.sandbox_id)?;
        // An unknown sandbox is NOT_FOUND now rather than when the page opens.
        self.manager.handle(sandbox_id).map_err(to_status)?;
        Ok(Link {
            sandbox_id,
            terminal_id,
            expires_at: link::unix(crate::clock::now() + ttl),
        })
    }
}

/// A terminal request's mistake, with the reason that says so.
fn invalid_terminal(e: impl Into<Error>) -> Error {
    e.into().with_reason(Reason::InvalidTerminal)
}

#[tonic::async_trait]
impl terminal_service_server::TerminalService for TerminalApi {
    type OpenStream = Guarded<api::OpenResponse>;

    async fn open(
        &self,
        req: Request<Streaming<api::OpenRequest>>,
    ) -> Result<Response<Self::OpenStream>, Status> {
        let caller = caller(&req)?;
        Ok(Response::new(self.bridge(req.into_inner(), caller)))
    }

    async fn create_terminal_link(
        &self,
        req: Request<api::CreateTerminalLinkRequest>,
    ) -> Result<Response<api::CreateTerminalLinkResponse>, Status> {
        let caller = caller(&req)?;
        let link = self.link(&caller, req.get_ref())?;
        let token = self.links.sign(&link);
        Ok(Response::new(api::CreateTerminalLinkResponse {
            path: format!("/terminal#token={token}"),
            token,
            expires_at: Some(crate::convert::timestamp(
                std::time::UNIX_EPOCH + Duration::from_secs(link.expires_at),
            )),
        }))
    }

    async fn list_terminals(
        &self,
        req: Request<api::ListTerminalsRequest>,
    ) -> Result<Response<api::ListTerminalsResponse>, Status> {
        let caller = caller(&req)?;
        let (_, client) = self.executor(&caller, &req.get_ref().sandbox_id).await?;
        let terminals = client.list_terminals().await.map_err(to_status)?;
        Ok(Response::new(api::ListTerminalsResponse { terminals }))
    }

    async fn close_terminal(
        &self,
        req: Request<api::CloseTerminalRequest>,
    ) -> Result<Response<api::CloseTerminalResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        validate_terminal_id(&r.terminal_id, "terminal_id")
            .map_err(|e| to_status(invalid_terminal(e)))?;
        let (sandbox, client) = self.executor(&caller, &r.sandbox_id).await?;
        client
            .close_terminal(&r.terminal_id)
            .await
            .map_err(|e| to_status(e.about(mentis_core::Resource::sandbox(sandbox))))?;
        Ok(Response::new(api::CloseTerminalResponse {}))
    }
}
