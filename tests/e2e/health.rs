//! Health tells the truth about the container engine: a runtime whose Docker engine goes away says
//! NOT_SERVING on every service, and SERVING again (and works) once the engine is back. The engine goes away
//! for this one runtime only: it reaches Docker through a socket of the test's that forwards to the real one,
//! and the test closes it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use mentis_e2e::*;
use tokio::net::{UnixListener, UnixStream};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

/// A unix socket forwarding every connection to the Docker engine's, until it is closed.
struct EngineDoor {
    path: PathBuf,
    task: tokio::task::JoinHandle<()>,
}

impl EngineDoor {
    fn open(path: &Path) -> anyhow::Result<Self> {
        let engine = std::env::var("DOCKER_HOST")
            .ok()
            .and_then(|h| h.strip_prefix("unix://").map(str::to_owned))
            .unwrap_or_else(|| "/var/run/docker.sock".to_owned());
        let _ = std::fs::remove_file(path);
        let listener = UnixListener::bind(path)?;
        let task = tokio::spawn(async move {
            // Dropped with the task: every forwarded connection ends when the door closes.
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((mut client, _)) = listener.accept().await {
                let engine = engine.clone();
                connections.spawn(async move {
                    if let Ok(mut docker) = UnixStream::connect(&engine).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut docker).await;
                    }
                });
            }
        });
        Ok(Self {
            path: path.to_owned(),
            task,
        })
    }

    fn close(self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn status(health: &mut HealthClient<tonic::transport::Channel>, service: &str) -> i32 {
    health
        .check(HealthCheckRequest {
            service: service.to_owned(),
        })
        .await
        .map_or(-1, |r| r.into_inner().status)
}

/// Polls until every service says `want` (a probe every 2 s).
async fn until_all(
    health: &mut HealthClient<tonic::transport::Channel>,
    want: ServingStatus,
) -> anyhow::Result<()> {
    let services = [
        "",
        "mentis.v1.SandboxService",
        "mentis.v1.ActionService",
        "mentis.v1.FileService",
    ];
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut got = Vec::new();
        for s in services {
            got.push(status(health, s).await);
        }
        if got.iter().all(|s| *s == want as i32) {
            return Ok(());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "health did not become {want:?}: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn health_follows_the_engine_going_away_and_coming_back() -> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let sockets = tempfile::tempdir()?;
    let socket = sockets.path().join("engine.sock");
    let door = EngineDoor::open(&socket)?;
    let host = format!("unix://{}", socket.display());
    let runtime =
        RuntimeProcess::start_with_env(bin, &instance, data_dir.path(), &[("DOCKER_HOST", &host)])
            .await?;
    let mut health = HealthClient::new(runtime.channel().await?);
    let mut h = runtime.harness(data_dir, guard).await?;
    until_all(&mut health, ServingStatus::Serving).await?;

    door.close();
    until_all(&mut health, ServingStatus::NotServing).await?;

    let door = EngineDoor::open(&socket)?;
    until_all(&mut health, ServingStatus::Serving).await?;
    // And it works again.
    let id = h.create_default().await?.sandbox_id;
    assert_eq!(stdout(&h.sh(&id, "echo back").await?), "back\n");
    drop(runtime);
    door.close();
    Ok(())
}
