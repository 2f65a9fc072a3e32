//! Spaces: proto ⇄ domain.

use std::time::SystemTime;

use mentis_core::{
    Error, Limits, SnapshotPolicy, Space, SpaceId, SpaceLimits, SpaceUpdate, quoted,
};
use mentis_proto::api;

use mentis_core::egress::{self, Egress, EgressCap};

use super::sandbox::{
    egress_mode_from_proto, egress_to_proto, read_only_from_proto, read_only_to_proto,
    rule_from_proto,
};
use super::timestamp;

/// A space to create; InvalidArgument for a missing or malformed id.
pub fn space_from_proto(s: Option<api::Space>) -> Result<Space, Error> {
    let s = s.ok_or_else(|| Error::invalid("space is required").at("space"))?;
    let now = SystemTime::now();
    Ok(Space {
        id: SpaceId::parse(&s.space_id).map_err(|e| e.within("space"))?,
        display_name: s.display_name,
        description: s.description,
        metadata: s.metadata.into_iter().collect(),
        limits: limits_from_proto(s.limits).map_err(|e| e.within("space"))?,
        snapshot_policy: policy_from_proto(s.snapshot_policy),
        runtime_class: s.runtime_class,
        egress: default_egress_from_proto(s.egress, s.egress_rules)?,
        egress_cap: cap_from_proto(s.egress_cap, s.egress_cap_rules)?,
        created_at: now,
        updated_at: now,
        generation: 0,
    })
}

/// A space's default egress (`None`: the runtime's); InvalidArgument at `space.egress...`.
fn default_egress_from_proto(
    mode: i32,
    rules: Vec<api::EgressRule>,
) -> Result<Option<Egress>, Error> {
    let mode = egress_mode_from_proto(mode).map_err(|e| e.within("space"))?;
    let rules: Vec<_> = rules.into_iter().map(rule_from_proto).collect();
    if mode.is_none() && rules.is_empty() {
        return Ok(None);
    }
    egress::validate(mode, rules, &Egress::Deny, "space.egress").map(Some)
}

/// A space's cap; InvalidArgument at `space.egress_cap...`.
fn cap_from_proto(mode: i32, rules: Vec<api::EgressRule>) -> Result<EgressCap, Error> {
    let mode = egress_mode_from_proto(mode)
        .map_err(|_| super::sandbox::unknown_enum("space.egress_cap", "Egress", mode))?;
    EgressCap::validate(
        mode,
        rules.into_iter().map(rule_from_proto).collect(),
        "space.egress_cap",
    )
}

/// The limits of a space; InvalidArgument (`limits.root_filesystem`) for an enum number the API does not
/// define.
fn limits_from_proto(l: Option<api::SpaceLimits>) -> Result<SpaceLimits, Error> {
    let l = l.unwrap_or_default();
    let sandbox = |s: Option<api::SandboxLimits>| {
        let s = s.unwrap_or_default();
        Limits {
            cpu: s.cpu,
            memory_mb: s.memory_mb,
            pids: s.pids,
            nofile: s.nofile,
            disk_mb: s.disk_mb,
        }
    };
    Ok(SpaceLimits {
        max_sandboxes: l.max_sandboxes,
        sandbox_default: sandbox(l.sandbox_default),
        sandbox_max: sandbox(l.sandbox_max),
        read_only_rootfs: read_only_from_proto(l.root_filesystem)
            .map_err(|e| e.within("limits"))?,
    })
}

fn policy_from_proto(p: Option<api::SnapshotPolicy>) -> SnapshotPolicy {
    let p = p.unwrap_or_default();
    SnapshotPolicy {
        on_pause: p.on_pause,
        on_delete: p.on_delete,
        on_expiry: p.on_expiry,
    }
}

fn sandbox_limits_to_proto(l: &Limits) -> api::SandboxLimits {
    api::SandboxLimits {
        cpu: l.cpu,
        memory_mb: l.memory_mb,
        pids: l.pids,
        nofile: l.nofile,
        disk_mb: l.disk_mb,
    }
}

