//! The runtime's component tier: the real runtime and the real executor, over real gRPC on 127.0.0.1, with a
//! fake backend in place of Docker (see `fake`). No Docker needed; time-driven behaviour runs on tokio's
//! paused clock. See docs/ARCHITECTURE.md, "Code map and test tiers".
#![allow(clippy::unwrap_used)]

mod api;
mod disk;
mod drain;
mod errors;
mod fake;
mod faults;
mod health;
mod support;

mod lifecycle;
mod pool;
mod race;
mod restart;
mod secrets;
mod terminal;
mod time;
mod transport;
