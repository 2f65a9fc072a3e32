//! Spaces: proto ⇄ domain.

use std::time::SystemTime;

use mentis_core::{Error, Space, SpaceId, SpaceLimits, SpaceUpdate};
use mentis_proto::api;

use super::timestamp;

/// A space to create; InvalidArgument for a missing or malformed id.
pub fn space_from_proto(s: Option<api::Space>) -> Result<Space, Error> {
    let s = s.ok_or_else(|| Error::invalid("space is required"))?;
    let now = SystemTime::now();
    Ok(Space {
        id: SpaceId::parse(&s.space_id)?,
        display_name: s.display_name,
        description: s.description,
        metadata: s.metadata.into_iter().collect(),
        limits: limits_from_proto(s.limits),
        created_at: now,
        updated_at: now,
    })
}

fn limits_from_proto(l: Option<api::SpaceLimits>) -> SpaceLimits {
    SpaceLimits {
        max_sandboxes: l.map_or(0, |l| l.max_sandboxes),
    }
}

/// The id and the change an UpdateSpace asks for: the fields named in the mask, or all when it is empty.
pub fn update_from_proto(
    s: Option<api::Space>,
    mask: Option<prost_types::FieldMask>,
) -> Result<(SpaceId, SpaceUpdate), Error> {
    let s = s.ok_or_else(|| Error::invalid("space is required"))?;
    let id = SpaceId::parse(&s.space_id)?;
    let paths = mask.map(|m| m.paths).unwrap_or_default();
    let all = paths.is_empty();
    for p in &paths {
        if !["display_name", "description", "metadata", "limits"].contains(&p.as_str()) {
            return Err(Error::invalid(format!(
                "update_mask: {p:?} cannot be updated (display_name, description, metadata, limits)"
            )));
        }
    }
    let wants = |f: &str| all || paths.iter().any(|p| p == f);
    Ok((
        id,
        SpaceUpdate {
            display_name: wants("display_name").then_some(s.display_name),
            description: wants("description").then_some(s.description),
            metadata: wants("metadata").then(|| s.metadata.into_iter().collect()),
            limits: wants("limits").then(|| limits_from_proto(s.limits)),
        },
    ))
}

/// The public proto of a space with its live sandbox count.
pub fn space_to_proto(s: &Space, sandbox_count: u32) -> api::Space {
    api::Space {
        space_id: s.id.to_string(),
        display_name: s.display_name.clone(),
        description: s.description.clone(),
        metadata: s.metadata.clone().into_iter().collect(),
        limits: Some(api::SpaceLimits {
            max_sandboxes: s.limits.max_sandboxes,
        }),
        create_time: Some(timestamp(s.created_at)),
        update_time: Some(timestamp(s.updated_at)),
        sandbox_count,
    }
}
