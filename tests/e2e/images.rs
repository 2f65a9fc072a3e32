//! Any image as a sandbox (docs/ARCHITECTURE.md, "Any image"): images that know nothing of MentisSandbox
//! (tests/images/build.sh makes them from local material) run shell actions, files, limits and the
//! isolation checks as the default image does, with the executor brought in from `/.mentis`; IPython says
//! what an image lacks; an image that cannot run a sandbox fails CreateSandbox within seconds, with its
//! cause.

use std::time::{Duration, Instant};

use bytes::Bytes;
use mentis_e2e::*;
use mentis_proto::api;

use crate::files::{files, write};

/// What every image must do as the default one does; `shell` is the program that runs commands there.
async fn runs_like_the_default(
    h: &mut Harness,
    image: &str,
    shell: &str,
) -> anyhow::Result<String> {
    let sb = h
        .create(api::SandboxSpec {
            image: image.to_owned(),
            memory_limit_mb: 192,
            pids_limit: 96,
            ..Default::default()
        })
        .await?;
    assert_eq!(
        sb.state,
        api::SandboxState::Running as i32,
        "{image}: {sb:?}"
    );
    let id = sb.sandbox_id;

    // Shell actions: the shell the image has, as the sandbox user with no capability, in a workspace that
    // is the user's (the image has no /workspace: the engine made it root's, the launcher gave it away).
    let who = h
        .sh(
            &id,
            "readlink /proc/$$/exe; id -u; grep CapEff /proc/self/status; stat -c %u /workspace; pwd",
        )
        .await?;
    assert_eq!(
        stdout(&who),
        format!("{shell}\n1000\nCapEff:\t0000000000000000\n1000\n/workspace\n"),
        "{image}: {}",
        stderr(&who)
    );
    // A failing command is data; stdin, stderr and exit codes as anywhere.
    let end = cmd_end(&h.sh(&id, "echo oops >&2; exit 7").await?)?;
    assert_eq!(end.exit_code, 7, "{image}");

    // Files: written through the API, read by a command, and the other way round.
    let mut fs = files(h);
    write(
        &mut fs,
        &id,
        "notes/in.txt",
        vec![Bytes::from_static(b"from the API\n")],
    )
    .await?;
    assert_eq!(
        stdout(
            &h.sh(
                &id,
                "cat notes/in.txt; ls -ln notes | tail -n 1 | awk '{print $3}'"
            )
            .await?
        ),
        "from the API\n1000\n",
        "{image}"
    );
    h.sh(&id, "printf 'from sh' > out.txt").await?;
    let read = fs
        .read_file(api::ReadFileRequest {
            sandbox_id: id.clone(),
            path: "out.txt".to_owned(),
            offset: 0,
            length: 0,
        })
        .await?
        .into_inner()
        .message()
        .await?
        .map(|c| c.data)
        .unwrap_or_default();
    assert_eq!(&read[..], b"from sh", "{image}");

    // Limits: the container's cgroup (v2, or v1's controllers) says what the spec asked.
    assert_eq!(
        stdout(
            &h.sh(
                &id,
                "cd /sys/fs/cgroup; cat memory.max 2>/dev/null || cat memory/memory.limit_in_bytes; \
                 cat pids.max 2>/dev/null || cat pids/pids.max"
            )
            .await?
        ),
        format!("{}\n96\n", 192 * 1024 * 1024),
        "{image}"
    );

    // Isolation: user code cannot signal tini or the executor, nor touch the executor's files.
    let attempts = h
        .sh(
            &id,
            "kill -9 1 2>/dev/null || echo no-kill; kill -STOP $PPID 2>/dev/null || echo no-stop; \
             touch /.mentis/bin/x 2>/dev/null || echo no-write; \
             cp /bin/sh /.mentis/bin/tini 2>/dev/null || echo no-replace",
        )
        .await?;
    assert_eq!(
        stdout(&attempts),
        "no-kill\nno-stop\nno-write\nno-replace\n",
        "{image}"
    );

    // A session keeps its directory and variables (sh reads its commands by lines).
    let in_session = |command: &str| api::ShellAction {
        session: "s".to_owned(),
        ..cmd(command)
    };
    h.exec(&id, in_session("cd notes && GREETING=hi")).await?;
    assert_eq!(
        stdout(
            &h.exec(&id, in_session("pwd; echo $GREETING\necho two"))
                .await?
        ),
        "/workspace/notes\nhi\ntwo\n",
        "{image}"
    );

    // The health loop keeps it RUNNING.
    assert_eq!(h.get(&id).await?.state, api::SandboxState::Running as i32);
    Ok(id)
}

