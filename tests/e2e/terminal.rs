//! Terminals end to end (TerminalService): a real pty in the sandbox, seen by programs as a TTY, resized
//! with SIGWINCH, interrupted by Ctrl-C and by a signal request; a client that comes back replays the
//! scrollback; terminals are listed, closed, bounded per sandbox, expire when idle, and count as activity.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use mentis_e2e::*;
use mentis_proto::api::{
    self, open_request, open_response, terminal_service_client::TerminalServiceClient,
};
use tokio::sync::mpsc;
use tonic::Streaming;

/// One terminal stream: what was sent and what came back.
pub(super) struct Term {
    tx: Option<mpsc::Sender<api::OpenRequest>>,
    rx: Streaming<api::OpenResponse>,
    id: String,
    /// Everything the terminal printed to this stream, as text.
    screen: String,
    /// Where the next `expect` looks from: after what the last one found.
    cursor: usize,
    last_seq: u64,
    exited: Option<open_response::Exited>,
}

pub(super) fn start(sandbox: &str, command: &[&str], cols: u32, rows: u32) -> api::OpenRequest {
    api::OpenRequest {
        kind: Some(open_request::Kind::Start(open_request::Start {
            sandbox_id: sandbox.to_owned(),
            command: command.iter().map(|s| (*s).to_owned()).collect(),
            cols,
            rows,
            ..Default::default()
        })),
    }
}

fn attach(sandbox: &str, terminal: &str, after_seq: u64) -> api::OpenRequest {
    api::OpenRequest {
        kind: Some(open_request::Kind::Attach(open_request::Attach {
            sandbox_id: sandbox.to_owned(),
            terminal_id: terminal.to_owned(),
            after_seq,
        })),
    }
}

impl Term {
    /// Opens a stream with `first`, and reads its `started`.
    pub(super) async fn open(
        client: &mut TerminalServiceClient<ApiChannel>,
        first: api::OpenRequest,
    ) -> Result<Self> {
        Ok(Self::try_open(client, first).await??)
    }

    /// Opens a stream with `first`; the inner error is the status the server refused it with.
    async fn try_open(
        client: &mut TerminalServiceClient<ApiChannel>,
        first: api::OpenRequest,
    ) -> Result<std::result::Result<Self, tonic::Status>> {
        let (tx, rx) = mpsc::channel(16);
        tx.send(first).await?;
        let stream = tokio_stream::wrappers::ReceiverStream::new(rx);
        let mut rx = match client.open(stream).await {
            Ok(r) => r.into_inner(),
            Err(status) => return Ok(Err(status)),
        };
        let started = match tokio::time::timeout(Duration::from_secs(60), rx.message())
            .await
            .context("no answer to the first request")?
        {
            Ok(Some(started)) => started,
            Ok(None) => bail!("the stream ended before started"),
            Err(status) => return Ok(Err(status)),
        };
        let Some(open_response::Kind::Started(s)) = started.kind else {
            bail!("expected started, got {started:?}");
        };
        Ok(Ok(Self {
            tx: Some(tx),
            rx,
            id: s.terminal_id,
            screen: String::new(),
            cursor: 0,
            last_seq: 0,
            exited: None,
        }))
    }

    async fn send(&self, kind: open_request::Kind) -> Result<()> {
        self.tx
            .as_ref()
            .context("the request side is closed")?
            .send(api::OpenRequest { kind: Some(kind) })
            .await?;
        Ok(())
    }

    pub(super) async fn type_in(&self, text: &str) -> Result<()> {
        self.send(open_request::Kind::Input(open_request::Input {
            data: text.as_bytes().to_vec().into(),
        }))
        .await
    }

    async fn resize(&self, cols: u32, rows: u32) -> Result<()> {
        self.send(open_request::Kind::Resize(open_request::Resize {
            cols,
            rows,
        }))
        .await
    }

    async fn signal(&self, name: &str) -> Result<()> {
        self.send(open_request::Kind::Signal(open_request::Signal {
            name: name.to_owned(),
        }))
        .await
    }

