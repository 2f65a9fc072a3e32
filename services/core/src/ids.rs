//! Identifiers. Parsing them is validation: a malformed id is an InvalidArgument before anything else runs.

use std::fmt;

use crate::error::Error;
use mentis_model::quote::quoted;

/// A sandbox id: a UUID, always shown in its lowercase hyphenated form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SandboxId(uuid::Uuid);

impl SandboxId {
    /// A fresh random id.
    pub fn new() -> Self {
        Self(uuid::Uuid::new_v4())
    }

    /// Parses a client-supplied id.
    pub fn parse(s: &str) -> Result<Self, Error> {
        if s.is_empty() {
            return Err(Error::invalid("sandbox_id is required").at("sandbox_id"));
        }
        uuid::Uuid::try_parse(s).map(Self).map_err(|_| {
            Error::invalid(format!("sandbox_id {} is not a UUID", quoted(s))).at("sandbox_id")
        })
    }
}

impl Default for SandboxId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for SandboxId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.as_hyphenated().fmt(f)
    }
}

pub use mentis_model::action::MAX_ACTION_ID_LEN;

/// An action id: client-chosen (a UUID is recommended) or generated. Printable ASCII without spaces, so it is
/// safe in logs, labels and metadata ([`mentis_model::action::validate_action_id`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActionId(String);

impl ActionId {
    /// A fresh random id (a UUID).
    pub fn generate() -> Self {
        Self(uuid::Uuid::new_v4().to_string())
    }

    /// Parses a client-chosen id (the rules are the shared model's, which the executor applies too).
    pub fn parse(s: &str) -> Result<Self, Error> {
        mentis_model::action::validate_action_id(s)?;
        Ok(Self(s.to_owned()))
    }

    /// Parses a client-chosen id, or generates one when the client left it empty.
    pub fn parse_or_generate(s: &str) -> Result<Self, Error> {
        if s.is_empty() {
            Ok(Self::generate())
        } else {
            Self::parse(s)
        }
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ActionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The space every sandbox belongs to when its spec names none.
pub const DEFAULT_SPACE: &str = "default";

/// A space id: lowercase letters, digits and `-`, 1 to 63 characters (a DNS label, so it fits Docker labels
/// and Kubernetes namespaces alike).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SpaceId(String);

impl SpaceId {
    /// Parses a space id; empty means the default space.
    pub fn parse_or_default(s: &str) -> Result<Self, Error> {
        if s.is_empty() {
            return Ok(Self(DEFAULT_SPACE.to_owned()));
        }
        let ok = s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !s.starts_with('-')
            && !s.ends_with('-');
        if ok {
            Ok(Self(s.to_owned()))
        } else {
            Err(Error::invalid(format!(
                "space_id {} must be 1-63 lowercase letters, digits or '-', not starting or ending with '-'",
                quoted(s)
            ))
            .at("space_id"))
        }
    }

    /// Parses a space id that must be given (not empty).
    pub fn parse(s: &str) -> Result<Self, Error> {
        if s.is_empty() {
            return Err(Error::invalid("space_id is required").at("space_id"));
        }
        Self::parse_or_default(s)
    }

    /// The space that always exists.
    pub fn default_space() -> Self {
        Self(DEFAULT_SPACE.to_owned())
    }

    /// Whether this is the default space.
    pub fn is_default(&self) -> bool {
        self.0 == DEFAULT_SPACE
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for SpaceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sandbox_id_round_trips_and_rejects_garbage() {
        let id = SandboxId::new();
        assert_eq!(SandboxId::parse(&id.to_string()), Ok(id));
        assert!(matches!(
            SandboxId::parse(""),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            SandboxId::parse("nope"),
            Err(Error::InvalidArgument(_))
        ));
        assert_eq!(
            SandboxId::parse("nope").expect_err("not a UUID").field(),
            Some("sandbox_id")
        );
    }

    #[test]
    fn action_id_rules() {
        assert!(ActionId::parse("a-b_c.1").is_ok());
        assert!(ActionId::parse("has space").is_err());
        assert!(ActionId::parse(&"x".repeat(129)).is_err());
        assert!(ActionId::parse("").is_err());
        assert!(
            !ActionId::parse_or_generate("")
                .unwrap_or_else(|_| ActionId::generate())
                .as_str()
                .is_empty()
        );
    }

    #[test]
    fn space_id_rules() {
        assert_eq!(
            SpaceId::parse_or_default("").map(|s| s.to_string()),
            Ok("default".into())
        );
        assert!(SpaceId::parse_or_default("team-a1").is_ok());
        assert!(SpaceId::parse_or_default("Team").is_err());
        assert!(SpaceId::parse_or_default("-a").is_err());
        assert!(SpaceId::parse_or_default(&"a".repeat(64)).is_err());
    }
}
