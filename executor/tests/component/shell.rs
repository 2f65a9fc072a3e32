//! Shell actions: streaming, streams, env, work_dir, bytes, volume, concurrency, timeouts, background jobs.

use std::collections::HashMap;

use mentis_proto::executor::run_response;
use mentis_proto::executor::{EndReason, OutputStream};

use super::support::*;

#[tokio::test]
async fn output_streams_before_the_command_ends_and_the_exit_code_is_kept() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let command = "printf hello; while [ ! -e go ]; do sleep 0.05; done; echo world; exit 3";
    let mut stream = start(&mut client, request(&action_id(), shell(command))).await;

    let started = expect_start(&mut stream).await;
    assert_eq!(started.command, command);
    assert!(started.pid > 0);

    // "hello" (no newline) must arrive while the command is still blocked on the gate: output is streamed
    // as it is written, not by line.
    let first = next(&mut stream).await;
    assert_eq!(first.index, 2);
    match &first.kind {
        Some(run_response::Kind::CmdOutput(out)) => {
            assert_eq!(out.stream, OutputStream::Stdout as i32);
            assert_eq!(&out.data[..], b"hello");
        }
        other => panic!("expected hello, got {other:?}"),
    }
    std::fs::write(executor.path("go"), b"").unwrap();

    let mut rest = collect(stream).await.0;
    let mut all = vec![
        mentis_proto::executor::RunResponse {
            index: 1,
            time: Some(prost_types::Timestamp::default()),
            kind: Some(run_response::Kind::CmdStart(started)),
        },
        first,
    ];
    all.append(&mut rest);
    let events = Events(all);
    assert_eq!(events.stdout(), b"helloworld\n");
    let end = events.end();
    assert_eq!(reason(&end), EndReason::Exited);
    assert_eq!((end.exit_code, end.signal), (3, 0));
    assert!(end.duration.is_some());
}

#[tokio::test]
async fn stderr_is_a_separate_stream() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let events = run(&mut client, shell("echo out; echo err >&2; echo out2")).await;
    assert_eq!(events.stdout(), b"out\nout2\n");
    assert_eq!(events.stderr(), b"err\n");
    assert_eq!(events.end().exit_code, 0);
}

#[tokio::test]
async fn env_is_layered_image_then_sandbox_then_action() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let mut action = shell(r#"echo "$LAYER_A $LAYER_B $HOME ${PATH:+image-path}""#);
    action.env = HashMap::from([("LAYER_B".to_owned(), "action".to_owned())]);
    let mut run_request = request(&action_id(), action);
    run_request.env = HashMap::from([
        ("LAYER_A".to_owned(), "sandbox".to_owned()),
        ("LAYER_B".to_owned(), "sandbox".to_owned()),
        // Over the image (here: the test process's) HOME.
        ("HOME".to_owned(), "/from-sandbox".to_owned()),
    ]);
    let events = collect(start(&mut client, run_request).await).await;
    assert_eq!(events.end().exit_code, 0);
    assert_eq!(
        String::from_utf8_lossy(&events.stdout()),
        "sandbox action /from-sandbox image-path\n"
    );
}

#[tokio::test]
async fn work_dir_defaults_to_the_workspace_and_resolves_relative_paths() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    std::fs::create_dir(executor.path("sub")).unwrap();
    let root = executor.workspace.path().canonicalize().unwrap();

    let events = run(&mut client, shell("pwd -P")).await;
    assert_eq!(events.stdout(), format!("{}\n", root.display()).as_bytes());

    let mut relative = shell("pwd -P");
    relative.work_dir = "sub".to_owned();
    let events = run(&mut client, relative).await;
    assert_eq!(
        events.stdout(),
        format!("{}\n", root.join("sub").display()).as_bytes()
    );

    let mut absolute = shell("pwd -P");
    absolute.work_dir = "/".to_owned();
    assert_eq!(run(&mut client, absolute).await.stdout(), b"/\n");
}

#[tokio::test]
async fn a_bad_work_dir_is_failed_to_start_not_an_rpc_error() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    std::fs::write(executor.path("a-file"), b"x").unwrap();
    for work_dir in ["missing", "a-file", "/nonexistent/mentis"] {
        let mut action = shell("echo never");
        action.work_dir = work_dir.to_owned();
        let events = run(&mut client, action).await;
        let end = events.end();
        assert_eq!(events.0.len(), 1, "only cmd_end: {events:?}");
        assert_eq!(reason(&end), EndReason::FailedToStart);
        assert_eq!(end.exit_code, -1);
        assert!(end.message.contains("work_dir"), "{}", end.message);
    }
}

