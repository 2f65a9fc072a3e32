//! The web terminal (MENTIS_HTTP_LISTEN): a link minted by TerminalService.CreateTerminalLink opens the page in
//! Debian's chromium (headless, driven by playwright-core from web/node_modules: web/drive-terminal.mjs), which
//! types into a real terminal of the sandbox, reads the answer from xterm.js's buffer, follows the window's
//! size (`stty size`) and takes a screenshot (target/web-terminal.png; docs/images/web-terminal.png is one).
//! The WebSocket refuses forged, expired and revoked tokens, and a page ends with its link (its expiry,
//! RevokeTerminalLinks, the revocation of the key that made it); links name a live sandbox and a terminal it
//! has; a runtime without the listener makes no links.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mentis_e2e::*;
use mentis_proto::api::{
    self, key_service_client::KeyServiceClient, terminal_service_client::TerminalServiceClient,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// A runtime serving the web terminal on a free port, and that port.
async fn start() -> Result<(Harness, u16)> {
    let port = free_port()?;
    let h = Harness::start_with(|c| {
        c.http_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
    })
    .await?;
    Ok((h, port))
}

async fn link(
    h: &Harness,
    sandbox: &str,
    ttl_seconds: u32,
) -> std::result::Result<api::CreateTerminalLinkResponse, tonic::Status> {
    link_to(h, sandbox, "", ttl_seconds).await
}

async fn link_to(
    h: &Harness,
    sandbox: &str,
    terminal: &str,
    ttl_seconds: u32,
) -> std::result::Result<api::CreateTerminalLinkResponse, tonic::Status> {
    TerminalServiceClient::new(h.channel.clone())
        .create_terminal_link(api::CreateTerminalLinkRequest {
            sandbox_id: sandbox.to_owned(),
            terminal_id: terminal.to_owned(),
            ttl_seconds,
        })
        .await
        .map(tonic::Response::into_inner)
}

/// A WebSocket handshake offering `token`: the status line and the headers of the answer.
async fn handshake(port: u16, token: &str) -> Result<String> {
    handshake_with(port, token, "").await
}

/// The same with `more` added to the query.
async fn handshake_with(port: u16, token: &str, more: &str) -> Result<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let request = format!(
        "GET /terminal/ws?cols=80&rows=24{more} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade\r\n\
         Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Protocol: mentis-terminal, token.{token}\r\n\r\n"
    );
    s.write_all(request.as_bytes()).await?;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // The head; for a refusal also its one-line body.
    let complete = |a: &[u8]| match a.windows(4).position(|w| w == b"\r\n\r\n") {
        None => false,
        Some(_) if a.starts_with(b"HTTP/1.1 101") => true,
        Some(end) => a.len() > end + 4 && a.ends_with(b"\n"),
    };
    while !complete(&answer) {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut buf))
            .await
            .context("no answer to the handshake")??;
        if n == 0 {
            break;
        }
        answer.extend_from_slice(&buf[..n]);
    }
    Ok(String::from_utf8_lossy(&answer).into_owned())
}

#[tokio::test]
async fn the_page_runs_a_terminal_in_chromium_and_follows_the_window() -> Result<()> {
    let (mut h, port) = start().await?;
    let sandbox = h.create_default().await?.sandbox_id;
    let l = link(&h, &sandbox, 0).await?;
    ensure!(l.path.starts_with("/terminal#token="), "path {}", l.path);
    ensure!(!l.path.contains("msk_"), "the API key is in the link");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let screenshot = root.join("target/web-terminal.png");
    let url = format!("http://127.0.0.1:{port}{}", l.path);
    let seen = drive_browser(
        "drive-terminal.mjs",
        &[url, screenshot.display().to_string()],
    )
    .await?;
    ensure!(seen["answer"] == "42", "{seen}");
    ensure!(
        seen["after"]["cols"].as_u64() > seen["before"]["cols"].as_u64()
            && seen["after"]["rows"].as_u64() > seen["before"]["rows"].as_u64(),
        "the terminal did not grow with the window: {seen}"
    );
    ensure!(
        std::fs::metadata(&screenshot)?.len() > 1000,
        "no screenshot"
    );
    h.stop().await
}

