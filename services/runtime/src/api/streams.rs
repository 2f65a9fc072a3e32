//! Observation streams shared by Execute, StreamObservations and Connect: log items filtered to one action
//! (ending after its terminal observation), and ended when the runtime shuts down.

use futures::{Stream, StreamExt};
use mentis_core::ActionId;

use crate::observations::LogItem;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observations::ObservationLog;
    use mentis_core::{ObservationKind, SandboxId, observation::ActionKind};
    use std::time::Duration;

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
}
