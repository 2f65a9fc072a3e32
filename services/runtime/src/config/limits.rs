//! `MENTIS_SANDBOX_DEFAULT`, `MENTIS_SANDBOX_MAX`, `MENTIS_READ_ONLY_ROOTFS`: the runtime's limits policy.

use mentis_core::{Limits, LimitsPolicy};

use super::error::{ConfigError, err};

/// Applies `cpu=1,memory_mb=1024,pids=512,nofile=1024` (any subset) to `limits`.
fn apply(var: &'static str, value: &str, limits: &mut Limits) -> Result<(), ConfigError> {
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = |why: &str| {
            err(
                var,
                value,
                format!("{item:?}: {why} (use cpu=, memory_mb=, pids=, nofile=)"),
            )
        };
        let (k, v) = item.split_once('=').ok_or_else(|| bad("no '='"))?;
        let (k, v) = (k.trim(), v.trim());
        match k {
            "cpu" => limits.cpu = v.parse().map_err(|_| bad("not a number"))?,
            "memory_mb" => limits.memory_mb = v.parse().map_err(|_| bad("not a number"))?,
            "pids" => limits.pids = v.parse().map_err(|_| bad("not a number"))?,
            "nofile" => limits.nofile = v.parse().map_err(|_| bad("not a number"))?,
            _ => return Err(bad("unknown limit")),
        }
    }
    Ok(())
}

pub(super) fn policy(
    get: &impl Fn(&str) -> Option<String>,
    mut policy: LimitsPolicy,
) -> Result<LimitsPolicy, ConfigError> {
    let default = get("MENTIS_SANDBOX_DEFAULT");
    let max = get("MENTIS_SANDBOX_MAX");
    if let Some(v) = &default {
        apply("MENTIS_SANDBOX_DEFAULT", v, &mut policy.default)?;
    }
    if let Some(v) = &max {
        apply("MENTIS_SANDBOX_MAX", v, &mut policy.max)?;
    }
    policy.validate().map_err(|e| {
        err(
            "MENTIS_SANDBOX_DEFAULT",
            default.as_deref().unwrap_or(""),
            format!(
                "with MENTIS_SANDBOX_MAX={:?}: {e}",
                max.as_deref().unwrap_or("")
            ),
        )
    })?;
    Ok(policy)
}

pub(super) fn read_only(get: &impl Fn(&str) -> Option<String>) -> Result<bool, ConfigError> {
    match get("MENTIS_READ_ONLY_ROOTFS").as_deref() {
        None | Some("" | "false") => Ok(false),
        Some("true") => Ok(true),
        Some(v) => Err(err("MENTIS_READ_ONLY_ROOTFS", v, "use true or false")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::collections::HashMap;

    fn parse(pairs: &[(&str, &str)]) -> Result<LimitsPolicy, ConfigError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        policy(&|k: &str| m.get(k).cloned(), LimitsPolicy::default())
    }

    #[test]
    fn defaults_and_maxima_come_from_the_env_and_are_checked() {
        let p = parse(&[
            ("MENTIS_SANDBOX_DEFAULT", "nofile=256, memory_mb=512"),
            ("MENTIS_SANDBOX_MAX", "cpu=4"),
        ])
        .unwrap();
        assert_eq!(
            (p.default.nofile, p.default.memory_mb, p.max.cpu),
            (256, 512, 4.0)
        );
        assert_eq!(p.default.pids, LimitsPolicy::default().default.pids);
        for bad in [
            [
                ("MENTIS_SANDBOX_DEFAULT", "cpu=8"),
                ("MENTIS_SANDBOX_MAX", "cpu=4"),
            ],
            [
                ("MENTIS_SANDBOX_DEFAULT", "disk=1"),
                ("MENTIS_SANDBOX_MAX", ""),
            ],
            [
                ("MENTIS_SANDBOX_DEFAULT", "pids=x"),
                ("MENTIS_SANDBOX_MAX", ""),
            ],
            [
                ("MENTIS_SANDBOX_DEFAULT", ""),
                ("MENTIS_SANDBOX_MAX", "nofile=10"),
            ],
        ] {
            assert!(parse(&bad).is_err(), "{bad:?}");
        }
    }
}
