//! IPython cells against a real ipykernel: the executor in-process, the kernel started with the python of
//! the repo's tool venv (deploy/ensure-tools.sh installs ipykernel, numpy, pandas, matplotlib there).
//! MENTIS_TEST_KERNEL_PYTHON points the tests at another python (for example one with Debian's ipykernel 6).

mod cells;
mod control;
mod faults;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

use mentis_proto::executor::{self as api, IpythonOutputKind, IpythonStatus, action};
use mentis_proto::executor::{CancelRequest, RunRequest, RunResponse, run_response};
use tokio::time::Instant;
use tonic::Streaming;

use super::support::*;

/// Which python runs the test kernels.
pub fn kernel_python() -> PathBuf {
    static CHECKED: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let checked = CHECKED.get_or_init(|| {
        let python = std::env::var_os("MENTIS_TEST_KERNEL_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/venv/bin/python")
            });
        let fix = "run deploy/ensure-tools.sh (it installs ipykernel, numpy, pandas and matplotlib into \
                   .tools/venv), or set MENTIS_TEST_KERNEL_PYTHON to a python that has them";
        let output = std::process::Command::new(&python)
            .args(["-c", "import ipykernel, numpy, pandas, matplotlib"])
            .output()
            .map_err(|e| format!("cannot run {}: {e}; {fix}", python.display()))?;
        if !output.status.success() {
            return Err(format!(
                "{} cannot import ipykernel/numpy/pandas/matplotlib: {}; {fix}",
                python.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(python)
    });
    match checked {
        Ok(python) => python.clone(),
        Err(e) => panic!("no kernel python for the IPython tests: {e}"),
    }
}

/// An executor whose kernel runs with the test python.
pub async fn start_ipython() -> TestExecutor {
    start_ipython_with(|_| {}).await
}

pub async fn start_ipython_with(adjust: impl FnOnce(&mut mentis_executor::Config)) -> TestExecutor {
    let python = kernel_python();
    TestExecutor::start_with(|config| {
        config.kernel.python = python;
        adjust(config);
    })
    .await
}

pub fn cell(code: &str) -> api::IPythonAction {
    api::IPythonAction {
        code: code.to_owned(),
        timeout_seconds: 0,
        rollback_on_error: None,
    }
}

/// A Run request for a cell, with the sandbox env the tests use (a headless matplotlib backend).
pub fn cell_request(action_id: &str, cell: api::IPythonAction) -> RunRequest {
    RunRequest {
        action_id: action_id.to_owned(),
        action: Some(api::Action {
            kind: Some(action::Kind::Ipython(cell)),
        }),
        env: HashMap::from([("MPLBACKEND".to_owned(), "Agg".to_owned())]),
    }
}

/// Starts a cell (it may queue) and returns its id and stream.
pub async fn submit(
    client: &mut Client,
    cell: api::IPythonAction,
) -> (String, Streaming<RunResponse>) {
    let id = action_id();
    let stream = start(client, cell_request(&id, cell)).await;
    (id, stream)
}

/// Runs a cell to its end.
pub async fn run_cell(client: &mut Client, code: &str) -> Cell {
    let (_, stream) = submit(client, cell(code)).await;
    collect_cell(stream).await
}

pub async fn collect_cell(stream: Streaming<RunResponse>) -> Cell {
    Cell(collect(stream).await.0)
}

pub async fn cancel(client: &mut Client, action_id: &str) {
    client
        .cancel(CancelRequest {
            action_id: action_id.to_owned(),
        })
        .await
        .expect("cancel accepted");
}

/// Events of one cell.
#[derive(Debug)]
pub struct Cell(pub Vec<RunResponse>);

impl Cell {
    /// The terminal event, after checking the stream's shape: consecutive indexes and exactly one
    /// `ipython_result`, last.
    pub fn result(&self) -> api::IPythonResult {
        let first = self.0.first().map_or(1, |e| e.index);
        for (i, event) in self.0.iter().enumerate() {
            assert_eq!(event.index, first + i as u64, "indexes count up by one");
        }
        let results: Vec<_> = self
            .0
            .iter()
            .filter_map(|e| match &e.kind {
                Some(run_response::Kind::IpythonResult(r)) => Some(r.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(results.len(), 1, "exactly one ipython_result: {self:?}");
        assert!(
            matches!(
                self.0.last().and_then(|e| e.kind.as_ref()),
                Some(run_response::Kind::IpythonResult(_))
            ),
            "ipython_result is last: {self:?}"
        );
        results[0].clone()
    }

    pub fn status(&self) -> IpythonStatus {
        IpythonStatus::try_from(self.result().status).expect("known status")
    }

    pub fn starts(&self) -> Vec<api::IPythonStart> {
        self.0
            .iter()
            .filter_map(|e| match &e.kind {
                Some(run_response::Kind::IpythonStart(s)) => Some(s.clone()),
                _ => None,
            })
            .collect()
    }

    pub fn outputs(&self) -> Vec<api::IPythonOutput> {
        self.0
            .iter()
            .filter_map(|e| match &e.kind {
                Some(run_response::Kind::IpythonOutput(o)) => Some(o.clone()),
                _ => None,
            })
            .collect()
    }

    pub fn text(&self, kind: IpythonOutputKind) -> String {
        self.outputs()
            .iter()
            .filter(|o| o.kind == kind as i32)
            .map(|o| o.text.as_str())
            .collect()
    }

    pub fn stdout(&self) -> String {
        self.text(IpythonOutputKind::StreamStdout)
    }

    pub fn stderr(&self) -> String {
        self.text(IpythonOutputKind::StreamStderr)
    }

    /// The MIME bundles of outputs of `kind`.
    pub fn bundles(&self, kind: IpythonOutputKind) -> Vec<HashMap<String, String>> {
        self.outputs()
            .into_iter()
            .filter(|o| o.kind == kind as i32)
            .map(|o| o.data)
            .collect()
    }

    /// text/plain of the execute_result.
    pub fn value(&self) -> String {
        let results = self.bundles(IpythonOutputKind::ExecuteResult);
        assert_eq!(results.len(), 1, "one execute_result: {self:?}");
        results[0].get("text/plain").cloned().unwrap_or_default()
    }

    pub fn agent_states(&self) -> Vec<api::AgentState> {
        self.0
            .iter()
            .filter_map(|e| match &e.kind {
                Some(run_response::Kind::AgentState(a)) => Some(a.clone()),
                _ => None,
            })
            .collect()
    }

    /// Asserts the cell ended OK and returns itself.
    pub fn ok(self) -> Self {
        let result = self.result();
        assert_eq!(self.status(), IpythonStatus::Ok, "{result:?}\n{self:?}");
        self
    }
}

/// Reads events until `stop` says so, noting when each arrived.
pub async fn read_until(
    stream: &mut Streaming<RunResponse>,
    mut stop: impl FnMut(&RunResponse) -> bool,
) -> Vec<(Instant, RunResponse)> {
    let mut seen = Vec::new();
    loop {
        let event = next(stream).await;
        let done = stop(&event);
        seen.push((Instant::now(), event));
        if done {
            return seen;
        }
    }
}

pub fn is_start(event: &RunResponse) -> bool {
    matches!(event.kind, Some(run_response::Kind::IpythonStart(_)))
}

pub fn is_result(event: &RunResponse) -> bool {
    matches!(event.kind, Some(run_response::Kind::IpythonResult(_)))
}
