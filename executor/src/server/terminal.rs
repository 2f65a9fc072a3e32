//! ExecutorService's terminal calls: the control plane's stream for one client and terminal, the list and
//! close. Proto stops here; [`crate::terminal`] sees the model's types.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::Stream;
use mentis_model::terminal::{Size, TerminalSpec, signal_name, validate_terminal_id};
use mentis_proto::executor::{
    ListTerminalsResponse, TerminalRequest, TerminalResponse, TerminalSettings,
};
use mentis_proto::executor::{OpenResponse, TerminalInfo, open_request, open_response};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::{Status, Streaming};
use tracing::Instrument as _;

use crate::error::Error;
use crate::terminal::{Attached, Event, Settings, Terminal, Terminals};

pub(super) type TerminalStream =
    Pin<Box<dyn Stream<Item = Result<TerminalResponse, Status>> + Send + 'static>>;

/// Responses waiting for the control plane; a full channel holds the cursor back (the scrollback keeps
/// what it has not read).
const OUTBOUND: usize = 16;

/// Opens a terminal stream: the first request starts or attaches, the later ones are input, resize and
/// signals.
pub(super) async fn open(
    terminals: &Arc<Terminals>,
    mut requests: Streaming<TerminalRequest>,
    streams: &TaskTracker,
) -> Result<TerminalStream, Status> {
    let first = requests
        .message()
        .await?
        .ok_or_else(|| invalid("the stream ended before its first request"))?;
    let TerminalRequest { request, settings } = first;
    let kind = request
        .and_then(|r| r.kind)
        .ok_or_else(|| invalid("the first request must be start or attach"))?;
    let attached = match kind {
        open_request::Kind::Start(start) => {
            let settings = settings_of(settings)?;
            let spec = TerminalSpec::validate(
                start.command,
                start.cols,
                start.rows,
                start.env.into_iter().collect::<BTreeMap<_, _>>(),
                start.work_dir,
                start.idle_timeout_seconds,
            )
            .map_err(Error::from)?;
            terminals.start(spec, settings).await?.attach(0)?
        }
        open_request::Kind::Attach(attach) => {
            validate_terminal_id(&attach.terminal_id, "attach.terminal_id").map_err(Error::from)?;
            terminals
                .get(&attach.terminal_id)?
                .attach(attach.after_seq)?
        }
        _ => return Err(invalid("the first request must be start or attach")),
    };
    let terminal = Arc::clone(&attached.terminal);
    let (tx, rx) = mpsc::channel(OUTBOUND);
    // Cancelled when the output side is done (the program's end was sent, or the stream went): the
    // requests then stop too, so the stream ends.
    let done = CancellationToken::new();
    let size = terminal.size();
    let started = OpenResponse {
        kind: Some(open_response::Kind::Started(open_response::Started {
            terminal_id: terminal.id.clone(),
            last_seq: terminal.last_seq(),
            cols: u32::from(size.cols),
            rows: u32::from(size.rows),
        })),
    };
    // Cannot fail: the channel is new.
    let _ = tx.try_send(Ok(wrap(started)));
    let span = tracing::debug_span!("terminal stream", terminal_id = %terminal.id);
    streams.spawn(forward_output(attached, tx.clone(), done.clone()).instrument(span.clone()));
    streams.spawn(apply_requests(terminal, requests, tx, done).instrument(span));
    Ok(Box::pin(ReceiverStream::new(rx)))
}

/// The terminal's output from the stream's cursor, then `exited`; stops when the stream is gone.
async fn forward_output(
    mut attached: Attached,
    tx: mpsc::Sender<Result<TerminalResponse, Status>>,
    done: CancellationToken,
) {
    let _done = done.drop_guard();
    loop {
        let event = tokio::select! {
            event = attached.cursor.next() => event,
            () = tx.closed() => return,
        };
        let Some(event) = event else { return };
        let kind = match event {
            Event::Output { seq, data } => {
                open_response::Kind::Output(open_response::Output { seq, data })
            }
            Event::Exited(exit) => open_response::Kind::Exited(open_response::Exited {
                exit_code: exit.code,
                signal: exit.signal,
            }),
        };
        let last = matches!(kind, open_response::Kind::Exited(_));
        if tx
            .send(Ok(wrap(OpenResponse { kind: Some(kind) })))
            .await
            .is_err()
            || last
        {
            return;
        }
    }
}

