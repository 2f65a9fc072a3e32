//! Connect: one bidirectional stream per client and sandbox. The first message attaches (optionally
//! replaying after a seq); then submits, cancels and stdin writes are answered in-stream while every
//! observation of the sandbox flows out. A session is a task of its own, so the response stream can start
//! before the client sends anything.

use std::pin::pin;
use std::sync::Arc;

use futures::StreamExt;
use mentis_core::{ActionId, Error, SandboxId};
use mentis_proto::api::{self, connect_request, connect_response};
use tonic::{Status, Streaming};

use super::action_service::{ActionApi, parse_action_id};
use super::decode;
use super::follow::{self, with_keepalives};
use super::outbound::{Guarded, Outbound};
use super::status::{client_message, code_name, reason, to_status};
use crate::auth::Caller;
use crate::convert::action_from_proto;

type Tx = Outbound<api::ConnectResponse>;

fn msg(kind: connect_response::Kind) -> Result<api::ConnectResponse, Status> {
    Ok(api::ConnectResponse { kind: Some(kind) })
}

fn rejected(action_id: &str, e: &Error) -> Result<api::ConnectResponse, Status> {
    msg(connect_response::Kind::Rejected(
        connect_response::Rejected {
            action_id: action_id.to_owned(),
            code: code_name(e).to_owned(),
            message: client_message(e),
            reason: reason(e).to_owned(),
        },
    ))
}

impl ActionApi {
    pub(super) fn start_session(
        &self,
        inbound: Streaming<api::ConnectRequest>,
        caller: Caller,
    ) -> Guarded<api::ConnectResponse> {
        let api = self.clone();
        follow::spawn_session(
            self.policy,
            &self.sessions,
            self.shutdown.clone(),
            move |tx| async move { api.session(inbound, &tx, &caller).await },
        )
    }

    async fn session(&self, mut inbound: Streaming<api::ConnectRequest>, tx: &Tx, caller: &Caller) {
        let first = tokio::select! {
            m = inbound.message() => m,
            () = tx.closed() => return,
        };
        let attach = match first {
            Ok(Some(api::ConnectRequest {
                kind: Some(connect_request::Kind::Attach(a)),
            })) => a,
            Ok(Some(_)) => {
                tx.send(Err(to_status(
                    Error::invalid("the first Connect message must be attach").at("attach"),
                )))
                .await;
                return;
            }
            Ok(None) => return,
            // A message the server cannot decode (or one over the size limit) ends the stream with the
            // client's mistake as its status, never a silent OK.
            Err(status) => {
                tx.send(Err(decode::inbound(status))).await;
                return;
            }
        };
        // The caller may act on this sandbox (its space); the session never leaves it.
        let attached = SandboxId::parse(&attach.sandbox_id).and_then(|id| {
            caller.require_space_of(
                &self.manager.space_of(id)?,
                &format!("sandbox {id}"),
                Some(mentis_core::Resource::sandbox(id)),
            )?;
            let log = self.manager.log(id)?;
            if let Some(after) = attach.after_seq {
                follow::check_after_seq(&log, after)?;
            }
            Ok((id, log))
        });
        let (sandbox, log) = match attached {
            Ok(attached) => attached,
            Err(e) => {
                tx.send(Err(to_status(e))).await;
                return;
            }
        };
        let last_seq = log.last_seq();
        let attached = connect_response::Attached {
            sandbox_id: sandbox.to_string(),
            last_seq,
        };
        if !tx
            .send(msg(connect_response::Kind::Attached(attached)))
            .await
        {
            return;
        }
        // The same follow as Execute and StreamObservations (gaps, keepalives, the stall cut-off of `tx`),
        // interleaved with the answers to the client's messages.
        let items = log.follow(attach.after_seq.unwrap_or(last_seq));
        let mut follow = pin!(with_keepalives(
            items,
            Arc::clone(&log),
            self.policy.keepalive
        ));
        let mut inbound_open = true;
        loop {
            let sent = tokio::select! {
                m = inbound.message(), if inbound_open => match m {
                    Ok(Some(m)) => match self.on_message(sandbox, m).await {
                        Some(answer) => tx.send(answer).await,
                        None => true,
                    },
                    // The client closed its side; it still gets observations until it hangs up.
                    Ok(None) => { inbound_open = false; true }
                    Err(status) => {
                        tx.send(Err(decode::inbound(status))).await;
                        return;
                    }
                },
                next = follow.next() => match next {
                    Some(next) => follow::send(tx, next).await,
                    // The sandbox was deleted and everything it logged has been sent.
                    None => return,
                },
                () = tx.closed() => return,
            };
            if !sent {
                return;
            }
        }
    }

    async fn on_message(
        &self,
        sandbox: SandboxId,
        m: api::ConnectRequest,
    ) -> Option<Result<api::ConnectResponse, Status>> {
        use connect_request::Kind;
        match m.kind {
            Some(Kind::Submit(s)) => {
                let result = async {
                    let action = action_from_proto(s.action)?;
                    let id = parse_action_id(&s.action_id)?;
                    self.manager.submit(sandbox, id, action).await
                }
                .await;
                Some(match result {
                    Ok(sub) => msg(connect_response::Kind::Accepted(
                        connect_response::Accepted {
                            action_id: sub.id.to_string(),
                            resumed: sub.resumed,
                        },
                    )),
                    Err(e) => rejected(&s.action_id, &e),
                })
            }
            Some(Kind::Cancel(c)) => {
                let result = async {
                    let id = ActionId::parse(&c.action_id)?;
                    self.manager.cancel(sandbox, &id).await
                }
                .await;
                result.err().map(|e| rejected(&c.action_id, &e))
            }
            Some(Kind::Stdin(s)) => {
                let result = async {
                    let id = ActionId::parse(&s.action_id)?;
                    self.manager.write_stdin(sandbox, &id, s.data, s.eof).await
                }
                .await;
                result.err().map(|e| rejected(&s.action_id, &e))
            }
            Some(Kind::Attach(_)) => Some(rejected(
                "",
                &Error::invalid("this stream is already attached"),
            )),
            None => Some(rejected("", &Error::invalid("empty Connect message"))),
        }
    }
}
