//! Why a request failed, in words a program can match on: each reason is a stable `SCREAMING_SNAKE` name in
//! one [`DOMAIN`] and belongs to exactly one status code. Clients get it as `google.rpc.ErrorInfo.reason`
//! (and in Connect's `Rejected.reason`); the executor tells the control plane the same way. The table in
//! docs/ARCHITECTURE.md, "Errors and statuses", lists them.

use std::time::Duration;

/// The `google.rpc.ErrorInfo.domain` every reason belongs to.
pub const DOMAIN: &str = "mentis.dev";

/// The status code classes a reason can belong to (the canonical gRPC codes the API uses; this crate has
/// no tonic).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Code {
    InvalidArgument,
    NotFound,
    AlreadyExists,
    FailedPrecondition,
    ResourceExhausted,
    Unavailable,
    Unauthenticated,
    PermissionDenied,
    OutOfRange,
    Internal,
}

impl Code {
    /// The canonical name (`INVALID_ARGUMENT`, ...).
    pub fn name(self) -> &'static str {
        match self {
            Self::InvalidArgument => "INVALID_ARGUMENT",
            Self::NotFound => "NOT_FOUND",
            Self::AlreadyExists => "ALREADY_EXISTS",
            Self::FailedPrecondition => "FAILED_PRECONDITION",
            Self::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Self::Unavailable => "UNAVAILABLE",
            Self::Unauthenticated => "UNAUTHENTICATED",
            Self::PermissionDenied => "PERMISSION_DENIED",
            Self::OutOfRange => "OUT_OF_RANGE",
            Self::Internal => "INTERNAL",
        }
    }

    /// The reason that says no more than the code does: what an error without a more specific one gets.
    pub fn generic_reason(self) -> Reason {
        match self {
            Self::InvalidArgument => Reason::InvalidArgument,
            Self::NotFound => Reason::NotFound,
            Self::AlreadyExists => Reason::AlreadyExists,
            Self::FailedPrecondition => Reason::FailedPrecondition,
            Self::ResourceExhausted => Reason::ResourceExhausted,
            Self::Unavailable => Reason::Unavailable,
            Self::Unauthenticated => Reason::Unauthenticated,
            Self::PermissionDenied => Reason::PermissionDenied,
            Self::OutOfRange => Reason::OutOfRange,
            Self::Internal => Reason::Internal,
        }
    }
}

/// Declares [`Reason`]: each variant with its name, its code and how long a client should wait before
/// retrying (none: retrying the same request cannot help).
macro_rules! reasons {
    ($( $(#[doc = $doc:literal])* $variant:ident = $name:literal, $code:ident, $retry:expr; )*) => {
        /// A stable, machine-readable reason for an error (`google.rpc.ErrorInfo.reason`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Reason {
            $( $(#[doc = $doc])* $variant, )*
        }

        impl Reason {
            /// Every reason, in the order of the table.
            pub const ALL: &[Reason] = &[$(Reason::$variant),*];

            /// The stable name (`SANDBOX_NOT_FOUND`).
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $name,)* }
            }

            /// The status code every error with this reason has.
            pub fn code(self) -> Code {
                match self { $(Self::$variant => Code::$code,)* }
            }

            /// How long to wait before trying again, for reasons a retry can cure.
            pub fn retry_after(self) -> Option<Duration> {
                match self { $(Self::$variant => $retry,)* }
            }
        }
    };
}

const fn secs(n: u64) -> Option<Duration> {
    Some(Duration::from_secs(n))
}

