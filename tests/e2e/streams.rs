//! Observation streams: replay after a seq returns exactly what was missed, then live ones; Connect attach
//! replays too; every observation of a run has one place in the sandbox's sequence.

use std::time::Duration;

use futures::StreamExt;
use mentis_e2e::*;
use mentis_proto::api;

type Next = Option<Result<Option<api::connect_response::Kind>, tonic::Status>>;

/// The next message of a Connect stream (bounded wait).
async fn next(resp: &mut tonic::Streaming<api::ConnectResponse>) -> anyhow::Result<Next> {
    let m = tokio::time::timeout(Duration::from_secs(30), resp.next()).await?;
    Ok(m.map(|r| r.map(|m| m.kind)))
}

/// Reads `n` observations from StreamObservations after `after_seq`.
#[tokio::test]
async fn replay_after_seq_returns_exactly_the_missed_observations_then_live_ones()
-> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    let first = h.sh(&id, "echo one; echo two").await?;
    let second = h.sh(&id, "echo three").await?;
    let all: Vec<u64> = first.iter().chain(&second).map(|o| o.seq).collect();
    let last = *all.last().unwrap();

    // Everything from the start: the sandbox-ready event, then both actions, contiguous.
    let everything = h.read_log(&id, 0, last as usize).await?;
    let seqs: Vec<u64> = everything.iter().map(|o| o.seq).collect();
    assert_eq!(seqs, (1..=last).collect::<Vec<_>>(), "contiguous from 1");
    assert!(matches!(everything[0].kind, Some(Kind::AgentState(_))));

    // After the first action's end: exactly the second action's observations.
    let k = first.last().unwrap().seq;
    let missed = h.read_log(&id, k, second.len()).await?;
    assert_eq!(missed, second, "replay after {k}");

    // Then live: a follower that caught up receives the next action's observations as they happen.
    let mut follower = h
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: id.clone(),
            after_seq: last,
            action_id: String::new(),
        })
        .await?
        .into_inner();
    let third = h.sh(&id, "echo four").await?;
    for expected in &third {
        let m = tokio::time::timeout(Duration::from_secs(30), follower.next())
            .await?
            .unwrap()?;
        let Some(api::stream_observations_response::Kind::Observation(o)) = m.kind else {
            anyhow::bail!("expected an observation");
        };
        assert_eq!(&o, expected);
    }
    h.stop().await
}

#[tokio::test]
async fn connect_attach_replays_then_follows() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    let before = h.sh(&id, "echo before").await?;
    let after_seq = before[0].seq - 1;

    let (tx, rx) = tokio::sync::mpsc::channel(8);
    let mut resp = h
        .actions
        .connect(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    use api::connect_request::{Attach, Kind as Req, Submit};
    tx.send(api::ConnectRequest {
        kind: Some(Req::Attach(Attach {
            sandbox_id: id.clone(),
            after_seq: Some(after_seq),
        })),
    })
    .await?;
    let Some(Ok(Some(api::connect_response::Kind::Attached(a)))) = next(&mut resp).await? else {
        anyhow::bail!("expected attached");
    };
    assert_eq!(a.last_seq, before.last().unwrap().seq);
    for expected in &before {
        let Some(Ok(Some(api::connect_response::Kind::Observation(o)))) = next(&mut resp).await?
        else {
            anyhow::bail!("expected replayed observation");
        };
        assert_eq!(&o, expected);
    }
    tx.send(api::ConnectRequest {
        kind: Some(Req::Submit(Submit {
            action: Some(shell_action(cmd("echo live"))),
            action_id: String::new(),
        })),
    })
    .await?;
    let mut live = Vec::new();
    loop {
        match next(&mut resp).await? {
            Some(Ok(Some(api::connect_response::Kind::Accepted(_)))) => {}
            Some(Ok(Some(api::connect_response::Kind::Observation(o)))) => {
                let end = matches!(o.kind, Some(Kind::CmdEnd(_)));
                live.push(o);
                if end {
                    break;
                }
            }
            other => anyhow::bail!("unexpected {other:?}"),
        }
    }
    assert_eq!(stdout(&live), "live\n");
    assert_eq!(
        live[0].seq,
        before.last().unwrap().seq + 1,
        "no gap, no duplicate"
    );

    // A bad submit is rejected in-stream; the stream stays usable.
    tx.send(api::ConnectRequest {
        kind: Some(Req::Submit(Submit {
            action: Some(shell_action(cmd(""))),
            action_id: "x1".into(),
        })),
    })
    .await?;
    let Some(Ok(Some(api::connect_response::Kind::Rejected(r)))) = next(&mut resp).await? else {
        anyhow::bail!("expected rejected");
    };
    assert_eq!(
        (r.action_id.as_str(), r.code.as_str()),
        ("x1", "INVALID_ARGUMENT")
    );
    h.stop().await
}
