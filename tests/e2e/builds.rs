//! Image builds run agent-written Dockerfiles (docs/ARCHITECTURE.md, Security model, "Image builds"): RUN
//! steps get no network unless the build asks and the runtime allows it (and then only the egress network
//! of sandboxes, behind its host guard), and the runtime's CPU and memory limits.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use mentis_e2e::*;
use mentis_proto::api::{self, template_service_client::TemplateServiceClient};
use mentis_runtime::config::BuildPolicy;
use tokio::io::AsyncWriteExt as _;
use tonic::Code;

use super::templates::{build_with, context};

/// A TCP service on every address of the host, answering `reached` and counting its connections.
struct HostService {
    port: u16,
    connections: Arc<AtomicUsize>,
    tasks: tokio::task::JoinSet<()>,
}

impl HostService {
    async fn start() -> anyhow::Result<Self> {
        let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await?;
        let port = listener.local_addr()?.port();
        let connections = Arc::new(AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        let counted = Arc::clone(&connections);
        tasks.spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                counted.fetch_add(1, Ordering::SeqCst);
                let _ = stream.write_all(b"reached\n").await;
            }
        });
        Ok(Self {
            port,
            connections,
            tasks,
        })
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for HostService {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// Removes the images named when dropped (they are the engine's, not an instance's).
struct Images(Vec<String>);

impl Drop for Images {
    fn drop(&mut self) {
        for image in &self.0 {
            let _ = docker(&["image", "rm", "-f", image]);
        }
    }
}

/// A build of `image` that runs every step (the engine's cache matches a RUN step by its text alone, not
/// by the network or limits it ran with).
fn header(image: &str, egress: bool) -> api::BuildImageHeader {
    api::BuildImageHeader {
        image: image.to_owned(),
        egress,
        no_cache: true,
        ..Default::default()
    }
}

/// Whether a build's output shows a default route (`/proc/net/route`: destination 00000000).
fn default_route(output: &str) -> bool {
    output
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some("00000000"))
}

#[tokio::test]
async fn builds_have_no_network_unless_allowed_and_run_within_their_limits() -> anyhow::Result<()> {
    test_images()?;
    let service = HostService::start().await?;
    // The host's address on Docker's default bridge, where builds used to run their steps.
    let host = docker(&[
        "network",
        "inspect",
        "bridge",
        "--format",
        "{{(index .IPAM.Config 0).Gateway}}",
    ])?
    .trim()
    .to_owned();
    let port = service.port;
    // The probe works: a container on the default bridge reaches the service (the docker CLI blocks: on a
    // thread of its own, so the service answers meanwhile).
    let reach = format!("nc -w 3 {host} {port} </dev/null");
    let probe = tokio::task::spawn_blocking(move || {
        docker(&["run", "--rm", "mentis-test/busybox:1", "sh", "-c", &reach])
    })
    .await??;
    assert_eq!(probe, "reached\n");
    let probed = service.connections();

    let h = Harness::start_with(|c| {
        c.builds = BuildPolicy {
            cpu: 0.5,
            memory_mb: 64,
            egress: false,
        };
    })
    .await?;
    let mut templates = TemplateServiceClient::new(h.channel.clone());
    let name = format!("mentis-test/build-isolation-{}:1", h.guard.instance);
    let _images = Images(vec![name.clone()]);

    // No network: a RUN step sees only loopback, and one that reaches for the host's service fails the
    // build, the service untouched.
    let dockerfile = format!(
        "FROM mentis-test/busybox:1\nRUN cat /proc/net/dev /proc/net/route\n\
         RUN nc -w 3 {host} {port} </dev/null\n"
    );
    let (output, built) = build_with(
        &mut templates,
        header(&name, false),
        context(&[("Dockerfile", &dockerfile)])?,
    )
    .await?;
    let refused = built.expect_err("a RUN step reached the host");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(
        refused.message().contains("returned a non-zero code: 1"),
        "{refused:?}"
    );
    assert!(output.contains("Network is unreachable"), "{output}");
    assert!(
        output.contains("lo:") && !output.contains("eth0") && !default_route(&output),
        "{output}"
    );
    assert_eq!(
        service.connections(),
        probed,
        "a build step reached the host"
    );

    // The limits: each RUN step's cgroup has the CPU quota and memory of MENTIS_BUILD_LIMITS (cgroup v1 or
    // v2), and a step that takes more memory is killed, the build failing with a status that says so.
    let (output, built) = build_with(
        &mut templates,
        header(&name, false),
        context(&[(
            "Dockerfile",
            "FROM mentis-test/busybox:1\n\
             RUN echo \"quota=$(cat /sys/fs/cgroup/cpu.max 2>/dev/null || cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us)\" \
             \"memory=$(cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes)\"\n",
        )])?,
    )
    .await?;
    built.map_err(|s| anyhow::anyhow!("{s:?}; output: {output}"))?;
    assert!(output.contains("quota=50000"), "{output}");
    assert!(output.contains(&format!("memory={}", 64 << 20)), "{output}");
    let (output, built) = build_with(
        &mut templates,
        header(&name, false),
        context(&[(
            "Dockerfile",
            "FROM mentis-test/busybox:1\nRUN head -c 314572800 /dev/zero | tail\n",
        )])?,
    )
    .await?;
    let killed = built.expect_err("300 MB in a step limited to 64 MiB");
    assert_eq!(killed.code(), Code::FailedPrecondition, "{killed:?}");
    assert!(
        killed
            .message()
            .contains("returned a non-zero code: 137 (137: killed, most likely by the build's memory limit of 64 MiB"),
        "{killed:?}; output: {output}"
    );

    // A build may not ask for a route out on a runtime that gives builds none.
    let (_, built) = build_with(
        &mut templates,
        header(&name, true),
        context(&[("Dockerfile", "FROM mentis-test/busybox:1\n")])?,
    )
    .await?;
    let denied = built.expect_err("egress on a runtime that denies it");
    assert_eq!(denied.code(), Code::FailedPrecondition, "{denied:?}");
    assert!(
        denied.message().contains("MENTIS_BUILD_EGRESS"),
        "{denied:?}"
    );
    h.stop().await?;

    // A runtime that allows it: a build that asks gets the sandboxes' egress network (a default route),
    // whose guard still keeps it off the host's services; one that does not ask still has no network.
    let h = Harness::start_with(|c| c.builds.egress = true).await?;
    let mut templates = TemplateServiceClient::new(h.channel.clone());
    let dockerfile = format!(
        "FROM mentis-test/busybox:1\nRUN cat /proc/net/route\n\
         RUN if nc -w 3 {host} {port} </dev/null; then exit 9; else echo host unreachable; fi\n"
    );
    let (output, built) = build_with(
        &mut templates,
        header(&name, true),
        context(&[("Dockerfile", &dockerfile)])?,
    )
    .await?;
    built.map_err(|s| anyhow::anyhow!("{s:?}; output: {output}"))?;
    assert!(default_route(&output), "{output}");
    assert!(output.contains("host unreachable"), "{output}");
    assert_eq!(
        service.connections(),
        probed,
        "a build step reached the host"
    );
    let (output, built) = build_with(
        &mut templates,
        header(&name, false),
        context(&[(
            "Dockerfile",
            "FROM mentis-test/busybox:1\nRUN cat /proc/net/route; echo no egress asked\n",
        )])?,
    )
    .await?;
    built.map_err(|s| anyhow::anyhow!("{s:?}; output: {output}"))?;
    assert!(
        output.contains("no egress asked") && !default_route(&output),
        "{output}"
    );
    h.stop().await
}
