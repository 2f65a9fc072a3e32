//! Sandbox lifecycle: create → RUNNING with labels, limits, volume and a non-root executor; delete removes
//! container and volume and is idempotent; reconciliation removes unknown labelled containers.

use mentis_e2e::*;
use mentis_proto::api;

#[tokio::test]
async fn create_runs_a_labelled_limited_non_root_sandbox_and_delete_removes_it()
-> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h
        .create(api::SandboxSpec {
            labels: [("team".to_owned(), "e2e".to_owned())].into(),
            cpu_limit: 0.5,
            memory_limit_mb: 256,
            pids_limit: 128,
            ..Default::default()
        })
        .await?;
    assert_eq!(sb.state, api::SandboxState::Running as i32, "{sb:?}");
    assert_eq!(sb.space_id, "default");
    assert_eq!(sb.image, executor_image());
    assert_eq!(sb.labels.get("team").map(String::as_str), Some("e2e"));
    assert_eq!(
        (sb.cpu_limit, sb.memory_limit_mb, sb.pids_limit),
        (0.5, 256, 128)
    );

    // Docker agrees: labels, limits, the network, the workspace volume.
    let c = container_of(&sb.sandbox_id);
    let labels = labels_of(&c)?;
    assert_eq!(
        labels.get("io.mentis.managed").map(String::as_str),
        Some("true")
    );
    assert_eq!(labels.get("io.mentis.sandbox-id"), Some(&sb.sandbox_id));
    assert_eq!(
        labels.get("io.mentis.space-id").map(String::as_str),
        Some("default")
    );
    assert_eq!(inspect(&c, "{{.HostConfig.NanoCpus}}")?, "500000000");
    assert_eq!(
        inspect(&c, "{{.HostConfig.Memory}}")?,
        (256 * 1024 * 1024).to_string()
    );
    assert_eq!(
        inspect(&c, "{{.HostConfig.MemorySwap}}")?,
        (256 * 1024 * 1024).to_string()
    );
    assert_eq!(inspect(&c, "{{.HostConfig.PidsLimit}}")?, "128");
    assert!(inspect(&c, "{{json .NetworkSettings.Networks}}")?.contains("mentis-net"));
    let volume = format!("mentis-ws-{}", sb.sandbox_id);
    assert!(
        h.guard.volumes().contains(&volume),
        "volume {volume} missing"
    );
    assert!(inspect(&c, "{{json .Mounts}}")?.contains("/workspace"));
    let net_internal = docker(&[
        "network",
        "inspect",
        "--format",
        "{{.Internal}} {{index .Options \"com.docker.network.bridge.enable_icc\"}}",
        "mentis-net",
    ])?;
    assert_eq!(net_internal.trim(), "true false");

    // User code is not root, and the workspace is its own. The container starts as root with three
    // capabilities: the launcher uses CHOWN (for images without a /workspace) and drops it, the executor
    // uses the other two once to become the supervisor (see isolation.rs).
    let obs = h
        .sh(&sb.sandbox_id, "id -u; stat -c %u /workspace; pwd")
        .await?;
    assert_eq!(stdout(&obs), "1000\n1000\n/workspace\n");
    assert_eq!(inspect(&c, "{{.Config.User}}")?, "0:0");
    assert_eq!(
        inspect(&c, "{{.HostConfig.CapDrop}} {{.HostConfig.CapAdd}}")?,
        "[ALL] [SETUID SETGID CHOWN]"
    );
    // Neither tini nor the executor may use CHOWN (bit 0) any more: SETGID and SETUID (bits 6, 7) only.
    let held = docker(&[
        "exec",
        &c,
        "sh",
        "-c",
        "grep CapPrm /proc/1/status; grep CapPrm /proc/$(pgrep -x mentis-executor)/status",
    ])?;
    assert_eq!(
        held,
        "CapPrm:\t00000000000000c0\nCapPrm:\t00000000000000c0\n"
    );
    // The executor and tini come from the executor volume, read-only, whatever the image.
    assert_eq!(
        inspect(&c, "{{json .Config.Entrypoint}}")?,
        r#"["/.mentis/bin/mentis-executor","launch","--","/.mentis/bin/tini","--","/.mentis/bin/mentis-executor"]"#
    );
    let mount = inspect(
        &c,
        "{{range .Mounts}}{{if eq .Destination \"/.mentis\"}}{{.Name}} {{.RW}}{{end}}{{end}}",
    )?;
    assert!(
        mount.starts_with("mentis-executor-") && mount.ends_with(" false"),
        "/.mentis: {mount:?}"
    );

    // The executor answers health to anyone on its network, but runs nothing without the sandbox's token.
    let ip = inspect(
        &c,
        "{{(index .NetworkSettings.Networks \"mentis-net\").IPAddress}}",
    )?;
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{ip}:50052"))?
        .connect()
        .await?;
    let health = tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await?
        .into_inner();
    assert_eq!(
        health.status,
        tonic_health::pb::health_check_response::ServingStatus::Serving as i32
    );
    // A health call with another sandbox's token is refused: this is how the runtime, which always sends
    // the token, tells its sandbox from a newcomer that got a vanished sandbox's address.
    let mut foreign = tonic::Request::new(tonic_health::pb::HealthCheckRequest {
        service: String::new(),
    });
    foreign
        .metadata_mut()
        .insert("authorization", "Bearer another-sandboxes-token".parse()?);
    let err = tonic_health::pb::health_client::HealthClient::new(channel.clone())
        .check(foreign)
        .await
        .expect_err("a wrong token is refused even for health");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let mut exec =
        mentis_proto::executor::executor_service_client::ExecutorServiceClient::new(channel);
    let run = mentis_proto::executor::RunRequest {
        action_id: "intruder".into(),
        action: Some(mentis_proto::executor::Action {
            kind: Some(mentis_proto::executor::action::Kind::Shell(
                mentis_proto::executor::ShellAction {
                    command: "touch /workspace/pwned".into(),
                    ..Default::default()
                },
            )),
        }),
        env: Default::default(),
    };
    let err = exec.run(run.clone()).await.expect_err("no token, no run");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    let mut forged = tonic::Request::new(run);
    forged
        .metadata_mut()
        .insert("authorization", "Bearer not-the-token".parse()?);
    let err = exec.run(forged).await.expect_err("wrong token, no run");
    assert_eq!(err.code(), tonic::Code::Unauthenticated);
    assert_eq!(stdout(&h.sh(&sb.sandbox_id, "ls /workspace").await?), "");

    // User code cannot find the token: not in its env, nor in any process's /proc environ or cmdline
    // (tini, PID 1, was started without it), nor in the pipe that carried it to the executor.
    let env = inspect(&c, "{{json .Config.Env}}")?;
    let token = env
        .split('"')
        .find_map(|entry| entry.strip_prefix("MENTIS_EXECUTOR_TOKEN="))
        .expect("the container has a token")
        .to_owned();
    let search = h
        .sh(
            &sb.sandbox_id,
            "env; for f in /proc/[0-9]*/environ /proc/[0-9]*/cmdline; do tr '\\0' '\\n' < $f 2>/dev/null; \
             done; timeout 2 cat /proc/1/fd/3 2>/dev/null; cat /proc/1/environ >/dev/null 2>&1; \
             echo pid1-environ=$?",
        )
        .await?;
    let seen = stdout(&search);
    // tini's environment is not even readable (root's, see isolation.rs), and it lacks the token anyway
    // (exec `binary::launch_keeps_the_token_out_of_the_first_process_environment`).
    assert!(seen.ends_with("pid1-environ=1\n"), "{seen}");
    assert!(seen.contains("PATH="), "the search ran: {seen}");
    assert!(!seen.contains(&token), "user code found the token: {seen}");

    // Get reports it; List finds it by label.
    let got = h
        .sandboxes
        .get_sandbox(api::GetSandboxRequest {
            sandbox_id: sb.sandbox_id.clone(),
        })
        .await?
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(got.state, api::SandboxState::Running as i32);
    assert!(got.last_seq > 0);
    let listed = h
        .sandboxes
        .list_sandboxes(api::ListSandboxesRequest {
            labels: [("team".to_owned(), "e2e".to_owned())].into(),
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(listed.sandboxes.len(), 1);

    // Delete removes container and volume, and is idempotent.
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: sb.sandbox_id.clone(),
        })
        .await?;
    assert!(
        h.guard.containers().is_empty(),
        "container left: {:?}",
        h.guard.containers()
    );
    assert!(
        h.guard.volumes().is_empty(),
        "volume left: {:?}",
        h.guard.volumes()
    );
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: sb.sandbox_id.clone(),
        })
        .await?;
    let got = h
        .sandboxes
        .get_sandbox(api::GetSandboxRequest {
            sandbox_id: sb.sandbox_id.clone(),
        })
        .await?
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(got.state, api::SandboxState::Terminated as i32);
    h.stop().await
}

