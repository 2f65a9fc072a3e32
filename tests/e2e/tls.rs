//! The API over TLS and mutual TLS (`MENTIS_TLS_CERT`, `MENTIS_TLS_KEY`, `MENTIS_TLS_CLIENT_CA`), with
//! certificates the test makes: the Rust client and grpcurl get in with the CA that signed the server's
//! certificate, plaintext and clients trusting another CA do not; with a client CA, only clients that
//! present a certificate it signed get in.

use std::path::Path;
use std::process::Command;

use mentis_e2e::*;
use mentis_proto::api;
use tonic::transport::Identity;

use crate::pki::{Pki, answers, channel, trusting};

/// grpcurl's health check of the runtime at `port`, with `flags`; its output when it succeeded.
fn grpcurl(port: u16, flags: &[&str]) -> anyhow::Result<Result<String, String>> {
    let bin = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/grpcurl");
    anyhow::ensure!(
        bin.exists(),
        "{} is missing: `make tools` installs it",
        bin.display()
    );
    let out = Command::new(bin)
        .args(flags)
        .args([&format!("localhost:{port}"), "grpc.health.v1.Health/Check"])
        .output()?;
    Ok(if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    })
}

#[tokio::test]
async fn the_api_speaks_tls_and_mutual_tls_with_the_certificates_it_is_given() -> anyhow::Result<()>
{
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let pki = Pki::make()?;
    let (cert, key, client_ca) = (
        pki.path("server.pem"),
        pki.path("server.key"),
        pki.path("ca.pem"),
    );
    let (cert, key, client_ca) = (
        cert.to_str().unwrap_or_default(),
        key.to_str().unwrap_or_default(),
        client_ca.to_str().unwrap_or_default(),
    );

    // TLS: a client trusting the CA gets in and works; plaintext and another CA do not.
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let tls = [("MENTIS_TLS_CERT", cert), ("MENTIS_TLS_KEY", key)];
    let runtime = RuntimeProcess::start_with_env(bin, &instance, data_dir.path(), &tls).await?;
    let port = runtime.addr.port();
    let over_tls = channel(port, trusting(&pki.ca)).await?;
    let mut h = Harness::over(over_tls, Some(&runtime.admin_key()?), data_dir, guard);
    let id = h.create_default().await?.sandbox_id;
    assert_eq!(stdout(&h.sh(&id, "echo over tls").await?), "over tls\n");
    let plaintext = runtime.channel().await;
    assert!(
        match plaintext {
            Ok(c) => !answers(c).await,
            Err(_) => true,
        },
        "a plaintext client must not get an answer"
    );
    assert!(
        channel(port, trusting(&pki.other_ca)).await.is_err(),
        "a client trusting another CA must not connect"
    );
    let ca_flag = pki.path("ca.pem");
    let ca_flag = ca_flag.to_str().unwrap_or_default();
    let out = grpcurl(port, &["-cacert", ca_flag])?.map_err(anyhow::Error::msg)?;
    assert!(out.contains("SERVING"), "{out}");
    assert!(grpcurl(port, &["-plaintext"])?.is_err());
    drop(runtime);
    drop(h);

    // Mutual TLS: only a client presenting a certificate the CA signed gets in.
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let mtls = [
        ("MENTIS_TLS_CERT", cert),
        ("MENTIS_TLS_KEY", key),
        ("MENTIS_TLS_CLIENT_CA", client_ca),
    ];
    let runtime = RuntimeProcess::start_with_env(bin, &instance, data_dir.path(), &mtls).await?;
    let port = runtime.addr.port();
    let anonymous = channel(port, trusting(&pki.ca)).await;
    assert!(
        match anonymous {
            Ok(c) => !answers(c).await,
            Err(_) => true,
        },
        "a client without a certificate must not get an answer"
    );
    let identified = channel(
        port,
        trusting(&pki.ca).identity(Identity::from_pem(&pki.client_cert, &pki.client_key)),
    )
    .await?;
    let mut h = Harness::over(identified, Some(&runtime.admin_key()?), data_dir, guard);
    let listed = h
        .sandboxes
        .list_sandboxes(api::ListSandboxesRequest::default())
        .await?
        .into_inner();
    assert!(listed.sandboxes.is_empty(), "{listed:?}");
    let (client_cert, client_key) = (pki.path("client.pem"), pki.path("client.key"));
    let out = grpcurl(
        port,
        &[
            "-cacert",
            ca_flag,
            "-cert",
            client_cert.to_str().unwrap_or_default(),
            "-key",
            client_key.to_str().unwrap_or_default(),
        ],
    )?
    .map_err(anyhow::Error::msg)?;
    assert!(out.contains("SERVING"), "{out}");
    assert!(grpcurl(port, &["-cacert", ca_flag])?.is_err());
    drop(runtime);
    drop(h);
    Ok(())
}

/// `mentis-runtime healthcheck` (the runtime image's HEALTHCHECK) with the runtime's own environment, run as
/// the real binary: exit 0 and SERVING while it serves, 1 once it drains or is gone; with the API over TLS it
/// asks `MENTIS_HEALTH_LISTEN`, a plaintext listener serving health alone (grpcurl finds health there and
/// nothing else), and without one it says what to set (exit 2).
#[tokio::test]
async fn healthcheck_asks_the_plaintext_health_listener_of_a_tls_runtime() -> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let pki = Pki::make()?;
    let (cert, key) = (pki.path("server.pem"), pki.path("server.key"));
    let (cert, key) = (
        cert.to_str().unwrap_or_default(),
        key.to_str().unwrap_or_default(),
    );
    let health_port = free_port()?;
    let health_listen = format!("127.0.0.1:{health_port}");
    let guard = Harness::new_instance();
    let data_dir = tempfile::tempdir()?;
    let env = [
        ("MENTIS_TLS_CERT", cert),
        ("MENTIS_TLS_KEY", key),
        ("MENTIS_HEALTH_LISTEN", health_listen.as_str()),
    ];
    let mut runtime =
        RuntimeProcess::start_with_env(bin, &guard.instance, data_dir.path(), &env).await?;
    let listen = runtime.addr.to_string();
    let check = |with_health: bool| {
        let mut c = Command::new(bin);
        c.arg("healthcheck")
            .env("MENTIS_LISTEN", &listen)
            .env("MENTIS_TLS_CERT", cert)
            .env("MENTIS_TLS_KEY", key);
        if with_health {
            c.env("MENTIS_HEALTH_LISTEN", &health_listen);
        }
        c.output()
    };
    let out = check(true)?;
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "SERVING\n");
    let out = check(false)?;
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("MENTIS_HEALTH_LISTEN"));
    // Health alone, in plaintext: the API is not there.
    let plain = grpcurl(health_port, &["-plaintext"])?.map_err(anyhow::Error::msg)?;
    assert!(plain.contains("SERVING"), "{plain}");
    let bin_grpcurl = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.tools/bin/grpcurl");
    let listed = Command::new(bin_grpcurl)
        .args([
            "-plaintext",
            &health_listen,
            "mentis.v1.SandboxService/ListSandboxes",
        ])
        .output()?;
    assert!(!listed.status.success(), "{listed:?}");

    // Draining (SIGTERM): NOT_SERVING, exit 1; gone: unreachable, exit 1.
    runtime.signal("TERM")?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let out = loop {
        let out = check(true)?;
        if out.status.code() != Some(0) || std::time::Instant::now() > deadline {
            break out;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    runtime.kill();
    let out = check(true)?;
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).starts_with("unreachable"),
        "{out:?}"
    );
    Ok(())
}
