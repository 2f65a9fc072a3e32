//! The executor wire (`mentis.executor.v1`) ⇄ the model, the control plane's side: the one place the
//! application makes and reads the executor's messages of actions, events and variable summaries (files and
//! terminals: `files`, `terminals`). The executor's own side is its `convert`.

use std::collections::BTreeMap;
use std::time::Duration;

use mentis_core::{
    Action, CmdEnd, EndReason, Error, IPythonOutput, IPythonOutputKind, IPythonResult,
    IPythonStatus, ObservationKind, OutputStream, VariableSummary,
};
use mentis_proto::executor as exec;
use prost_types::value::Kind;
use serde_json::{Map, Number, Value};

fn duration_from_proto(d: Option<prost_types::Duration>) -> Duration {
    d.and_then(|d| Duration::try_from(d).ok())
        .unwrap_or_default()
}

fn map<K: Ord, V>(m: impl IntoIterator<Item = (K, V)>) -> BTreeMap<K, V> {
    m.into_iter().collect()
}

/// The action as the executor receives it.
pub(crate) fn action_to_wire(action: &Action) -> exec::Action {
    let kind = match action {
        Action::Shell(s) => exec::action::Kind::Shell(exec::ShellAction {
            command: s.command.clone(),
            work_dir: s.work_dir.clone(),
            env: s.env.clone().into_iter().collect(),
            timeout_seconds: u32::try_from(s.timeout.as_secs()).unwrap_or(u32::MAX),
            stdin: s.stdin.clone(),
            keep_stdin_open: s.keep_stdin_open,
            session: s.session.clone().unwrap_or_default(),
        }),
        Action::IPython(c) => exec::action::Kind::Ipython(exec::IPythonAction {
            code: c.code.clone(),
            timeout_seconds: u32::try_from(c.timeout.as_secs()).unwrap_or(u32::MAX),
            rollback_on_error: Some(c.rollback_on_error),
        }),
    };
    exec::Action { kind: Some(kind) }
}

