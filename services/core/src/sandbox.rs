//! Sandboxes: the spec a client asks for, its validation against the configured limits, and the record the
//! control plane keeps.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use crate::egress::{Egress, EgressMode, RuleRequest};
use crate::error::{Error, Reason};
use crate::ids::{SandboxId, SpaceId};
use mentis_model::quote::quoted;

pub use mentis_model::env::validate_env;

/// Where a sandbox is in its life. The moves between states are the table in [`crate::lifecycle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SandboxState {
    Creating,
    Running,
    /// The backend is freezing the container; no action runs and none may start.
    Pausing,
    Paused,
    /// The backend is thawing the container and the executor is being reached again.
    Resuming,
    Terminating,
    Terminated,
    Failed,
    /// The executor does not answer; the control plane is bringing it back.
    Unhealthy,
}

impl SandboxState {
    /// Whether the sandbox is gone for good (or never came up).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Terminated | Self::Failed)
    }

    /// The public name, as in the API's enum without its prefix (`RUNNING`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Creating => "CREATING",
            Self::Running => "RUNNING",
            Self::Pausing => "PAUSING",
            Self::Paused => "PAUSED",
            Self::Resuming => "RESUMING",
            Self::Terminating => "TERMINATING",
            Self::Terminated => "TERMINATED",
            Self::Failed => "FAILED",
            Self::Unhealthy => "UNHEALTHY",
        }
    }
}

impl std::fmt::Display for SandboxState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

pub use crate::limits::{Limits, LimitsPolicy, MIN_DISK_MB, MIN_MEMORY_MB, MIN_NOFILE, MIN_PIDS};

/// Label keys under this prefix belong to the control plane.
pub const RESERVED_LABEL_PREFIX: &str = "io.mentis.";
const MAX_MAP_ENTRIES: usize = 256;
const MAX_KEY_LEN: usize = 256;

/// What the reaper does with a sandbox idle for its idle timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IdlePolicy {
    #[default]
    Pause,
    Delete,
    /// Never expire for idleness.
    Keep,
}

impl IdlePolicy {
    /// The name used in config and in the store.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pause => "pause",
            Self::Delete => "delete",
            Self::Keep => "keep",
        }
    }

    /// Parses [`IdlePolicy::as_str`]'s names.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pause" => Some(Self::Pause),
            "delete" => Some(Self::Delete),
            "keep" => Some(Self::Keep),
            _ => None,
        }
    }
}

/// When a sandbox expires, with every default filled in. A zero duration means never.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Expiry {
    pub idle_timeout: Duration,
    pub idle_policy: IdlePolicy,
    pub max_lifetime: Duration,
    /// Actions on a paused sandbox resume it.
    pub auto_resume: bool,
}

/// Longest external key accepted.
pub const MAX_EXTERNAL_KEY_LEN: usize = 256;

/// Checks a client key: 1..=256 characters, no control characters.
pub fn validate_external_key(key: &str) -> Result<(), Error> {
    if key.is_empty() || key.len() > MAX_EXTERNAL_KEY_LEN || key.chars().any(char::is_control) {
        return Err(Error::invalid(format!(
            "external_key must be 1-{MAX_EXTERNAL_KEY_LEN} characters without control characters"
        ))
        .at("external_key"));
    }
    Ok(())
}

/// A validated sandbox spec: what the control plane will create.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxSpec {
    pub space_id: SpaceId,
    /// `None` = the configured default image.
    pub image: Option<String>,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub limits: Limits,
    pub external_key: Option<String>,
    pub expiry: Expiry,
    /// What it may reach outside this machine.
    pub egress: Egress,
    /// Only /workspace and /tmp (a tmpfs) are writable.
    pub read_only_rootfs: bool,
}

/// A sandbox request as it came from a client, before validation.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SandboxRequest {
    pub space_id: String,
    pub image: String,
    pub env: BTreeMap<String, String>,
    pub labels: BTreeMap<String, String>,
    pub cpu_limit: f64,
    pub memory_limit_mb: i64,
    pub pids_limit: i64,
    pub nofile_limit: i64,
    /// 0 = default.
    pub disk_limit_mb: i64,
    /// `None` = the space's or the runtime's default.
    pub read_only_rootfs: Option<bool>,
    pub external_key: String,
    /// 0 = default.
    pub idle_timeout_seconds: u32,
    /// `None` = default.
    pub idle_policy: Option<IdlePolicy>,
    /// 0 = default.
    pub max_lifetime_seconds: u32,
    pub auto_resume: bool,
    /// `None` = the default (the template's, else the runtime's), unless rules are given.
    pub egress: Option<EgressMode>,
    /// With EGRESS_RULES (or no mode), what it may reach.
    pub egress_rules: Vec<RuleRequest>,
    /// The space's template this sandbox is made from (empty: none); see [`crate::Template::apply`].
    pub template: String,
}

