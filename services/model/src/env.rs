//! Environment maps (a sandbox's, an action's): names and values a process environment can carry, in
//! bounded numbers and sizes.

use crate::error::Error;
use crate::quote::quoted;

/// Most variables in one env map.
pub const MAX_ENV_ENTRIES: usize = 256;
/// Longest variable name.
pub const MAX_ENV_NAME_LEN: usize = 256;
/// Longest variable value, in bytes.
pub const MAX_ENV_VALUE_BYTES: usize = 64 * 1024;

/// Checks an env map (`field` names it in the message): at most [`MAX_ENV_ENTRIES`] variables, names of
/// 1 to [`MAX_ENV_NAME_LEN`] bytes without `=` or NUL, values of at most [`MAX_ENV_VALUE_BYTES`] without
/// NUL.
pub fn validate_env<'a, I>(env: I, field: &str) -> Result<(), Error>
where
    I: IntoIterator<Item = (&'a String, &'a String)>,
    I::IntoIter: ExactSizeIterator,
{
    let env = env.into_iter();
    if env.len() > MAX_ENV_ENTRIES {
        return Err(Error::invalid(
            field,
            format!("{field} has more than {MAX_ENV_ENTRIES} entries"),
        ));
    }
    for (k, v) in env {
        if k.is_empty() || k.len() > MAX_ENV_NAME_LEN || k.contains('=') || k.contains('\0') {
            return Err(Error::invalid(
                field,
                format!("{field}: {} is not a valid variable name", quoted(k)),
            ));
        }
        if v.len() > MAX_ENV_VALUE_BYTES || v.contains('\0') {
            return Err(Error::invalid(
                field,
                format!("{field}: the value of {k} is too long or contains NUL"),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashMap};

    use super::*;

    fn one(k: &str, v: &str) -> BTreeMap<String, String> {
        [(k.to_owned(), v.to_owned())].into()
    }

    #[test]
    fn names_and_values_are_checked() {
        assert!(validate_env(&one("PATH", "/bin"), "env").is_ok());
        assert!(validate_env(&one("K", &"v".repeat(MAX_ENV_VALUE_BYTES)), "env").is_ok());
        for (k, v) in [
            ("", "x"),
            ("A=B", "x"),
            ("A\0", "x"),
            ("A", "x\0"),
            (&*"K".repeat(MAX_ENV_NAME_LEN + 1), "x"),
            ("K", &*"v".repeat(MAX_ENV_VALUE_BYTES + 1)),
        ] {
            let e = validate_env(&one(k, v), "shell.env");
            assert!(
                matches!(&e, Err(e) if e.to_string().starts_with("shell.env") && e.field() == "shell.env"),
                "{k:?}: {e:?}"
            );
        }
    }

    #[test]
    fn the_number_of_entries_is_bounded_for_any_map() {
        let full: HashMap<String, String> = (0..MAX_ENV_ENTRIES)
            .map(|i| (format!("V{i}"), String::new()))
            .collect();
        assert!(validate_env(&full, "env").is_ok());
        let mut over = full;
        over.insert("ONE_MORE".into(), String::new());
        assert!(validate_env(&over, "env").is_err());
    }
}
