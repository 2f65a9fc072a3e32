//! Preview URLs (SandboxService.GetPreviewUrl, the HTTP listener's preview proxy): `python3 -m http.server`
//! and a WebSocket echo server (`preview/ws_echo.py`, standard library only) inside a sandbox, reached
//! through their URLs, path-based and host-based (`<port>-<sandbox>.preview.localhost`), with curl and with
//! Debian's chromium (headless, `web/drive-preview.mjs`): the page's script loads by the cookie the first
//! visit set and talks to the echo server through the proxy. Tokens of other sandboxes and ports, forged,
//! expired and revoked ones are refused; a visit wakes a PAUSED sandbox with auto_resume; traffic counts as
//! activity; the token never reaches the app.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mentis_e2e::*;
use mentis_proto::api;
use tonic::Code;

const DOMAIN: &str = "preview.localhost";
const ECHO: &str = include_str!("preview/ws_echo.py");
const PAGE: &str = r#"<!doctype html><title>preview</title>
<p id="script">no script</p><p id="echo">no echo</p>
<script src="app.js"></script>
"#;
const SCRIPT: &str = r#"document.getElementById('script').textContent = 'script loaded';
const sock = new WebSocket(new URL(location.href).searchParams.get('ws'));
sock.onopen = () => sock.send('hello from the page');
sock.onmessage = (e) => { document.getElementById('echo').textContent = e.data; };
sock.onerror = () => { document.getElementById('echo').textContent = 'websocket error'; };
"#;

/// A runtime whose HTTP listener serves previews (host-based under [`DOMAIN`] too), and its port.
async fn start(
    tweak: impl FnOnce(&mut mentis_runtime::config::RuntimeConfig),
) -> Result<(Harness, u16)> {
    let port = free_port()?;
    let h = Harness::start_with(|c| {
        c.http_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], port)));
        c.preview_domain = Some(DOMAIN.to_owned());
        tweak(c);
    })
    .await?;
    Ok((h, port))
}

/// Starts the page's web server on 8000 and the echo server on 8765 in `sandbox`, and waits for both.
async fn serve(h: &mut Harness, sandbox: &str) -> Result<()> {
    let script = format!(
        "mkdir -p /workspace/site && cd /workspace/site && cat > index.html <<'MENTIS_EOF'\n{PAGE}MENTIS_EOF\n\
         cat > app.js <<'MENTIS_EOF'\n{SCRIPT}MENTIS_EOF\n\
         cat > /workspace/ws_echo.py <<'MENTIS_EOF'\n{ECHO}MENTIS_EOF\n\
         nohup python3 -m http.server 8000 >/tmp/http.log 2>&1 &\n\
         nohup python3 /workspace/ws_echo.py 8765 >/tmp/echo.log 2>&1 &\n\
         for port in 8000 8765; do for i in $(seq 100); do \
           python3 -c \"import socket,sys; socket.create_connection(('127.0.0.1', $port), 1)\" 2>/dev/null && break; \
           sleep 0.1; done; done; echo served"
    );
    let out = h.sh(sandbox, &script).await?;
    ensure!(stdout(&out).ends_with("served\n"), "{out:?}");
    Ok(())
}

async fn preview(
    h: &Harness,
    sandbox: &str,
    port: u32,
    ttl_seconds: u32,
) -> std::result::Result<api::GetPreviewUrlResponse, tonic::Status> {
    h.sandboxes
        .clone()
        .get_preview_url(api::GetPreviewUrlRequest {
            sandbox_id: sandbox.to_owned(),
            port,
            ttl_seconds,
        })
        .await
        .map(tonic::Response::into_inner)
}

async fn revoke(h: &Harness, sandbox: &str, port: u32) -> Result<()> {
    h.sandboxes
        .clone()
        .revoke_preview_urls(api::RevokePreviewUrlsRequest {
            sandbox_id: sandbox.to_owned(),
            port,
        })
        .await?;
    Ok(())
}

/// What curl got: the status, the headers (lowercase names) and the body.
#[derive(Debug)]
struct Got {
    status: u16,
    headers: String,
    body: String,
}

/// `curl -sS -i` with `args`.
async fn curl(args: &[&str]) -> Result<Got> {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "-i", "--max-time", "60"])
        .args(args)
        .output()
        .await
        .context("curl (deploy/ensure-tools.sh installs it)")?;
    ensure!(
        out.status.success(),
        "curl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").context("no head")?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .context("no status")?;
    Ok(Got {
        status,
        headers: head.to_ascii_lowercase(),
        body: body.to_owned(),
    })
}

/// The runtime's address and `path`.
fn at(port: u16, path: &str) -> String {
    format!("http://127.0.0.1:{port}{path}")
}

