//! Shell actions end to end: streaming order, exit codes, stderr, env and work_dir, binary output,
//! concurrency, timeout and cancel that kill the whole process group, stdin.

use std::time::{Duration, Instant};

use futures::StreamExt;
use mentis_e2e::*;
use mentis_proto::api;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readme_scenario_streams_live_and_ends_once_with_exit_3() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let mut stream = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: sb.sandbox_id.clone(),
            action: Some(shell_action(cmd(
                "echo hello && sleep 1 && echo world && exit 3",
            ))),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let mut obs = Vec::new();
    let mut hello_at = None;
    let mut end_at = None;
    while let Some(m) = tokio::time::timeout(Duration::from_secs(60), stream.next()).await? {
        let Some(api::execute_response::Kind::Observation(o)) = m?.kind else {
            anyhow::bail!("expected observations only");
        };
        if stdout(std::slice::from_ref(&o)).contains("hello") {
            hello_at = Some(Instant::now());
        }
        if matches!(o.kind, Some(Kind::CmdEnd(_))) {
            end_at = Some(Instant::now());
        }
        obs.push(o);
    }
    assert!(
        matches!(obs[0].kind, Some(Kind::CmdStart(_))),
        "first is cmd_start: {obs:?}"
    );
    let out = stdout(&obs);
    assert_eq!(out, "hello\nworld\n");
    let end = cmd_end(&obs)?;
    assert_eq!(
        (end.exit_code, end.reason),
        (3, api::EndReason::Exited as i32)
    );
    assert!(
        matches!(obs.last().unwrap().kind, Some(Kind::CmdEnd(_))),
        "cmd_end is last"
    );
    // Output arrives while the command runs, not at its end: hello came a good part of the sleep earlier.
    let gap = end_at.unwrap() - hello_at.expect("hello arrived");
    assert!(
        gap >= Duration::from_millis(500),
        "hello arrived only {gap:?} before the end"
    );
    // seq strictly increasing, one action id throughout.
    assert!(obs.windows(2).all(|w| w[0].seq < w[1].seq));
    assert!(
        obs.iter()
            .all(|o| o.action_id == obs[0].action_id && !o.action_id.is_empty())
    );
    h.stop().await
}

