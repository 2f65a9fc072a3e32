//! One soak client: its own sandbox, a stream of shell commands, cells and file round trips, each with a
//! client-chosen id, retried through every fault until it ends, and checked against what it must print.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use mentis_e2e::*;
use mentis_proto::api::file_service_client::FileServiceClient;
use mentis_proto::api::{self, observation::Kind};
use tokio::time::Instant;

use super::report::{Client, Tally};

/// How long one action may take, faults and restarts included, before it counts as never ended.
const ACTION_PATIENCE: Duration = Duration::from_secs(180);
/// A stream silent this long (keepalives come every few seconds) counts as dead.
const STREAM_SILENCE: Duration = Duration::from_secs(60);

/// What the clients share: where the runtime is, and the stream-drop fault.
pub struct Shared {
    pub channel: ApiChannel,
    /// Set by the fault task: the next client reading a stream drops it and resumes.
    pub drop_stream: AtomicBool,
}

/// A small xorshift generator: the soak replays with the same seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn is_end(o: &api::Observation) -> bool {
    matches!(o.kind, Some(Kind::CmdEnd(_)) | Some(Kind::IpythonResult(_)))
}

fn printed(obs: &[api::Observation]) -> String {
    obs.iter()
        .filter_map(|o| match &o.kind {
            Some(Kind::CmdOutput(c)) => Some(String::from_utf8_lossy(&c.data).into_owned()),
            Some(Kind::IpythonOutput(c)) => Some(c.text.clone()),
            _ => None,
        })
        .collect()
}

/// The end's reason, as the summary counts it.
fn reason(end: &api::Observation) -> String {
    match &end.kind {
        Some(Kind::CmdEnd(e)) => format!(
            "shell {:?}",
            api::EndReason::try_from(e.reason).unwrap_or_default()
        ),
        Some(Kind::IpythonResult(r)) => {
            format!(
                "cell {:?}",
                api::IpythonStatus::try_from(r.status).unwrap_or_default()
            )
        }
        _ => "none".to_owned(),
    }
}

fn ended_well(end: &api::Observation) -> bool {
    match &end.kind {
        Some(Kind::CmdEnd(e)) => e.reason == api::EndReason::Exited as i32 && e.exit_code == 0,
        Some(Kind::IpythonResult(r)) => r.status == api::IpythonStatus::Ok as i32,
        _ => false,
    }
}

