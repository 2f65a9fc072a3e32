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

/// The action as the executor receives it.
pub fn action_to_proto(action: &Action) -> api::Action {
    let kind = match action {
        Action::Shell(s) => api::action::Kind::Shell(api::ShellAction {
            command: s.command.clone(),
            work_dir: s.work_dir.clone(),
            env: s.env.clone().into_iter().collect(),
            timeout_seconds: u32::try_from(s.timeout.as_secs()).unwrap_or(u32::MAX),
            stdin: s.stdin.clone(),
            keep_stdin_open: s.keep_stdin_open,
            session: s.session.clone().unwrap_or_default(),
        }),
        Action::IPython(c) => api::action::Kind::Ipython(api::IPythonAction {
            code: c.code.clone(),
            timeout_seconds: u32::try_from(c.timeout.as_secs()).unwrap_or(u32::MAX),
            rollback_on_error: Some(c.rollback_on_error),
        }),
    };
    api::Action { kind: Some(kind) }
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
    fn shell_round_trips() {
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
        let action = action_from_proto(Some(proto.clone())).expect("valid");
        assert_eq!(action_to_proto(&action), proto);
        let in_session = api::Action {
            kind: Some(api::action::Kind::Shell(api::ShellAction {
                command: "cd /tmp".into(),
                session: "work".into(),
                ..Default::default()
            })),
        };
        let action = action_from_proto(Some(in_session)).expect("valid");
        assert_eq!(
            action_to_proto(&action).kind.and_then(|k| match k {
                api::action::Kind::Shell(s) => Some(s.session),
                api::action::Kind::Ipython(_) => None,
            }),
            Some("work".to_owned())
        );
    }
}
