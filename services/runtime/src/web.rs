//! The web terminal (`MENTIS_HTTP_LISTEN`; docs/ARCHITECTURE.md, "Web terminal"): a page with xterm.js
//! (embedded at build time from web/node_modules, nothing fetched at run time) and a WebSocket bridged
//! in-process to TerminalService's streams. The API key never reaches the browser: the page's URL carries a
//! link's short-lived token in its fragment (`/terminal#token=...`, made by CreateTerminalLink), and the
//! page hands it over as a WebSocket subprotocol (`token.<token>`), so it appears in no URL a server logs.
//!
//! On the socket: binary frames are the terminal's bytes both ways; text frames are JSON control messages:
//! from the page `{"type":"resize","cols":C,"rows":R}` and `{"type":"signal","name":"INT"}`; to the page
//! `{"type":"started",...}`, `{"type":"exited","exit_code":N,"signal":S}` and `{"type":"error",...}`, each
//! of the last two followed by the close. One terminal per socket.

use std::sync::Arc;

use axum::Router;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::StreamExt as _;
use mentis_core::Reason;
use mentis_proto::api::{self, open_request, open_response};
use serde_json::json;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::Status;

use crate::api::TerminalApi;
use crate::auth::link::{Link, LinkError, Links};
use crate::auth::{Caller, Keyring};
use crate::server::door::{Guarded, serve_http};

/// The WebSocket subprotocol the page speaks (the server picks it among those the page offers).
pub const SUBPROTOCOL: &str = "mentis-terminal";
/// The page offers its token as the subprotocol `token.<token>`.
pub const TOKEN_PREFIX: &str = "token.";
/// The largest WebSocket message or frame taken from the page (typed or pasted input, control messages).
const MAX_MESSAGE: usize = 64 * 1024;
/// Page messages waiting for the terminal.
const INBOUND: usize = 16;

const PAGE: &str = include_str!("web/terminal.html");
const SCRIPT: &str = include_str!("web/terminal.js");
const XTERM_JS: &[u8] = include_bytes!("../../../web/node_modules/@xterm/xterm/lib/xterm.js");
const XTERM_CSS: &[u8] = include_bytes!("../../../web/node_modules/@xterm/xterm/css/xterm.css");
const FIT_JS: &[u8] = include_bytes!("../../../web/node_modules/@xterm/addon-fit/lib/addon-fit.js");

/// The page's policy: its own scripts only, connections only back to this server.
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self' data:; font-src 'self' data:; base-uri 'none'; \
                   frame-ancestors 'none'; form-action 'none'";

#[derive(Clone)]
struct Web {
    terminals: TerminalApi,
    links: Links,
}

/// The MCP tools over streamable HTTP (`mentis-mcp`), and the keys its requests must present.
pub struct Mcp {
    pub service: mentis_mcp::HttpService,
    pub keyring: Arc<Keyring>,
    /// The largest request body taken (`MENTIS_MAX_MESSAGE_BYTES`).
    pub max_body: usize,
}

/// Serves the web terminal and MCP on `listener` until `shutdown`.
pub fn serve(
    listener: Guarded,
    terminals: TerminalApi,
    links: Links,
    mcp: Mcp,
    previews: Arc<crate::proxy::Proxy>,
    shutdown: CancellationToken,
    tasks: &TaskTracker,
) {
    if let Ok(at) = listener.local_addr() {
        tracing::info!(%at, "web terminal served at /terminal, MCP at /mcp, preview URLs at /preview/ (plaintext HTTP)");
    }
    // Preview requests (by path or by host) go to the preview proxy before any route is looked at.
    let app = router(Web { terminals, links })
        .nest_service(
            "/mcp",
            tower::ServiceBuilder::new()
                .layer(axum::middleware::from_fn_with_state(mcp.keyring, mcp_key))
                .layer(axum::middleware::from_fn_with_state(mcp.max_body, mcp_json))
                .service(mcp.service),
        )
        .layer(axum::middleware::from_fn_with_state(
            previews,
            crate::proxy::middleware,
        ));
    // An open WebSocket or MCP stream may outlast the shutdown: after a grace the listener stops regardless.
    serve_http(
        listener,
        app,
        "http",
        std::time::Duration::from_secs(10),
        shutdown,
        tasks,
    );
}

