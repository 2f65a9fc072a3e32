//! The error enum that crosses crate boundaries. Each variant is one code of the table in
//! docs/ARCHITECTURE.md, "Errors and statuses", and each error has one of its reasons; the API layer is the
//! only place that turns it into a gRPC status.

use std::fmt;
use std::sync::Arc;

pub use mentis_model::reason::{Code, DOMAIN, Reason};

/// What went wrong, classified by what the caller can do about it. Each error also has a [`Reason`] (of
/// its variant's code) and may name the resources and the request field it is about: see [`Detail`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Malformed request, unknown action kind, bad spec.
    #[error("{0}")]
    InvalidArgument(Detail),
    /// Unknown sandbox, space or action.
    #[error("{0}")]
    NotFound(Detail),
    /// A client-chosen id is already used.
    #[error("{0}")]
    AlreadyExists(Detail),
    /// The target is in the wrong state (sandbox not RUNNING, ...).
    #[error("{0}")]
    FailedPrecondition(Detail),
    /// A configured limit was reached.
    #[error("{0}")]
    ResourceExhausted(Detail),
    /// Docker or the executor is unreachable, or the service is shutting down. Keeps the error it came
    /// from, for the log.
    #[error("{0}")]
    Unavailable(#[source] Detail),
    /// No credentials, or credentials the runtime does not know (or has revoked).
    #[error("{0}")]
    Unauthenticated(Detail),
    /// Known credentials that do not allow this call (another space, an admin-only call).
    #[error("{0}")]
    PermissionDenied(Detail),
    /// A value past the end of what exists (an `after_seq` beyond the newest seq).
    #[error("{0}")]
    OutOfRange(Detail),
    /// Anything else. The message and the error it came from are for the log, not for the client.
    #[error("{0}")]
    Internal(#[source] Detail),
}

/// What an error says: its message, its reason when more specific than its code, the resources and the
/// request field it is about, and (Unavailable and Internal only) the error it came from.
#[derive(Clone)]
pub struct Detail {
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
    /// `None`: the generic reason of the variant's code.
    reason: Option<Reason>,
    about: Option<Box<About>>,
}

/// The resources and the field an error is about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct About {
    resources: Vec<Resource>,
    field: Option<String>,
}

/// A resource an error is about: a sandbox, a space, an action, ...
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resource {
    pub kind: ResourceKind,
    /// Its id (an external key's key).
    pub name: String,
}

/// The kinds of [`Resource`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResourceKind {
    Sandbox,
    Space,
    Action,
    ApiKey,
    ExternalKey,
    Template,
}

impl ResourceKind {
    /// Its name as a client sees it (`google.rpc.ResourceInfo.resource_type`).
    pub fn type_name(self) -> &'static str {
        match self {
            Self::Sandbox => "sandbox",
            Self::Space => "space",
            Self::Action => "action",
            Self::ApiKey => "api_key",
            Self::ExternalKey => "external_key",
            Self::Template => "template",
        }
    }

    /// The key of its id in `google.rpc.ErrorInfo.metadata`: the field that carries it in requests.
    pub fn id_key(self) -> &'static str {
        match self {
            Self::Sandbox => "sandbox_id",
            Self::Space => "space_id",
            Self::Action => "action_id",
            Self::ApiKey => "key_id",
            Self::ExternalKey => "external_key",
            Self::Template => "name",
        }
    }
}

impl Resource {
    /// The resource of `kind` named `name`.
    pub fn new(kind: ResourceKind, name: impl fmt::Display) -> Self {
        Self {
            kind,
            name: name.to_string(),
        }
    }

    pub fn sandbox(id: impl fmt::Display) -> Self {
        Self::new(ResourceKind::Sandbox, id)
    }

    pub fn space(id: impl fmt::Display) -> Self {
        Self::new(ResourceKind::Space, id)
    }

    pub fn action(id: impl fmt::Display) -> Self {
        Self::new(ResourceKind::Action, id)
    }

    /// Template `name` of `space` (named `SPACE/NAME`).
    pub fn template(space: impl fmt::Display, name: &str) -> Self {
        Self::new(ResourceKind::Template, format!("{space}/{name}"))
    }
}

impl Detail {
    pub fn message(&self) -> &str {
        &self.message
    }

    fn about(&mut self) -> &mut About {
        self.about.get_or_insert_default()
    }
}

impl fmt::Display for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl fmt::Debug for Detail {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.message)?;
        if let Some(r) = self.reason {
            write!(f, " [{r}]")?;
        }
        if let Some(a) = &self.about {
            write!(f, " {a:?}")?;
        }
        if let Some(s) = &self.source {
            write!(f, " (from {s:?})")?;
        }
        Ok(())
    }
}

impl std::error::Error for Detail {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|s| s as &(dyn std::error::Error + 'static))
    }
}

/// Two details are the same when they say the same (sources are for the log).
impl PartialEq for Detail {
    fn eq(&self, other: &Self) -> bool {
        self.message == other.message && self.reason == other.reason && self.about == other.about
    }
}

impl Eq for Detail {}

