//! `MENTIS_SANDBOX_DEFAULT`, `MENTIS_SANDBOX_MAX`, `MENTIS_READ_ONLY_ROOTFS`, `MENTIS_DISK_LIMITS`: the
//! runtime's limits policy.

use mentis_core::{Limits, LimitsPolicy};

use super::error::{ConfigError, err};

/// Applies `cpu=1,memory_mb=1024,pids=512,nofile=1024,disk_mb=4096` (any subset) to `limits`.
fn apply(var: &'static str, value: &str, limits: &mut Limits) -> Result<(), ConfigError> {
    for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
        let bad = |why: &str| {
            err(
                var,
                value,
                format!("{item:?}: {why} (use cpu=, memory_mb=, pids=, nofile=, disk_mb=)"),
            )
        };
        let (k, v) = item.split_once('=').ok_or_else(|| bad("no '='"))?;
        let (k, v) = (k.trim(), v.trim());
        match k {
            "cpu" => limits.cpu = v.parse().map_err(|_| bad("not a number"))?,
            "memory_mb" => limits.memory_mb = v.parse().map_err(|_| bad("not a number"))?,
            "pids" => limits.pids = v.parse().map_err(|_| bad("not a number"))?,
            "nofile" => limits.nofile = v.parse().map_err(|_| bad("not a number"))?,
            "disk_mb" => {
                limits.disk_mb = v.parse().map_err(|_| bad("not a number"))?;
                if limits.disk_mb == 0 {
                    return Err(bad("0 bounds no disk: use MENTIS_DISK_LIMITS=off for that"));
                }
            }
            _ => return Err(bad("unknown limit")),
        }
    }
    Ok(())
}

/// How workspaces are bounded: `MENTIS_DISK_LIMITS`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskLimits {
    /// Each workspace is its own ext4 filesystem of the sandbox's disk limit, in an image file attached to a
    /// loop device (the default).
    Loop,
    /// No disk limits: workspaces are plain volumes on the host's disk, sandboxes show `disk_limit_mb` 0 and
    /// a spec asking for a disk limit is refused.
    Off,
}

pub(super) fn disk_limits(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<DiskLimits, ConfigError> {
    match get("MENTIS_DISK_LIMITS").as_deref() {
        None | Some("" | "loop") => Ok(DiskLimits::Loop),
        Some("off") => Ok(DiskLimits::Off),
        Some(v) => Err(err("MENTIS_DISK_LIMITS", v, "use loop or off")),
    }
}

pub(super) fn policy(
    get: &impl Fn(&str) -> Option<String>,
    mut policy: LimitsPolicy,
    disks: DiskLimits,
) -> Result<LimitsPolicy, ConfigError> {
    let default = get("MENTIS_SANDBOX_DEFAULT");
    let max = get("MENTIS_SANDBOX_MAX");
    if let Some(v) = &default {
        apply("MENTIS_SANDBOX_DEFAULT", v, &mut policy.default)?;
    }
    if let Some(v) = &max {
        apply("MENTIS_SANDBOX_MAX", v, &mut policy.max)?;
    }
    if disks == DiskLimits::Off {
        for (var, value) in [
            ("MENTIS_SANDBOX_DEFAULT", &default),
            ("MENTIS_SANDBOX_MAX", &max),
        ] {
            if let Some(v) = value.as_deref().filter(|v| v.contains("disk_mb")) {
                return Err(err(
                    var,
                    v,
                    "disk_mb cannot be set with MENTIS_DISK_LIMITS=off (no disk is bounded)",
                ));
            }
        }
        policy = policy.without_disk();
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

/// Read-only unless `false`: a writable root's layer lies on the host's disk, beyond any disk limit.
pub(super) fn read_only(get: &impl Fn(&str) -> Option<String>) -> Result<bool, ConfigError> {
    match get("MENTIS_READ_ONLY_ROOTFS").as_deref() {
        None | Some("" | "true") => Ok(true),
        Some("false") => Ok(false),
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
        let get = |k: &str| m.get(k).cloned();
        policy(&get, LimitsPolicy::default(), disk_limits(&get)?)
    }

    #[test]
    fn disk_limits_default_to_loop_and_off_bounds_no_disk() {
        let p = parse(&[]).unwrap();
        assert_eq!((p.default.disk_mb, p.max.disk_mb), (4096, 100 * 1024));
        let p = parse(&[
            ("MENTIS_SANDBOX_DEFAULT", "disk_mb=512"),
            ("MENTIS_SANDBOX_MAX", "disk_mb=1024"),
        ])
        .unwrap();
        assert_eq!((p.default.disk_mb, p.max.disk_mb), (512, 1024));
        let p = parse(&[("MENTIS_DISK_LIMITS", "off")]).unwrap();
        assert_eq!((p.default.disk_mb, p.max.disk_mb), (0, 0));
        for bad in [
            vec![("MENTIS_DISK_LIMITS", "quota")],
            vec![("MENTIS_SANDBOX_DEFAULT", "disk_mb=8")],
            vec![("MENTIS_SANDBOX_DEFAULT", "disk_mb=0")],
            vec![("MENTIS_SANDBOX_MAX", "disk_mb=0")],
            vec![
                ("MENTIS_SANDBOX_DEFAULT", "disk_mb=2048"),
                ("MENTIS_SANDBOX_MAX", "disk_mb=1024"),
            ],
            vec![
                ("MENTIS_DISK_LIMITS", "off"),
                ("MENTIS_SANDBOX_MAX", "disk_mb=1024"),
            ],
        ] {
            assert!(parse(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_root_is_read_only_unless_false() {
        let m: HashMap<&str, &str> = HashMap::new();
        assert!(read_only(&|k: &str| m.get(k).map(|v| (*v).to_owned())).unwrap());
        for (v, want) in [("true", Some(true)), ("false", Some(false)), ("no", None)] {
            let got = read_only(&|k: &str| (k == "MENTIS_READ_ONLY_ROOTFS").then(|| v.to_owned()));
            assert_eq!(got.ok(), want, "{v}");
        }
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
                ("MENTIS_SANDBOX_DEFAULT", "inodes=1"),
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
