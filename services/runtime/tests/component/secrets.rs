//! The data folder holds no usable secret and is private to the runtime's user: executor tokens are derived
//! from the key in `mentis.key`, envs are sealed, modes wider than 0700/0600 are fixed at start, and a store
//! whose key is missing, corrupt or another is refused with an error naming the file. A store of schema 5
//! keeps its live sandboxes' stored tokens, has its envs sealed and its pool members replaced.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use mentis_core::{BackendSpec, SandboxBackend, SandboxId};
use mentis_proto::api::{self, SandboxState};
use mentis_runtime::Runtime;
use mentis_store::{DB_FILE, KEY_FILE};

use crate::support::*;

const ENV_VALUE: &str = "env-value-that-must-not-be-on-disk-31337";

fn with_env() -> api::SandboxSpec {
    api::SandboxSpec {
        env: [("SECRET_SETTING".to_owned(), ENV_VALUE.to_owned())].into(),
        ..Default::default()
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().permissions().mode() & 0o777
}

/// Every file and folder under `dir` with its mode.
fn walk(dir: &Path, out: &mut Vec<(std::path::PathBuf, u32)>) {
    out.push((dir.to_owned(), mode(dir)));
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push((p.clone(), mode(&p)));
        }
    }
}

fn holds(hay: &[u8], needle: &str) -> bool {
    hay.windows(needle.len()).any(|w| w == needle.as_bytes())
}

async fn stop(rt: &mut TestRuntime) {
    let _busy = Busy::hold();
    rt.runtime.take().unwrap().stop().await.unwrap();
}

async fn restart(mut rt: TestRuntime) -> TestRuntime {
    stop(&mut rt).await;
    TestRuntime::start_on(rt.backend.clone(), rt.config.clone(), rt.data_dir.clone()).await
}

#[tokio::test]
async fn the_store_holds_neither_tokens_nor_env_values_and_a_restart_still_reaches_the_sandbox() {
    let mut rt = TestRuntime::start().await;
    let sb = rt.create(with_env()).await.unwrap();
    let token = rt.backend.token(sid(&sb)).unwrap();
    assert_eq!(token.len(), 64);
    let obs = rt.sh(&sb.sandbox_id, "echo $SECRET_SETTING").await.unwrap();
    assert_eq!(stdout(&obs), format!("{ENV_VALUE}\n"));
    let dir = rt.data_dir.path().to_owned();
    let mut bytes = Vec::new();
    for name in [DB_FILE, "mentis.db-wal"] {
        bytes.extend(std::fs::read(dir.join(name)).unwrap_or_default());
    }
    assert!(bytes.len() > 4096, "the store was read");
    assert!(!holds(&bytes, &token), "the executor token is not stored");
    assert!(!holds(&bytes, ENV_VALUE), "the env is sealed");
    let mut files = Vec::new();
    walk(&dir, &mut files);
    for (p, m) in &files {
        let want = if p.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(*m, want, "{}", p.display());
    }
    assert!(files.iter().any(|(p, _)| p.ends_with(KEY_FILE)));

    // The same token after a restart, derived again, and the env opened again.
    let mut rt = restart(rt).await;
    assert_eq!(rt.state(&sb.sandbox_id).await, SandboxState::Running);
    let obs = rt.sh(&sb.sandbox_id, "echo $SECRET_SETTING").await.unwrap();
    assert_eq!(stdout(&obs), format!("{ENV_VALUE}\n"));
}

#[tokio::test]
async fn a_data_folder_open_to_others_is_made_private_at_start() {
    let mut rt = TestRuntime::start().await;
    let sb = rt.create(with_env()).await.unwrap();
    rt.sh(&sb.sandbox_id, "echo journaled").await.unwrap();
    stop(&mut rt).await;
    let dir = rt.data_dir.path().to_owned();
    let mut files = Vec::new();
    walk(&dir, &mut files);
    assert!(files.len() >= 5, "{files:?}");
    for (p, _) in &files {
        let wide = if p.is_dir() { 0o755 } else { 0o644 };
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(wide)).unwrap();
    }
    let mut rt =
        TestRuntime::start_on(rt.backend.clone(), rt.config.clone(), rt.data_dir.clone()).await;
    let mut after = Vec::new();
    walk(&dir, &mut after);
    for (p, m) in &after {
        let want = if p.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(*m, want, "{}", p.display());
    }
    let obs = rt.sh(&sb.sandbox_id, "echo $SECRET_SETTING").await.unwrap();
    assert_eq!(stdout(&obs), format!("{ENV_VALUE}\n"));
}

