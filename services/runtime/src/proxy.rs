//! The preview proxy on the HTTP listener: finds the sandbox and port a request is for (its path
//! `/preview/<sandbox>/<port>/...` or its host `<port>-<sandbox>.<domain>`), checks its token (query
//! parameter, header or cookie), wakes the sandbox when it is PAUSED with auto_resume, and passes the request
//! to that port over a fresh HTTP/1.1 connection on the executor network; a WebSocket (any upgrade) is then
//! tunnelled both ways until either side closes, counting as activity all the while. What a token opened
//! (the connection to the app, a tunnel) ends when its URL is revoked or expires (`Previews::ended`).
//!
//! A token that came in the query is turned into an HttpOnly cookie scoped to the app (its path prefix, or
//! its host), so the app's own links and requests carry it; the token never reaches the app (the parameter,
//! the header and the cookie are taken out of what is passed on).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use hyper_util::rt::TokioIo;
use mentis_core::SandboxId;
use mentis_core::error::Code;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument as _;

use crate::preview::token::TicketError;
use crate::preview::{Previews, Refusal, TOKEN_HEADER, TOKEN_PARAM};
use crate::sandboxes::Manager;

/// How long connecting to the sandbox's port may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How often an open tunnel counts as activity.
const TUNNEL_ACTIVITY: Duration = Duration::from_secs(30);
/// The path prefix of path-based previews.
const PREFIX: &str = "/preview/";

/// What the proxy needs: the tokens' rules and the sandboxes.
pub struct Proxy {
    previews: Arc<Previews>,
    manager: Arc<Manager>,
    /// Owns each connection to an app and each tunnel, all ended at shutdown.
    tasks: TaskTracker,
    shutdown: CancellationToken,
}

impl Proxy {
    pub fn new(
        previews: Arc<Previews>,
        manager: Arc<Manager>,
        tasks: TaskTracker,
        shutdown: CancellationToken,
    ) -> Self {
        Self {
            previews,
            manager,
            tasks,
            shutdown,
        }
    }
}

/// The app a request is for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Target {
    sandbox: SandboxId,
    port: u16,
    /// `/preview/<sandbox>/<port>` for path-based previews, empty for host-based ones.
    prefix: String,
    /// The path to ask the app for (from `/`).
    path: String,
}

#[derive(Debug, PartialEq, Eq)]
enum Route {
    /// Not a preview: the listener's other routes.
    Elsewhere,
    /// `/preview/<sandbox>/<port>` without its slash: there, with it.
    AddSlash(String),
    NotFound,
    To(Target),
}

/// The tower middleware that sends preview requests to the proxy and every other request on.
pub async fn middleware(State(proxy): State<Arc<Proxy>>, req: Request, next: Next) -> Response {
    match route(proxy.previews.domain(), &req) {
        Route::Elsewhere => next.run(req).await,
        Route::AddSlash(location) => (
            StatusCode::PERMANENT_REDIRECT,
            [(header::LOCATION, location)],
        )
            .into_response(),
        Route::NotFound => plain(StatusCode::NOT_FOUND, "no such preview"),
        Route::To(target) => proxy.serve(target, req).await,
    }
}

fn route(domain: Option<&str>, req: &Request) -> Route {
    if let Some(domain) = domain
        && let Some(host) = request_host(req)
        && let Some(label) = host.strip_suffix(domain).and_then(|h| h.strip_suffix('.'))
    {
        let parsed = label.split_once('-').and_then(|(port, sandbox)| {
            Some((port.parse::<u16>().ok()?, SandboxId::parse(sandbox).ok()?))
        });
        return match parsed {
            Some((port, sandbox)) if port != 0 => Route::To(Target {
                sandbox,
                port,
                prefix: String::new(),
                path: req.uri().path().to_owned(),
            }),
            _ => Route::NotFound,
        };
    }
    let Some(tail) = req.uri().path().strip_prefix(PREFIX) else {
        return Route::Elsewhere;
    };
    let mut parts = tail.splitn(3, '/');
    let (Some(sandbox), Some(port)) = (parts.next(), parts.next()) else {
        return Route::NotFound;
    };
    let (Ok(sandbox), Ok(port)) = (SandboxId::parse(sandbox), port.parse::<u16>()) else {
        return Route::NotFound;
    };
    if port == 0 {
        return Route::NotFound;
    }
    let prefix = format!("/preview/{sandbox}/{port}");
    match parts.next() {
        None => Route::AddSlash(match req.uri().query() {
            Some(q) => format!("{prefix}/?{q}"),
            None => format!("{prefix}/"),
        }),
        Some(rest) => Route::To(Target {
            sandbox,
            port,
            prefix,
            path: format!("/{rest}"),
        }),
    }
}

