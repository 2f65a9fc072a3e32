//! Terminals in the executor alone: a real pty, input after input, resize, a signal, the program's end, a
//! client that attaches again, close and the per-sandbox bound.

use std::time::Duration;

use mentis_proto::executor::{self as api, open_request, open_response};
use mentis_proto::executor::{
    CloseTerminalRequest, ListTerminalsRequest, TerminalRequest, TerminalResponse, TerminalSettings,
};
use tokio::sync::mpsc;
use tonic::Streaming;

use super::support::*;

struct Term {
    tx: mpsc::Sender<TerminalRequest>,
    rx: Streaming<TerminalResponse>,
    id: String,
    screen: String,
    /// Where the next `expect` looks from: after what the last one found.
    cursor: usize,
    exited: Option<open_response::Exited>,
}

fn settings(max: u32) -> TerminalSettings {
    TerminalSettings {
        env: Default::default(),
        max_terminals: max,
        default_idle_timeout_seconds: 600,
        scrollback_bytes: 1 << 20,
    }
}

fn start(command: &[&str]) -> api::OpenRequest {
    api::OpenRequest {
        kind: Some(open_request::Kind::Start(open_request::Start {
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            cols: 90,
            rows: 20,
            ..Default::default()
        })),
    }
}

async fn open(
    client: &mut Client,
    first: api::OpenRequest,
    max: u32,
) -> Result<Term, tonic::Status> {
    let (tx, rx) = mpsc::channel(16);
    tx.send(TerminalRequest {
        request: Some(first),
        settings: Some(settings(max)),
    })
    .await
    .unwrap();
    let mut rx = client
        .terminal(tokio_stream::wrappers::ReceiverStream::new(rx))
        .await?
        .into_inner();
    let started = tokio::time::timeout(PATIENCE, rx.message())
        .await
        .unwrap()?
        .unwrap();
    let Some(open_response::Kind::Started(s)) = started.response.clone().and_then(|r| r.kind)
    else {
        panic!("expected started: {started:?}");
    };
    Ok(Term {
        tx,
        rx,
        id: s.terminal_id,
        screen: String::new(),
        cursor: 0,
        exited: None,
    })
}

impl Term {
    async fn send(&self, kind: open_request::Kind) {
        self.tx
            .send(TerminalRequest {
                request: Some(api::OpenRequest { kind: Some(kind) }),
                settings: None,
            })
            .await
            .unwrap();
    }

    async fn type_in(&self, text: &str) {
        self.send(open_request::Kind::Input(open_request::Input {
            data: text.as_bytes().to_vec().into(),
        }))
        .await;
    }

    async fn expect(&mut self, text: &str) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        while !self.screen[self.cursor..].contains(text) {
            let m = tokio::time::timeout_at(deadline, self.rx.message())
                .await
                .unwrap_or_else(|_| panic!("{text:?} never came: {:?}", self.screen))
                .unwrap();
            match m.and_then(|m| m.response).and_then(|m| m.kind) {
                Some(open_response::Kind::Output(o)) => {
                    self.screen.push_str(&String::from_utf8_lossy(&o.data));
                }
                Some(open_response::Kind::Exited(e)) => self.exited = Some(e),
                None => panic!("the stream ended before {text:?}: {:?}", self.screen),
                other => panic!("unexpected {other:?}"),
            }
        }
        let at = self.screen[self.cursor..].find(text).unwrap_or(0);
        self.cursor += at + text.len();
    }

    async fn until_exit(&mut self) -> open_response::Exited {
        loop {
            let m = tokio::time::timeout(PATIENCE, self.rx.message())
                .await
                .unwrap()
                .unwrap();
            match m.and_then(|m| m.response).and_then(|m| m.kind) {
                Some(open_response::Kind::Output(o)) => {
                    self.screen.push_str(&String::from_utf8_lossy(&o.data));
                }
                Some(open_response::Kind::Exited(e)) => self.exited = Some(e),
                None => return self.exited.expect("exited before the end"),
                other => panic!("unexpected {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn input_after_input_resize_signal_and_the_programs_end() {
    let ex = TestExecutor::start().await;
    let mut client = ex.client().await;
    let mut t = open(&mut client, start(&["/bin/bash", "--norc", "-i"]), 4)
        .await
        .unwrap();
    t.type_in("stty size\r").await;
    t.expect("20 90").await;
    t.type_in("echo $((6*7))\r").await;
    t.expect("42").await;
    t.type_in("echo again-$((1+1))\r").await;
    t.expect("again-2").await;
    t.send(open_request::Kind::Resize(open_request::Resize {
        cols: 132,
        rows: 43,
    }))
    .await;
    t.type_in("stty size\r").await;
    t.expect("43 132").await;
    // An interactive shell's Ctrl-C ends the whole line (no `echo` after it), and $? says SIGINT.
    // (SIGINT once the line runs: one that came while bash still read the line would only clear it.)
    t.type_in("echo SLEEPING; sleep 300; echo never\r").await;
    t.expect("SLEEPING\r\n").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    t.send(open_request::Kind::Signal(open_request::Signal {
        name: "sigint".into(),
    }))
    .await;
    t.type_in("echo slept-$?\r").await;
    t.expect("slept-130").await;
    t.type_in("exit 5\r").await;
    let exited = t.until_exit().await;
    assert_eq!((exited.exit_code, exited.signal), (5, 0));
}

#[tokio::test]
async fn attach_again_close_and_the_bound() {
    let ex = TestExecutor::start().await;
    let mut client = ex.client().await;
    let mut t = open(&mut client, start(&["/bin/bash", "--norc", "-i"]), 1)
        .await
        .unwrap();
    t.type_in("echo first-$((2*3))\r").await;
    t.expect("first-6").await;
    // One may run: a second start is refused.
    let second = open(&mut client, start(&["cat"]), 1).await;
    assert_eq!(
        second.err().map(|s| s.code()),
        Some(tonic::Code::ResourceExhausted)
    );
    let attach = api::OpenRequest {
        kind: Some(open_request::Kind::Attach(open_request::Attach {
            sandbox_id: String::new(),
            terminal_id: t.id.clone(),
            after_seq: 0,
        })),
    };
    let mut again = open(&mut client, attach, 1).await.unwrap();
    again.expect("first-6").await;
    again.type_in("echo second-$((3*3))\r").await;
    again.expect("second-9").await;
    t.expect("second-9").await;
    let listed = client
        .list_terminals(ListTerminalsRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.terminals.len(), 1);
    assert_eq!(listed.terminals[0].attached, 2);
    client
        .close_terminal(CloseTerminalRequest {
            terminal_id: t.id.clone(),
        })
        .await
        .unwrap();
    assert_eq!(t.until_exit().await.signal, 1);
    assert_eq!(again.until_exit().await.exit_code, 129);
}
