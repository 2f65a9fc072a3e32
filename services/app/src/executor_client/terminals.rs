//! The executor client's terminal calls (`mentis.executor.v1.ExecutorService`'s Terminal, ListTerminals,
//! CloseTerminal), in the model's terms (`mentis_core::terminal`): the executor's messages are made and
//! read here and nowhere else.

use futures::{Stream, StreamExt as _};
use mentis_core::Error;
use mentis_core::terminal::{TerminalInfo, TerminalInput, TerminalOutput, TerminalSettings};
use mentis_proto::executor::{
    self as wire, CloseTerminalRequest, ListTerminalsRequest, TerminalRequest, TerminalResponse,
    TerminalSettings as WireSettings, open_request, open_response,
};

use super::{ExecutorClient, TerminalOutputs, status_to_error};

impl ExecutorClient {
    /// Opens a terminal stream: `first` (a start or an attach) goes with `settings`, then `inputs` as they
    /// come; the outputs are the terminal's.
    pub async fn terminal(
        &self,
        first: TerminalInput,
        settings: TerminalSettings,
        inputs: impl Stream<Item = TerminalInput> + Send + 'static,
    ) -> Result<TerminalOutputs, Error> {
        let first = TerminalRequest {
            request: Some(input_to_wire(first)),
            settings: Some(WireSettings {
                env: settings.env.into_iter().collect(),
                max_terminals: settings.max_terminals,
                default_idle_timeout_seconds: u32::try_from(
                    settings.default_idle_timeout.as_secs(),
                )
                .unwrap_or(u32::MAX),
                scrollback_bytes: settings.scrollback_bytes,
            }),
        };
        let requests =
            futures::stream::once(async { first }).chain(inputs.map(|input| TerminalRequest {
                request: Some(input_to_wire(input)),
                settings: None,
            }));
        let mut rpc = self.rpc.clone();
        let responses = self.timed(rpc.terminal(requests)).await?.into_inner();
        Ok(Box::pin(responses.filter_map(|r| async move {
            match r {
                Ok(TerminalResponse { response }) => response.and_then(output_from_wire).map(Ok),
                Err(status) => Some(Err(status_to_error(status))),
            }
        })))
    }

    /// The sandbox's terminals.
    pub async fn list_terminals(&self) -> Result<Vec<TerminalInfo>, Error> {
        let mut rpc = self.rpc.clone();
        let listed = self
            .timed(rpc.list_terminals(ListTerminalsRequest {}))
            .await?
            .into_inner();
        Ok(listed.terminals.into_iter().map(info_from_wire).collect())
    }

    /// Hangs a terminal up (or forgets an exited one).
    pub async fn close_terminal(&self, terminal_id: &str) -> Result<(), Error> {
        let mut rpc = self.rpc.clone();
        self.timed(rpc.close_terminal(CloseTerminalRequest {
            terminal_id: terminal_id.to_owned(),
        }))
        .await
        .map(drop)
    }
}

fn input_to_wire(input: TerminalInput) -> wire::OpenRequest {
    let kind = match input {
        TerminalInput::Start(s) => open_request::Kind::Start(open_request::Start {
            sandbox_id: String::new(),
            command: s.command,
            cols: s.cols,
            rows: s.rows,
            env: s.env.into_iter().collect(),
            work_dir: s.work_dir,
            idle_timeout_seconds: s.idle_timeout_seconds,
        }),
        TerminalInput::Attach {
            terminal_id,
            after_seq,
        } => open_request::Kind::Attach(open_request::Attach {
            sandbox_id: String::new(),
            terminal_id,
            after_seq,
        }),
        TerminalInput::Input(data) => open_request::Kind::Input(open_request::Input { data }),
        TerminalInput::Resize { cols, rows } => {
            open_request::Kind::Resize(open_request::Resize { cols, rows })
        }
        TerminalInput::Signal(name) => open_request::Kind::Signal(open_request::Signal { name }),
    };
    wire::OpenRequest { kind: Some(kind) }
}

/// An output as the executor sends it; `None` for a message without one (or a keepalive, which the
/// executor does not send: the runtime makes its own).
fn output_from_wire(response: wire::OpenResponse) -> Option<TerminalOutput> {
    Some(match response.kind? {
        open_response::Kind::Started(s) => TerminalOutput::Started {
            terminal_id: s.terminal_id,
            last_seq: s.last_seq,
            cols: s.cols,
            rows: s.rows,
        },
        open_response::Kind::Output(o) => TerminalOutput::Output {
            seq: o.seq,
            data: o.data,
        },
        open_response::Kind::Exited(e) => TerminalOutput::Exited {
            exit_code: e.exit_code,
            signal: e.signal,
        },
        open_response::Kind::Keepalive(_) => return None,
    })
}

fn info_from_wire(t: wire::TerminalInfo) -> TerminalInfo {
    TerminalInfo {
        terminal_id: t.terminal_id,
        command: t.command,
        cols: t.cols,
        rows: t.rows,
        pid: t.pid,
        created_at: t
            .created_at
            .and_then(|c| std::time::SystemTime::try_from(c).ok()),
        last_seq: t.last_seq,
        attached: t.attached,
        exit_code: t.exit_code,
    }
}
