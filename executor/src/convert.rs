//! The edge: proto requests become validated domain specs, domain events become proto responses.

mod ipython;

use std::collections::HashMap;
use std::time::Duration;

use mentis_model::{CmdEnd, EndReason, ObservationKind, OutputStream};
use mentis_proto::api::{self, action};
use mentis_proto::executor::{RunRequest, RunResponse, run_response};

use crate::actions::ActionSpec;
use crate::error::Error;
use crate::events::Event;
use crate::shell::ShellSpec;

pub(crate) use ipython::{inspect_names, variable_summaries};

/// Longest accepted action id; ids are UUIDs in practice, this only keeps garbage out of logs and maps.
const MAX_ACTION_ID_LEN: usize = 128;

/// Validates a Run request into the action's id and spec.
pub(crate) fn run_request(request: RunRequest) -> Result<(String, ActionSpec), Error> {
    let RunRequest {
        action_id,
        action,
        env: sandbox_env,
    } = request;
    let action_id = action_id_arg(action_id)?;
    let kind = action
        .ok_or_else(|| invalid("action is required"))?
        .kind
        .ok_or_else(|| invalid("action.kind must be shell or ipython"))?;
    let spec = match kind {
        action::Kind::Shell(shell) => ActionSpec::Shell(shell_spec(shell, sandbox_env)?),
        action::Kind::Ipython(cell) => {
            check_env("env", &sandbox_env)?;
            ActionSpec::IPython(ipython::cell_spec(cell, sandbox_env)?)
        }
    };
    Ok((action_id, spec))
}

/// Validates the action id of Cancel / WriteStdin (and Run).
pub(crate) fn action_id_arg(action_id: String) -> Result<String, Error> {
    if action_id.is_empty() {
        return Err(invalid("action_id is required"));
    }
    if action_id.len() > MAX_ACTION_ID_LEN || action_id.chars().any(char::is_control) {
        return Err(invalid(format!(
            "action_id must be at most {MAX_ACTION_ID_LEN} bytes without control characters"
        )));
    }
    Ok(action_id)
}

fn shell_spec(
    shell: api::ShellAction,
    sandbox_env: HashMap<String, String>,
) -> Result<ShellSpec, Error> {
    let api::ShellAction {
        command,
        work_dir,
        env: action_env,
        timeout_seconds,
        stdin,
        keep_stdin_open,
    } = shell;
    if command.trim().is_empty() {
        return Err(invalid("shell.command must not be empty"));
    }
    // A NUL cannot cross execve; say so now rather than report a confusing spawn failure.
    if command.contains('\0') {
        return Err(invalid("shell.command must not contain NUL"));
    }
    if work_dir.contains('\0') {
        return Err(invalid("shell.work_dir must not contain NUL"));
    }
    check_env("env", &sandbox_env)?;
    check_env("shell.env", &action_env)?;
    Ok(ShellSpec {
        command,
        work_dir,
        sandbox_env,
        action_env,
        timeout: (timeout_seconds > 0).then(|| Duration::from_secs(u64::from(timeout_seconds))),
        stdin,
        keep_stdin_open,
    })
}

fn check_env(field: &str, env: &HashMap<String, String>) -> Result<(), Error> {
    for (name, value) in env {
        if name.is_empty() || name.contains('=') || name.contains('\0') {
            return Err(invalid(format!(
                "{field}: {name:?} is not a valid variable name"
            )));
        }
        if value.contains('\0') {
            return Err(invalid(format!(
                "{field}: the value of {name} contains NUL"
            )));
        }
    }
    Ok(())
}

pub(crate) fn invalid(message: impl Into<String>) -> Error {
    Error::InvalidArgument(message.into())
}

/// Builds the wire form of one event.
pub(crate) fn run_response(event: Event) -> RunResponse {
    let Event { index, time, kind } = event;
    let kind = match kind {
        ObservationKind::CmdStart { command, pid } => {
            run_response::Kind::CmdStart(api::CmdStart { command, pid })
        }
        ObservationKind::CmdOutput { stream, data } => {
            run_response::Kind::CmdOutput(api::CmdOutput {
                stream: output_stream(stream) as i32,
                data,
            })
        }
        ObservationKind::CmdEnd(end) => run_response::Kind::CmdEnd(cmd_end(end)),
        ObservationKind::IPythonStart {
            code,
            execution_count,
        } => run_response::Kind::IpythonStart(api::IPythonStart {
            code,
            execution_count,
        }),
        ObservationKind::IPythonOutput(output) => {
            run_response::Kind::IpythonOutput(ipython::cell_output(output))
        }
        ObservationKind::IPythonResult(result) => {
            run_response::Kind::IpythonResult(ipython::cell_result(result))
        }
        ObservationKind::Error { message, details } => {
            run_response::Kind::Error(api::ErrorObservation {
                message,
                details: details.into_iter().collect(),
            })
        }
        ObservationKind::AgentState { message, details } => {
            run_response::Kind::AgentState(api::AgentState {
                message,
                details: details.into_iter().collect(),
            })
        }
    };
    RunResponse {
        index,
        time: Some(time.into()),
        kind: Some(kind),
    }
}