/// Input, resize and signals from the stream; a request that breaks a rule ends the stream with its status.
async fn apply_requests(
    terminal: Arc<Terminal>,
    mut requests: Streaming<TerminalRequest>,
    tx: mpsc::Sender<Result<TerminalResponse, Status>>,
    done: CancellationToken,
) {
    loop {
        let request = tokio::select! {
            request = requests.message() => request,
            () = done.cancelled() => return,
        };
        let kind = match request {
            Ok(Some(r)) => r.request.and_then(|r| r.kind),
            // The client closed its side (or went): the terminal runs on, output still flows.
            Ok(None) | Err(_) => return,
        };
        tracing::debug!(terminal_id = %terminal.id, ?kind, "terminal request");
        let result = match kind {
            Some(open_request::Kind::Input(input)) => terminal.input(&input.data).await,
            Some(open_request::Kind::Resize(resize)) => {
                Size::validate(resize.cols, resize.rows, "resize")
                    .map_err(Error::from)
                    .and_then(|size| terminal.resize(size))
            }
            Some(open_request::Kind::Signal(signal)) => signal_name(&signal.name)
                .map_err(Error::from)
                .and_then(|name| terminal.signal(name)),
            Some(open_request::Kind::Start(_) | open_request::Kind::Attach(_)) => Err(
                Error::InvalidArgument("start and attach may only be the first request".to_owned()),
            ),
            None => Err(Error::InvalidArgument(
                "a request must be input, resize or signal".to_owned(),
            )),
        };
        if let Err(e) = result {
            let _ = tx.send(Err(Status::from(e))).await;
            return;
        }
    }
}

fn settings_of(settings: Option<TerminalSettings>) -> Result<Settings, Status> {
    let s = settings.ok_or_else(|| invalid("a start carries the terminal settings"))?;
    mentis_model::env::validate_env(&s.env, "settings.env").map_err(Error::from)?;
    Ok(Settings {
        sandbox_env: s.env.into_iter().collect(),
        max_terminals: usize::try_from(s.max_terminals).unwrap_or(usize::MAX),
        default_idle_timeout: Duration::from_secs(u64::from(s.default_idle_timeout_seconds.max(1))),
        scrollback_bytes: usize::try_from(s.scrollback_bytes).unwrap_or(usize::MAX),
    })
}

/// A terminal as ListTerminals shows it.
pub(super) fn info(terminal: &Terminal) -> TerminalInfo {
    let size = terminal.size();
    TerminalInfo {
        terminal_id: terminal.id.clone(),
        command: terminal.command.clone(),
        cols: u32::from(size.cols),
        rows: u32::from(size.rows),
        pid: terminal.pid,
        created_at: Some(timestamp(terminal.created)),
        last_seq: terminal.last_seq(),
        attached: terminal.attached(),
        exit_code: terminal.exited().map(|e| e.code),
    }
}

fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    let since = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp {
        seconds: i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        nanos: i32::try_from(since.subsec_nanos()).unwrap_or(0),
    }
}

pub(super) fn list(terminals: &Terminals) -> ListTerminalsResponse {
    ListTerminalsResponse {
        terminals: terminals.list().iter().map(|t| info(t)).collect(),
    }
}

pub(super) fn close(terminals: &Terminals, id: &str) -> Result<(), Status> {
    validate_terminal_id(id, "terminal_id").map_err(Error::from)?;
    terminals.close(id)?;
    Ok(())
}

fn wrap(response: OpenResponse) -> TerminalResponse {
    TerminalResponse {
        response: Some(response),
    }
}

fn invalid(message: &str) -> Status {
    Status::from(Error::InvalidArgument(message.to_owned()))
}
