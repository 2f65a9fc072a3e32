//! Kernel control: InspectVariables, ResetKernel, eager start, executor shutdown.

use std::time::Duration;

use mentis_proto::executor::{InspectVariablesRequest, ResetKernelRequest};
use mentis_proto::executor::{IpythonStatus, VariableSummary};
use prost_types::value::Kind;
use tonic::Code;

use super::super::support::*;
use super::*;

async fn inspect(client: &mut Client, names: &[&str]) -> Vec<VariableSummary> {
    client
        .inspect_variables(InspectVariablesRequest {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
        })
        .await
        .expect("inspect")
        .into_inner()
        .variables
}

fn field<'a>(summary: &'a VariableSummary, name: &str) -> &'a Kind {
    summary
        .summary
        .as_ref()
        .and_then(|s| s.fields.get(name))
        .and_then(|v| v.kind.as_ref())
        .unwrap_or_else(|| panic!("{} has no {name}: {summary:?}", summary.name))
}

fn number(kind: &Kind) -> f64 {
    match kind {
        Kind::NumberValue(n) => *n,
        other => panic!("not a number: {other:?}"),
    }
}

fn list(kind: &Kind) -> &[prost_types::Value] {
    match kind {
        Kind::ListValue(l) => &l.values,
        other => panic!("not a list: {other:?}"),
    }
}

fn string(kind: &Kind) -> &str {
    match kind {
        Kind::StringValue(s) => s,
        other => panic!("not a string: {other:?}"),
    }
}

