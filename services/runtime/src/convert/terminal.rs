//! Terminal streams: public proto ⇄ the model's terminal types.

use mentis_core::terminal::{TerminalInfo, TerminalInput, TerminalOutput, TerminalStart};
use mentis_proto::api::{self, open_request, open_response};

use super::timestamp;

/// A client's request (`None`: a message without a kind, which the executor would refuse too).
pub fn terminal_input_from_proto(r: api::OpenRequest) -> Option<TerminalInput> {
    Some(match r.kind? {
        open_request::Kind::Start(s) => TerminalInput::Start(TerminalStart {
            command: s.command,
            cols: s.cols,
            rows: s.rows,
            env: s.env.into_iter().collect(),
            work_dir: s.work_dir,
            idle_timeout_seconds: s.idle_timeout_seconds,
        }),
        open_request::Kind::Attach(a) => TerminalInput::Attach {
            terminal_id: a.terminal_id,
            after_seq: a.after_seq,
        },
        open_request::Kind::Input(i) => TerminalInput::Input(i.data),
        open_request::Kind::Resize(r) => TerminalInput::Resize {
            cols: r.cols,
            rows: r.rows,
        },
        open_request::Kind::Signal(s) => TerminalInput::Signal(s.name),
    })
}

pub fn terminal_output_to_proto(o: TerminalOutput) -> api::OpenResponse {
    let kind = match o {
        TerminalOutput::Started {
            terminal_id,
            last_seq,
            cols,
            rows,
        } => open_response::Kind::Started(open_response::Started {
            terminal_id,
            last_seq,
            cols,
            rows,
        }),
        TerminalOutput::Output { seq, data } => {
            open_response::Kind::Output(open_response::Output { seq, data })
        }
        TerminalOutput::Exited { exit_code, signal } => {
            open_response::Kind::Exited(open_response::Exited { exit_code, signal })
        }
    };
    api::OpenResponse { kind: Some(kind) }
}

pub fn terminal_info_to_proto(t: TerminalInfo) -> api::TerminalInfo {
    api::TerminalInfo {
        terminal_id: t.terminal_id,
        command: t.command,
        cols: t.cols,
        rows: t.rows,
        pid: t.pid,
        created_at: t.created_at.map(timestamp),
        last_seq: t.last_seq,
        attached: t.attached,
        exit_code: t.exit_code,
    }
}
