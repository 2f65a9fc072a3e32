//! `MENTIS_BUILD_LIMITS`, `MENTIS_BUILD_EGRESS`: what the RUN steps of an image build get (docs/ARCHITECTURE.md,
//! Security model, "Image builds").

use super::error::{ConfigError, err};

/// Most memory a build step may be given: the engine's build API takes it in bytes, and our client
/// (bollard) as a 32-bit number (`i32::MAX` bytes is 2047 MiB and a bit).
pub const MAX_BUILD_MEMORY_MB: i64 = 2047;
/// Least memory the engine gives a container.
const MIN_BUILD_MEMORY_MB: i64 = 6;

/// What each RUN step of a build gets.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BuildPolicy {
    /// CPU cores (a CFS quota), 1 by default.
    pub cpu: f64,
    /// Memory in MiB, with no swap beyond it, 1024 by default (a sandbox's default).
    pub memory_mb: i64,
    /// Whether a build may ask for a route out (`BuildImageHeader.egress`): off by default, and RUN steps
    /// then have no network at all.
    pub egress: bool,
}

impl Default for BuildPolicy {
    fn default() -> Self {
        Self {
            cpu: 1.0,
            memory_mb: 1024,
            egress: false,
        }
    }
}

pub(super) fn policy(get: &impl Fn(&str) -> Option<String>) -> Result<BuildPolicy, ConfigError> {
    let mut p = BuildPolicy::default();
    if let Some(value) = get("MENTIS_BUILD_LIMITS") {
        const VAR: &str = "MENTIS_BUILD_LIMITS";
        for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
            let bad = |why: String| {
                err(
                    VAR,
                    &value,
                    format!("{item:?}: {why} (use cpu=, memory_mb=)"),
                )
            };
            let (k, v) = item.split_once('=').ok_or_else(|| bad("no '='".into()))?;
            match k.trim() {
                "cpu" => {
                    p.cpu = v
                        .trim()
                        .parse()
                        .ok()
                        .filter(|c: &f64| c.is_finite() && *c >= 0.01 && *c <= 1024.0)
                        .ok_or_else(|| bad("use 0.01 to 1024 cores".into()))?;
                }
                "memory_mb" => {
                    p.memory_mb = v
                        .trim()
                        .parse()
                        .ok()
                        .filter(|m| (MIN_BUILD_MEMORY_MB..=MAX_BUILD_MEMORY_MB).contains(m))
                        .ok_or_else(|| {
                            bad(format!(
                                "use {MIN_BUILD_MEMORY_MB} to {MAX_BUILD_MEMORY_MB} MiB (the engine's build \
                                 API takes at most 2 GiB through our client)"
                            ))
                        })?;
                }
                _ => return Err(bad("unknown limit".into())),
            }
        }
    }
    match get("MENTIS_BUILD_EGRESS").as_deref() {
        None | Some("" | "deny") => {}
        Some("allow") => p.egress = true,
        Some(v) => return Err(err("MENTIS_BUILD_EGRESS", v, "use deny or allow")),
    }
    Ok(p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<BuildPolicy, ConfigError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        policy(&|k: &str| m.get(k).cloned())
    }

    #[test]
    fn builds_get_a_sandbox_s_default_limits_and_no_network_unless_set() {
        assert_eq!(parse(&[]).ok(), Some(BuildPolicy::default()));
        let p = parse(&[
            ("MENTIS_BUILD_LIMITS", "cpu=2.5, memory_mb=2047"),
            ("MENTIS_BUILD_EGRESS", "allow"),
        ])
        .ok();
        assert_eq!(
            p,
            Some(BuildPolicy {
                cpu: 2.5,
                memory_mb: 2047,
                egress: true
            })
        );
        for (var, value) in [
            ("MENTIS_BUILD_LIMITS", "memory_mb=2048"),
            ("MENTIS_BUILD_LIMITS", "memory_mb=5"),
            ("MENTIS_BUILD_LIMITS", "cpu=0"),
            ("MENTIS_BUILD_LIMITS", "cpu=NaN"),
            ("MENTIS_BUILD_LIMITS", "pids=10"),
            ("MENTIS_BUILD_LIMITS", "cpu"),
            ("MENTIS_BUILD_EGRESS", "yes"),
        ] {
            let e = parse(&[(var, value)]).expect_err(value);
            assert_eq!(e.var, var);
        }
    }
}
