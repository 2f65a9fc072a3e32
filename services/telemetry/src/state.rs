//! The process-wide telemetry state [`crate::install`] sets: whether traces are exported, and the subscriber.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::Dispatch;
use tracing::dispatcher::WeakDispatch;

/// Whether this process exports traces (a tracer provider was installed).
static TRACES_ON: AtomicBool = AtomicBool::new(false);
/// The process's subscriber, for the JSON lines' trace ids.
static DISPATCH: OnceLock<WeakDispatch> = OnceLock::new();

/// Whether this process exports traces.
pub fn traces_on() -> bool {
    TRACES_ON.load(Ordering::Relaxed)
}

pub(crate) fn set_traces_on() {
    TRACES_ON.store(true, Ordering::Relaxed);
}

pub(crate) fn set_dispatch(dispatch: &Dispatch) {
    let _ = DISPATCH.set(dispatch.downgrade());
}

/// The subscriber [`crate::install`] set, while it lives.
pub(crate) fn dispatch() -> Option<Dispatch> {
    DISPATCH.get().and_then(WeakDispatch::upgrade)
}
