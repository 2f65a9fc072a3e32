//! Metrics end to end: a runtime with `MENTIS_METRICS_LISTEN` serves `GET /metrics` in Prometheus' text
//! format, and with an OTLP endpoint pushes the same metrics to a real OTLP receiver. A scrape before and
//! after a sandbox and a few actions shows the counters, gauges and histograms move.

use std::collections::BTreeMap;
use std::time::Duration;

use fake_opentelemetry_collector::FakeCollectorServer;
use mentis_e2e::*;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// `GET /metrics` over plain HTTP/1.1: the body.
pub(crate) async fn scrape(port: u16) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("not an HTTP response: {response}"))?;
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "{head}");
    anyhow::ensure!(head.contains("text/plain"), "{head}");
    Ok(body.to_owned())
}

/// The samples of a scrape: `name{labels}` → value (labels sorted as the exposition writes them).
pub(crate) fn samples(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| {
            let (key, value) = l.rsplit_once(' ')?;
            Some((key.to_owned(), value.parse().ok()?))
        })
        .collect()
}

/// The sum of the samples whose key starts with `name` and contains every one of `labels`.
pub(crate) fn total(samples: &BTreeMap<String, f64>, name: &str, labels: &[&str]) -> f64 {
    samples
        .iter()
        .filter(|(k, _)| {
            (k.starts_with(&format!("{name}{{")) || k.as_str() == name)
                && labels.iter().all(|l| k.contains(l))
        })
        .map(|(_, v)| v)
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_scrape_shows_sandboxes_and_actions_and_otlp_gets_the_same() -> anyhow::Result<()> {
    let mut collector = FakeCollectorServer::start()
        .await
        .map_err(|e| anyhow::anyhow!("cannot start the OTLP receiver: {e}"))?;
    let endpoint = collector.endpoint();
    let port = free_port()?;
    let listen = format!("127.0.0.1:{port}");
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let runtime = RuntimeProcess::start_with_env(
        bin,
        &instance,
        data_dir.path(),
        &[
            ("MENTIS_METRICS_LISTEN", listen.as_str()),
            // Metrics only over OTLP (traces stay off), pushed every second.
            ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", endpoint.as_str()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
            // Per-sandbox usage is read at each health check.
            ("MENTIS_HEALTH_INTERVAL_SECS", "1"),
        ],
    )
    .await?;
    let mut h = runtime.harness(data_dir, guard).await?;

    let before = samples(&scrape(port).await?);
    assert_eq!(total(&before, "mentis_actions_started_total", &[]), 0.0);

    let id = h.create_default().await?.sandbox_id;
    assert_eq!(stdout(&h.sh(&id, "echo one").await?), "one\n");
    assert_eq!(cmd_end(&h.sh(&id, "exit 4").await?)?.exit_code, 4);
    let cell = h.py(&id, "1 + 1").await?;
    assert_eq!(cell_value(&cell).as_deref(), Some("2"));

    let after_text = scrape(port).await?;
    let after = samples(&after_text);
    eprintln!("{after_text}");
    let shell = "kind=\"shell\"";
    assert_eq!(total(&after, "mentis_actions_started_total", &[shell]), 2.0);
    assert_eq!(
        total(
            &after,
            "mentis_actions_ended_total",
            &[shell, "reason=\"Exited\""]
        ),
        2.0
    );
    assert_eq!(
        total(
            &after,
            "mentis_actions_ended_total",
            &["kind=\"ipython\"", "reason=\"Ok\""]
        ),
        1.0
    );
    assert_eq!(
        total(&after, "mentis_action_duration_seconds_count", &[shell]),
        2.0
    );
    assert_eq!(
        total(
            &after,
            "mentis_sandbox_creates_total",
            &["path=\"cold\"", "outcome=\"ok\""]
        ),
        1.0
    );
    assert_eq!(
        total(
            &after,
            "mentis_sandbox_create_duration_seconds_count",
            &["path=\"cold\""]
        ),
        1.0
    );
    assert_eq!(
        total(
            &after,
            "mentis_sandboxes",
            &["state=\"RUNNING\"", "space=\"default\""]
        ),
        1.0
    );
    // Only the state it is in now (a series seen while it was CREATING reads 0).
    assert_eq!(total(&after, "mentis_sandboxes", &[]), 1.0);
    assert!(
        total(&after, "mentis_observations_appended_total", &[])
            > total(&before, "mentis_observations_appended_total", &[])
    );
    // Each Execute stream was counted open and closed again (the server drops a stream just after its end).
    let mut open = total(&after, "mentis_streams_open", &[]);
    for _ in 0..20 {
        if open == 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        open = total(&samples(&scrape(port).await?), "mentis_streams_open", &[]);
    }
    assert_eq!(open, 0.0);

    // Per-sandbox memory and CPU time from the sandbox's cgroup, as of its last health check; gone with it.
    let of_sandbox = format!("sandbox_id=\"{id}\"");
    let mut usage = (0.0, 0.0);
    for _ in 0..50 {
        let now = samples(&scrape(port).await?);
        usage = (
            total(&now, "mentis_sandbox_memory_bytes", &[&of_sandbox]),
            total(&now, "mentis_sandbox_cpu_seconds_total", &[&of_sandbox]),
        );
        if usage.0 > 0.0 && usage.1 > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("sandbox usage: {} bytes, {} s of CPU", usage.0, usage.1);
    // The executor, its kernel and a shell: more than a MiB, less than the default 1 GiB limit.
    assert!(
        usage.0 > (1 << 20) as f64 && usage.0 < (1u64 << 30) as f64,
        "{usage:?}"
    );
    assert!(usage.1 > 0.0, "{usage:?}");
    h.sandboxes
        .delete_sandbox(mentis_proto::api::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    let gone = scrape(port).await?;
    assert!(
        !gone.contains(&of_sandbox),
        "a deleted sandbox's series stays:\n{gone}"
    );

    // The same instruments reach the OTLP receiver.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut names = std::collections::BTreeSet::new();
    while !names.contains("mentis.actions.ended") && tokio::time::Instant::now() < deadline {
        for batch in collector
            .exported_metrics(1, Duration::from_millis(500))
            .await
        {
            names.extend(batch.metrics.into_iter().map(|m| m.name));
        }
    }
    for name in [
        "mentis.actions.started",
        "mentis.actions.ended",
        "mentis.action.duration",
        "mentis.sandbox.creates",
        "mentis.sandboxes",
    ] {
        assert!(
            names.contains(name),
            "{name} not pushed over OTLP: {names:?}"
        );
    }
    h.stop().await?;
    Ok(())
}
