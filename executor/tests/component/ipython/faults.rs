//! Faults: a kernel that dies (in a cell, by a shell action, while idle) or ignores the interrupt, huge
//! output, bad bytes, forks, and the rollback of a failed cell's names.

use std::time::Duration;

use mentis_proto::executor::{IpythonOutputKind, IpythonStatus};

use super::super::support::*;
use super::*;

/// The kernel's pid, asked from the kernel.
async fn kernel_pid(client: &mut Client) -> i32 {
    run_cell(client, "import os; os.getpid()")
        .await
        .ok()
        .value()
        .parse()
        .unwrap()
}

fn restarted(cell: &Cell, reason: &str) -> HashMap<String, String> {
    let states = cell.agent_states();
    assert_eq!(states.len(), 1, "one agent_state: {cell:?}");
    assert_eq!(states[0].message, "kernel restarted", "{:?}", states[0]);
    assert_eq!(states[0].details["reason"], reason, "{:?}", states[0]);
    states[0].details.clone()
}

#[tokio::test]
async fn a_kernel_killed_by_its_cell_is_replaced_and_the_queue_goes_on() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    run_cell(&mut client, "before = 1").await.ok();
    let old_pid = kernel_pid(&mut client).await;
    let (_, dying) = submit(
        &mut client,
        cell(
            "import os, time\nprint('going', flush=True)\ntime.sleep(0.5)\nos.kill(os.getpid(), 9)",
        ),
    )
    .await;
    let (_, queued) = submit(&mut client, cell("'before' in globals()")).await;

    let dying = collect_cell(dying).await;
    let result = dying.result();
    assert_eq!(dying.status(), IpythonStatus::Aborted);
    assert!(result.reason.contains("SIGKILL"), "{}", result.reason);
    assert_eq!(
        dying.stdout(),
        "going\n",
        "output written before the death is kept"
    );
    let details = restarted(&dying, "died");
    assert_eq!(details["signal"], "9");
    assert_eq!(details["old_pid"], old_pid.to_string());
    eventually("the old kernel is gone", || !is_alive(old_pid)).await;

    let queued = collect_cell(queued).await.ok();
    assert_eq!(queued.value(), "False", "a fresh namespace");
    assert_eq!(
        queued.result().execution_count,
        1,
        "counts restart on the new kernel"
    );
    assert!(queued.agent_states().is_empty());
}

#[tokio::test]
async fn a_kernel_killed_by_a_shell_action_is_replaced() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let pid = kernel_pid(&mut client).await;
    let (_, mut sleeper) = submit(&mut client, cell("import time\ntime.sleep(60)")).await;
    read_until(&mut sleeper, is_start).await;
    let killed = run(&mut client, shell(&format!("kill -9 {pid}"))).await;
    assert_eq!(killed.end().exit_code, 0);
    let sleeper = collect_cell(sleeper).await;
    assert_eq!(sleeper.status(), IpythonStatus::Aborted);
    assert!(
        sleeper.result().reason.contains("signal 9"),
        "{:?}",
        sleeper.result()
    );
    let details = restarted(&sleeper, "died");
    assert_ne!(details["pid"], pid.to_string());
    assert_eq!(run_cell(&mut client, "6*7").await.ok().value(), "42");
}

#[tokio::test]
async fn a_kernel_that_died_while_idle_is_replaced_at_the_next_cell() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let pid = kernel_pid(&mut client).await;
    run(&mut client, shell(&format!("kill -9 {pid}"))).await;
    // Reaped, not just a zombie: a dying leader whose threads are still exiting is not yet waitable.
    eventually("the kernel is reaped", || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    })
    .await;
    let next = run_cell(&mut client, "'fresh'").await.ok();
    assert_eq!(next.value(), "'fresh'");
    let details = restarted(&next, "died");
    assert_eq!(details["while"], "idle");
    // agent_state comes before the cell starts.
    let state_at = next
        .0
        .iter()
        .position(|e| matches!(e.kind, Some(run_response::Kind::AgentState(_))));
    let start_at = next.0.iter().position(is_start);
    assert!(state_at < start_at);
}

#[tokio::test]
async fn a_kernel_that_ignores_the_interrupt_is_killed_and_replaced() {
    let executor = start_ipython_with(|config| {
        config.kernel.interrupt_grace = Duration::from_secs(2);
    })
    .await;
    let mut client = executor.client().await;
    let mut stubborn =
        cell("import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\ntime.sleep(60)");
    stubborn.timeout_seconds = 1;
    let (_, stream) = submit(&mut client, stubborn).await;
    let (_, queued) = submit(&mut client, cell("'next'")).await;
    let stubborn = collect_cell(stream).await;
    let result = stubborn.result();
    assert_eq!(stubborn.status(), IpythonStatus::Aborted);
    assert!(
        result.reason.starts_with("timed out after 1 s"),
        "{}",
        result.reason
    );
    assert!(
        result.reason.contains("did not respond"),
        "{}",
        result.reason
    );
    restarted(&stubborn, "unresponsive");
    assert_eq!(collect_cell(queued).await.ok().value(), "'next'");
}

