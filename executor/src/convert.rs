//! The edge, used by the server alone: proto requests become the shared model's validated actions (in the
//! executor's specs), and domain events become proto responses. Nothing below the server sees proto.

mod ipython;

use mentis_model::action::validate_action_id;
use mentis_model::env::validate_env;
use mentis_model::{CmdEnd, EndReason, ObservationKind, OutputStream, ShellAction};
use mentis_proto::executor::{self as api, action};
use mentis_proto::executor::{RunRequest, RunResponse, run_response};

use crate::actions::ActionSpec;
use crate::error::Error;
use crate::events::Event;
use crate::ipython::CellSpec;
use crate::shell::ShellSpec;

pub(crate) use ipython::{inspect_names, variable_summaries};

/// Validates a Run request into the action's id and spec, by the model's rules and limits (the ones the
/// control plane applied already).
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
        action::Kind::Shell(shell) => {
            let action = shell_action(shell)?;
            validate_env(&sandbox_env, "env")?;
            ActionSpec::Shell(ShellSpec {
                action,
                sandbox_env,
            })
        }
        action::Kind::Ipython(cell) => {
            let action = ipython::cell_action(cell)?;
            validate_env(&sandbox_env, "env")?;
            ActionSpec::IPython(CellSpec {
                action,
                sandbox_env,
            })
        }
    };
    Ok((action_id, spec))
}

/// Validates the action id of Cancel / WriteStdin (and Run).
pub(crate) fn action_id_arg(action_id: String) -> Result<String, Error> {
    validate_action_id(&action_id)?;
    Ok(action_id)
}

fn shell_action(shell: api::ShellAction) -> Result<ShellAction, Error> {
    let api::ShellAction {
        command,
        work_dir,
        env,
        timeout_seconds,
        stdin,
        keep_stdin_open,
        session,
    } = shell;
    Ok(ShellAction::validate(
        command,
        work_dir,
        env.into_iter().collect(),
        timeout_seconds,
        stdin,
        keep_stdin_open,
        session,
    )?)
}

fn invalid(message: impl Into<String>) -> Error {
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

    use std::collections::HashMap;
    use std::time::{Duration, SystemTime};

    use bytes::Bytes;
    use mentis_model::action::{
        DEFAULT_TIMEOUT, MAX_ACTION_ID_LEN, MAX_CODE_BYTES, MAX_INLINE_STDIN, MAX_REQUEST_BYTES,
    };
    use mentis_model::env::MAX_ENV_VALUE_BYTES;
    use prost::Message as _;

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
        assert_eq!(spec.action.command, "echo hi");
        assert_eq!(spec.action.timeout, Duration::from_secs(7));
        let (_, ActionSpec::Shell(spec)) = run_request(shell_request("a2", command("x"))).unwrap()
        else {
            panic!("not shell")
        };
        assert_eq!(spec.action.timeout, DEFAULT_TIMEOUT, "0 means the default");
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
        let mut long_value = shell_request("a", command("true"));
        long_value
            .env
            .insert("K".into(), "v".repeat(MAX_ENV_VALUE_BYTES + 1));
        expect_invalid(long_value);
        expect_invalid(shell_request("a", command(&"x".repeat(MAX_CODE_BYTES + 1))));
        let mut big_stdin = command("cat");
        big_stdin.stdin = Bytes::from(vec![0; MAX_INLINE_STDIN + 1]);
        expect_invalid(shell_request("a", big_stdin));
        let mut forever = command("true");
        forever.timeout_seconds = u32::MAX;
        expect_invalid(shell_request("a", forever));
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
        assert_eq!(spec.action.code, "1+1");
        assert!(spec.action.rollback_on_error, "unset means true");
        assert_eq!(spec.action.timeout, DEFAULT_TIMEOUT);
        assert_eq!(spec.sandbox_env.get("K").map(String::as_str), Some("v"));
    }

    #[test]
    fn a_request_at_the_model_limits_fits_the_servers_cap() {
        // The largest code and stdin, the longest id, and 512 KiB of env in each of the two maps: what the
        // model's limits allow, with the envs well within the allowance, must pass the gRPC size cap.
        let env = |prefix: &str| -> HashMap<String, String> {
            (0..8)
                .map(|i| (format!("{prefix}{i}"), "v".repeat(MAX_ENV_VALUE_BYTES)))
                .collect()
        };
        let mut shell = command(&"x".repeat(MAX_CODE_BYTES));
        shell.stdin = Bytes::from(vec![0; MAX_INLINE_STDIN]);
        shell.env = env("ACTION_");
        shell.work_dir = "w".repeat(4096);
        shell.timeout_seconds = 3600;
        let mut request = shell_request(&"i".repeat(MAX_ACTION_ID_LEN), shell);
        request.env = env("SANDBOX_");
        let size = request.encoded_len();
        assert!(size <= MAX_REQUEST_BYTES, "{size} > {MAX_REQUEST_BYTES}");
        assert!(run_request(request).is_ok());
    }

    #[test]
    fn a_bad_sandbox_env_is_refused_for_both_kinds() {
        let bad = HashMap::from([("A=B".to_owned(), "x".to_owned())]);
        let mut shell = shell_request("a", command("true"));
        shell.env.clone_from(&bad);
        expect_invalid(shell);
        expect_invalid(RunRequest {
            action_id: "a".into(),
            action: Some(api::Action {
                kind: Some(action::Kind::Ipython(api::IPythonAction {
                    code: "1".into(),
                    ..Default::default()
                })),
            }),
            env: bad,
        });
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
