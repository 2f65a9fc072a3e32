//! Attach: the executor holds an action's events until the control plane acknowledges them, so a control
//! plane that went away attaches again after the last event it holds and gets the rest, its end included.

use mentis_proto::executor::{
    AttachRequest, AttachResponse, Resume, RunResponse, attach_request, run_response,
};
use tokio::sync::mpsc;
use tonic::{Code, Streaming};

use super::support::*;

/// One attach: its events, and the sender of its acks.
struct Attached {
    events: Streaming<AttachResponse>,
    acks: mpsc::UnboundedSender<AttachRequest>,
}

async fn attach(
    client: &mut Client,
    first: attach_request::Kind,
) -> Result<Attached, tonic::Status> {
    let (acks, rx) = mpsc::unbounded_channel();
    acks.send(AttachRequest { kind: Some(first) }).unwrap();
    let requests = tokio_stream::wrappers::UnboundedReceiverStream::new(rx);
    let events = client.attach(requests).await?.into_inner();
    Ok(Attached { events, acks })
}

impl Attached {
    async fn next(&mut self) -> Option<RunResponse> {
        tokio::time::timeout(PATIENCE, self.events.message())
            .await
            .expect("an event in time")
            .expect("stream ok")
            .map(|r| r.event.expect("an event"))
    }

    fn ack(&self, index: u64) {
        self.acks
            .send(AttachRequest {
                kind: Some(attach_request::Kind::Ack(index)),
            })
            .unwrap();
    }
}

fn stdout_of(events: &[RunResponse]) -> String {
    events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(run_response::Kind::CmdOutput(o)) => {
                Some(String::from_utf8_lossy(&o.data).into_owned())
            }
            _ => None,
        })
        .collect()
}

#[tokio::test]
async fn a_second_attach_gets_what_the_first_did_not_hold_and_the_end() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let id = action_id();
    let gate = executor.path("gate");
    let command = format!(
        "echo one; echo two; while [ ! -e {} ]; do sleep 0.05; done; echo three",
        gate.display()
    );
    let mut first = attach(
        &mut client,
        attach_request::Kind::Start(request(&id, shell(&command))),
    )
    .await
    .unwrap();
    let mut held = Vec::new();
    while stdout_of(&held) != "one\ntwo\n" {
        held.push(first.next().await.unwrap());
    }
    first.ack(1);
    // The control plane goes away holding everything up to the last event it read; the command goes on.
    let last = held.last().unwrap().index;
    drop(first);
    std::fs::write(&gate, b"").unwrap();

    let mut again = attach(
        &mut client,
        attach_request::Kind::Resume(Resume {
            action_id: id.clone(),
            after_index: last,
        }),
    )
    .await
    .unwrap();
    let mut rest = Vec::new();
    loop {
        let event = again.next().await.expect("events up to the end");
        let end = matches!(event.kind, Some(run_response::Kind::CmdEnd(_)));
        rest.push(event);
        if end {
            break;
        }
    }
    assert_eq!(rest.first().map(|e| e.index), Some(last + 1), "{rest:?}");
    let all = [held, rest].concat();
    assert_eq!(stdout_of(&all), "one\ntwo\nthree\n");
    let indexes: Vec<u64> = all.iter().map(|e| e.index).collect();
    assert_eq!(indexes, (1..=all.len() as u64).collect::<Vec<_>>());
    match &all.last().unwrap().kind {
        Some(run_response::Kind::CmdEnd(end)) => {
            assert_eq!(reason(end), mentis_proto::executor::EndReason::Exited)
        }
        other => panic!("not cmd_end: {other:?}"),
    }
    // The stream ends once the end is acknowledged, and the executor forgets the action.
    again.ack(all.last().unwrap().index);
    assert!(again.next().await.is_none());
    let forgotten = attach(
        &mut client,
        attach_request::Kind::Resume(Resume {
            action_id: id.clone(),
            after_index: 0,
        }),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(forgotten.code(), Code::NotFound, "{forgotten:?}");
}

#[tokio::test]
async fn attaching_to_an_unknown_action_or_starting_with_an_ack_is_refused() {
    let executor = TestExecutor::start().await;
    let mut client = executor.client().await;
    let unknown = attach(
        &mut client,
        attach_request::Kind::Resume(Resume {
            action_id: "never-ran".into(),
            after_index: 0,
        }),
    )
    .await
    .err()
    .unwrap();
    assert_eq!(unknown.code(), Code::NotFound, "{unknown:?}");
    let ack_first = attach(&mut client, attach_request::Kind::Ack(3))
        .await
        .err()
        .unwrap();
    assert_eq!(ack_first.code(), Code::InvalidArgument, "{ack_first:?}");
}

#[tokio::test]
async fn tmp_iopub_close_over_attach() {
    let executor = super::ipython::start_ipython().await;
    let mut client = executor.client().await;
    for code in [
        "x = 1",
        "get_ipython().kernel.shell_stream.close()",
        "print('x' in globals())",
        "x = 1",
        "get_ipython().kernel.iopub_socket.close()",
        "print('x' in globals())",
    ] {
        let started = std::time::Instant::now();
        let req = super::ipython::cell_request(&action_id(), super::ipython::cell(code));
        let mut a = attach(&mut client, attach_request::Kind::Start(req))
            .await
            .unwrap();
        loop {
            let e = a.next().await.unwrap();
            let end = matches!(e.kind, Some(run_response::Kind::IpythonResult(_)));
            if end {
                a.ack(e.index);
                break;
            }
        }
        drop(a);
        eprintln!("{code}: {:?}", started.elapsed());
    }
}