/// The host the request names, lowercase, without its port.
fn request_host(req: &Request) -> Option<String> {
    let host = match req.headers().get(header::HOST) {
        Some(h) => h
            .to_str()
            .ok()?
            .parse::<http::uri::Authority>()
            .ok()?
            .host()
            .to_owned(),
        None => req.uri().host()?.to_owned(),
    };
    Some(host.trim_end_matches('.').to_ascii_lowercase())
}

/// The request's query without the token parameter, and the token when it was there.
fn split_query(query: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(query) = query else {
        return (None, None);
    };
    let mut token = None;
    let kept: Vec<&str> = query
        .split('&')
        .filter(|pair| match pair.strip_prefix(TOKEN_PARAM) {
            Some(v) if v.starts_with('=') => {
                token = Some(v[1..].to_owned());
                false
            }
            _ => true,
        })
        .collect();
    let kept = kept.join("&");
    ((!kept.is_empty()).then_some(kept), token)
}

/// The token cookie's value, and the `Cookie` header without it (None when nothing else is left).
fn split_cookies(headers: &HeaderMap) -> (Option<String>, Option<String>) {
    let mut token = None;
    let mut kept = Vec::new();
    for value in headers.get_all(header::COOKIE) {
        let Ok(value) = value.to_str() else { continue };
        for c in value.split(';').map(str::trim).filter(|c| !c.is_empty()) {
            match c.split_once('=') {
                Some((name, v)) if name == TOKEN_PARAM => token = Some(v.to_owned()),
                _ => kept.push(c),
            }
        }
    }
    let kept = kept.join("; ");
    (token, (!kept.is_empty()).then_some(kept))
}

/// Headers that belong to one hop, never passed on (RFC 9110, 7.6.1), and those `Connection` names.
fn strip_hop_by_hop(headers: &mut HeaderMap, keep_upgrade: bool) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::try_from(n.trim()).ok())
        .collect();
    for name in named {
        if !(keep_upgrade && name == header::UPGRADE) {
            headers.remove(name);
        }
    }
    for name in [
        "keep-alive",
        "proxy-connection",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
    ] {
        headers.remove(name);
    }
    if keep_upgrade {
        headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    } else {
        headers.remove(header::CONNECTION);
        headers.remove(header::UPGRADE);
    }
}

fn wants_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

fn plain(status: StatusCode, text: &str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::CACHE_CONTROL, "no-store"),
        ],
        format!("{text}\n"),
    )
        .into_response()
}

fn refusal_status(r: Refusal) -> StatusCode {
    match r {
        Refusal::Missing | Refusal::Revoked | Refusal::Ticket(TicketError::Expired) => {
            StatusCode::UNAUTHORIZED
        }
        Refusal::Ticket(TicketError::Forged) | Refusal::Elsewhere => StatusCode::FORBIDDEN,
    }
}

