//! IPython cells end to end on the real image's ipykernel: streaming, state, ordering, rich outputs,
//! timeouts, kernel death, rollback, inspection, reset and the bad-input list of the issue.

use std::time::{Duration, Instant};

use futures::StreamExt;
use mentis_e2e::*;
use mentis_proto::api;

const OK: i32 = api::IpythonStatus::Ok as i32;
const ERROR: i32 = api::IpythonStatus::Error as i32;
const ABORTED: i32 = api::IpythonStatus::Aborted as i32;

#[tokio::test]
async fn a_failing_cell_streams_its_output_live_and_ends_once_with_the_error() -> anyhow::Result<()>
{
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let mut stream = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: sb.sandbox_id.clone(),
            action: Some(cell("import time; print(1); time.sleep(1); print(2); 1/0")),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let mut obs = Vec::new();
    let (mut one_at, mut end_at) = (None, None);
    while let Some(m) = tokio::time::timeout(Duration::from_secs(120), stream.next()).await? {
        let Some(api::execute_response::Kind::Observation(o)) = m?.kind else {
            anyhow::bail!("expected observations only");
        };
        if one_at.is_none() && cell_stdout(std::slice::from_ref(&o)).contains('1') {
            one_at = Some(Instant::now());
        }
        if matches!(o.kind, Some(Kind::IpythonResult(_))) {
            end_at = Some(Instant::now());
        }
        obs.push(o);
    }
    assert!(
        matches!(obs[0].kind, Some(Kind::IpythonStart(_))),
        "{obs:#?}"
    );
    assert_eq!(cell_stdout(&obs), "1\n2\n");
    let gap = end_at.unwrap() - one_at.expect("1 arrived");
    assert!(
        gap >= Duration::from_millis(500),
        "1 arrived only {gap:?} before the end"
    );
    let r = ipython_result(&obs)?;
    assert_eq!(r.status, ERROR);
    assert_eq!(r.error_name, "ZeroDivisionError");
    assert!(!r.traceback.is_empty());
    h.stop().await
}

