//! Terminal streams through the runtime's relay to a real executor (a real pty, real programs): every stream
//! of a program that ends ends with `exited`, whatever the client does with its own side meanwhile: typing,
//! resizing, closing it, or nothing. A stream that ended without `exited` was seen twice in about 35 runs of
//! the CLI's end-to-end tests; these rounds look for it where it is cheap to look many times.

use std::time::Duration;

use mentis_proto::api::terminal_service_client::TerminalServiceClient;
use mentis_proto::api::{self, open_request, open_response};
use tokio::sync::mpsc;

use crate::support::*;

#[derive(Debug, Clone, Copy)]
enum ClientSide {
    /// Input (Ctrl-D) every millisecond until the stream ends.
    Typing,
    /// A resize every millisecond.
    Resizing,
    /// The request side closed right after `start`.
    Closed,
    /// Open and silent.
    Idle,
}

fn start(sandbox: &str, script: &str) -> api::OpenRequest {
    api::OpenRequest {
        kind: Some(open_request::Kind::Start(open_request::Start {
            sandbox_id: sandbox.to_owned(),
            command: vec!["sh".to_owned(), "-c".to_owned(), script.to_owned()],
            ..Default::default()
        })),
    }
}

/// One stream: start `script`, do `side`, read to the end. Returns the exit, or how the stream ended
/// without one.
async fn round(
    client: &mut TerminalServiceClient<tonic::transport::Channel>,
    sandbox: &str,
    script: &str,
    side: ClientSide,
) -> Result<open_response::Exited, String> {
    let (tx, rx) = mpsc::channel(16);
    tx.send(start(sandbox, script)).await.unwrap();
    let mut stream = client
        .open(futures::stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|r| (r, rx))
        }))
        .await
        .map_err(|s| format!("Open refused: {s:?}"))?
        .into_inner();
    let feeder = match side {
        ClientSide::Closed => {
            drop(tx);
            None
        }
        ClientSide::Idle => Some(tokio::spawn(async move {
            tx.closed().await;
        })),
        ClientSide::Typing | ClientSide::Resizing => Some(tokio::spawn(async move {
            for i in 0..5000u32 {
                let kind = if matches!(side, ClientSide::Typing) {
                    open_request::Kind::Input(open_request::Input {
                        data: bytes::Bytes::from_static(b"\x04"),
                    })
                } else {
                    open_request::Kind::Resize(open_request::Resize {
                        cols: 80 + i % 40,
                        rows: 24,
                    })
                };
                if tx
                    .send(api::OpenRequest { kind: Some(kind) })
                    .await
                    .is_err()
                {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        })),
    };
    let mut seen = Vec::new();
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(30), stream.message()).await {
            Err(_) => break Err(format!("no end within 30 s after {seen:?}")),
            Ok(Ok(Some(m))) => match m.kind {
                Some(open_response::Kind::Exited(e)) => {
                    // Nothing follows `exited`.
                    break match stream.message().await {
                        Ok(None) => Ok(e),
                        other => Err(format!("after exited: {other:?}")),
                    };
                }
                Some(open_response::Kind::Started(_)) => seen.push("started"),
                Some(open_response::Kind::Output(_)) => seen.push("output"),
                other => seen.push(if other.is_some() { "other" } else { "empty" }),
            },
            Ok(Ok(None)) => break Err(format!("ended OK without exited after {seen:?}")),
            Ok(Err(status)) => break Err(format!("ended with {status:?} after {seen:?}")),
        }
    };
    if let Some(feeder) = feeder {
        feeder.abort();
    }
    end
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_stream_of_a_program_that_ends_ends_with_exited_whatever_the_client_does() {
    let mut rt = TestRuntime::start().await;
    let sandbox = rt.create_default().await.sandbox_id;
    let mut client = TerminalServiceClient::new(rt.channel.clone());
    let scripts = ["exit 9", "echo bye; exit 9", "sleep 0.02; exit 9"];
    let sides = [
        ClientSide::Typing,
        ClientSide::Resizing,
        ClientSide::Closed,
        ClientSide::Idle,
    ];
    let mut failures = Vec::new();
    for n in 0..240 {
        let script = scripts[n % scripts.len()];
        let side = sides[(n / scripts.len()) % sides.len()];
        match round(&mut client, &sandbox, script, side).await {
            Ok(exited) if exited.exit_code == 9 => {}
            Ok(exited) => failures.push(format!("{n} {script:?} {side:?}: {exited:?}")),
            Err(e) => failures.push(format!("{n} {script:?} {side:?}: {e}")),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of 240: {failures:#?}",
        failures.len()
    );
}
