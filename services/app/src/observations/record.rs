//! The journal's record (`mentis.journal.v1.Record`, format 1) ⇄ the model: the one place observations
//! become what the journal writes and are read back from it. The journal encodes a record's head and kind
//! apart (see `journal`), so this gives both.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use mentis_core::{
    CmdEnd, EndReason, Error, IPythonOutput, IPythonOutputKind, IPythonResult, IPythonStatus,
    Observation, ObservationKind, OutputStream,
};
use mentis_proto::journal;

fn duration_to_proto(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or_default()
}

fn duration_from_proto(d: Option<prost_types::Duration>) -> Duration {
    d.and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default()
}

fn map<K: Ord, V>(m: impl IntoIterator<Item = (K, V)>) -> BTreeMap<K, V> {
    m.into_iter().collect()
}

/// The record of an observation's kind.
pub(crate) fn kind_to_record(kind: &ObservationKind) -> journal::record::Kind {
    use journal::record::Kind as K;
    match kind {
        ObservationKind::CmdStart { command, pid } => K::CmdStart(journal::CmdStart {
            command: command.clone(),
            pid: *pid,
        }),
        ObservationKind::CmdOutput { stream, data } => K::CmdOutput(journal::CmdOutput {
            stream: match stream {
                OutputStream::Stdout => journal::OutputStream::Stdout,
                OutputStream::Stderr => journal::OutputStream::Stderr,
            } as i32,
            data: data.clone(),
        }),
        ObservationKind::CmdEnd(e) => K::CmdEnd(journal::CmdEnd {
            exit_code: e.exit_code,
            reason: match e.reason {
                EndReason::Exited => journal::EndReason::Exited,
                EndReason::TimedOut => journal::EndReason::TimedOut,
                EndReason::Cancelled => journal::EndReason::Cancelled,
                EndReason::Lost => journal::EndReason::Lost,
                EndReason::FailedToStart => journal::EndReason::FailedToStart,
                EndReason::OomKilled => journal::EndReason::OomKilled,
                EndReason::PidsLimitReached => journal::EndReason::PidsLimitReached,
            } as i32,
            duration: Some(duration_to_proto(e.duration)),
            signal: e.signal,
            message: e.message.clone(),
        }),
        ObservationKind::IPythonStart {
            code,
            execution_count,
        } => K::IpythonStart(journal::IPythonStart {
            code: code.clone(),
            execution_count: *execution_count,
        }),
        ObservationKind::IPythonOutput(o) => K::IpythonOutput(journal::IPythonOutput {
            kind: match o.kind {
                IPythonOutputKind::Stdout => journal::IpythonOutputKind::StreamStdout,
                IPythonOutputKind::Stderr => journal::IpythonOutputKind::StreamStderr,
                IPythonOutputKind::DisplayData => journal::IpythonOutputKind::DisplayData,
                IPythonOutputKind::ExecuteResult => journal::IpythonOutputKind::ExecuteResult,
                IPythonOutputKind::UpdateDisplayData => {
                    journal::IpythonOutputKind::UpdateDisplayData
                }
            } as i32,
            text: o.text.clone(),
            data: o.data.clone().into_iter().collect(),
            display_id: o.display_id.clone(),
        }),
        ObservationKind::IPythonResult(r) => K::IpythonResult(journal::IPythonResult {
            status: match r.status {
                IPythonStatus::Ok => journal::IpythonStatus::Ok,
                IPythonStatus::Error => journal::IpythonStatus::Error,
                IPythonStatus::Aborted => journal::IpythonStatus::Aborted,
            } as i32,
            execution_count: r.execution_count,
            error_name: r.error_name.clone(),
            error_value: r.error_value.clone(),
            traceback: r.traceback.clone(),
            reason: r.reason.clone(),
            duration: Some(duration_to_proto(r.duration)),
        }),
        ObservationKind::Error { message, details } => K::Error(journal::ErrorObservation {
            message: message.clone(),
            details: details.clone().into_iter().collect(),
        }),
        ObservationKind::AgentState { message, details } => K::AgentState(journal::AgentState {
            message: message.clone(),
            details: details.clone().into_iter().collect(),
        }),
    }
}

/// The record without its kind and origin: what says where and when the observation is.
pub(crate) fn record_head(o: &Observation) -> journal::Record {
    journal::Record {
        seq: o.seq,
        sandbox_id: o.sandbox_id.to_string(),
        action_id: o
            .action_id
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        time: Some(prost_types::Timestamp::from(o.time)),
        ..Default::default()
    }
}

/// The whole record of an observation (without its origin).
#[cfg(test)]
pub(crate) fn record_of(o: &Observation) -> journal::Record {
    journal::Record {
        kind: Some(kind_to_record(&o.kind)),
        ..record_head(o)
    }
}

/// The observation a record holds.
pub(crate) fn observation_from_record(r: journal::Record) -> Result<Observation, Error> {
    Ok(Observation {
        seq: r.seq,
        sandbox_id: mentis_core::SandboxId::parse(&r.sandbox_id)?,
        action_id: if r.action_id.is_empty() {
            None
        } else {
            Some(mentis_core::ActionId::parse(&r.action_id)?)
        },
        time: r
            .time
            .and_then(|t| SystemTime::try_from(t).ok())
            .unwrap_or(SystemTime::UNIX_EPOCH),
        kind: kind_from_record(r.kind)?,
    })
}