fn router(web: Web) -> Router {
    Router::new()
        .route("/terminal", get(page))
        .route("/terminal/ws", get(socket))
        .route(
            "/terminal/terminal.js",
            get(|| asset("text/javascript", SCRIPT.as_bytes())),
        )
        .route(
            "/terminal/xterm.js",
            get(|| asset("text/javascript", XTERM_JS)),
        )
        .route("/terminal/xterm.css", get(|| asset("text/css", XTERM_CSS)))
        .route(
            "/terminal/addon-fit.js",
            get(|| asset("text/javascript", FIT_JS)),
        )
        .with_state(web)
}

/// Every MCP request needs a key, as every API call does (refused here with 401 and a `WWW-Authenticate`
/// challenge, as HTTP clients expect); the tools then call the API with the same `authorization`, so a
/// key limited to a space reaches only that space's sandboxes.
async fn mcp_key(
    State(keyring): State<Arc<Keyring>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .map(HeaderValue::as_bytes);
    match keyring.authenticate(header) {
        Ok(_) => next.run(request).await,
        Err(e) => (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Bearer")],
            format!("{e}\n"),
        )
            .into_response(),
    }
}

/// A POST whose body is not JSON gets JSON-RPC's parse error (-32700, id null) with 400, as JSON-RPC and
/// MCP's streamable HTTP transport ask, instead of the transport's 415; a body above `max` is 413.
async fn mcp_json(
    State(max): State<usize>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if request.method() != axum::http::Method::POST {
        return next.run(request).await;
    }
    let (parts, body) = request.into_parts();
    let bytes = match axum::body::to_bytes(body, max).await {
        Ok(b) => b,
        Err(_) => {
            return (
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("an MCP request has at most {max} bytes (MENTIS_MAX_MESSAGE_BYTES)\n"),
            )
                .into_response();
        }
    };
    if let Err(e) = serde_json::from_slice::<serde_json::Value>(&bytes) {
        let error = json!({
            "jsonrpc": "2.0",
            "id": null,
            "error": {"code": -32700, "message": format!("Parse error: {e}")},
        });
        return (
            StatusCode::BAD_REQUEST,
            [(header::CONTENT_TYPE, "application/json")],
            error.to_string(),
        )
            .into_response();
    }
    next.run(axum::extract::Request::from_parts(
        parts,
        axum::body::Body::from(bytes),
    ))
    .await
}

fn secured(mut r: Response) -> Response {
    let h = r.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    r
}

