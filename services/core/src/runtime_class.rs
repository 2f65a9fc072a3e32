//! Runtime classes: the isolation a sandbox runs under, named per template or space (gVisor, Kata: a
//! stronger boundary than the host kernel's). On Docker a class is the name of an engine runtime
//! (`runsc`), on Kubernetes a RuntimeClass. The operator offers a set (`MENTIS_RUNTIME_CLASSES`); an empty
//! name is the runtime's default (`MENTIS_CONTAINER_RUNTIME`, `MENTIS_K8S_RUNTIME_CLASS`).

use std::collections::BTreeSet;

use crate::error::Error;
use mentis_model::quote::quoted;

/// Longest name (a Kubernetes object name, a DNS subdomain).
pub const MAX_NAME_LEN: usize = 253;

/// Checks the form of a class name (empty: the default); INVALID_ARGUMENT at `field` when malformed.
pub fn check_name(name: &str, field: &str) -> Result<(), Error> {
    if name.is_empty() || well_formed(name) {
        return Ok(());
    }
    Err(Error::invalid(format!(
        "runtime class {} must be 1-{MAX_NAME_LEN} lowercase letters, digits, '-' or '.', starting and \
         ending with a letter or digit",
        quoted(name)
    ))
    .at(field))
}

fn well_formed(name: &str) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    name.len() <= MAX_NAME_LEN
        && name.bytes().all(|b| alnum(b) || b == b'-' || b == b'.')
        && name.bytes().next().is_some_and(alnum)
        && name.bytes().last().is_some_and(alnum)
}

/// The class a sandbox runs under: its template's, else its space's; empty: the runtime's default.
pub fn resolve<'a>(template: Option<&'a str>, space: &'a str) -> &'a str {
    template.filter(|t| !t.is_empty()).unwrap_or(space)
}

/// The classes the operator offers to templates and spaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offered(BTreeSet<String>);

impl Offered {
    /// Parses `MENTIS_RUNTIME_CLASSES`: names separated by commas (blanks around them ignored).
    pub fn parse(value: &str) -> Result<Self, String> {
        let mut set = BTreeSet::new();
        for name in value.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if !well_formed(name) {
                return Err(format!(
                    "{} is not a runtime class name (lowercase letters, digits, '-' or '.')",
                    quoted(name)
                ));
            }
            set.insert(name.to_owned());
        }
        Ok(Self(set))
    }

    /// The names offered, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Checks that `name` may be set at `field`: empty, or well formed and offered; INVALID_ARGUMENT
    /// naming the offered classes otherwise.
    pub fn admit(&self, name: &str, field: &str) -> Result<(), Error> {
        check_name(name, field)?;
        if name.is_empty() || self.0.contains(name) {
            return Ok(());
        }
        let offered = if self.0.is_empty() {
            "this runtime offers none (MENTIS_RUNTIME_CLASSES)".to_owned()
        } else {
            format!(
                "this runtime offers {} (MENTIS_RUNTIME_CLASSES)",
                self.names().collect::<Vec<_>>().join(", ")
            )
        };
        Err(Error::invalid(format!(
            "runtime class {} is not offered: {offered}",
            quoted(name)
        ))
        .at(field))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn names_are_dns_subdomains_and_empty_is_the_default() {
        for ok in [
            "",
            "runsc",
            "gvisor",
            "kata-qemu",
            "io.containerd.runsc.v1",
            "k8s1",
        ] {
            check_name(ok, "template.runtime_class").expect(ok);
        }
        for bad in [
            "RUNSC",
            "-a",
            "a-",
            ".a",
            "a b",
            "a/b",
            "é",
            &"a".repeat(254),
        ] {
            let e = check_name(bad, "template.runtime_class").expect_err(bad);
            assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
            assert_eq!(e.field(), Some("template.runtime_class"), "{bad}");
        }
    }

    #[test]
    fn only_offered_classes_are_admitted_and_the_refusal_lists_them() {
        let offered = Offered::parse(" runsc, kata ,,").unwrap();
        assert_eq!(offered.names().collect::<Vec<_>>(), ["kata", "runsc"]);
        offered.admit("", "space.runtime_class").unwrap();
        offered.admit("runsc", "space.runtime_class").unwrap();
        let e = offered.admit("runc", "space.runtime_class").unwrap_err();
        assert!(matches!(e, Error::InvalidArgument(_)), "{e:?}");
        assert_eq!(e.field(), Some("space.runtime_class"));
        assert!(e.to_string().contains("offers kata, runsc"), "{e}");
        let none = Offered::parse("").unwrap();
        assert!(none.is_empty());
        let e = none.admit("runsc", "template.runtime_class").unwrap_err();
        assert!(e.to_string().contains("offers none"), "{e}");
        assert!(Offered::parse("runsc,Kata").unwrap_err().contains("Kata"));
    }

    #[test]
    fn a_template_class_wins_over_the_space_class() {
        assert_eq!(resolve(Some("kata"), "runsc"), "kata");
        assert_eq!(resolve(Some(""), "runsc"), "runsc");
        assert_eq!(resolve(None, "runsc"), "runsc");
        assert_eq!(resolve(None, ""), "");
    }
}
