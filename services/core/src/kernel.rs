//! The Jupyter kernel of a sandbox, as clients see it: variable summaries and the rules for asking for them.

use crate::error::Error;

/// A JSON summary of one variable of the kernel's user namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct VariableSummary {
    pub name: String,
    /// Python type name.
    pub type_name: String,
    pub summary: serde_json::Map<String, serde_json::Value>,
}

/// Most names one inspect call may ask for.
pub const MAX_INSPECT_NAMES: usize = 256;

/// Checks the names of an inspect request: Python identifiers, a bounded number of them.
pub fn validate_names(names: &[String]) -> Result<(), Error> {
    if names.len() > MAX_INSPECT_NAMES {
        return Err(Error::invalid(format!(
            "at most {MAX_INSPECT_NAMES} names per InspectVariables call"
        )));
    }
    for n in names {
        let mut chars = n.chars();
        let ok = n.len() <= 256
            && chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
            && chars.all(|c| c == '_' || c.is_alphanumeric());
        if !ok {
            return Err(Error::invalid(format!("{n:?} is not a Python identifier")));
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
        assert!(validate_names(&["1x".into()]).is_err());
        assert!(validate_names(&["a.b".into()]).is_err());
        assert!(validate_names(&[String::new()]).is_err());
        assert!(validate_names(&vec!["a".to_owned(); 257]).is_err());
    }
}
