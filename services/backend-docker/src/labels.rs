//! The labels every container, volume and network we create carries (docs/ARCHITECTURE.md, Invariants:
//! nothing leaks).

use std::collections::HashMap;

use mentis_core::{SandboxId, SpaceId};

pub const LABEL_MANAGED: &str = "io.mentis.managed";
pub const LABEL_SANDBOX_ID: &str = "io.mentis.sandbox-id";
pub const LABEL_SPACE_ID: &str = "io.mentis.space-id";
pub const LABEL_INSTANCE: &str = "io.mentis.instance";
/// On a bounded workspace volume: the absolute path of its disk image (so that tools removing volumes by
/// hand can detach and remove the image too: `deploy/clean-sandboxes.sh`).
pub const LABEL_DISK_IMAGE: &str = "io.mentis.disk-image";
/// On containers created for a warm pool: which sandbox they became is in the store, not in labels.
pub const LABEL_POOL: &str = "io.mentis.pool";

/// Labels of a sandbox's container and volume.
pub(crate) fn for_sandbox(
    instance: &str,
    id: SandboxId,
    space: Option<&SpaceId>,
) -> HashMap<String, String> {
    let mut labels = HashMap::from([
        (LABEL_MANAGED.to_owned(), "true".to_owned()),
        (LABEL_SANDBOX_ID.to_owned(), id.to_string()),
        // Empty for a pool member: the space it is claimed for is recorded in the store.
        (
            LABEL_SPACE_ID.to_owned(),
            space.map(ToString::to_string).unwrap_or_default(),
        ),
        (LABEL_INSTANCE.to_owned(), instance.to_owned()),
    ]);
    if space.is_none() {
        labels.insert(LABEL_POOL.to_owned(), "true".to_owned());
    }
    labels
}

/// Docker list filter selecting the objects of one control-plane instance.
pub(crate) fn instance_filter(instance: &str) -> HashMap<String, Vec<String>> {
    HashMap::from([(
        "label".to_owned(),
        vec![
            format!("{LABEL_MANAGED}=true"),
            format!("{LABEL_INSTANCE}={instance}"),
        ],
    )])
}

/// The sandbox id an object is labelled with, when it is well-formed.
pub(crate) fn sandbox_id(labels: &HashMap<String, String>) -> Option<SandboxId> {
    labels
        .get(LABEL_SANDBOX_ID)
        .and_then(|s| SandboxId::parse(s).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_round_trip() {
        let id = SandboxId::new();
        let space = SpaceId::parse_or_default("").expect("default space");
        let l = for_sandbox("i1", id, Some(&space));
        assert_eq!(sandbox_id(&l), Some(id));
        assert_eq!(l.get(LABEL_MANAGED).map(String::as_str), Some("true"));
        assert_eq!(l.get(LABEL_SPACE_ID).map(String::as_str), Some("default"));
        assert_eq!(l.get(LABEL_INSTANCE).map(String::as_str), Some("i1"));
        assert_eq!(l.get(LABEL_POOL), None);
        // A pool member: no space yet (the store binds it at claim), marked as such.
        let member = for_sandbox("i1", id, None);
        assert_eq!(member.get(LABEL_SPACE_ID).map(String::as_str), Some(""));
        assert_eq!(member.get(LABEL_POOL).map(String::as_str), Some("true"));
    }
}
