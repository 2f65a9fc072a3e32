//! The labels every container, volume and network we create carries (docs/ARCHITECTURE.md, Invariants:
//! nothing leaks).

use std::collections::HashMap;

use mentis_core::{SandboxId, SpaceId};

pub use mentis_core::layout::{
    LABEL_INSTANCE, LABEL_MANAGED, LABEL_POOL, LABEL_SANDBOX_ID, LABEL_SPACE_ID,
};
/// On a bounded workspace volume: the absolute path of its disk image (so that tools removing volumes by
/// hand can detach and remove the image too: `deploy/clean-sandboxes.sh`).
pub const LABEL_DISK_IMAGE: &str = "io.mentis.disk-image";

/// Labels of a sandbox's container and volume.
pub(crate) fn for_sandbox(
    instance: &str,
    id: SandboxId,
    space: Option<&SpaceId>,
) -> HashMap<String, String> {
    mentis_core::layout::labels_of(instance, id, space)
        .into_iter()
        .collect()
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
