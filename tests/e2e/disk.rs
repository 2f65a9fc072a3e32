//! Disk limits (docs/ARCHITECTURE.md, Security model): each workspace is an ext4 filesystem of the sandbox's
//! disk limit on a loop device. A sandbox that writes past it gets ENOSPC (as data: in its command's end,
//! its cell's error, a file call's RESOURCE_EXHAUSTED) while it keeps answering, its neighbour writes on and
//! the runtime serves on; its loop device lives as long as its container's mount, the image is attached
//! again before the container starts, and removed with the sandbox.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use mentis_e2e::*;
use mentis_proto::api::{self, file_service_client::FileServiceClient};
use tonic::Code;

/// The volume of a sandbox's workspace.
fn volume_of(sandbox: &str) -> String {
    format!("mentis-ws-{sandbox}")
}

/// The disk image a workspace volume is labelled with.
fn image_of(sandbox: &str) -> anyhow::Result<PathBuf> {
    let image = docker(&[
        "volume",
        "inspect",
        "--format",
        "{{index .Labels \"io.mentis.disk-image\"}}",
        &volume_of(sandbox),
    ])?;
    Ok(PathBuf::from(image.trim()))
}

/// The loop devices whose backing file is `image`.
fn loops_of(image: &Path) -> Vec<String> {
    let image = image.to_string_lossy();
    loop_devices()
        .into_iter()
        .filter(|(_, file)| *file == image)
        .map(|(device, _)| device)
        .collect()
}

/// The size of /workspace's filesystem in KiB, as the sandbox sees it.
async fn workspace_kib(h: &mut Harness, sandbox: &str) -> anyhow::Result<u64> {
    let out = stdout(
        &h.sh(sandbox, "df -k --output=size /workspace | tail -1")
            .await?,
    );
    Ok(out.trim().parse()?)
}

async fn write_file(
    h: &Harness,
    sandbox: &str,
    path: &str,
    data: Bytes,
) -> Result<api::WriteFileResponse, tonic::Status> {
    let mut messages = vec![api::WriteFileRequest {
        kind: Some(api::write_file_request::Kind::Header(
            api::WriteFileHeader {
                sandbox_id: sandbox.to_owned(),
                path: path.to_owned(),
                mode: 0,
            },
        )),
    }];
    // Chunks of 256 KiB, far below the 4 MiB message limit.
    let mut data = data;
    while !data.is_empty() {
        let chunk = data.split_to(data.len().min(256 << 10));
        messages.push(api::WriteFileRequest {
            kind: Some(api::write_file_request::Kind::Data(chunk)),
        });
    }
    Ok(FileServiceClient::new(h.channel.clone())
        .write_file(futures::stream::iter(messages))
        .await?
        .into_inner())
}