async fn page() -> Response {
    secured(
        (
            [
                (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                (header::CACHE_CONTROL, "no-store"),
            ],
            PAGE,
        )
            .into_response(),
    )
}

async fn asset(content_type: &'static str, body: &'static [u8]) -> Response {
    secured(([(header::CONTENT_TYPE, content_type)], body).into_response())
}

/// The token among the subprotocols the page offers.
fn offered_token(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .find_map(|p| p.strip_prefix(TOKEN_PREFIX))
}

/// What the page's query says: its size (`cols`, `rows`, each at most 1000; 0 = the terminal's default) and,
/// after a reload, the terminal it had (`terminal`), to attach to again.
#[derive(Debug, Default, PartialEq)]
struct PageQuery {
    cols: u32,
    rows: u32,
    terminal: Option<String>,
}

impl PageQuery {
    fn parse(query: Option<&str>) -> Self {
        let mut q = Self::default();
        for pair in query.unwrap_or("").split('&') {
            let Some((k, v)) = pair.split_once('=') else {
                continue;
            };
            let number = || v.parse::<u32>().unwrap_or(0).min(1000);
            match k {
                "cols" => q.cols = number(),
                "rows" => q.rows = number(),
                // Terminal ids are [a-z0-9-]: nothing to decode; anything else is refused by the attach.
                "terminal" if !v.is_empty() => q.terminal = Some(v.to_owned()),
                _ => {}
            }
        }
        q
    }
}

fn refused(status: StatusCode, why: &str) -> Response {
    secured(
        (
            status,
            [(header::CACHE_CONTROL, "no-store")],
            format!("{why}\n"),
        )
            .into_response(),
    )
}

async fn socket(
    State(web): State<Web>,
    headers: HeaderMap,
    RawQuery(query): RawQuery,
    upgrade: WebSocketUpgrade,
) -> Response {
    let Some(token) = offered_token(&headers) else {
        return refused(
            StatusCode::UNAUTHORIZED,
            "no link token: open the page from a link (TerminalService.CreateTerminalLink)",
        );
    };
    let mut link = match web.links.open(token) {
        Ok(link) => link,
        Err(e) => {
            tracing::info!(error = %e, "web terminal: a link was refused");
            return refused(StatusCode::UNAUTHORIZED, &e.to_string());
        }
    };
    let mut page = PageQuery::parse(query.as_deref());
    // A link to one terminal opens only that one; a link to the sandbox any of its terminals.
    match (&link.terminal_id, page.terminal.take()) {
        (Some(linked), Some(asked)) if *linked != asked => {
            return refused(
                StatusCode::FORBIDDEN,
                "this link opens another terminal of the sandbox",
            );
        }
        (None, asked @ Some(_)) => link.terminal_id = asked,
        _ => {}
    }
    let (cols, rows) = (page.cols, page.rows);
    upgrade
        .protocols([SUBPROTOCOL])
        .max_message_size(MAX_MESSAGE)
        .max_frame_size(MAX_MESSAGE)
        .on_upgrade(move |socket| bridge(socket, web, link, cols, rows))
}

/// A control message from the page, as the terminal request it stands for.
fn control(text: &str) -> Option<open_request::Kind> {
    let v: serde_json::Value = serde_json::from_str(text).ok()?;
    let number = |k: &str| {
        v.get(k)
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
    };
    match v.get("type")?.as_str()? {
        "resize" => Some(open_request::Kind::Resize(open_request::Resize {
            cols: number("cols")?,
            rows: number("rows")?,
        })),
        "signal" => Some(open_request::Kind::Signal(open_request::Signal {
            name: v.get("name")?.as_str()?.to_string(),
        })),
        _ => None,
    }
}

fn text(v: serde_json::Value) -> Message {
    Message::Text(v.to_string().into())
}

fn error_message(status: &Status) -> Message {
    let reason = crate::api::status::reason_of(status).map(|r| r.as_str());
    text(json!({
        "type": "error",
        "code": format!("{:?}", status.code()),
        "reason": reason,
        "message": status.message(),
    }))
}

/// Why a link's page is closed, as the `error` message says it: the link expired or was revoked, or the
/// key that made it was.
fn ended_status(e: LinkError) -> Status {
    let reason = match e {
        LinkError::KeyRevoked => Reason::ApiKeyRevoked,
        LinkError::Forged | LinkError::Expired | LinkError::Revoked => Reason::Unauthenticated,
    };
    crate::api::status::to_status(mentis_core::Error::new(reason, e.to_string()))
}

/// One page's terminal: the socket's messages become the stream's requests and the stream's responses the
/// socket's messages, until either side ends, or the link stops opening (its expiry, its revocation or its
/// key's: `Links::ended`), which closes the socket with an `error`. The terminal outlives the page (like a
/// gRPC client's).
async fn bridge(mut socket: WebSocket, web: Web, link: Link, cols: u32, rows: u32) {
    let Web { terminals, links } = web;
    let link_ended = links.ended(&link);
    tokio::pin!(link_ended);
    let sandbox_id = link.sandbox_id.to_string();
    let first = match link.terminal_id.clone() {
        None => open_request::Kind::Start(open_request::Start {
            sandbox_id,
            cols,
            rows,
            ..Default::default()
        }),
        Some(terminal_id) => open_request::Kind::Attach(open_request::Attach {
            sandbox_id,
            terminal_id,
            after_seq: 0,
        }),
    };
    let (to_terminal, requests) = mpsc::channel::<Result<api::OpenRequest, Status>>(INBOUND);
    let _ = to_terminal.try_send(Ok(api::OpenRequest { kind: Some(first) }));
    let requests = Box::pin(futures::stream::unfold(requests, |mut rx| async move {
        rx.recv().await.map(|r| (r, rx))
    }));
    // The link was made by a caller allowed the sandbox, and opens only that sandbox.
    let mut responses = std::pin::pin!(terminals.bridge(requests, Caller::Admin));
    loop {
        tokio::select! {
            e = &mut link_ended => {
                tracing::info!(sandbox_id = %link.sandbox_id, error = %e, "web terminal: a page's link ended");
                let _ = socket.send(error_message(&ended_status(e))).await;
                let _ = socket.send(Message::Close(None)).await;
                return;
            }
            m = socket.recv() => {
                let request = match m {
                    Some(Ok(Message::Binary(data))) => {
                        open_request::Kind::Input(open_request::Input { data })
                    }
                    Some(Ok(Message::Text(t))) => match control(t.as_str()) {
                        Some(kind) => kind,
                        None => {
                            let status = Status::invalid_argument(
                                "a text message must be {\"type\":\"resize\",\"cols\":C,\"rows\":R} \
                                 or {\"type\":\"signal\",\"name\":\"INT\"}",
                            );
                            let _ = socket.send(error_message(&status)).await;
                            continue;
                        }
                    },
                    Some(Ok(Message::Ping(_) | Message::Pong(_))) => continue,
                    Some(Ok(Message::Close(_)) | Err(_)) | None => return,
                };
                if to_terminal.send(Ok(api::OpenRequest { kind: Some(request) })).await.is_err() {
                    return;
                }
            }
            r = responses.next() => {
                let message = match r {
                    Some(Ok(api::OpenResponse { kind: Some(kind) })) => match kind {
                        open_response::Kind::Started(s) => text(json!({
                            "type": "started",
                            "terminal_id": s.terminal_id,
                            "cols": s.cols,
                            "rows": s.rows,
                        })),
                        open_response::Kind::Output(o) => Message::Binary(o.data),
                        open_response::Kind::Exited(e) => {
                            let _ = socket
                                .send(text(json!({
                                    "type": "exited",
                                    "exit_code": e.exit_code,
                                    "signal": e.signal,
                                })))
                                .await;
                            let _ = socket.send(Message::Close(None)).await;
                            return;
                        }
                        // Proxies between the page and here see traffic.
                        open_response::Kind::Keepalive(_) => Message::Ping(Default::default()),
                    },
                    Some(Ok(_)) => continue,
                    Some(Err(status)) => {
                        let _ = socket.send(error_message(&status)).await;
                        let _ = socket.send(Message::Close(None)).await;
                        return;
                    }
                    None => {
                        let _ = socket.send(Message::Close(None)).await;
                        return;
                    }
                };
                if socket.send(message).await.is_err() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_is_found_among_the_subprotocols() {
        let mut h = HeaderMap::new();
        h.insert(
            header::SEC_WEBSOCKET_PROTOCOL,
            HeaderValue::from_static("mentis-terminal, token.abc.def"),
        );
        assert_eq!(offered_token(&h), Some("abc.def"));
        assert_eq!(offered_token(&HeaderMap::new()), None);
    }

    #[test]
    fn sizes_and_controls_are_read_within_bounds() {
        assert_eq!(
            PageQuery::parse(Some("cols=120&rows=40&terminal=term-0123")),
            PageQuery {
                cols: 120,
                rows: 40,
                terminal: Some("term-0123".into())
            }
        );
        assert_eq!(
            PageQuery::parse(Some("cols=99999&rows=x&terminal=")),
            PageQuery {
                cols: 1000,
                ..Default::default()
            }
        );
        assert_eq!(PageQuery::parse(None), PageQuery::default());
        assert!(matches!(
            control(r#"{"type":"resize","cols":100,"rows":30}"#),
            Some(open_request::Kind::Resize(open_request::Resize {
                cols: 100,
                rows: 30
            }))
        ));
        assert!(matches!(
            control(r#"{"type":"signal","name":"INT"}"#),
            Some(open_request::Kind::Signal(_))
        ));
        assert!(control(r#"{"type":"resize","cols":-1,"rows":30}"#).is_none());
        assert!(control("not json").is_none());
    }
}
