//! Where a new user of `mentis` stumbled (issue 39), each pinned by a test against a real runtime: a closed
//! stdout ends mentis quietly (`logs | head`, `completions | head`, `exec | head`, which also stops the
//! command); stdin reaches `exec` (a pipe, `-i`) as `docker exec -i` sends it; a unique prefix of an id
//! names a sandbox; a delete of nothing says so; a runtime that is not there and a missing key are named
//! with what to do; `terminals link` prints a whole URL; `run-code --images` saves a cell's images; `pause`
//! and `resume` print what changed; a piped `mentis shell` echoes nothing and sends no escape codes;
//! `files rm` and `files mkdir`; and `mentis mcp --help` lists every tool.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use mentis_e2e::*;
use serde_json::Value;
use tokio::io::AsyncBufReadExt as _;

use super::Env;

/// `bash -c SCRIPT` with the Env's address and key, `$M` the mentis binary; its status, stdout, stderr.
async fn sh(e: &Env, script: &str) -> Result<super::Out> {
    let mut c = tokio::process::Command::new("bash");
    c.args(["-c", script])
        .env("M", &e.bin)
        .env_remove("MENTIS_DATA_DIR")
        .env("MENTIS_ADDR", &e.addr)
        .env("MENTIS_API_KEY", &e.key)
        .kill_on_drop(true);
    e.run_with(c, None).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_stdout_ends_mentis_quietly_and_exec_stops_its_command() -> Result<()> {
    let mut e = Env::start().await?;
    let sb = e.sandbox().await?;
    // Enough log that `head` closes the pipe long before mentis is done writing.
    e.ok(&["exec", &sb, "--", "seq 1 200000"]).await?;

    for script in [
        format!("$M logs {sb} | head -c 100 >/dev/null; echo \"status ${{PIPESTATUS[0]}}\" >&2"),
        "$M completions bash | head -1 >/dev/null; echo \"status ${PIPESTATUS[0]}\" >&2".to_owned(),
        "$M completions zsh | head -c 10 >/dev/null; echo \"status ${PIPESTATUS[0]}\" >&2"
            .to_owned(),
    ] {
        let out = sh(&e, &script).await?;
        // 141 is a death by SIGPIPE (what `seq 1 1000000 | head -1` shows), 0 when all was written
        // before the pipe closed; never 101 and a panic.
        let status = out.stderr.lines().last().unwrap_or_default();
        ensure!(
            status == "status 141" || status == "status 0",
            "{script}: {out:?}"
        );
        ensure!(
            !out.stderr.contains("panicked") && out.stderr.lines().count() == 1,
            "{script}: {out:?}"
        );
    }

    // `exec | head`: mentis ends at once, quietly, and the command is cancelled rather than left to run
    // until its timeout.
    let started = std::time::Instant::now();
    let out = sh(
        &e,
        &format!(
            "$M exec {sb} -- 'while true; do echo y; done; echo never' | head -3; \
             echo \"status ${{PIPESTATUS[0]}}\" >&2"
        ),
    )
    .await?;
    assert_eq!(out.stdout, "y\ny\ny\n", "{out:?}");
    assert_eq!(out.stderr, "status 141\n", "{out:?}");
    assert!(started.elapsed() < Duration::from_secs(30), "{out:?}");
    // The loop's action ends CANCELLED (its end reaches the log within moments).
    let cancelled = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let log = e.run(&["logs", &sb, "--output", "json"]).await?;
            if log
                .stdout
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .any(|o| o["cmd_end"]["reason"] == "CANCELLED")
            {
                return Ok::<_, anyhow::Error>(());
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    })
    .await;
    ensure!(cancelled.is_ok(), "no CANCELLED end in the log");
    cancelled.context("timeout")??;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdin_reaches_exec_from_a_pipe_or_with_dash_i_and_ids_take_a_unique_prefix() -> Result<()>
{
    let mut e = Env::start().await?;
    let sb = e.sandbox().await?;

    // A pipe: its bytes, then its end.
    let out = e.run_stdin(&["exec", &sb, "--", "cat"], b"hi\n").await?;
    assert_eq!((out.code, out.stdout.as_str()), (0, "hi\n"), "{out:?}");
    // Several MiB, every byte value, intact (the hash of what arrived is the hash of what was sent).
    let data: Vec<u8> = (0..3_000_000u32).map(|i| (i * 13 % 256) as u8).collect();
    let out = e
        .run_stdin(&["exec", &sb, "--", "sha256sum | cut -c1-64"], &data)
        .await?;
    let local = sh(
        &e,
        "python3 -c 'import sys; sys.stdout.buffer.write(bytes((i * 13) % 256 for i in range(3000000)))' \
         | sha256sum | cut -c1-64",
    )
    .await?;
    assert_eq!(out.stdout, local.stdout, "{out:?}");
    // -i with stdin from a file.
    let dir = tempfile::tempdir()?;
    let file = dir.path().join("in.txt");
    std::fs::write(&file, "one\ntwo\nthree\n")?;
    let out = sh(
        &e,
        &format!("$M exec -i {sb} -- wc -l < '{}'", file.display()),
    )
    .await?;
    assert_eq!(out.stdout.trim(), "3", "{out:?}");
    // No stdin given (/dev/null): the command reads its end at once.
    let out = e.run(&["exec", &sb, "--", "cat; echo done"]).await?;
    assert_eq!(out.stdout, "done\n", "{out:?}");
    // A session's command reads no stdin: a pipe is not sent to it (and is no error).
    let out = e
        .run_stdin(
            &["exec", "--session", "s1", &sb, "--", "echo in-session"],
            b"x",
        )
        .await?;
    assert_eq!(
        (out.code, out.stdout.as_str()),
        (0, "in-session\n"),
        "{out:?}"
    );

    // A unique prefix names the sandbox, as Docker takes one of a container's id.
    let prefix = &sb[..8];
    assert_eq!(
        e.ok(&["exec", prefix, "--", "echo by-prefix"]).await?,
        "by-prefix\n"
    );
    let got = e.json(&["sandbox", "get", &sb[..5]]).await?;
    assert_eq!(got["sandbox_id"], sb.as_str());
    // A prefix of no sandbox is NOT_FOUND, said as such.
    let none = if sb.starts_with('0') {
        "fffffff"
    } else {
        "0000000"
    };
    let out = e.run(&["exec", none, "--", "true"]).await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr
            .starts_with("mentis: NOT_FOUND: no sandbox has an id starting with"),
        "{out:?}"
    );
    // Something that is no id at all still gets the runtime's INVALID_ARGUMENT.
    let out = e.run(&["exec", "not-an-id!", "--", "true"]).await?;
    assert!(out.stderr.contains("INVALID_ARGUMENT"), "{out:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_of_nothing_unreachable_runtimes_and_missing_keys_say_what_to_do() -> Result<()> {
    let mut e = Env::start().await?;
    let sb = e.sandbox().await?;

    // A delete of a sandbox that is there prints its id; of one that is not (any more), succeeds and
    // says nothing was there; JSON says which.
    assert_eq!(e.ok(&["sandbox", "delete", &sb]).await?, format!("{sb}\n"));
    let out = e.run(&["sandbox", "delete", &sb]).await?;
    assert_eq!(out.code, 0, "{out:?}");
    assert_eq!(out.stdout, "", "{out:?}");
    assert!(out.stderr.contains("was there to delete"), "{out:?}");
    let nobody = "8fe0d6af-0000-4000-8000-000000000000";
    let v = e.json(&["sandbox", "delete", nobody]).await?;
    assert_eq!(v["deleted"], false, "{v}");

    // No runtime at the address: the address, the cause and what to do.
    let dead = free_port()?;
    let mut c = e.command(&["sandbox", "list"]);
    c.env("MENTIS_ADDR", format!("127.0.0.1:{dead}"));
    let out = e.run_with(c, None).await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(out.stderr.starts_with("mentis: UNAVAILABLE: "), "{out:?}");
    assert!(
        out.stderr.contains(&format!("http://127.0.0.1:{dead}")) && out.stderr.contains("make run"),
        "{out:?}"
    );
    // No key, and no admin key file where mentis looks: where it looked and what to set.
    let nowhere = tempfile::tempdir()?;
    let mut c = e.command(&["sandbox", "list"]);
    c.env_remove("MENTIS_API_KEY")
        .env("MENTIS_DATA_DIR", nowhere.path());
    let out = e.run_with(c, None).await?;
    assert_eq!(out.code, 1, "{out:?}");
    assert!(
        out.stderr.starts_with("mentis: UNAUTHENTICATED: "),
        "{out:?}"
    );
    assert!(
        out.stderr.contains("MENTIS_API_KEY")
            && out
                .stderr
                .contains(&nowhere.path().join("admin.key").display().to_string()),
        "{out:?}"
    );
    // A key the runtime does not know: that it was refused.
    let mut c = e.command(&["sandbox", "list"]);
    c.env("MENTIS_API_KEY", "not-a-key-of-this-runtime");
    let out = e.run_with(c, None).await?;
    assert!(
        out.stderr.starts_with("mentis: UNAUTHENTICATED: ") && out.stderr.contains("was refused"),
        "{out:?}"
    );
    Ok(())
}

/// A 1x1 PNG.
const PNG_B64: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_links_images_pause_resume_piped_shells_and_files_rm_mkdir() -> Result<()> {
    let http = free_port()?;
    let mut e = Env::start_with(|c| {
        c.http_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], http)));
    })
    .await?;
    let sb = e.sandbox().await?;

    // A web terminal link is a whole URL, which opens the page.
    let url = e.ok(&["terminals", "link", &sb]).await?;
    let url = url.trim_end();
    let base = format!("http://127.0.0.1:{http}/terminal#token=");
    assert!(url.starts_with(&base), "{url}");
    let v = e.json(&["terminals", "link", &sb, "--ttl", "60"]).await?;
    assert!(
        v["url"].as_str().is_some_and(|u| u.starts_with(&base)),
        "{v}"
    );

    // run-code: an image the cell displays is saved with --images, and said to be there without.
    let cell = format!(
        "import base64\nfrom IPython.display import Image, display\n\
         display(Image(data=base64.b64decode('{PNG_B64}')))\n"
    );
    let dir = tempfile::tempdir()?;
    let images = dir.path().join("images");
    let out = e
        .run_stdin(
            &[
                "run-code",
                &sb,
                "-",
                "--images",
                images.to_str().context("path")?,
            ],
            cell.as_bytes(),
        )
        .await?;
    assert_eq!(out.code, 0, "{out:?}");
    let saved: Vec<_> = std::fs::read_dir(&images)?.collect::<Result<_, _>>()?;
    assert_eq!(saved.len(), 1, "{out:?}");
    let png = std::fs::read(saved[0].path())?;
    use base64::Engine as _;
    assert_eq!(
        png,
        base64::engine::general_purpose::STANDARD.decode(PNG_B64)?
    );
    assert!(
        saved[0].file_name().to_string_lossy().ends_with(".png"),
        "{saved:?}"
    );
    assert!(out.stderr.contains("saved image/png"), "{out:?}");
    let out = e
        .run_stdin(&["run-code", &sb, "-"], cell.as_bytes())
        .await?;
    assert!(
        out.stderr.contains("displayed an image (image/png") && out.stderr.contains("--images"),
        "{out:?}"
    );

    // pause and resume print the id and the state it is in now, not the whole record.
    assert_eq!(
        e.ok(&["sandbox", "pause", &sb]).await?,
        format!("{sb}  PAUSED\n")
    );
    assert_eq!(
        e.ok(&["sandbox", "resume", &sb]).await?,
        format!("{sb}  RUNNING\n")
    );

    // A piped shell: the commands' output, without the input echoed back or readline's escape codes.
    let out = e
        .run_stdin(
            &["shell", &sb],
            b"echo piped-$((2+3))\necho second-$((1+1))\nexit 5\n",
        )
        .await?;
    assert_eq!(out.code, 5, "{out:?}");
    assert_eq!(out.stdout.matches("piped-5").count(), 1, "{out:?}");
    assert_eq!(out.stdout.matches("second-2").count(), 1, "{out:?}");
    assert!(
        !out.stdout.contains("$((2+3))"),
        "the input echoed: {out:?}"
    );
    assert!(
        !out.stdout.contains("\x1b[?2004"),
        "bracketed paste: {out:?}"
    );

    // ps and kill: the sandbox's processes, and a signal to one of them.
    let pid = e
        .ok(&[
            "exec",
            &sb,
            "--",
            "nohup sleep 555 >/dev/null 2>&1 & echo $!",
        ])
        .await?;
    let pid = pid.trim();
    let ps = e.ok(&["ps", &sb]).await?;
    assert!(ps.starts_with("PID"), "{ps}");
    assert!(
        ps.lines()
            .any(|l| l.starts_with(&format!("{pid} ")) && l.ends_with("sleep 555")),
        "{ps}"
    );
    assert!(!ps.contains("(executor)"), "without -a: {ps}");
    assert!(e.ok(&["ps", &sb, "-a"]).await?.contains("(executor)"));
    let v = e.json(&["ps", &sb]).await?;
    assert!(
        v.as_array().is_some_and(|a| a
            .iter()
            .any(|p| p["pid"] == pid.parse::<i64>().unwrap_or(-1) && p["command"][0] == "sleep")),
        "{v}"
    );
    e.ok(&["kill", &sb, pid, "-s", "KILL"]).await?;
    let gone = tokio::time::timeout(Duration::from_secs(10), async {
        while e.ok(&["ps", &sb]).await?.contains("sleep 555") {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok::<_, anyhow::Error>(())
    })
    .await;
    ensure!(gone.is_ok(), "the sleep outlived its KILL");
    let out = e.run(&["kill", &sb, "1"]).await?;
    assert!(
        out.stderr.starts_with("mentis: FAILED_PRECONDITION: "),
        "{out:?}"
    );

    // files watch: a line per change as it happens, until stopped.
    e.ok(&["files", "mkdir", &sb, "watched"]).await?;
    let mut child = e
        .command(&["files", "watch", &sb, "watched", "-r"])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut lines = tokio::io::BufReader::new(child.stdout.take().context("no stdout")?).lines();
    let mut stderr = tokio::io::BufReader::new(child.stderr.take().context("no stderr")?).lines();
    // Started: it says so on stderr before any change is made.
    let started = tokio::time::timeout(Duration::from_secs(30), stderr.next_line()).await??;
    assert!(
        started
            .as_deref()
            .is_some_and(|l| l.starts_with("mentis: watching (watch id watch-")),
        "{started:?}"
    );
    e.ok(&[
        "exec",
        &sb,
        "--",
        // A pause after the mkdir: what happens in a new directory before its own watch is added is
        // seen only if it is still there then (docs/FILES.md).
        "mkdir watched/a && sleep 0.5 && echo x > watched/a/f.txt && rm watched/a/f.txt",
    ])
    .await?;
    let mut got = Vec::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(line) = lines.next_line().await? {
            let done = line == "REMOVED  watched/a/f.txt";
            got.push(line);
            if done {
                break;
            }
        }
        Ok::<_, anyhow::Error>(())
    })
    .await
    .with_context(|| format!("the watch printed only {got:?}"))??;
    assert_eq!(got[0], "CREATED  watched/a/", "{got:?}");
    assert!(
        got.contains(&"CREATED  watched/a/f.txt".to_owned()),
        "{got:?}"
    );
    child.kill().await?;

    // files mkdir (with the missing parents) and files rm (-r for a directory with things in it).
    assert_eq!(e.ok(&["files", "mkdir", &sb, "a/b/c"]).await?, "a/b/c\n");
    e.ok(&["exec", &sb, "--", "touch a/b/c/f && test -d a/b/c"])
        .await?;
    let out = e.run(&["files", "rm", &sb, "a"]).await?;
    assert_eq!(out.code, 1, "a non-empty directory without -r: {out:?}");
    // files mv: a rename; onto something only with -f.
    e.ok(&[
        "exec",
        &sb,
        "--",
        "echo one > one.txt && echo two > two.txt",
    ])
    .await?;
    assert_eq!(
        e.ok(&["files", "mv", &sb, "one.txt", "a/b/c/moved.txt"])
            .await?,
        "a/b/c/moved.txt\n"
    );
    let out = e
        .run(&["files", "mv", &sb, "two.txt", "a/b/c/moved.txt"])
        .await?;
    assert!(
        out.code == 1 && out.stderr.starts_with("mentis: ALREADY_EXISTS: "),
        "{out:?}"
    );
    e.ok(&["files", "mv", &sb, "-f", "two.txt", "a/b/c/moved.txt"])
        .await?;
    assert_eq!(
        e.ok(&[
            "exec",
            &sb,
            "--",
            "cat a/b/c/moved.txt; test -e two.txt || echo gone"
        ])
        .await?,
        "two\ngone\n"
    );
    e.ok(&["files", "rm", &sb, "-r", "a"]).await?;
    assert_eq!(
        e.ok(&["exec", &sb, "--", "test -e a && echo there || echo gone"])
            .await?,
        "gone\n"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcp_help_lists_every_tool() -> Result<()> {
    let bin = tokio::task::spawn_blocking(super::mentis_bin).await??;
    let out = tokio::process::Command::new(&bin)
        .args(["mcp", "--help"])
        .output()
        .await?;
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8_lossy(&out.stdout);
    for tool in [
        "create_sandbox",
        "run_shell",
        "run_python",
        "read_file",
        "write_file",
        "list_files",
        "preview_url",
        "delete_sandbox",
    ] {
        assert!(
            help.lines().any(|l| l.trim_start().starts_with(tool)),
            "{tool} is not listed: {help}"
        );
    }
    Ok(())
}