impl Proxy {
    async fn serve(&self, target: Target, mut req: Request) -> Response {
        let (query, query_token) = split_query(req.uri().query());
        let (cookie_token, other_cookies) = split_cookies(req.headers());
        let header_token = req
            .headers()
            .get(TOKEN_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned);
        let token = header_token
            .clone()
            .or_else(|| query_token.clone())
            .or(cookie_token);
        let ticket = match self
            .previews
            .check(token.as_deref(), target.sandbox, target.port)
        {
            Ok(t) => t,
            Err(r) => return plain(refusal_status(r), &r.to_string()),
        };
        // Wakes a PAUSED sandbox with auto_resume, and counts as activity.
        let address = match self.manager.app_address(target.sandbox, target.port).await {
            Ok(a) => a,
            Err(e) => {
                let status = match e.code() {
                    Code::NotFound => StatusCode::NOT_FOUND,
                    Code::PermissionDenied => StatusCode::FORBIDDEN,
                    Code::FailedPrecondition | Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                    _ => StatusCode::BAD_GATEWAY,
                };
                return plain(status, &e.to_string());
            }
        };

        let upgrade = wants_upgrade(req.headers());
        let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
        let original_host = req.headers().get(header::HOST).cloned();
        let (mut parts, body) = req.into_parts();
        let path_and_query = match &query {
            Some(q) => format!("{}?{q}", target.path),
            None => target.path.clone(),
        };
        parts.uri = match path_and_query.parse::<Uri>() {
            Ok(u) => u,
            Err(_) => {
                return plain(
                    StatusCode::BAD_REQUEST,
                    "a path the app cannot be asked for",
                );
            }
        };
        parts.version = http::Version::HTTP_11;
        let headers = &mut parts.headers;
        strip_hop_by_hop(headers, upgrade);
        headers.remove(TOKEN_HEADER);
        headers.remove(header::COOKIE);
        if let Some(c) = other_cookies.and_then(|c| HeaderValue::try_from(c).ok()) {
            headers.insert(header::COOKIE, c);
        }
        if let Some(host) = &original_host {
            headers.insert("x-forwarded-host", host.clone());
        } else if let Ok(h) = HeaderValue::try_from(format!("localhost:{}", target.port)) {
            headers.insert(header::HOST, h);
        }
        let proto = if self.previews.secure() {
            "https"
        } else {
            "http"
        };
        headers.insert("x-forwarded-proto", HeaderValue::from_static(proto));
        if !target.prefix.is_empty()
            && let Ok(p) = HeaderValue::try_from(target.prefix.as_str())
        {
            headers.insert("x-forwarded-prefix", p);
        }
        let upstream = Request::from_parts(parts, body);

        let refused_here = |what: &str| {
            plain(
                StatusCode::BAD_GATEWAY,
                &format!(
                    "{what} port {} of sandbox {} (a server there must listen on 0.0.0.0)",
                    target.port, target.sandbox
                ),
            )
        };
        let stream =
            match tokio::time::timeout(CONNECT_TIMEOUT, tokio::net::TcpStream::connect(address))
                .await
            {
                Ok(Ok(s)) => s,
                Ok(Err(_)) | Err(_) => return refused_here("nothing answers on"),
            };
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) =
            match hyper::client::conn::http1::handshake::<_, Body>(TokioIo::new(stream)).await {
                Ok(pair) => pair,
                Err(_) => return refused_here("no HTTP/1.1 on"),
            };
        let shutdown = self.shutdown.clone();
        // A connection ends with its token too: a response still streaming is cut off when the URL is
        // revoked or expires.
        let previews = Arc::clone(&self.previews);
        let grant = ticket.clone();
        self.tasks.spawn(
            async move {
                tokio::select! {
                    ended = connection.with_upgrades() => if let Err(e) = ended {
                        tracing::debug!(error = %e, "a preview connection ended with an error");
                    },
                    () = shutdown.cancelled() => {}
                    why = previews.ended(&grant) => {
                        tracing::debug!(reason = %why, "a preview connection ended with its token");
                    }
                }
            }
            .instrument(tracing::debug_span!("preview connection", sandbox = %target.sandbox, port = target.port)),
        );
        let mut response = match sender.send_request(upstream).await {
            Ok(r) => r,
            Err(_) => return refused_here("no answer from"),
        };
        let switched = response.status() == StatusCode::SWITCHING_PROTOCOLS;
        if switched && let Some(client_side) = client_side {
            let app_side = hyper::upgrade::on(&mut response);
            let manager = Arc::clone(&self.manager);
            let sandbox = target.sandbox;
            let shutdown = self.shutdown.clone();
            let previews = Arc::clone(&self.previews);
            let grant = ticket.clone();
            self.tasks.spawn(
                async move {
                    tokio::select! {
                        () = tunnel(client_side, app_side, manager, sandbox) => {}
                        () = shutdown.cancelled() => {}
                        // Revoking the URL or its expiry closes both sides (issue 40).
                        why = previews.ended(&grant) => {
                            tracing::info!(%sandbox, reason = %why, "a preview tunnel ended with its token");
                        }
                    }
                }
                .instrument(tracing::debug_span!("preview tunnel", %sandbox)),
            );
        }
        let (mut parts, body) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers, switched);
        if query_token.is_some() && header_token.is_none() {
            let max_age = ticket
                .expires_at
                .saturating_sub(crate::auth::link::unix(crate::clock::now()));
            let path = if target.prefix.is_empty() {
                "/".to_owned()
            } else {
                format!("{}/", target.prefix)
            };
            let secure = if self.previews.secure() {
                "; Secure"
            } else {
                ""
            };
            let cookie = format!(
                "{TOKEN_PARAM}={}; Path={path}; Max-Age={max_age}; HttpOnly; SameSite=Lax{secure}",
                query_token.as_deref().unwrap_or_default()
            );
            if let Ok(v) = HeaderValue::try_from(cookie) {
                parts.headers.append(header::SET_COOKIE, v);
            }
        }
        Response::from_parts(parts, Body::new(body))
    }
}