    /// Reads one message; false when the stream ended.
    async fn read_one(&mut self, within: Duration) -> Result<bool> {
        let m = tokio::time::timeout(within, self.rx.message())
            .await
            .with_context(|| {
                format!(
                    "nothing within {within:?}; screen so far: {:?}",
                    self.screen
                )
            })??;
        let Some(m) = m else { return Ok(false) };
        match m.kind {
            Some(open_response::Kind::Output(o)) => {
                assert!(
                    o.seq > self.last_seq,
                    "seqs rise: {} after {}",
                    o.seq,
                    self.last_seq
                );
                self.last_seq = o.seq;
                self.screen.push_str(&String::from_utf8_lossy(&o.data));
            }
            Some(open_response::Kind::Exited(e)) => self.exited = Some(e),
            Some(open_response::Kind::Keepalive(_)) => {}
            other => bail!("unexpected {other:?}"),
        }
        Ok(true)
    }

    /// Reads until the screen holds `text` after position `from`; returns the position after it.
    async fn expect_from(&mut self, from: usize, text: &str) -> Result<usize> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(at) = self.screen.get(from..).and_then(|s| s.find(text)) {
                return Ok(from + at + text.len());
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() || !self.read_one(left).await? {
                bail!("{text:?} never came; screen: {:?}", self.screen);
            }
        }
    }

    /// Reads until the screen holds `text` after what the last `expect` found.
    pub(super) async fn expect(&mut self, text: &str) -> Result<usize> {
        self.cursor = self.expect_from(self.cursor, text).await?;
        Ok(self.cursor)
    }

    /// Reads to the end of the stream; returns how the program exited.
    async fn until_exit(&mut self) -> Result<open_response::Exited> {
        while self.read_one(Duration::from_secs(30)).await? {}
        self.exited.context("the stream ended without exited")
    }
}

pub(super) fn terminals(h: &Harness) -> TerminalServiceClient<ApiChannel> {
    TerminalServiceClient::new(h.channel.clone())
}