#[tokio::test]
async fn non_utf8_output_is_byte_exact() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let events = run(
        &mut client,
        shell(r"printf '\xff\xfe'; printf 'a\x00b' >&2"),
    )
    .await;
    assert_eq!(events.stdout(), [0xff, 0xfe]);
    assert_eq!(events.stderr(), b"a\x00b");
    assert_eq!(events.end().exit_code, 0);
}

#[tokio::test]
async fn one_mebibyte_arrives_intact_in_bounded_chunks() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let events = run(
        &mut client,
        shell("head -c 1048576 /dev/urandom > blob && cat blob"),
    )
    .await;
    assert_eq!(events.end().exit_code, 0);
    let blob = std::fs::read(executor.path("blob")).unwrap();
    assert_eq!(blob.len(), 1 << 20);
    assert!(events.stdout() == blob, "output differs from the file");
    assert!(
        events
            .chunks(OutputStream::Stdout)
            .iter()
            .all(|c| !c.is_empty() && c.len() <= 64 * 1024)
    );
}

#[tokio::test]
async fn commands_run_concurrently() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    // Each command blocks until the test opens the gate: if they ran one at a time, the second would
    // never start while the first waits, and the test would time out.
    let mut streams = Vec::new();
    for i in 0..3 {
        let command =
            format!("touch started-{i}; while [ ! -e release ]; do sleep 0.05; done; sleep 1");
        streams.push(start(&mut client, request(&action_id(), shell(&command))).await);
    }
    for stream in &mut streams {
        expect_start(stream).await;
    }
    eventually("all three commands are running", || {
        (0..3).all(|i| executor.path(&format!("started-{i}")).exists())
    })
    .await;
    std::fs::write(executor.path("release"), b"").unwrap();
    for stream in streams {
        let events = collect(stream).await;
        let end = events.end();
        assert_eq!((reason(&end), end.exit_code), (EndReason::Exited, 0));
    }
}

#[tokio::test]
async fn a_timeout_kills_the_whole_process_group() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let mut action = shell("sleep 1000 & echo $! > bg.pid; sleep 1000");
    action.timeout_seconds = 3;
    let mut stream = start(&mut client, request(&action_id(), action)).await;
    let pgid = expect_start(&mut stream).await.pid;
    let events = collect(stream).await;
    let end = events.end();
    assert_eq!(reason(&end), EndReason::TimedOut);
    assert_eq!(end.exit_code, -1);
    assert_eq!(end.signal, 9);
    assert!(end.message.contains("timed out"), "{}", end.message);

    let background = read_pid(&executor.path("bg.pid"));
    eventually("the background sleep is gone", || !is_alive(background)).await;
    eventually("the process group is empty", || {
        live_in_group(pgid).is_empty()
    })
    .await;
}

#[tokio::test]
async fn a_signal_exit_is_128_plus_the_signal() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let end = run(&mut client, shell("kill -TERM $$")).await.end();
    assert_eq!(reason(&end), EndReason::Exited);
    assert_eq!((end.exit_code, end.signal), (143, 15));
}

#[tokio::test]
async fn a_background_job_holding_the_pipes_neither_hangs_nor_dies_with_the_action() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    // The background sleep inherits stdout/stderr and keeps them open.
    let events = run(
        &mut client,
        shell("sleep 1000 & echo $! > bg.pid; echo done"),
    )
    .await;
    let end = events.end();
    assert_eq!((reason(&end), end.exit_code), (EndReason::Exited, 0));
    assert_eq!(events.stdout(), b"done\n");

    let background = read_pid(&executor.path("bg.pid"));
    assert!(
        is_alive(background),
        "a normal exit leaves background jobs running"
    );
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(background),
        nix::sys::signal::Signal::SIGKILL,
    );
}

#[tokio::test]
async fn a_large_stdin_and_output_at_once_do_not_deadlock() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let input: Vec<u8> = (0..(512 * 1024)).map(|i| (i % 251) as u8).collect();
    let mut action = shell("cat");
    action.stdin = input.clone().into();
    let events = run(&mut client, action).await;
    assert_eq!(events.end().exit_code, 0);
    assert!(events.stdout() == input, "cat echoed its input");
}

#[tokio::test]
async fn the_shell_action_sees_a_unique_process_group() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let mut stream = start(
        &mut client,
        request(
            &action_id(),
            shell("read -ra stat < /proc/$$/stat; echo ${stat[4]}"),
        ),
    )
    .await;
    let pid = expect_start(&mut stream).await.pid;
    let events = collect(stream).await;
    assert_eq!(events.end().exit_code, 0);
    // pgid == pid: bash leads its own group (also what cmd_start's pid promises).
    let out = String::from_utf8(events.stdout()).unwrap();
    assert_eq!(out.trim(), pid.to_string());
}