/// `s` as a query parameter's value.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[tokio::test]
async fn an_app_and_its_websocket_are_reached_with_curl_and_in_chromium() -> Result<()> {
    let (mut h, port) = start(|_| {}).await?;
    let sandbox = h.create_default().await?.sandbox_id;
    serve(&mut h, &sandbox).await?;
    let page = preview(&h, &sandbox, 8000, 0).await?;
    let echo = preview(&h, &sandbox, 8765, 0).await?;
    ensure!(
        page.url.starts_with(&format!(
            "http://8000-{sandbox}.{DOMAIN}:{port}/?mentis_preview_token="
        )),
        "{page:?}"
    );
    ensure!(
        page.path
            == format!(
                "/preview/{sandbox}/8000/?mentis_preview_token={}",
                page.token
            ),
        "{page:?}"
    );
    let expires = page.expire_time.context("no expiry")?.seconds;
    let now = i64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)?
            .as_secs(),
    )?;
    ensure!(
        (3500..=3600).contains(&(expires - now)),
        "an hour by default: {expires} {now}"
    );

    // Path-based: the first visit sets the cookie, scoped to the app's prefix.
    let first = curl(&[&at(port, &page.path)]).await?;
    ensure!(first.status == 200, "{first:?}");
    ensure!(first.body.contains("<title>preview</title>"), "{first:?}");
    for want in [
        "set-cookie: mentis_preview_token=",
        &format!("path=/preview/{sandbox}/8000/"),
        "httponly",
        "samesite=lax",
    ] {
        ensure!(first.headers.contains(want), "no {want}: {first:?}");
    }
    // Then the cookie alone, or the header alone, opens the app's other paths.
    let cookie = format!("Cookie: other=1; mentis_preview_token={}", page.token);
    let script = curl(&[
        "-H",
        &cookie,
        &at(port, &format!("/preview/{sandbox}/8000/app.js")),
    ])
    .await?;
    ensure!(
        script.status == 200 && script.body.contains("script loaded"),
        "{script:?}"
    );
    let by_header = format!("X-Mentis-Preview-Token: {}", page.token);
    let script = curl(&[
        "-H",
        &by_header,
        &at(port, &format!("/preview/{sandbox}/8000/app.js?v=2")),
    ])
    .await?;
    ensure!(script.status == 200, "{script:?}");
    ensure!(!script.headers.contains("set-cookie"), "{script:?}");
    // Without the slash: sent to the app's root, the query kept.
    let bare = curl(&[&at(port, &format!("/preview/{sandbox}/8000?x=1"))]).await?;
    ensure!(bare.status == 308, "{bare:?}");
    ensure!(
        bare.headers
            .contains(&format!("location: /preview/{sandbox}/8000/?x=1")),
        "{bare:?}"
    );

    // Host-based: the app on an origin of its own, the cookie for that host.
    let resolve = format!("8000-{sandbox}.{DOMAIN}:{port}:127.0.0.1");
    let hosted = curl(&["--resolve", &resolve, &page.url]).await?;
    ensure!(
        hosted.status == 200 && hosted.body.contains("<title>preview</title>"),
        "{hosted:?}"
    );
    ensure!(hosted.headers.contains("path=/;"), "{hosted:?}");

    // The app never saw the token: not in its paths, not in its cookies.
    let log = stdout(&h.sh(&sandbox, "cat /tmp/http.log").await?);
    ensure!(log.contains("\"GET /app.js?v=2 HTTP/1.1\" 200"), "{log}");
    ensure!(!log.contains("mentis_preview_token"), "{log}");

    // Chromium: the page, its script (by the cookie) and its WebSocket, path-based and host-based.
    let ws_path = format!("ws://127.0.0.1:{port}{}", echo.path);
    let ws_host = echo.url.replacen("http://", "ws://", 1);
    let urls = [
        format!("{}&ws={}", at(port, &page.path), encode(&ws_path)),
        format!("{}&ws={}", page.url, encode(&ws_host)),
    ];
    let seen = drive_browser("drive-preview.mjs", &urls).await?;
    for page in seen.as_array().context("not a list")? {
        ensure!(page["script"] == "script loaded", "{page}");
        ensure!(page["echo"] == "echo: hello from the page", "{page}");
        ensure!(
            page["failed"].as_array().is_some_and(Vec::is_empty),
            "{page}"
        );
    }
    h.stop().await
}