fn output_stream(stream: OutputStream) -> api::OutputStream {
    match stream {
        OutputStream::Stdout => api::OutputStream::Stdout,
        OutputStream::Stderr => api::OutputStream::Stderr,
    }
}

fn cmd_end(end: CmdEnd) -> api::CmdEnd {
    let reason = match end.reason {
        EndReason::Exited => api::EndReason::Exited,
        EndReason::TimedOut => api::EndReason::TimedOut,
        EndReason::Cancelled => api::EndReason::Cancelled,
        EndReason::Lost => api::EndReason::Lost,
        EndReason::FailedToStart => api::EndReason::FailedToStart,
        EndReason::OomKilled => api::EndReason::OomKilled,
        EndReason::PidsLimitReached => api::EndReason::PidsLimitReached,
    };
    api::CmdEnd {
        exit_code: end.exit_code,
        reason: reason as i32,
        // Fails only for durations beyond i64 seconds, which no command reaches.
        duration: prost_types::Duration::try_from(end.duration).ok(),
        signal: end.signal,
        message: end.message,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::SystemTime;

    use super::*;

    fn shell_request(action_id: &str, shell: api::ShellAction) -> RunRequest {
        RunRequest {
            action_id: action_id.into(),
            action: Some(api::Action {
                kind: Some(action::Kind::Shell(shell)),
            }),
            env: HashMap::new(),
        }
    }

    fn command(c: &str) -> api::ShellAction {
        api::ShellAction {
            command: c.into(),
            ..Default::default()
        }
    }

    fn expect_invalid(request: RunRequest) {
        match run_request(request) {
            Err(Error::InvalidArgument(_)) => {}
            other => panic!("expected InvalidArgument, got {other:?}"),
        }
    }

    #[test]
    fn accepts_a_plain_shell_action() {
        let mut shell = command("echo hi");
        shell.timeout_seconds = 7;
        let (id, spec) = run_request(shell_request("a1", shell)).unwrap();
        assert_eq!(id, "a1");
        let ActionSpec::Shell(spec) = spec else {
            panic!("not shell")
        };
        assert_eq!(spec.command, "echo hi");
        assert_eq!(spec.timeout, Some(Duration::from_secs(7)));
        let (_, ActionSpec::Shell(spec)) = run_request(shell_request("a2", command("x"))).unwrap()
        else {
            panic!("not shell")
        };
        assert_eq!(spec.timeout, None, "0 means the default");
    }

    #[test]
    fn rejects_malformed_requests() {
        expect_invalid(shell_request("", command("true")));
        expect_invalid(shell_request("a\nb", command("true")));
        expect_invalid(shell_request(&"x".repeat(200), command("true")));
        expect_invalid(shell_request("a", command("")));
        expect_invalid(shell_request("a", command("   ")));
        expect_invalid(shell_request("a", command("echo \0")));
        let mut bad_env = command("true");
        bad_env.env.insert("A=B".into(), "x".into());
        expect_invalid(shell_request("a", bad_env));
        let mut empty_name = shell_request("a", command("true"));
        empty_name.env.insert(String::new(), "x".into());
        expect_invalid(empty_name);
        expect_invalid(RunRequest {
            action_id: "a".into(),
            action: None,
            env: HashMap::new(),
        });
        expect_invalid(RunRequest {
            action_id: "a".into(),
            action: Some(api::Action { kind: None }),
            env: HashMap::new(),
        });
    }

    #[test]
    fn ipython_is_recognised() {
        let request = RunRequest {
            action_id: "a".into(),
            action: Some(api::Action {
                kind: Some(action::Kind::Ipython(api::IPythonAction {
                    code: "1+1".into(),
                    timeout_seconds: 0,
                    rollback_on_error: None,
                })),
            }),
            env: HashMap::from([("K".to_owned(), "v".to_owned())]),
        };
        let Ok((_, ActionSpec::IPython(spec))) = run_request(request) else {
            panic!("not ipython")
        };
        assert_eq!(spec.code, "1+1");
        assert!(spec.rollback_on_error, "unset means true");
        assert_eq!(spec.timeout, None);
        assert_eq!(spec.sandbox_env.get("K").map(String::as_str), Some("v"));
    }

    #[test]
    fn events_become_responses() {
        let response = run_response(Event {
            index: 3,
            time: SystemTime::UNIX_EPOCH,
            kind: ObservationKind::CmdEnd(CmdEnd {
                exit_code: 137,
                reason: EndReason::Exited,
                duration: Duration::from_millis(1500),
                signal: 9,
                message: String::new(),
            }),
        });
        assert_eq!(response.index, 3);
        let Some(run_response::Kind::CmdEnd(end)) = response.kind else {
            panic!("not cmd_end")
        };
        assert_eq!(end.reason, api::EndReason::Exited as i32);
        assert_eq!(end.signal, 9);
        let duration = end.duration.unwrap();
        assert_eq!((duration.seconds, duration.nanos), (1, 500_000_000));
    }
}
