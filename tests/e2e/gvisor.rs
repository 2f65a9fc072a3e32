//! gVisor: with `MENTIS_CONTAINER_RUNTIME=runsc` sandboxes run under runsc (a user-space kernel between user
//! code and the host) and work as usual: shell, IPython with state across cells, network isolation, the
//! disk limit, deletion that leaves nothing behind. The tests install and register Debian's runsc themselves
//! (`deploy/ensure-runsc.sh`) and fail, never skip, when that is impossible.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use mentis_e2e::*;
use mentis_proto::api;
use mentis_proto::api::sandbox_service_client::SandboxServiceClient;
use mentis_runtime::RuntimeConfig;
use mentis_runtime::config::{ContainerRuntime, PoolConfig};

/// Runs `deploy/ensure-runsc.sh` once per test process (it edits the engine's config and reloads it).
pub(crate) fn ensure_runsc() -> anyhow::Result<()> {
    static DONE: OnceLock<Result<(), String>> = OnceLock::new();
    DONE.get_or_init(|| {
        run_script(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../deploy/ensure-runsc.sh"
        ))
    })
    .clone()
    .map_err(|e| anyhow::anyhow!("gVisor cannot be set up on this machine: {e}"))
}

/// Checks that the sandbox's container runs under runsc, from the outside and from the inside.
async fn assert_under_gvisor(h: &mut Harness, sandbox: &str) -> anyhow::Result<()> {
    let container = container_of(sandbox);
    assert_eq!(inspect(&container, "{{.HostConfig.Runtime}}")?, "runsc");
    // gVisor's kernel introduces itself in its own log, which runc containers never show.
    let dmesg = stdout(&h.sh(sandbox, "dmesg 2>&1 | head -n 3").await?);
    assert!(dmesg.contains("Starting gVisor"), "dmesg: {dmesg:?}");
    Ok(())
}

