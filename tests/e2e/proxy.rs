//! MentisSandbox behind a real proxy: Debian's nginx terminating TLS and passing gRPC on (`grpc_pass`), with
//! the settings docs/PROXY.md names. Through it: health, a sandbox's command, a WriteFile of 3 MiB (nginx's
//! default body limit of 1 MiB would refuse it), and a Connect stream left idle three times longer than the
//! proxy's read timeout, kept open by the runtime's keepalives and still answering afterwards.

use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use mentis_e2e::*;
use mentis_proto::api;

use crate::pki::{Pki, answers, channel, trusting};

/// nginx in the foreground on `port`, passing gRPC to `upstream`, with the config of docs/PROXY.md and a
/// read timeout of `read_timeout_secs`.
struct Nginx {
    child: Child,
    dir: tempfile::TempDir,
}

impl Nginx {
    fn start(pki: &Pki, port: u16, upstream: u16, read_timeout_secs: u32) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let d = dir.path().display();
        let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
        let conf = format!(
            r#"
daemon off;
user root;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/error.log info;
events {{}}
http {{
    access_log {d}/access.log;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    server {{
        listen 127.0.0.1:{port} ssl http2;
        ssl_certificate {cert};
        ssl_certificate_key {key};
{settings}
        location / {{
            grpc_pass grpc://127.0.0.1:{upstream};
        }}
    }}
}}
"#,
            cert = cert.display(),
            key = key.display(),
            settings = doc_settings(read_timeout_secs)?,
        );
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf)?;
        let nginx = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .ok_or_else(|| anyhow::anyhow!("nginx is missing: `make tools` installs it"))?;
        let child = Command::new(nginx)
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(dir.path())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        Ok(Self { child, dir })
    }
}

impl Nginx {
    /// nginx's error log so far, for a failure's message.
    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("error.log")).unwrap_or_default()
    }
}

impl Drop for Nginx {
    /// SIGTERM: the master stops its workers and exits (a SIGKILL would leave the workers running).
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::time::Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The settings block of docs/PROXY.md (the fenced block that starts `# mentis-proxy-settings`), with the
/// read timeout set to `read_timeout_secs`.
fn doc_settings(read_timeout_secs: u32) -> anyhow::Result<String> {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/PROXY.md"))?;
    let block: Vec<&str> = doc
        .lines()
        .skip_while(|l| l.trim() != "# mentis-proxy-settings")
        .take_while(|l| !l.starts_with("```"))
        .collect();
    anyhow::ensure!(
        block.iter().any(|l| l.starts_with("grpc_read_timeout")),
        "docs/PROXY.md has no settings block with grpc_read_timeout: {block:?}"
    );
    Ok(block
        .iter()
        .map(|l| {
            if l.starts_with("grpc_read_timeout") {
                format!("grpc_read_timeout {read_timeout_secs}s;")
            } else {
                (*l).to_owned()
            }
        })
        .collect::<Vec<_>>()
        .join("\n"))
}

#[tokio::test]
async fn behind_nginx_streams_stay_open_past_its_read_timeout_and_big_writes_pass()
-> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let pki = Pki::make()?;
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    // Keepalives every 2 s on idle streams; the proxy's read timeout is 4 s.
    let runtime = RuntimeProcess::start_with_env(
        bin,
        &instance,
        data_dir.path(),
        &[("MENTIS_STREAM_KEEPALIVE_SECS", "2")],
    )
    .await?;
    let port = free_port()?;
    let nginx = Nginx::start(&pki, port, runtime.addr.port(), 4)?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let proxied = loop {
        match channel(port, trusting(&pki.ca)).await {
            Ok(c) if answers(c.clone()).await => break c,
            _ if tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            _ => anyhow::bail!("nginx did not pass health checks on within 20 s"),
        }
    };
    let mut h = Harness::over(proxied, Some(&runtime.admin_key()?), data_dir, guard);
    let id = h.create_default().await?.sandbox_id;
    assert_eq!(stdout(&h.sh(&id, "echo proxied").await?), "proxied\n");

    // A write past nginx's default body limit.
    let mut files = crate::files::files(&h);
    let big = Bytes::from(vec![b'x'; 3 << 20]);
    let chunks = big.chunks(1 << 20).map(Bytes::copy_from_slice).collect();
    let info = crate::files::write(&mut files, &id, "big.bin", chunks).await?;
    assert_eq!(info.size, 3 << 20);

    // A Connect stream idle for 12 s, three times the proxy's read timeout. The attach is queued before the
    // call starts: nginx passes the response's headers on only with its first message, and tonic's
    // `connect` waits for them (docs/PROXY.md).
    use api::connect_request::{Attach, Kind as Req, Submit};
    use api::connect_response::Kind as Resp;
    let (tx, rx) = tokio::sync::mpsc::channel(8);
    tx.send(api::ConnectRequest {
        kind: Some(Req::Attach(Attach {
            sandbox_id: id.clone(),
            after_seq: None,
        })),
    })
    .await?;
    let mut resp = h
        .actions
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await
        .map_err(|e| anyhow::anyhow!("Connect through nginx: {e:?}; nginx: {}", nginx.log()))?
        .into_inner();
    let idle_until = tokio::time::Instant::now() + Duration::from_secs(12);
    let mut keepalives = 0;
    while let Ok(m) = tokio::time::timeout_at(idle_until, resp.next()).await {
        match m {
            Some(Ok(api::ConnectResponse {
                kind: Some(Resp::Keepalive(_)),
            })) => keepalives += 1,
            Some(Ok(_)) => {}
            other => anyhow::bail!("the idle stream ended: {other:?}"),
        }
    }
    assert!(keepalives >= 4, "{keepalives} keepalives in 12 s");
    tx.send(api::ConnectRequest {
        kind: Some(Req::Submit(Submit {
            action: Some(shell_action(cmd("echo still here"))),
            action_id: String::new(),
        })),
    })
    .await?;
    let mut out = Vec::new();
    loop {
        let m = tokio::time::timeout(Duration::from_secs(30), resp.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("the stream ended"))??;
        if let Some(Resp::Observation(o)) = m.kind {
            let end = matches!(o.kind, Some(api::observation::Kind::CmdEnd(_)));
            out.push(o);
            if end {
                break;
            }
        }
    }
    assert_eq!(stdout(&out), "still here\n");
    drop(runtime);
    Ok(())
}
