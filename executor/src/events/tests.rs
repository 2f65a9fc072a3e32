#![allow(clippy::unwrap_used)]

use std::time::Duration;

use bytes::Bytes;
use mentis_model::{CmdEnd, OutputStream};

use super::*;

fn out(n: u8) -> ObservationKind {
    ObservationKind::CmdOutput {
        stream: OutputStream::Stdout,
        data: Bytes::from(vec![n]),
    }
}

fn end() -> ObservationKind {
    ObservationKind::CmdEnd(CmdEnd::failed_to_start("x".into()))
}

const WAIT: Duration = Duration::from_secs(600);

async fn indexes(reader: &mut Reader, n: usize) -> Vec<u64> {
    let mut got = Vec::new();
    for _ in 0..n {
        got.push(reader.next().await.unwrap().index);
    }
    got
}

#[tokio::test]
async fn run_numbers_events_and_survives_a_gone_reader() {
    let (mut sink, mut rx) = EventSink::channel();
    let before = SystemTime::now();
    sink.send(ObservationKind::CmdStart {
        command: "true".into(),
        pid: 7,
    })
    .await;
    let first = rx.recv().await.unwrap();
    assert_eq!(first.index, 1);
    assert!(first.time >= before);
    assert!(matches!(
        first.kind,
        ObservationKind::CmdStart { pid: 7, .. }
    ));
    drop(rx);
    // Must neither panic nor block, whatever the amount.
    for i in 0..(EVENT_BUFFER * 3) {
        sink.send(out(i as u8)).await;
    }
    sink.send(end()).await;
    assert!(
        sink.outbox.is_done(),
        "nothing is kept for a Run reader that left"
    );
}

#[tokio::test]
async fn held_events_stay_until_acked_and_a_new_reader_resumes_after_its_index() {
    let outboxes = Outboxes::default();
    let (mut sink, outbox) = outboxes.open("a", Hold::Acked { wait: WAIT }).unwrap();
    let mut first = outbox.attach(0);
    for i in 1..=5 {
        sink.send(out(i)).await;
    }
    assert_eq!(indexes(&mut first, 5).await, [1, 2, 3, 4, 5]);
    outbox.ack(2);
    // The control plane restarts: it holds 1..=3 (3 was read but not acknowledged yet).
    drop(first);
    sink.send(out(6)).await;
    sink.send(end()).await;
    let mut again = outboxes.get("a").unwrap().attach(3);
    assert_eq!(indexes(&mut again, 3).await, [4, 5, 6]);
    assert_eq!(again.next().await.unwrap().index, 7);
    assert!(!outbox.is_done(), "nothing acknowledged past 2 yet");
    let ack = {
        let outbox = Arc::clone(&outbox);
        tokio::spawn(async move {
            tokio::task::yield_now().await;
            outbox.ack(7);
        })
    };
    assert!(
        again.next().await.is_none(),
        "the stream ends after the terminal event, once it is acknowledged"
    );
    ack.await.unwrap();
    assert!(outbox.is_done());
    outboxes.release_if_done("a", &outbox);
    assert!(matches!(outboxes.get("a"), Err(Error::NotFound(_))));
}

#[tokio::test]
async fn a_reader_from_before_the_acks_gets_what_is_still_held() {
    let outboxes = Outboxes::default();
    let (mut sink, outbox) = outboxes.open("a", Hold::Acked { wait: WAIT }).unwrap();
    for i in 1..=4 {
        sink.send(out(i)).await;
    }
    outbox.ack(2);
    let mut r = outbox.attach(0);
    assert_eq!(
        indexes(&mut r, 2).await,
        [3, 4],
        "an index jump says what is gone"
    );
}

#[tokio::test]
async fn a_newer_reader_ends_the_older_one() {
    let outboxes = Outboxes::default();
    let (mut sink, outbox) = outboxes.open("a", Hold::Acked { wait: WAIT }).unwrap();
    let mut old = outbox.attach(0);
    let mut new = outbox.attach(0);
    sink.send(out(1)).await;
    assert!(old.next().await.is_none());
    assert_eq!(new.next().await.unwrap().index, 1);
}

#[tokio::test(start_paused = true)]
async fn a_full_outbox_waits_for_acks_while_a_reader_is_attached() {
    let outboxes = Outboxes::default();
    let (mut sink, outbox) = outboxes.open("a", Hold::Acked { wait: WAIT }).unwrap();
    let mut reader = outbox.attach(0);
    let producer = tokio::spawn(async move {
        for i in 0..(EVENT_BUFFER + 10) {
            sink.send(out(i as u8)).await;
        }
        sink.send(end()).await;
    });
    // Read everything that fits, but acknowledge nothing: the producer must wait, however long.
    let got = indexes(&mut reader, EVENT_BUFFER).await;
    assert_eq!(got.last(), Some(&(EVENT_BUFFER as u64)));
    tokio::time::sleep(WAIT * 3).await;
    assert!(!producer.is_finished(), "output waits for its reader");
    outbox.ack(EVENT_BUFFER as u64);
    let rest = indexes(&mut reader, 11).await;
    assert_eq!(rest.first(), Some(&(EVENT_BUFFER as u64 + 1)));
    producer.await.unwrap();
    reader.outbox().ack(EVENT_BUFFER as u64 + 11);
    assert!(reader.next().await.is_none());
}

#[tokio::test(start_paused = true)]
async fn with_nobody_attached_past_the_wait_the_oldest_events_go() {
    let outboxes = Outboxes::default();
    let (mut sink, outbox) = outboxes.open("a", Hold::Acked { wait: WAIT }).unwrap();
    drop(outbox.attach(0));
    let producer = tokio::spawn(async move {
        for i in 0..(EVENT_BUFFER + 10) {
            sink.send(out(i as u8)).await;
        }
        sink.send(end()).await;
    });
    tokio::time::sleep(WAIT / 2).await;
    assert!(
        !producer.is_finished(),
        "a control plane may still come back"
    );
    tokio::time::sleep(WAIT).await;
    producer.await.unwrap();
    let mut late = outbox.attach(0);
    let first = late.next().await.unwrap().index;
    assert_eq!(
        first, 11,
        "10 of the oldest went, the newest {EVENT_BUFFER} are held"
    );
    let mut last = first;
    while last < EVENT_BUFFER as u64 + 11 {
        last = late.next().await.unwrap().index;
    }
    let end = late
        .outbox()
        .state()
        .events
        .back()
        .map(|e| e.kind.is_terminal());
    assert_eq!(end, Some(true), "the terminal event is kept");
}

#[tokio::test]
async fn ids_are_refused_while_running_and_ended_ones_are_replaced() {
    let outboxes = Outboxes::default();
    let (mut sink, outbox) = outboxes.open("a", Hold::Acked { wait: WAIT }).unwrap();
    assert!(matches!(
        outboxes.open("a", Hold::Acked { wait: WAIT }),
        Err(Error::AlreadyExists(_))
    ));
    sink.send(end()).await;
    let (_, replaced) = outboxes.open("a", Hold::Read).unwrap();
    assert!(!Arc::ptr_eq(&replaced, &outbox));
    assert_eq!(outboxes.len(), 1);
    // The old outbox's release does not touch the new one.
    outbox.ack(1);
    outboxes.release_if_done("a", &outbox);
    assert_eq!(outboxes.len(), 1);
}
