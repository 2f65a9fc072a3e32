//! Traces end to end: a runtime with `OTEL_EXPORTER_OTLP_ENDPOINT` exports to a real OTLP receiver (the
//! fake-opentelemetry-collector crate's gRPC server); a client's `traceparent` on CreateSandbox and on
//! Execute continues in the runtime's spans and, through the runtime→executor calls, in the executor's
//! spans (relayed by the runtime), each with a correct parent.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use fake_opentelemetry_collector::{ExportedSpan, FakeCollectorServer};
use mentis_e2e::*;
use mentis_proto::api;

/// A W3C `traceparent` for a trace and parent span the test chose (sampled).
fn traceparent(trace_id: &str, span_id: &str) -> String {
    format!("00-{trace_id}-{span_id}-01")
}

/// Collects exported spans until `done` says the trace is complete, or the time is up.
async fn spans_until(
    collector: &mut FakeCollectorServer,
    within: Duration,
    done: impl Fn(&[ExportedSpan]) -> bool,
) -> Vec<ExportedSpan> {
    let deadline = tokio::time::Instant::now() + within;
    let mut all = Vec::new();
    while !done(&all) && tokio::time::Instant::now() < deadline {
        all.extend(
            collector
                .exported_spans(1, Duration::from_millis(500))
                .await,
        );
    }
    all
}

/// The spans of one trace as an indented tree (name, attributes the test cares about, duration), for the
/// log and the closing notes.
fn tree(spans: &[ExportedSpan], trace_id: &str, root_parent: &str) -> String {
    let mut children: HashMap<&str, Vec<&ExportedSpan>> = HashMap::new();
    for s in spans.iter().filter(|s| s.trace_id == trace_id) {
        children
            .entry(s.parent_span_id.as_str())
            .or_default()
            .push(s);
    }
    for list in children.values_mut() {
        list.sort_by_key(|s| s.start_time_unix_nano);
    }
    fn walk(
        out: &mut String,
        children: &HashMap<&str, Vec<&ExportedSpan>>,
        parent: &str,
        depth: usize,
    ) {
        for s in children.get(parent).map(Vec::as_slice).unwrap_or_default() {
            let ms = s.end_time_unix_nano.saturating_sub(s.start_time_unix_nano) as f64 / 1e6;
            let keep: BTreeMap<&str, &str> = s
                .attributes
                .iter()
                .filter(|(k, _)| {
                    matches!(
                        k.as_str(),
                        "sandbox_id" | "kind" | "exit_code" | "reason" | "rpc.grpc.status_code"
                    )
                })
                .map(|(k, v)| (k.as_str(), value(v)))
                .collect();
            out.push_str(&format!(
                "{}{} [{}] {ms:.1} ms {keep:?}\n",
                "  ".repeat(depth),
                s.name,
                s.kind
            ));
            walk(out, children, &s.span_id, depth + 1);
        }
    }
    let mut out = String::new();
    walk(&mut out, &children, root_parent, 0);
    out
}

/// An attribute's value as the receiver gives it (`Some(AnyValue { value: Some(IntValue(3)) })`), bare.
fn value(debug: &str) -> &str {
    let inner = debug
        .trim_start_matches("Some(AnyValue { value: Some(")
        .trim_end_matches(") })");
    let inner = inner.split_once('(').map_or(inner, |(_, v)| v);
    inner.trim_end_matches(')').trim_matches('"')
}