#[tokio::test]
async fn forged_and_expired_tokens_are_refused() -> Result<()> {
    let (mut h, port) = start().await?;
    let sandbox = h.create_default().await?.sandbox_id;
    // A good token upgrades, choosing the page's subprotocol.
    let good = link(&h, &sandbox, 60).await?.token;
    let answer = handshake(port, &good).await?;
    ensure!(answer.starts_with("HTTP/1.1 101"), "{answer}");
    ensure!(
        answer
            .to_ascii_lowercase()
            .contains("sec-websocket-protocol: mentis-terminal"),
        "{answer}"
    );
    // The same payload with another signature, a token of nothing, none at all.
    let (payload, _) = good.split_once('.').context("token without a dot")?;
    for forged in [
        format!("{payload}.AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"),
        "bm90aGluZw.bm90aGluZw".to_owned(),
    ] {
        let answer = handshake(port, &forged).await?;
        ensure!(answer.starts_with("HTTP/1.1 401"), "{answer}");
    }
    let short = link(&h, &sandbox, 1).await?.token;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let answer = handshake(port, &short).await?;
    ensure!(
        answer.starts_with("HTTP/1.1 401") && answer.contains("expired"),
        "{answer}"
    );
    // A link to one terminal opens no other.
    let (_, terminal) = open_page(port, &good, "").await?;
    let one = link_to(&h, &sandbox, &terminal, 60).await?.token;
    let answer = handshake_with(port, &one, "&terminal=term-111111111111").await?;
    ensure!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    // A key of another space makes no link for the sandbox.
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "web-other".into(),
                ..Default::default()
            }),
        })
        .await?;
    let other = KeyServiceClient::new(h.channel.clone())
        .create_api_key(api::CreateApiKeyRequest {
            name: "another space".into(),
            space_ids: vec!["web-other".into()],
        })
        .await?
        .into_inner()
        .secret;
    let r = TerminalServiceClient::new(h.with_key(Some(&other)))
        .create_terminal_link(api::CreateTerminalLinkRequest {
            sandbox_id: sandbox.clone(),
            ..Default::default()
        })
        .await;
    ensure!(
        refusal(r).1 == "SPACE_NOT_ALLOWED",
        "a key of another space made a link"
    );
    // Links are bounded in time, and name a sandbox that exists.
    ensure!(code(link(&h, &sandbox, 12 * 3600 + 1).await) == tonic::Code::InvalidArgument);
    ensure!(code(link(&h, &uuid::Uuid::new_v4().to_string(), 0).await) == tonic::Code::NotFound);
    h.stop().await
}

#[tokio::test]
async fn a_runtime_without_the_listener_makes_no_links() -> Result<()> {
    let h = Harness::start().await?;
    let r = link(&h, &uuid::Uuid::new_v4().to_string(), 0).await;
    ensure!(code(r) == tonic::Code::FailedPrecondition);
    h.stop().await
}

/// Issue 40, finding 9: MCP answered a body that is not JSON with 415. It is JSON-RPC's parse error
/// (-32700, id null) with 400; a well-formed request still initializes.
#[tokio::test]
async fn mcp_answers_a_body_that_is_not_json_with_a_json_rpc_parse_error() -> Result<()> {
    let (h, port) = start().await?;
    let key = KeyServiceClient::new(h.channel.clone())
        .create_api_key(api::CreateApiKeyRequest {
            name: "mcp".into(),
            space_ids: vec!["default".into()],
        })
        .await?
        .into_inner()
        .secret;
    let post = |body: &'static str| {
        let key = key.clone();
        async move {
            let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
            let request = format!(
                "POST /mcp HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {key}\r\n\
                 Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(request.as_bytes()).await?;
            let mut response = String::new();
            s.read_to_string(&mut response).await?;
            Ok::<_, anyhow::Error>(response)
        }
    };
    let response = post("{not json").await?;
    ensure!(response.starts_with("HTTP/1.1 400"), "{response}");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b)
        .unwrap_or("");
    let error: serde_json::Value = serde_json::from_str(body).context(response.clone())?;
    ensure!(error["error"]["code"] == -32700, "{error}");
    ensure!(error["id"].is_null(), "{error}");
    let response = post(
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-03-26","capabilities":{},"clientInfo":{"name":"e2e","version":"1"}}}"#,
    )
    .await?;
    ensure!(response.starts_with("HTTP/1.1 200"), "{response}");
    ensure!(response.contains("\"serverInfo\""), "{response}");
    h.stop().await
}

