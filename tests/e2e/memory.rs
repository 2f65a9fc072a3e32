//! The runtime's memory stays flat however much sandboxes print: a journaled log keeps only a recent tail in
//! memory, and an ended sandbox's log keeps only its newest entry (replay reads the journal).

use std::time::Duration;

use futures::StreamExt;
use mentis_e2e::*;
use mentis_proto::api::{self, observation::Kind};

const CYCLES: usize = 5;
const BYTES: usize = 100_000_000;

#[tokio::test]
async fn printing_and_deleting_sandboxes_leaves_runtime_memory_flat() -> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let rt = RuntimeProcess::start(bin, &instance, data_dir.path()).await?;
    let mut h = rt.harness(data_dir, guard).await?;
    let mut rss = Vec::new();
    let mut last = String::new();
    for _ in 0..CYCLES {
        let id = h.create_default().await?.sandbox_id;
        let mut stream = h
            .actions
            .execute(api::ExecuteRequest {
                sandbox_id: id.clone(),
                action: Some(shell_action(api::ShellAction {
                    command: format!("head -c {BYTES} /dev/zero | tr '\\0' x"),
                    timeout_seconds: 300,
                    ..Default::default()
                })),
                action_id: String::new(),
            })
            .await?
            .into_inner();
        // The client reads as fast as it can; one that falls more than the log's 64 MiB behind (a loaded
        // machine, this debug build) is told so with a gap, by design (faults::a_trimmed_log_reports_an_
        // explicit_gap): every byte then, or a gap and fewer.
        let (mut printed, mut gap) = (Vec::new(), false);
        while let Some(item) = tokio::time::timeout(Duration::from_secs(300), stream.next()).await?
        {
            match item?.kind {
                Some(api::execute_response::Kind::Observation(o)) => printed.push(o),
                Some(api::execute_response::Kind::Gap(_)) => gap = true,
                _ => {}
            }
        }
        let seen = output(&printed, api::OutputStream::Stdout).len();
        if gap {
            assert!(seen < BYTES, "a gap, yet {seen} bytes");
        } else {
            assert_eq!(seen, BYTES);
        }
        assert_eq!(cmd_end(&printed)?.exit_code, 0);
        h.sandboxes
            .delete_sandbox(api::DeleteSandboxRequest {
                sandbox_id: id.clone(),
            })
            .await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        rss.push(rt.rss_kib()?);
        last = id;
    }
    // Each cycle used to keep up to 64 MiB of log in memory for the retention hour: five cycles, 320 MiB.
    let growth = rss[CYCLES - 1].saturating_sub(rss[0]);
    assert!(
        growth <= 64 * 1024,
        "RSS grew by {growth} KiB from the first cycle to the last: {rss:?}"
    );
    // The ended sandbox's log still replays from its journal: a gap (its bounds trimmed the oldest), then
    // the newest output, byte for byte, and the end.
    let mut s = h
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: last,
            after_seq: 0,
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let mut bytes = 0usize;
    let mut gap = false;
    while let Some(item) = tokio::time::timeout(Duration::from_secs(60), s.next()).await? {
        match item?.kind {
            Some(api::stream_observations_response::Kind::Gap(_)) => gap = true,
            Some(api::stream_observations_response::Kind::Observation(o)) => {
                if let Some(Kind::CmdOutput(c)) = o.kind {
                    assert!(c.data.iter().all(|b| *b == b'x'));
                    bytes += c.data.len();
                }
            }
            _ => {}
        }
    }
    assert!(gap, "100 MB of output is beyond the 64 MiB bound");
    assert!(
        (50 * 1024 * 1024..BYTES).contains(&bytes),
        "replayed {bytes} bytes"
    );
    eprintln!("runtime RSS after each cycle (KiB): {rss:?}");
    drop(rt);
    Ok(())
}
