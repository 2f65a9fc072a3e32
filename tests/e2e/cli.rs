//! The `mentis` command line (cli/, docs/CLI.md) end to end: the built binary against a real runtime.
//! `exec` streams stdout and stderr apart and exits with the command's status; `sandbox` commands print
//! JSON; `sandbox create --allow/--header` makes egress rules that `sandbox egress` replaces and `sandbox
//! denials` reports on, with a header naming a secret of `secret set` (stdin), `ls` and `rm`; `snapshot`
//! commands take, list, get and delete snapshots and `sandbox create --snapshot` restores one; `preview url` prints a URL that curl opens and `preview revoke` ends it; `cp` round-trips a file and a directory both ways; `files ls`, `logs --after-seq` (and `--follow`), `run-code`;
//! the key comes from the flag, the environment or the admin key file; and `mentis shell` in a real
//! terminal (tmux's): raw mode, a resize seen by `stty size`, Ctrl-C interrupting a command, the remote
//! exit status, and the local terminal's settings put back. Fails (never skips) when tmux is missing:
//! `make tools` (deploy/ensure-tools.sh) installs it.

mod everyday;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use mentis_e2e::*;
use mentis_runtime::config::AuthConfig;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt};

/// `target/debug/mentis`, built once per test process with the cargo that runs the tests: with the runtime,
/// the set of packages `make test`, the README walk-through and the SDK checks build (cargo resolves the
/// dependencies' features per set, so another set would compile them all again).
fn mentis_bin() -> Result<PathBuf> {
    static BIN: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .ok_or("no workspace folder")?;
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
        let out = std::process::Command::new(cargo)
            .args(["build", "-q", "-p", "mentis-runtime", "-p", "mentis-cli"])
            .current_dir(workspace)
            .output()
            .map_err(|e| format!("cargo build -p mentis-runtime -p mentis-cli: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "cargo build -p mentis-runtime -p mentis-cli failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let target = std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| workspace.join("target"));
        let bin = target.join("debug").join("mentis");
        if bin.is_file() {
            Ok(bin)
        } else {
            Err(format!("{} is missing after the build", bin.display()))
        }
    })
    .clone()
    .map_err(anyhow::Error::msg)
}

/// A runtime, its admin key, and the built `mentis`.
struct Env {
    h: Harness,
    bin: PathBuf,
    addr: String,
    key: String,
}

