//! Sandboxes: the client's spec → an unvalidated request, and the domain record → the public proto.

use mentis_core::{Error, IdlePolicy, Sandbox, SandboxRequest, SandboxState};
use mentis_proto::api;

use super::timestamp;

/// The client's spec as a request for validation (a missing spec means "all defaults").
pub fn request_from_proto(spec: Option<api::SandboxSpec>) -> SandboxRequest {
    let s = spec.unwrap_or_default();
    SandboxRequest {
        space_id: s.space_id,
        image: s.image,
        env: s.env.into_iter().collect(),
        labels: s.labels.into_iter().collect(),
        cpu_limit: s.cpu_limit,
        memory_limit_mb: s.memory_limit_mb,
        pids_limit: s.pids_limit,
        nofile_limit: s.nofile_limit,
        disk_limit_mb: s.disk_limit_mb,
        read_only_rootfs: read_only_from_proto(s.root_filesystem),
        external_key: s.external_key,
        idle_timeout_seconds: s.idle_timeout_seconds,
        idle_policy: idle_policy_from_proto(s.idle_policy),
        max_lifetime_seconds: s.max_lifetime_seconds,
        auto_resume: s.auto_resume,
        egress: match api::Egress::try_from(s.egress) {
            Ok(api::Egress::Allow) => Some(true),
            Ok(api::Egress::Deny) => Some(false),
            Ok(api::Egress::Unspecified) | Err(_) => None,
        },
    }
}

/// `Some(true)` for READ_ONLY, `Some(false)` for WRITABLE, `None` (the default) otherwise.
pub fn read_only_from_proto(v: i32) -> Option<bool> {
    match api::RootFilesystem::try_from(v) {
        Ok(api::RootFilesystem::ReadOnly) => Some(true),
        Ok(api::RootFilesystem::Writable) => Some(false),
        Ok(api::RootFilesystem::Unspecified) | Err(_) => None,
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

fn idle_policy_from_proto(p: i32) -> Option<IdlePolicy> {
    match api::IdlePolicy::try_from(p) {
        Ok(api::IdlePolicy::Pause) => Some(IdlePolicy::Pause),
        Ok(api::IdlePolicy::Delete) => Some(IdlePolicy::Delete),
        Ok(api::IdlePolicy::Keep) => Some(IdlePolicy::Keep),
        // Unknown values are taken as "default" like proto3 does for unset enums.
        Ok(api::IdlePolicy::Unspecified) | Err(_) => None,
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
            return Err(Error::invalid(format!("states: {v} is not a sandbox state")).at("states"));
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
        egress: if s.egress {
            api::Egress::Allow
        } else {
            api::Egress::Deny
        } as i32,
    }
}
