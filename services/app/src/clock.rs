//! The runtime's wall clock: the system time when first asked plus tokio's monotonic time since. Record
//! times, expiry and retention follow it, so a system clock stepped back or forth neither expires sandboxes
//! early nor keeps them forever, and the component tests drive all of it with tokio's paused clock.

use std::sync::OnceLock;
use std::time::SystemTime;

use tokio::time::Instant;

static ANCHOR: OnceLock<(SystemTime, Instant)> = OnceLock::new();

/// Now, on the runtime's clock.
pub fn now() -> SystemTime {
    let (wall, mono) = ANCHOR.get_or_init(|| (SystemTime::now(), Instant::now()));
    *wall + mono.elapsed()
}

/// Sleeps until `at` on the runtime's clock (returns at once when it has passed).
pub async fn sleep_until(at: SystemTime) {
    let left = at.duration_since(now()).unwrap_or_default();
    tokio::time::sleep(left).await;
}