#[tokio::test]
async fn inspect_summarises_variables_without_copying_them() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    assert!(
        inspect(&mut client, &[]).await.is_empty(),
        "no kernel yet: nothing defined"
    );
    run_cell(
        &mut client,
        "import numpy as np, pandas as pd, math, os\n\
         df = pd.DataFrame({'a': np.arange(1_000_000), 'b': np.random.rand(1_000_000), \
                            't': pd.Timestamp('2024-01-02')})\n\
         df.loc[0, 'b'] = float('nan')\n\
         s = pd.Series(range(500), name='ser')\n\
         d = {'k': 1, 'nested': {'x': [1, 2]}, 'nan': math.nan}\n\
         l = list(range(1000))\n\
         t = (1, 'two')\n\
         n = 7\n\
         big = 2**70\n\
         f = 1.5\n\
         flag = True\n\
         nothing = None\n\
         text = 'y' * 5000\n\
         class Thing:\n    def __repr__(self): return 'T' * 3000\n\
         obj = Thing()\n\
         def fn(): pass\n\
         _private = 1",
    )
    .await
    .ok();

    let started = Instant::now();
    let all = inspect(&mut client, &[]).await;
    let took = started.elapsed();
    let names: Vec<&str> = all.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names,
        vec![
            "Thing", "big", "d", "df", "f", "flag", "fn", "l", "n", "nothing", "obj", "s", "t",
            "text"
        ],
        "modules, private names and IPython's own are left out"
    );
    assert!(
        took < Duration::from_secs(20),
        "a 1,000,000-row frame took {took:?}"
    );
    let by_name = |name: &str| all.iter().find(|v| v.name == name).unwrap();

    let df = by_name("df");
    assert_eq!(df.r#type, "DataFrame");
    let shape: Vec<f64> = list(field(df, "shape"))
        .iter()
        .map(|v| number(v.kind.as_ref().unwrap()))
        .collect();
    assert_eq!(shape, vec![1_000_000.0, 3.0]);
    let head = list(field(df, "head"));
    assert_eq!(head.len(), 10);
    let Some(Kind::StructValue(row0)) = &head[0].kind else {
        panic!("row is a struct")
    };
    assert_eq!(
        string(row0.fields["b"].kind.as_ref().unwrap()),
        "nan",
        "NaN becomes a string"
    );
    assert!(string(row0.fields["t"].kind.as_ref().unwrap()).starts_with("2024-01-02"));
    let Kind::StructValue(dtypes) = field(df, "dtypes") else {
        panic!("dtypes")
    };
    assert_eq!(string(dtypes.fields["a"].kind.as_ref().unwrap()), "int64");

    let s = by_name("s");
    assert_eq!(s.r#type, "Series");
    assert_eq!(number(field(s, "length")), 500.0);
    assert_eq!(list(field(s, "head")).len(), 100);
    assert_eq!(string(field(s, "name")), "ser");

    let d = by_name("d");
    assert_eq!(number(field(d, "length")), 3.0);
    assert_eq!(list(field(d, "keys")).len(), 3);
    let Kind::StructValue(data) = field(d, "data") else {
        panic!("data")
    };
    assert_eq!(string(data.fields["nan"].kind.as_ref().unwrap()), "nan");

    let l = by_name("l");
    assert_eq!(
        (l.r#type.as_str(), number(field(l, "length"))),
        ("list", 1000.0)
    );
    assert_eq!(list(field(l, "head")).len(), 100);
    assert_eq!(number(field(by_name("t"), "length")), 2.0);
    assert_eq!(number(field(by_name("n"), "value")), 7.0);
    assert_eq!(
        string(field(by_name("big"), "value")),
        "1180591620717411303424"
    );
    assert_eq!(number(field(by_name("f"), "value")), 1.5);
    assert_eq!(field(by_name("flag"), "value"), &Kind::BoolValue(true));
    assert!(matches!(
        field(by_name("nothing"), "value"),
        Kind::NullValue(_)
    ));
    let text = by_name("text");
    assert_eq!(number(field(text, "length")), 5000.0);
    assert!(string(field(text, "value")).chars().count() <= 1001);
    let obj = by_name("obj");
    assert_eq!(obj.r#type, "Thing");
    assert!(string(field(obj, "repr")).chars().count() <= 1001);

    let picked = inspect(&mut client, &["df", "missing", "_private"]).await;
    let names: Vec<&str> = picked.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(
        names,
        vec!["df", "_private"],
        "asked-for names are given even when private; missing ones are left out"
    );

    let status = client
        .inspect_variables(InspectVariablesRequest {
            names: vec!["__import__('os')".to_owned()],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn inspect_waits_for_the_running_cell() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let (_, mut running) = submit(&mut client, cell("import time\ntime.sleep(2)\nlate = 1")).await;
    read_until(&mut running, is_start).await;
    let found = inspect(&mut client, &["late"]).await;
    assert_eq!(found.len(), 1, "it ran after the cell: {found:?}");
    collect_cell(running).await.ok();
}

#[tokio::test]
async fn inspect_gives_up_when_the_kernel_stays_busy() {
    let executor =
        start_ipython_with(|config| config.kernel.inspect_wait = Duration::from_secs(1)).await;
    let mut client = executor.client().await;
    let (id, mut running) = submit(&mut client, cell("import time\ntime.sleep(60)")).await;
    read_until(&mut running, is_start).await;
    let status = client
        .inspect_variables(InspectVariablesRequest { names: vec![] })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    cancel(&mut client, &id).await;
    collect_cell(running).await;
}

#[tokio::test]
async fn reset_gives_a_fresh_namespace_and_aborts_the_running_cell() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    run_cell(&mut client, "x = 1").await.ok();
    client.reset_kernel(ResetKernelRequest {}).await.unwrap();
    let after = run_cell(&mut client, "'x' in globals()").await.ok();
    assert_eq!(after.value(), "False");
    assert_eq!(after.result().execution_count, 1);

    run_cell(&mut client, "y = 1").await.ok();
    let (_, mut running) = submit(&mut client, cell("import time\ntime.sleep(60)")).await;
    let (_, queued) = submit(&mut client, cell("'y' in globals()")).await;
    read_until(&mut running, is_start).await;
    client.reset_kernel(ResetKernelRequest {}).await.unwrap();
    let running = collect_cell(running).await;
    assert_eq!(running.status(), IpythonStatus::Aborted);
    assert_eq!(running.result().reason, "kernel reset");
    let states = running.agent_states();
    assert_eq!(states.len(), 1);
    assert_eq!(states[0].message, "kernel restarted");
    assert_eq!(states[0].details["reason"], "reset");
    let queued = collect_cell(queued).await.ok();
    assert_eq!(
        queued.value(),
        "False",
        "the queued cell ran on the new kernel"
    );
    assert_eq!(queued.result().execution_count, 1);
}

#[tokio::test]
async fn an_eager_kernel_serves_the_first_cell() {
    let executor = start_ipython_with(|config| config.kernel.eager = true).await;
    let mut client = executor.client().await;
    let first = run_cell(&mut client, "import os; os.getcwd()").await.ok();
    assert_eq!(first.result().execution_count, 1);
    // The kernel runs in the workspace.
    let cwd = first.value();
    let workspace = executor.workspace.path().canonicalize().unwrap();
    assert_eq!(cwd.trim_matches('\''), workspace.display().to_string());
}

#[tokio::test]
async fn the_kernel_gets_the_sandbox_env_but_never_the_token() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let id = action_id();
    let mut request = cell_request(
        &id,
        cell(
            "import os; (os.environ.get('FROM_SANDBOX'), os.environ.get('MENTIS_EXECUTOR_TOKEN'))",
        ),
    );
    request
        .env
        .insert("FROM_SANDBOX".to_owned(), "yes".to_owned());
    let cell = collect_cell(start(&mut client, request).await).await.ok();
    assert_eq!(cell.value(), "('yes', None)");
}

#[tokio::test]
async fn a_kernel_started_ahead_gets_each_cells_sandbox_env() {
    // Started eagerly, as in a warm pool: it has only the executor's env until a cell brings the sandbox's.
    let executor = start_ipython_with(|c| c.kernel.eager = true).await;
    let mut client = executor.client().await;
    let code = "import os; (os.environ.get('MODE'), os.environ.get('ODD'), os.environ.get('GONE'))";
    let with_env = |env: &[(&str, &str)]| {
        let mut request = cell_request(&action_id(), cell(code));
        request.env = env
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        request
    };
    let first = with_env(&[
        ("MODE", "warm"),
        ("ODD", "it's \"quoted\"\n\\ é"),
        ("GONE", "x"),
    ]);
    let cell = collect_cell(start(&mut client, first).await).await.ok();
    assert_eq!(cell.value(), r#"('warm', 'it\'s "quoted"\n\\ é', 'x')"#);
    // A later env replaces it: names no longer there are removed.
    let second = with_env(&[("MODE", "other")]);
    let cell = collect_cell(start(&mut client, second).await).await.ok();
    assert_eq!(cell.value(), "('other', None, None)");
    // No helper name was left in the user's namespace.
    let names = run_cell(
        &mut client,
        "sorted(n for n in dir() if not n.startswith('_'))",
    )
    .await
    .ok()
    .value();
    assert!(!names.contains("'o'") && !names.contains("'j'"), "{names}");
}

#[tokio::test]
async fn shutdown_ends_running_and_queued_cells_and_kills_the_kernel() {
    let executor = start_ipython().await;
    let mut client = executor.client().await;
    let pid: i32 = run_cell(&mut client, "import os; os.getpid()")
        .await
        .ok()
        .value()
        .parse()
        .unwrap();
    let (_, mut running) = submit(&mut client, cell("import time\ntime.sleep(60)")).await;
    let (_, queued) = submit(&mut client, cell("1")).await;
    read_until(&mut running, is_start).await;
    let stopping = tokio::spawn(executor.stop());
    let (running, queued) = tokio::join!(collect_cell(running), collect_cell(queued));
    for cell in [&running, &queued] {
        assert_eq!(cell.status(), IpythonStatus::Aborted);
        assert_eq!(cell.result().reason, "the executor is shutting down");
    }
    stopping.await.unwrap().unwrap();
    eventually("the kernel is gone", || !is_alive(pid)).await;
    assert!(live_in_group(pid).is_empty());
}

#[tokio::test]
async fn a_kernel_that_cannot_start_aborts_the_cell_with_the_reason() {
    let executor = TestExecutor::start_with(|config| {
        config.kernel.python = "/definitely/not/a/python".into();
    })
    .await;
    let mut client = executor.client().await;
    let missing = run_cell(&mut client, "1").await;
    assert_eq!(missing.status(), IpythonStatus::Aborted);
    let reason = missing.result().reason;
    assert!(
        reason.starts_with(
            "cannot start the kernel: IPython cells need python3 with the ipykernel module, and this \
             image has no /definitely/not/a/python on its PATH: add it to the image (Debian, Ubuntu: \
             apt-get install python3-ipykernel"
        ),
        "{reason}"
    );

    // A real python without ipykernel (-S: no site-packages): the reason says what is missing, at once.
    let dir = tempfile::tempdir().unwrap();
    let bare = dir.path().join("bare-python");
    std::fs::write(&bare, "#!/bin/sh\nexec python3 -S \"$@\"\n").unwrap();
    std::fs::set_permissions(&bare, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let executor = TestExecutor::start_with(|config| config.kernel.python = bare.clone()).await;
    let mut client = executor.client().await;
    let started = std::time::Instant::now();
    let bare_cell = run_cell(&mut client, "1").await;
    assert_eq!(bare_cell.status(), IpythonStatus::Aborted);
    let reason = bare_cell.result().reason;
    assert_eq!(
        reason,
        format!(
            "cannot start the kernel: IPython cells need python3 with the ipykernel module, and {} has \
             no ipykernel: add it to the image (Debian, Ubuntu: apt-get install python3-ipykernel; \
             elsewhere: pip install ipykernel), or point MENTIS_KERNEL_PYTHON at a python that has it",
            bare.display()
        )
    );
    assert!(
        started.elapsed() < std::time::Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );

    let executor =
        TestExecutor::start_with(|config| config.kernel.python = "/bin/false".into()).await;
    let mut client = executor.client().await;
    let failing = run_cell(&mut client, "1").await;
    assert_eq!(failing.status(), IpythonStatus::Aborted);
    assert!(
        failing
            .result()
            .reason
            .contains("exited with status 1 while starting"),
        "{:?}",
        failing.result()
    );
    // InspectVariables and ResetKernel say so too, and the executor keeps serving.
    assert!(inspect(&mut client, &[]).await.is_empty());
    let status = client
        .reset_kernel(ResetKernelRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::Unavailable);
    assert_eq!(
        run(&mut client, shell("echo alive")).await.stdout(),
        b"alive\n"
    );
}
