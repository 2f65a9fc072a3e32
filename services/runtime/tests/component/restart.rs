//! A runtime restarted on the same store and backend takes its sandboxes over: running ones keep running
//! (their executor, its state and their seqs continue), paused ones stay paused, vanished ones end, and a
//! container nobody recorded is removed.

use std::time::Duration;

use mentis_core::{BackendSpec, SandboxBackend, SandboxId};
use mentis_proto::api::{self, SandboxState};

use crate::support::*;

#[tokio::test]
async fn a_restarted_runtime_takes_over_what_the_backend_holds() {
    let mut rt = TestRuntime::start().await;
    let running = rt.create_default().await;
    let paused = rt.create_default().await;
    let vanishing = rt.create_default().await;
    let half_made = rt.create_default().await;
    let half_deleted = rt.create_default().await;
    rt.sh(&running.sandbox_id, "echo state > kept.txt")
        .await
        .unwrap();
    rt.pause(&paused.sandbox_id).await.unwrap();
    let seq_before = rt.get(&running.sandbox_id).await.unwrap().last_seq;
    let log_before = rt.log(&running.sandbox_id, 0).await;
    let deleted = rt.create_default().await;
    rt.sh(&deleted.sandbox_id, "echo bye").await.unwrap();
    rt.delete(&deleted.sandbox_id).await.unwrap();
    let deleted_log = rt.log(&deleted.sandbox_id, 0).await;
    // A container the store does not know (left by a crash between create and record).
    let stray = SandboxId::new();
    rt.backend
        .create(&BackendSpec {
            id: stray,
            space_id: None,
            image: "stray".into(),
            limits: Default::default(),
            token: "stray-token".into(),
            data_mounts: Vec::new(),
            executor_env: Vec::new(),
            egress: false,
            gateway: false,
            read_only_rootfs: false,
            runtime_class: None,
        })
        .await
        .unwrap();

    let backend = rt.backend.clone();
    let mut rt = {
        let _busy = Busy::hold();
        let stopped = rt.runtime.take().unwrap().stop();
        stopped.await.unwrap();
        // While it is down, one container vanishes; and two records say what a crash in the middle of a
        // create or a delete would leave.
        backend.lose(sid(&vanishing));
        let store = mentis_store::Store::open(rt.data_dir.path()).unwrap();
        for (sb, state) in [
            (&half_made, mentis_core::SandboxState::Creating),
            (&half_deleted, mentis_core::SandboxState::Terminating),
        ] {
            let mut record = store
                .sandboxes()
                .unwrap()
                .into_iter()
                .find(|s| s.record.id == sid(sb))
                .unwrap()
                .record;
            record.state = state;
            store.update_sandbox(&record, 0).unwrap();
        }
        drop(store);
        TestRuntime::start_on(backend, rt.config.clone(), rt.data_dir.clone()).await
    };

    assert_eq!(rt.state(&running.sandbox_id).await, SandboxState::Running);
    let obs = rt.sh(&running.sandbox_id, "cat kept.txt").await.unwrap();
    assert_eq!(stdout(&obs), "state\n");
    // The log survived: replay returns exactly what was there, then the takeover, then the new action.
    let log_after = rt.log(&running.sandbox_id, 0).await;
    assert_eq!(log_after[..log_before.len()], log_before[..]);
    assert_eq!(obs[0].seq, seq_before + 2, "seqs continue without a jump");
    // So did the deleted sandbox's, for its retention.
    assert_eq!(rt.log(&deleted.sandbox_id, 0).await, deleted_log);
    assert_eq!(rt.state(&paused.sandbox_id).await, SandboxState::Paused);
    rt.resume(&paused.sandbox_id).await.unwrap();
    assert_eq!(
        stdout(&rt.sh(&paused.sandbox_id, "echo up").await.unwrap()),
        "up\n"
    );
    let gone = rt.get(&vanishing.sandbox_id).await.unwrap();
    assert_eq!(gone.state, SandboxState::Terminated as i32);
    assert!(gone.state_reason.contains("vanished"), "{gone:?}");
    assert_eq!(
        rt.backend.state(stray),
        None,
        "the unrecorded container is removed"
    );
    let log = rt.log(&running.sandbox_id, seq_before).await;
    assert!(
        log.iter().any(
            |o| matches!(&o.kind, Some(Kind::AgentState(a)) if a.message.contains("taken over"))
        ),
        "{log:?}"
    );
}