/// The page's WebSocket opened with `token` (and `more` in the query), once its terminal has started: the
/// socket and the terminal's id.
async fn open_page(port: u16, token: &str, more: &str) -> Result<(ws::Ws, String)> {
    let mut sock = ws::connect(
        port,
        &format!("/terminal/ws?cols=80&rows=24{more}"),
        &format!("Sec-WebSocket-Protocol: mentis-terminal, token.{token}\r\n"),
    )
    .await?;
    loop {
        let m = sock.next_message(Duration::from_secs(60)).await?;
        if m.opcode != ws::TEXT {
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(&m.text())?;
        ensure!(v["type"] == "started", "{v}");
        let id = v["terminal_id"].as_str().context("no terminal id")?;
        return Ok((sock, id.to_owned()));
    }
}

/// Waits for the server to close `sock` (at most `wait`): how long it took, and the `error` message sent
/// before the close, if any.
async fn closed(sock: &mut ws::Ws, wait: Duration) -> Result<(Duration, serde_json::Value)> {
    let (took, before) = sock.closed_within(wait).await?;
    let error = before
        .iter()
        .filter(|f| f.opcode == ws::TEXT)
        .filter_map(|f| serde_json::from_str::<serde_json::Value>(&f.text()).ok())
        .find(|v| v["type"] == "error")
        .unwrap_or_default();
    Ok((took, error))
}

async fn revoke_links(h: &Harness, sandbox: &str) -> std::result::Result<(), tonic::Status> {
    TerminalServiceClient::new(h.channel.clone())
        .revoke_terminal_links(api::RevokeTerminalLinksRequest {
            sandbox_id: sandbox.to_owned(),
        })
        .await
        .map(|_| ())
}

/// Revocation closes what is open (issue 40): a page's socket ends within a second of revoking the key that
/// made its link, of RevokeTerminalLinks, and at its link's expiry; a link whose key or sandbox's links were
/// revoked no longer opens, and links made afterwards do. The terminals themselves keep running.
#[tokio::test]
async fn an_open_page_ends_with_its_link_and_the_key_that_made_it() -> Result<()> {
    let (mut h, port) = start().await?;
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "web-keys".into(),
                ..Default::default()
            }),
        })
        .await?;
    let keys = KeyServiceClient::new(h.channel.clone());
    let key = keys
        .clone()
        .create_api_key(api::CreateApiKeyRequest {
            name: "links".into(),
            space_ids: vec!["web-keys".into()],
        })
        .await?
        .into_inner();
    let sandbox = h
        .create(api::SandboxSpec {
            space_id: "web-keys".into(),
            ..Default::default()
        })
        .await?
        .sandbox_id;
    let as_key = TerminalServiceClient::new(h.with_key(Some(&key.secret)));
    let by_key = |ttl_seconds| {
        let mut client = as_key.clone();
        let sandbox_id = sandbox.clone();
        async move {
            client
                .create_terminal_link(api::CreateTerminalLinkRequest {
                    sandbox_id,
                    terminal_id: String::new(),
                    ttl_seconds,
                })
                .await
        }
    };

    // The key's link opens a page; revoking the key closes it and its other link no longer opens.
    let opened = by_key(600).await?.into_inner().token;
    let unopened = by_key(600).await?.into_inner().token;
    let (mut page, terminal) = open_page(port, &opened, "").await?;
    let admin_page = link(&h, &sandbox, 600).await?.token;
    let (mut kept, _) = open_page(port, &admin_page, "").await?;
    keys.clone()
        .revoke_api_key(api::RevokeApiKeyRequest {
            key_id: key.api_key.context("no key")?.key_id,
        })
        .await?;
    let (took, error) = closed(&mut page, Duration::from_secs(1)).await?;
    ensure!(took < Duration::from_secs(1), "closed after {took:?}");
    ensure!(error["reason"] == "API_KEY_REVOKED", "{error}");
    for token in [&opened, &unopened] {
        let answer = handshake(port, token).await?;
        ensure!(
            answer.starts_with("HTTP/1.1 401") && answer.contains("revoked"),
            "{answer}"
        );
    }
    // The admin's page was not touched, and the terminal the key's page started runs on.
    kept.send(ws::BINARY, b"echo kept-$((6*7))\r").await?;
    let mut seen = String::new();
    while !seen.contains("kept-42") {
        seen.push_str(&kept.next_message(Duration::from_secs(10)).await?.text());
    }
    let listed = TerminalServiceClient::new(h.channel.clone())
        .list_terminals(api::ListTerminalsRequest {
            sandbox_id: sandbox.clone(),
        })
        .await?
        .into_inner();
    ensure!(
        listed.terminals.iter().any(|t| t.terminal_id == terminal),
        "{listed:?}"
    );

    // RevokeTerminalLinks closes every page of the sandbox's links; links made afterwards open.
    let unopened = link(&h, &sandbox, 600).await?.token;
    revoke_links(&h, &sandbox).await?;
    let (took, error) = closed(&mut kept, Duration::from_secs(1)).await?;
    ensure!(took < Duration::from_secs(1), "closed after {took:?}");
    ensure!(error["code"] == "Unauthenticated", "{error}");
    for token in [&admin_page, &unopened] {
        let answer = handshake(port, token).await?;
        ensure!(
            answer.starts_with("HTTP/1.1 401") && answer.contains("revoked"),
            "{answer}"
        );
    }
    let fresh = link(&h, &sandbox, 600).await?.token;
    let (mut fresh_page, _) = open_page(port, &fresh, &format!("&terminal={terminal}")).await?;

    // A link's page ends at its expiry (Unix seconds: between 1 and 2 s from now); another link's stays.
    let short = link(&h, &sandbox, 2).await?;
    let expires = std::time::UNIX_EPOCH
        + Duration::from_secs(u64::try_from(
            short.expires_at.context("no expiry")?.seconds,
        )?);
    let (mut page, _) = open_page(port, &short.token, "").await?;
    let (_, error) = closed(&mut page, Duration::from_secs(5)).await?;
    let late = std::time::SystemTime::now()
        .duration_since(expires)
        .unwrap_or_default();
    ensure!(
        late < Duration::from_secs(1),
        "closed {late:?} after the expiry"
    );
    ensure!(
        error["message"]
            .as_str()
            .is_some_and(|m| m.contains("expired")),
        "{error}"
    );
    fresh_page
        .send(ws::BINARY, b"echo fresh-$((6*7))\r")
        .await?;
    let mut seen = String::new();
    while !seen.contains("fresh-42") {
        seen.push_str(
            &fresh_page
                .next_message(Duration::from_secs(10))
                .await?
                .text(),
        );
    }
    h.stop().await
}