/// The reason a cell of this sandbox is aborted with.
async fn cell_refusal(h: &mut Harness, id: &str) -> anyhow::Result<String> {
    let obs = h.py(id, "1 + 1").await?;
    let result = ipython_result(&obs)?;
    assert_eq!(
        result.status,
        api::IpythonStatus::Aborted as i32,
        "{result:?}"
    );
    Ok(result.reason)
}

#[tokio::test]
async fn busybox_debian_and_python_images_run_sandboxes_and_say_what_ipython_lacks()
-> anyhow::Result<()> {
    test_images()?;
    let mut h = Harness::start().await?;

    // busybox only: sh is busybox's ash; no python at all.
    let id = runs_like_the_default(&mut h, "mentis-test/busybox:1", "/bin/busybox").await?;
    let reason = cell_refusal(&mut h, &id).await?;
    assert!(
        reason.contains("IPython cells need python3 with the ipykernel module, and this image has no python3 on its PATH: add it to the image"),
        "{reason}"
    );
    // The runtime's executor volume is the same for every image: read-only, ours.
    let c = container_of(&id);
    assert_eq!(inspect(&c, "{{.Config.Image}}")?, "mentis-test/busybox:1");

    // Debian without Python (and without our user and /workspace): bash runs commands.
    let id =
        runs_like_the_default(&mut h, "mentis-test/debian-no-python:1", "/usr/bin/bash").await?;
    let reason = cell_refusal(&mut h, &id).await?;
    assert!(reason.contains("has no python3 on its PATH"), "{reason}");
    // Shell actions still run after the refused cell.
    assert_eq!(stdout(&h.sh(&id, "echo still").await?), "still\n");

    // python3 without ipykernel: the cell ends at once and says what to install.
    let id =
        runs_like_the_default(&mut h, "mentis-test/python-no-ipykernel:1", "/usr/bin/bash").await?;
    let started = Instant::now();
    let reason = cell_refusal(&mut h, &id).await?;
    assert!(
        reason.contains(
            "IPython cells need python3 with the ipykernel module, and python3 has no ipykernel: add it \
             to the image (Debian, Ubuntu: apt-get install python3-ipykernel; elsewhere: pip install \
             ipykernel)"
        ),
        "{reason}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(
        stdout(&h.sh(&id, "python3 -c 'print(6 * 7)'").await?),
        "42\n"
    );
    h.stop().await
}

#[tokio::test]
async fn an_image_that_cannot_run_a_sandbox_fails_the_create_within_seconds_with_its_cause()
-> anyhow::Result<()> {
    test_images()?;
    // The ready timeout stays long: a fast failure must come from the cause, not from a timer.
    let mut h = Harness::start_with(|c| c.ready_timeout = Duration::from_secs(120)).await?;
    let cases = [
        (
            "mentis-test/not-here:1",
            "IMAGE_MISSING",
            "is not on this engine (there is no registry to pull from)",
        ),
        (
            "mentis-test/no-shell:1",
            "FAILED_PRECONDITION",
            "exited as it started (exit code 2), so it cannot run a sandbox: mentis-executor launch: this image \
             has no /bin/sh",
        ),
        (
            "mentis-test/arm64:1",
            "FAILED_PRECONDITION",
            "is built for arm64, and this engine runs amd64 containers",
        ),
    ];
    for (image, reason, says) in cases {
        let started = Instant::now();
        let r = h
            .sandboxes
            .create_sandbox(api::CreateSandboxRequest {
                spec: Some(api::SandboxSpec {
                    image: image.to_owned(),
                    ..Default::default()
                }),
            })
            .await;
        let elapsed = started.elapsed();
        let message = r
            .as_ref()
            .err()
            .map(|s| s.message().to_owned())
            .unwrap_or_default();
        assert_eq!(
            refusal(r),
            (tonic::Code::FailedPrecondition, reason.to_owned(), None),
            "{image}: {message}"
        );
        assert!(message.contains(says), "{image}: {message}");
        assert!(elapsed < Duration::from_secs(15), "{image}: {elapsed:?}");
    }
    // Nothing is left of them.
    assert!(
        h.guard.containers().is_empty(),
        "{:?}",
        h.guard.containers()
    );
    assert!(h.guard.volumes().is_empty(), "{:?}", h.guard.volumes());
    h.stop().await
}
