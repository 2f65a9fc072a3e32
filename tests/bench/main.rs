//! `make bench`: round trips through the whole chain (client → runtime → executor → process or kernel →
//! back), measured with a real gRPC client against a runtime started in this process, on 127.0.0.1 and our
//! own containers only. Loops are bounded in count and time. Prints median and p95 and writes JSON.
//! (Baselines against Docker itself and the warm-pool figures arrive with the performance issue.)
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use anyhow::Context;
use mentis_e2e::*;
use mentis_proto::api;

/// One measured figure.
struct Figure {
    name: &'static str,
    samples: Vec<Duration>,
}

impl Figure {
    fn pct(&self, p: f64) -> Duration {
        let mut s = self.samples.clone();
        s.sort();
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let i = ((s.len() - 1) as f64 * p).round() as usize;
        s[i]
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Runs `f` up to `n` times or until `budget` is spent, after `warmup` unmeasured runs.
async fn measure<F, Fut>(
    name: &'static str,
    n: usize,
    warmup: usize,
    budget: Duration,
    mut f: F,
) -> anyhow::Result<Figure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    for _ in 0..warmup {
        f().await?;
    }
    let deadline = Instant::now() + budget;
    let mut samples = Vec::with_capacity(n);
    while samples.len() < n && Instant::now() < deadline {
        let t = Instant::now();
        f().await?;
        samples.push(t.elapsed());
    }
    Ok(Figure { name, samples })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let n: usize = std::env::var("BENCH_N")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(200);
    let mut h = Harness::start().await.context("start the runtime")?;
    let mut figures = Vec::new();

    // Cold create to first output: CreateSandbox + `echo ok` until its output arrives.
    let created = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let fig = measure(
        "create_to_first_output_cold",
        n.min(10),
        0,
        Duration::from_secs(120),
        || {
            let mut sandboxes = h.sandboxes.clone();
            let mut actions = h.actions.clone();
            let created = std::sync::Arc::clone(&created);
            async move {
                let sb = sandboxes
                    .create_sandbox(api::CreateSandboxRequest {
                        spec: Some(api::SandboxSpec::default()),
                    })
                    .await?
                    .into_inner()
                    .sandbox
                    .unwrap();
                let s = actions
                    .execute(api::ExecuteRequest {
                        sandbox_id: sb.sandbox_id.clone(),
                        action: Some(shell_action(cmd("echo ok"))),
                        action_id: String::new(),
                    })
                    .await?
                    .into_inner();
                let obs = collect(s, Duration::from_secs(60)).await?;
                anyhow::ensure!(stdout(&obs) == "ok\n");
                created.lock().unwrap().push(sb.sandbox_id);
                Ok(())
            }
        },
    )
    .await?;
    figures.push(fig);
    let ids: Vec<String> = created.lock().unwrap().drain(..).collect();
    for id in ids {
        h.sandboxes
            .delete_sandbox(api::DeleteSandboxRequest { sandbox_id: id })
            .await?;
    }

    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    let fig = measure(
        "shell_round_trip_true",
        n,
        10,
        Duration::from_secs(120),
        || {
            let mut actions = h.actions.clone();
            let id = id.clone();
            async move {
                let s = actions
                    .execute(api::ExecuteRequest {
                        sandbox_id: id,
                        action: Some(shell_action(cmd("true"))),
                        action_id: String::new(),
                    })
                    .await?
                    .into_inner();
                let obs = collect(s, Duration::from_secs(60)).await?;
                anyhow::ensure!(cmd_end(&obs)?.exit_code == 0);
                Ok(())
            }
        },
    )
    .await?;
    figures.push(fig);

    let fig = measure(
        "ipython_round_trip_1_plus_1",
        n,
        10,
        Duration::from_secs(120),
        || {
            let mut actions = h.actions.clone();
            let id = id.clone();
            async move {
                let s = actions
                    .execute(api::ExecuteRequest {
                        sandbox_id: id,
                        action: Some(cell("1+1")),
                        action_id: String::new(),
                    })
                    .await?
                    .into_inner();
                let obs = collect(s, Duration::from_secs(60)).await?;
                anyhow::ensure!(cell_value(&obs).as_deref() == Some("2"), "{obs:?}");
                Ok(())
            }
        },
    )
    .await?;
    figures.push(fig);

    println!(
        "{:<32} {:>6} {:>12} {:>12}",
        "figure", "runs", "median ms", "p95 ms"
    );
    let mut json = serde_json::Map::new();
    for f in &figures {
        println!(
            "{:<32} {:>6} {:>12.2} {:>12.2}",
            f.name,
            f.samples.len(),
            ms(f.pct(0.5)),
            ms(f.pct(0.95))
        );
        json.insert(
            f.name.to_owned(),
            serde_json::json!({ "runs": f.samples.len(), "median_ms": ms(f.pct(0.5)), "p95_ms": ms(f.pct(0.95)) }),
        );
    }
    let path = std::env::var("BENCH_OUT").unwrap_or_else(|_| "target/bench.json".to_owned());
    std::fs::write(
        &path,
        serde_json::to_string_pretty(&serde_json::Value::Object(json))?,
    )?;
    println!("results written to {path}");
    h.stop().await
}
