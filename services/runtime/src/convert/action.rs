//! Actions: proto → validated domain action (client input) and back (to the executor).

use mentis_core::{Action, Error, IPythonAction, Reason, ShellAction};
use mentis_proto::api;

/// Validates a client's action; every problem is an INVALID_ACTION naming the field (`action.…`, its
/// path in Execute and in Connect's submit).
pub fn action_from_proto(action: Option<api::Action>) -> Result<Action, Error> {
    checked(action).map_err(|e| e.within("action").with_reason(Reason::InvalidAction))
}

fn checked(action: Option<api::Action>) -> Result<Action, Error> {
    let kind = action
        .and_then(|a| a.kind)
        .ok_or_else(|| Error::invalid("action is required: set action.shell or action.ipython"))?;
    Ok(match kind {
        api::action::Kind::Shell(s) => Action::Shell(ShellAction::validate(
            s.command,
            s.work_dir,
            s.env.into_iter().collect(),
            s.timeout_seconds,
            s.stdin,
            s.keep_stdin_open,
            s.session,
        )?),
        api::action::Kind::Ipython(c) => Action::IPython(IPythonAction::validate(
            c.code,
            c.timeout_seconds,
            c.rollback_on_error.unwrap_or(true),
        )?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_action_is_invalid() {
        assert!(matches!(
            action_from_proto(None),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            action_from_proto(Some(api::Action { kind: None })),
            Err(Error::InvalidArgument(_))
        ));
        let e = action_from_proto(None).expect_err("no action");
        assert_eq!(
            (e.reason(), e.field()),
            (Reason::InvalidAction, Some("action"))
        );
    }

    #[test]
    fn a_bad_action_names_its_field_in_the_request() {
        let shell = |command: &str, timeout_seconds| {
            action_from_proto(Some(api::Action {
                kind: Some(api::action::Kind::Shell(api::ShellAction {
                    command: command.into(),
                    timeout_seconds,
                    ..Default::default()
                })),
            }))
        };
        for (r, field) in [
            (shell(" ", 0), "action.shell.command"),
            (shell("true", u32::MAX), "action.shell.timeout_seconds"),
        ] {
            let e = r.expect_err(field);
            assert_eq!(
                (e.reason(), e.field()),
                (Reason::InvalidAction, Some(field))
            );
        }
    }

    #[test]
    fn a_shell_action_converts_field_by_field() {
        let proto = api::Action {
            kind: Some(api::action::Kind::Shell(api::ShellAction {
                command: "echo hi".into(),
                work_dir: "sub".into(),
                env: [("A".to_owned(), "1".to_owned())].into(),
                timeout_seconds: 7,
                stdin: bytes::Bytes::from_static(b"in"),
                keep_stdin_open: true,
                session: String::new(),
            })),
        };
        let Action::Shell(shell) = action_from_proto(Some(proto)).expect("valid") else {
            panic!("a shell action stays one");
        };
        assert_eq!(
            (
                shell.command.as_str(),
                shell.work_dir.as_str(),
                shell.timeout.as_secs()
            ),
            ("echo hi", "sub", 7)
        );
        assert_eq!(shell.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(
            (&shell.stdin[..], shell.keep_stdin_open, shell.session),
            (&b"in"[..], true, None)
        );
        let in_session = api::Action {
            kind: Some(api::action::Kind::Shell(api::ShellAction {
                command: "cd /tmp".into(),
                session: "work".into(),
                ..Default::default()
            })),
        };
        let Action::Shell(shell) = action_from_proto(Some(in_session)).expect("valid") else {
            panic!("a shell action stays one");
        };
        assert_eq!(shell.session.as_deref(), Some("work"));
    }
}
