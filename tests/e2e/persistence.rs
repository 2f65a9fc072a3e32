//! Sandbox lifecycle beyond create and delete: pause and resume, idle expiry, get-or-create by key, and a
//! control plane that is killed and started again.

use std::time::Duration;

use mentis_e2e::*;
use mentis_proto::api;
use tonic::Code;

async fn pause(h: &mut Harness, id: &str) -> anyhow::Result<api::Sandbox> {
    Ok(h.sandboxes
        .pause_sandbox(api::PauseSandboxRequest {
            sandbox_id: id.to_owned(),
        })
        .await?
        .into_inner()
        .sandbox
        .unwrap())
}

async fn resume(h: &mut Harness, id: &str) -> anyhow::Result<api::Sandbox> {
    Ok(h.sandboxes
        .resume_sandbox(api::ResumeSandboxRequest {
            sandbox_id: id.to_owned(),
        })
        .await?
        .into_inner()
        .sandbox
        .unwrap())
}

#[tokio::test]
async fn pause_then_resume_keeps_files_and_kernel_state() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let id = h.create_default().await?.sandbox_id;
    h.sh(&id, "echo kept > /workspace/f").await?;
    assert_eq!(ipython_result(&h.py(&id, "x = 41").await?)?.status, 1);

    let paused = pause(&mut h, &id).await?;
    assert_eq!(paused.state, api::SandboxState::Paused as i32);
    assert_eq!(inspect(&container_of(&id), "{{.State.Status}}")?, "paused");
    // Idempotent; actions are refused while paused.
    assert_eq!(
        pause(&mut h, &id).await?.state,
        api::SandboxState::Paused as i32
    );
    let r = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.clone(),
            action: Some(shell_action(cmd("true"))),
            action_id: String::new(),
        })
        .await;
    assert_eq!(code(r), Code::FailedPrecondition);

    let resumed = resume(&mut h, &id).await?;
    assert_eq!(resumed.state, api::SandboxState::Running as i32);
    assert_eq!(stdout(&h.sh(&id, "cat /workspace/f").await?), "kept\n");
    assert_eq!(
        cell_value(&h.py(&id, "x + 1").await?).as_deref(),
        Some("42")
    );

    // A running action makes pause a FailedPrecondition (its stream would not survive the freeze).
    let mut long = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.clone(),
            action: Some(shell_action(cmd("sleep 30"))),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let _accepted = futures::StreamExt::next(&mut long).await;
    let r = h
        .sandboxes
        .pause_sandbox(api::PauseSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await;
    assert_eq!(code(r), Code::FailedPrecondition);

    // auto_resume: an action on a paused sandbox resumes it.
    let auto = h
        .create(api::SandboxSpec {
            auto_resume: true,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    pause(&mut h, &auto).await?;
    assert_eq!(stdout(&h.sh(&auto, "echo awake").await?), "awake\n");
    assert_eq!(h.get(&auto).await?.state, api::SandboxState::Running as i32);
    h.stop().await
}

#[tokio::test]
async fn idle_sandboxes_are_paused_or_deleted_and_lifetimes_end() -> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| c.reaper_interval = Duration::from_secs(1)).await?;
    let to_pause = h
        .create(api::SandboxSpec {
            idle_timeout_seconds: 2,
            idle_policy: api::IdlePolicy::Pause as i32,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    let to_delete = h
        .create(api::SandboxSpec {
            idle_timeout_seconds: 2,
            idle_policy: api::IdlePolicy::Delete as i32,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    let short_lived = h
        .create(api::SandboxSpec {
            idle_policy: api::IdlePolicy::Keep as i32,
            max_lifetime_seconds: 3,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    let kept = h
        .create(api::SandboxSpec {
            idle_timeout_seconds: 2,
            idle_policy: api::IdlePolicy::Keep as i32,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    let within = Duration::from_secs(30);
    let paused = h
        .wait_state(&to_pause, api::SandboxState::Paused, within)
        .await?;
    assert_eq!(paused.state_reason, "idle timeout");
    let deleted = h
        .wait_state(&to_delete, api::SandboxState::Terminated, within)
        .await?;
    assert!(deleted.state_reason.contains("idle"), "{deleted:?}");
    assert!(docker(&["inspect", &container_of(&to_delete)]).is_err());
    let expired = h
        .wait_state(&short_lived, api::SandboxState::Terminated, within)
        .await?;
    assert!(expired.state_reason.contains("lifetime"), "{expired:?}");
    assert_eq!(h.get(&kept).await?.state, api::SandboxState::Running as i32);
    h.stop().await
}

#[tokio::test]
async fn get_or_create_by_external_key() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let spec = api::SandboxSpec {
        external_key: "chat-42".into(),
        ..Default::default()
    };
    let first = h.create(spec.clone()).await?;
    let second = h.create(spec.clone()).await?;
    assert_eq!(first.sandbox_id, second.sandbox_id);
    assert_eq!(second.external_key, "chat-42");
    let found = h
        .sandboxes
        .get_sandbox_by_key(api::GetSandboxByKeyRequest {
            space_id: String::new(),
            external_key: "chat-42".into(),
        })
        .await?
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(found.sandbox_id, first.sandbox_id);
    let missing = h
        .sandboxes
        .get_sandbox_by_key(api::GetSandboxByKeyRequest {
            space_id: String::new(),
            external_key: "chat-43".into(),
        })
        .await;
    assert_eq!(code(missing), Code::NotFound);
    let bad = h
        .sandboxes
        .get_sandbox_by_key(api::GetSandboxByKeyRequest {
            space_id: String::new(),
            external_key: String::new(),
        })
        .await;
    assert_eq!(code(bad), Code::InvalidArgument);
    // Once deleted, the key is free again.
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: first.sandbox_id.clone(),
        })
        .await?;
    let fresh = h.create(spec).await?;
    assert_ne!(fresh.sandbox_id, first.sandbox_id);
    h.stop().await
}

#[tokio::test]
async fn a_container_removed_behind_the_runtimes_back_is_terminated() -> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| c.health_interval = Duration::from_secs(1)).await?;
    let id = h.create_default().await?.sandbox_id;
    docker(&["rm", "-f", &container_of(&id)])?;
    let sb = h
        .wait_state(&id, api::SandboxState::Terminated, Duration::from_secs(60))
        .await?;
    assert!(sb.state_reason.contains("gone"), "{sb:?}");
    // Its workspace volume went too.
    assert!(h.guard.volumes().is_empty(), "{:?}", h.guard.volumes());
    h.stop().await
}

#[tokio::test]
async fn a_killed_runtime_takes_its_sandboxes_over_when_started_again() -> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let mut first = RuntimeProcess::start(bin, &instance, data_dir.path()).await?;
    let mut h = first.harness(data_dir, guard).await?;

    let running = h
        .create(api::SandboxSpec {
            external_key: "conversation-1".into(),
            labels: [("app".to_owned(), "e2e".to_owned())].into(),
            ..Default::default()
        })
        .await?
        .sandbox_id;
    h.sh(&running, "echo persisted > /workspace/f").await?;
    h.py(&running, "state = 'kept'").await?;
    // An action with a client-chosen id, finished before the kill: its retry afterwards must replay it.
    let retried = api::ExecuteRequest {
        sandbox_id: running.clone(),
        action: Some(shell_action(cmd(
            "echo once >> /workspace/count; wc -l < /workspace/count",
        ))),
        action_id: "before-the-kill".into(),
    };
    let first_run = collect(
        h.actions.execute(retried.clone()).await?.into_inner(),
        Duration::from_secs(60),
    )
    .await?;
    assert_eq!(stdout(&first_run), "1\n");
    let last_seq_before = h.get(&running).await?.last_seq;
    let log_before = h.read_log(&running, 0, last_seq_before as usize).await?;
    let paused = h.create_default().await?.sandbox_id;
    pause(&mut h, &paused).await?;
    let vanishing = h.create_default().await?.sandbox_id;

    // SIGKILL: no shutdown code runs. Meanwhile a container disappears.
    first.kill();
    docker(&["rm", "-f", &container_of(&vanishing)])?;

    let Harness {
        data_dir, guard, ..
    } = h;
    let second = RuntimeProcess::start(bin, &instance, data_dir.path()).await?;
    let mut h = second.harness(data_dir, guard).await?;

    let sb = h.get(&running).await?;
    assert_eq!(sb.state, api::SandboxState::Running as i32, "{sb:?}");
    assert_eq!(sb.external_key, "conversation-1");
    assert_eq!(sb.labels.get("app").map(String::as_str), Some("e2e"));
    assert!(
        sb.last_seq > last_seq_before,
        "seqs continue upwards: {sb:?}"
    );
    // The action id survived too: the retry replays, it does not run again.
    let replayed = collect(
        h.actions.execute(retried).await?.into_inner(),
        Duration::from_secs(60),
    )
    .await?;
    assert_eq!(replayed, first_run);
    assert_eq!(
        stdout(&h.sh(&running, "wc -l < /workspace/count").await?),
        "1\n"
    );
    // The log survived the SIGKILL: replay returns exactly what was there before.
    assert_eq!(h.read_log(&running, 0, log_before.len()).await?, log_before);
    assert_eq!(
        stdout(&h.sh(&running, "cat /workspace/f").await?),
        "persisted\n"
    );
    // The container was never restarted: the kernel kept its state.
    assert_eq!(
        cell_value(&h.py(&running, "state").await?).as_deref(),
        Some("'kept'")
    );
    let found = h
        .sandboxes
        .get_sandbox_by_key(api::GetSandboxByKeyRequest {
            space_id: String::new(),
            external_key: "conversation-1".into(),
        })
        .await?
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(found.sandbox_id, running);

    assert_eq!(
        h.get(&paused).await?.state,
        api::SandboxState::Paused as i32
    );
    resume(&mut h, &paused).await?;
    assert_eq!(stdout(&h.sh(&paused, "echo back").await?), "back\n");

    let gone = h.get(&vanishing).await?;
    assert_eq!(gone.state, api::SandboxState::Terminated as i32, "{gone:?}");
    assert!(gone.state_reason.contains("vanished"), "{gone:?}");

    let listed = h
        .sandboxes
        .list_sandboxes(api::ListSandboxesRequest {
            states: vec![
                api::SandboxState::Running as i32,
                api::SandboxState::Paused as i32,
            ],
            ..Default::default()
        })
        .await?
        .into_inner();
    assert_eq!(listed.sandboxes.len(), 2, "{listed:?}");
    drop(second);
    Ok(())
}

#[tokio::test]
async fn a_store_belongs_to_one_instance() -> anyhow::Result<()> {
    let h = Harness::start().await?;
    let dir = h.data_dir.path().to_owned();
    // Another instance on this store would take the first one's sandboxes for vanished ones.
    let other = Harness::start_with(|c| c.data_dir = dir).await;
    let err = other
        .err()
        .expect("a second instance on the same store must not start");
    assert!(
        format!("{err:#}").contains("belongs to instance"),
        "{err:#}"
    );
    h.stop().await
}

/// SIGTERM drains: health goes NOT_SERVING, an open Execute ends with UNAVAILABLE telling the client to resume
/// (not with OK and no end), the process exits in seconds though a Health/Watch stays open, and the sandbox
/// and its running command carry on for the next runtime. A second signal exits at once.
#[tokio::test]
async fn sigterm_drains_and_leaves_sandboxes_running() -> anyhow::Result<()> {
    use futures::StreamExt;
    use tonic_health::pb::health_check_response::ServingStatus;
    use tonic_health::pb::{HealthCheckRequest, health_client::HealthClient};

    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let mut first = RuntimeProcess::start(bin, &instance, data_dir.path()).await?;
    let mut h = first.harness(data_dir, guard).await?;
    let id = h.create_default().await?.sandbox_id;

    let mut health = HealthClient::new(first.channel().await?);
    let mut watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await?
        .into_inner();
    assert_eq!(
        watch.next().await.unwrap()?.status,
        ServingStatus::Serving as i32
    );
    let mut stream = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.clone(),
            action: Some(shell_action(cmd(
                "for i in $(seq 1 30); do echo $i | tee -a /workspace/lines; sleep 0.1; done",
            ))),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    // Running: its first line arrived.
    let first_item = stream.next().await.unwrap()?;
    assert!(first_item.kind.is_some());

    first.signal("TERM")?;
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), watch.next())
            .await?
            .unwrap()?
            .status,
        ServingStatus::NotServing as i32,
        "health says NOT_SERVING first"
    );
    let mut ended = None;
    while let Some(item) = tokio::time::timeout(Duration::from_secs(10), stream.next()).await? {
        match item {
            Ok(r) => assert!(
                !matches!(
                    r.kind,
                    Some(api::execute_response::Kind::Observation(api::Observation {
                        kind: Some(Kind::CmdEnd(_)),
                        ..
                    }))
                ),
                "the command ended during the drain: {r:?}"
            ),
            Err(status) => {
                ended = Some(status);
                break;
            }
        }
    }
    let status = ended.expect("the Execute stream ends with a status, not OK");
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(status.message().contains("resume"), "{status:?}");
    let exit = first.exited_within(Duration::from_secs(15)).await?;
    assert!(
        exit.is_some_and(|s| s.success()),
        "the runtime exits cleanly within the drain grace though a Health/Watch is open: {exit:?}"
    );

    // The next runtime takes the sandbox over; the command ran on to its end meanwhile.
    let Harness {
        data_dir, guard, ..
    } = h;
    let mut second = RuntimeProcess::start(bin, &instance, data_dir.path()).await?;
    let mut h = second.harness(data_dir, guard).await?;
    assert_eq!(h.get(&id).await?.state, api::SandboxState::Running as i32);
    // The command prints 30 lines in 3 s from its start; give it ample time on a loaded machine.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let lines = stdout(&h.sh(&id, "wc -l < /workspace/lines").await?);
        if lines.trim() == "30" {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the command kept running through the drain: {lines}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    // A second signal exits at once, Health/Watch open or not.
    let mut health = HealthClient::new(second.channel().await?);
    let _watch = health
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await?;
    second.signal("TERM")?;
    tokio::time::sleep(Duration::from_millis(200)).await;
    second.signal("TERM")?;
    let exit = second.exited_within(Duration::from_secs(5)).await?;
    assert!(
        exit.is_some_and(|s| s.code() == Some(130)),
        "a second signal exits at once: {exit:?}"
    );
    Ok(())
}
