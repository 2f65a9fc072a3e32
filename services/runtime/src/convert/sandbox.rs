//! Sandboxes: the client's spec → an unvalidated request, and the domain record → the public proto.

use mentis_core::egress::{Egress, EgressMode, RuleRequest};
use mentis_core::{Error, IdlePolicy, Reason, Sandbox, SandboxRequest, SandboxState};
use mentis_proto::api;

use super::timestamp;

/// The client's spec as a request for validation (a missing spec means "all defaults"); an enum value
/// the API does not define is INVALID_SPEC naming its field (never taken as the default).
pub fn request_from_proto(spec: Option<api::SandboxSpec>) -> Result<SandboxRequest, Error> {
    let s = spec.unwrap_or_default();
    let invalid = |e: Error| e.within("spec").with_reason(Reason::InvalidSpec);
    Ok(SandboxRequest {
        space_id: s.space_id,
        image: s.image,
        env: s.env.into_iter().collect(),
        labels: s.labels.into_iter().collect(),
        cpu_limit: s.cpu_limit,
        memory_limit_mb: s.memory_limit_mb,
        pids_limit: s.pids_limit,
        nofile_limit: s.nofile_limit,
        disk_limit_mb: s.disk_limit_mb,
        read_only_rootfs: read_only_from_proto(s.root_filesystem).map_err(invalid)?,
        external_key: s.external_key,
        idle_timeout_seconds: s.idle_timeout_seconds,
        idle_policy: idle_policy_from_proto(s.idle_policy).map_err(invalid)?,
        max_lifetime_seconds: s.max_lifetime_seconds,
        auto_resume: s.auto_resume,
        egress: egress_mode_from_proto(s.egress).map_err(invalid)?,
        egress_rules: s.egress_rules.into_iter().map(rule_from_proto).collect(),
        template: s.template,
    })
}

/// The mode an Egress value asks for (`None`: unspecified); InvalidArgument (field `egress`) for a number
/// the enum does not define.
pub fn egress_mode_from_proto(v: i32) -> Result<Option<EgressMode>, Error> {
    match api::Egress::try_from(v) {
        Ok(api::Egress::Allow) => Ok(Some(EgressMode::Allow)),
        Ok(api::Egress::Deny) => Ok(Some(EgressMode::Deny)),
        Ok(api::Egress::Rules) => Ok(Some(EgressMode::Rules)),
        Ok(api::Egress::Unspecified) => Ok(None),
        Err(_) => Err(unknown_enum("egress", "Egress", v)),
    }
}

/// A rule as the client wrote it, for validation.
pub fn rule_from_proto(r: api::EgressRule) -> RuleRequest {
    RuleRequest {
        domain: r.domain,
        cidr: r.cidr,
        ports: r.ports,
        headers: r.headers.into_iter().map(|h| (h.name, h.value)).collect(),
    }
}

/// The proto of a policy: its mode and its rules (header values as written: secrets by name only).
pub fn egress_to_proto(e: &Egress) -> (api::Egress, Vec<api::EgressRule>) {
    let mode = match e.mode() {
        EgressMode::Deny => api::Egress::Deny,
        EgressMode::Allow => api::Egress::Allow,
        EgressMode::Rules => api::Egress::Rules,
    };
    let rules = e
        .to_requests()
        .into_iter()
        .map(|r| api::EgressRule {
            domain: r.domain,
            cidr: r.cidr,
            ports: r.ports,
            headers: r
                .headers
                .into_iter()
                .map(|(name, value)| api::EgressHeader { name, value })
                .collect(),
        })
        .collect();
    (mode, rules)
}

/// InvalidArgument for `value`, which is no value of the enum `name` (field `field`). Proto3 keeps an
/// unknown enum number as it came, so it must be refused here rather than taken as the default.
pub fn unknown_enum(field: &str, name: &str, value: i32) -> Error {
    Error::invalid(format!("{field}: {value} is not a value of {name}")).at(field)
}

/// `Some(true)` for READ_ONLY, `Some(false)` for WRITABLE, `None` (the default) for UNSPECIFIED;
/// InvalidArgument (field `root_filesystem`) for a number the enum does not define.
pub fn read_only_from_proto(v: i32) -> Result<Option<bool>, Error> {
    match api::RootFilesystem::try_from(v) {
        Ok(api::RootFilesystem::ReadOnly) => Ok(Some(true)),
        Ok(api::RootFilesystem::Writable) => Ok(Some(false)),
        Ok(api::RootFilesystem::Unspecified) => Ok(None),
        Err(_) => Err(unknown_enum("root_filesystem", "RootFilesystem", v)),
    }
}

/// The proto of a resolved root filesystem setting.
pub fn read_only_to_proto(read_only: bool) -> api::RootFilesystem {
    if read_only {
        api::RootFilesystem::ReadOnly
    } else {
        api::RootFilesystem::Writable
    }
}

fn idle_policy_from_proto(p: i32) -> Result<Option<IdlePolicy>, Error> {
    match api::IdlePolicy::try_from(p) {
        Ok(api::IdlePolicy::Pause) => Ok(Some(IdlePolicy::Pause)),
        Ok(api::IdlePolicy::Delete) => Ok(Some(IdlePolicy::Delete)),
        Ok(api::IdlePolicy::Keep) => Ok(Some(IdlePolicy::Keep)),
        Ok(api::IdlePolicy::Unspecified) => Ok(None),
        Err(_) => Err(unknown_enum("idle_policy", "IdlePolicy", p)),
    }
}

