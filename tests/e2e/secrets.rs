//! What the runtime keeps on disk gives a local user nothing: the data folder is 0700 and its files 0600
//! (fixed at start when wider), the store holds no executor token (they are derived from `mentis.key`) and no
//! env value in plain text (sealed), and a restart on the same folder still reaches the sandboxes.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use mentis_e2e::*;
use mentis_proto::api;

/// Every file and folder under `dir` (symbolic links left out) with its mode.
fn walk(dir: &Path, out: &mut Vec<(PathBuf, u32, bool)>) -> anyhow::Result<()> {
    out.push((
        dir.to_owned(),
        dir.metadata()?.permissions().mode() & 0o7777,
        true,
    ));
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let meta = std::fs::symlink_metadata(&path)?;
        if meta.file_type().is_symlink() {
            continue;
        }
        if meta.is_dir() {
            walk(&path, out)?;
        } else {
            out.push((path, meta.permissions().mode() & 0o7777, false));
        }
    }
    Ok(())
}

/// Checks the modes of everything under `dir` and that no file outside `disks/` (the sandboxes' sparse
/// workspace images, which hold their files, not the runtime's) holds any of `secrets`.
fn assert_private_and_clean(dir: &Path, secrets: &[&str]) -> anyhow::Result<Vec<PathBuf>> {
    let mut all = Vec::new();
    walk(dir, &mut all)?;
    for (path, mode, is_dir) in &all {
        let want = if *is_dir { 0o700 } else { 0o600 };
        assert_eq!(*mode, want, "mode of {}: {mode:04o}", path.display());
        if *is_dir || path.starts_with(dir.join("disks")) {
            continue;
        }
        let bytes = std::fs::read(path)?;
        for s in secrets {
            assert!(
                !bytes.windows(s.len()).any(|w| w == s.as_bytes()),
                "{} holds a secret",
                path.display()
            );
        }
    }
    Ok(all.into_iter().map(|(p, ..)| p).collect())
}

/// Prints the env value reversed: the sandbox has it, and the journal (which keeps what sandboxes print)
/// does not get it from the test.
const SHOW_REVERSED: &str = "printf %s \"$SECRET_SETTING\" | rev; echo";

fn reversed(value: &str) -> String {
    format!("{}\n", value.chars().rev().collect::<String>())
}

#[tokio::test]
async fn the_data_folder_is_private_and_holds_neither_tokens_nor_env_values() -> anyhow::Result<()>
{
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    // Open to others before the first start, with a file of someone's in it: both are fixed.
    std::fs::set_permissions(data_dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let notes = data_dir.path().join("notes.txt");
    std::fs::write(&notes, "operator notes\n")?;
    std::fs::set_permissions(&notes, std::fs::Permissions::from_mode(0o644))?;

    let mut first = RuntimeProcess::start(bin, &instance, data_dir.path()).await?;
    let mut h = first.harness(data_dir, guard).await?;
    let value = format!("env-value-{}", uuid::Uuid::new_v4().simple());
    let sb = h
        .create(api::SandboxSpec {
            env: [("SECRET_SETTING".to_owned(), value.clone())].into(),
            ..Default::default()
        })
        .await?
        .sandbox_id;
    assert_eq!(stdout(&h.sh(&sb, SHOW_REVERSED).await?), reversed(&value));
    let env = inspect(
        &container_of(&sb),
        "{{range .Config.Env}}{{println .}}{{end}}",
    )?;
    let token = env
        .lines()
        .find_map(|l| l.strip_prefix("MENTIS_EXECUTOR_TOKEN="))
        .expect("the container has a token")
        .to_owned();
    assert_eq!(token.len(), 64);
    // After the sweeper's flush, while it runs (the WAL holds the newest writes).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dir = h.data_dir.path().to_owned();
    let files = assert_private_and_clean(&dir, &[&token, &value])?;
    for name in [
        "mentis.db",
        "mentis.db-wal",
        "mentis.key",
        "admin.key",
        "notes.txt",
    ] {
        assert!(files.contains(&dir.join(name)), "{name} in {files:?}");
    }
    assert!(
        files.iter().any(|p| p.starts_with(dir.join("logs"))),
        "a journal: {files:?}"
    );

    // Stopped (the WAL checkpointed into the database), then started again on the same folder.
    first.signal("TERM")?;
    assert!(
        first
            .exited_within(Duration::from_secs(30))
            .await?
            .is_some()
    );
    assert_private_and_clean(&dir, &[&token, &value])?;
    let Harness {
        data_dir, guard, ..
    } = h;
    let second = RuntimeProcess::start(bin, &instance, data_dir.path()).await?;
    let mut h = second.harness(data_dir, guard).await?;
    assert_eq!(
        h.get(&sb).await?.state,
        api::SandboxState::Running as i32,
        "taken over"
    );
    assert_eq!(stdout(&h.sh(&sb, SHOW_REVERSED).await?), reversed(&value));
    assert_private_and_clean(&dir, &[&token, &value])?;
    drop(second);
    Ok(())
}
