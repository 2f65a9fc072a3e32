//! Sandboxes: the client's spec → an unvalidated request, and the domain record → the public proto.

use mentis_core::{Sandbox, SandboxRequest, SandboxState};
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
    }
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
        state_reason: s.state_reason.clone(),
        update_time: Some(timestamp(s.updated_at)),
        last_seq,
    }
}
