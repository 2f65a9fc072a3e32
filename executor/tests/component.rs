//! Component tests: the executor served in-process on 127.0.0.1:0 with a temporary workspace, driven by a
//! real tonic client, running real bash and a real Jupyter kernel. Timeouts are generous and ordering is
//! proved with gates (files the test creates) or event order, not with sleeps, so a loaded machine cannot
//! make them flaky.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod component {
    pub mod attach;
    pub mod auth;
    pub mod binary;
    pub mod files;
    pub mod ipython;
    pub mod lifecycle;
    pub mod shell;
    pub mod stdin;
    pub mod support;
    pub mod terminal;
}
