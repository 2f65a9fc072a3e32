//! Following a sandbox's observations, the one way Execute, StreamObservations and Connect all do it: the
//! log's replay-then-follow stream (with its gap markers), optionally narrowed to one action, with keepalives
//! while idle, sent through a guarded channel that cuts off a client that stops reading (see `outbound`).

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use mentis_core::{ActionId, Error, Reason};
use mentis_proto::api;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use super::outbound::{self, Guarded, Outbound, StreamPolicy};
use super::status::expected_status;
use crate::convert::observation_to_proto;
use crate::observations::{LogItem, ObservationLog};

/// OUT_OF_RANGE (SEQ_OUT_OF_RANGE) when `after_seq` is beyond the newest seq of `log`: no observation has
/// that seq yet, so the client asks for something it cannot have seen (a stream would wait for seqs it
/// means to skip, and 2^64-1 would wrap round to a full replay). Every RPC taking an after_seq asks here.
pub fn check_after_seq(log: &ObservationLog, after_seq: u64) -> Result<(), Error> {
    let last = log.last_seq();
    if after_seq > last {
        return Err(Error::new(
            Reason::SeqOutOfRange,
            format!("after_seq {after_seq} is beyond the sandbox's newest seq {last}"),
        )
        .at("after_seq"));
    }
    Ok(())
}

/// What a follow stream sends: a log item, or a keepalive carrying the newest seq.
#[derive(Debug)]
pub enum Outgoing {
    Item(LogItem),
    Keepalive { last_seq: u64 },
}

/// A response message of an observation stream (each RPC has its own, with the same three kinds).
pub trait FollowMessage: Send + 'static {
    fn observation(o: api::Observation) -> Self;
    fn gap(g: api::LogGap) -> Self;
    fn keepalive(k: api::Keepalive) -> Self;
}

/// Implements [`FollowMessage`] for a response whose `kind` oneof has `Observation`, `Gap` and `Keepalive`.
macro_rules! follow_message {
    ($response:ty, $kind:path) => {
        impl FollowMessage for $response {
            fn observation(o: api::Observation) -> Self {
                use $kind as K;
                Self {
                    kind: Some(K::Observation(o)),
                }
            }
            fn gap(g: api::LogGap) -> Self {
                use $kind as K;
                Self {
                    kind: Some(K::Gap(g)),
                }
            }
            fn keepalive(k: api::Keepalive) -> Self {
                use $kind as K;
                Self {
                    kind: Some(K::Keepalive(k)),
                }
            }
        }
    };
}

follow_message!(api::ExecuteResponse, api::execute_response::Kind);
follow_message!(
    api::StreamObservationsResponse,
    api::stream_observations_response::Kind
);
follow_message!(api::ConnectResponse, api::connect_response::Kind);

/// The message of `T` that carries `out`.
pub fn message<T: FollowMessage>(out: Outgoing) -> T {
    match out {
        Outgoing::Item(LogItem::Observation(o)) => T::observation(observation_to_proto(&o)),
        Outgoing::Item(LogItem::Gap {
            after_seq,
            first_available_seq,
        }) => T::gap(api::LogGap {
            after_seq,
            first_available_seq,
        }),
        Outgoing::Keepalive { last_seq } => T::keepalive(api::Keepalive {
            last_seq,
            time: Some(crate::convert::timestamp(crate::clock::now())),
        }),
    }
}

/// `items`, with a keepalive (carrying the log's newest seq) after every `every` without one.
pub fn with_keepalives(
    items: impl Stream<Item = LogItem> + Send + 'static,
    log: Arc<ObservationLog>,
    every: Duration,
) -> impl Stream<Item = Outgoing> + Send + 'static {
    let items = Box::pin(items);
    futures::stream::unfold(Some(items), move |state| {
        let log = Arc::clone(&log);
        async move {
            let mut items = state?;
            tokio::select! {
                item = items.next() => item.map(|i| (Outgoing::Item(i), Some(items))),
                () = tokio::time::sleep(every) => {
                    Some((Outgoing::Keepalive { last_seq: log.last_seq() }, Some(items)))
                }
            }
        }
    })
}

/// Keeps only `action`'s observations (and gaps) and ends right after its terminal observation, without
/// waiting for the log to produce anything further.
pub fn only_action(
    items: impl Stream<Item = LogItem> + Send + 'static,
    action: ActionId,
) -> impl Stream<Item = LogItem> + Send + 'static {
    let items = Box::pin(items.filter(move |item| {
        let keep = match item {
            LogItem::Observation(o) => o.action_id.as_ref() == Some(&action),
            LogItem::Gap { .. } => true,
        };
        futures::future::ready(keep)
    }));
    futures::stream::unfold(Some(items), |state| async move {
        let mut items = state?;
        let item = items.next().await?;
        let terminal = matches!(&item, LogItem::Observation(o) if o.kind.is_terminal());
        Some((item, (!terminal).then_some(items)))
    })
}

