//! A control plane killed (SIGKILL) while actions run: started again, it attaches to every running executor
//! and receives what was emitted meanwhile (each executor holds an action's events until the runtime has
//! journaled them). Clients resume from the last seq they saw and get every line once and the action's own
//! end, for a shell command and for a cell alike.

use std::time::Duration;

use futures::StreamExt;
use mentis_e2e::*;
use mentis_proto::api::{self, observation::Kind};

const LINES: usize = 30;

fn is_end(o: &api::Observation) -> bool {
    matches!(o.kind, Some(Kind::CmdEnd(_)) | Some(Kind::IpythonResult(_)))
}

/// Reads an Execute stream until its first output: what the client saw before the kill.
async fn until_first_output(
    stream: &mut tonic::Streaming<api::ExecuteResponse>,
) -> anyhow::Result<Vec<api::Observation>> {
    let mut seen = Vec::new();
    loop {
        let item = tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("the stream ended before any output"))??;
        if let Some(api::execute_response::Kind::Observation(o)) = item.kind {
            let output = matches!(
                o.kind,
                Some(Kind::CmdOutput(_)) | Some(Kind::IpythonOutput(_))
            );
            seen.push(o);
            if output {
                return Ok(seen);
            }
        }
    }
}

/// The rest of an action after `after_seq`, to its terminal observation, from the restarted runtime.
async fn resume_from(
    h: &mut Harness,
    sandbox: &str,
    action: &str,
    after_seq: u64,
) -> anyhow::Result<Vec<api::Observation>> {
    let mut s = h
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: sandbox.to_owned(),
            after_seq,
            action_id: action.to_owned(),
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(item) = tokio::time::timeout(Duration::from_secs(60), s.next()).await? {
        match item?.kind {
            Some(api::stream_observations_response::Kind::Observation(o)) => out.push(o),
            Some(api::stream_observations_response::Kind::Keepalive(_)) => {}
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    Ok(out)
}

fn check_sequence(all: &[api::Observation]) {
    let seqs: Vec<u64> = all.iter().map(|o| o.seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "seqs strictly increase, no duplicates: {seqs:?}"
    );
    assert_eq!(all.iter().filter(|o| is_end(o)).count(), 1, "{all:#?}");
    assert!(
        all.last().is_some_and(is_end),
        "the end is the last: {all:#?}"
    );
}

#[tokio::test]
async fn a_runtime_killed_mid_action_resumes_every_action_to_its_own_end() -> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let mut first = RuntimeProcess::start(bin, &instance, data_dir.path()).await?;
    let mut h = first.harness(data_dir, guard).await?;
    let id = h.create_default().await?.sandbox_id;
    // The kernel is up before the clock starts.
    h.py(&id, "import time").await?;

    let shell = api::ExecuteRequest {
        sandbox_id: id.clone(),
        action: Some(shell_action(cmd(&format!(
            "for i in $(seq 1 {LINES}); do echo line-$i; sleep 0.1; done"
        )))),
        action_id: "numbered-shell".into(),
    };
    let cell = api::ExecuteRequest {
        sandbox_id: id.clone(),
        action: Some(cell_with(api::IPythonAction {
            code: format!(
                "for i in range({LINES}):\n    print(f'cell-{{i + 1}}', flush=True)\n    time.sleep(0.1)"
            ),
            ..Default::default()
        })),
        action_id: "numbered-cell".into(),
    };
    let mut shell_stream = h.actions.execute(shell).await?.into_inner();
    let mut cell_stream = h.actions.execute(cell).await?.into_inner();
    let shell_before = until_first_output(&mut shell_stream).await?;
    let cell_before = until_first_output(&mut cell_stream).await?;

    // SIGKILL: nothing is flushed, nothing is said to anyone. Lines go on meanwhile.
    first.kill();
    drop((shell_stream, cell_stream));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let Harness {
        data_dir, guard, ..
    } = h;
    let second = RuntimeProcess::start(bin, &instance, data_dir.path()).await?;
    let mut h = second.harness(data_dir, guard).await?;

    let last = |seen: &[api::Observation]| seen.last().map_or(0, |o| o.seq);
    let shell_after = resume_from(&mut h, &id, "numbered-shell", last(&shell_before)).await?;
    let cell_after = resume_from(&mut h, &id, "numbered-cell", last(&cell_before)).await?;

    let shell_all = [shell_before, shell_after].concat();
    check_sequence(&shell_all);
    let expected: String = (1..=LINES).map(|i| format!("line-{i}\n")).collect();
    assert_eq!(stdout(&shell_all), expected, "every line once");
    let end = cmd_end(&shell_all)?;
    assert_eq!(end.reason, api::EndReason::Exited as i32, "{end:?}");
    assert_eq!(end.exit_code, 0);

    let cell_all = [cell_before, cell_after].concat();
    check_sequence(&cell_all);
    let expected: String = (1..=LINES).map(|i| format!("cell-{i}\n")).collect();
    assert_eq!(cell_stdout(&cell_all), expected, "every line once");
    match &cell_all.last().and_then(|o| o.kind.clone()) {
        Some(Kind::IpythonResult(r)) => {
            assert_eq!(r.status, api::IpythonStatus::Ok as i32, "{r:?}")
        }
        other => panic!("not an ipython_result: {other:?}"),
    }
    drop(second);
    Ok(())
}