fn idle_policy_to_proto(p: IdlePolicy) -> api::IdlePolicy {
    match p {
        IdlePolicy::Pause => api::IdlePolicy::Pause,
        IdlePolicy::Delete => api::IdlePolicy::Delete,
        IdlePolicy::Keep => api::IdlePolicy::Keep,
    }
}

/// A state filter value; InvalidArgument for values outside the enum.
pub fn state_from_proto(v: i32) -> Result<SandboxState, Error> {
    Ok(match api::SandboxState::try_from(v) {
        Ok(api::SandboxState::Creating) => SandboxState::Creating,
        Ok(api::SandboxState::Running) => SandboxState::Running,
        Ok(api::SandboxState::Paused) => SandboxState::Paused,
        Ok(api::SandboxState::Terminating) => SandboxState::Terminating,
        Ok(api::SandboxState::Terminated) => SandboxState::Terminated,
        Ok(api::SandboxState::Failed) => SandboxState::Failed,
        Ok(api::SandboxState::Unhealthy) => SandboxState::Unhealthy,
        Ok(api::SandboxState::Pausing) => SandboxState::Pausing,
        Ok(api::SandboxState::Resuming) => SandboxState::Resuming,
        Ok(api::SandboxState::Unspecified) | Err(_) => {
            return Err(unknown_enum("states", "SandboxState", v));
        }
    })
}

fn secs(d: std::time::Duration) -> u32 {
    u32::try_from(d.as_secs()).unwrap_or(u32::MAX)
}

fn state_to_proto(s: SandboxState) -> api::SandboxState {
    match s {
        SandboxState::Creating => api::SandboxState::Creating,
        SandboxState::Running => api::SandboxState::Running,
        SandboxState::Paused => api::SandboxState::Paused,
        SandboxState::Terminating => api::SandboxState::Terminating,
        SandboxState::Terminated => api::SandboxState::Terminated,
        SandboxState::Failed => api::SandboxState::Failed,
        SandboxState::Unhealthy => api::SandboxState::Unhealthy,
        SandboxState::Pausing => api::SandboxState::Pausing,
        SandboxState::Resuming => api::SandboxState::Resuming,
    }
}

/// The public proto of a sandbox record.
pub fn sandbox_to_proto(s: &Sandbox, last_seq: u64) -> api::Sandbox {
    let (egress, egress_rules) = egress_to_proto(&s.egress);
    api::Sandbox {
        sandbox_id: s.id.to_string(),
        space_id: s.space_id.to_string(),
        state: state_to_proto(s.state) as i32,
        image: s.image.clone(),
        labels: s.labels.clone().into_iter().collect(),
        create_time: Some(timestamp(s.created_at)),
        cpu_limit: s.limits.cpu,
        memory_limit_mb: s.limits.memory_mb,
        pids_limit: s.limits.pids,
        nofile_limit: s.limits.nofile,
        disk_limit_mb: s.limits.disk_mb,
        root_filesystem: read_only_to_proto(s.read_only_rootfs) as i32,
        state_reason: s.state_reason.clone(),
        update_time: Some(timestamp(s.updated_at)),
        last_seq,
        external_key: s.external_key.clone().unwrap_or_default(),
        last_activity_time: Some(timestamp(s.last_activity)),
        idle_timeout_seconds: secs(s.expiry.idle_timeout),
        idle_policy: idle_policy_to_proto(s.expiry.idle_policy) as i32,
        max_lifetime_seconds: secs(s.expiry.max_lifetime),
        auto_resume: s.expiry.auto_resume,
        egress: egress as i32,
        egress_rules,
        template: s.template.clone(),
        work_dir: s.work_dir.clone(),
        runtime_class: s.runtime_class.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_enum_numbers_are_invalid_specs_naming_their_field() {
        for (spec, field) in [
            (
                api::SandboxSpec {
                    idle_policy: 99,
                    ..Default::default()
                },
                "spec.idle_policy",
            ),
            (
                api::SandboxSpec {
                    egress: 99,
                    ..Default::default()
                },
                "spec.egress",
            ),
            (
                api::SandboxSpec {
                    root_filesystem: -1,
                    ..Default::default()
                },
                "spec.root_filesystem",
            ),
        ] {
            let e = request_from_proto(Some(spec)).expect_err(field);
            assert_eq!(e.field(), Some(field));
            assert_eq!(e.reason(), Reason::InvalidSpec);
        }
        let ok = request_from_proto(Some(api::SandboxSpec {
            idle_policy: api::IdlePolicy::Keep as i32,
            egress: api::Egress::Allow as i32,
            root_filesystem: api::RootFilesystem::Writable as i32,
            ..Default::default()
        }))
        .expect("known values");
        assert_eq!(
            (ok.idle_policy, ok.egress, ok.read_only_rootfs),
            (Some(IdlePolicy::Keep), Some(EgressMode::Allow), Some(false))
        );
        assert_eq!(
            state_from_proto(99).expect_err("state").field(),
            Some("states")
        );
        assert_eq!(
            state_from_proto(0).expect_err("unspecified").field(),
            Some("states")
        );
    }
}
