//! Persistent shell sessions end to end: state carries over from one command to the next, each command
//! keeps its own start, output, end and exit code, a timeout or cancel interrupts only that command, and a
//! command that will not stop costs the session its shell, not the sandbox.

use std::time::Duration;

use anyhow::Result;
use mentis_e2e::*;
use mentis_proto::api;

fn in_session(session: &str, command: &str) -> api::ShellAction {
    api::ShellAction {
        command: command.to_owned(),
        session: session.to_owned(),
        ..Default::default()
    }
}

/// Runs `command` in `session`; returns (stdout, stderr, cmd_end).
async fn run(
    h: &mut Harness,
    sb: &str,
    session: &str,
    command: &str,
) -> Result<(String, String, api::CmdEnd)> {
    let obs = h.exec(sb, in_session(session, command)).await?;
    assert!(
        matches!(
            obs.first().and_then(|o| o.kind.as_ref()),
            Some(Kind::CmdStart(_))
        ),
        "cmd_start first: {obs:?}"
    );
    Ok((stdout(&obs), stderr(&obs), cmd_end(&obs)?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_cwd_env_and_variables_and_each_command_its_own_end() -> Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let sb = sb.sandbox_id.as_str();
    run(&mut h, sb, "work", "cd /tmp").await?;
    assert_eq!(run(&mut h, sb, "work", "pwd").await?.0, "/tmp\n");
    run(&mut h, sb, "work", "export X=1; Y=2; f() { echo fn-$1; }").await?;
    let (out, _, end) = run(&mut h, sb, "work", "echo $X $Y; f ok").await?;
    assert_eq!((out.as_str(), end.exit_code), ("1 2\nfn-ok\n", 0));
    // Exit codes, stderr apart from stdout, output without a final newline, a syntax error.
    assert_eq!(run(&mut h, sb, "work", "false").await?.2.exit_code, 1);
    assert_eq!(run(&mut h, sb, "work", "(exit 3)").await?.2.exit_code, 3);
    let (out, err, end) = run(&mut h, sb, "work", "echo out; echo err >&2; printf tail").await?;
    assert_eq!(
        (out.as_str(), err.as_str(), end.exit_code),
        ("out\ntail", "err\n", 0)
    );
    let (_, err, end) = run(&mut h, sb, "work", "echo 'unclosed").await?;
    assert!(
        end.exit_code != 0 && err.contains("unexpected EOF"),
        "{end:?} {err:?}"
    );
    assert_eq!(
        run(&mut h, sb, "work", "echo $X").await?.0,
        "1\n",
        "a syntax error keeps the session"
    );
    // A command of its own, another session: untouched.
    let plain = h.sh(sb, "pwd; echo ${X:-unset}").await?;
    assert_eq!(stdout(&plain), "/workspace\nunset\n");
    assert_eq!(
        run(&mut h, sb, "other", "pwd; echo ${X:-unset}").await?.0,
        "/workspace\nunset\n"
    );
    // work_dir and env of a session command stay, as if typed.
    let mut with = in_session("work", "pwd; echo $Z");
    with.work_dir = "/var".into();
    with.env = [("Z".to_owned(), "it's z".to_owned())].into();
    assert_eq!(stdout(&h.exec(sb, with).await?), "/var\nit's z\n");
    assert_eq!(
        run(&mut h, sb, "work", "pwd; echo $Z").await?.0,
        "/var\nit's z\n"
    );
    // The session's shell is the sandbox user's, demoted like every command.
    let (out, _, _) = run(&mut h, sb, "work", "id -u; cat /proc/self/oom_score_adj").await?;
    assert_eq!(out, "1000\n1000\n");
    // A session command reads no stdin: refused, naming the field.
    let mut stdin = in_session("work", "cat");
    stdin.stdin = bytes::Bytes::from_static(b"x");
    let r = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: sb.to_owned(),
            action: Some(shell_action(stdin)),
            action_id: String::new(),
        })
        .await;
    assert_eq!(
        refusal(r),
        (
            tonic::Code::InvalidArgument,
            "INVALID_ACTION".to_owned(),
            Some("action.shell.stdin".to_owned())
        )
    );
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timeout_or_cancel_interrupts_only_the_command_and_a_stubborn_one_costs_the_shell()
-> Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let sb = sb.sandbox_id.as_str();
    run(&mut h, sb, "s", "cd /tmp; export KEPT=yes").await?;
    // A timeout interrupts the program and the rest of the command: `echo after` does not run.
    let mut slow = in_session("s", "sleep 30; echo after");
    slow.timeout_seconds = 1;
    let obs = h.exec(sb, slow).await?;
    let end = cmd_end(&obs)?;
    assert_eq!(end.reason, api::EndReason::TimedOut as i32, "{end:?}");
    assert!(end.message.contains("keeps its state"), "{end:?}");
    assert!(!stdout(&obs).contains("after"), "{obs:?}");
    assert_eq!(
        run(&mut h, sb, "s", "echo $KEPT; pwd").await?.0,
        "yes\n/tmp\n"
    );
    // A cancel, the same.
    let mut long = in_session("s", "sleep 30");
    long.timeout_seconds = 60;
    let id = uuid::Uuid::new_v4().to_string();
    let mut stream = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: sb.to_owned(),
            action: Some(shell_action(long)),
            action_id: id.clone(),
        })
        .await?
        .into_inner();
    let _started = stream.message().await?;
    h.actions
        .cancel_action(api::CancelActionRequest {
            sandbox_id: sb.to_owned(),
            action_id: id,
        })
        .await?;
    let obs = collect(stream, Duration::from_secs(30)).await?;
    assert_eq!(cmd_end(&obs)?.reason, api::EndReason::Cancelled as i32);
    assert_eq!(run(&mut h, sb, "s", "echo $KEPT").await?.0, "yes\n");
    // A command that ignores SIGINT: the shell is killed after the grace, the next command has a fresh one.
    let mut stubborn = in_session("s", "trap '' INT; sleep 30");
    stubborn.timeout_seconds = 1;
    let end = cmd_end(&h.exec(sb, stubborn).await?)?;
    assert_eq!(end.reason, api::EndReason::TimedOut as i32);
    assert!(end.message.contains("shell was killed"), "{end:?}");
    assert_eq!(
        run(&mut h, sb, "s", "echo ${KEPT:-fresh}; pwd").await?.0,
        "fresh\n/workspace\n"
    );
    // `exit` ends the session with its code; the next command starts a new shell.
    run(&mut h, sb, "s", "export AGAIN=1").await?;
    assert_eq!(run(&mut h, sb, "s", "exit 4").await?.2.exit_code, 4);
    assert_eq!(run(&mut h, sb, "s", "echo ${AGAIN:-new}").await?.0, "new\n");
    h.stop().await
}