impl SandboxRequest {
    /// Validates the request; every problem is an INVALID_SPEC naming the field (`spec.…`, its path in a
    /// CreateSandbox request). `defaults` fills in the expiry settings the request leaves at zero.
    pub fn validate(
        self,
        policy: &LimitsPolicy,
        defaults: &Expiry,
        default_egress: &Egress,
        default_read_only: bool,
    ) -> Result<SandboxSpec, Error> {
        self.checked(policy, defaults, default_egress, default_read_only)
            .map_err(|e| e.with_reason(Reason::InvalidSpec))
    }

    /// The space the request names (the default one when it names none); INVALID_SPEC when malformed.
    pub fn space(&self) -> Result<SpaceId, Error> {
        SpaceId::parse_or_default(&self.space_id)
            .map_err(|e| e.within("spec").with_reason(Reason::InvalidSpec))
    }

    fn checked(
        self,
        policy: &LimitsPolicy,
        defaults: &Expiry,
        default_egress: &Egress,
        default_read_only: bool,
    ) -> Result<SandboxSpec, Error> {
        let space_id = self.space()?;
        let image = if self.image.is_empty() {
            None
        } else if let Err(cause) = crate::image::check_reference(&self.image) {
            return Err(Error::invalid(format!(
                "image {} is not a valid image reference: {cause}",
                quoted(&self.image)
            ))
            .at("spec.image"));
        } else {
            Some(self.image)
        };
        validate_env(&self.env, "spec.env")?;
        validate_labels(&self.labels)?;
        let limits = policy
            .resolve(Limits {
                cpu: self.cpu_limit,
                memory_mb: self.memory_limit_mb,
                pids: self.pids_limit,
                nofile: self.nofile_limit,
                disk_mb: self.disk_limit_mb,
            })
            .map_err(|e| e.within("spec"))?;
        let external_key = if self.external_key.is_empty() {
            None
        } else {
            validate_external_key(&self.external_key).map_err(|e| e.within("spec"))?;
            Some(self.external_key)
        };
        let or_default = |secs: u32, default: Duration| {
            if secs == 0 {
                default
            } else {
                Duration::from_secs(u64::from(secs))
            }
        };
        let expiry = Expiry {
            idle_timeout: or_default(self.idle_timeout_seconds, defaults.idle_timeout),
            idle_policy: self.idle_policy.unwrap_or(defaults.idle_policy),
            max_lifetime: or_default(self.max_lifetime_seconds, defaults.max_lifetime),
            auto_resume: self.auto_resume || defaults.auto_resume,
        };
        let egress = crate::egress::validate(
            self.egress,
            self.egress_rules,
            default_egress,
            "spec.egress",
        )?;
        Ok(SandboxSpec {
            space_id,
            image,
            env: self.env,
            labels: self.labels,
            limits,
            external_key,
            expiry,
            egress,
            read_only_rootfs: self.read_only_rootfs.unwrap_or(default_read_only),
        })
    }
}

fn validate_labels(labels: &BTreeMap<String, String>) -> Result<(), Error> {
    check_labels(labels, "spec.labels")
}

/// The rules of labels (of sandboxes, snapshots): entries, key and value lengths, no control characters,
/// no key under the reserved prefix. Errors name `field`.
pub fn check_labels(labels: &BTreeMap<String, String>, field: &str) -> Result<(), Error> {
    if labels.len() > MAX_MAP_ENTRIES {
        return Err(
            Error::invalid(format!("{field} has more than {MAX_MAP_ENTRIES} entries")).at(field),
        );
    }
    for (k, v) in labels {
        if k.is_empty() || k.len() > MAX_KEY_LEN || k.chars().any(char::is_control) {
            return Err(
                Error::invalid(format!("{field}: {} is not a valid key", quoted(k))).at(field),
            );
        }
        if k.starts_with(RESERVED_LABEL_PREFIX) {
            return Err(Error::invalid(format!(
                "{field}: keys under {RESERVED_LABEL_PREFIX} are reserved"
            ))
            .at(field));
        }
        if v.len() > MAX_KEY_LEN || v.chars().any(char::is_control) {
            return Err(Error::invalid(format!(
                "{field}: the value of {k} is too long or has control characters"
            ))
            .at(field));
        }
    }
    Ok(())
}