impl From<String> for Detail {
    fn from(message: String) -> Self {
        Self {
            message,
            source: None,
            reason: None,
            about: None,
        }
    }
}

impl From<&str> for Detail {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

/// An error and every error under it, `: `-separated, leaving out a cause whose text the level above
/// already includes: what the log shows.
pub struct Chain<'a>(pub &'a (dyn std::error::Error + 'static));

impl fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        f.write_str(&shown)?;
        let mut next = self.0.source();
        while let Some(e) = next {
            let text = e.to_string();
            if !shown.contains(&text) {
                write!(f, ": {text}")?;
                shown = text;
            }
            next = e.source();
        }
        Ok(())
    }
}

/// Result with the shared [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// An error of `reason`'s code saying `message`.
    pub fn new(reason: Reason, message: impl Into<String>) -> Self {
        let mut d = Detail::from(message.into());
        if !reason.is_generic() {
            d.reason = Some(reason);
        }
        match reason.code() {
            Code::InvalidArgument => Self::InvalidArgument(d),
            Code::NotFound => Self::NotFound(d),
            Code::AlreadyExists => Self::AlreadyExists(d),
            Code::FailedPrecondition => Self::FailedPrecondition(d),
            Code::ResourceExhausted => Self::ResourceExhausted(d),
            Code::Unavailable => Self::Unavailable(d),
            Code::Unauthenticated => Self::Unauthenticated(d),
            Code::PermissionDenied => Self::PermissionDenied(d),
            Code::OutOfRange => Self::OutOfRange(d),
            Code::Internal => Self::Internal(d),
        }
    }

    /// [`Error::InvalidArgument`] with `msg` (add the field with [`Error::at`]).
    pub fn invalid(msg: impl Into<String>) -> Self {
        Self::InvalidArgument(Detail::from(msg.into()))
    }

    /// [`Error::Unavailable`] with `message`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::Unavailable(Detail::from(message.into()))
    }

    /// [`Error::Internal`] with `message`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::Internal(Detail::from(message.into()))
    }

    /// SANDBOX_NOT_FOUND for `id`.
    pub fn sandbox_not_found(id: impl fmt::Display) -> Self {
        Self::new(Reason::SandboxNotFound, format!("sandbox {id} not found"))
            .about(Resource::sandbox(id))
    }

    /// SPACE_NOT_FOUND for `id`.
    pub fn space_not_found(id: impl fmt::Display) -> Self {
        Self::new(Reason::SpaceNotFound, format!("space {id} not found")).about(Resource::space(id))
    }

    fn detail(&self) -> &Detail {
        match self {
            Self::InvalidArgument(d)
            | Self::NotFound(d)
            | Self::AlreadyExists(d)
            | Self::FailedPrecondition(d)
            | Self::ResourceExhausted(d)
            | Self::Unavailable(d)
            | Self::Unauthenticated(d)
            | Self::PermissionDenied(d)
            | Self::OutOfRange(d)
            | Self::Internal(d) => d,
        }
    }

    fn detail_mut(&mut self) -> &mut Detail {
        match self {
            Self::InvalidArgument(d)
            | Self::NotFound(d)
            | Self::AlreadyExists(d)
            | Self::FailedPrecondition(d)
            | Self::ResourceExhausted(d)
            | Self::Unavailable(d)
            | Self::Unauthenticated(d)
            | Self::PermissionDenied(d)
            | Self::OutOfRange(d)
            | Self::Internal(d) => d,
        }
    }

    /// The status code class of this error.
    pub fn code(&self) -> Code {
        match self {
            Self::InvalidArgument(_) => Code::InvalidArgument,
            Self::NotFound(_) => Code::NotFound,
            Self::AlreadyExists(_) => Code::AlreadyExists,
            Self::FailedPrecondition(_) => Code::FailedPrecondition,
            Self::ResourceExhausted(_) => Code::ResourceExhausted,
            Self::Unavailable(_) => Code::Unavailable,
            Self::Unauthenticated(_) => Code::Unauthenticated,
            Self::PermissionDenied(_) => Code::PermissionDenied,
            Self::OutOfRange(_) => Code::OutOfRange,
            Self::Internal(_) => Code::Internal,
        }
    }

    /// Why: the reason this error was made with, or its code's generic one.
    pub fn reason(&self) -> Reason {
        self.detail()
            .reason
            .unwrap_or_else(|| self.code().generic_reason())
    }

    /// The same error with `reason`, when `reason` belongs to its code (an error of another code keeps
    /// its own: a validation step may say INVALID_SPEC for everything it refuses without turning a
    /// NOT_FOUND into one).
    pub fn with_reason(mut self, reason: Reason) -> Self {
        if reason.code() == self.code() {
            self.detail_mut().reason = (!reason.is_generic()).then_some(reason);
        }
        self
    }

    /// Names a resource this error is about; the first named is the one `google.rpc.ResourceInfo`
    /// describes, and every one's id goes into `google.rpc.ErrorInfo.metadata`.
    pub fn about(mut self, resource: Resource) -> Self {
        self.detail_mut().about().resources.push(resource);
        self
    }

    /// The resources this error is about, the main one first.
    pub fn resources(&self) -> &[Resource] {
        self.detail()
            .about
            .as_deref()
            .map_or(&[], |a| a.resources.as_slice())
    }

    /// Names the request field at fault (`google.rpc.BadRequest`): its path in the message being checked.
    pub fn at(mut self, field: impl Into<String>) -> Self {
        self.detail_mut().about().field = Some(field.into());
        self
    }

    /// Places this error's field inside `prefix` (`env` in `spec` is `spec.env`); an error without a field
    /// gets `prefix` itself. Only for InvalidArgument errors: others are left as they are.
    pub fn within(mut self, prefix: &str) -> Self {
        if let Self::InvalidArgument(d) = &mut self {
            let about = d.about();
            about.field = Some(match about.field.take() {
                Some(f) => format!("{prefix}.{f}"),
                None => prefix.to_owned(),
            });
        }
        self
    }

    /// The request field at fault, when known.
    pub fn field(&self) -> Option<&str> {
        self.detail().about.as_deref()?.field.as_deref()
    }

    /// Keeps `source` under an Unavailable or Internal error (other kinds are the client's to act on and
    /// carry their whole story in their message).
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        if let Self::Unavailable(d) | Self::Internal(d) = &mut self {
            d.source = Some(Arc::new(source));
        }
        self
    }

    /// The same error, its message led by `what` ("what: message"): where it happened, when the call
    /// that failed is not what the client asked for.
    pub fn context(mut self, what: &str) -> Self {
        let d = self.detail_mut();
        d.message = format!("{what}: {}", d.message);
        self
    }

    /// This error and its causes, for the log.
    pub fn chain(&self) -> Chain<'_> {
        Chain(self)
    }
}

