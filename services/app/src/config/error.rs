//! The error of a setting that could not be used, naming the variable.

/// A setting that could not be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid {var}={value:?}: {reason}")]
pub struct ConfigError {
    pub var: &'static str,
    pub value: String,
    pub reason: String,
}

pub(super) fn err(var: &'static str, value: &str, reason: impl Into<String>) -> ConfigError {
    ConfigError {
        var,
        value: value.to_owned(),
        reason: reason.into(),
    }
}