/// CreateTerminalLink refuses what the page could not open (issue 40): a terminal the sandbox does not have
/// (NOT_FOUND) and a sandbox that has ended (FAILED_PRECONDITION); RevokeTerminalLinks needs a sandbox that
/// exists.
#[tokio::test]
async fn links_need_a_live_sandbox_and_a_terminal_it_has() -> Result<()> {
    let (mut h, port) = start().await?;
    let sandbox = h.create_default().await?.sandbox_id;
    let (code, reason, _) = refusal(link_to(&h, &sandbox, "term-000000000000", 60).await);
    ensure!(
        code == tonic::Code::NotFound && reason == "TERMINAL_NOT_FOUND",
        "{code:?} {reason}"
    );
    // A terminal it has: the link opens it.
    let (_, terminal) = open_page(port, &link(&h, &sandbox, 60).await?.token, "").await?;
    let to_it = link_to(&h, &sandbox, &terminal, 60).await?.token;
    let (_, again) = open_page(port, &to_it, "").await?;
    ensure!(again == terminal, "{again} {terminal}");

    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: sandbox.clone(),
        })
        .await?;
    ensure!(h.get(&sandbox).await?.state == api::SandboxState::Terminated as i32);
    for terminal in ["", terminal.as_str()] {
        let (code, reason, _) = refusal(link_to(&h, &sandbox, terminal, 60).await);
        ensure!(
            code == tonic::Code::FailedPrecondition && reason == "SANDBOX_ENDED",
            "{terminal:?}: {code:?} {reason}"
        );
    }
    let unknown = uuid::Uuid::new_v4().to_string();
    let (code, reason, _) = refusal(revoke_links(&h, &unknown).await);
    ensure!(
        code == tonic::Code::NotFound && reason == "SANDBOX_NOT_FOUND",
        "{code:?} {reason}"
    );
    h.stop().await
}