#[tokio::test]
async fn a_sandbox_writing_past_its_disk_limit_gets_enospc_while_its_neighbour_and_the_runtime_keep_working()
-> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let small = h
        .create(api::SandboxSpec {
            disk_limit_mb: 64,
            memory_limit_mb: 256,
            ..Default::default()
        })
        .await?;
    let id = small.sandbox_id.clone();
    assert_eq!(small.disk_limit_mb, 64);
    assert_eq!(h.get(&id).await?.disk_limit_mb, 64);
    let neighbour = h.create_default().await?;
    assert_eq!(neighbour.disk_limit_mb, 4096);
    let other = neighbour.sandbox_id.clone();

    // The workspace is a filesystem of its own, of the limit's size (less ext4's own metadata), and
    // belongs to the sandbox user.
    assert_eq!(
        docker(&[
            "volume",
            "inspect",
            "--format",
            "{{.Options.type}}",
            &volume_of(&id)
        ])?
        .trim(),
        "ext4"
    );
    let kib = workspace_kib(&mut h, &id).await?;
    assert!((40 * 1024..=64 * 1024).contains(&kib), "{kib} KiB");
    assert_eq!(
        stdout(
            &h.sh(&id, "stat -c %u /workspace; ls -A /workspace | wc -l")
                .await?
        ),
        "1000\n0\n"
    );
    let image = image_of(&id)?;
    assert_eq!(loops_of(&image).len(), 1, "{image:?}");
    h.py(&id, "x = 41").await?;

    // Past the limit: ENOSPC for the command, as data.
    let fill = h
        .sh(&id, "dd if=/dev/zero of=/workspace/fill bs=1M count=200")
        .await?;
    let end = cmd_end(&fill)?;
    assert_eq!(end.reason, api::EndReason::Exited as i32, "{end:?}");
    assert_ne!(end.exit_code, 0, "{end:?}");
    assert!(
        stderr(&fill).contains("No space left on device"),
        "{}",
        stderr(&fill)
    );
    // From Python too: the cell raises OSError 28 and the kernel keeps its state.
    let cell = h
        .py(&id, "open('/workspace/more', 'wb').write(b'x' * (8 << 20))")
        .await?;
    let result = ipython_result(&cell)?;
    assert_eq!(
        result.status,
        api::IpythonStatus::Error as i32,
        "{result:?}"
    );
    assert!(
        result.error_value.contains("No space left on device"),
        "{result:?}"
    );
    // And a file call: RESOURCE_EXHAUSTED, nothing left behind.
    let written = write_file(&h, &id, "via-api", Bytes::from(vec![7u8; 4 << 20])).await;
    let status = written.expect_err("a write to a full workspace");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(status.message().contains("no space left"), "{status:?}");

    // The sandbox keeps answering: the next command and the next cell run.
    assert_eq!(stdout(&h.sh(&id, "echo still here").await?), "still here\n");
    let cell = h.py(&id, "x += 1\nprint(x)").await?;
    assert_eq!(cell_stdout(&cell), "42\n", "{cell:?}");
    assert_eq!(h.get(&id).await?.state, api::SandboxState::Running as i32);
    // Its neighbour writes more than the whole limit, and the runtime serves.
    let big = h
        .sh(
            &other,
            "head -c 100M /dev/zero > /workspace/big && stat -c %s /workspace/big",
        )
        .await?;
    assert_eq!(stdout(&big), format!("{}\n", 100 << 20), "{}", stderr(&big));
    let listed = h
        .sandboxes
        .list_sandboxes(api::ListSandboxesRequest::default())
        .await?
        .into_inner();
    assert_eq!(listed.sandboxes.len(), 2);

    // The host's disk holds what was written, not more; removing the file gives the room back.
    let used = std::fs::metadata(&image)?;
    assert!(
        std::os::unix::fs::MetadataExt::blocks(&used) * 512 <= 68 << 20,
        "the image takes {} bytes",
        std::os::unix::fs::MetadataExt::blocks(&used) * 512
    );
    let again = h
        .sh(
            &id,
            "rm /workspace/fill && head -c 10M /dev/zero > /workspace/again && echo room",
        )
        .await?;
    assert_eq!(stdout(&again), "room\n", "{}", stderr(&again));

    // /tmp (the default read-only root's tmpfs, half the memory limit) fills the same way.
    let tmp = h.sh(&id, "head -c 400M /dev/zero > /tmp/fill").await?;
    assert_ne!(cmd_end(&tmp)?.exit_code, 0);
    assert!(
        stderr(&tmp).contains("No space left on device"),
        "{}",
        stderr(&tmp)
    );
    assert_eq!(stdout(&h.sh(&id, "rm /tmp/fill; echo ok").await?), "ok\n");
    assert_eq!(cell_stdout(&h.py(&id, "print(x)").await?), "42\n");

    // Deleted: the volume, the loop device and the image go.
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    assert!(!h.guard.volumes().contains(&volume_of(&id)));
    assert!(loops_of(&image).is_empty(), "{:?}", loops_of(&image));
    assert!(!image.exists(), "{image:?}");
    h.stop().await
}