/// What one `mentis` run printed and how it ended.
#[derive(Debug)]
struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Env {
    async fn start() -> Result<Self> {
        Self::start_with(|_| {}).await
    }

    /// [`Env::start`] with `tweak` adjusting the runtime's config.
    async fn start_with(
        tweak: impl FnOnce(&mut mentis_runtime::config::RuntimeConfig),
    ) -> Result<Self> {
        let bin = tokio::task::spawn_blocking(mentis_bin).await??;
        let mut key = None;
        let h = Harness::start_with(|c| {
            if let AuthConfig::Keys { admin_key } = &c.auth {
                key = admin_key.clone();
            }
            tweak(c);
        })
        .await?;
        let addr = format!("http://{}", h.runtime.as_ref().context("no runtime")?.addr);
        Ok(Self {
            h,
            bin,
            addr,
            key: key.context("the harness made no admin key")?,
        })
    }

    /// `mentis ARGS` with MENTIS_ADDR and MENTIS_API_KEY set (and nothing else of the caller's MENTIS_*).
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(&self.bin);
        c.args(args)
            .env_remove("MENTIS_DATA_DIR")
            .env_remove("MENTIS_CA_CERT")
            .env("MENTIS_ADDR", &self.addr)
            .env("MENTIS_API_KEY", &self.key)
            .kill_on_drop(true);
        c
    }

    async fn run(&self, args: &[&str]) -> Result<Out> {
        self.run_with(self.command(args), None).await
    }

    async fn run_stdin(&self, args: &[&str], stdin: &[u8]) -> Result<Out> {
        self.run_with(self.command(args), Some(stdin)).await
    }

    async fn run_with(&self, mut c: tokio::process::Command, stdin: Option<&[u8]>) -> Result<Out> {
        c.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = c.spawn().context("running mentis")?;
        if let Some(data) = stdin {
            let mut pipe = child.stdin.take().context("no stdin")?;
            pipe.write_all(data).await?;
            drop(pipe);
        }
        let out = tokio::time::timeout(Duration::from_secs(120), child.wait_with_output())
            .await
            .context("mentis did not end within 2 minutes")??;
        Ok(Out {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// `mentis ARGS`, which must succeed; its stdout.
    async fn ok(&self, args: &[&str]) -> Result<String> {
        let out = self.run(args).await?;
        ensure!(out.code == 0, "mentis {args:?} failed: {out:?}");
        Ok(out.stdout)
    }

    /// `mentis ARGS --output json`, which must succeed; its JSON.
    async fn json(&self, args: &[&str]) -> Result<Value> {
        let mut args = args.to_vec();
        args.extend(["--output", "json"]);
        let out = self.ok(&args).await?;
        serde_json::from_str(&out).with_context(|| format!("not JSON: {out}"))
    }

    async fn sandbox(&mut self) -> Result<String> {
        Ok(self.h.create_default().await?.sandbox_id)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_streams_stdout_and_stderr_apart_and_exits_with_the_commands_status() -> Result<()> {
    let mut e = Env::start().await?;
    let sb = e.sandbox().await?;

    let out = e
        .run(&["exec", &sb, "--", "echo out; echo err >&2; exit 7"])
        .await?;
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (7, "out\n", "err\n")
    );

    // The words after `--` joined with spaces, as a bash command line; --workdir and --env.
    let out = e
        .run(&[
            "exec",
            &sb,
            "--workdir",
            "/tmp",
            "--env",
            "GREETING=hi there",
            "--",
            "echo",
            "$GREETING",
            "from",
            "$(pwd)",
        ])
        .await?;
    assert_eq!((out.code, out.stdout.as_str()), (0, "hi there from /tmp\n"));

    // A persistent session keeps its variables between two runs of mentis.
    e.ok(&["exec", &sb, "--session", "s1", "--", "export KEPT=42"])
        .await?;
    let out = e
        .ok(&["exec", &sb, "--session", "s1", "--", "echo $KEPT"])
        .await?;
    assert_eq!(out, "42\n");

    // Killed by a signal: 128 + N. A timeout: 124, with the reason on stderr.
    let out = e.run(&["exec", &sb, "--", "kill -9 $$"]).await?;
    assert_eq!(out.code, 137, "{out:?}");
    let out = e
        .run(&["exec", &sb, "--timeout", "1", "--", "sleep 30"])
        .await?;
    assert_eq!(out.code, 124, "{out:?}");
    assert!(out.stderr.contains("TIMED_OUT"), "{out:?}");

    // Ctrl-C (SIGINT) cancels the remote command (CancelAction), waits for its end, and exits 130.
    let mut c = e.command(&["exec", &sb, "--", "echo started; sleep 60; echo finished"]);
    let mut child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
    let first = tokio::time::timeout(Duration::from_secs(30), lines.next_line()).await??;
    assert_eq!(first.as_deref(), Some("started"));
    let pid = child.id().context("no pid")?.to_string();
    let killed = tokio::process::Command::new("kill")
        .args(["-INT", &pid])
        .status()
        .await?;
    assert!(killed.success());
    let out = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .context("mentis did not end after Ctrl-C")??;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("CANCELLED"), "{stderr}");

    // A refused call: `mentis: CODE: message`, status 1. A usage error: status 2.
    let out = e
        .run(&["exec", "00000000-0000-4000-8000-000000000000", "--", "true"])
        .await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("mentis: NOT_FOUND: "), "{out:?}");
    let out = e.run(&["exec", &sb]).await?;
    assert_eq!(out.code, 2, "{out:?}");

    // The key: without flag or MENTIS_API_KEY, the admin key file of MENTIS_DATA_DIR; no key at all is
    // UNAUTHENTICATED.
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("admin.key"), format!("{}\n", e.key))?;
    let mut c = e.command(&["exec", &sb, "--", "echo keyfile"]);
    c.env_remove("MENTIS_API_KEY")
        .env("MENTIS_DATA_DIR", dir.path());
    let out = e.run_with(c, None).await?;
    assert_eq!((out.code, out.stdout.as_str()), (0, "keyfile\n"), "{out:?}");
    let mut c = e.command(&["sandbox", "list"]);
    c.env_remove("MENTIS_API_KEY")
        .env("MENTIS_DATA_DIR", dir.path().join("nothing-here"));
    let out = e.run_with(c, None).await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with("mentis: UNAUTHENTICATED: "),
        "{out:?}"
    );
    // The flag wins over the environment.
    let out = e
        .run(&["--api-key", "wrong", "sandbox", "get", &sb])
        .await?;
    assert!(
        out.stderr.starts_with("mentis: UNAUTHENTICATED: "),
        "{out:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sandbox_commands_create_get_list_pause_resume_delete_in_json() -> Result<()> {
    let e = Env::start().await?;
    let created = e
        .json(&["sandbox", "create", "--label", "team=cli", "--env", "A=1"])
        .await?;
    let sb = created["sandbox_id"]
        .as_str()
        .context("no sandbox_id")?
        .to_owned();
    assert_eq!(created["state"], "RUNNING", "{created}");
    assert_eq!(created["labels"]["team"], "cli", "{created}");
    // The sandbox's env reaches commands.
    assert_eq!(e.ok(&["exec", &sb, "--", "echo $A"]).await?, "1\n");

    let got = e.json(&["sandbox", "get", &sb]).await?;
    assert_eq!(got["sandbox_id"], sb.as_str());
    assert_eq!(got["state"], "RUNNING");
    let list = e.json(&["sandbox", "list", "--label", "team=cli"]).await?;
    let ids: Vec<&str> = list
        .as_array()
        .context("list is not an array")?
        .iter()
        .filter_map(|s| s["sandbox_id"].as_str())
        .collect();
    assert_eq!(ids, vec![sb.as_str()]);
    assert_eq!(
        e.json(&["sandbox", "list", "--label", "team=other"])
            .await?,
        Value::Array(vec![])
    );
    // Text: a header, then one row with the id and state.
    let text = e.ok(&["sandbox", "list"]).await?;
    assert!(text.starts_with("SANDBOX"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.starts_with(&sb) && l.contains("RUNNING")),
        "{text}"
    );
    assert_eq!(
        e.ok(&["sandbox", "create", "--label", "x=y"])
            .await?
            .trim()
            .len(),
        36
    );

    let paused = e.json(&["sandbox", "pause", &sb]).await?;
    assert_eq!(paused["state"], "PAUSED", "{paused}");
    let resumed = e.json(&["sandbox", "resume", &sb]).await?;
    assert_eq!(resumed["state"], "RUNNING", "{resumed}");
    assert_eq!(e.ok(&["exec", &sb, "--", "echo back"]).await?, "back\n");

    e.ok(&["sandbox", "delete", &sb]).await?;
    let out = e.run(&["sandbox", "get", &sb, "--output", "json"]).await?;
    // Gone, or still being torn down (TERMINATING/TERMINATED) right after the delete.
    if out.code == 0 {
        let v: Value = serde_json::from_str(&out.stdout)?;
        assert!(
            matches!(v["state"].as_str(), Some("TERMINATING" | "TERMINATED")),
            "{v}"
        );
    } else {
        assert!(out.stderr.starts_with("mentis: NOT_FOUND: "), "{out:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn egress_flags_make_rules_that_sandbox_egress_replaces_and_secrets_come_from_stdin()
-> Result<()> {
    let e = Env::start().await?;
    // A secret's value from stdin (one trailing newline dropped); `ls` names secrets, never their values.
    let secret = format!("tok-{}", uuid::Uuid::new_v4().simple());
    let out = e
        .run_stdin(
            &["secret", "set", "API_TOKEN"],
            format!("{secret}\n").as_bytes(),
        )
        .await?;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "API_TOKEN\n"),
        "{out:?}"
    );
    let out = e
        .run_stdin(&["secret", "set", "OTHER", "--output", "json"], b"x")
        .await?;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        serde_json::from_str::<Value>(&out.stdout)?,
        serde_json::json!({"space_id": "default", "name": "OTHER", "set": true})
    );
    assert_eq!(
        e.json(&["secret", "ls"]).await?,
        serde_json::json!(["API_TOKEN", "OTHER"])
    );
    assert_eq!(e.ok(&["secret", "ls"]).await?, "NAME\nAPI_TOKEN\nOTHER\n");

    // --allow and --header make the rules; a header's DOMAIN no --allow named gets a rule on 80 and 443.
    let created = e
        .json(&[
            "sandbox",
            "create",
            "--allow",
            "pkgs.example.org",
            "--allow",
            "*.files.example.org",
            "--allow",
            "10.0.0.0/8:5432",
            "--allow",
            "api.example.test:443",
            "--header",
            "api.example.test=Authorization: Bearer {secret:API_TOKEN}",
            "--header",
            "team.example.test=X-Team: cli",
        ])
        .await?;
    assert_eq!(created["egress"], "RULES", "{created}");
    let sb = created["sandbox_id"]
        .as_str()
        .context("no sandbox_id")?
        .to_owned();
    let got = e.json(&["sandbox", "get", &sb]).await?;
    let rule = |domain: &str, cidr: &str, ports: &[u32], headers: Value| serde_json::json!({"domain": domain, "cidr": cidr, "ports": ports, "headers": headers});
    assert_eq!(
        got["egress_rules"],
        serde_json::json!([
            rule("pkgs.example.org", "", &[80, 443], serde_json::json!([])),
            rule("*.files.example.org", "", &[80, 443], serde_json::json!([])),
            rule("", "10.0.0.0/8", &[5432], serde_json::json!([])),
            rule(
                "api.example.test",
                "",
                &[443],
                serde_json::json!([{"name": "Authorization", "value": "Bearer {secret:API_TOKEN}"}])
            ),
            rule(
                "team.example.test",
                "",
                &[80, 443],
                serde_json::json!([{"name": "X-Team", "value": "cli"}])
            ),
        ]),
        "{got}"
    );
    assert!(!got.to_string().contains(&secret), "{got}");
    // Text: the policy in the flags' own terms.
    let text = e.ok(&["sandbox", "egress", &sb]).await?;
    assert!(
        text.starts_with(
            "egress                RULES\nallow                 pkgs.example.org:80,443\n"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "header                api.example.test=Authorization: Bearer {secret:API_TOKEN}\n"
        ),
        "{text}"
    );

    // A name no rule allows does not resolve, and the gateway's refusal is listed.
    let out = e
        .run(&[
            "exec",
            &sb,
            "--",
            "curl -sS https://nothing.example.test/ || true",
        ])
        .await?;
    assert_eq!(out.code, 0, "{out:?}");
    assert!(out.stderr.contains("Could not resolve host"), "{out:?}");
    let denials = e.json(&["sandbox", "denials", &sb]).await?;
    assert!(
        denials.as_array().context("not an array")?.iter().any(|d| {
            d["protocol"] == "dns"
                && d["name"] == "nothing.example.test"
                && d["reason"].as_str().is_some_and(|r| !r.is_empty())
                && d["time"].is_string()
        }),
        "{denials}"
    );
    let text = e.ok(&["sandbox", "denials", &sb]).await?;
    assert!(text.starts_with("TIME"), "{text}");
    assert!(
        text.lines()
            .any(|l| l.contains(" dns ") && l.contains("nothing.example.test")),
        "{text}"
    );

    // `sandbox egress` replaces the rules in place (the mode stays).
    let policy = e
        .json(&["sandbox", "egress", &sb, "--allow", "other.example.test"])
        .await?;
    assert_eq!(
        policy,
        serde_json::json!({
            "sandbox_id": sb,
            "egress": "RULES",
            "egress_rules": [rule("other.example.test", "", &[80, 443], serde_json::json!([]))],
        })
    );
    assert_eq!(
        e.json(&["sandbox", "get", &sb]).await?["egress_rules"],
        policy["egress_rules"]
    );

    // The flags' own syntax is checked here: a usage error (status 2), the call never made.
    for args in [
        vec!["sandbox", "create", "--allow", "a b:xx"],
        vec!["sandbox", "create", "--header", "api.example.test"],
        vec![
            "sandbox",
            "create",
            "--egress",
            "deny",
            "--allow",
            "pkgs.example.org",
        ],
        vec!["sandbox", "create", "--egress", "sometimes"],
        vec!["sandbox", "egress", &sb, "--allow", "pkgs.example.org:0"],
    ] {
        let out = e.run(&args).await?;
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
    }
    let out = e.run(&["sandbox", "create", "--allow", "a b:xx"]).await?;
    assert!(
        out.stderr
            .starts_with("mentis: --allow \"a b:xx\": \"xx\" is not a port"),
        "{out:?}"
    );
    // Names, secrets and the rest are the runtime's to check: INVALID_ARGUMENT names the rule's field.
    for (args, field) in [
        (
            vec!["sandbox", "create", "--allow", "*"],
            "spec.egress_rules[0].domain",
        ),
        (
            vec![
                "sandbox",
                "create",
                "--allow",
                "pkgs.example.org",
                "--header",
                "a.example.test=X-Key: {secret:MISSING}",
            ],
            "spec.egress_rules[1].headers",
        ),
        (
            vec!["sandbox", "egress", &sb, "--allow", "10.0.0.0/33"],
            "sandbox.egress_rules[0].cidr",
        ),
    ] {
        let out = e.run(&args).await?;
        assert_eq!(out.code, 1, "{args:?}: {out:?}");
        assert!(
            out.stderr.starts_with("mentis: INVALID_ARGUMENT: ") && out.stderr.contains(field),
            "{args:?}: {out:?}"
        );
    }

    // `secret rm`: the name; a missing one is NOT_FOUND (status 1).
    assert_eq!(e.ok(&["secret", "rm", "OTHER"]).await?, "OTHER\n");
    let out = e.run(&["secret", "rm", "OTHER"]).await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("mentis: NOT_FOUND: "), "{out:?}");
    assert_eq!(
        e.json(&["secret", "ls"]).await?,
        serde_json::json!(["API_TOKEN"])
    );
    // No value on stdin: the runtime refuses an empty one.
    let out = e.run(&["secret", "set", "EMPTY"]).await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with("mentis: INVALID_ARGUMENT: "),
        "{out:?}"
    );
    e.h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_commands_take_list_get_delete_and_sandbox_create_restores_one() -> Result<()> {
    let mut e = Env::start().await?;
    let sb = e.sandbox().await?;
    e.ok(&[
        "exec",
        &sb,
        "--",
        "mkdir -p d && printf 'kept bytes\\n' > d/kept.txt",
    ])
    .await?;

    let first = e
        .json(&["snapshot", "create", &sb, "--label", "conv=cli-1"])
        .await?;
    let first_id = first["snapshot_id"]
        .as_str()
        .context("no snapshot_id")?
        .to_owned();
    assert_eq!(first["sandbox_id"], sb.as_str(), "{first}");
    assert_eq!(first["space_id"], "default", "{first}");
    assert_eq!(first["labels"]["conv"], "cli-1", "{first}");
    assert_eq!(first["store"], "local", "{first}");
    assert_eq!(first["sha256"].as_str().map(str::len), Some(64), "{first}");
    assert!(first["size_bytes"].as_u64() > Some(0), "{first}");
    assert!(first["create_time"].is_string(), "{first}");
    // Text: the id only.
    let second_id = e
        .ok(&["snapshot", "create", &sb, "-l", "conv=cli-1", "-l", "n=2"])
        .await?
        .trim()
        .to_owned();
    assert_eq!(second_id.len(), 36, "{second_id}");

    let ids = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s["snapshot_id"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    };
    // Newest first; filtered by label, sandbox and space; --limit keeps the newest.
    let both = vec![second_id.clone(), first_id.clone()];
    let list = e
        .json(&["snapshot", "list", "--label", "conv=cli-1"])
        .await?;
    assert_eq!(ids(&list), both);
    assert_eq!(
        ids(&e.json(&["snapshot", "list", "--sandbox", &sb]).await?),
        both
    );
    assert_eq!(
        ids(&e
            .json(&["snapshot", "list", "--space", "default", "-l", "conv=cli-1"])
            .await?),
        both
    );
    assert_eq!(
        ids(&e
            .json(&["snapshot", "list", "-l", "conv=cli-1", "-l", "n=2"])
            .await?),
        vec![second_id.clone()]
    );
    assert_eq!(
        ids(&e
            .json(&["snapshot", "list", "-l", "conv=cli-1", "--limit", "1"])
            .await?),
        vec![second_id.clone()]
    );
    assert_eq!(
        e.json(&["snapshot", "list", "--label", "conv=other"])
            .await?,
        Value::Array(vec![])
    );
    // Text: a header, then a row per snapshot with its sandbox and labels.
    let text = e.ok(&["snapshot", "list", "--sandbox", &sb]).await?;
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert!(lines[0].starts_with("SNAPSHOT"), "{text}");
    assert!(
        lines[1].starts_with(&second_id)
            && lines[1].contains(&sb)
            && lines[1].ends_with("conv=cli-1,n=2"),
        "{text}"
    );
    assert!(lines[2].starts_with(&first_id), "{text}");

    let got = e.json(&["snapshot", "get", &first_id]).await?;
    assert_eq!(got, first);
    let text = e.ok(&["snapshot", "get", &first_id]).await?;
    assert!(
        text.lines()
            .any(|l| l.starts_with("snapshot_id") && l.ends_with(&first_id)),
        "{text}"
    );

    // The sandbox goes; `sandbox create --snapshot` brings its workspace back in a new one.
    e.ok(&["sandbox", "delete", &sb]).await?;
    let restored = e
        .json(&["sandbox", "create", "--snapshot", &first_id])
        .await?;
    let restored_id = restored["sandbox_id"].as_str().context("no sandbox_id")?;
    assert_ne!(restored_id, sb);
    assert_eq!(restored["state"], "RUNNING", "{restored}");
    assert_eq!(
        e.ok(&["exec", restored_id, "--", "cat d/kept.txt"]).await?,
        "kept bytes\n"
    );
    e.ok(&["sandbox", "delete", restored_id]).await?;

    // Delete: the id; a second delete is no error; a deleted snapshot is NOT_FOUND, for get and restore.
    assert_eq!(
        e.ok(&["snapshot", "delete", &first_id]).await?.trim(),
        first_id
    );
    let deleted = e.json(&["snapshot", "delete", &first_id]).await?;
    assert_eq!(deleted["deleted"], true, "{deleted}");
    let out = e.run(&["snapshot", "get", &first_id]).await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("mentis: NOT_FOUND: "), "{out:?}");
    let out = e
        .run(&["sandbox", "create", "--snapshot", &first_id])
        .await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("mentis: NOT_FOUND: "), "{out:?}");
    assert_eq!(
        ids(&e.json(&["snapshot", "list", "-l", "conv=cli-1"]).await?),
        vec![second_id.clone()]
    );
    e.ok(&["snapshot", "delete", &second_id]).await?;

    // Bad input: a label that is not K=V, an id that is not one, a missing argument.
    let out = e
        .run(&["snapshot", "create", restored_id, "-l", "conv"])
        .await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("is not KEY=VALUE"), "{out:?}");
    let out = e.run(&["snapshot", "get", "not-a-snapshot"]).await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with("mentis: INVALID_ARGUMENT: "),
        "{out:?}"
    );
    let out = e.run(&["snapshot", "create"]).await?;
    assert_eq!(out.code, 2, "{out:?}");
    Ok(())
}