#[tokio::test]
async fn gvisor_sandboxes_run_shell_and_ipython() -> anyhow::Result<()> {
    ensure_runsc()?;
    // The setting as an operator writes it (in-process, so that runtimes of this test binary never race
    // each other into creating the networks twice).
    let runtime = RuntimeConfig::from_lookup(|k| {
        (k == "MENTIS_CONTAINER_RUNTIME").then(|| "runsc".to_owned())
    })?
    .docker
    .runtime;
    let mut h = Harness::start_with(|c| c.docker.runtime = runtime).await?;

    let started = Instant::now();
    let id = h.create_default().await?.sandbox_id;
    let created_in = started.elapsed();
    assert_under_gvisor(&mut h, &id).await?;

    // Shell: output, exit code, the usual user and workspace.
    let started = Instant::now();
    let obs = h.sh(&id, "echo hello from gvisor").await?;
    let shell_round_trip = started.elapsed();
    assert_eq!(stdout(&obs), "hello from gvisor\n");
    assert_eq!(cmd_end(&obs)?.exit_code, 0);
    let obs = h
        .sh(&id, "id -u; pwd; echo data > f.txt; cat f.txt; exit 3")
        .await?;
    assert_eq!(stdout(&obs), "1000\n/workspace\ndata\n");
    assert_eq!(cmd_end(&obs)?.exit_code, 3);
    // The executor apart from user code under gVisor too (see isolation.rs): its ids, and a refused signal.
    let obs = h
        .sh(
            &id,
            "grep -h '^Uid:' /proc/self/status /proc/$PPID/status | tr -s '\\t ' ' '; \
             kill -STOP $PPID 2>/dev/null; echo stop=$?",
        )
        .await?;
    assert_eq!(
        stdout(&obs),
        "Uid: 1000 1000 1000 1000\nUid: 0 1000 0 1000\nstop=1\n"
    );

    // IPython: a real kernel under gVisor, with state kept from one cell to the next.
    let started = Instant::now();
    let first = h.py(&id, "x = 20 + 1\nprint('ready')").await?;
    let first_cell = started.elapsed();
    assert_eq!(
        ipython_result(&first)?.status,
        api::IpythonStatus::Ok as i32,
        "{first:?}"
    );
    assert_eq!(cell_stdout(&first), "ready\n");
    let second = h.py(&id, "x * 2").await?;
    assert_eq!(
        ipython_result(&second)?.status,
        api::IpythonStatus::Ok as i32
    );
    assert_eq!(cell_value(&second).as_deref(), Some("42"));
    // Files written by the kernel are seen by the shell: one workspace.
    h.py(&id, "open('from_py.txt', 'w').write('py')").await?;
    assert_eq!(stdout(&h.sh(&id, "cat from_py.txt").await?), "py");

    // A timeout still kills the command under gVisor.
    let slow = h
        .exec(
            &id,
            api::ShellAction {
                command: "sleep 30".into(),
                timeout_seconds: 1,
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(cmd_end(&slow)?.reason, api::EndReason::TimedOut as i32);

    // The disk limit holds under gVisor too: the workspace is the same ext4 filesystem of its own.
    let bounded = h
        .create(api::SandboxSpec {
            disk_limit_mb: 32,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    let fill = h
        .sh(&bounded, "head -c 64M /dev/zero > /workspace/fill")
        .await?;
    assert_ne!(cmd_end(&fill)?.exit_code, 0);
    let stderr = String::from_utf8_lossy(&output(&fill, api::OutputStream::Stderr)).into_owned();
    assert!(stderr.contains("No space left on device"), "{stderr}");
    assert_eq!(stdout(&h.sh(&bounded, "echo ok").await?), "ok\n");
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: bounded,
        })
        .await?;

    eprintln!(
        "gvisor: create {created_in:?}, first shell round trip {shell_round_trip:?}, first cell \
         (kernel start) {first_cell:?}"
    );

    // Delete: container and workspace volume are gone.
    let container = container_of(&id);
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !(h.guard.containers().is_empty() && h.guard.volumes().is_empty()) {
        if Instant::now() > deadline {
            bail!(
                "left behind after delete: containers {:?}, volumes {:?}",
                h.guard.containers(),
                h.guard.volumes()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(docker(&["inspect", &container]).is_err());
    h.stop().await
}

#[tokio::test]
async fn gvisor_sandboxes_keep_network_isolation_and_egress_is_opt_in() -> anyhow::Result<()> {
    ensure_runsc()?;
    let mut h = Harness::start_with(|c| c.docker.runtime = ContainerRuntime::Runsc).await?;
    crate::isolation::check_network_isolation(&mut h)
        .await
        .context("network isolation under gVisor")?;
    // Every sandbox the checks made ran under gVisor.
    let containers = h.guard.containers();
    assert!(containers.len() >= 3, "{containers:?}");
    for c in &containers {
        assert_eq!(inspect(c, "{{.HostConfig.Runtime}}")?, "runsc", "{c}");
    }
    h.stop().await
}

#[tokio::test]
async fn gvisor_pool_members_serve_default_limits_and_other_limits_start_cold() -> anyhow::Result<()>
{
    ensure_runsc()?;
    let mut h = Harness::start_with(|c| {
        c.docker.runtime = ContainerRuntime::Runsc;
        c.pools = vec![PoolConfig {
            image: executor_image(),
            min_idle: 1,
            max_total: 2,
            kernel: false,
        }];
    })
    .await?;
    let is_member = |id: &str| {
        inspect(
            &container_of(id),
            "{{index .Config.Labels \"io.mentis.pool\"}}",
        )
    };
    h.wait_pool_idle("", 1, Duration::from_secs(90)).await?;

    // runsc cannot change a running container's limits, so a member cannot take these on: a cold create.
    let custom = h
        .create(api::SandboxSpec {
            memory_limit_mb: 512,
            ..Default::default()
        })
        .await?;
    assert_eq!(
        custom.state,
        api::SandboxState::Running as i32,
        "{custom:?}"
    );
    assert_ne!(is_member(&custom.sandbox_id)?, "true");
    assert_eq!(
        inspect(&container_of(&custom.sandbox_id), "{{.HostConfig.Memory}}")?,
        (512 * 1024 * 1024).to_string()
    );
    assert_eq!(
        stdout(&h.sh(&custom.sandbox_id, "echo cold").await?),
        "cold\n"
    );

    // Default limits: served warm by a gVisor member.
    let warm = h.create_default().await?;
    assert_eq!(is_member(&warm.sandbox_id)?, "true");
    assert_eq!(
        inspect(&container_of(&warm.sandbox_id), "{{.HostConfig.Runtime}}")?,
        "runsc"
    );
    assert_eq!(
        stdout(&h.sh(&warm.sandbox_id, "echo warm").await?),
        "warm\n"
    );
    h.stop().await
}

/// A template, with `runtime_class` and a pool of `pool_size`.
fn class_template(space: &str, name: &str, class: &str, pool_size: u32) -> api::Template {
    api::Template {
        space_id: space.to_owned(),
        name: name.to_owned(),
        runtime_class: class.to_owned(),
        pool_size,
        ..Default::default()
    }
}

/// The engine runtime of the sandbox's container, and the class GetSandbox reports.
async fn runtime_of(h: &mut Harness, sandbox: &str) -> anyhow::Result<(String, String)> {
    let reported = h
        .sandboxes
        .get_sandbox(api::GetSandboxRequest {
            sandbox_id: sandbox.to_owned(),
        })
        .await?
        .into_inner()
        .sandbox
        .context("no sandbox")?
        .runtime_class;
    Ok((
        inspect(&container_of(sandbox), "{{.HostConfig.Runtime}}")?,
        reported,
    ))
}

#[tokio::test]
async fn a_template_or_a_space_runs_its_sandboxes_under_gvisor_while_the_default_stays_runc()
-> anyhow::Result<()> {
    use mentis_proto::api::key_service_client::KeyServiceClient;
    use mentis_proto::api::template_service_client::TemplateServiceClient;
    ensure_runsc()?;
    // The operator offers runsc to templates and spaces; the runtime's default stays runc.
    let offered = RuntimeConfig::from_lookup(|k| {
        (k == "MENTIS_RUNTIME_CLASSES").then(|| "runsc".to_owned())
    })?
    .runtime_classes;
    let mut h = Harness::start_with(|c| c.runtime_classes = offered).await?;
    let mut templates = TemplateServiceClient::new(h.channel.clone());

    // The default: runc, and no class reported.
    let plain = h.create_default().await?.sandbox_id;
    assert_eq!(
        runtime_of(&mut h, &plain).await?,
        ("runc".into(), String::new())
    );

    // A template that names runsc (the admin sets it): its sandboxes run under gVisor.
    templates
        .create_template(api::CreateTemplateRequest {
            template: Some(class_template("", "boxed", "runsc", 0)),
        })
        .await?;
    let boxed = h
        .create(api::SandboxSpec {
            template: "boxed".into(),
            ..Default::default()
        })
        .await?
        .sandbox_id;
    assert_eq!(
        runtime_of(&mut h, &boxed).await?,
        ("runsc".into(), "runsc".into())
    );
    assert_under_gvisor(&mut h, &boxed).await?;
    assert_eq!(stdout(&h.sh(&boxed, "echo boxed").await?), "boxed\n");

    // A space that names runsc: every sandbox of it whose template names none.
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "untrusted".into(),
                runtime_class: "runsc".into(),
                ..Default::default()
            }),
        })
        .await?;
    let in_space = h
        .create(api::SandboxSpec {
            space_id: "untrusted".into(),
            ..Default::default()
        })
        .await?
        .sandbox_id;
    assert_eq!(
        runtime_of(&mut h, &in_space).await?,
        ("runsc".into(), "runsc".into())
    );

    // A class the runtime does not offer: INVALID_ARGUMENT naming the field and what is offered.
    let (code, _, field) = refusal(
        templates
            .create_template(api::CreateTemplateRequest {
                template: Some(class_template("", "kata", "kata", 0)),
            })
            .await,
    );
    assert_eq!(
        (code, field.as_deref()),
        (tonic::Code::InvalidArgument, Some("template.runtime_class"))
    );
    let (code, _, field) = refusal(
        h.spaces
            .update_space(api::UpdateSpaceRequest {
                space: Some(api::Space {
                    space_id: "untrusted".into(),
                    runtime_class: "runc".into(),
                    ..Default::default()
                }),
                update_mask: Some(prost_types::FieldMask {
                    paths: vec!["runtime_class".into()],
                }),
            })
            .await,
    );
    assert_eq!(
        (code, field.as_deref()),
        (tonic::Code::InvalidArgument, Some("space.runtime_class"))
    );

    // A key of the space cannot choose its own boundary: setting or changing a template's class is the
    // admin's (PERMISSION_DENIED, ADMIN_REQUIRED); a template that names none gets the space's.
    let key = KeyServiceClient::new(h.channel.clone())
        .create_api_key(api::CreateApiKeyRequest {
            name: "agent of untrusted".into(),
            space_ids: vec!["untrusted".into()],
        })
        .await?
        .into_inner()
        .secret;
    let mut tenant = TemplateServiceClient::new(h.with_key(Some(&key)));
    let denied = tenant
        .create_template(api::CreateTemplateRequest {
            template: Some(class_template("untrusted", "mine", "runsc", 0)),
        })
        .await;
    let message = denied.as_ref().err().map(|s| s.message().to_owned());
    let (code, reason, _) = refusal(denied);
    assert_eq!(
        (code, reason.as_str()),
        (tonic::Code::PermissionDenied, "ADMIN_REQUIRED")
    );
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("runtime_class")),
        "{message:?}"
    );
    tenant
        .create_template(api::CreateTemplateRequest {
            template: Some(class_template("untrusted", "mine", "", 1)),
        })
        .await?;
    // An update of every field that keeps the class is the tenant's to make.
    tenant
        .update_template(api::UpdateTemplateRequest {
            template: Some(api::Template {
                description: "mine".into(),
                ..class_template("untrusted", "mine", "", 1)
            }),
            update_mask: None,
        })
        .await?;

    // Its pool's members were made under the space's class, and a claim takes one.
    h.wait_pool_idle("mine", 1, Duration::from_secs(90)).await?;
    let claimed = SandboxServiceClient::new(h.with_key(Some(&key)))
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec {
                space_id: "untrusted".into(),
                template: "mine".into(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner()
        .sandbox
        .context("no sandbox")?
        .sandbox_id;
    assert_eq!(
        inspect(
            &container_of(&claimed),
            "{{index .Config.Labels \"io.mentis.pool\"}}"
        )?,
        "true",
        "the sandbox is a claimed pool member"
    );
    assert_eq!(
        runtime_of(&mut h, &claimed).await?,
        ("runsc".into(), "runsc".into())
    );
    h.stop().await
}

#[tokio::test]
async fn a_runtime_offering_a_class_its_engine_lacks_does_not_start() -> anyhow::Result<()> {
    let offered = RuntimeConfig::from_lookup(|k| {
        (k == "MENTIS_RUNTIME_CLASSES").then(|| "youki".to_owned())
    })?
    .runtime_classes;
    let Err(e) = Harness::start_with(|c| c.runtime_classes = offered).await else {
        bail!("the runtime started with a class its engine does not have");
    };
    let text = format!("{e:#}");
    assert!(
        text.contains("MENTIS_RUNTIME_CLASSES offers youki") && text.contains("no runtime youki"),
        "{text}"
    );
    Ok(())
}