fn named<'a>(spans: &'a [ExportedSpan], trace_id: &str, name: &str) -> Vec<&'a ExportedSpan> {
    spans
        .iter()
        .filter(|s| s.trace_id == trace_id && s.name == name)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_clients_traceparent_continues_through_the_runtime_and_the_executor() -> anyhow::Result<()>
{
    let mut collector = FakeCollectorServer::start()
        .await
        .map_err(|e| anyhow::anyhow!("cannot start the OTLP receiver: {e}"))?;
    let endpoint = collector.endpoint();
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let runtime = RuntimeProcess::start_with_env(
        bin,
        &instance,
        data_dir.path(),
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            // Export batches quickly, and relay executor spans at every (1 s) health check.
            ("OTEL_BSP_SCHEDULE_DELAY", "200"),
            ("MENTIS_HEALTH_INTERVAL_SECS", "1"),
            // A collector's auth header, sent by the exporter and by the relay of executor spans alike.
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-collector-token=t%201"),
        ],
    )
    .await?;
    let mut h = runtime.harness(data_dir, guard).await?;

    // CreateSandbox under the client's trace.
    let create_trace = "4bf92f3577b34da6a3ce929d0e0e4736";
    let client_span = "00f067aa0ba902b7";
    let mut req = tonic::Request::new(api::CreateSandboxRequest {
        spec: Some(api::SandboxSpec::default()),
    });
    req.metadata_mut().insert(
        "traceparent",
        traceparent(create_trace, client_span).parse()?,
    );
    let sandbox = h
        .sandboxes
        .create_sandbox(req)
        .await?
        .into_inner()
        .sandbox
        .ok_or_else(|| anyhow::anyhow!("no sandbox"))?;
    let id = sandbox.sandbox_id;

    // Execute under another.
    let exec_trace = "0af7651916cd43dd8448eb211c80319c";
    let exec_parent = "b7ad6b7169203331";
    let mut req = tonic::Request::new(api::ExecuteRequest {
        sandbox_id: id.clone(),
        action: Some(shell_action(cmd("echo traced; exit 3"))),
        action_id: String::new(),
    });
    req.metadata_mut()
        .insert("traceparent", traceparent(exec_trace, exec_parent).parse()?);
    let obs = collect(
        h.actions.execute(req).await?.into_inner(),
        Duration::from_secs(60),
    )
    .await?;
    assert_eq!(stdout(&obs), "traced\n");
    assert_eq!(cmd_end(&obs)?.exit_code, 3);

    // A space's secret, set under a third trace: the call is traced, its value is in no span.
    let secret_trace = "5c1e3f0a9d8b7c6e5f4a3b2c1d0e9f8a";
    let secret = format!("traced-secret-{}", uuid::Uuid::new_v4().simple());
    let mut req = tonic::Request::new(api::SetSecretRequest {
        space_id: String::new(),
        name: "TRACED".into(),
        value: secret.clone(),
    });
    req.metadata_mut().insert(
        "traceparent",
        traceparent(secret_trace, client_span).parse()?,
    );
    h.spaces.set_secret(req).await?;

    let expected = [
        (secret_trace, "mentis.v1.SpaceService/SetSecret"),
        (create_trace, "mentis.v1.SandboxService/CreateSandbox"),
        (create_trace, "create_sandbox"),
        (create_trace, "executor_ready"),
        (exec_trace, "mentis.v1.ActionService/Execute"),
        (exec_trace, "action"),
        (exec_trace, "mentis.executor.v1.ExecutorService/Attach"),
        (exec_trace, "shell_action"),
    ];
    let spans = spans_until(&mut collector, Duration::from_secs(60), |all| {
        expected
            .iter()
            .all(|(trace, name)| !named(all, trace, name).is_empty())
    })
    .await;
    // Positive control: the SetSecret span is there (with the request's attributes); the value is nowhere.
    assert_eq!(
        named(&spans, secret_trace, "mentis.v1.SpaceService/SetSecret").len(),
        1,
        "{spans:#?}"
    );
    assert!(
        !format!("{spans:?}").contains(&secret),
        "a span carries the secret's value"
    );
    let create_tree = tree(&spans, create_trace, client_span);
    let exec_tree = tree(&spans, exec_trace, exec_parent);
    eprintln!("CreateSandbox trace:\n{create_tree}\nExecute trace:\n{exec_tree}");

    // CreateSandbox: the server span is the client's child; creation's phases and Docker calls under it.
    let create_rpc = named(
        &spans,
        create_trace,
        "mentis.v1.SandboxService/CreateSandbox",
    );
    let [create_rpc] = create_rpc.as_slice() else {
        anyhow::bail!("one CreateSandbox server span expected:\n{create_tree}");
    };
    assert_eq!(create_rpc.parent_span_id, client_span);
    assert_eq!(create_rpc.kind, "SPAN_KIND_SERVER");
    let phase = named(&spans, create_trace, "create_sandbox");
    let [phase] = phase.as_slice() else {
        anyhow::bail!("one create_sandbox span expected:\n{create_tree}");
    };
    assert_eq!(phase.parent_span_id, create_rpc.span_id);
    for name in ["docker create container", "docker start container"] {
        let docker = named(&spans, create_trace, name);
        assert!(
            docker.iter().any(|d| d.parent_span_id == phase.span_id),
            "{name} under create_sandbox:\n{create_tree}"
        );
    }
    let ready = named(&spans, create_trace, "executor_ready");
    assert!(
        ready.iter().any(|r| r.parent_span_id == phase.span_id),
        "executor_ready under create_sandbox:\n{create_tree}"
    );

    // Execute: client -> runtime RPC -> action -> executor RPC -> the executor's action, one trace.
    let exec_rpc = named(&spans, exec_trace, "mentis.v1.ActionService/Execute");
    let [exec_rpc] = exec_rpc.as_slice() else {
        anyhow::bail!("one Execute server span expected:\n{exec_tree}");
    };
    assert_eq!(exec_rpc.parent_span_id, exec_parent);
    let action = named(&spans, exec_trace, "action");
    let [action] = action.as_slice() else {
        anyhow::bail!("one action span expected:\n{exec_tree}");
    };
    assert_eq!(action.parent_span_id, exec_rpc.span_id);
    assert_eq!(
        action.attributes.get("sandbox_id").map(|v| value(v)),
        Some(id.as_str())
    );
    assert_eq!(
        action.attributes.get("exit_code").map(|v| value(v)),
        Some("3")
    );
    assert_eq!(
        action.attributes.get("reason").map(|v| value(v)),
        Some("Exited")
    );
    let attach = named(
        &spans,
        exec_trace,
        "mentis.executor.v1.ExecutorService/Attach",
    );
    let [attach] = attach.as_slice() else {
        anyhow::bail!("one executor Attach span expected:\n{exec_tree}");
    };
    assert_eq!(attach.parent_span_id, action.span_id);
    assert_eq!(attach.kind, "SPAN_KIND_SERVER");
    let shell = named(&spans, exec_trace, "shell_action");
    let [shell] = shell.as_slice() else {
        anyhow::bail!("one executor shell_action span expected:\n{exec_tree}");
    };
    assert_eq!(shell.parent_span_id, attach.span_id);
    assert_eq!(
        shell.attributes.get("exit_code").map(|v| value(v)),
        Some("3")
    );

    // Background work is no trace of its own: in three more seconds of health checks (every second), span
    // relays and engine pings, nothing outside the client's two traces is exported.
    let later = spans_until(&mut collector, Duration::from_secs(3), |_| false).await;
    let stray: Vec<&str> = spans
        .iter()
        .chain(&later)
        .filter(|s| ![create_trace, exec_trace, secret_trace].contains(&s.trace_id.as_str()))
        .map(|s| s.name.as_str())
        .collect();
    assert!(
        stray.is_empty(),
        "spans outside the client's traces: {stray:?}"
    );
    assert!(
        !format!("{later:?}").contains(&secret),
        "a later span carries the secret's value"
    );
    h.stop().await?;
    Ok(())
}
