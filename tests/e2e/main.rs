//! End-to-end tests: the real runtime, a real Docker engine, the real executor image, real gRPC.
//! They fail (never skip) when Docker or the image is missing; `make test` provides both.
#![allow(clippy::unwrap_used)]

mod auth;
mod bad_input;
mod builds;
mod cli;
mod disk;
mod egress;
mod faults;
mod files;
mod flood;
mod gvisor;
mod hardening;
mod health;
mod image_owners;
mod images;
mod ipython;
mod isolation;
mod kubernetes;
mod lifecycle;
mod memory;
mod metrics;
mod persistence;
mod pki;
mod pool;
mod preview;
mod processes;
mod proxy;
mod reattach;
mod recovery;
mod reflection;
mod secrets;
mod sessions;
mod shell;
mod snapshots;
mod spaces;
mod streams;
mod templates;
mod terminal;
mod tls;
mod traces;
mod watch;
mod web;