/// Copies both ways between the client's upgraded connection and the app's until either ends; the
/// sandbox counts as active meanwhile.
async fn tunnel(
    client: hyper::upgrade::OnUpgrade,
    app: hyper::upgrade::OnUpgrade,
    manager: Arc<Manager>,
    sandbox: SandboxId,
) {
    let (client, app) = match tokio::try_join!(client, app) {
        Ok(pair) => pair,
        Err(e) => {
            tracing::debug!(error = %e, %sandbox, "a preview upgrade did not complete");
            return;
        }
    };
    let (mut client, mut app) = (TokioIo::new(client), TokioIo::new(app));
    let copy = tokio::io::copy_bidirectional(&mut client, &mut app);
    tokio::pin!(copy);
    let mut activity = tokio::time::interval(TUNNEL_ACTIVITY);
    loop {
        tokio::select! {
            _ = &mut copy => return,
            _ = activity.tick() => manager.touch(sandbox),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn request(uri: &str, host: &str) -> Request {
        Request::builder()
            .uri(uri)
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap()
    }

    #[test]
    fn requests_are_routed_by_path_or_host() {
        let id = SandboxId::new();
        let at = |uri: &str, host: &str, domain: Option<&str>| route(domain, &request(uri, host));
        assert_eq!(
            at(&format!("/preview/{id}/8000/a/b?x=1"), "h:80", None),
            Route::To(Target {
                sandbox: id,
                port: 8000,
                prefix: format!("/preview/{id}/8000"),
                path: "/a/b".into(),
            })
        );
        assert_eq!(
            at(&format!("/preview/{id}/8000?x=1"), "h", None),
            Route::AddSlash(format!("/preview/{id}/8000/?x=1"))
        );
        for bad in [
            "/preview/".to_owned(),
            format!("/preview/{id}"),
            format!("/preview/{id}/0/"),
            format!("/preview/{id}/70000/"),
            "/preview/not-a-uuid/8000/".to_owned(),
        ] {
            assert_eq!(at(&bad, "h", None), Route::NotFound, "{bad}");
        }
        assert_eq!(at("/terminal", "h", None), Route::Elsewhere);
        let domain = Some("preview.localhost");
        assert_eq!(
            at("/x", &format!("3000-{id}.Preview.LOCALHOST:8080"), domain),
            Route::To(Target {
                sandbox: id,
                port: 3000,
                prefix: String::new(),
                path: "/x".into(),
            })
        );
        assert_eq!(at("/x", "junk.preview.localhost", domain), Route::NotFound);
        // The listener's own host still serves its routes, and path-based previews too.
        assert_eq!(at("/terminal", "127.0.0.1:8080", domain), Route::Elsewhere);
        assert!(matches!(
            at(&format!("/preview/{id}/1/"), "127.0.0.1", domain),
            Route::To(_)
        ));
    }

    #[test]
    fn the_token_is_taken_out_of_the_query_and_the_cookies() {
        assert_eq!(
            split_query(Some("a=1&mentis_preview_token=T.M&b=2")),
            (Some("a=1&b=2".into()), Some("T.M".into()))
        );
        assert_eq!(
            split_query(Some("mentis_preview_token=T")),
            (None, Some("T".into()))
        );
        assert_eq!(
            split_query(Some("mentis_preview_tokens=1")),
            (Some("mentis_preview_tokens=1".into()), None)
        );
        let mut h = HeaderMap::new();
        h.append(
            header::COOKIE,
            HeaderValue::from_static("a=1; mentis_preview_token=T.M"),
        );
        h.append(header::COOKIE, HeaderValue::from_static("b=2"));
        assert_eq!(
            split_cookies(&h),
            (Some("T.M".into()), Some("a=1; b=2".into()))
        );
    }

    #[test]
    fn hop_by_hop_headers_stay_behind_but_an_upgrade_goes_through() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("Upgrade, x-private"),
        );
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        assert!(wants_upgrade(&h));
        let mut upgraded = h.clone();
        strip_hop_by_hop(&mut upgraded, true);
        assert_eq!(upgraded.get(header::UPGRADE).unwrap(), "websocket");
        assert_eq!(upgraded.get(header::CONNECTION).unwrap(), "upgrade");
        assert!(!upgraded.contains_key("x-private") && !upgraded.contains_key("keep-alive"));
        strip_hop_by_hop(&mut h, false);
        assert!(h.is_empty(), "{h:?}");
    }
}
