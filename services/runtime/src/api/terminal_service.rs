//! TerminalService: a client's terminal stream passed on to the sandbox's executor, which owns the terminal
//! (its pty, scrollback and idle timer; docs/ARCHITECTURE.md, "Terminals"). The runtime checks who may
//! touch the sandbox and what the first request asks, resumes a paused sandbox, adds the settings and the
//! sandbox env, counts the traffic as activity and keeps the stream alive through proxies.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt as _};

use mentis_core::terminal::{TerminalSpec, validate_terminal_id};
use mentis_core::{Error, Reason};
use mentis_proto::api::{self, open_request, open_response, terminal_service_server};
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
use crate::convert::{terminal_info_to_proto, terminal_input_from_proto, terminal_output_to_proto};
use crate::preview::Previews;
use crate::sandboxes::{Manager, TerminalSession};

/// Implementation of `mentis.v1.TerminalService`.
#[derive(Debug, Clone)]
pub struct TerminalApi {
    manager: Arc<Manager>,
    /// Ends every open stream when the runtime shuts down.
    shutdown: CancellationToken,
    sessions: TaskTracker,
    policy: StreamPolicy,
    links: Links,
    /// Where the HTTP listener is reached, for a link's whole URL.
    previews: Arc<Previews>,
}

impl TerminalApi {
    pub fn new(
        manager: Arc<Manager>,
        shutdown: CancellationToken,
        sessions: TaskTracker,
        policy: StreamPolicy,
        links: Links,
        previews: Arc<Previews>,
    ) -> Self {
        Self {
            previews,
            manager,
            shutdown,
            sessions,
            policy,
            links,
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
        let mut session = match self.admit(first, caller).await {
            Ok(session) => session,
            Err(status) => {
                tx.send(Err(status)).await;
                return;
            }
        };
        let keepalive = self.policy.keepalive;
        let mut quiet_since = Instant::now();
        loop {
            let sent = tokio::select! {
                m = inbound.next(), if session.takes_input() => match m.transpose() {
                    Ok(Some(request)) => {
                        tracing::debug!(?request, "terminal request from the client");
                        if let Some(input) = terminal_input_from_proto(request) {
                            session.send(input).await;
                        }
                        true
                    }
                    // The client closed its side: the terminal runs on and its output still comes.
                    Ok(None) => { session.close_input(); true }
                    Err(status) => {
                        tx.send(Err(decode::inbound(status))).await;
                        return;
                    }
                },
                out = session.next() => match out {
                    Ok(Some(output)) => {
                        quiet_since = Instant::now();
                        tx.send(Ok(terminal_output_to_proto(output))).await
                    }
                    // `exited` was sent: the stream ends OK.
                    Ok(None) => return,
                    Err(e) => {
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
                () = tx.closed() => return,
            };
            if !sent {
                return;
            }
        }
    }

    /// Checks the first request and opens the stream on the sandbox's executor (resuming a paused
    /// sandbox).
    async fn admit(
        &self,
        first: api::OpenRequest,
        caller: &Caller,
    ) -> Result<TerminalSession, Status> {
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
                start.sandbox_id.clone()
            }
            Some(open_request::Kind::Attach(attach)) => {
                validate_terminal_id(&attach.terminal_id, "attach.terminal_id")
                    .map_err(|e| to_status(invalid_terminal(e)))?;
                attach.sandbox_id.clone()
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
        let sandbox = access::sandbox(caller, &self.manager, &sandbox_id)?;
        let first = terminal_input_from_proto(first)
            .ok_or_else(|| to_status(Error::internal("a checked first request has no kind")))?;
        self.manager
            .open_terminal(sandbox, first)
            .await
            .map_err(to_status)
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

    /// CreateTerminalLink: the caller may use the sandbox, the terminal id is one, the sandbox can open it
    /// now (`Manager::check_terminal_link`); the link (`Links::create`) is bound to the caller's key.
    async fn link(
        &self,
        caller: &Caller,
        r: &api::CreateTerminalLinkRequest,
    ) -> Result<(Link, String), Status> {
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
        let ttl = link::ttl(r.ttl_seconds).map_err(to_status)?;
        let sandbox_id = access::sandbox(caller, &self.manager, &r.sandbox_id)?;
        // An unknown sandbox is NOT_FOUND, one that cannot open the terminal FAILED_PRECONDITION, a terminal
        // it does not have NOT_FOUND: now rather than when the page opens.
        self.manager
            .check_terminal_link(sandbox_id, terminal_id.as_deref())
            .await
            .map_err(to_status)?;
        self.links
            .create(caller, sandbox_id, terminal_id, ttl)
            .map_err(to_status)
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
        let (link, token) = self.link(&caller, req.get_ref()).await?;
        let path = format!("/terminal#token={token}");
        Ok(Response::new(api::CreateTerminalLinkResponse {
            url: format!("{}{path}", self.previews.base().unwrap_or_default()),
            path,
            token,
            expires_at: Some(crate::convert::timestamp(
                std::time::UNIX_EPOCH + Duration::from_secs(link.expires_at),
            )),
        }))
    }

    async fn revoke_terminal_links(
        &self,
        req: Request<api::RevokeTerminalLinksRequest>,
    ) -> Result<Response<api::RevokeTerminalLinksResponse>, Status> {
        let caller = caller(&req)?;
        let sandbox = access::sandbox(&caller, &self.manager, &req.get_ref().sandbox_id)?;
        // An unknown sandbox is NOT_FOUND whoever asks; an ended one's links are revoked all the same.
        self.manager.get(sandbox).map_err(to_status)?;
        self.links.revoke(sandbox).map_err(to_status)?;
        tracing::info!(sandbox_id = %sandbox, "terminal links revoked");
        Ok(Response::new(api::RevokeTerminalLinksResponse {}))
    }

    async fn list_terminals(
        &self,
        req: Request<api::ListTerminalsRequest>,
    ) -> Result<Response<api::ListTerminalsResponse>, Status> {
        let caller = caller(&req)?;
        let sandbox = access::sandbox(&caller, &self.manager, &req.get_ref().sandbox_id)?;
        let terminals = self
            .manager
            .list_terminals(sandbox)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::ListTerminalsResponse {
            terminals: terminals.into_iter().map(terminal_info_to_proto).collect(),
        }))
    }

    async fn close_terminal(
        &self,
        req: Request<api::CloseTerminalRequest>,
    ) -> Result<Response<api::CloseTerminalResponse>, Status> {
        let caller = caller(&req)?;
        let r = req.into_inner();
        validate_terminal_id(&r.terminal_id, "terminal_id")
            .map_err(|e| to_status(invalid_terminal(e)))?;
        let sandbox = access::sandbox(&caller, &self.manager, &r.sandbox_id)?;
        self.manager
            .close_terminal(sandbox, &r.terminal_id)
            .await
            .map_err(to_status)?;
        Ok(Response::new(api::CloseTerminalResponse {}))
    }
}