#[tokio::test]
async fn list_pages_through_sandboxes() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(h.create_default().await?.sandbox_id);
    }
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = h
            .sandboxes
            .list_sandboxes(api::ListSandboxesRequest {
                page_size: 2,
                page_token: token.clone(),
                ..Default::default()
            })
            .await?
            .into_inner();
        assert!(page.sandboxes.len() <= 2);
        seen.extend(page.sandboxes.into_iter().map(|s| s.sandbox_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    assert_eq!(seen, ids, "pages return every sandbox once, oldest first");
    h.stop().await
}

#[tokio::test]
async fn start_removes_labelled_containers_it_does_not_know() -> anyhow::Result<()> {
    // A sandbox left behind by an earlier run of this instance: container and volume.
    let first = Harness::start().await?;
    let instance = first.guard.instance.clone();
    let mut first = first;
    let sb = first.create_default().await?;
    let rt = first.runtime.take().unwrap();
    rt.stop().await?;
    assert_eq!(
        first.guard.containers().len(),
        1,
        "the stopped runtime leaves its sandbox"
    );

    let second = Harness::start_with(|c| c.docker.instance = instance.clone()).await?;
    assert!(
        second.guard.containers().is_empty(),
        "unknown container of {} not removed",
        sb.sandbox_id
    );
    assert!(
        second.guard.volumes().is_empty(),
        "unknown volume not removed"
    );
    drop(first);
    second.stop().await
}

/// An executor installer that an earlier process of this instance made and never ran (killed between the
/// engine's create and its start) goes at the next start; another instance's recent one is left to its own
/// runtime.
#[tokio::test]
async fn start_removes_the_installers_an_earlier_process_left() -> anyhow::Result<()> {
    let ours = Harness::new_instance();
    let theirs = Harness::new_instance();
    let made = |instance: &str| {
        docker(&[
            "create",
            "--label",
            "io.mentis.managed=true",
            "--label",
            "io.mentis.component=executor-installer",
            "--label",
            &format!("io.mentis.instance={instance}"),
            "--network",
            "none",
            &executor_image(),
        ])
    };
    made(&ours.instance)?;
    made(&theirs.instance)?;
    assert_eq!(ours.containers().len(), 1);
    let h = Harness::start_in(ours, |_| {}).await?;
    assert!(
        h.guard.containers().is_empty(),
        "the installer an earlier process left is still there: {:?}",
        h.guard.containers()
    );
    assert_eq!(theirs.containers().len(), 1, "another instance's was taken");
    h.stop().await
}

#[tokio::test]
async fn deleting_a_sandbox_ends_its_running_actions_with_one_lost_terminal() -> anyhow::Result<()>
{
    use futures::StreamExt;
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let mut stream = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: sb.sandbox_id.clone(),
            action: Some(shell_action(cmd("echo started; sleep 1000"))),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    // Wait until it runs (its output arrived), then delete the sandbox under it.
    let mut seen = Vec::new();
    while !stdout(&seen).contains("started") {
        let m = tokio::time::timeout(std::time::Duration::from_secs(30), stream.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("stream ended early"))??;
        if let Some(api::execute_response::Kind::Observation(o)) = m.kind {
            seen.push(o);
        }
    }
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: sb.sandbox_id.clone(),
        })
        .await?;
    seen.extend(collect(stream, std::time::Duration::from_secs(30)).await?);
    let end = cmd_end(&seen)?;
    assert_eq!(end.reason, api::EndReason::Lost as i32, "{end:?}");
    assert!(h.guard.containers().is_empty());
    h.stop().await
}