/// The domain kind of a record's. A record without a kind is damage the checksum did not catch.
fn kind_from_record(kind: Option<journal::record::Kind>) -> Result<ObservationKind, Error> {
    use journal::record::Kind as K;
    let kind = kind.ok_or_else(|| Error::internal("a journal record without a kind"))?;
    Ok(match kind {
        K::CmdStart(s) => ObservationKind::CmdStart {
            command: s.command,
            pid: s.pid,
        },
        K::CmdOutput(o) => ObservationKind::CmdOutput {
            stream: match journal::OutputStream::try_from(o.stream) {
                Ok(journal::OutputStream::Stderr) => OutputStream::Stderr,
                _ => OutputStream::Stdout,
            },
            // A copy: the decoded bytes are a slice of the segment's read buffer, and a few bytes of
            // output kept in the log would keep the whole buffer alive.
            data: bytes::Bytes::copy_from_slice(&o.data),
        },
        K::CmdEnd(e) => ObservationKind::CmdEnd(CmdEnd {
            exit_code: e.exit_code,
            reason: match journal::EndReason::try_from(e.reason) {
                Ok(journal::EndReason::Exited) => EndReason::Exited,
                Ok(journal::EndReason::TimedOut) => EndReason::TimedOut,
                Ok(journal::EndReason::Cancelled) => EndReason::Cancelled,
                Ok(journal::EndReason::FailedToStart) => EndReason::FailedToStart,
                Ok(journal::EndReason::OomKilled) => EndReason::OomKilled,
                Ok(journal::EndReason::PidsLimitReached) => EndReason::PidsLimitReached,
                _ => EndReason::Lost,
            },
            duration: duration_from_proto(e.duration),
            signal: e.signal,
            message: e.message,
        }),
        K::IpythonStart(s) => ObservationKind::IPythonStart {
            code: s.code,
            execution_count: s.execution_count,
        },
        K::IpythonOutput(o) => ObservationKind::IPythonOutput(IPythonOutput {
            kind: match journal::IpythonOutputKind::try_from(o.kind) {
                Ok(journal::IpythonOutputKind::StreamStderr) => IPythonOutputKind::Stderr,
                Ok(journal::IpythonOutputKind::DisplayData) => IPythonOutputKind::DisplayData,
                Ok(journal::IpythonOutputKind::ExecuteResult) => IPythonOutputKind::ExecuteResult,
                Ok(journal::IpythonOutputKind::UpdateDisplayData) => {
                    IPythonOutputKind::UpdateDisplayData
                }
                _ => IPythonOutputKind::Stdout,
            },
            text: o.text,
            data: map(o.data),
            display_id: o.display_id,
        }),
        K::IpythonResult(r) => ObservationKind::IPythonResult(IPythonResult {
            status: match journal::IpythonStatus::try_from(r.status) {
                Ok(journal::IpythonStatus::Ok) => IPythonStatus::Ok,
                Ok(journal::IpythonStatus::Error) => IPythonStatus::Error,
                _ => IPythonStatus::Aborted,
            },
            execution_count: r.execution_count,
            error_name: r.error_name,
            error_value: r.error_value,
            traceback: r.traceback,
            reason: r.reason,
            duration: duration_from_proto(r.duration),
        }),
        K::Error(e) => ObservationKind::Error {
            message: e.message,
            details: map(e.details),
        },
        K::AgentState(a) => ObservationKind::AgentState {
            message: a.message,
            details: map(a.details),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use mentis_core::{ActionId, SandboxId};

    #[test]
    fn every_kind_comes_back_from_its_record() {
        let mut kinds = vec![
            ObservationKind::CmdStart {
                command: "make".into(),
                pid: 42,
            },
            ObservationKind::CmdOutput {
                stream: OutputStream::Stderr,
                data: Bytes::from_static(b"\xff\x00err"),
            },
            ObservationKind::IPythonStart {
                code: "1 + 1".into(),
                execution_count: 3,
            },
            ObservationKind::IPythonResult(IPythonResult {
                status: IPythonStatus::Error,
                execution_count: 3,
                error_name: "ZeroDivisionError".into(),
                error_value: "division by zero".into(),
                traceback: vec!["line 1".into()],
                reason: String::new(),
                duration: Duration::from_millis(12),
            }),
            ObservationKind::Error {
                message: "m".into(),
                details: [("k".to_owned(), "v".to_owned())].into(),
            },
            ObservationKind::AgentState {
                message: "room made".into(),
                details: BTreeMap::new(),
            },
        ];
        for kind in [
            IPythonOutputKind::Stdout,
            IPythonOutputKind::Stderr,
            IPythonOutputKind::DisplayData,
            IPythonOutputKind::ExecuteResult,
            IPythonOutputKind::UpdateDisplayData,
        ] {
            kinds.push(ObservationKind::IPythonOutput(IPythonOutput {
                kind,
                text: "t".into(),
                data: [("text/plain".to_owned(), "2".to_owned())].into(),
                display_id: "d".into(),
            }));
        }
        for reason in [
            EndReason::Exited,
            EndReason::TimedOut,
            EndReason::Cancelled,
            EndReason::Lost,
            EndReason::FailedToStart,
            EndReason::OomKilled,
            EndReason::PidsLimitReached,
        ] {
            kinds.push(ObservationKind::CmdEnd(CmdEnd {
                exit_code: 137,
                reason,
                duration: Duration::new(1, 5),
                signal: 9,
                message: "m".into(),
            }));
        }
        let sandbox = SandboxId::new();
        for (seq, kind) in (1..).zip(kinds) {
            let o = Observation {
                seq,
                sandbox_id: sandbox,
                action_id: (seq % 2 == 0).then(ActionId::generate),
                time: SystemTime::UNIX_EPOCH + Duration::new(seq, 7),
                kind,
            };
            assert_eq!(observation_from_record(record_of(&o)).expect("reads"), o);
        }
        assert!(observation_from_record(journal::Record::default()).is_err());
    }
}