#[tokio::test]
async fn stderr_env_workdir_and_binary_output() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h
        .create(api::SandboxSpec {
            env: [
                ("FROM_SANDBOX".to_owned(), "s".to_owned()),
                ("BOTH".to_owned(), "sandbox".to_owned()),
            ]
            .into(),
            ..Default::default()
        })
        .await?;
    let id = sb.sandbox_id.clone();

    let obs = h.sh(&id, "echo out; echo err >&2; echo out2").await?;
    assert_eq!(output(&obs, api::OutputStream::Stdout), b"out\nout2\n");
    assert_eq!(output(&obs, api::OutputStream::Stderr), b"err\n");

    let obs = h
        .exec(
            &id,
            api::ShellAction {
                command: "mkdir -p sub && cd sub && pwd".into(),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(stdout(&obs), "/workspace/sub\n");
    let obs = h
        .exec(
            &id,
            api::ShellAction {
                command: "pwd; echo $FROM_SANDBOX $BOTH $ONLY_ACTION".into(),
                work_dir: "sub".into(),
                env: [
                    ("BOTH".to_owned(), "action".to_owned()),
                    ("ONLY_ACTION".to_owned(), "a".to_owned()),
                ]
                .into(),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(stdout(&obs), "/workspace/sub\ns action a\n");

    // A missing work_dir is data: FAILED_TO_START, not an RPC error.
    let obs = h
        .exec(
            &id,
            api::ShellAction {
                command: "true".into(),
                work_dir: "/does/not/exist".into(),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(cmd_end(&obs)?.reason, api::EndReason::FailedToStart as i32);

    // Bytes that are not UTF-8 arrive exactly.
    let obs = h.sh(&id, r"printf '\xff\xfe\x00\x80abc'").await?;
    assert_eq!(
        output(&obs, api::OutputStream::Stdout),
        b"\xff\xfe\x00\x80abc"
    );

    // 1 MiB of every byte value, intact and in order.
    let obs = h
        .sh(
            &id,
            "python3 -c 'import sys; sys.stdout.buffer.write(bytes(range(256)) * 4096)'",
        )
        .await?;
    let expected: Vec<u8> = (0..4096).flat_map(|_| 0..=255u8).collect();
    let got = output(&obs, api::OutputStream::Stdout);
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "1 MiB output corrupted");
    assert_eq!(cmd_end(&obs)?.exit_code, 0);
    h.stop().await
}

#[tokio::test]
async fn three_commands_run_at_once() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let mut tasks = Vec::new();
    for i in 0..3 {
        let mut actions = h.actions.clone();
        let id = sb.sandbox_id.clone();
        tasks.push(tokio::spawn(async move {
            let s = actions
                .execute(api::ExecuteRequest {
                    sandbox_id: id,
                    action: Some(shell_action(cmd(&format!("sleep 2; echo {i}")))),
                    action_id: String::new(),
                })
                .await?
                .into_inner();
            collect(s, Duration::from_secs(60)).await
        }));
    }
    let mut starts = Vec::new();
    let mut ends = Vec::new();
    for t in tasks {
        let obs = t.await??;
        assert_eq!(cmd_end(&obs)?.exit_code, 0);
        for o in obs {
            match o.kind {
                Some(Kind::CmdStart(_)) => starts.push(o.seq),
                Some(Kind::CmdEnd(_)) => ends.push(o.seq),
                _ => {}
            }
        }
    }
    assert_eq!((starts.len(), ends.len()), (3, 3));
    let last_start = starts.iter().max().unwrap();
    let first_end = ends.iter().min().unwrap();
    assert!(
        last_start < first_end,
        "all three start before any ends: starts {starts:?} ends {ends:?}"
    );
    h.stop().await
}

/// Processes whose command line contains `marker`, as seen inside the sandbox.
async fn leftovers(h: &mut Harness, sandbox: &str, marker: &str) -> anyhow::Result<String> {
    // The pattern is split so it does not match this very command.
    let obs = h
        .sh(
            sandbox,
            &format!(
                "ps -eo pid,args | grep -F '{}''{}' | grep -v grep || true",
                &marker[..1],
                &marker[1..]
            ),
        )
        .await?;
    Ok(stdout(&obs))
}

#[tokio::test]
async fn timeout_kills_the_whole_process_group() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let started = Instant::now();
    let obs = h
        .exec(
            &sb.sandbox_id,
            api::ShellAction {
                command: "bash -c 'sleep 1000 & sleep 1000'".into(),
                timeout_seconds: 2,
                ..Default::default()
            },
        )
        .await?;
    let end = cmd_end(&obs)?;
    assert_eq!(end.reason, api::EndReason::TimedOut as i32, "{end:?}");
    assert!(started.elapsed() < Duration::from_secs(60));
    let left = leftovers(&mut h, &sb.sandbox_id, "sleep 1000").await?;
    assert!(left.trim().is_empty(), "processes left behind: {left}");
    h.stop().await
}

#[tokio::test]
async fn cancel_kills_the_command_and_disconnect_does_not() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();

    // A client that hangs up mid-command does not stop it: the command finishes and its end is logged.
    let action_id = uuid::Uuid::new_v4().to_string();
    let mut stream = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.clone(),
            action: Some(shell_action(cmd(
                "sleep 2; echo done > /workspace/marker; echo finished",
            ))),
            action_id: action_id.clone(),
        })
        .await?
        .into_inner();
    let first = stream.next().await.unwrap()?;
    assert!(matches!(
        first.kind,
        Some(api::execute_response::Kind::Observation(api::Observation {
            kind: Some(Kind::CmdStart(_)),
            ..
        }))
    ));
    drop(stream);
    let replay = h
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: id.clone(),
            after_seq: 0,
            action_id: action_id.clone(),
        })
        .await?
        .into_inner();
    let obs = collect_stream(replay).await?;
    let end = cmd_end(&obs)?;
    assert_eq!(
        (end.exit_code, end.reason),
        (0, api::EndReason::Exited as i32)
    );
    assert_eq!(stdout(&obs), "finished\n");
    assert_eq!(stdout(&h.sh(&id, "cat /workspace/marker").await?), "done\n");

    // CancelAction stops a command and its children.
    let action_id = uuid::Uuid::new_v4().to_string();
    let mut stream = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.clone(),
            action: Some(shell_action(cmd("sleep 1001 & sleep 1001; echo never"))),
            action_id: action_id.clone(),
        })
        .await?
        .into_inner();
    stream.next().await.unwrap()?; // cmd_start: it runs
    h.actions
        .cancel_action(api::CancelActionRequest {
            sandbox_id: id.clone(),
            action_id: action_id.clone(),
        })
        .await?;
    let obs = collect(stream, Duration::from_secs(30)).await?;
    let end = cmd_end(&obs)?;
    assert_eq!(end.reason, api::EndReason::Cancelled as i32, "{end:?}");
    assert!(!stdout(&obs).contains("never"));
    let left = leftovers(&mut h, &id, "sleep 1001").await?;
    assert!(left.trim().is_empty(), "processes left behind: {left}");
    // Cancelling a finished action is harmless; an unknown one is NotFound.
    h.actions
        .cancel_action(api::CancelActionRequest {
            sandbox_id: id.clone(),
            action_id,
        })
        .await?;
    let err = h
        .actions
        .cancel_action(api::CancelActionRequest {
            sandbox_id: id.clone(),
            action_id: "no-such-action".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    h.stop().await
}

#[tokio::test]
async fn stdin_inline_and_streamed_over_connect() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let obs = h
        .exec(
            &sb.sandbox_id,
            api::ShellAction {
                command: "tr a-z A-Z".into(),
                stdin: bytes::Bytes::from_static(b"hello stdin"),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(stdout(&obs), "HELLO STDIN");

    // Connect: submit with stdin kept open, write twice, close, read the result.
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    let mut resp = h
        .actions
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    use api::connect_request::{Attach, Kind as Req, Stdin, Submit};
    let send = |k| api::ConnectRequest { kind: Some(k) };
    tx.send(send(Req::Attach(Attach {
        sandbox_id: sb.sandbox_id.clone(),
        after_seq: None,
    })))
    .await?;
    let action_id = "stdin-action-1".to_owned();
    tx.send(send(Req::Submit(Submit {
        action: Some(shell_action(api::ShellAction {
            command: "cat".into(),
            keep_stdin_open: true,
            ..Default::default()
        })),
        action_id: action_id.clone(),
    })))
    .await?;
    let mut accepted = false;
    let mut out = Vec::new();
    let mut sent = false;
    loop {
        let m = tokio::time::timeout(Duration::from_secs(60), resp.next())
            .await?
            .unwrap()?;
        match m.kind {
            Some(api::connect_response::Kind::Attached(_)) => {}
            Some(api::connect_response::Kind::Accepted(a)) => {
                assert_eq!(a.action_id, action_id);
                accepted = true;
                if !sent {
                    sent = true;
                    tx.send(send(Req::Stdin(Stdin {
                        action_id: action_id.clone(),
                        data: "one ".into(),
                        eof: false,
                    })))
                    .await?;
                    tx.send(send(Req::Stdin(Stdin {
                        action_id: action_id.clone(),
                        data: "two".into(),
                        eof: true,
                    })))
                    .await?;
                }
            }
            Some(api::connect_response::Kind::Rejected(r)) => anyhow::bail!("rejected: {r:?}"),
            Some(api::connect_response::Kind::Observation(o)) => {
                if o.action_id == action_id {
                    if let Some(Kind::CmdOutput(c)) = &o.kind {
                        out.extend_from_slice(&c.data);
                    }
                    if let Some(Kind::CmdEnd(e)) = &o.kind {
                        assert_eq!(e.exit_code, 0);
                        break;
                    }
                }
            }
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    assert!(accepted);
    assert_eq!(out, b"one two");
    h.stop().await
}

/// A command longer than Linux lets one argument be (128 KiB; the API allows 4 MiB), as an agent writing a
/// file with a heredoc sends: it runs, and the action's stdin still reaches it.
#[tokio::test]
async fn a_command_of_megabytes_runs_and_still_gets_its_stdin() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let content: String = (0..50_000)
        .map(|i| format!("line {i:05}: \\ 'single' \"double\" $HOME `date` é\n"))
        .collect();
    let command = format!(
        "cat > big.txt <<'END'\n{content}END\nwc -c < big.txt\nsed -n '12346p' big.txt\ncat"
    );
    assert!(command.len() > 2 * 1024 * 1024, "{}", command.len());
    let obs = h
        .exec(
            &sb.sandbox_id,
            api::ShellAction {
                command,
                stdin: bytes::Bytes::from_static(b"and its stdin\n"),
                ..Default::default()
            },
        )
        .await?;
    let end = obs
        .iter()
        .find_map(|o| match &o.kind {
            Some(Kind::CmdEnd(e)) => Some(e.clone()),
            _ => None,
        })
        .ok_or_else(|| anyhow::anyhow!("no cmd_end"))?;
    assert_eq!((end.exit_code, end.message.as_str()), (0, ""), "{end:?}");
    assert_eq!(
        stdout(&obs),
        format!(
            "{}\nline 12345: \\ 'single' \"double\" $HOME `date` é\nand its stdin\n",
            content.len()
        )
    );
    h.stop().await
}

/// Reads a StreamObservations stream (filtered to one action, so it ends) to its end.
pub async fn collect_stream(
    mut s: tonic::Streaming<api::StreamObservationsResponse>,
) -> anyhow::Result<Vec<api::Observation>> {
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(120), async {
        while let Some(m) = s.next().await {
            match m?.kind {
                Some(api::stream_observations_response::Kind::Observation(o)) => out.push(o),
                Some(api::stream_observations_response::Kind::Keepalive(_)) => {}
                other => anyhow::bail!("unexpected {other:?}"),
            }
        }
        Ok(())
    })
    .await??;
    Ok(out)
}
