//! Cells: streaming, errors, state, ordering, rich outputs, timeouts, cancel, bad requests.

use std::time::Duration;

use mentis_model::action::MAX_CODE_BYTES;
use mentis_proto::executor::run_response;
use mentis_proto::executor::{IpythonOutputKind, IpythonStatus};
use tonic::Code;

use super::super::support::*;
use super::*;

#[tokio::test]
async fn output_streams_while_the_cell_runs_and_an_error_ends_it() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let code = "import time\nprint(1)\ntime.sleep(1)\nprint(2)\n1/0";
    let (_, mut stream) = submit(&mut client, cell(code)).await;
    let seen = read_until(&mut stream, is_result).await;

    let Some(run_response::Kind::IpythonStart(start)) = &seen[0].1.kind else {
        panic!("ipython_start first: {seen:?}")
    };
    assert_eq!(start.code, code);
    assert_eq!(start.execution_count, 1);
    let stdout: Vec<(Instant, String)> = seen
        .iter()
        .filter_map(|(at, e)| match &e.kind {
            Some(run_response::Kind::IpythonOutput(o))
                if o.kind == IpythonOutputKind::StreamStdout as i32 =>
            {
                Some((*at, o.text.clone()))
            }
            _ => None,
        })
        .collect();
    let text: String = stdout.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(text, "1\n2\n");
    let (result_at, last) = seen.last().unwrap();
    // "1" was forwarded while the cell slept, not with its end (the sleep is 1 s; allow for load).
    let first_at = stdout.iter().find(|(_, t)| t.contains('1')).unwrap().0;
    assert!(
        *result_at - first_at >= Duration::from_millis(500),
        "the first output came {:?} before the result",
        *result_at - first_at
    );
    let Some(run_response::Kind::IpythonResult(result)) = &last.kind else {
        unreachable!()
    };
    assert_eq!(result.status, IpythonStatus::Error as i32);
    assert_eq!(result.error_name, "ZeroDivisionError");
    assert!(result.error_value.contains("division by zero"));
    assert!(!result.traceback.is_empty());
    assert!(
        result.traceback.iter().any(|l| l.contains("1/0")),
        "{:?}",
        result.traceback
    );
    // No colour codes: tracebacks are read as text.
    assert!(
        !result.traceback.concat().contains('\u{1b}'),
        "{:?}",
        result.traceback
    );
    assert_eq!(result.execution_count, 1);
    assert!(result.duration.is_some());
    assert!(stream.message().await.unwrap().is_none(), "the stream ends");
}

#[tokio::test]
async fn state_persists_across_cells() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let started = Instant::now();
    run_cell(&mut client, "x = 41").await.ok();
    let first = started.elapsed();
    let round_trip = Instant::now();
    let sum = run_cell(&mut client, "1+1").await.ok();
    let round_trip = round_trip.elapsed();
    assert_eq!(sum.value(), "2");
    let cell = run_cell(&mut client, "x + 1").await.ok();
    assert_eq!(cell.value(), "42");
    assert_eq!(cell.result().execution_count, 3);
    eprintln!("first cell (with kernel start): {first:?}; `1+1` round trip: {round_trip:?}");
}

#[tokio::test]
async fn cells_submitted_together_run_one_at_a_time_in_order() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let (_, first) = submit(
        &mut client,
        cell("import time\nlog = []\ntime.sleep(1)\nlog.append(1)"),
    )
    .await;
    let (_, second) = submit(&mut client, cell("log.append(2)\ntime.sleep(0.2)")).await;
    let (_, third) = submit(&mut client, cell("log.append(3)\nlog")).await;
    let (first, second, third) = tokio::join!(
        collect_cell(first),
        collect_cell(second),
        collect_cell(third)
    );
    let (first, second, third) = (first.ok(), second.ok(), third.ok());
    assert_eq!(third.value(), "[1, 2, 3]");
    let counts: Vec<i32> = [&first, &second, &third]
        .iter()
        .map(|c| c.starts()[0].execution_count)
        .collect();
    assert_eq!(counts, vec![1, 2, 3]);
    // Each started only after the one before had ended.
    let time = |cell: &Cell, pick: fn(&RunResponse) -> bool| {
        let event = cell.0.iter().find(|e| pick(e)).unwrap();
        let t = event.time.unwrap();
        (t.seconds, t.nanos)
    };
    assert!(time(&first, is_result) <= time(&second, is_start));
    assert!(time(&second, is_result) <= time(&third, is_start));
}

#[tokio::test]
async fn a_shell_command_runs_while_a_cell_sleeps() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let (_, mut sleeper) = submit(&mut client, cell("import time\ntime.sleep(4)")).await;
    read_until(&mut sleeper, is_start).await;
    let shell_started = Instant::now();
    let events = run(&mut client, shell("echo beside")).await;
    assert_eq!(events.stdout(), b"beside\n");
    assert!(
        shell_started.elapsed() < Duration::from_secs(3),
        "the shell did not wait for the cell"
    );
    let rest = collect_cell(sleeper).await;
    assert_eq!(rest.status(), IpythonStatus::Ok);
}