/// A sandbox as the control plane knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Sandbox {
    pub id: SandboxId,
    pub space_id: SpaceId,
    pub state: SandboxState,
    pub image: String,
    pub labels: BTreeMap<String, String>,
    pub limits: Limits,
    pub created_at: SystemTime,
    pub updated_at: SystemTime,
    /// Why the sandbox is in its state, when that is worth saying.
    pub state_reason: String,
    pub external_key: Option<String>,
    pub expiry: Expiry,
    /// The last action, file call, create or resume.
    pub last_activity: SystemTime,
    /// What it may reach outside this machine.
    pub egress: Egress,
    /// Only /workspace and /tmp are writable.
    pub read_only_rootfs: bool,
    /// The template it was made from (empty: none).
    pub template: String,
    /// Where shell actions that name no directory start (its template's); empty: the workspace.
    pub work_dir: String,
    /// The runtime class it runs under (its template's, else its space's); empty: the runtime's default.
    pub runtime_class: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req() -> SandboxRequest {
        SandboxRequest::default()
    }

    #[test]
    fn zero_limits_take_defaults() {
        let p = LimitsPolicy::default();
        let spec = req()
            .validate(&p, &Expiry::default(), &Egress::Deny, false)
            .expect("valid");
        assert_eq!(spec.limits, p.default);
        assert_eq!(spec.space_id.as_str(), "default");
        assert_eq!(spec.image, None);
    }

    #[test]
    fn bad_limits_are_invalid_argument() {
        let p = LimitsPolicy::default();
        for (cpu, mem, pids) in [
            (-1.0, 0, 0),
            (f64::NAN, 0, 0),
            (f64::INFINITY, 0, 0),
            (1000.0, 0, 0),
            (0.0, -5, 0),
            (0.0, 1, 0),
            (0.0, i64::MAX, 0),
            (0.0, 0, -1),
            (0.0, 0, 1_000_000_000),
        ] {
            let r = SandboxRequest {
                cpu_limit: cpu,
                memory_limit_mb: mem,
                pids_limit: pids,
                ..req()
            }
            .validate(&p, &Expiry::default(), &Egress::Deny, false);
            assert!(
                matches!(r, Err(Error::InvalidArgument(_))),
                "{cpu} {mem} {pids}: {r:?}"
            );
        }
        let ok = SandboxRequest {
            cpu_limit: 0.5,
            memory_limit_mb: 256,
            pids_limit: 64,
            ..req()
        }
        .validate(&p, &Expiry::default(), &Egress::Deny, false)
        .expect("valid");
        assert_eq!(
            ok.limits,
            Limits {
                cpu: 0.5,
                memory_mb: 256,
                pids: 64,
                nofile: LimitsPolicy::default().default.nofile,
                disk_mb: LimitsPolicy::default().default.disk_mb,
            }
        );
    }

    #[test]
    fn env_labels_and_image_are_checked() {
        let p = LimitsPolicy::default();
        let bad_env = SandboxRequest {
            env: [("A=B".to_owned(), "x".to_owned())].into(),
            ..req()
        };
        assert!(
            bad_env
                .validate(&p, &Expiry::default(), &Egress::Deny, false)
                .is_err()
        );
        let reserved = SandboxRequest {
            labels: [("io.mentis.sandbox-id".to_owned(), "x".to_owned())].into(),
            ..req()
        };
        assert!(
            reserved
                .validate(&p, &Expiry::default(), &Egress::Deny, false)
                .is_err()
        );
        let image = SandboxRequest {
            image: "bad image".into(),
            ..req()
        };
        assert!(
            image
                .validate(&p, &Expiry::default(), &Egress::Deny, false)
                .is_err()
        );
        let good = SandboxRequest {
            image: "mentis/executor:latest".into(),
            ..req()
        };
        assert!(
            good.validate(&p, &Expiry::default(), &Egress::Deny, false)
                .is_ok()
        );
    }

    #[test]
    fn every_refusal_is_invalid_spec_naming_its_field_in_the_request() {
        let p = LimitsPolicy::default();
        let cases = [
            (
                SandboxRequest {
                    memory_limit_mb: -1,
                    ..req()
                },
                "spec.memory_limit_mb",
            ),
            (
                SandboxRequest {
                    cpu_limit: 1e9,
                    ..req()
                },
                "spec.cpu_limit",
            ),
            (
                SandboxRequest {
                    space_id: "Not A Space".into(),
                    ..req()
                },
                "spec.space_id",
            ),
            (
                SandboxRequest {
                    env: [("A=B".to_owned(), "x".to_owned())].into(),
                    ..req()
                },
                "spec.env",
            ),
            (
                SandboxRequest {
                    labels: [("io.mentis.x".to_owned(), "x".to_owned())].into(),
                    ..req()
                },
                "spec.labels",
            ),
            (
                SandboxRequest {
                    image: "bad image".into(),
                    ..req()
                },
                "spec.image",
            ),
            (
                SandboxRequest {
                    external_key: "\n".into(),
                    ..req()
                },
                "spec.external_key",
            ),
        ];
        for (r, field) in cases {
            let e = r
                .validate(&p, &Expiry::default(), &Egress::Deny, false)
                .expect_err(field);
            assert_eq!((e.reason(), e.field()), (Reason::InvalidSpec, Some(field)));
        }
    }
}
