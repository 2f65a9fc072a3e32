//! The mentis-executor binary: config errors exit clearly; the token never reaches commands or the log.

use std::process::Stdio;
use std::time::Duration;

use mentis_proto::executor::executor_service_client::ExecutorServiceClient;
use tokio::io::AsyncReadExt;
use tokio::process::Command;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

use super::support::*;

const BINARY: &str = env!("CARGO_BIN_EXE_mentis-executor");

fn executor_command(workspace: &std::path::Path) -> Command {
    let mut command = Command::new(BINARY);
    command
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("MENTIS_WORKSPACE", workspace)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    command
}

#[tokio::test]
async fn a_missing_token_exits_with_a_clear_message() {
    let workspace = tempfile::tempdir().unwrap();
    let output = tokio::time::timeout(PATIENCE, executor_command(workspace.path()).output())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("MENTIS_EXECUTOR_TOKEN"), "{stderr}");
}

#[tokio::test]
async fn the_token_is_hidden_from_commands_and_logs() {
    let workspace = tempfile::tempdir().unwrap();
    serve_and_check_the_token_is_hidden(executor_command(workspace.path())).await;
}

/// The image's entrypoint: `launch` execs tini (here a shell that records its environment, then execs the
/// executor) with the token moved into a pipe, so the first process's /proc/PID/environ lacks it.
#[tokio::test]
async fn launch_keeps_the_token_out_of_the_first_process_environment() {
    let workspace = tempfile::tempdir().unwrap();
    let seen = workspace.path().join("first-process-environ");
    let script = format!(
        "tr '\\0' '\\n' < /proc/$$/environ > '{}'; exec '{BINARY}'",
        seen.display()
    );
    let mut command = executor_command(workspace.path());
    command.args(["launch", "--", "/bin/sh", "-c", &script]);
    serve_and_check_the_token_is_hidden(command).await;
    let environ = std::fs::read_to_string(&seen).unwrap();
    assert!(environ.contains("MENTIS_EXECUTOR_TOKEN_FD="), "{environ}");
    assert!(!environ.contains("MENTIS_EXECUTOR_TOKEN="), "{environ}");
    assert!(!environ.contains(TOKEN), "{environ}");

    let usage = executor_command(workspace.path())
        .args(["launch", "/bin/true"])
        .env("MENTIS_EXECUTOR_TOKEN", TOKEN)
        .output()
        .await
        .unwrap();
    assert_eq!(usage.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&usage.stderr).contains("usage"));
}

/// Starts `command` with the token, runs `env` through it, stops it; neither the command nor the log sees
/// the token.
async fn serve_and_check_the_token_is_hidden(mut command: Command) {
    // Find a free port; the tiny window before the executor binds it again is acceptable in a test.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut child = command
        .env("MENTIS_EXECUTOR_TOKEN", TOKEN)
        .env("MENTIS_EXECUTOR_LISTEN", addr.to_string())
        .env("RUST_LOG", "debug")
        .spawn()
        .unwrap();

    // Ready = health answers SERVING.
    let channel = tokio::time::timeout(PATIENCE, async {
        loop {
            if let Some(channel) = serving(addr).await {
                return channel;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the executor becomes ready");

    let value = format!("Bearer {TOKEN}").parse().unwrap();
    let mut client =
        ExecutorServiceClient::with_interceptor(channel, move |mut request: tonic::Request<()>| {
            request
                .metadata_mut()
                .insert("authorization", Clone::clone(&value));
            Ok(request)
        });
    let stream = client
        .run(request(&action_id(), shell("env")))
        .await
        .unwrap()
        .into_inner();
    let events = collect(stream).await;
    assert_eq!(events.end().exit_code, 0);
    let env = String::from_utf8_lossy(&events.stdout()).into_owned();
    assert!(
        env.contains("MENTIS_WORKSPACE="),
        "the image env is passed on"
    );
    assert!(!env.contains("MENTIS_EXECUTOR_TOKEN"), "{env}");
    assert!(!env.contains(TOKEN), "{env}");

    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id().unwrap()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::time::timeout(PATIENCE, child.wait())
        .await
        .expect("exits after SIGTERM")
        .unwrap();
    assert!(status.success(), "{status:?}");
    let mut log = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut log)
        .await
        .unwrap();
    assert!(log.contains("executor serving"), "{log}");
    assert!(!log.contains(TOKEN), "the log never shows the token");
}

/// A channel to `addr` once its health check answers SERVING.
async fn serving(addr: std::net::SocketAddr) -> Option<tonic::transport::Channel> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .ok()?
        .connect()
        .await
        .ok()?;
    let response = HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .ok()?;
    (response.into_inner().status == ServingStatus::Serving as i32).then_some(channel)
}