#[tokio::test]
async fn a_missing_corrupt_or_other_key_stops_the_start_naming_the_file() {
    let mut rt = TestRuntime::start().await;
    let sb = rt.create_default().await;
    stop(&mut rt).await;
    let key = rt.data_dir.path().join(KEY_FILE);
    let good = std::fs::read_to_string(&key).unwrap();
    let start = async |rt: &TestRuntime| {
        let _busy = Busy::hold();
        Runtime::start_with(rt.config.clone(), rt.backend.clone())
            .await
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };

    std::fs::remove_file(&key).unwrap();
    let err = start(&rt).await;
    assert!(
        err.contains("mentis.key") && err.contains("is missing"),
        "{err}"
    );
    assert!(!key.exists(), "no new key is made for a sealed store");

    std::fs::write(&key, "not a key\n").unwrap();
    let err = start(&rt).await;
    assert!(
        err.contains("mentis.key") && err.contains("is corrupt"),
        "{err}"
    );

    std::fs::write(&key, format!("{}\n", "5a".repeat(32))).unwrap();
    let err = start(&rt).await;
    assert!(
        err.contains("not the key the store was sealed with"),
        "{err}"
    );

    // With its own key back, the store and its sandbox are as they were.
    std::fs::write(&key, good).unwrap();
    let mut rt =
        TestRuntime::start_on(rt.backend.clone(), rt.config.clone(), rt.data_dir.clone()).await;
    assert_eq!(rt.state(&sb.sandbox_id).await, SandboxState::Running);
    rt.sh(&sb.sandbox_id, "true").await.unwrap();
}

#[tokio::test]
async fn a_store_of_schema_5_keeps_its_live_sandboxes_and_replaces_its_pool_members() {
    let mut rt = TestRuntime::start_with(|c| {
        c.pools = vec![mentis_runtime::config::PoolConfig {
            image: c.executor_image.clone(),
            min_idle: 1,
            max_total: 4,
            kernel: false,
        }];
    })
    .await;
    let template = rt.create_default().await;
    stop(&mut rt).await;
    // What a runtime of schema 5 left: a sandbox and a pool member whose containers were made with random
    // tokens kept in the store, and an env in plain text.
    let (sandbox, member) = (SandboxId::new(), SandboxId::new());
    let (old_token, member_token) = ("a1".repeat(32), "b2".repeat(32));
    for (id, token) in [(sandbox, &old_token), (member, &member_token)] {
        let _busy = Busy::hold();
        rt.backend
            .create(&BackendSpec {
                id,
                space_id: None,
                image: rt.config.executor_image.clone(),
                limits: Default::default(),
                token: token.clone(),
                data_mounts: Vec::new(),
                executor_env: Vec::new(),
                egress: false,
                gateway: false,
                read_only_rootfs: false,
                runtime_class: None,
            })
            .await
            .unwrap();
    }
    let db = rt.data_dir.path().join(DB_FILE);
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch(&format!(
        "CREATE TEMP TABLE t AS SELECT * FROM sandboxes WHERE id = '{}';
         UPDATE t SET id = '{sandbox}', token = '{old_token}', env = '{{\"OLD\":\"{ENV_VALUE}\"}}';
         INSERT INTO sandboxes SELECT * FROM t;
         INSERT INTO pool (id, image, token, created_ms) VALUES ('{member}', '{}', '{member_token}', 0);
         DELETE FROM meta WHERE key = 'key_id';
         PRAGMA user_version = 5;",
        template.sandbox_id, rt.config.executor_image
    ))
    .unwrap();
    drop(conn);

    let mut rt =
        TestRuntime::start_on(rt.backend.clone(), rt.config.clone(), rt.data_dir.clone()).await;
    // Reached with its stored token, its env as it was; the template with its derived one.
    let id = sandbox.to_string();
    assert_eq!(rt.state(&id).await, SandboxState::Running);
    let obs = rt.sh(&id, "printf %s \"$OLD\" | wc -c").await.unwrap();
    assert_eq!(stdout(&obs).trim(), ENV_VALUE.len().to_string());
    rt.sh(&template.sandbox_id, "true").await.unwrap();
    // The old member is replaced, not taken over.
    assert_eq!(rt.backend.calls("ensure_running", member), 0, "not reached");
    assert_eq!(rt.backend.calls("delete", member), 1);
    assert_eq!(rt.backend.state(member), None);
    // The env is sealed now; the live sandbox's token stays until it is deleted.
    let mut bytes = std::fs::read(&db).unwrap();
    bytes.extend(std::fs::read(rt.data_dir.path().join("mentis.db-wal")).unwrap_or_default());
    assert!(!holds(&bytes, ENV_VALUE));
    assert!(!holds(&bytes, &member_token));
    rt.delete(&id).await.unwrap();
}