#[tokio::test]
async fn other_forged_expired_and_revoked_tokens_are_refused() -> Result<()> {
    let (mut h, port) = start(|_| {}).await?;
    let a = h.create_default().await?.sandbox_id;
    let b = h.create_default().await?.sandbox_id;
    serve(&mut h, &a).await?;
    serve(&mut h, &b).await?;
    let good = preview(&h, &a, 8000, 0).await?;
    let path = |sandbox: &str, port: u16, token: &str| {
        format!("/preview/{sandbox}/{port}/?mentis_preview_token={token}")
    };
    ensure!(curl(&[&at(port, &good.path)]).await?.status == 200);

    let none = curl(&[&at(port, &format!("/preview/{a}/8000/"))]).await?;
    ensure!(
        none.status == 401 && none.body.contains("no preview token"),
        "{none:?}"
    );
    let mut forged = good.token.clone();
    let last = forged.pop().context("empty token")?;
    forged.push(if last == 'A' { 'B' } else { 'A' });
    let refused = curl(&[&at(port, &path(&a, 8000, &forged))]).await?;
    ensure!(refused.status == 403, "{refused:?}");
    // A's token opens neither B's port nor A's other port.
    for (sandbox, p) in [(&b, 8000), (&a, 8765)] {
        let other = curl(&[&at(port, &path(sandbox, p, &good.token))]).await?;
        ensure!(
            other.status == 403 && other.body.contains("another sandbox or port"),
            "{sandbox} {p}: {other:?}"
        );
    }
    // Host-based too: the host names the sandbox and port, the token must match them.
    let resolve = format!("8000-{b}.{DOMAIN}:{port}:127.0.0.1");
    let other_host = curl(&[
        "--resolve",
        &resolve,
        &format!(
            "http://8000-{b}.{DOMAIN}:{port}/?mentis_preview_token={}",
            good.token
        ),
    ])
    .await?;
    ensure!(other_host.status == 403, "{other_host:?}");

    let short = preview(&h, &a, 8000, 1).await?;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let expired = curl(&[&at(port, &short.path)]).await?;
    ensure!(
        expired.status == 401 && expired.body.contains("expired"),
        "{expired:?}"
    );

    // Revoked: the port's URLs, then every port's; URLs handed out afterwards open.
    revoke(&h, &a, 8000).await?;
    let revoked = curl(&[&at(port, &good.path)]).await?;
    ensure!(
        revoked.status == 401 && revoked.body.contains("revoked"),
        "{revoked:?}"
    );
    let echo = preview(&h, &a, 8765, 0).await?;
    let fresh = preview(&h, &a, 8000, 0).await?;
    ensure!(curl(&[&at(port, &fresh.path)]).await?.status == 200);
    revoke(&h, &a, 0).await?;
    for gone in [&fresh, &echo] {
        let r = curl(&[&at(port, &gone.path)]).await?;
        ensure!(r.status == 401, "{r:?}");
    }
    ensure!(
        curl(&[&at(port, &preview(&h, &a, 8000, 0).await?.path)])
            .await?
            .status
            == 200
    );
    // B's URLs were not touched.
    ensure!(
        curl(&[&at(port, &preview(&h, &b, 8000, 0).await?.path)])
            .await?
            .status
            == 200
    );

    // A port nobody listens on: a clear 502.
    let empty = preview(&h, &a, 9999, 0).await?;
    let nothing = curl(&[&at(port, &empty.path)]).await?;
    ensure!(
        nothing.status == 502 && nothing.body.contains("listen on 0.0.0.0"),
        "{nothing:?}"
    );
    ensure!(
        curl(&[&at(port, "/preview/not-a-sandbox/1/")])
            .await?
            .status
            == 404
    );

    // Bad requests get clear statuses.
    for (p, ttl, field) in [
        (0, 0, "port"),
        (70_000, 0, "port"),
        (50_052, 0, "port"),
        (8000, 8 * 24 * 3600, "ttl_seconds"),
    ] {
        let (code, _, f) = refusal(preview(&h, &a, p, ttl).await);
        ensure!(
            code == Code::InvalidArgument && f.as_deref() == Some(field),
            "{p} {ttl}: {code:?} {f:?}"
        );
    }
    let (code, reason, _) =
        refusal(preview(&h, "4d1b1e9c-0000-4000-8000-000000000000", 8000, 0).await);
    ensure!(
        code == Code::NotFound && reason == "SANDBOX_NOT_FOUND",
        "{code:?} {reason}"
    );
    h.stop().await?;

    // A runtime without the HTTP listener hands out none.
    let mut plain = Harness::start().await?;
    let sandbox = plain.create_default().await?.sandbox_id;
    let (code, _, _) = refusal(preview(&plain, &sandbox, 8000, 0).await);
    ensure!(code == Code::FailedPrecondition, "{code:?}");
    plain.stop().await
}

