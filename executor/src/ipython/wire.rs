//! The Jupyter wire: shell (requests and replies) and iopub (outputs, status) sockets to one kernel, with
//! a reader task per socket that verifies each message's signature and hands it on through a bounded
//! channel (so a slow reader of the cell's events slows the reading, and memory stays bounded).
//!
//! Messages are read as JSON values rather than jupyter-protocol's typed content: its strict types reject
//! some real messages (ipykernel 6's `interrupt_reply`, MIME bundles with unusual values), and a message
//! that fails to parse must never be lost, least of all the reply or the `idle` that ends a cell.

use std::collections::HashMap;
use std::time::Duration;

use jupyter_protocol::{ConnectionInfo, ExecuteRequest, JupyterMessage, KernelInfoRequest};
use jupyter_zmq_client::{Connection, RawMessage};
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::{CancellationToken, DropGuard};
use tokio_util::task::TaskTracker;
use tracing::Instrument;
use zeromq::SocketRecv;

/// Messages buffered per socket before its reader waits.
const CHANNEL_DEPTH: usize = 32;
/// Bound on handing a request to the socket (a dead kernel must not hang a send).
const SEND_TIMEOUT: Duration = Duration::from_secs(10);
/// Pause after a socket error before reading again (the socket reconnects in the background).
const ERROR_PAUSE: Duration = Duration::from_millis(100);

/// One message from the kernel.
#[derive(Debug, Clone)]
pub(crate) struct Incoming {
    pub(crate) msg_type: String,
    /// msg_id of the request this message answers or belongs to.
    pub(crate) parent_id: Option<String>,
    pub(crate) content: Value,
}

impl Incoming {
    pub(crate) fn is_child_of(&self, msg_id: &str) -> bool {
        self.parent_id.as_deref() == Some(msg_id)
    }
}

/// The sockets of one kernel. Dropping it stops the readers and closes the sockets.
pub(crate) struct Wire {
    shell: Connection<zeromq::DealerSendHalf>,
    /// iopub: outputs, status, execute_input.
    pub(crate) iopub: mpsc::Receiver<Incoming>,
    /// shell replies.
    pub(crate) replies: mpsc::Receiver<Incoming>,
    _stop_readers: DropGuard,
}

impl Wire {
    /// Connects to the kernel described by `info`.
    pub(crate) async fn connect(
        info: &ConnectionInfo,
        tracker: &TaskTracker,
        shutdown: &CancellationToken,
    ) -> Result<Self, String> {
        let session = uuid::Uuid::new_v4().to_string();
        let iopub = jupyter_zmq_client::create_client_iopub_connection(info, "", &session)
            .await
            .map_err(|e| format!("cannot connect to the kernel's iopub socket: {e}"))?;
        // Shell and stdin must share an identity for input requests; we have no stdin, but follow the
        // protocol's convention anyway.
        let identity = jupyter_zmq_client::peer_identity_for_session(&session)
            .map_err(|e| format!("cannot make a socket identity: {e}"))?;
        let shell = jupyter_zmq_client::create_client_shell_connection_with_identity(
            info, &session, identity,
        )
        .await
        .map_err(|e| format!("cannot connect to the kernel's shell socket: {e}"))?;
        let (shell_send, shell_recv) = shell.split();

        let stop = shutdown.child_token();
        let (iopub_tx, iopub_rx) = mpsc::channel(CHANNEL_DEPTH);
        let (reply_tx, reply_rx) = mpsc::channel(CHANNEL_DEPTH);
        tracker.spawn(
            read(iopub, iopub_tx, stop.clone())
                .instrument(tracing::debug_span!(parent: None, "iopub_reader")),
        );
        tracker.spawn(
            read(shell_recv, reply_tx, stop.clone())
                .instrument(tracing::debug_span!(parent: None, "shell_reader")),
        );
        Ok(Self {
            shell: shell_send,
            iopub: iopub_rx,
            replies: reply_rx,
            _stop_readers: stop.drop_guard(),
        })
    }

    /// Sends an execute_request; returns its msg_id.
    pub(crate) async fn execute(
        &mut self,
        code: &str,
        silent: bool,
        user_expressions: Option<HashMap<String, String>>,
    ) -> Result<String, String> {
        let request = ExecuteRequest {
            code: code.to_owned(),
            silent,
            store_history: !silent,
            user_expressions,
            // No stdin socket: input() fails at once instead of waiting forever.
            allow_stdin: false,
            // true would make ipykernel abort requests that arrive right after an error, such as the
            // rollback we send then. We never queue requests in the kernel, so there is nothing to stop.
            stop_on_error: false,
        };
        self.send(request.into()).await
    }

    /// Sends a kernel_info_request; returns its msg_id.
    pub(crate) async fn kernel_info(&mut self) -> Result<String, String> {
        self.send(KernelInfoRequest {}.into()).await
    }

