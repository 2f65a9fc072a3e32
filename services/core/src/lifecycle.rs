//! The sandbox lifecycle as one table: which state may move to which, and why it would. The runtime moves a
//! sandbox only through this table (its `enter`); docs/ARCHITECTURE.md, "Sandbox lifecycle", shows it.

use crate::error::{Error, Reason, Resource};
use crate::ids::SandboxId;
use crate::sandbox::SandboxState;

use SandboxState::{
    Creating, Failed, Paused, Pausing, Resuming, Running, Terminated, Terminating, Unhealthy,
};

/// One allowed move, with the message its `agent_state` observation carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Move {
    pub from: SandboxState,
    pub to: SandboxState,
    /// What happened, for the `agent_state` observation (`sandbox paused`).
    pub message: &'static str,
    /// When the runtime makes this move.
    pub when: &'static str,
}

const fn mv(
    from: SandboxState,
    to: SandboxState,
    message: &'static str,
    when: &'static str,
) -> Move {
    Move {
        from,
        to,
        message,
        when,
    }
}

/// Every allowed move. Anything else is refused.
pub const MOVES: &[Move] = &[
    mv(
        Creating,
        Running,
        "sandbox ready",
        "the executor answers its health check (cold create or pool claim)",
    ),
    mv(
        Creating,
        Failed,
        "sandbox failed to start",
        "the container or executor did not come up, or a pool member could not be bound",
    ),
    mv(
        Running,
        Pausing,
        "sandbox pausing",
        "PauseSandbox or the idle reaper, with no action running",
    ),
    mv(
        Pausing,
        Paused,
        "sandbox paused",
        "the backend froze the container",
    ),
    mv(
        Pausing,
        Running,
        "sandbox pause failed",
        "the backend could not freeze the container",
    ),
    mv(
        Paused,
        Resuming,
        "sandbox resuming",
        "ResumeSandbox, or auto_resume on the next action or file call",
    ),
    mv(
        Resuming,
        Running,
        "sandbox resumed",
        "thawed, and the executor answers",
    ),
    mv(
        Resuming,
        Paused,
        "sandbox resume failed",
        "the backend could not thaw the container",
    ),
    mv(
        Resuming,
        Unhealthy,
        "executor unreachable after resume",
        "thawed, but the executor does not answer (the health watch brings it back)",
    ),
    mv(
        Running,
        Unhealthy,
        "executor unreachable",
        "two health checks in a row failed",
    ),
    mv(
        Unhealthy,
        Running,
        "executor reachable again",
        "the executor answers again, or was brought back (container started again, new address)",
    ),
    mv(
        Running,
        Terminating,
        "sandbox terminating",
        "DeleteSandbox, the reaper (maximum lifetime, idle policy delete), space deletion with force",
    ),
    mv(
        Paused,
        Terminating,
        "sandbox terminating",
        "as from RUNNING",
    ),
    mv(
        Unhealthy,
        Terminating,
        "sandbox terminating",
        "as from RUNNING, or the container is gone for good",
    ),
    mv(
        Terminating,
        Terminated,
        "sandbox terminated",
        "running actions ended (LOST), container and workspace removed",
    ),
];

/// The move from `from` to `to`, when the table allows it.
pub fn find(from: SandboxState, to: SandboxState) -> Option<&'static Move> {
    MOVES.iter().find(|m| m.from == from && m.to == to)
}

/// The move from `from` to `to`; FailedPrecondition naming both states when the table has none.
pub fn check(id: SandboxId, from: SandboxState, to: SandboxState) -> Result<&'static Move, Error> {
    find(from, to).ok_or_else(|| {
        Error::new(
            state_reason(from),
            format!("sandbox {id} is {from}, it cannot become {to}"),
        )
        .about(Resource::sandbox(id))
    })
}

/// FailedPrecondition for a call that needs the sandbox in one of `allowed`, naming its state.
pub fn refuse(id: SandboxId, now: SandboxState, call: &str, allowed: &[SandboxState]) -> Error {
    let allowed: Vec<&str> = allowed.iter().map(|s| s.name()).collect();
    Error::new(
        state_reason(now),
        format!(
            "sandbox {id} is {now}; {call} needs it {}",
            allowed.join(" or ")
        ),
    )
    .about(Resource::sandbox(id))
}

/// Why a sandbox in `state` cannot do what was asked: it is paused (resume it), has ended (make another),
/// or is on its way between states.
pub fn state_reason(state: SandboxState) -> Reason {
    match state {
        Paused => Reason::SandboxPaused,
        Terminating | Terminated | Failed => Reason::SandboxEnded,
        Creating | Running | Pausing | Resuming | Unhealthy => Reason::SandboxNotRunning,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: [SandboxState; 9] = [
        Creating,
        Running,
        Pausing,
        Paused,
        Resuming,
        Unhealthy,
        Terminating,
        Terminated,
        Failed,
    ];

    #[test]
    fn final_states_have_no_way_out_and_every_other_state_has_one() {
        for s in ALL {
            let out = MOVES.iter().filter(|m| m.from == s).count();
            assert_eq!(out == 0, s.is_final(), "{s}: {out} moves out");
        }
    }

    #[test]
    fn every_state_but_creating_is_reached_and_moves_are_listed_once() {
        for s in ALL {
            let into = MOVES.iter().filter(|m| m.to == s).count();
            assert_eq!(into == 0, s == Creating, "{s}: {into} moves in");
        }
        for (i, a) in MOVES.iter().enumerate() {
            assert!(
                MOVES[i + 1..]
                    .iter()
                    .all(|b| (a.from, a.to) != (b.from, b.to)),
                "{a:?} twice"
            );
            assert_ne!(a.from, a.to, "{a:?}");
        }
    }

    #[test]
    fn transitional_states_end_in_a_settled_one_and_terminating_only_ends() {
        let out = |s| -> Vec<SandboxState> {
            MOVES.iter().filter(|m| m.from == s).map(|m| m.to).collect()
        };
        assert_eq!(out(Pausing), [Paused, Running]);
        assert_eq!(out(Resuming), [Running, Paused, Unhealthy]);
        assert_eq!(out(Terminating), [Terminated]);
        // Nothing that is being created, paused or resumed is deleted from under that work.
        for s in [Creating, Pausing, Resuming] {
            assert!(find(s, Terminating).is_none(), "{s}");
        }
    }

    #[test]
    fn a_refused_move_names_the_state() {
        let id = SandboxId::new();
        let e = check(id, Paused, Running).expect_err("PAUSED cannot become RUNNING");
        assert!(
            matches!(&e, Error::FailedPrecondition(m) if m.message().contains("PAUSED") && m.message().contains("RUNNING")),
            "{e:?}"
        );
        assert_eq!(e.reason(), Reason::SandboxPaused);
        assert_eq!(e.resources(), [Resource::sandbox(id)].as_slice());
        let e = refuse(id, Terminated, "Execute", &[Running]);
        assert_eq!(e.reason(), Reason::SandboxEnded);
        assert_eq!(
            refuse(id, Resuming, "Execute", &[Running]).reason(),
            Reason::SandboxNotRunning
        );
        assert_eq!(
            check(id, Running, Pausing).expect("a move").message,
            "sandbox pausing"
        );
    }
}