#[tokio::test]
async fn a_visit_wakes_a_paused_sandbox_and_traffic_keeps_it_awake() -> Result<()> {
    let (mut h, port) = start(|c| c.reaper_interval = Duration::from_secs(1)).await?;
    let sleeper = h
        .create(api::SandboxSpec {
            auto_resume: true,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    serve(&mut h, &sleeper).await?;
    let url = preview(&h, &sleeper, 8000, 0).await?;
    h.sandboxes
        .pause_sandbox(api::PauseSandboxRequest {
            sandbox_id: sleeper.clone(),
        })
        .await?;
    let woken = curl(&[&at(port, &url.path)]).await?;
    ensure!(
        woken.status == 200 && woken.body.contains("<title>preview</title>"),
        "{woken:?}"
    );
    ensure!(h.get(&sleeper).await?.state == api::SandboxState::Running as i32);

    // Without auto_resume a PAUSED sandbox stays asleep: 503, saying why.
    let kept = h.create_default().await?.sandbox_id;
    serve(&mut h, &kept).await?;
    let url = preview(&h, &kept, 8000, 0).await?;
    h.sandboxes
        .pause_sandbox(api::PauseSandboxRequest {
            sandbox_id: kept.clone(),
        })
        .await?;
    let asleep = curl(&[&at(port, &url.path)]).await?;
    ensure!(
        asleep.status == 503 && asleep.body.contains("PAUSED"),
        "{asleep:?}"
    );

    // Idle for 3 s pauses a sandbox; a visit every half second keeps it RUNNING for 6 s.
    let busy = h
        .create(api::SandboxSpec {
            idle_timeout_seconds: 3,
            idle_policy: api::IdlePolicy::Pause as i32,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    serve(&mut h, &busy).await?;
    let url = preview(&h, &busy, 8000, 0).await?;
    for _ in 0..12 {
        ensure!(curl(&[&at(port, &url.path)]).await?.status == 200);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    ensure!(
        h.get(&busy).await?.state == api::SandboxState::Running as i32,
        "paused while visited"
    );
    h.wait_state(&busy, api::SandboxState::Paused, Duration::from_secs(30))
        .await?;
    h.stop().await
}

/// A WebSocket to the echo server through `url` (its path and token), answering.
async fn echo_socket(port: u16, url: &api::GetPreviewUrlResponse) -> Result<ws::Ws> {
    let mut sock = ws::connect(port, &url.path, "").await?;
    sock.send_text("ping").await?;
    let answer = sock.next_message(Duration::from_secs(10)).await?;
    ensure!(answer.text() == "echo: ping", "{answer:?}");
    Ok(sock)
}

/// Revocation and expiry close what they opened: a WebSocket through the proxy ends within a second of
/// RevokePreviewUrls (of its port, or of every port) and at its URL's expiry, instead of echoing on for as
/// long as it stays open (issue 40: 35 s later it still did, and kept its sandbox from going idle).
#[tokio::test]
async fn an_open_websocket_ends_when_its_url_is_revoked_or_expires() -> Result<()> {
    let (mut h, port) = start(|_| {}).await?;
    let sandbox = h.create_default().await?.sandbox_id;
    serve(&mut h, &sandbox).await?;

    // Revoking the port's URLs ends the socket; one of another port of the sandbox is untouched.
    let url = preview(&h, &sandbox, 8765, 0).await?;
    let mut sock = echo_socket(port, &url).await?;
    let page = preview(&h, &sandbox, 8000, 0).await?;
    revoke(&h, &sandbox, 8765).await?;
    let (took, _) = sock.closed_within(Duration::from_secs(1)).await?;
    ensure!(took < Duration::from_secs(1), "closed after {took:?}");
    ensure!(curl(&[&at(port, &page.path)]).await?.status == 200);

    // Revoking every port's ends a socket opened by a URL made since.
    let url = preview(&h, &sandbox, 8765, 0).await?;
    let mut sock = echo_socket(port, &url).await?;
    let mut kept = echo_socket(port, &url).await?;
    revoke(&h, &sandbox, 0).await?;
    for s in [&mut sock, &mut kept] {
        let (took, _) = s.closed_within(Duration::from_secs(1)).await?;
        ensure!(took < Duration::from_secs(1), "closed after {took:?}");
    }

    // A URL that expires ends its socket at the expiry (Unix seconds: between 1 and 2 s from now).
    let short = preview(&h, &sandbox, 8765, 2).await?;
    let expires = std::time::UNIX_EPOCH
        + Duration::from_secs(
            u64::try_from(short.expire_time.context("no expiry")?.seconds)
                .context("an expiry before 1970")?,
        );
    let mut sock = echo_socket(port, &short).await?;
    sock.send_text("still there").await?;
    ensure!(sock.next_message(Duration::from_secs(1)).await?.text() == "echo: still there");
    sock.closed_within(Duration::from_secs(5)).await?;
    let late = std::time::SystemTime::now()
        .duration_since(expires)
        .unwrap_or_default();
    ensure!(
        late < Duration::from_secs(1),
        "closed {late:?} after the expiry"
    );
    h.stop().await
}
