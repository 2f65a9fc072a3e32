//! The labels every container, volume and network we create carries (DESIGN.md invariant 5).

use std::collections::HashMap;

use mentis_core::{SandboxId, SpaceId};

pub const LABEL_MANAGED: &str = "io.mentis.managed";
pub const LABEL_SANDBOX_ID: &str = "io.mentis.sandbox-id";
pub const LABEL_SPACE_ID: &str = "io.mentis.space-id";
pub const LABEL_INSTANCE: &str = "io.mentis.instance";

/// Labels of a sandbox's container and volume.
pub(crate) fn for_sandbox(
    instance: &str,
    id: SandboxId,
    space: &SpaceId,
) -> HashMap<String, String> {
    HashMap::from([
        (LABEL_MANAGED.to_owned(), "true".to_owned()),
        (LABEL_SANDBOX_ID.to_owned(), id.to_string()),
        (LABEL_SPACE_ID.to_owned(), space.to_string()),
        (LABEL_INSTANCE.to_owned(), instance.to_owned()),
    ])
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
        let l = for_sandbox("i1", id, &space);
        assert_eq!(sandbox_id(&l), Some(id));
        assert_eq!(l.get(LABEL_MANAGED).map(String::as_str), Some("true"));
        assert_eq!(l.get(LABEL_SPACE_ID).map(String::as_str), Some("default"));
        assert_eq!(l.get(LABEL_INSTANCE).map(String::as_str), Some("i1"));
    }
}
