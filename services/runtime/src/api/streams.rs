//! Observation streams shared by Execute, StreamObservations and Connect: log items filtered to one action
//! (ending after its terminal observation), and ended when the runtime shuts down.

use futures::{Stream, StreamExt};
use mentis_core::ActionId;

use crate::observations::LogItem;

/// Keeps only `action`'s observations (and gaps) and ends right after its terminal observation.
pub fn only_action(
    items: impl Stream<Item = LogItem> + Send + 'static,
    action: ActionId,
) -> impl Stream<Item = LogItem> + Send + 'static {
    items
        .filter(move |item| {
            let keep = match item {
                LogItem::Observation(o) => o.action_id.as_ref() == Some(&action),
                LogItem::Gap { .. } => true,
            };
            futures::future::ready(keep)
        })
        .scan(false, |done, item| {
            if *done {
                return futures::future::ready(None);
            }
            if let LogItem::Observation(o) = &item {
                *done = o.kind.is_terminal();
            }
            futures::future::ready(Some(item))
        })
}