#[tokio::test]
async fn rich_outputs_carry_their_mime_bundles() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let plot = run_cell(
        &mut client,
        "%matplotlib inline\nimport matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.show()",
    )
    .await
    .ok();
    let images = plot.bundles(IpythonOutputKind::DisplayData);
    assert!(!images.is_empty(), "{plot:?}");
    let png = images[0].get("image/png").expect("image/png");
    // base64 of the PNG signature.
    assert!(
        png.starts_with("iVBORw0KGgo"),
        "{}",
        &png[..png.len().min(40)]
    );
    assert!(images[0].contains_key("text/plain"));

    let frame = run_cell(
        &mut client,
        "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': ['x', 'y']})",
    )
    .await
    .ok();
    let results = frame.bundles(IpythonOutputKind::ExecuteResult);
    assert!(results[0]["text/html"].contains("<table"), "{results:?}");
    assert!(results[0]["text/plain"].contains('a'));

    let rich = run_cell(
        &mut client,
        "from IPython.display import display, JSON, HTML\n\
         h = display(HTML('<b>v1</b>'), display_id='d1')\n\
         h.update(HTML('<b>v2</b>'))\n\
         display(JSON({'k': [1, 2]}))\n\
         import sys; print('err', file=sys.stderr)",
    )
    .await
    .ok();
    let displays = rich.bundles(IpythonOutputKind::DisplayData);
    assert_eq!(displays.len(), 2, "{rich:?}");
    assert_eq!(displays[1]["application/json"], r#"{"k":[1,2]}"#);
    let updates: Vec<_> = rich
        .outputs()
        .into_iter()
        .filter(|o| o.kind == IpythonOutputKind::UpdateDisplayData as i32)
        .collect();
    assert_eq!(updates.len(), 1);
    assert_eq!(updates[0].display_id, "d1");
    assert!(updates[0].data["text/html"].contains("v2"));
    let first_display = rich
        .outputs()
        .into_iter()
        .find(|o| o.kind == IpythonOutputKind::DisplayData as i32)
        .unwrap();
    assert_eq!(first_display.display_id, "d1");
    assert_eq!(rich.stderr(), "err\n");
}

#[tokio::test]
async fn a_timeout_interrupts_the_cell_and_keeps_the_state() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    run_cell(&mut client, "kept = 5").await.ok();
    let mut sleeper = cell("import time\nnew_name = 1\ntime.sleep(100)");
    sleeper.timeout_seconds = 2;
    let started = Instant::now();
    let (_, stream) = submit(&mut client, sleeper).await;
    let aborted = collect_cell(stream).await;
    let result = aborted.result();
    assert_eq!(aborted.status(), IpythonStatus::Aborted, "{result:?}");
    assert_eq!(result.reason, "timed out after 2 s");
    assert_eq!(result.error_name, "KeyboardInterrupt");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert!(
        aborted.agent_states().is_empty(),
        "the kernel was not replaced"
    );
    let after = run_cell(&mut client, "kept, 'new_name' in globals()")
        .await
        .ok();
    // The interrupted cell's new name was rolled back; earlier state is there.
    assert_eq!(after.value(), "(5, False)");
    assert_eq!(after.result().execution_count, 3);
}

#[tokio::test]
async fn cancel_interrupts_a_running_cell_and_drops_a_queued_one() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    run_cell(&mut client, "kept = 'yes'").await.ok();
    let (running_id, mut running) = submit(&mut client, cell("while True:\n    pass")).await;
    let (queued_id, queued) = submit(&mut client, cell("never = 1")).await;
    read_until(&mut running, is_start).await;

    cancel(&mut client, &queued_id).await;
    let dropped = collect_cell(queued).await;
    assert_eq!(dropped.status(), IpythonStatus::Aborted);
    assert_eq!(dropped.result().reason, "cancelled before it started");
    assert!(dropped.starts().is_empty(), "it never started");

    cancel(&mut client, &running_id).await;
    let cancelled = collect_cell(running).await;
    assert_eq!(cancelled.status(), IpythonStatus::Aborted);
    assert_eq!(cancelled.result().reason, "cancelled");

    let after = run_cell(&mut client, "kept, 'never' in globals()")
        .await
        .ok();
    assert_eq!(after.value(), "('yes', False)");
    let status = client
        .cancel(mentis_proto::executor::CancelRequest {
            action_id: running_id,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
}

#[tokio::test]
async fn the_queue_is_bounded() {
    let executor = start_ipython_with(|config| config.kernel.queue_limit = 2).await;
    let mut client = executor.client().await;
    let (sleeper_id, mut sleeper) = submit(&mut client, cell("import time\ntime.sleep(60)")).await;
    read_until(&mut sleeper, is_start).await;
    let (_, a) = submit(&mut client, cell("1")).await;
    let (_, b) = submit(&mut client, cell("2")).await;
    let status = client
        .run(cell_request(&action_id(), cell("3")))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    cancel(&mut client, &sleeper_id).await;
    assert_eq!(collect_cell(sleeper).await.status(), IpythonStatus::Aborted);
    assert_eq!(collect_cell(a).await.ok().value(), "1");
    assert_eq!(collect_cell(b).await.ok().value(), "2");
}

#[tokio::test]
async fn bad_cells_are_refused_and_large_ones_run() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    for code in ["", "  \n\t"] {
        let status = client
            .run(cell_request(&action_id(), cell(code)))
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{code:?}");
    }
    // Just over the model's limit (the control plane's too): refused by validation, not by the transport.
    let too_big = format!("x = '{}'", "a".repeat(MAX_CODE_BYTES));
    let status = client
        .run(cell_request(&action_id(), cell(&too_big)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("limit"), "{}", status.message());

    // Several megabytes of code run; the echo in ipython_start is cut.
    let big = format!("big = '{}'\nlen(big)", "b".repeat(3_000_000));
    let cell = run_cell(&mut client, &big).await.ok();
    assert_eq!(cell.value(), "3000000");
    let echo = &cell.starts()[0].code;
    assert!(
        echo.len() < 100_000 && echo.contains("not shown"),
        "{}",
        echo.len()
    );

    // input() has no terminal: it fails at once instead of hanging.
    let asked = run_cell(&mut client, "input('name? ')").await;
    assert_eq!(asked.status(), IpythonStatus::Error);
    assert_eq!(asked.result().error_name, "StdinNotImplementedError");
}