/// The id and the change an UpdateSpace asks for: the fields named in the mask, or all when it is empty.
pub fn update_from_proto(
    s: Option<api::Space>,
    mask: Option<prost_types::FieldMask>,
) -> Result<(SpaceId, SpaceUpdate), Error> {
    let s = s.ok_or_else(|| Error::invalid("space is required").at("space"))?;
    let id = SpaceId::parse(&s.space_id).map_err(|e| e.within("space"))?;
    let paths = mask.map(|m| m.paths).unwrap_or_default();
    let all = paths.is_empty();
    for p in &paths {
        if ![
            "display_name",
            "description",
            "metadata",
            "limits",
            "snapshot_policy",
            "runtime_class",
            "egress",
            "egress_rules",
            "egress_cap",
            "egress_cap_rules",
        ]
        .contains(&p.as_str())
        {
            return Err(Error::invalid(format!(
                "update_mask: {} cannot be updated (display_name, description, metadata, limits, \
                 snapshot_policy, runtime_class, egress, egress_cap)",
                quoted(p)
            ))
            .at("update_mask"));
        }
    }
    let wants = |f: &str| all || paths.iter().any(|p| p == f);
    let limits = if wants("limits") {
        Some(limits_from_proto(s.limits).map_err(|e| e.within("space"))?)
    } else {
        None
    };
    let egress = if wants("egress") || wants("egress_rules") {
        Some(default_egress_from_proto(s.egress, s.egress_rules)?)
    } else {
        None
    };
    let egress_cap = if wants("egress_cap") || wants("egress_cap_rules") {
        Some(cap_from_proto(s.egress_cap, s.egress_cap_rules)?)
    } else {
        None
    };
    Ok((
        id,
        SpaceUpdate {
            display_name: wants("display_name").then_some(s.display_name),
            description: wants("description").then_some(s.description),
            metadata: wants("metadata").then(|| s.metadata.into_iter().collect()),
            limits,
            snapshot_policy: wants("snapshot_policy").then(|| policy_from_proto(s.snapshot_policy)),
            runtime_class: wants("runtime_class").then_some(s.runtime_class),
            egress,
            egress_cap,
        },
    ))
}

/// The public proto of a space with its live sandbox count.
pub fn space_to_proto(s: &Space, sandbox_count: u32) -> api::Space {
    let (egress, egress_rules) = s
        .egress
        .as_ref()
        .map_or((api::Egress::Unspecified, Vec::new()), egress_to_proto);
    let cap = egress_to_proto(&s.egress_cap.to_egress());
    api::Space {
        space_id: s.id.to_string(),
        display_name: s.display_name.clone(),
        description: s.description.clone(),
        metadata: s.metadata.clone().into_iter().collect(),
        limits: Some(api::SpaceLimits {
            max_sandboxes: s.limits.max_sandboxes,
            sandbox_default: Some(sandbox_limits_to_proto(&s.limits.sandbox_default)),
            sandbox_max: Some(sandbox_limits_to_proto(&s.limits.sandbox_max)),
            root_filesystem: s
                .limits
                .read_only_rootfs
                .map_or(api::RootFilesystem::Unspecified, read_only_to_proto)
                as i32,
        }),
        create_time: Some(timestamp(s.created_at)),
        update_time: Some(timestamp(s.updated_at)),
        sandbox_count,
        snapshot_policy: Some(api::SnapshotPolicy {
            on_pause: s.snapshot_policy.on_pause,
            on_delete: s.snapshot_policy.on_delete,
            on_expiry: s.snapshot_policy.on_expiry,
        }),
        runtime_class: s.runtime_class.clone(),
        egress: egress as i32,
        egress_rules,
        egress_cap: cap.0 as i32,
        egress_cap_rules: cap.1,
    }
}