async fn list(h: &Harness, sandbox: &str) -> Result<Vec<api::TerminalInfo>> {
    Ok(terminals(h)
        .list_terminals(api::ListTerminalsRequest {
            sandbox_id: sandbox.to_owned(),
        })
        .await?
        .into_inner()
        .terminals)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn programs_see_a_tty_that_resizes_and_ctrl_c_interrupts() -> Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let mut client = terminals(&h);
    let mut t = Term::open(&mut client, start(&sb.sandbox_id, &[], 100, 30)).await?;
    assert!(t.id.starts_with("term-"), "{}", t.id);
    // A login bash on a pty, as the sandbox user, in the workspace, in its own session.
    t.type_in("tty; stty size; id -u; pwd; echo TERM=$TERM\r")
        .await?;
    t.expect("/dev/pts/").await?;
    t.expect("30 100").await?;
    t.expect("1000").await?;
    t.expect("/workspace").await?;
    t.expect("TERM=xterm-256color").await?;
    t.type_in("echo $((6*7))\r").await?;
    t.expect("42").await?;
    // Resize: stty sees the new size, and a program waiting in the foreground gets SIGWINCH.
    t.resize(120, 40).await?;
    t.type_in("stty size\r").await?;
    t.expect("40 120").await?;
    t.type_in(
        "python3 -c 'import os, signal, time; signal.signal(signal.SIGWINCH, lambda *_: \
         print(\"WINCH\", os.get_terminal_size(), flush=True)); print(\"READY\", flush=True); time.sleep(120)'\r",
    )
    .await?;
    t.expect("READY\r\n").await?;
    t.resize(150, 50).await?;
    t.expect("WINCH os.terminal_size(columns=150, lines=50)")
        .await?;
    // Ctrl-C as a terminal sends it: the program dies and the shell answers again.
    t.type_in("\x03").await?;
    t.expect("KeyboardInterrupt").await?;
    t.type_in("echo after-$((1+1))\r").await?;
    t.expect("after-2").await?;
    // A signal request goes to the foreground process group (sleep, not the shell); as with Ctrl-C, an
    // interactive shell drops the rest of the line.
    // (SIGINT once the line runs: one that came while bash still read the line would only clear it.)
    t.type_in("echo SLEEPING; sleep 300; echo never\r").await?;
    t.expect("SLEEPING\r\n").await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    t.signal("INT").await?;
    t.type_in("echo slept-$?\r").await?;
    t.expect("slept-130").await?;
    // A program asks the terminal its size.
    t.type_in("COLUMNS= LINES= python3 -c 'import os; print(\"size\", os.get_terminal_size())'\r")
        .await?;
    t.expect("columns=150, lines=50").await?;
    // The program's end ends the stream, with its exit code.
    t.type_in("exit 7\r").await?;
    let exited = t.until_exit().await?;
    assert_eq!((exited.exit_code, exited.signal), (7, 0));
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_comes_back_replays_the_scrollback_and_follows() -> Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let mut client = terminals(&h);
    let mut first = Term::open(&mut client, start(&sb.sandbox_id, &["/bin/bash"], 0, 0)).await?;
    first.type_in("echo one-$((10+1))\r").await?;
    first.expect("one-11").await?;
    let id = first.id.clone();
    let seen = first.last_seq;
    // The client goes away; the terminal does not.
    drop(first);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let listed = list(&h, &sb.sandbox_id).await?;
    let info = listed
        .iter()
        .find(|t| t.terminal_id == id)
        .context("listed")?;
    assert_eq!(
        (info.attached, info.exit_code, info.cols, info.rows),
        (0, None, 80, 24)
    );
    assert_eq!(info.command, ["/bin/bash"]);
    assert!(info.pid > 1);
    // From the start of the scrollback: what was printed while nobody watched too.
    let mut again = Term::open(&mut client, attach(&sb.sandbox_id, &id, 0)).await?;
    again.expect("one-11").await?;
    again.type_in("echo two-$((20+2))\r").await?;
    again.expect("two-22").await?;
    // From a seq: only what came after it.
    let mut later = Term::open(&mut client, attach(&sb.sandbox_id, &id, seen)).await?;
    later.expect("two-22").await?;
    assert!(!later.screen.contains("one-11"), "{:?}", later.screen);
    assert_eq!(list(&h, &sb.sandbox_id).await?[0].attached, 2);
    // Beyond the newest seq, an unknown terminal, a malformed id.
    let beyond = Term::try_open(&mut client, attach(&sb.sandbox_id, &id, 1 << 40)).await?;
    assert_eq!(refusal(beyond.map(drop)).1, "SEQ_OUT_OF_RANGE");
    let unknown =
        Term::try_open(&mut client, attach(&sb.sandbox_id, "term-000000000000", 0)).await?;
    assert_eq!(
        refusal(unknown.map(drop)),
        (tonic::Code::NotFound, "TERMINAL_NOT_FOUND".to_owned(), None)
    );
    let bad = Term::try_open(&mut client, attach(&sb.sandbox_id, "../x", 0)).await?;
    assert_eq!(refusal(bad.map(drop)).0, tonic::Code::InvalidArgument);
    // Closing hangs it up: every attached stream gets exited (bash ends on SIGHUP), and it is listed as
    // exited until it is closed again.
    client
        .close_terminal(api::CloseTerminalRequest {
            sandbox_id: sb.sandbox_id.clone(),
            terminal_id: id.clone(),
        })
        .await?;
    let exited = again.until_exit().await?;
    assert_eq!((exited.exit_code, exited.signal), (129, 1));
    assert_eq!(later.until_exit().await?.exit_code, 129);
    let listed = list(&h, &sb.sandbox_id).await?;
    assert_eq!(listed[0].exit_code, Some(129));
    client
        .close_terminal(api::CloseTerminalRequest {
            sandbox_id: sb.sandbox_id.clone(),
            terminal_id: id.clone(),
        })
        .await?;
    assert!(list(&h, &sb.sandbox_id).await?.is_empty());
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminals_are_bounded_expire_when_idle_and_count_as_activity() -> Result<()> {
    let mut h = Harness::start_with(|c| c.terminals.max_per_sandbox = 2).await?;
    let sb = h.create_default().await?;
    let mut client = terminals(&h);
    // An idle timeout of a second: gone soon after its client leaves.
    let mut short = start(&sb.sandbox_id, &["sleep", "600"], 0, 0);
    if let Some(open_request::Kind::Start(s)) = short.kind.as_mut() {
        s.idle_timeout_seconds = 1;
    }
    let brief = Term::open(&mut client, short).await?;
    let brief_id = brief.id.clone();
    let mut kept = Term::open(&mut client, start(&sb.sandbox_id, &["cat"], 0, 0)).await?;
    // Two run: a third is refused.
    let third = Term::try_open(&mut client, start(&sb.sandbox_id, &["cat"], 0, 0)).await?;
    assert_eq!(
        refusal(third.map(drop)),
        (
            tonic::Code::ResourceExhausted,
            "TOO_MANY_TERMINALS".to_owned(),
            None
        )
    );
    drop(brief);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let listed = list(&h, &sb.sandbox_id).await?;
        let t = listed
            .iter()
            .find(|t| t.terminal_id == brief_id)
            .context("listed")?;
        if t.exit_code.is_some() {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the idle terminal is still running"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The attached one stays (its client is there), and a new one may start in the freed place.
    Term::open(&mut client, start(&sb.sandbox_id, &["cat"], 0, 0)).await?;
    // Terminal traffic is activity: the sandbox's last activity moves.
    let before = h
        .get(&sb.sandbox_id)
        .await?
        .last_activity_time
        .context("activity")?;
    tokio::time::sleep(Duration::from_millis(1100)).await;
    kept.type_in("ping\r").await?;
    kept.expect("ping").await?;
    let after = h
        .get(&sb.sandbox_id)
        .await?
        .last_activity_time
        .context("activity")?;
    assert!(after.seconds > before.seconds, "{before:?} -> {after:?}");
    // A program that does not exist: the start fails with its reason (after `kept`'s neighbour is closed).
    let listed = list(&h, &sb.sandbox_id).await?;
    for t in listed
        .iter()
        .filter(|t| t.terminal_id != kept.id && t.exit_code.is_none())
    {
        client
            .close_terminal(api::CloseTerminalRequest {
                sandbox_id: sb.sandbox_id.clone(),
                terminal_id: t.terminal_id.clone(),
            })
            .await?;
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let missing = Term::try_open(
        &mut client,
        start(&sb.sandbox_id, &["/no/such/program"], 0, 0),
    )
    .await?;
    assert_eq!(
        refusal(missing.map(drop)).0,
        tonic::Code::FailedPrecondition
    );
    // Start mistakes are INVALID_ARGUMENT naming the field, before anything runs.
    for (req, field) in [
        (start(&sb.sandbox_id, &[""], 0, 0), "start.command"),
        (start(&sb.sandbox_id, &[], 5000, 0), "start.cols"),
    ] {
        let r = Term::try_open(&mut client, req).await?;
        assert_eq!(
            refusal(r.map(drop)),
            (
                tonic::Code::InvalidArgument,
                "INVALID_TERMINAL".to_owned(),
                Some(field.to_owned())
            )
        );
    }
    h.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_that_ends_at_once_still_ends_its_stream_with_exited_while_input_flows()
-> Result<()> {
    let mut h = Harness::start().await?;
    let sb = h.create_default().await?;
    let mut client = terminals(&h);
    // The executor stops taking requests once the end is on its way; input the client sends meanwhile must
    // not end the stream before `exited` (it did: the relay returned on the refused request).
    for round in 0..20 {
        let mut t = Term::open(
            &mut client,
            start(&sb.sandbox_id, &["sh", "-c", "exit 9"], 0, 0),
        )
        .await?;
        let tx = t.tx.take().context("request side")?;
        let typist = tokio::spawn(async move {
            for _ in 0..200 {
                let input = api::OpenRequest {
                    kind: Some(open_request::Kind::Input(open_request::Input {
                        data: bytes::Bytes::from_static(b"\x04"),
                    })),
                };
                if tx.send(input).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        let exited = t
            .until_exit()
            .await
            .with_context(|| format!("round {round}"))?;
        assert_eq!(exited.exit_code, 9, "round {round}");
        typist.abort();
    }
    h.stop().await
}