/// The domain kind of an executor event. An event without a kind is a protocol error of the executor.
pub(crate) fn kind_from_wire(
    kind: Option<exec::run_response::Kind>,
) -> Result<ObservationKind, Error> {
    use exec::run_response::Kind as K;
    let kind = kind.ok_or_else(|| Error::internal("executor sent an event without a kind"))?;
    Ok(match kind {
        K::CmdStart(s) => ObservationKind::CmdStart {
            command: s.command,
            pid: s.pid,
        },
        K::CmdOutput(o) => ObservationKind::CmdOutput {
            stream: match exec::OutputStream::try_from(o.stream) {
                Ok(exec::OutputStream::Stderr) => OutputStream::Stderr,
                _ => OutputStream::Stdout,
            },
            // A copy: the decoded bytes are a slice of the connection's receive buffer, and a few bytes
            // of output kept in the log would keep the whole buffer alive.
            data: bytes::Bytes::copy_from_slice(&o.data),
        },
        K::CmdEnd(e) => ObservationKind::CmdEnd(CmdEnd {
            exit_code: e.exit_code,
            reason: match exec::EndReason::try_from(e.reason) {
                Ok(exec::EndReason::Exited) => EndReason::Exited,
                Ok(exec::EndReason::TimedOut) => EndReason::TimedOut,
                Ok(exec::EndReason::Cancelled) => EndReason::Cancelled,
                Ok(exec::EndReason::FailedToStart) => EndReason::FailedToStart,
                Ok(exec::EndReason::OomKilled) => EndReason::OomKilled,
                Ok(exec::EndReason::PidsLimitReached) => EndReason::PidsLimitReached,
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
            kind: match exec::IpythonOutputKind::try_from(o.kind) {
                Ok(exec::IpythonOutputKind::StreamStderr) => IPythonOutputKind::Stderr,
                Ok(exec::IpythonOutputKind::DisplayData) => IPythonOutputKind::DisplayData,
                Ok(exec::IpythonOutputKind::ExecuteResult) => IPythonOutputKind::ExecuteResult,
                Ok(exec::IpythonOutputKind::UpdateDisplayData) => {
                    IPythonOutputKind::UpdateDisplayData
                }
                _ => IPythonOutputKind::Stdout,
            },
            text: o.text,
            data: map(o.data),
            display_id: o.display_id,
        }),
        K::IpythonResult(r) => ObservationKind::IPythonResult(IPythonResult {
            status: match exec::IpythonStatus::try_from(r.status) {
                Ok(exec::IpythonStatus::Ok) => IPythonStatus::Ok,
                Ok(exec::IpythonStatus::Error) => IPythonStatus::Error,
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

fn value_to_json(v: prost_types::Value) -> Value {
    match v.kind {
        None | Some(Kind::NullValue(_)) => Value::Null,
        Some(Kind::BoolValue(b)) => Value::Bool(b),
        // JSON numbers of the Struct are doubles; whole ones read back as integers.
        Some(Kind::NumberValue(n)) => {
            if n.fract() == 0.0 && n.abs() < 9.0e15 {
                #[allow(clippy::cast_possible_truncation)]
                Value::Number(Number::from(n as i64))
            } else {
                Number::from_f64(n).map_or(Value::Null, Value::Number)
            }
        }
        Some(Kind::StringValue(s)) => Value::String(s),
        Some(Kind::ListValue(l)) => Value::Array(l.values.into_iter().map(value_to_json).collect()),
        Some(Kind::StructValue(s)) => Value::Object(struct_to_json(s)),
    }
}

fn struct_to_json(s: prost_types::Struct) -> Map<String, Value> {
    s.fields
        .into_iter()
        .map(|(k, v)| (k, value_to_json(v)))
        .collect()
}

/// A summary as the executor sent it.
pub(crate) fn summary_from_wire(s: exec::VariableSummary) -> VariableSummary {
    VariableSummary {
        name: s.name,
        type_name: s.r#type,
        summary: s.summary.map(struct_to_json).unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn an_action_reaches_the_executor_field_by_field() {
        let shell = Action::Shell(mentis_core::ShellAction {
            command: "echo hi".into(),
            work_dir: "sub".into(),
            env: [("A".to_owned(), "1".to_owned())].into(),
            timeout: Duration::from_secs(7),
            stdin: Bytes::from_static(b"in"),
            keep_stdin_open: true,
            session: Some("work".into()),
        });
        assert_eq!(
            action_to_wire(&shell),
            exec::Action {
                kind: Some(exec::action::Kind::Shell(exec::ShellAction {
                    command: "echo hi".into(),
                    work_dir: "sub".into(),
                    env: [("A".to_owned(), "1".to_owned())].into(),
                    timeout_seconds: 7,
                    stdin: Bytes::from_static(b"in"),
                    keep_stdin_open: true,
                    session: "work".into(),
                })),
            }
        );
        let cell = Action::IPython(mentis_core::IPythonAction {
            code: "1 + 1".into(),
            timeout: Duration::from_secs(3),
            rollback_on_error: false,
        });
        assert_eq!(
            action_to_wire(&cell),
            exec::Action {
                kind: Some(exec::action::Kind::Ipython(exec::IPythonAction {
                    code: "1 + 1".into(),
                    timeout_seconds: 3,
                    rollback_on_error: Some(false),
                })),
            }
        );
    }

    #[test]
    fn every_executor_event_becomes_its_kind() {
        use exec::run_response::Kind as K;
        let out = kind_from_wire(Some(K::CmdOutput(exec::CmdOutput {
            stream: exec::OutputStream::Stderr as i32,
            data: Bytes::from_static(b"\xff\x00"),
        })))
        .expect("converts");
        assert_eq!(
            out,
            ObservationKind::CmdOutput {
                stream: OutputStream::Stderr,
                data: Bytes::from_static(b"\xff\x00"),
            }
        );
        for (wire, reason) in [
            (exec::EndReason::Exited, EndReason::Exited),
            (exec::EndReason::TimedOut, EndReason::TimedOut),
            (exec::EndReason::Cancelled, EndReason::Cancelled),
            (exec::EndReason::Lost, EndReason::Lost),
            (exec::EndReason::FailedToStart, EndReason::FailedToStart),
            (exec::EndReason::OomKilled, EndReason::OomKilled),
            (
                exec::EndReason::PidsLimitReached,
                EndReason::PidsLimitReached,
            ),
            // An executor newer than this runtime: its reason is not known, so nothing is claimed.
            (exec::EndReason::Unspecified, EndReason::Lost),
        ] {
            let end = kind_from_wire(Some(K::CmdEnd(exec::CmdEnd {
                exit_code: 137,
                reason: wire as i32,
                duration: Some(prost_types::Duration {
                    seconds: 1,
                    nanos: 5,
                }),
                signal: 9,
                message: "m".into(),
            })))
            .expect("converts");
            assert_eq!(
                end,
                ObservationKind::CmdEnd(CmdEnd {
                    exit_code: 137,
                    reason,
                    duration: Duration::new(1, 5),
                    signal: 9,
                    message: "m".into(),
                })
            );
        }
        assert!(kind_from_wire(None).is_err());
    }

    #[test]
    fn a_summary_from_the_executor_reads_as_json() {
        let number = |n: f64| prost_types::Value {
            kind: Some(Kind::NumberValue(n)),
        };
        let wire = exec::VariableSummary {
            name: "df".into(),
            r#type: "DataFrame".into(),
            summary: Some(prost_types::Struct {
                fields: [
                    (
                        "shape".to_owned(),
                        prost_types::Value {
                            kind: Some(Kind::ListValue(prost_types::ListValue {
                                values: vec![number(1_000_000.0), number(3.0)],
                            })),
                        },
                    ),
                    ("x".to_owned(), number(1.5)),
                ]
                .into(),
            }),
        };
        let s = summary_from_wire(wire);
        assert_eq!((s.name.as_str(), s.type_name.as_str()), ("df", "DataFrame"));
        assert_eq!(
            Value::Object(s.summary),
            serde_json::json!({"shape": [1_000_000, 3], "x": 1.5})
        );
    }
}
