//! Spaces: named groups of sandboxes (a project, a tenant) with their own limits. The default space always
//! exists.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::error::Error;
use crate::ids::SpaceId;
use crate::limits::Limits;
use mentis_model::quote::quoted;

const MAX_DISPLAY_NAME: usize = 256;
const MAX_DESCRIPTION: usize = 4096;
const MAX_METADATA_ENTRIES: usize = 64;
const MAX_METADATA_KEY: usize = 256;
const MAX_METADATA_VALUE: usize = 4096;

/// What a space may hold, and how its sandboxes are bounded.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct SpaceLimits {
    /// Live sandboxes at once; 0 = no limit of its own.
    pub max_sandboxes: u32,
    /// Limits of sandboxes whose spec leaves them at zero (zero fields: the runtime's defaults).
    pub sandbox_default: Limits,
    /// Most a sandbox spec may ask for (zero fields: the runtime's maxima, which a space never exceeds).
    pub sandbox_max: Limits,
    /// Read-only root filesystem for sandboxes whose spec does not say; `None` = the runtime's default.
    pub read_only_rootfs: Option<bool>,
}

/// A space as the control plane keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Space {
    pub id: SpaceId,
    pub display_name: String,
    pub description: String,
    pub metadata: BTreeMap<String, String>,
    pub limits: SpaceLimits,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
}

/// A change to a space: `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpaceUpdate {
    pub display_name: Option<String>,
    pub description: Option<String>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub limits: Option<SpaceLimits>,
}

impl Space {
    /// The space that always exists.
    pub fn default_space(now: SystemTime) -> Self {
        Self {
            id: SpaceId::default_space(),
            display_name: "Default".into(),
            description: "Sandboxes created without a space".into(),
            metadata: BTreeMap::new(),
            limits: SpaceLimits::default(),
            created_at: now,
            updated_at: now,
        }
    }

    /// Checks the client-settable fields; every problem is an InvalidArgument naming the field.
    pub fn validate(&self) -> Result<(), Error> {
        validate_fields(
            Some(&self.display_name),
            Some(&self.description),
            Some(&self.metadata),
        )
    }

    /// Applies an update (already validated with [`SpaceUpdate::validate`]).
    pub fn apply(&mut self, update: SpaceUpdate, now: SystemTime) {
        if let Some(v) = update.display_name {
            self.display_name = v;
        }
        if let Some(v) = update.description {
            self.description = v;
        }
        if let Some(v) = update.metadata {
            self.metadata = v;
        }
        if let Some(v) = update.limits {
            self.limits = v;
        }
        self.updated_at = now;
    }
}

impl SpaceUpdate {
    /// Checks the fields it sets.
    pub fn validate(&self) -> Result<(), Error> {
        validate_fields(
            self.display_name.as_ref(),
            self.description.as_ref(),
            self.metadata.as_ref(),
        )
    }
}

fn validate_fields(
    display_name: Option<&String>,
    description: Option<&String>,
    metadata: Option<&BTreeMap<String, String>>,
) -> Result<(), Error> {
    if let Some(n) = display_name
        && (n.len() > MAX_DISPLAY_NAME || n.chars().any(char::is_control))
    {
        return Err(Error::invalid(format!(
            "display_name must be at most {MAX_DISPLAY_NAME} bytes without control characters"
        ))
        .at("display_name"));
    }
    if let Some(d) = description
        && d.len() > MAX_DESCRIPTION
    {
        return Err(Error::invalid(format!(
            "description must be at most {MAX_DESCRIPTION} bytes"
        ))
        .at("description"));
    }
    if let Some(m) = metadata {
        if m.len() > MAX_METADATA_ENTRIES {
            return Err(Error::invalid(format!(
                "metadata has more than {MAX_METADATA_ENTRIES} entries"
            ))
            .at("metadata"));
        }
        for (k, v) in m {
            if k.is_empty() || k.len() > MAX_METADATA_KEY || k.chars().any(char::is_control) {
                return Err(
                    Error::invalid(format!("metadata: {} is not a valid key", quoted(k)))
                        .at("metadata"),
                );
            }
            if v.len() > MAX_METADATA_VALUE {
                return Err(Error::invalid(format!(
                    "metadata: the value of {k} is longer than {MAX_METADATA_VALUE} bytes"
                ))
                .at("metadata"));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_bounded_and_updates_apply() {
        let now = SystemTime::now();
        let mut s = Space::default_space(now);
        assert!(s.validate().is_ok());
        s.display_name = "x\n".into();
        assert!(matches!(s.validate(), Err(Error::InvalidArgument(_))));
        let bad = SpaceUpdate {
            metadata: Some([(String::new(), "v".into())].into()),
            ..SpaceUpdate::default()
        };
        assert!(bad.validate().is_err());
        let mut s = Space::default_space(now);
        s.apply(
            SpaceUpdate {
                description: Some("d".into()),
                limits: Some(SpaceLimits {
                    max_sandboxes: 3,
                    ..SpaceLimits::default()
                }),
                ..SpaceUpdate::default()
            },
            now,
        );
        assert_eq!((s.description.as_str(), s.limits.max_sandboxes), ("d", 3));
        assert_eq!(s.display_name, "Default");
    }
}