#[tokio::test]
async fn disk_limits_follow_the_space_and_the_runtime_and_out_of_range_is_invalid()
-> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| {
        c.limits.default.disk_mb = 256;
        c.limits.max.disk_mb = 1024;
    })
    .await?;
    let space = |id: &str, default: i64, max: i64| api::CreateSpaceRequest {
        space: Some(api::Space {
            space_id: id.into(),
            limits: Some(api::SpaceLimits {
                sandbox_default: Some(api::SandboxLimits {
                    disk_mb: default,
                    ..Default::default()
                }),
                sandbox_max: Some(api::SandboxLimits {
                    disk_mb: max,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    };
    // Above the runtime's maximum: refused.
    assert_eq!(
        code(h.spaces.create_space(space("greedy", 0, 2048)).await),
        Code::InvalidArgument
    );
    h.spaces.create_space(space("small", 32, 128)).await?;
    for (spec, want) in [
        (api::SandboxSpec::default(), Ok(256)),
        (
            api::SandboxSpec {
                disk_limit_mb: 1024,
                ..Default::default()
            },
            Ok(1024),
        ),
        (
            api::SandboxSpec {
                space_id: "small".into(),
                ..Default::default()
            },
            Ok(32),
        ),
        (
            api::SandboxSpec {
                disk_limit_mb: 2048,
                ..Default::default()
            },
            Err("..=1024"),
        ),
        (
            api::SandboxSpec {
                disk_limit_mb: 8,
                ..Default::default()
            },
            Err("16..="),
        ),
        (
            api::SandboxSpec {
                space_id: "small".into(),
                disk_limit_mb: 256,
                ..Default::default()
            },
            Err("..=128"),
        ),
    ] {
        match want {
            Ok(mb) => {
                let sb = h.create(spec).await?;
                assert_eq!(sb.disk_limit_mb, mb);
                let kib = workspace_kib(&mut h, &sb.sandbox_id).await?;
                assert!(
                    kib * 100 / 1024 >= mb as u64 * 75 && kib <= mb as u64 * 1024,
                    "{mb}: {kib}"
                );
            }
            Err(says) => {
                let status = h
                    .sandboxes
                    .create_sandbox(api::CreateSandboxRequest { spec: Some(spec) })
                    .await
                    .expect_err(says);
                assert_eq!(status.code(), Code::InvalidArgument);
                assert!(status.message().contains("disk_limit_mb"), "{status:?}");
                assert!(status.message().contains(says), "{status:?}");
            }
        }
    }
    h.stop().await
}

#[tokio::test]
async fn with_disk_limits_off_workspaces_are_plain_volumes_and_no_limit_is_claimed()
-> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| {
        c.disk_limits = mentis_runtime::config::DiskLimits::Off;
    })
    .await?;
    let sb = h.create_default().await?;
    assert_eq!(sb.disk_limit_mb, 0);
    assert_eq!(
        docker(&[
            "volume",
            "inspect",
            "--format",
            "{{.Options}}",
            &volume_of(&sb.sandbox_id)
        ])?
        .trim(),
        "map[]"
    );
    let status = h
        .sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec {
                disk_limit_mb: 64,
                ..Default::default()
            }),
        })
        .await
        .expect_err("a limit nothing would enforce");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(
        status.message().contains("MENTIS_DISK_LIMITS=off"),
        "{status:?}"
    );
    h.stop().await
}

/// Whether the kernel frees `device` with its last user (its autoclear flag).
fn autoclear(device: &str) -> bool {
    let name = device.trim_start_matches("/dev/");
    std::fs::read_to_string(format!("/sys/block/{name}/loop/autoclear"))
        .is_ok_and(|v| v.trim() == "1")
}

/// Waits up to 10 s for no loop device to back `image`; the devices left.
async fn loops_gone(image: &Path) -> Vec<String> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !loops_of(image).is_empty() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    loops_of(image)
}