reasons! {
    /// A malformed request field (`google.rpc.BadRequest` names it when known).
    InvalidArgument = "INVALID_ARGUMENT", InvalidArgument, None;
    /// CreateSandbox's spec breaks a rule: limits out of range, an image reference, env, labels, key.
    InvalidSpec = "INVALID_SPEC", InvalidArgument, None;
    /// An action breaks a rule: empty or oversized code or stdin, env, timeout.
    InvalidAction = "INVALID_ACTION", InvalidArgument, None;

    /// A terminal request breaks a rule: size, command, env, signal name, or a first message that is not start
    /// or attach.
    InvalidTerminal = "INVALID_TERMINAL", InvalidArgument, None;
    /// No sandbox has this id.
    SandboxNotFound = "SANDBOX_NOT_FOUND", NotFound, None;
    /// No space has this id.
    SpaceNotFound = "SPACE_NOT_FOUND", NotFound, None;
    /// The sandbox knows no action with this id.
    ActionNotFound = "ACTION_NOT_FOUND", NotFound, None;
    /// No live sandbox carries this external key in the space.
    ExternalKeyNotFound = "EXTERNAL_KEY_NOT_FOUND", NotFound, None;
    /// The sandbox has no terminal with this id (never started, or closed and forgotten).
    TerminalNotFound = "TERMINAL_NOT_FOUND", NotFound, None;
    /// The sandbox has no process with this pid (it ended, or never was).
    ProcessNotFound = "PROCESS_NOT_FOUND", NotFound, None;
    /// No API key has this id.
    ApiKeyNotFound = "API_KEY_NOT_FOUND", NotFound, None;
    /// No snapshot has this id.
    SnapshotNotFound = "SNAPSHOT_NOT_FOUND", NotFound, None;
    /// No file or directory at this workspace path.
    PathNotFound = "PATH_NOT_FOUND", NotFound, None;
    /// The sandbox's container vanished; the sandbox ends.
    ContainerGone = "CONTAINER_GONE", NotFound, None;
    /// Not found, nothing more specific known.
    NotFound = "NOT_FOUND", NotFound, None;

    /// A space with this id exists.
    SpaceExists = "SPACE_EXISTS", AlreadyExists, None;
    /// The action id is already used in the sandbox by a different action.
    ActionIdReused = "ACTION_ID_REUSED", AlreadyExists, None;
    /// Something exists at this workspace path.
    PathExists = "PATH_EXISTS", AlreadyExists, None;
    /// Already exists, nothing more specific known.
    AlreadyExists = "ALREADY_EXISTS", AlreadyExists, None;

    /// The sandbox is PAUSED: resume it (or set auto_resume).
    SandboxPaused = "SANDBOX_PAUSED", FailedPrecondition, None;
    /// The sandbox is between states (CREATING, PAUSING, RESUMING).
    SandboxNotRunning = "SANDBOX_NOT_RUNNING", FailedPrecondition, None;
    /// The sandbox is TERMINATING, TERMINATED or FAILED: it will not run again.
    SandboxEnded = "SANDBOX_ENDED", FailedPrecondition, None;
    /// Actions still run (a pause waits for none).
    ActionsRunning = "ACTIONS_RUNNING", FailedPrecondition, None;
    /// The action has ended (stdin to a finished action).
    ActionEnded = "ACTION_ENDED", FailedPrecondition, None;
    /// The space still has sandboxes (delete them, or pass force).
    SpaceNotEmpty = "SPACE_NOT_EMPTY", FailedPrecondition, None;
    /// The default space cannot be deleted.
    DefaultSpace = "DEFAULT_SPACE", FailedPrecondition, None;
    /// A snapshot's archive fails its checksum, cannot be unpacked, or is missing from the store.
    SnapshotCorrupt = "SNAPSHOT_CORRUPT", FailedPrecondition, None;
    /// The sandbox's image is not on the machine.
    ImageMissing = "IMAGE_MISSING", FailedPrecondition, None;
    /// Authentication is disabled, so API keys would not be checked.
    AuthDisabled = "AUTH_DISABLED", FailedPrecondition, None;
    /// A failed precondition, nothing more specific known (the message says which).
    FailedPrecondition = "FAILED_PRECONDITION", FailedPrecondition, None;

    /// The runtime holds MENTIS_MAX_SANDBOXES live sandboxes.
    RuntimeQuotaExceeded = "RUNTIME_QUOTA_EXCEEDED", ResourceExhausted, secs(10);
    /// The space holds its max_sandboxes live sandboxes.
    SpaceQuotaExceeded = "SPACE_QUOTA_EXCEEDED", ResourceExhausted, secs(10);
    /// The sandbox runs MENTIS_MAX_ACTIONS_PER_SANDBOX actions (or its executor its own bound).
    TooManyActions = "TOO_MANY_ACTIONS", ResourceExhausted, secs(1);
    /// The sandbox holds as many shell sessions as it may (32).
    TooManySessions = "TOO_MANY_SESSIONS", ResourceExhausted, None;
    /// The sandbox runs MENTIS_MAX_TERMINALS_PER_SANDBOX terminals.
    TooManyTerminals = "TOO_MANY_TERMINALS", ResourceExhausted, secs(1);
    /// Too many IPython cells wait for the kernel.
    CellQueueFull = "CELL_QUEUE_FULL", ResourceExhausted, secs(1);
    /// A write, upload or edit over its size cap.
    FileTooLarge = "FILE_TOO_LARGE", ResourceExhausted, None;
    /// The workspace's disk is full.
    WorkspaceFull = "WORKSPACE_FULL", ResourceExhausted, None;
    /// The client stopped reading its stream: reconnect and resume after the last seq.
    ClientTooSlow = "CLIENT_TOO_SLOW", ResourceExhausted, secs(0);
    /// A request message over the size limit (MENTIS_MAX_MESSAGE_BYTES), compressed or once decompressed.
    MessageTooLarge = "MESSAGE_TOO_LARGE", ResourceExhausted, None;
    /// A limit reached, nothing more specific known.
    ResourceExhausted = "RESOURCE_EXHAUSTED", ResourceExhausted, secs(1);

    /// The runtime is shutting down or restarting: reconnect and resume.
    ShuttingDown = "SHUTTING_DOWN", Unavailable, secs(5);
    /// The container engine does not answer.
    EngineUnavailable = "ENGINE_UNAVAILABLE", Unavailable, secs(5);
    /// The sandbox's executor (or its kernel) does not answer now.
    ExecutorUnavailable = "EXECUTOR_UNAVAILABLE", Unavailable, secs(1);
    /// The sandbox is UNHEALTHY; the runtime is bringing its executor back.
    SandboxUnhealthy = "SANDBOX_UNHEALTHY", Unavailable, secs(5);
    /// The sandbox is being deleted.
    SandboxDeleting = "SANDBOX_DELETING", Unavailable, secs(1);
    /// Unavailable, nothing more specific known.
    Unavailable = "UNAVAILABLE", Unavailable, secs(1);

    /// No credentials, or not `Bearer <key>`.
    ApiKeyMissing = "API_KEY_MISSING", Unauthenticated, None;
    /// The runtime knows no such key.
    ApiKeyUnknown = "API_KEY_UNKNOWN", Unauthenticated, None;
    /// The key has been revoked.
    ApiKeyRevoked = "API_KEY_REVOKED", Unauthenticated, None;
    /// Not authenticated, nothing more specific known.
    Unauthenticated = "UNAUTHENTICATED", Unauthenticated, None;

    /// The key is scoped to other spaces.
    SpaceNotAllowed = "SPACE_NOT_ALLOWED", PermissionDenied, None;
    /// The call needs the admin key.
    AdminRequired = "ADMIN_REQUIRED", PermissionDenied, None;
    /// A key of a space names an image of another space that is not shared, or an image by its id.
    ImageNotAllowed = "IMAGE_NOT_ALLOWED", PermissionDenied, None;
    /// Denied, nothing more specific known.
    PermissionDenied = "PERMISSION_DENIED", PermissionDenied, None;

    /// `after_seq` is beyond the sandbox's newest seq (no observation has that seq yet).
    SeqOutOfRange = "SEQ_OUT_OF_RANGE", OutOfRange, None;
    /// Out of range, nothing more specific known.
    OutOfRange = "OUT_OF_RANGE", OutOfRange, None;

    /// A failure of the service; the message carries an error id to quote.
    Internal = "INTERNAL", Internal, None;
}

