//! The kernel's requests between cells: which variable names InspectVariables may ask for.

use crate::error::Error;
use crate::quote::quoted;

/// Most names one InspectVariables call may ask for.
pub const MAX_INSPECT_NAMES: usize = 256;
/// Longest name InspectVariables accepts, in bytes.
pub const MAX_VARIABLE_NAME_LEN: usize = 256;

/// Checks the names of an inspect request: Python identifiers, so they can be handed to the kernel as a
/// literal without any quoting concerns, and a bounded number of them.
pub fn validate_names(names: &[String]) -> Result<(), Error> {
    if names.len() > MAX_INSPECT_NAMES {
        return Err(Error::invalid(
            "names",
            format!("at most {MAX_INSPECT_NAMES} names per InspectVariables call"),
        ));
    }
    for n in names {
        let mut chars = n.chars();
        let ok = n.len() <= MAX_VARIABLE_NAME_LEN
            && chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
            && chars.all(|c| c == '_' || c.is_alphanumeric());
        if !ok {
            return Err(Error::invalid(
                "names",
                format!("{} is not a Python identifier", quoted(n)),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_must_be_identifiers() {
        assert!(validate_names(&["df".into(), "_x1".into(), "données".into()]).is_ok());
        for bad in ["", "1x", "a b", "a\"]", "a.b", "__import__('os')"] {
            assert!(validate_names(&[bad.into()]).is_err(), "{bad:?}");
        }
        assert!(validate_names(&["x".repeat(MAX_VARIABLE_NAME_LEN + 1)]).is_err());
        assert!(validate_names(&vec!["a".to_owned(); MAX_INSPECT_NAMES]).is_ok());
        assert!(validate_names(&vec!["a".to_owned(); MAX_INSPECT_NAMES + 1]).is_err());
    }
}