/// Issue 40, finding 9: loop devices are a finite host resource, and a workspace's stayed attached after its
/// container was gone when the runtime did not remove it itself (a runtime container and its engine going
/// down in the Compose walk-throughs stranded three, attached to deleted images). A workspace's device now
/// lives only as long as its container's mount, whoever stops the container. After a stop the number may
/// belong to another image (as after a host reboot): the runtime attaches the image again before the
/// container starts and moves the link its volume mounts, so the sandbox finds its own files; a volume
/// removed behind the runtime's back leaves neither a device nor, at the next start, an image.
#[tokio::test]
async fn a_workspace_holds_a_loop_device_only_while_its_container_runs_and_gets_its_own_again()
-> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let mut first = RuntimeProcess::start(bin, &instance, data_dir.path()).await?;
    let mut h = first.harness(data_dir, guard).await?;
    let id = h
        .create(api::SandboxSpec {
            disk_limit_mb: 64,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    h.sh(&id, "echo kept > /workspace/file").await?;
    let image = image_of(&id)?;
    let device = loops_of(&image).pop().expect("attached");
    assert!(
        autoclear(&device),
        "{device} is freed with its container's mount"
    );

    // The runtime is killed and the container stopped behind its back (an engine going down, a host
    // reboot): the device goes with the container, and another image takes its number.
    first.kill();
    docker(&["stop", "-t", "0", &container_of(&id)])?;
    let left = loops_gone(&image).await;
    assert!(left.is_empty(), "the stopped container stranded {left:?}");
    let decoy_dir = tempfile::tempdir()?;
    let decoy = decoy_dir.path().join("decoy.ext4");
    let content = decoy_dir.path().join("content");
    std::fs::create_dir(&content)?;
    std::fs::write(content.join("decoy"), "not yours\n")?;
    std::fs::File::create(&decoy)?.set_len(16 << 20)?;
    let made = std::process::Command::new("mkfs.ext4")
        .args(["-q", "-F", "-d"])
        .arg(&content)
        .arg(&decoy)
        .status()?;
    assert!(made.success());
    let decoy_attached = std::process::Command::new("losetup")
        .arg(&device)
        .arg(&decoy)
        .status()?
        .success();

    let Harness {
        data_dir, guard, ..
    } = h;
    let mut second = RuntimeProcess::start(bin, &instance, data_dir.path()).await?;
    let mut h = second.harness(data_dir, guard).await?;
    let sb = h
        .wait_state(&id, api::SandboxState::Running, Duration::from_secs(60))
        .await?;
    assert_eq!(sb.disk_limit_mb, 64);
    assert_eq!(
        stdout(&h.sh(&id, "cat /workspace/file; ls /workspace").await?),
        "kept\nfile\n"
    );
    let kib = workspace_kib(&mut h, &id).await?;
    assert!(kib <= 64 * 1024, "{kib}");
    let now = loops_of(&image);
    assert_eq!(now.len(), 1, "{now:?}");
    if decoy_attached {
        assert_ne!(now[0], device, "the decoy holds {device}");
        let _ = std::process::Command::new("losetup")
            .args(["-d", &device])
            .status();
    }
    assert!(autoclear(&now[0]), "{now:?}");

    // The runtime is killed again and its sandbox removed by hand (what the Compose walk-through's
    // clean-up does): no device is left, and the next start removes the image.
    second.kill();
    docker(&["rm", "-f", "-v", &container_of(&id)])?;
    docker(&["volume", "rm", "-f", &volume_of(&id)])?;
    let left = loops_gone(&image).await;
    assert!(left.is_empty(), "the removed container stranded {left:?}");
    assert!(image.exists(), "nothing removed the image yet");
    let Harness {
        data_dir, guard, ..
    } = h;
    let third = RuntimeProcess::start(bin, &instance, data_dir.path()).await?;
    let h = third.harness(data_dir, guard).await?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while image.exists() && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        !image.exists(),
        "the start removes an image whose volume is gone: {image:?}"
    );
    h.stop().await
}

/// Issue 40, finding 9: a disk limit larger than the host's free space was accepted (a limit that could
/// never be honoured). It is FAILED_PRECONDITION, saying how much is free, and leaves nothing.
#[tokio::test]
async fn a_disk_limit_beyond_the_hosts_free_space_is_refused_and_leaves_nothing()
-> anyhow::Result<()> {
    // 64 TiB allowed by the runtime's policy: more than any host here has free.
    let mut h = Harness::start_with(|c| c.limits.max.disk_mb = 64 * 1024 * 1024).await?;
    let refused = h
        .sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec {
                disk_limit_mb: 64 * 1024 * 1024,
                ..Default::default()
            }),
        })
        .await
        .expect_err("more than is free");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("free"), "{refused:?}");
    assert!(
        h.guard.containers().is_empty(),
        "{:?}",
        h.guard.containers()
    );
    assert!(h.guard.volumes().is_empty(), "{:?}", h.guard.volumes());
    // A limit that fits still works.
    h.create_default().await?;
    h.stop().await
}