/// Streams `items` (with keepalives) to the client as `T`s through a guarded channel, in a task owned by
/// `tasks`; ends with the items, when the client leaves or is cut off, or at shutdown.
pub fn spawn<T, S>(
    items: S,
    log: Arc<ObservationLog>,
    policy: StreamPolicy,
    tasks: &TaskTracker,
    shutdown: CancellationToken,
) -> Guarded<T>
where
    T: FollowMessage,
    S: Stream<Item = LogItem> + Send + 'static,
{
    let (out, guarded) = outbound::channel(policy);
    tasks.spawn(async move {
        let mut items = std::pin::pin!(with_keepalives(items, log, policy.keepalive));
        loop {
            let next = tokio::select! {
                biased;
                () = shutdown.cancelled() => {
                    let _ = out.send(Err(draining())).await;
                    break;
                }
                () = out.closed() => break,
                next = items.next() => match next {
                    Some(next) => next,
                    None => break,
                },
            };
            if !send(&out, next).await {
                break;
            }
        }
    });
    guarded
}

/// Runs a two-way stream's session as a task of `sessions` (a drain waits for those) and returns the client's
/// end. When the runtime starts to drain first, the session is dropped and the client gets [`draining`], to
/// resume. Connect and TerminalService/Open (over gRPC and the web terminal's WebSocket) go through here.
pub fn spawn_session<T, F>(
    policy: StreamPolicy,
    sessions: &TaskTracker,
    shutdown: CancellationToken,
    session: impl FnOnce(Arc<Outbound<T>>) -> F,
) -> Guarded<T>
where
    T: Send + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = outbound::channel(policy);
    let tx = Arc::new(tx);
    let run = session(Arc::clone(&tx));
    sessions.spawn(async move {
        tokio::select! {
            () = run => {}
            () = shutdown.cancelled() => {
                let _ = tx.send(Err(draining())).await;
            }
        }
    });
    rx
}

/// The status that ends an open stream when the runtime drains: nothing is lost, the client resumes.
pub fn draining() -> tonic::Status {
    expected_status(&Error::new(
        Reason::ShuttingDown,
        "the runtime is restarting: reconnect and resume after the last seq you received \
         (StreamObservations or Connect with after_seq; Execute: retry with the same action_id)",
    ))
}

/// Sends one follow item as a `T`; false when the client is gone or was cut off.
pub async fn send<T: FollowMessage>(out: &Outbound<T>, next: Outgoing) -> bool {
    out.send(Ok(message(next))).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use mentis_core::{ObservationKind, SandboxId, observation::ActionKind};

    #[tokio::test]
    async fn ends_after_the_terminal_without_waiting_for_more() {
        let log = ObservationLog::new(SandboxId::new(), Default::default());
        let a = ActionId::generate();
        let b = ActionId::generate();
        log.append(
            Some(b.clone()),
            ObservationKind::CmdStart {
                command: "b".into(),
                pid: 1,
            },
        );
        log.append(
            Some(a.clone()),
            ObservationKind::CmdStart {
                command: "a".into(),
                pid: 2,
            },
        );
        log.append(
            Some(a.clone()),
            ObservationKind::lost(ActionKind::Shell, "x", Duration::ZERO),
        );
        // The log stays open: the stream must end on its own after a's terminal.
        let got: Vec<_> = tokio::time::timeout(
            Duration::from_secs(5),
            only_action(log.follow(0), a.clone()).collect::<Vec<_>>(),
        )
        .await
        .expect("stream ends after the terminal observation");
        assert_eq!(got.len(), 2);
        assert!(
            got.iter()
                .all(|i| matches!(i, LogItem::Observation(o) if o.action_id.as_ref() == Some(&a)))
        );
    }

    #[tokio::test]
    async fn idle_streams_carry_keepalives() {
        let log = ObservationLog::new(SandboxId::new(), Default::default());
        let policy = StreamPolicy {
            keepalive: Duration::from_millis(20),
            stall: Duration::from_secs(5),
            buffer: 4,
        };
        let tasks = TaskTracker::new();
        let mut s: Guarded<api::StreamObservationsResponse> = spawn(
            log.follow(0),
            Arc::clone(&log),
            policy,
            &tasks,
            CancellationToken::new(),
        );
        let first = tokio::time::timeout(Duration::from_secs(5), s.next())
            .await
            .expect("in time");
        assert!(
            matches!(
                first,
                Some(Ok(api::StreamObservationsResponse {
                    kind: Some(api::stream_observations_response::Kind::Keepalive(
                        api::Keepalive { last_seq: 0, .. }
                    ))
                }))
            ),
            "{first:?}"
        );
    }
}