/// `curl -sS` of `url` with `args`: the HTTP status and the body.
async fn curl(url: &str, args: &[&str]) -> Result<(u16, String)> {
    let out = tokio::process::Command::new("curl")
        .args(["-sS", "--max-time", "60", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .await
        .context("curl (deploy/ensure-tools.sh installs it)")?;
    ensure!(
        out.status.success(),
        "curl {url}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').context("no status")?;
    Ok((status.parse()?, body.to_owned()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_url_prints_a_url_that_opens_and_preview_revoke_ends_it() -> Result<()> {
    let http = free_port()?;
    let mut e = Env::start_with(|c| {
        c.http_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], http)));
    })
    .await?;
    let sb = e.sandbox().await?;
    e.ok(&[
        "exec",
        &sb,
        "--",
        "mkdir -p site && echo '<h1>from the cli</h1>' > site/index.html && \
         (nohup python3 -m http.server 8000 --directory site >/tmp/http.log 2>&1 &) && \
         until (echo > /dev/tcp/127.0.0.1/8000) 2>/dev/null; do sleep 0.1; done",
    ])
    .await?;

    // Text: the URL alone, which opens the page.
    let url = e.ok(&["preview", "url", &sb, "8000"]).await?;
    let url = url.trim_end_matches('\n');
    let app = format!("http://127.0.0.1:{http}/preview/{sb}/8000/");
    assert!(
        url.starts_with(&format!("{app}?mentis_preview_token=")),
        "{url}"
    );
    assert_eq!(
        curl(url, &[]).await?,
        (200, "<h1>from the cli</h1>\n".into())
    );
    // Without its token: refused.
    let (status, body) = curl(&app, &[]).await?;
    assert_eq!(status, 401, "{body}");

    // JSON: the whole answer; the token alone opens it as a header; --ttl sets its expiry.
    let before = std::time::SystemTime::now();
    let got = e
        .json(&["preview", "url", &sb, "8000", "--ttl", "120"])
        .await?;
    let token = got["token"].as_str().context("no token")?;
    let path = got["path"].as_str().context("no path")?;
    assert_eq!(
        path,
        format!("/preview/{sb}/8000/?mentis_preview_token={token}")
    );
    assert_eq!(
        got["url"],
        format!("http://127.0.0.1:{http}{path}"),
        "{got}"
    );
    let expires = got["expire_time"].as_str().context("no expire_time")?;
    let expires: prost_types::Timestamp = expires.parse().context("expire_time")?;
    let left =
        expires.seconds - i64::try_from(before.duration_since(std::time::UNIX_EPOCH)?.as_secs())?;
    assert!((110..=121).contains(&left), "{left} s left: {got}");
    let header = format!("X-Mentis-Preview-Token: {token}");
    assert_eq!(
        curl(&format!("{app}index.html"), &["-H", &header]).await?,
        (200, "<h1>from the cli</h1>\n".into())
    );

    // Revoke port 8000: both URLs stop opening; another port's does not; a new one works.
    let other = e.json(&["preview", "url", &sb, "8001"]).await?;
    let other_header = format!(
        "X-Mentis-Preview-Token: {}",
        other["token"].as_str().context("no token")?
    );
    let other_app = format!("http://127.0.0.1:{http}/preview/{sb}/8001/");
    assert_eq!(
        e.ok(&["preview", "revoke", &sb, "--port", "8000"]).await?,
        format!("{sb}\n")
    );
    for old in [url, got["url"].as_str().context("url")?] {
        let (status, body) = curl(old, &[]).await?;
        assert_eq!(status, 401, "{body}");
        assert!(body.contains("revoked"), "{body}");
    }
    // Nothing listens on 8001, but its token still passes (502, not 401).
    let (status, body) = curl(&other_app, &["-H", &other_header]).await?;
    assert_eq!(status, 502, "{body}");
    let fresh = e.ok(&["preview", "url", &sb, "8000"]).await?;
    assert_eq!(curl(fresh.trim(), &[]).await?.0, 200);
    // Every port's: JSON says which.
    let revoked = e.json(&["preview", "revoke", &sb]).await?;
    assert_eq!(
        revoked,
        serde_json::json!({"sandbox_id": sb, "port": null, "revoked": true})
    );
    assert_eq!(curl(fresh.trim(), &[]).await?.0, 401);
    assert_eq!(curl(&other_app, &["-H", &other_header]).await?.0, 401);

    // Bad input: no port, a port that is none, the executor's own, a TTL over 7 days, an unknown sandbox.
    for args in [
        vec!["preview", "url", &sb],
        vec!["preview", "url", &sb, "0"],
        vec!["preview", "url", &sb, "65536"],
        vec!["preview", "url", &sb, "8000", "--ttl", "0"],
        vec!["preview", "revoke", &sb, "--port", "0"],
    ] {
        let out = e.run(&args).await?;
        assert_eq!(out.code, 2, "{args:?}: {out:?}");
    }
    let out = e.run(&["preview", "url", &sb, "50052"]).await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with("mentis: INVALID_ARGUMENT: ") && out.stderr.contains("executor"),
        "{out:?}"
    );
    let out = e
        .run(&["preview", "url", &sb, "8000", "--ttl", "700000"])
        .await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("ttl_seconds"), "{out:?}");
    let out = e
        .run(&[
            "preview",
            "url",
            "00000000-0000-4000-8000-000000000000",
            "8000",
        ])
        .await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("mentis: NOT_FOUND: "), "{out:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preview_url_without_the_http_listener_says_how_to_turn_it_on() -> Result<()> {
    let mut e = Env::start().await?;
    let sb = e.sandbox().await?;
    let out = e.run(&["preview", "url", &sb, "8000"]).await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with("mentis: FAILED_PRECONDITION: ")
            && out.stderr.contains("MENTIS_HTTP_LISTEN"),
        "{out:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cp_both_ways_files_ls_logs_after_seq_and_run_code() -> Result<()> {
    let mut e = Env::start().await?;
    let sb = e.sandbox().await?;
    let dir = tempfile::tempdir()?;

    // A file of several chunks, every byte value, up and back down.
    let data: Vec<u8> = (0..700_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let local = dir.path().join("data.bin");
    std::fs::write(&local, &data)?;
    e.ok(&[
        "cp",
        local.to_str().context("path")?,
        &format!("{sb}:up/data.bin"),
    ])
    .await?;
    assert_eq!(
        e.ok(&["exec", &sb, "--", "wc -c < up/data.bin"])
            .await?
            .trim(),
        "700000"
    );
    let back = dir.path().join("back.bin");
    e.ok(&[
        "cp",
        &format!("{sb}:up/data.bin"),
        back.to_str().context("path")?,
    ])
    .await?;
    assert!(std::fs::read(&back)? == data, "the file came back changed");
    // Into a local directory: the remote name; into a remote directory (trailing /): the local name.
    let sub = dir.path().join("sub");
    std::fs::create_dir(&sub)?;
    e.ok(&[
        "cp",
        &format!("{sb}:up/data.bin"),
        sub.to_str().context("path")?,
    ])
    .await?;
    assert!(std::fs::read(sub.join("data.bin"))? == data);
    e.ok(&[
        "cp",
        local.to_str().context("path")?,
        &format!("{sb}:other/"),
    ])
    .await?;
    // stdin and stdout.
    let out = e
        .run_stdin(&["cp", "-", &format!("{sb}:notes.txt")], b"from stdin\n")
        .await?;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(
        e.ok(&["cp", &format!("{sb}:notes.txt"), "-"]).await?,
        "from stdin\n"
    );
    let out = e
        .run(&[
            "cp",
            &format!("{sb}:missing.txt"),
            back.to_str().context("path")?,
        ])
        .await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("mentis: NOT_FOUND: "), "{out:?}");
    assert!(
        std::fs::read(&back)? == data,
        "a failed copy changed the file"
    );

    // A directory, links as links, up and back down (cp -r's naming: into a new name, or inside an
    // existing directory).
    let tree = dir.path().join("tree");
    std::fs::create_dir_all(tree.join("a/b"))?;
    std::fs::write(tree.join("top.txt"), "top\n")?;
    std::fs::write(tree.join("a/b/deep.txt"), "deep\n")?;
    std::os::unix::fs::symlink("top.txt", tree.join("link"))?;
    e.ok(&[
        "cp",
        tree.to_str().context("path")?,
        &format!("{sb}:uptree"),
    ])
    .await?;
    assert_eq!(
        e.ok(&[
            "exec",
            &sb,
            "--",
            "cat uptree/a/b/deep.txt; readlink uptree/link"
        ])
        .await?,
        "deep\ntop.txt\n"
    );
    let down = dir.path().join("down");
    e.ok(&[
        "cp",
        &format!("{sb}:uptree"),
        down.to_str().context("path")?,
    ])
    .await?;
    assert_eq!(
        std::fs::read_to_string(down.join("a/b/deep.txt"))?,
        "deep\n"
    );
    assert_eq!(std::fs::read_link(down.join("link"))?, Path::new("top.txt"));
    let inside = dir.path().join("inside");
    std::fs::create_dir(&inside)?;
    e.ok(&[
        "cp",
        &format!("{sb}:uptree/a"),
        inside.to_str().context("path")?,
    ])
    .await?;
    assert_eq!(
        std::fs::read_to_string(inside.join("a/b/deep.txt"))?,
        "deep\n"
    );

    // files ls: JSON and text.
    let files = e.json(&["files", "ls", &sb, "up"]).await?;
    assert_eq!(files[0]["path"], "up/data.bin", "{files}");
    assert_eq!(files[0]["size"], 700_000, "{files}");
    assert_eq!(files[0]["type"], "FILE", "{files}");
    let text = e.ok(&["files", "ls", &sb]).await?;
    for name in ["up/", "other/", "notes.txt", "uptree/"] {
        assert!(text.lines().any(|l| l.ends_with(name)), "{name} in {text}");
    }
    let all = e.json(&["files", "ls", "-R", &sb]).await?;
    assert!(
        all.as_array()
            .context("array")?
            .iter()
            .any(|f| f["path"] == "other/data.bin"),
        "{all}"
    );

    // logs --after-seq: only what came after.
    let before = e.h.get(&sb).await?.last_seq;
    e.ok(&["exec", &sb, "--", "echo later"]).await?;
    let out = e
        .ok(&[
            "logs",
            &sb,
            "--after-seq",
            &before.to_string(),
            "-o",
            "json",
        ])
        .await?;
    let lines: Vec<Value> = out
        .lines()
        .map(serde_json::from_str)
        .collect::<std::result::Result<_, _>>()?;
    assert!(!lines.is_empty());
    assert!(
        lines.iter().all(|o| o["seq"].as_u64() > Some(before)),
        "{out}"
    );
    assert!(
        lines
            .iter()
            .any(|o| o["kind"] == "cmd_output" && o["cmd_output"]["data"] == "later\n"),
        "{out}"
    );
    assert_eq!(lines.last().context("no line")?["kind"], "cmd_end", "{out}");
    let text = e.ok(&["logs", &sb]).await?;
    assert!(
        text.contains("cmd_start") && text.contains("\"later\\n\""),
        "{text}"
    );
    // --follow prints what comes next.
    let last = e.h.get(&sb).await?.last_seq;
    let mut follow = e.command(&["logs", &sb, "--follow", "--after-seq", &last.to_string()]);
    let mut child = follow.stdout(Stdio::piped()).spawn()?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().context("stdout")?).lines();
    e.ok(&["exec", &sb, "--", "echo followed"]).await?;
    let found = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            if line.contains("followed\\n") {
                return Ok::<_, anyhow::Error>(line);
            }
        }
        bail!("logs --follow ended")
    })
    .await
    .context("logs --follow printed nothing new")??;
    assert!(found.contains("cmd_output"), "{found}");
    child.kill().await?;

    // run-code: a file and stdin; an exception is status 1 with the traceback on stderr.
    let code = dir.path().join("cell.py");
    std::fs::write(
        &code,
        "import sys\nx = 6 * 7\nprint('to', 'stdout')\nprint('to stderr', file=sys.stderr)\nx\n",
    )?;
    let out = e
        .run(&["run-code", &sb, code.to_str().context("path")?])
        .await?;
    assert_eq!(
        (out.code, out.stdout.as_str(), out.stderr.as_str()),
        (0, "to stdout\n42\n", "to stderr\n"),
        "{out:?}"
    );
    let out = e.run_stdin(&["run-code", &sb, "-"], b"x + 1\n").await?;
    assert_eq!((out.code, out.stdout.as_str()), (0, "43\n"), "{out:?}");
    let out = e.run_stdin(&["run-code", &sb, "-"], b"1/0\n").await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.contains("ZeroDivisionError"), "{out:?}");
    Ok(())
}

