//! Stdin: request bytes, /dev/null by default, keep_stdin_open with WriteStdin, and its refusals.

use mentis_proto::executor::EndReason;
use mentis_proto::executor::{CancelRequest, RunResponse, WriteStdinRequest, run_response};
use tonic::{Code, Streaming};

use super::support::*;

fn write(action_id: &str, data: &[u8], eof: bool) -> WriteStdinRequest {
    WriteStdinRequest {
        action_id: action_id.to_owned(),
        data: data.to_vec().into(),
        eof,
    }
}

/// Reads stdout events until `expected` has been seen in full.
async fn read_stdout_until(stream: &mut Streaming<RunResponse>, expected: &[u8]) {
    let mut seen = Vec::new();
    while seen.len() < expected.len() {
        match next(stream).await.kind {
            Some(run_response::Kind::CmdOutput(out)) => seen.extend_from_slice(&out.data),
            other => panic!("expected output, got {other:?}"),
        }
    }
    assert_eq!(seen, expected);
}

#[tokio::test]
async fn stdin_bytes_are_written_then_closed() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let mut action = shell("cat; echo end");
    action.stdin = b"abc\xff\n".to_vec().into();
    let events = run(&mut client, action).await;
    assert_eq!(events.end().exit_code, 0);
    assert_eq!(events.stdout(), b"abc\xff\nend\n");
}

#[tokio::test]
async fn without_stdin_the_command_reads_eof() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let events = run(&mut client, shell("cat; echo end")).await;
    assert_eq!(events.end().exit_code, 0);
    assert_eq!(events.stdout(), b"end\n");
}

#[tokio::test]
async fn keep_stdin_open_then_write_stdin_until_eof() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let id = action_id();
    let mut action = shell("cat");
    action.stdin = b"first\n".to_vec().into();
    action.keep_stdin_open = true;
    let mut stream = start(&mut client, request(&id, action)).await;
    expect_start(&mut stream).await;
    read_stdout_until(&mut stream, b"first\n").await;

    client
        .write_stdin(write(&id, b"second\n", false))
        .await
        .unwrap();
    read_stdout_until(&mut stream, b"second\n").await;
    client.write_stdin(write(&id, b"", true)).await.unwrap();

    let events = collect(stream).await;
    let end = events.0.last().cloned().unwrap();
    match end.kind {
        Some(run_response::Kind::CmdEnd(end)) => {
            assert_eq!(reason(&end), EndReason::Exited);
            assert_eq!(end.exit_code, 0);
        }
        other => panic!("expected cmd_end, got {other:?}"),
    }
    let status = client
        .write_stdin(write(&id, b"late", false))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
}

#[tokio::test]
async fn write_stdin_after_eof_or_without_keep_stdin_open_is_failed_precondition() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let gate = "while [ ! -e stop ]; do sleep 0.05; done";

    let open_id = action_id();
    let mut open = shell(&format!("cat; {gate}"));
    open.keep_stdin_open = true;
    let mut open_stream = start(&mut client, request(&open_id, open)).await;
    expect_start(&mut open_stream).await;
    client
        .write_stdin(write(&open_id, b"", true))
        .await
        .unwrap();
    let status = client
        .write_stdin(write(&open_id, b"x", false))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);

    let closed_id = action_id();
    let mut closed_stream = start(&mut client, request(&closed_id, shell(gate))).await;
    expect_start(&mut closed_stream).await;
    let status = client
        .write_stdin(write(&closed_id, b"x", false))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);

    let status = client
        .write_stdin(write("no-such-action", b"x", false))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    for id in [&open_id, &closed_id] {
        client
            .cancel(CancelRequest {
                action_id: id.clone(),
            })
            .await
            .unwrap();
    }
    for stream in [open_stream, closed_stream] {
        assert_eq!(
            reason(&collect(stream).await.0.last().map_or_else(
                || panic!("no events"),
                |e| match &e.kind {
                    Some(run_response::Kind::CmdEnd(end)) => end.clone(),
                    other => panic!("expected cmd_end, got {other:?}"),
                }
            )),
            EndReason::Cancelled
        );
    }
}