/// Runs one client until `until`, then returns its tally.
pub async fn run(shared: Arc<Shared>, index: usize, seed: u64, until: Instant) -> Client {
    let mut rng = Rng(seed | 1);
    let mut c = Client::default();
    let mut sandboxes =
        api::sandbox_service_client::SandboxServiceClient::new(shared.channel.clone());
    let sandbox = loop {
        match sandboxes
            .create_sandbox(api::CreateSandboxRequest::default())
            .await
        {
            Ok(r) => {
                break r
                    .into_inner()
                    .sandbox
                    .map(|s| s.sandbox_id)
                    .unwrap_or_default();
            }
            Err(e) if Instant::now() < until => {
                if e.code() == tonic::Code::Internal {
                    c.tally.status("create", e.code(), e.message());
                }
                c.tally.note(format!("create retried: {}", e.code()));
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            Err(e) => {
                c.tally.fail(format!("client {index}: no sandbox: {e}"));
                return c;
            }
        }
    };
    c.sandbox = sandbox.clone();
    // Odd clients submit over Connect and follow their sandbox's whole sequence; even ones use Execute.
    let via = if index % 2 == 1 {
        Via::Connect
    } else {
        Via::Execute
    };
    let mut watched = 0u64;
    let mut n = 0u64;
    while Instant::now() < until {
        n += 1;
        let lines = 3 + rng.below(20);
        let id = format!("c{index}-{n}");
        match rng.below(3) {
            0 => {
                let command =
                    format!("for i in $(seq 1 {lines}); do echo {id}-$i; sleep 0.02; done");
                let action = shell_action(cmd(&command));
                run_action(
                    &shared,
                    &sandbox,
                    &id,
                    action,
                    lines,
                    via,
                    &mut watched,
                    &mut c.tally,
                )
                .await;
            }
            1 => {
                let code = format!(
                    "import time\nfor i in range(1, {}):\n    print(f'{id}-{{i}}', flush=True)\n    time.sleep(0.02)",
                    lines + 1
                );
                run_action(
                    &shared,
                    &sandbox,
                    &id,
                    cell(&code),
                    lines,
                    via,
                    &mut watched,
                    &mut c.tally,
                )
                .await;
            }
            _ => file_round_trip(&shared, &sandbox, &id, &mut rng, &mut c.tally).await,
        }
    }
    c
}

/// How a client submits its actions: unary Execute, or the bidirectional Connect, which also follows the
/// sandbox's whole sequence.
#[derive(Debug, Clone, Copy)]
enum Via {
    Execute,
    Connect,
}

/// Submits `action` as `id` and follows it to its end through every fault (a retry with the same id
/// replays it), then checks it. `watched` is the newest seq this client saw over Connect.
#[allow(clippy::too_many_arguments)]
async fn run_action(
    shared: &Shared,
    sandbox: &str,
    id: &str,
    action: api::Action,
    lines: u64,
    via: Via,
    watched: &mut u64,
    tally: &mut Tally,
) {
    let expected: String = (1..=lines).map(|i| format!("{id}-{i}\n")).collect();
    let started = Instant::now();
    let deadline = started + ACTION_PATIENCE;
    // Every observation any attempt saw, by seq: a seq must always carry the same observation.
    let mut by_seq: BTreeMap<u64, api::Observation> = BTreeMap::new();
    let mut attempt = 0;
    let outcome = loop {
        attempt += 1;
        if started.elapsed() > ACTION_PATIENCE {
            break None;
        }
        let Some((seen, ended)) = (match via {
            Via::Execute => attempt_execute(shared, sandbox, id, &action, deadline, tally).await,
            Via::Connect => {
                attempt_connect(shared, sandbox, id, &action, watched, deadline, tally).await
            }
        }) else {
            tokio::time::sleep(Duration::from_millis(300)).await;
            continue;
        };
        let seqs: Vec<u64> = seen.iter().map(|o| o.seq).collect();
        if seqs.windows(2).any(|w| w[1] <= w[0]) {
            tally.fail(format!("{id}: seqs not strictly increasing: {seqs:?}"));
        }
        for o in &seen {
            if let Some(old) = by_seq.insert(o.seq, o.clone())
                && old != *o
            {
                tally.fail(format!("{id}: seq {} carried two observations", o.seq));
            }
        }
        if ended {
            break Some(seen);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let Some(last) = outcome else {
        tally.fail(format!(
            "{id}: never ended within {ACTION_PATIENCE:?} ({attempt} attempts)"
        ));
        return;
    };
    let obs: Vec<api::Observation> = match via {
        // The retry that ended replayed the whole action.
        Via::Execute => last,
        // Each attempt went on from where the one before stopped: all of them, in seq order.
        Via::Connect => by_seq.into_values().collect(),
    };
    let ends: Vec<_> = obs.iter().filter(|o| is_end(o)).collect();
    if ends.len() != 1 {
        tally.fail(format!("{id}: {} terminal observations", ends.len()));
        return;
    }
    let end = ends[0];
    let out = printed(&obs);
    if ended_well(end) {
        if out != expected {
            tally.fail(format!("{id}: printed {out:?}, expected {expected:?}"));
        }
    } else if !expected.starts_with(&out) {
        tally.fail(format!(
            "{id}: ended {} having printed {out:?}, not a prefix",
            reason(end)
        ));
    }
    tally.bytes += out.len() as u64;
    tally.ended(reason(end));
}

/// One Execute of the action: what it saw, and whether that ended with the action's end (`None`: not
/// submitted).
async fn attempt_execute(
    shared: &Shared,
    sandbox: &str,
    id: &str,
    action: &api::Action,
    deadline: Instant,
    tally: &mut Tally,
) -> Option<(Vec<api::Observation>, bool)> {
    let mut client = api::action_service_client::ActionServiceClient::new(shared.channel.clone());
    let request = api::ExecuteRequest {
        sandbox_id: sandbox.to_owned(),
        action: Some(action.clone()),
        action_id: id.to_owned(),
    };
    let mut stream = match client.execute(request).await {
        Ok(s) => s.into_inner(),
        Err(e) => {
            tally.status("submit", e.code(), e.message());
            return None;
        }
    };
    // Execute answers only once the action is accepted.
    let accepted = true;
    let mut seen: Vec<api::Observation> = Vec::new();
    let ended = loop {
        if shared.drop_stream.swap(false, Ordering::Relaxed) && !seen.is_empty() {
            tally.reconnect("dropped by the soak".to_owned());
            break false;
        }
        // Keepalives keep a stream that never brings the end alive: the action's patience bounds it.
        if Instant::now() > deadline {
            tally.fail(format!(
                "{id}: no end within {ACTION_PATIENCE:?} on a live stream ({} of its observations seen{})",
                seen.len(),
                if accepted { "" } else { ", never accepted" }
            ));
            break false;
        }
        match tokio::time::timeout(STREAM_SILENCE, stream.next()).await {
            Ok(Some(Ok(m))) => match m.kind {
                Some(api::execute_response::Kind::Observation(o)) => {
                    let end = is_end(&o);
                    seen.push(o);
                    if end {
                        break true;
                    }
                }
                Some(api::execute_response::Kind::Gap(g)) => {
                    tally.fail(format!("{id}: a gap in its own replay: {g:?}"));
                }
                _ => {}
            },
            Ok(Some(Err(e))) => {
                tally.status("stream", e.code(), e.message());
                break false;
            }
            Ok(None) => {
                tally.fail(format!(
                    "{id}: the stream ended OK without a terminal observation"
                ));
                break false;
            }
            Err(_) => {
                tally.reconnect("stream silent for 60 s".to_owned());
                break false;
            }
        }
    };
    Some((seen, ended))
}

/// One Connect: attaches after `watched`, submits the action and reads the sandbox's sequence until the
/// action's end. Every seq must follow the one before (or a gap the server names); the action's own
/// observations are returned.
async fn attempt_connect(
    shared: &Shared,
    sandbox: &str,
    id: &str,
    action: &api::Action,
    watched: &mut u64,
    deadline: Instant,
    tally: &mut Tally,
) -> Option<(Vec<api::Observation>, bool)> {
    use api::connect_request::{Attach, Kind as Req, Submit};
    use api::connect_response::Kind as Resp;
    let mut client = api::action_service_client::ActionServiceClient::new(shared.channel.clone());
    let requests = [
        Req::Attach(Attach {
            sandbox_id: sandbox.to_owned(),
            after_seq: Some(*watched),
        }),
        Req::Submit(Submit {
            action: Some(action.clone()),
            action_id: id.to_owned(),
        }),
    ]
    .map(|k| api::ConnectRequest { kind: Some(k) });
    // The request stream stays open while the answers are read and ends with this attempt (`_open` is
    // dropped on return): a request stream that never ends keeps the HTTP/2 stream, and so the server's
    // session, alive after the response is dropped (a soak run once held 967 such sessions).
    let (_open, closed) = tokio::sync::oneshot::channel::<()>();
    let requests = futures::stream::iter(requests).chain(
        futures::stream::once(async move {
            let _ = closed.await;
        })
        .filter_map(|()| async { None }),
    );
    let mut stream = match client.connect(requests).await {
        Ok(s) => s.into_inner(),
        Err(e) => {
            tally.status("connect", e.code(), e.message());
            return None;
        }
    };
    let mut accepted = false;
    let mut seen: Vec<api::Observation> = Vec::new();
    let ended = loop {
        if shared.drop_stream.swap(false, Ordering::Relaxed) && !seen.is_empty() {
            tally.reconnect("dropped by the soak".to_owned());
            break false;
        }
        // Keepalives keep a stream that never brings the end alive: the action's patience bounds it.
        if Instant::now() > deadline {
            tally.fail(format!(
                "{id}: no end within {ACTION_PATIENCE:?} on a live stream ({} of its observations seen{})",
                seen.len(),
                if accepted { "" } else { ", never accepted" }
            ));
            break false;
        }
        match tokio::time::timeout(STREAM_SILENCE, stream.next()).await {
            Ok(Some(Ok(m))) => match m.kind {
                Some(Resp::Observation(o)) => {
                    if o.seq != *watched + 1 {
                        tally.fail(format!(
                            "{id}: over Connect seq {} came after {} (a gap or a repeat)",
                            o.seq, *watched
                        ));
                    }
                    *watched = (*watched).max(o.seq);
                    if o.action_id == id {
                        let end = is_end(&o);
                        seen.push(o);
                        if end {
                            break true;
                        }
                    }
                }
                Some(Resp::Accepted(_)) => accepted = true,
                Some(Resp::Gap(g)) => {
                    // Dropped from the bounded log before this client read it: named, so not lost.
                    tally.note("a named gap on Connect".to_owned());
                    *watched = (*watched).max(g.first_available_seq.saturating_sub(1));
                }
                Some(Resp::Rejected(r)) => {
                    if r.code == "INTERNAL" {
                        tally.status("rejected", tonic::Code::Internal, &r.message);
                    } else {
                        tally.reconnect(format!("rejected: {}", r.code));
                    }
                    break false;
                }
                _ => {}
            },
            Ok(Some(Err(e))) => {
                tally.status("stream", e.code(), e.message());
                break false;
            }
            Ok(None) => {
                tally.fail(format!(
                    "{id}: Connect ended OK before the action's terminal observation"
                ));
                break false;
            }
            Err(_) => {
                tally.reconnect("stream silent for 60 s".to_owned());
                break false;
            }
        }
    };
    Some((seen, ended))
}

/// Writes a file and reads it back: after a cut or refused write the old content stays, after a complete
/// one the new content is there, byte for byte.
async fn file_round_trip(
    shared: &Shared,
    sandbox: &str,
    id: &str,
    rng: &mut Rng,
    tally: &mut Tally,
) {
    let mut client = FileServiceClient::new(shared.channel.clone());
    let len = 1 + rng.below(64 * 1024) as usize;
    let data: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
    let path = format!("soak/{id}.bin");
    let started = Instant::now();
    loop {
        if started.elapsed() > ACTION_PATIENCE {
            tally.fail(format!("{id}: the file round trip never succeeded"));
            return;
        }
        let messages = vec![
            api::WriteFileRequest {
                kind: Some(api::write_file_request::Kind::Header(
                    api::WriteFileHeader {
                        sandbox_id: sandbox.to_owned(),
                        path: path.clone(),
                        mode: 0,
                    },
                )),
            },
            api::WriteFileRequest {
                kind: Some(api::write_file_request::Kind::Data(Bytes::from(
                    data.clone(),
                ))),
            },
        ];
        let written = client.write_file(futures::stream::iter(messages)).await;
        let read = read_file(&mut client, sandbox, &path).await;
        match (written, read) {
            (Ok(_), Ok(back)) => {
                if back != data {
                    tally.fail(format!(
                        "{id}: read back {} bytes that differ from the {len} written",
                        back.len()
                    ));
                }
                tally.bytes += len as u64;
                tally.ended("file written and read".to_owned());
                return;
            }
            (Err(_), Ok(back)) if !back.is_empty() && back != data => {
                tally.fail(format!(
                    "{id}: a failed write left {} bytes behind",
                    back.len()
                ));
                return;
            }
            (w, r) => {
                if let Some(e) = w.err().or(r.err()) {
                    tally.status("file", e.code(), e.message());
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
    }
}

async fn read_file(
    client: &mut FileServiceClient<ApiChannel>,
    sandbox: &str,
    path: &str,
) -> Result<Vec<u8>, tonic::Status> {
    let mut stream = client
        .read_file(api::ReadFileRequest {
            sandbox_id: sandbox.to_owned(),
            path: path.to_owned(),
            offset: 0,
            length: 0,
        })
        .await?
        .into_inner();
    let mut out = Vec::new();
    while let Some(chunk) = stream.message().await? {
        out.extend_from_slice(&chunk.data);
    }
    Ok(out)
}
