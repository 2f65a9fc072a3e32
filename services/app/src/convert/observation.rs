//! Observations: executor events → domain kinds, and domain observations → the public proto.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use mentis_core::{
    CmdEnd, EndReason, Error, IPythonOutput, IPythonOutputKind, IPythonResult, IPythonStatus,
    Observation, ObservationKind, OutputStream,
};
use mentis_proto::{api, executor};

/// A protobuf timestamp for a system time.
pub fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

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

/// The domain kind of an executor event. An event without a kind is a protocol error of the executor.
pub fn kind_from_executor(
    kind: Option<executor::run_response::Kind>,
) -> Result<ObservationKind, Error> {
    use executor::run_response::Kind as K;
    let kind = kind.ok_or_else(|| Error::internal("executor sent an event without a kind"))?;
    Ok(match kind {
        K::CmdStart(s) => ObservationKind::CmdStart {
            command: s.command,
            pid: s.pid,
        },
        K::CmdOutput(o) => ObservationKind::CmdOutput {
            stream: match api::OutputStream::try_from(o.stream) {
                Ok(api::OutputStream::Stderr) => OutputStream::Stderr,
                _ => OutputStream::Stdout,
            },
            // A copy: the decoded bytes are a slice of the connection's receive buffer, and a few bytes
            // of output kept in the log would keep the whole buffer alive.
            data: bytes::Bytes::copy_from_slice(&o.data),
        },
        K::CmdEnd(e) => ObservationKind::CmdEnd(CmdEnd {
            exit_code: e.exit_code,
            reason: match api::EndReason::try_from(e.reason) {
                Ok(api::EndReason::Exited) => EndReason::Exited,
                Ok(api::EndReason::TimedOut) => EndReason::TimedOut,
                Ok(api::EndReason::Cancelled) => EndReason::Cancelled,
                Ok(api::EndReason::FailedToStart) => EndReason::FailedToStart,
                Ok(api::EndReason::OomKilled) => EndReason::OomKilled,
                Ok(api::EndReason::PidsLimitReached) => EndReason::PidsLimitReached,
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
            kind: match api::IpythonOutputKind::try_from(o.kind) {
                Ok(api::IpythonOutputKind::StreamStderr) => IPythonOutputKind::Stderr,
                Ok(api::IpythonOutputKind::DisplayData) => IPythonOutputKind::DisplayData,
                Ok(api::IpythonOutputKind::ExecuteResult) => IPythonOutputKind::ExecuteResult,
                Ok(api::IpythonOutputKind::UpdateDisplayData) => {
                    IPythonOutputKind::UpdateDisplayData
                }
                _ => IPythonOutputKind::Stdout,
            },
            text: o.text,
            data: map(o.data),
            display_id: o.display_id,
        }),
        K::IpythonResult(r) => ObservationKind::IPythonResult(IPythonResult {
            status: match api::IpythonStatus::try_from(r.status) {
                Ok(api::IpythonStatus::Ok) => IPythonStatus::Ok,
                Ok(api::IpythonStatus::Error) => IPythonStatus::Error,
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

/// The public proto of a domain kind.
pub fn kind_to_proto(kind: &ObservationKind) -> api::observation::Kind {
    use api::observation::Kind as K;
    match kind {
        ObservationKind::CmdStart { command, pid } => K::CmdStart(api::CmdStart {
            command: command.clone(),
            pid: *pid,
        }),
        ObservationKind::CmdOutput { stream, data } => K::CmdOutput(api::CmdOutput {
            stream: match stream {
                OutputStream::Stdout => api::OutputStream::Stdout,
                OutputStream::Stderr => api::OutputStream::Stderr,
            } as i32,
            data: data.clone(),
        }),
        ObservationKind::CmdEnd(e) => K::CmdEnd(api::CmdEnd {
            exit_code: e.exit_code,
            reason: match e.reason {
                EndReason::Exited => api::EndReason::Exited,
                EndReason::TimedOut => api::EndReason::TimedOut,
                EndReason::Cancelled => api::EndReason::Cancelled,
                EndReason::Lost => api::EndReason::Lost,
                EndReason::FailedToStart => api::EndReason::FailedToStart,
                EndReason::OomKilled => api::EndReason::OomKilled,
                EndReason::PidsLimitReached => api::EndReason::PidsLimitReached,
            } as i32,
            duration: Some(duration_to_proto(e.duration)),
            signal: e.signal,
            message: e.message.clone(),
        }),
        ObservationKind::IPythonStart {
            code,
            execution_count,
        } => K::IpythonStart(api::IPythonStart {
            code: code.clone(),
            execution_count: *execution_count,
        }),
        ObservationKind::IPythonOutput(o) => K::IpythonOutput(api::IPythonOutput {
            kind: match o.kind {
                IPythonOutputKind::Stdout => api::IpythonOutputKind::StreamStdout,
                IPythonOutputKind::Stderr => api::IpythonOutputKind::StreamStderr,
                IPythonOutputKind::DisplayData => api::IpythonOutputKind::DisplayData,
                IPythonOutputKind::ExecuteResult => api::IpythonOutputKind::ExecuteResult,
                IPythonOutputKind::UpdateDisplayData => api::IpythonOutputKind::UpdateDisplayData,
            } as i32,
            text: o.text.clone(),
            data: o.data.clone().into_iter().collect(),
            display_id: o.display_id.clone(),
        }),
        ObservationKind::IPythonResult(r) => K::IpythonResult(api::IPythonResult {
            status: match r.status {
                IPythonStatus::Ok => api::IpythonStatus::Ok,
                IPythonStatus::Error => api::IpythonStatus::Error,
                IPythonStatus::Aborted => api::IpythonStatus::Aborted,
            } as i32,
            execution_count: r.execution_count,
            error_name: r.error_name.clone(),
            error_value: r.error_value.clone(),
            traceback: r.traceback.clone(),
            reason: r.reason.clone(),
            duration: Some(duration_to_proto(r.duration)),
        }),
        ObservationKind::Error { message, details } => K::Error(api::ErrorObservation {
            message: message.clone(),
            details: details.clone().into_iter().collect(),
        }),
        ObservationKind::AgentState { message, details } => K::AgentState(api::AgentState {
            message: message.clone(),
            details: details.clone().into_iter().collect(),
        }),
    }
}

/// The public proto of an observation.
pub fn observation_to_proto(o: &Observation) -> api::Observation {
    api::Observation {
        kind: Some(kind_to_proto(&o.kind)),
        ..observation_to_proto_head(o)
    }
}

/// The observation without its kind: what says where and when it is (the journal encodes the kind apart).
pub fn observation_to_proto_head(o: &Observation) -> api::Observation {
    api::Observation {
        seq: o.seq,
        sandbox_id: o.sandbox_id.to_string(),
        action_id: o
            .action_id
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        time: Some(timestamp(o.time)),
        kind: None,
    }
}

/// The domain observation of a public proto (as the journal stores it). The public kinds are the
/// executor's events with the same messages and field numbers, so one conversion serves both.
pub fn observation_from_proto(o: api::Observation) -> Result<Observation, Error> {
    use api::observation::Kind as P;
    use executor::run_response::Kind as E;
    let kind = o.kind.map(|k| match k {
        P::CmdStart(x) => E::CmdStart(x),
        P::CmdOutput(x) => E::CmdOutput(x),
        P::CmdEnd(x) => E::CmdEnd(x),
        P::IpythonStart(x) => E::IpythonStart(x),
        P::IpythonOutput(x) => E::IpythonOutput(x),
        P::IpythonResult(x) => E::IpythonResult(x),
        P::Error(x) => E::Error(x),
        P::AgentState(x) => E::AgentState(x),
    });
    Ok(Observation {
        seq: o.seq,
        sandbox_id: mentis_core::SandboxId::parse(&o.sandbox_id)?,
        action_id: if o.action_id.is_empty() {
            None
        } else {
            Some(mentis_core::ActionId::parse(&o.action_id)?)
        },
        time: o
            .time
            .and_then(|t| SystemTime::try_from(t).ok())
            .unwrap_or(SystemTime::UNIX_EPOCH),
        kind: kind_from_executor(kind)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn executor_events_survive_the_trip_to_the_public_api() {
        use executor::run_response::Kind as K;
        let out = kind_from_executor(Some(K::CmdOutput(api::CmdOutput {
            stream: api::OutputStream::Stderr as i32,
            data: Bytes::from_static(b"\xff\x00"),
        })))
        .expect("converts");
        assert_eq!(
            kind_to_proto(&out),
            api::observation::Kind::CmdOutput(api::CmdOutput {
                stream: api::OutputStream::Stderr as i32,
                data: Bytes::from_static(b"\xff\x00"),
            })
        );
        let end = kind_from_executor(Some(K::CmdEnd(api::CmdEnd {
            exit_code: 3,
            reason: api::EndReason::Exited as i32,
            duration: Some(prost_types::Duration {
                seconds: 1,
                nanos: 5,
            }),
            signal: 0,
            message: String::new(),
        })))
        .expect("converts");
        assert!(end.is_terminal());
        assert!(kind_from_executor(None).is_err());
    }

    #[test]
    fn every_end_reason_survives_the_trip() {
        use executor::run_response::Kind as K;
        for reason in [
            api::EndReason::Exited,
            api::EndReason::TimedOut,
            api::EndReason::Cancelled,
            api::EndReason::Lost,
            api::EndReason::FailedToStart,
            api::EndReason::OomKilled,
            api::EndReason::PidsLimitReached,
        ] {
            let end = api::CmdEnd {
                exit_code: 137,
                reason: reason as i32,
                duration: Some(prost_types::Duration::default()),
                signal: 9,
                message: "m".into(),
            };
            let kind = kind_from_executor(Some(K::CmdEnd(end.clone()))).expect("converts");
            assert_eq!(kind_to_proto(&kind), api::observation::Kind::CmdEnd(end));
        }
    }
}