/// A tmux server of its own (a unique socket), killed when dropped, even by a failing test.
struct Tmux {
    socket: String,
}

impl Tmux {
    async fn start(width: u32, height: u32, command: &str) -> Result<Self> {
        let t = Self {
            socket: format!("mentis-cli-{}", uuid::Uuid::new_v4().simple()),
        };
        let (w, h) = (width.to_string(), height.to_string());
        t.run(&[
            "-f",
            "/dev/null",
            "new-session",
            "-d",
            "-s",
            "main",
            "-x",
            &w,
            "-y",
            &h,
            command,
        ])
        .await?;
        // Without a status line the pane is the whole window.
        t.run(&["set-option", "-g", "status", "off"]).await?;
        Ok(t)
    }

    async fn run(&self, args: &[&str]) -> Result<String> {
        let out = tokio::process::Command::new("tmux")
            .arg("-L")
            .arg(&self.socket)
            .args(args)
            .output()
            .await
            .context("tmux is missing: `make tools` (deploy/ensure-tools.sh) installs it")?;
        ensure!(
            out.status.success(),
            "tmux {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    async fn screen(&self) -> Result<String> {
        self.run(&["capture-pane", "-p", "-t", "main"]).await
    }

    /// Waits until a line of the screen is `line` (trailing blanks aside).
    async fn expect_line(&self, line: &str) -> Result<String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            let screen = self.screen().await?;
            if screen.lines().any(|l| l.trim_end() == line) {
                return Ok(screen);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("no line {line:?} on the screen:\n{screen}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn keys(&self, keys: &[&str]) -> Result<()> {
        let mut args = vec!["send-keys", "-t", "main"];
        args.extend(keys);
        self.run(&args).await.map(drop)
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux")
            .args(["-L", &self.socket, "kill-server"])
            .output();
    }
}

/// Waits until `path` holds a line.
async fn read_when_written(path: &Path) -> Result<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(s) = std::fs::read_to_string(path)
            && s.ends_with('\n')
        {
            return Ok(s.trim().to_owned());
        }
        if tokio::time::Instant::now() > deadline {
            bail!("{} was never written", path.display());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shell_in_a_real_terminal_resizes_interrupts_and_exits_with_the_remote_status() -> Result<()>
{
    let mut e = Env::start().await?;
    let sb = e.sandbox().await?;
    let dir = tempfile::tempdir()?;
    let d = dir.path().display();
    // The local terminal's settings before and after: raw mode must be undone.
    let script = dir.path().join("run.sh");
    std::fs::write(
        &script,
        format!(
            "stty -g > {d}/before\nMENTIS_ADDR='{}' MENTIS_API_KEY='{}' '{}' shell {sb}\necho $? > {d}/exit\n\
             stty -g > {d}/after\nsleep 600\n",
            e.addr,
            e.key,
            e.bin.display()
        ),
    )?;
    let tmux = Tmux::start(100, 30, &format!("bash {}", script.display())).await?;

    tmux.keys(&["echo $((6*7))", "Enter"]).await?;
    tmux.expect_line("42").await?;
    let size = tmux
        .run(&[
            "display-message",
            "-p",
            "-t",
            "main",
            "#{pane_height} #{pane_width}",
        ])
        .await?;
    tmux.keys(&["echo S1:$(stty size)", "Enter"]).await?;
    tmux.expect_line(&format!("S1:{}", size.trim())).await?;

    // A resize of the local terminal (SIGWINCH to mentis) reaches the remote one.
    tmux.run(&["resize-window", "-t", "main", "-x", "120", "-y", "40"])
        .await?;
    let size = tmux
        .run(&[
            "display-message",
            "-p",
            "-t",
            "main",
            "#{pane_height} #{pane_width}",
        ])
        .await?;
    assert!(size.trim().ends_with(" 120"), "pane size {size}");
    tmux.keys(&["clear; echo S2:$(stty size)", "Enter"]).await?;
    tmux.expect_line(&format!("S2:{}", size.trim())).await?;

    // Ctrl-C is a byte for the remote terminal: it interrupts the command, not mentis.
    // (Ctrl-C once the line runs: one that came while bash still read the line would only clear it.)
    tmux.keys(&["echo SLEEPING; sleep 300; echo NOT-INTERRUPTED", "Enter"])
        .await?;
    tmux.expect_line("SLEEPING").await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    tmux.keys(&["C-c"]).await?;
    tmux.keys(&["echo AFTER-$((1+1))", "Enter"]).await?;
    let screen = tmux.expect_line("AFTER-2").await?;
    assert!(
        !screen.lines().any(|l| l.trim_end() == "NOT-INTERRUPTED"),
        "{screen}"
    );

    // `exit 3` ends mentis with status 3, and the terminal is as it was.
    tmux.keys(&["exit 3", "Enter"]).await?;
    assert_eq!(read_when_written(&dir.path().join("exit")).await?, "3");
    let after = read_when_written(&dir.path().join("after")).await?;
    assert_eq!(read_when_written(&dir.path().join("before")).await?, after);
    drop(tmux);

    // Without a terminal on stdin: bytes go as they are, and the program's status comes back.
    let out = e
        .run_stdin(&["shell", &sb], b"echo piped-$((2+3))\nexit 5\n")
        .await?;
    assert_eq!(out.code, 5, "{out:?}");
    assert!(out.stdout.contains("piped-5"), "{out:?}");
    // The end of piped input ends the shell (Ctrl-D).
    let out = e.run_stdin(&["shell", &sb], b"echo bye\n").await?;
    assert_eq!(out.code, 0, "{out:?}");
    // A program instead of bash, and its status.
    let out = e
        .run(&[
            "shell",
            &sb,
            "--",
            "sh",
            "-c",
            "echo in-a-pty; [ -t 0 ] && exit 9",
        ])
        .await?;
    assert_eq!(out.code, 9, "{out:?}");
    assert!(out.stdout.contains("in-a-pty"), "{out:?}");

    // Re-attach: a terminal left running shows its scrollback to `--attach`.
    let list = e.json(&["terminals", "ls", &sb]).await?;
    assert!(list.as_array().is_some_and(|l| !l.is_empty()), "{list}");
    let script = dir.path().join("detach.sh");
    std::fs::write(
        &script,
        format!(
            "MENTIS_ADDR='{}' MENTIS_API_KEY='{}' '{}' shell {sb}\nsleep 600\n",
            e.addr,
            e.key,
            e.bin.display()
        ),
    )?;
    let tmux = Tmux::start(80, 24, &format!("bash {}", script.display())).await?;
    tmux.keys(&["echo MARK-$((3*3))", "Enter"]).await?;
    tmux.expect_line("MARK-9").await?;
    drop(tmux); // the local terminal goes away; the remote one keeps running
    let running = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let list = e.json(&["terminals", "ls", &sb]).await?;
            let found = list.as_array().and_then(|l| {
                l.iter()
                    .find(|t| t["exit_code"].is_null() && t["attached"] == 0 && t["cols"] == 80)
                    .and_then(|t| t["terminal_id"].as_str().map(str::to_owned))
            });
            if let Some(id) = found {
                return Ok::<_, anyhow::Error>(id);
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await
    .context("the detached terminal was never listed")??;
    let out = e
        .run_stdin(&["shell", &sb, "--attach", &running], b"exit 4\n")
        .await?;
    assert_eq!(out.code, 4, "{out:?}");
    assert!(out.stdout.contains("MARK-9"), "the scrollback: {out:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn completions_are_printed_for_bash_zsh_and_fish() -> Result<()> {
    let bin = tokio::task::spawn_blocking(mentis_bin).await??;
    for shell in ["bash", "zsh", "fish"] {
        let out = tokio::process::Command::new(&bin)
            .args(["completions", shell])
            .output()
            .await?;
        assert!(out.status.success(), "{shell}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("run-code") && text.contains("sandbox"),
            "{shell}: {text}"
        );
    }
    Ok(())
}

#[tokio::test]
async fn template_commands_build_an_image_name_a_template_and_make_a_sandbox_of_it() -> Result<()> {
    test_images()?;
    let e = Env::start().await?;
    let tag = format!("mentis-test/cli-{}:1", e.h.guard.instance);
    struct Image(String);
    impl Drop for Image {
        fn drop(&mut self) {
            let _ = docker(&["image", "rm", "-f", &self.0]);
        }
    }
    let _image = Image(tag.clone());
    let dir = tempfile::tempdir()?;
    std::fs::write(
        dir.path().join("Dockerfile"),
        "FROM mentis-test/busybox:1\nCOPY note.txt /srv/note.txt\n",
    )?;
    std::fs::write(dir.path().join("note.txt"), "from the folder\n")?;

    // The build's output on stderr, the image's name on stdout.
    let built = e
        .run(&[
            "template",
            "build",
            dir.path().to_str().context("path")?,
            "-t",
            &tag,
        ])
        .await?;
    assert_eq!(built.code, 0, "{built:?}");
    assert_eq!(built.stdout, format!("{tag}\n"));
    assert!(
        built.stderr.contains(" : COPY note.txt /srv/note.txt"),
        "{built:?}"
    );

    assert_eq!(
        e.ok(&[
            "template",
            "create",
            "notes",
            "--image",
            &tag,
            "--env",
            "WHO=cli",
            "--setup",
            "echo \"set up for $WHO\" > ready",
            "--memory-mb",
            "300",
        ])
        .await?,
        "notes\n"
    );
    let listed = e.json(&["template", "list"]).await?;
    assert_eq!(listed[0]["name"], "notes", "{listed}");
    assert_eq!(listed[0]["limits"]["memory_mb"], 300, "{listed}");
    let sb = e.ok(&["sandbox", "create", "--template", "notes"]).await?;
    let sb = sb.trim();
    assert_eq!(
        e.ok(&["exec", sb, "--", "cat /srv/note.txt ready"]).await?,
        "from the folder\nset up for cli\n"
    );
    let got = e.json(&["sandbox", "get", sb]).await?;
    assert_eq!(got["memory_limit_mb"], 300, "{got}");
    assert_eq!(e.ok(&["template", "delete", "notes"]).await?, "notes\n");
    let gone = e.run(&["template", "get", "notes"]).await?;
    assert_eq!(gone.code, 1, "{gone:?}");
    assert!(gone.stderr.starts_with("mentis: NOT_FOUND: "), "{gone:?}");
    e.h.stop().await
}