    async fn send(&mut self, message: JupyterMessage) -> Result<String, String> {
        let msg_id = message.header.msg_id.clone();
        match tokio::time::timeout(SEND_TIMEOUT, self.shell.send(message)).await {
            Ok(Ok(())) => Ok(msg_id),
            Ok(Err(e)) => Err(format!("cannot send to the kernel: {e}")),
            Err(_) => Err("sending to the kernel timed out".to_owned()),
        }
    }

    /// Drops whatever earlier requests left in the channels (their parent ids would not match anyway).
    pub(crate) fn discard_stale(&mut self) {
        while self.iopub.try_recv().is_ok() {}
        while self.replies.try_recv().is_ok() {}
    }
}

/// Reads one socket until stopped, forwarding verified, parsed messages.
async fn read<S: SocketRecv>(
    mut connection: Connection<S>,
    forward: mpsc::Sender<Incoming>,
    stop: CancellationToken,
) {
    loop {
        let received = tokio::select! {
            received = connection.socket.recv() => received,
            () = stop.cancelled() => return,
        };
        let message = match received {
            Ok(multipart) => multipart,
            Err(e) => {
                // The kernel went away (its death is noticed by the process watcher) or a frame was bad.
                tracing::debug!(error = %e, "kernel socket error");
                tokio::select! {
                    () = tokio::time::sleep(ERROR_PAUSE) => continue,
                    () = stop.cancelled() => return,
                }
            }
        };
        let incoming = match RawMessage::from_multipart(message, &connection.mac)
            .map_err(|e| e.to_string())
            .and_then(|raw| parse(&raw))
        {
            Ok(incoming) => incoming,
            Err(e) => {
                tracing::warn!(error = %e, "dropping a kernel message that does not verify or parse");
                continue;
            }
        };
        tokio::select! {
            sent = forward.send(incoming) => if sent.is_err() { return },
            () = stop.cancelled() => return,
        }
    }
}

/// The parts we use of a verified message: header, parent header and content (frames 0, 1, 3).
fn parse(raw: &RawMessage) -> Result<Incoming, String> {
    let frame = |i: usize| {
        raw.jparts
            .get(i)
            .ok_or_else(|| format!("message frame {i} is missing"))
    };
    let header = from_json(frame(0)?).map_err(|e| format!("bad message header: {e}"))?;
    let msg_type = header
        .get("msg_type")
        .and_then(Value::as_str)
        .ok_or("the message header has no msg_type")?
        .to_owned();
    // An empty parent header is `{}`: no parent.
    let parent = from_json(frame(1)?).unwrap_or(Value::Null);
    let parent_id = parent
        .get("msg_id")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let content = from_json(frame(3)?).map_err(|e| format!("bad {msg_type} content: {e}"))?;
    Ok(Incoming {
        msg_type,
        parent_id,
        content,
    })
}

/// Parses a JSON frame. jupyter_client encodes with `surrogateescape`, so a cell that prints undecodable
/// bytes (`b'\xff'.decode(errors='surrogateescape')`) sends a frame that is not UTF-8; its bad bytes become
/// U+FFFD rather than costing the whole message.
fn from_json(frame: &[u8]) -> serde_json::Result<Value> {
    match std::str::from_utf8(frame) {
        Ok(text) => serde_json::from_str(text),
        Err(_) => serde_json::from_str(&String::from_utf8_lossy(frame)),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use bytes::Bytes;

    fn raw(header: &str, parent: &str, content: &str) -> RawMessage {
        RawMessage {
            zmq_identities: Vec::new(),
            jparts: vec![
                Bytes::from(header.to_owned()),
                Bytes::from(parent.to_owned()),
                Bytes::from_static(b"{}"),
                Bytes::from(content.to_owned()),
            ],
        }
    }

    #[test]
    fn parses_what_typed_parsing_rejects() {
        // ipykernel 6's interrupt_reply: `{}`, which jupyter-protocol 2.0.3 cannot parse.
        let incoming = parse(&raw(
            r#"{"msg_type":"interrupt_reply","msg_id":"r"}"#,
            r#"{"msg_id":"req-1","msg_type":"interrupt_request"}"#,
            "{}",
        ))
        .unwrap();
        assert_eq!(incoming.msg_type, "interrupt_reply");
        assert!(incoming.is_child_of("req-1"));
        let orphan = parse(&raw(
            r#"{"msg_type":"status"}"#,
            "{}",
            r#"{"execution_state":"idle"}"#,
        ))
        .unwrap();
        assert_eq!(orphan.parent_id, None);
        assert!(parse(&raw("{}", "{}", "{}")).is_err());
        // Bytes that are not UTF-8 (what surrogateescape produces) are replaced, not a reason to drop.
        let mut bad = raw(r#"{"msg_type":"stream"}"#, "{}", "");
        bad.jparts[3] = Bytes::from_static(b"{\"name\":\"stdout\",\"text\":\"\xff\xfe ok\"}");
        let incoming = parse(&bad).unwrap();
        assert_eq!(incoming.content["text"], "\u{fffd}\u{fffd} ok");
    }
}