/// ipykernel goes idle without an execute_reply when its message handler fails (or swallows an interrupt
/// that landed outside the user's code): the cell ends ABORTED soon, and the live kernel is kept.
#[tokio::test]
async fn a_cell_the_kernel_never_answers_ends_and_the_kernel_is_kept() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let pid = kernel_pid(&mut client).await;
    // Break the handler of the next execute_request: it raises before it can reply.
    run_cell(
        &mut client,
        "ip = get_ipython(); ip.run_cell = ip.run_cell_async = ip.should_run_async = None",
    )
    .await
    .ok();
    let mut unanswered = cell("1");
    unanswered.timeout_seconds = 60;
    let (_, stream) = submit(&mut client, unanswered).await;
    let unanswered = collect_cell(stream).await;
    assert_eq!(
        unanswered.status(),
        IpythonStatus::Aborted,
        "{unanswered:?}"
    );
    assert_eq!(
        unanswered.result().reason,
        "the kernel ended the cell without a result"
    );
    assert!(
        unanswered.agent_states().is_empty(),
        "the kernel was not replaced: {unanswered:?}"
    );
    assert!(
        std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "the same kernel lives on"
    );
}

#[tokio::test]
async fn fifty_megabytes_of_output_arrive_in_bounded_pieces() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let cell = run_cell(
        &mut client,
        "import sys\nsys.stdout.write('x' * 50_000_000)\nsys.stdout.flush()\nprint('end')",
    )
    .await
    .ok();
    let pieces: Vec<usize> = cell
        .outputs()
        .iter()
        .filter(|o| o.kind == IpythonOutputKind::StreamStdout as i32)
        .map(|o| o.text.len())
        .collect();
    assert!(
        pieces.iter().all(|&n| n <= 64 * 1024),
        "largest {:?}",
        pieces.iter().max()
    );
    assert_eq!(pieces.iter().sum::<usize>(), 50_000_000 + 4);
    assert!(cell.stdout().ends_with("xend\n"));
}

#[tokio::test]
async fn invalid_utf8_and_forks_end_sensibly() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let bytes = run_cell(
        &mut client,
        "import os, sys\nos.write(1, b'bad \\xff\\xfe bytes\\n')\nsys.stdout.flush()\nprint('after')",
    )
    .await
    .ok();
    // The kernel forwards fd output with replacement characters; whatever arrives is valid text.
    assert!(bytes.stdout().contains("after"), "{bytes:?}");

    let forked = run_cell(
        &mut client,
        "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('parent', pid > 0)",
    )
    .await
    .ok();
    assert_eq!(forked.stdout(), "parent True\n");
    let unreaped = run_cell(
        &mut client,
        "import os\nif os.fork() == 0:\n    os._exit(0)\n'parent'",
    )
    .await
    .ok();
    assert_eq!(unreaped.value(), "'parent'");
    assert_eq!(run_cell(&mut client, "1").await.ok().value(), "1");
}

#[tokio::test]
async fn a_failed_cell_loses_only_the_names_it_created() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    run_cell(&mut client, "a = 1").await.ok();
    let failed = run_cell(&mut client, "a = 2\nb = 3\ndef f(): pass\n1/0").await;
    assert_eq!(failed.status(), IpythonStatus::Error);
    let after = run_cell(&mut client, "a, 'b' in globals(), 'f' in globals()")
        .await
        .ok();
    // a existed before: its new value stays (rebinding is not undone); b and f are gone.
    assert_eq!(after.value(), "(2, False, False)");

    let mut keep = cell("c = 1\nraise ValueError('kept anyway')");
    keep.rollback_on_error = Some(false);
    let (_, stream) = submit(&mut client, keep).await;
    let kept = collect_cell(stream).await;
    assert_eq!(kept.status(), IpythonStatus::Error);
    assert_eq!(kept.result().error_value, "kept anyway");
    assert_eq!(run_cell(&mut client, "c").await.ok().value(), "1");

    // A syntax error creates nothing and removes nothing.
    let syntax = run_cell(&mut client, "d = (").await;
    assert_eq!(syntax.status(), IpythonStatus::Error);
    assert_eq!(syntax.result().error_name, "SyntaxError");
    assert_eq!(run_cell(&mut client, "a, c").await.ok().value(), "(2, 1)");
}

/// User code may close the kernel's sockets: the shell socket (no reply comes, only idle) or iopub (the
/// reply comes, no idle). The cell ends within seconds, not at its timeout, the kernel that no longer
/// answers on both sockets is replaced right away, and the next cell runs on the fresh kernel.
#[tokio::test]
async fn a_kernel_whose_sockets_were_closed_is_replaced_before_the_next_cell() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    for (socket, code) in [
        ("shell", "get_ipython().kernel.shell_stream.close()"),
        ("iopub", "get_ipython().kernel.iopub_socket.close()"),
    ] {
        run_cell(&mut client, "before = 1").await.ok();
        let started = std::time::Instant::now();
        let closing = run_cell(&mut client, code).await;
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{socket}: the cell took {:?}",
            started.elapsed()
        );
        let details = restarted(&closing, "unreachable");
        assert_eq!(details["while"], "running a cell", "{socket}");
        let next = run_cell(&mut client, "'before' in globals()").await.ok();
        assert_eq!(next.value(), "False", "{socket}: a fresh kernel");
        assert!(next.agent_states().is_empty(), "{socket}: {next:?}");
    }
}

/// A shell socket closed after its cell ended (a timer in the kernel): the next cell cannot be sent there,
/// so it goes to a fresh kernel instead of failing.
#[tokio::test]
async fn a_cell_the_kernel_cannot_take_goes_to_a_fresh_kernel() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    run_cell(
        &mut client,
        "before = 1\nk = get_ipython().kernel\nk.io_loop.call_later(0.5, k.shell_stream.close)",
    )
    .await
    .ok();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let next = run_cell(&mut client, "'before' in globals()").await.ok();
    assert_eq!(next.value(), "False", "a fresh kernel: {next:?}");
    let details = restarted(&next, "unreachable");
    assert_eq!(details["while"], "sending a cell");
}