/// Action ids survive a restart: a retry of a finished action replays it (it does not run again), the same id
/// with another action is still ALREADY_EXISTS, and an action that ran across the restart is attached to again:
/// everything it printed, once, and its own end.
#[tokio::test]
async fn retries_after_a_restart_replay_and_every_action_has_one_end() {
    let mut rt = TestRuntime::start().await;
    let id = rt.create_default().await.sandbox_id;
    let once = shell("echo ran >> count; wc -l < count");
    let first = rt.exec(&id, once.clone(), "retry-me").await.unwrap();
    assert_eq!(stdout(&first), "1\n");
    let mut across = rt.start_action(&id, shell("echo started; sleep 3; echo after"));
    across.started().await;
    // The action running across the restart is known under the id the client gave it.
    let running_id = {
        let log = rt.log(&id, 0).await;
        log.last().unwrap().action_id.clone()
    };

    let backend = rt.backend.clone();
    let mut rt = {
        let stopped = rt.runtime.take().unwrap().stop();
        stopped.await.unwrap();
        TestRuntime::start_on(backend, rt.config.clone(), rt.data_dir.clone()).await
    };
    drop(across);

    let retry = rt.exec(&id, once.clone(), "retry-me").await.unwrap();
    assert_eq!(retry, first, "the retry replays the same observations");
    assert_eq!(
        stdout(&rt.sh(&id, "wc -l < count").await.unwrap()),
        "1\n",
        "it did not run again"
    );
    let other = rt.exec(&id, shell("true"), "retry-me").await.unwrap_err();
    assert_eq!(other.code(), tonic::Code::AlreadyExists, "{other:?}");
    // The action that ran across the restart: everything it printed, once, and one end, its own.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = rt.log(&id, 0).await;
        if log
            .iter()
            .any(|o| o.action_id == running_id && is_terminal(o))
        {
            break log;
        }
        assert!(tokio::time::Instant::now() < deadline, "no end: {log:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mine: Vec<_> = log
        .iter()
        .filter(|o| o.action_id == running_id)
        .cloned()
        .collect();
    assert_eq!(stdout(&mine), "started\nafter\n", "{mine:?}");
    assert_eq!(
        mine.iter().filter(|o| is_terminal(o)).count(),
        1,
        "{mine:?}"
    );
    assert_eq!(
        cmd_end(&mine).reason,
        api::EndReason::Exited as i32,
        "{mine:?}"
    );
}

/// A space's deletion that a stop interrupted is finished by the next start, before anything can reach the
/// space: its sandboxes and their containers go, and its id can be taken again, empty (issue 40, finding 2).
#[tokio::test]
async fn a_space_deletion_a_stop_interrupted_is_finished_at_the_next_start() {
    let mut rt = TestRuntime::start().await;
    rt.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "tz".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let member = rt
        .create(api::SandboxSpec {
            space_id: "tz".into(),
            ..Default::default()
        })
        .await
        .unwrap();
    // What a stop right after DeleteSpace began leaves: the space marked, everything else still there.
    let mut rt = restart_after(rt, |store| {
        store
            .mark_space_deleting(&mentis_core::SpaceId::parse("tz").unwrap())
            .unwrap();
    })
    .await;
    let got = rt
        .spaces
        .get_space(api::GetSpaceRequest {
            space_id: "tz".into(),
        })
        .await;
    assert_eq!(got.unwrap_err().code(), tonic::Code::NotFound);
    assert_eq!(
        rt.get(&member.sandbox_id).await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    assert_eq!(
        rt.backend.state(sid(&member)),
        None,
        "its container is gone"
    );
    let again = rt
        .spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "tz".into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .space
        .unwrap();
    assert_eq!(again.sandbox_count, 0);
    let db = rusqlite::Connection::open(rt.data_dir.path().join("mentis.db")).unwrap();
    let generation: i64 = db
        .query_row("SELECT generation FROM spaces WHERE id = 'tz'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(generation, 2, "the space made again is another generation");
}

/// A sandbox whose restore from a snapshot a stop interrupted (issue 40, finding 5) is discarded by the next
/// start, as a failed restore is: it never runs with an empty workspace in place of the snapshot's.
#[tokio::test]
async fn a_sandbox_whose_restore_a_stop_interrupted_is_discarded_at_the_next_start() {
    let mut rt = TestRuntime::start().await;
    let restoring = rt.create_default().await;
    let bystander = rt.create_default().await;
    // What a stop in the middle of CreateSandbox from a snapshot leaves: the sandbox made and running, its
    // restore begun and not ended.
    let mut rt = restart_after(rt, |store| {
        store.begin_restore(sid(&restoring), "snap-x").unwrap();
    })
    .await;
    let got = rt.get(&restoring.sandbox_id).await.unwrap();
    assert_eq!(got.state, SandboxState::Terminated as i32, "{got:?}");
    assert!(got.state_reason.contains("restoring"), "{got:?}");
    assert_eq!(
        rt.backend.state(sid(&restoring)),
        None,
        "its container is gone"
    );
    assert_eq!(rt.state(&bystander.sandbox_id).await, SandboxState::Running);
    // Only once: the next start finds nothing left to discard.
    let mut rt = restart_after(rt, |_| {}).await;
    assert_eq!(rt.state(&bystander.sandbox_id).await, SandboxState::Running);
}

/// Stops `rt`, lets `meddle` change its store as a stop at a bad moment would have left it, and starts a
/// runtime again on the same store and backend.
async fn restart_after(
    mut rt: TestRuntime,
    meddle: impl FnOnce(&mentis_store::Store),
) -> TestRuntime {
    let backend = rt.backend.clone();
    let _busy = Busy::hold();
    let stopped = rt.runtime.take().unwrap().stop();
    stopped.await.unwrap();
    let store = mentis_store::Store::open(rt.data_dir.path()).unwrap();
    meddle(&store);
    drop(store);
    TestRuntime::start_on(backend, rt.config.clone(), rt.data_dir.clone()).await
}
