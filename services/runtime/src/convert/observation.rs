//! Observations: domain observations → the public proto.

use std::time::{Duration, SystemTime};

use mentis_core::{
    EndReason, IPythonOutputKind, IPythonStatus, Observation, ObservationKind, OutputStream,
};
use mentis_proto::api;

/// A protobuf timestamp for a system time.
pub fn timestamp(t: SystemTime) -> prost_types::Timestamp {
    prost_types::Timestamp::from(t)
}

fn duration_to_proto(d: Duration) -> prost_types::Duration {
    prost_types::Duration::try_from(d).unwrap_or_default()
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

#[cfg(test)]
mod tests {
    use super::*;
    use mentis_core::CmdEnd;

    #[test]
    fn every_end_reason_has_its_public_name() {
        for (reason, public) in [
            (EndReason::Exited, api::EndReason::Exited),
            (EndReason::TimedOut, api::EndReason::TimedOut),
            (EndReason::Cancelled, api::EndReason::Cancelled),
            (EndReason::Lost, api::EndReason::Lost),
            (EndReason::FailedToStart, api::EndReason::FailedToStart),
            (EndReason::OomKilled, api::EndReason::OomKilled),
            (
                EndReason::PidsLimitReached,
                api::EndReason::PidsLimitReached,
            ),
        ] {
            let end = ObservationKind::CmdEnd(CmdEnd {
                exit_code: 137,
                reason,
                duration: Duration::from_millis(5),
                signal: 9,
                message: "m".into(),
            });
            let api::observation::Kind::CmdEnd(e) = kind_to_proto(&end) else {
                panic!("a command's end stays one");
            };
            assert_eq!(e.reason, public as i32);
        }
    }
}
