//! `MENTIS_AUTH`, `MENTIS_ADMIN_KEY`, `MENTIS_ADMIN_KEY_FILE`: whether the API needs keys, and the admin key.

use super::error::{ConfigError, err};

/// Shortest admin key we accept: anything shorter can be guessed.
const MIN_ADMIN_KEY_LEN: usize = 16;

/// How callers of the public API are authenticated.
#[derive(Clone, PartialEq, Eq)]
pub enum AuthConfig {
    /// Every call but health and reflection needs a key (the default).
    Keys {
        /// The admin key; `None` = the one in `MENTIS_DATA_DIR/admin.key`, made on first start.
        admin_key: Option<String>,
    },
    /// `MENTIS_AUTH=disabled`: anybody who reaches the port is admin. Local development only.
    Disabled,
}

impl Default for AuthConfig {
    fn default() -> Self {
        Self::Keys { admin_key: None }
    }
}

// Never print the key.
impl std::fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Keys { admin_key } => f
                .debug_struct("Keys")
                .field("admin_key", &admin_key.as_ref().map(|_| "<redacted>"))
                .finish(),
            Self::Disabled => f.write_str("Disabled"),
        }
    }
}

pub(super) fn from_lookup(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<AuthConfig, ConfigError> {
    let key = get("MENTIS_ADMIN_KEY").filter(|v| !v.is_empty());
    let file = get("MENTIS_ADMIN_KEY_FILE").filter(|v| !v.is_empty());
    let admin_key = match (key, file) {
        (Some(_), Some(f)) => {
            return Err(err(
                "MENTIS_ADMIN_KEY_FILE",
                &f,
                "set MENTIS_ADMIN_KEY or MENTIS_ADMIN_KEY_FILE, not both",
            ));
        }
        (Some(k), None) => Some(check_key("MENTIS_ADMIN_KEY", "<redacted>", k)?),
        (None, Some(f)) => {
            let text = std::fs::read_to_string(&f)
                .map_err(|e| err("MENTIS_ADMIN_KEY_FILE", &f, format!("cannot read it: {e}")))?;
            Some(check_key(
                "MENTIS_ADMIN_KEY_FILE",
                &f,
                text.trim().to_owned(),
            )?)
        }
        (None, None) => None,
    };
    match get("MENTIS_AUTH").as_deref() {
        None | Some("" | "keys") => Ok(AuthConfig::Keys { admin_key }),
        Some("disabled") if admin_key.is_some() => Err(err(
            "MENTIS_AUTH",
            "disabled",
            "an admin key is set too; drop one of them",
        )),
        Some("disabled") => Ok(AuthConfig::Disabled),
        Some(v) => Err(err("MENTIS_AUTH", v, "use keys or disabled")),
    }
}

fn check_key(var: &'static str, shown: &str, key: String) -> Result<String, ConfigError> {
    if key.len() < MIN_ADMIN_KEY_LEN || key.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(err(
            var,
            shown,
            format!("the admin key needs {MIN_ADMIN_KEY_LEN} or more characters and no spaces"),
        ));
    }
    Ok(key)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<AuthConfig, ConfigError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        from_lookup(&|k: &str| m.get(k).cloned())
    }

    #[test]
    fn keys_are_the_default_and_disabled_must_be_said() {
        assert_eq!(parse(&[]).unwrap(), AuthConfig::Keys { admin_key: None });
        assert_eq!(
            parse(&[("MENTIS_AUTH", "disabled")]).unwrap(),
            AuthConfig::Disabled
        );
        assert!(parse(&[("MENTIS_AUTH", "off")]).is_err());
    }

    #[test]
    fn the_admin_key_comes_from_the_env_or_a_file_and_is_never_shown() {
        let k = "0123456789abcdef-key";
        let c = parse(&[("MENTIS_ADMIN_KEY", k)]).unwrap();
        assert_eq!(
            c,
            AuthConfig::Keys {
                admin_key: Some(k.into())
            }
        );
        assert!(!format!("{c:?}").contains(k));
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        std::fs::write(&f, format!("{k}\n")).unwrap();
        let f = f.to_str().unwrap();
        assert_eq!(parse(&[("MENTIS_ADMIN_KEY_FILE", f)]).unwrap(), c);
        assert!(parse(&[("MENTIS_ADMIN_KEY_FILE", f), ("MENTIS_ADMIN_KEY", k)]).is_err());
        assert!(parse(&[("MENTIS_ADMIN_KEY_FILE", "/nonexistent/k")]).is_err());
        assert!(parse(&[("MENTIS_ADMIN_KEY", "short")]).is_err());
        let e = parse(&[("MENTIS_ADMIN_KEY", "has a space in it, too")]).unwrap_err();
        assert!(!e.to_string().contains("space in it"));
        assert!(parse(&[("MENTIS_ADMIN_KEY", k), ("MENTIS_AUTH", "disabled")]).is_err());
    }
}
