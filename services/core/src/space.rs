//! Spaces: named groups of sandboxes (a project, a tenant) with their own limits. The default space always
//! exists.

use std::collections::BTreeMap;
use std::time::SystemTime;

use crate::egress::{Egress, EgressCap};
use crate::error::Error;
use crate::ids::SpaceId;
use crate::limits::Limits;
use crate::sandbox::SandboxRequest;
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

/// When the runtime snapshots a space's sandboxes on its own (`mentis.v1.SnapshotPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SnapshotPolicy {
    /// Before a pause.
    pub on_pause: bool,
    /// Before a delete.
    pub on_delete: bool,
    /// Before the idle timeout or the maximum lifetime pauses or deletes a sandbox.
    pub on_expiry: bool,
}

/// Why a sandbox is being paused or deleted, as far as a snapshot policy cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// A pause asked for by a client (or the idle policy, see `cause`).
    Pause(Cause),
    /// A delete asked for by a client, a space's forced delete or an expiry.
    Delete(Cause),
}

/// Who asked for a pause or a delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    /// A client (PauseSandbox, DeleteSandbox, DeleteSpace with force).
    Request,
    /// The idle timeout.
    IdleTimeout,
    /// The maximum lifetime.
    MaxLifetime,
}

impl SnapshotPolicy {
    /// Whether `ending` calls for a snapshot first, and the `io.mentis.trigger` label it gets.
    pub fn trigger(&self, ending: Ending) -> Option<&'static str> {
        let (asked, cause, name) = match ending {
            Ending::Pause(c) => (self.on_pause, c, "pause"),
            Ending::Delete(c) => (self.on_delete, c, "delete"),
        };
        let expiry = match cause {
            Cause::Request => None,
            Cause::IdleTimeout => Some("idle-timeout"),
            Cause::MaxLifetime => Some("max-lifetime"),
        };
        match expiry {
            Some(e) if self.on_expiry => Some(e),
            _ if asked => Some(name),
            _ => None,
        }
    }

    /// Whether any snapshot is asked for.
    pub fn any(&self) -> bool {
        self.on_pause || self.on_delete || self.on_expiry
    }
}

/// A space as the control plane keeps it.
#[derive(Debug, Clone, PartialEq)]
pub struct Space {
    pub id: SpaceId,
    pub display_name: String,
    pub description: String,
    pub metadata: BTreeMap<String, String>,
    pub limits: SpaceLimits,
    pub snapshot_policy: SnapshotPolicy,
    /// Runtime class of its sandboxes whose template names none; empty: the runtime's default.
    pub runtime_class: String,
    /// Egress of its sandboxes whose spec and template name none; `None`: the runtime's default.
    pub egress: Option<Egress>,
    /// The most egress its sandboxes may have, checked whenever a sandbox's policy is set.
    pub egress_cap: EgressCap,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
    /// Which space of this id this is: a space deleted and made again under the same id gets the next one,
    /// so what was granted to the first (a key's scope) never passes to the second. Set by the control plane
    /// when the space is made (0: the default space, and spaces made before generations).
    pub generation: u64,
}

/// A change to a space: `None` leaves a field as it is.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SpaceUpdate {
    pub display_name: Option<String>,
    pub description: Option<String>,
    pub metadata: Option<BTreeMap<String, String>>,
    pub limits: Option<SpaceLimits>,
    pub snapshot_policy: Option<SnapshotPolicy>,
    pub runtime_class: Option<String>,
    /// `Some(None)`: back to the runtime's default.
    pub egress: Option<Option<Egress>>,
    pub egress_cap: Option<EgressCap>,
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
            snapshot_policy: SnapshotPolicy::default(),
            runtime_class: String::new(),
            egress: None,
            egress_cap: EgressCap::Any,
            created_at: now,
            updated_at: now,
            generation: 0,
        }
    }

    /// Checks the client-settable fields; every problem is an InvalidArgument naming the field.
    pub fn validate(&self) -> Result<(), Error> {
        validate_fields(
            Some(&self.display_name),
            Some(&self.description),
            Some(&self.metadata),
        )?;
        crate::runtime_class::check_name(&self.runtime_class, "runtime_class")?;
        self.check_egress()
    }

    /// INVALID_ARGUMENT (at `egress`) when the default egress is not within the cap.
    pub fn check_egress(&self) -> Result<(), Error> {
        match &self.egress {
            Some(e) => self.egress_cap.admit(e, self.id.as_str(), "egress"),
            None => Ok(()),
        }
    }

    /// Gives a request the space's default egress when neither it nor its template named one; whether the
    /// policy is then still unnamed (the runtime's default will be it).
    pub fn fill_egress(&self, req: &mut SandboxRequest) -> bool {
        if req.egress.is_some() || !req.egress_rules.is_empty() {
            return false;
        }
        match &self.egress {
            Some(e) => {
                req.egress = Some(e.mode());
                req.egress_rules = e.to_requests();
                false
            }
            None => true,
        }
    }

    /// A sandbox's policy as its space lets it be: `egress` when within the cap; when it is only the
    /// runtime's default (`defaulted`: no spec, template or space named one) and the cap refuses it, DENY;
    /// else INVALID_ARGUMENT at `field`.
    pub fn admit_egress(
        &self,
        egress: Egress,
        defaulted: bool,
        field: &str,
    ) -> Result<Egress, Error> {
        match self.egress_cap.admit(&egress, self.id.as_str(), field) {
            Ok(()) => Ok(egress),
            Err(_) if defaulted => Ok(Egress::Deny),
            Err(e) => Err(e),
        }
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
        if let Some(v) = update.snapshot_policy {
            self.snapshot_policy = v;
        }
        if let Some(v) = update.runtime_class {
            self.runtime_class = v;
        }
        if let Some(v) = update.egress {
            self.egress = v;
        }
        if let Some(v) = update.egress_cap {
            self.egress_cap = v;
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
        )?;
        match &self.runtime_class {
            Some(class) => crate::runtime_class::check_name(class, "runtime_class"),
            None => Ok(()),
        }
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
    fn a_policy_names_the_trigger_of_each_ending() {
        let none = SnapshotPolicy::default();
        for e in [
            Ending::Pause(Cause::Request),
            Ending::Delete(Cause::IdleTimeout),
            Ending::Delete(Cause::MaxLifetime),
        ] {
            assert_eq!(none.trigger(e), None);
        }
        let pause = SnapshotPolicy {
            on_pause: true,
            ..none
        };
        assert_eq!(pause.trigger(Ending::Pause(Cause::Request)), Some("pause"));
        assert_eq!(
            pause.trigger(Ending::Pause(Cause::IdleTimeout)),
            Some("pause")
        );
        assert_eq!(pause.trigger(Ending::Delete(Cause::Request)), None);
        let delete = SnapshotPolicy {
            on_delete: true,
            ..none
        };
        assert_eq!(
            delete.trigger(Ending::Delete(Cause::MaxLifetime)),
            Some("delete")
        );
        assert_eq!(delete.trigger(Ending::Pause(Cause::IdleTimeout)), None);
        let expiry = SnapshotPolicy {
            on_expiry: true,
            ..none
        };
        assert_eq!(expiry.trigger(Ending::Pause(Cause::Request)), None);
        assert_eq!(expiry.trigger(Ending::Delete(Cause::Request)), None);
        assert_eq!(
            expiry.trigger(Ending::Pause(Cause::IdleTimeout)),
            Some("idle-timeout")
        );
        assert_eq!(
            expiry.trigger(Ending::Delete(Cause::MaxLifetime)),
            Some("max-lifetime")
        );
        assert!(expiry.any() && !none.any());
    }

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