#[tokio::test]
async fn state_order_concurrency_with_shell_and_rich_outputs() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();

    // State persists across cells.
    assert_eq!(ipython_result(&h.py(&id, "x = 41").await?)?.status, OK);
    assert_eq!(
        cell_value(&h.py(&id, "x + 1").await?).as_deref(),
        Some("42")
    );

    // Three cells submitted at once run one at a time, in order.
    let mut tasks = Vec::new();
    for i in 0..3 {
        let mut actions = h.actions.clone();
        let id = id.clone();
        tasks.push(tokio::spawn(async move {
            let s = actions
                .execute(api::ExecuteRequest {
                    sandbox_id: id,
                    action: Some(cell(&format!("import time; time.sleep(0.3); print({i})"))),
                    action_id: format!("cell-{i}"),
                })
                .await?
                .into_inner();
            collect(s, Duration::from_secs(120)).await
        }));
        // Submission order is what counts: give each submit a moment to land first.
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut spans = Vec::new();
    for (i, t) in tasks.into_iter().enumerate() {
        let obs = t.await??;
        assert_eq!(cell_stdout(&obs), format!("{i}\n"));
        let start = obs
            .iter()
            .find(|o| matches!(o.kind, Some(Kind::IpythonStart(_))))
            .unwrap()
            .seq;
        let end = terminals(&obs)[0].seq;
        spans.push((start, end));
    }
    assert!(
        spans.windows(2).all(|w| w[0].1 < w[1].0),
        "cells overlapped or ran out of order: {spans:?}"
    );

    // A shell command runs while a cell sleeps.
    let mut actions = h.actions.clone();
    let cell_id = id.clone();
    let slow = tokio::spawn(async move {
        let s = actions
            .execute(api::ExecuteRequest {
                sandbox_id: cell_id,
                action: Some(cell("import time; time.sleep(3); print('cell done')")),
                action_id: String::new(),
            })
            .await?
            .into_inner();
        collect(s, Duration::from_secs(120)).await
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let shell = h.sh(&id, "echo shell done").await?;
    let cell_obs = slow.await??;
    assert_eq!(stdout(&shell), "shell done\n");
    assert!(
        terminals(&shell)[0].seq < terminals(&cell_obs)[0].seq,
        "the shell command waited for the cell"
    );

    // A plot arrives as display_data with image/png; a DataFrame's result carries text/html.
    let plot = h
        .py(
            &id,
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\nplt.show()",
        )
        .await?;
    assert_eq!(ipython_result(&plot)?.status, OK);
    let displays = ipython_outputs(&plot, api::IpythonOutputKind::DisplayData);
    assert!(
        displays
            .iter()
            .any(|d| d.data.get("image/png").is_some_and(|p| p.len() > 100)),
        "{plot:#?}"
    );
    let df = h
        .py(
            &id,
            "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})",
        )
        .await?;
    let results = ipython_outputs(&df, api::IpythonOutputKind::ExecuteResult);
    assert!(
        results.iter().any(|r| r
            .data
            .get("text/html")
            .is_some_and(|h| h.contains("<table"))),
        "{df:#?}"
    );
    h.stop().await
}

#[tokio::test]
async fn timeout_interrupts_and_the_kernel_keeps_its_state() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    h.py(&id, "kept = 5").await?;
    let obs = h
        .run_cell(
            &id,
            api::IPythonAction {
                code: "while True: pass".into(),
                timeout_seconds: 2,
                ..Default::default()
            },
        )
        .await?;
    let r = ipython_result(&obs)?;
    assert_eq!(r.status, ABORTED, "{r:?}");
    assert!(r.reason.contains("time"), "reason says it timed out: {r:?}");
    assert_eq!(cell_value(&h.py(&id, "kept").await?).as_deref(), Some("5"));
    h.stop().await
}

#[tokio::test]
async fn a_killed_kernel_is_replaced_and_the_queued_cell_runs() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    h.py(&id, "warm = 1").await?;

    // The kernel kills itself mid-cell while another cell waits in the queue.
    let mut actions = h.actions.clone();
    let sid = id.clone();
    let dying = tokio::spawn(async move {
        let s = actions
            .execute(api::ExecuteRequest {
                sandbox_id: sid,
                action: Some(cell(
                    "import os, time; time.sleep(1); os.kill(os.getpid(), 9)",
                )),
                action_id: String::new(),
            })
            .await?
            .into_inner();
        collect(s, Duration::from_secs(120)).await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queued = h.py(&id, "print('after', 'warm' in globals())").await?;
    let dead = dying.await??;
    let r = ipython_result(&dead)?;
    assert_eq!(r.status, ABORTED, "{r:?}");
    assert!(!r.reason.is_empty());
    assert_eq!(ipython_result(&queued)?.status, OK);
    assert_eq!(
        cell_stdout(&queued),
        "after False\n",
        "the queued cell ran on a fresh kernel"
    );

    // The restart is a sandbox-level observation.
    let (sandbox, _) = (
        h.sandboxes
            .get_sandbox(api::GetSandboxRequest {
                sandbox_id: id.clone(),
            })
            .await?
            .into_inner(),
        (),
    );
    let last = sandbox.sandbox.unwrap().last_seq;
    let mut s = h
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: id.clone(),
            after_seq: 0,
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let mut restarts = 0;
    while let Some(m) = tokio::time::timeout(Duration::from_secs(30), s.next()).await? {
        let Some(api::stream_observations_response::Kind::Observation(o)) = m?.kind else {
            continue;
        };
        if let Some(Kind::AgentState(a)) = &o.kind
            && a.message.contains("kernel")
        {
            assert!(o.action_id.is_empty(), "agent_state belongs to no action");
            restarts += 1;
        }
        if o.seq >= last {
            break;
        }
    }
    assert!(restarts >= 1, "no agent_state about the kernel restart");

    // SIGKILL from a shell action while a cell runs.
    let mut actions = h.actions.clone();
    let sid = id.clone();
    let sleeping = tokio::spawn(async move {
        let s = actions
            .execute(api::ExecuteRequest {
                sandbox_id: sid,
                action: Some(cell("import time; time.sleep(60)")),
                action_id: String::new(),
            })
            .await?
            .into_inner();
        collect(s, Duration::from_secs(120)).await
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    h.sh(&id, "pkill -9 -f ipykernel_launcher").await?;
    let killed = sleeping.await??;
    assert_eq!(ipython_result(&killed)?.status, ABORTED);
    assert_eq!(cell_value(&h.py(&id, "1 + 1").await?).as_deref(), Some("2"));
    h.stop().await
}

#[tokio::test]
async fn rollback_inspect_and_reset() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();

    // Rollback removes only the failed cell's new names; rebinding an old name is not undone.
    h.py(&id, "a = 1").await?;
    let failed = h.py(&id, "a = 2\nb = 3\n1/0").await?;
    assert_eq!(ipython_result(&failed)?.status, ERROR);
    assert_eq!(
        cell_stdout(&h.py(&id, "print('b' in globals(), a)").await?),
        "False 2\n"
    );
    // Without rollback the names stay.
    let kept = h
        .run_cell(
            &id,
            api::IPythonAction {
                code: "c = 1\n1/0".into(),
                rollback_on_error: Some(false),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(ipython_result(&kept)?.status, ERROR);
    assert_eq!(cell_value(&h.py(&id, "c").await?).as_deref(), Some("1"));

    // Inspect summarises without copying: a 1,000,000-row DataFrame among others.
    let setup = "import numpy as np, pandas as pd\n\
                 df = pd.DataFrame({'a': np.arange(1_000_000), 'b': 1.5})\n\
                 s = pd.Series([1, 2, 3], name='s')\n\
                 d = {'k': 1}\n\
                 l = list(range(500))\n\
                 n = 7\n\
                 t = 'text'\n\
                 o = object()";
    assert_eq!(ipython_result(&h.py(&id, setup).await?)?.status, OK);
    let started = Instant::now();
    let vars = h
        .actions
        .inspect_variables(api::InspectVariablesRequest {
            sandbox_id: id.clone(),
            names: vec![],
        })
        .await?
        .into_inner()
        .variables;
    let took = started.elapsed();
    let get = |name: &str| vars.iter().find(|v| v.name == name).cloned();
    let json = |v: &api::VariableSummary| {
        serde_json::to_string(&struct_json(v.summary.as_ref().unwrap())).unwrap()
    };
    let df = get("df").expect("df inspected");
    assert_eq!(df.r#type, "DataFrame");
    let dfj = json(&df);
    assert!(
        dfj.contains("1000000") && dfj.contains("\"a\"") && dfj.contains("int64"),
        "{dfj}"
    );
    let sj = json(&get("s").expect("s"));
    assert!(sj.contains("\"s\"") && sj.contains('3'), "{sj}");
    assert!(json(&get("d").expect("d")).contains("\"k\""));
    assert!(json(&get("l").expect("l")).contains("500"));
    assert!(json(&get("n").expect("n")).contains('7'));
    assert!(json(&get("t").expect("t")).contains("text"));
    assert!(json(&get("o").expect("o")).contains("object"));
    assert!(
        vars.iter().all(|v| !v.name.starts_with('_')),
        "hidden names reported"
    );
    assert!(took < Duration::from_secs(30), "inspect took {took:?}");
    // Bad names are refused.
    let bad = h
        .actions
        .inspect_variables(api::InspectVariablesRequest {
            sandbox_id: id.clone(),
            names: vec!["1x".into()],
        })
        .await;
    assert_eq!(bad.unwrap_err().code(), tonic::Code::InvalidArgument);

    // Reset: a fresh namespace.
    h.actions
        .reset_kernel(api::ResetKernelRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    let after = h.py(&id, "n").await?;
    let r = ipython_result(&after)?;
    assert_eq!((r.status, r.error_name.as_str()), (ERROR, "NameError"));
    h.stop().await
}

#[tokio::test]
async fn bad_cells_get_clear_outcomes_and_the_sandbox_keeps_working() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();

    let empty = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.clone(),
            action: Some(cell("")),
            action_id: String::new(),
        })
        .await;
    assert_eq!(empty.unwrap_err().code(), tonic::Code::InvalidArgument);

    // Code of several megabytes.
    let big = format!("# {}\nprint('big ok')", "x".repeat(3 * 1024 * 1024));
    let obs = h.py(&id, &big).await?;
    assert_eq!(
        (ipython_result(&obs)?.status, cell_stdout(&obs)),
        (OK, "big ok\n".to_owned())
    );

    // Invalid UTF-8 on stdout.
    let obs = h
        .py(
            &id,
            "import sys; sys.stdout.write(b'\\xff\\xfe ok\\n'.decode('utf-8', 'surrogateescape'))",
        )
        .await?;
    assert_eq!(ipython_result(&obs)?.status, OK);
    assert!(cell_stdout(&obs).contains("ok"), "{obs:#?}");

    // A cell that forks.
    let obs = h
        .py(&id, "import os\npid = os.fork()\nif pid == 0:\n    os._exit(0)\nos.waitpid(pid, 0)\nprint('parent')")
        .await?;
    assert_eq!(
        (ipython_result(&obs)?.status, cell_stdout(&obs)),
        (OK, "parent\n".to_owned())
    );

    // A cell printing 50 MB: it ends, and what arrives is bounded pieces (or an explicit gap).
    let mut s = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.clone(),
            action: Some(cell(
                "import sys\nfor _ in range(50):\n    sys.stdout.write('x' * 1_000_000)\nprint()",
            )),
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let (mut bytes, mut result) = (0usize, None);
    while let Some(m) = tokio::time::timeout(Duration::from_secs(120), s.next()).await? {
        match m?.kind {
            Some(api::execute_response::Kind::Observation(o)) => match o.kind {
                Some(Kind::IpythonOutput(out)) => bytes += out.text.len(),
                Some(Kind::IpythonResult(r)) => result = Some(r),
                _ => {}
            },
            Some(
                api::execute_response::Kind::Gap(_) | api::execute_response::Kind::Keepalive(_),
            )
            | None => {}
        }
    }
    assert_eq!(result.expect("one result").status, OK);
    assert!(bytes > 1_000_000, "only {bytes} bytes of output arrived");

    assert_eq!(
        cell_value(&h.py(&id, "21 * 2").await?).as_deref(),
        Some("42")
    );
    h.stop().await
}

fn struct_json(s: &prost_types::Struct) -> serde_json::Value {
    fn value(v: &prost_types::Value) -> serde_json::Value {
        use prost_types::value::Kind as K;
        match &v.kind {
            None | Some(K::NullValue(_)) => serde_json::Value::Null,
            Some(K::BoolValue(b)) => (*b).into(),
            Some(K::NumberValue(n)) => (*n).into(),
            Some(K::StringValue(s)) => s.clone().into(),
            Some(K::ListValue(l)) => l.values.iter().map(value).collect(),
            Some(K::StructValue(s)) => struct_json(s),
        }
    }
    s.fields
        .iter()
        .map(|(k, v)| (k.clone(), value(v)))
        .collect()
}