/// A request that breaks a rule of the shared model (an action, an id, an env, a name) is the client's to
/// fix; the model names the field.
impl From<mentis_model::Error> for Error {
    fn from(e: mentis_model::Error) -> Self {
        match e {
            mentis_model::Error::InvalidArgument { field, message } => {
                Self::invalid(message).at(field)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("connection refused")]
    struct Refused;

    #[derive(Debug, thiserror::Error)]
    #[error("transport error")]
    struct Transport(#[source] Refused);

    #[test]
    fn the_chain_keeps_every_cause_once() {
        let e = Error::unavailable("the executor does not answer").with_source(Transport(Refused));
        assert_eq!(e.to_string(), "the executor does not answer");
        assert_eq!(
            e.chain().to_string(),
            "the executor does not answer: transport error: connection refused"
        );
        // A cause already in the message is not repeated.
        let e = Error::unavailable("cannot reach Docker: transport error")
            .with_source(Transport(Refused));
        assert_eq!(
            e.chain().to_string(),
            "cannot reach Docker: transport error: connection refused"
        );
        // Other kinds carry no source.
        let e = Error::invalid("bad").with_source(Refused);
        assert!(std::error::Error::source(&e).is_none());
    }

    #[test]
    fn a_reason_picks_its_code_and_a_generic_one_equals_none() {
        let e = Error::new(Reason::SpaceQuotaExceeded, "full");
        assert!(matches!(&e, Error::ResourceExhausted(d) if d.message() == "full"));
        assert_eq!(e.reason(), Reason::SpaceQuotaExceeded);
        assert_eq!(Error::invalid("x").reason(), Reason::InvalidArgument);
        assert_eq!(
            Error::new(Reason::InvalidArgument, "x"),
            Error::invalid("x")
        );
        assert_ne!(Error::new(Reason::InvalidSpec, "x"), Error::invalid("x"));
        // A reason of another code does not change an error.
        let e = Error::sandbox_not_found("s").with_reason(Reason::InvalidSpec);
        assert_eq!(e.reason(), Reason::SandboxNotFound);
        assert_eq!(
            Error::invalid("x")
                .with_reason(Reason::InvalidSpec)
                .reason(),
            Reason::InvalidSpec
        );
    }

    #[test]
    fn fields_nest_and_resources_keep_their_order() {
        let e = Error::invalid("bad").at("env").within("spec");
        assert_eq!(e.field(), Some("spec.env"));
        assert_eq!(
            Error::invalid("bad").within("action").field(),
            Some("action")
        );
        assert_eq!(Error::sandbox_not_found("s").within("spec").field(), None);
        let model: Error = mentis_model::Error::invalid("shell.command", "empty").into();
        assert_eq!(model.field(), Some("shell.command"));
        assert_eq!(model.to_string(), "empty");
        let e = Error::new(Reason::ActionNotFound, "no")
            .about(Resource::action("a"))
            .about(Resource::sandbox("s"));
        assert_eq!(
            e.resources(),
            [Resource::action("a"), Resource::sandbox("s")].as_slice()
        );
        // Sources stay with the kinds that keep them, reasons and resources with every kind.
        let e = Error::new(Reason::EngineUnavailable, "down").with_source(Refused);
        assert_eq!(e.reason(), Reason::EngineUnavailable);
        assert!(std::error::Error::source(&e).is_some());
    }
}
