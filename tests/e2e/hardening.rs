//! Per-runtime and per-space sandbox settings: a space narrows the runtime's limits (a spec above its
//! maximum is InvalidArgument), sets defaults (open files, read-only root), and the container really gets
//! them: the nofile ulimit, a read-only root with a writable /workspace and /tmp, IPython still working.

use mentis_e2e::*;
use mentis_proto::api;
use tonic::Code;

fn limits(memory_mb: i64, nofile: i64) -> api::SandboxLimits {
    api::SandboxLimits {
        memory_mb,
        nofile,
        ..Default::default()
    }
}

#[tokio::test]
async fn a_space_bounds_its_sandboxes_and_they_get_a_read_only_root_and_ulimits()
-> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    // Above the runtime's maxima (64 GiB): refused.
    let too_big = h
        .spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "greedy".into(),
                limits: Some(api::SpaceLimits {
                    sandbox_max: Some(limits(1 << 20, 0)),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await;
    assert_eq!(code(too_big), Code::InvalidArgument);
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "locked".into(),
                limits: Some(api::SpaceLimits {
                    sandbox_default: Some(limits(0, 256)),
                    sandbox_max: Some(limits(512, 0)),
                    root_filesystem: api::RootFilesystem::ReadOnly as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
        })
        .await?;
    let in_locked = |memory_limit_mb: i64, root: api::RootFilesystem| api::SandboxSpec {
        space_id: "locked".into(),
        memory_limit_mb,
        root_filesystem: root as i32,
        ..Default::default()
    };

    // More than the space allows: InvalidArgument, and it says the maximum.
    let r = h
        .sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(in_locked(1024, api::RootFilesystem::Unspecified)),
        })
        .await;
    let status = r.expect_err("above the space's maximum");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("512"), "{}", status.message());

    // The space's defaults: memory lowered to its maximum, 256 open files, a read-only root.
    let sb = h
        .create(in_locked(0, api::RootFilesystem::Unspecified))
        .await?;
    assert_eq!(
        (sb.memory_limit_mb, sb.nofile_limit, sb.root_filesystem),
        (512, 256, api::RootFilesystem::ReadOnly as i32)
    );
    let id = sb.sandbox_id.clone();
    let c = container_of(&id);
    assert_eq!(inspect(&c, "{{.HostConfig.ReadonlyRootfs}}")?, "true");
    assert_eq!(
        inspect(&c, "{{.HostConfig.Memory}}")?,
        (512i64 << 20).to_string()
    );

    let obs = h
        .sh(
            &id,
            "ulimit -n; ulimit -Hn; touch /usr/x 2>&1; touch /workspace/w /tmp/t && echo writable; echo $HOME",
        )
        .await?;
    assert_eq!(cmd_end(&obs)?.exit_code, 0);
    let out = stdout(&obs);
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[..2], ["256", "256"], "{out}");
    assert!(lines[2].contains("Read-only file system"), "{out}");
    assert_eq!(lines[3..], ["writable", "/tmp"], "{out}");
    // IPython works with a read-only root (its profile lives under HOME=/tmp).
    h.py(&id, "x = 6 * 7").await?;
    let obs = h.py(&id, "x").await?;
    assert_eq!(cell_value(&obs).as_deref(), Some("42"));

    // A spec may override the space's default root filesystem and ask for what is within the maxima.
    let sb = h
        .create(api::SandboxSpec {
            nofile_limit: 4096,
            ..in_locked(256, api::RootFilesystem::Writable)
        })
        .await?;
    assert_eq!(
        (sb.memory_limit_mb, sb.nofile_limit, sb.root_filesystem),
        (256, 4096, api::RootFilesystem::Writable as i32)
    );
    let obs = h
        .sh(
            &sb.sandbox_id,
            "ulimit -n; touch /home/sandbox/x && echo writable",
        )
        .await?;
    assert_eq!(stdout(&obs), "4096\nwritable\n");

    // The default space keeps the runtime's defaults: 1024 open files, a read-only root (a writable one
    // would lie outside the disk limit).
    let sb = h.create_default().await?;
    assert_eq!(
        (sb.nofile_limit, sb.root_filesystem),
        (1024, api::RootFilesystem::ReadOnly as i32)
    );
    assert_eq!(
        inspect(
            &container_of(&sb.sandbox_id),
            "{{.HostConfig.ReadonlyRootfs}}"
        )?,
        "true"
    );
    h.stop().await
}