impl Reason {
    /// The reason with this name, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|r| r.as_str() == name)
    }

    /// Whether this is its code's generic reason (it says no more than the code).
    pub fn is_generic(self) -> bool {
        self.code().generic_reason() == self
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_screaming_snake_and_parse_back() {
        let mut seen = std::collections::HashSet::new();
        for r in Reason::ALL {
            let name = r.as_str();
            assert!(seen.insert(name), "{name} twice");
            assert!(
                name.bytes().all(|b| b.is_ascii_uppercase() || b == b'_'),
                "{name}"
            );
            assert_eq!(Reason::from_name(name), Some(*r));
        }
        assert_eq!(Reason::from_name("sandbox_not_found"), None);
    }

    #[test]
    fn each_code_has_its_generic_reason_named_after_it() {
        for r in Reason::ALL {
            let generic = r.code().generic_reason();
            assert_eq!(generic.code(), r.code());
            assert_eq!(generic.as_str(), r.code().name());
            assert_eq!(r.is_generic(), *r == generic);
        }
    }

    #[test]
    fn the_errors_guide_and_the_architecture_list_every_reason() {
        let guide = include_str!("../../../docs/ERRORS.md");
        let architecture = include_str!("../../../docs/ARCHITECTURE.md");
        for r in Reason::ALL {
            let name = format!("`{r}`");
            assert!(guide.contains(&name), "docs/ERRORS.md does not list {r}");
            assert!(
                architecture.contains(r.as_str()),
                "docs/ARCHITECTURE.md does not list {r}"
            );
        }
        assert!(guide.contains(DOMAIN) && architecture.contains(DOMAIN));
    }

    #[test]
    fn only_waits_that_can_end_come_with_a_retry_delay() {
        for r in Reason::ALL {
            if r.retry_after().is_some() {
                assert!(
                    matches!(r.code(), Code::ResourceExhausted | Code::Unavailable),
                    "{r}"
                );
            }
        }
        assert_eq!(Reason::FileTooLarge.retry_after(), None);
        assert!(Reason::Unavailable.retry_after().is_some());
        assert!(Reason::SandboxUnhealthy.retry_after().is_some());
    }
}
