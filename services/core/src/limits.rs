//! Resource limits of sandboxes: what one sandbox gets, and the policy that fills in what a request leaves
//! at zero and bounds what it may ask for. The runtime has a policy; a space may narrow it (lower maxima,
//! other defaults), never widen it.

use crate::error::Error;

/// Resource limits of one sandbox. In a sandbox every field is set; in a space's settings a zero field is
/// "not set here" (the runtime's value applies).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Limits {
    /// CPU cores (may be fractional).
    pub cpu: f64,
    /// Memory in MiB; swap is not allowed beyond it.
    pub memory_mb: i64,
    /// Processes and threads.
    pub pids: i64,
    /// Open files per process (soft and hard `nofile` ulimit).
    pub nofile: i64,
    /// Disk in MiB: the size of the sandbox's workspace filesystem. In a sandbox, 0 means not bounded (the
    /// runtime runs with disk limits off, or the sandbox was made before disk limits); in a policy's
    /// maximum, 0 means this runtime bounds no disk, so a request may only leave it at 0.
    pub disk_mb: i64,
}

/// Smallest memory limit we accept: below this not even the executor and a shell fit.
pub const MIN_MEMORY_MB: i64 = 32;
/// Smallest pids limit we accept: the executor, its runtime threads and a shell need this many.
pub const MIN_PIDS: i64 = 16;
/// Smallest open-files limit we accept: the executor and a kernel need this many descriptors.
pub const MIN_NOFILE: i64 = 64;
/// Smallest disk limit we accept: an ext4 filesystem this small still leaves room for a few files.
pub const MIN_DISK_MB: i64 = 16;
/// Smallest CPU limit we accept.
const MIN_CPU: f64 = 0.01;

/// Defaults applied when a spec leaves a limit at zero, and the maxima a spec may ask for.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LimitsPolicy {
    pub default: Limits,
    pub max: Limits,
}

impl Default for LimitsPolicy {
    fn default() -> Self {
        Self {
            default: Limits {
                cpu: 1.0,
                memory_mb: 1024,
                pids: 512,
                nofile: 1024,
                disk_mb: 4 * 1024,
            },
            max: Limits {
                cpu: 16.0,
                memory_mb: 64 * 1024,
                pids: 32_768,
                nofile: 65_536,
                disk_mb: 100 * 1024,
            },
        }
    }
}

fn int(field: &str, v: i64, min: i64, default: i64, max: i64) -> Result<i64, Error> {
    match v {
        0 => Ok(default),
        v if (min..=max).contains(&v) => Ok(v),
        v => Err(Error::invalid(format!(
            "{field} {v} is out of range: use 0 (default {default}) or {min}..={max}"
        ))
        .at(field)),
    }
}

impl LimitsPolicy {
    /// This policy with no disk bound at all (a runtime whose disk limits are off): every sandbox gets
    /// `disk_mb` 0, and asking for a disk limit is refused rather than silently not enforced.
    pub fn without_disk(mut self) -> Self {
        self.default.disk_mb = 0;
        self.max.disk_mb = 0;
        self
    }

    /// Whether this policy bounds disks.
    pub fn bounds_disk(&self) -> bool {
        self.max.disk_mb > 0
    }

    /// Resolves requested limits (0 = default) and rejects negative, non-finite, too small or too big ones.
    pub fn resolve(&self, want: Limits) -> Result<Limits, Error> {
        let (d, m) = (self.default, self.max);
        let cpu = if want.cpu == 0.0 {
            d.cpu
        } else if !want.cpu.is_finite() || want.cpu < MIN_CPU || want.cpu > m.cpu {
            return Err(Error::invalid(format!(
                "cpu_limit {} is out of range: use 0 (default {}) or {MIN_CPU}..={}",
                want.cpu, d.cpu, m.cpu
            ))
            .at("cpu_limit"));
        } else {
            want.cpu
        };
        Ok(Limits {
            cpu,
            memory_mb: int(
                "memory_limit_mb",
                want.memory_mb,
                MIN_MEMORY_MB,
                d.memory_mb,
                m.memory_mb,
            )?,
            pids: int("pids_limit", want.pids, MIN_PIDS, d.pids, m.pids)?,
            nofile: int("nofile_limit", want.nofile, MIN_NOFILE, d.nofile, m.nofile)?,
            disk_mb: if m.disk_mb == 0 {
                if want.disk_mb != 0 {
                    return Err(Error::invalid(format!(
                        "disk_limit_mb {} cannot be honoured: this runtime bounds no disk \
                         (MENTIS_DISK_LIMITS=off); leave it at 0",
                        want.disk_mb
                    ))
                    .at("disk_limit_mb"));
                }
                0
            } else {
                int(
                    "disk_limit_mb",
                    want.disk_mb,
                    MIN_DISK_MB,
                    d.disk_mb,
                    m.disk_mb,
                )?
            },
        })
    }

    /// Checks a policy read from config: every value in range, defaults within maxima.
    pub fn validate(&self) -> Result<(), Error> {
        // The maxima, each checked against its floor only; then the defaults against the maxima.
        let wide = Self {
            default: self.max,
            max: Limits {
                cpu: f64::MAX,
                memory_mb: i64::MAX,
                pids: i64::MAX,
                nofile: i64::MAX,
                // A policy without disk bounds (max 0) stays so.
                disk_mb: if self.bounds_disk() { i64::MAX } else { 0 },
            },
        };
        if self.max.cpu < MIN_CPU {
            return Err(Error::invalid(format!(
                "the maximum cpu is below {MIN_CPU}"
            )));
        }
        wide.resolve(self.max)?;
        self.resolve(self.default).map(|_| ())
    }

    /// The policy of a space: where its `default` and `max` set a field (non-zero), they replace ours. A
    /// space's maxima must lie within ours and its defaults within the resulting maxima
    /// ([`LimitsPolicy::check_space`] says so when the space is written); a default the space leaves unset
    /// is lowered to its maximum.
    pub fn narrowed(&self, default: &Limits, max: &Limits) -> Self {
        let f = |ours: f64, theirs: f64| if theirs > 0.0 { theirs.min(ours) } else { ours };
        let i = |ours: i64, theirs: i64| if theirs > 0 { theirs.min(ours) } else { ours };
        let max = Limits {
            cpu: f(self.max.cpu, max.cpu),
            memory_mb: i(self.max.memory_mb, max.memory_mb),
            pids: i(self.max.pids, max.pids),
            nofile: i(self.max.nofile, max.nofile),
            disk_mb: i(self.max.disk_mb, max.disk_mb),
        };
        let default = Limits {
            cpu: f(self.default.cpu, default.cpu).min(max.cpu),
            memory_mb: i(self.default.memory_mb, default.memory_mb).min(max.memory_mb),
            pids: i(self.default.pids, default.pids).min(max.pids),
            nofile: i(self.default.nofile, default.nofile).min(max.nofile),
            disk_mb: i(self.default.disk_mb, default.disk_mb).min(max.disk_mb),
        };
        Self { default, max }
    }

    /// Checks a space's settings against this (the runtime's) policy: each field set is in range and at
    /// most our maximum, and each default set is at most the space's maximum.
    pub fn check_space(&self, default: &Limits, max: &Limits) -> Result<(), Error> {
        let unbounded_default = Self {
            default: self.max,
            max: self.max,
        };
        // A spec's `memory_limit_mb` is a space's `memory_mb`.
        let in_space = |e: Error, at: &str, what: &str| {
            let field = e.field().unwrap_or_default().replace("_limit", "");
            Error::invalid(format!("space sandbox {what}: {e}")).at(format!("limits.{at}.{field}"))
        };
        unbounded_default
            .resolve(*max)
            .map_err(|e| in_space(e, "sandbox_max", "maximum"))?;
        let space_max = self.narrowed(&Limits::default(), max).max;
        Self {
            default: space_max,
            max: space_max,
        }
        .resolve(*default)
        .map_err(|e| in_space(e, "sandbox_default", "default"))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn l(cpu: f64, memory_mb: i64, pids: i64, nofile: i64) -> Limits {
        Limits {
            cpu,
            memory_mb,
            pids,
            nofile,
            disk_mb: 0,
        }
    }

    fn disk(disk_mb: i64) -> Limits {
        Limits {
            disk_mb,
            ..Limits::default()
        }
    }

    #[test]
    fn zero_takes_the_default_and_out_of_range_is_invalid() {
        let p = LimitsPolicy::default();
        assert_eq!(p.resolve(Limits::default()).ok(), Some(p.default));
        assert_eq!(
            p.resolve(l(0.5, 256, 64, 128)).ok(),
            Some(Limits {
                disk_mb: 4096,
                ..l(0.5, 256, 64, 128)
            })
        );
        assert_eq!(p.resolve(disk(64)).unwrap().disk_mb, 64);
        assert_eq!(p.resolve(disk(100 * 1024)).unwrap().disk_mb, 100 * 1024);
        for bad in [
            disk(-1),
            disk(MIN_DISK_MB - 1),
            disk(100 * 1024 + 1),
            l(-1.0, 0, 0, 0),
            l(f64::NAN, 0, 0, 0),
            l(f64::INFINITY, 0, 0, 0),
            l(1000.0, 0, 0, 0),
            l(0.0, -5, 0, 0),
            l(0.0, 1, 0, 0),
            l(0.0, i64::MAX, 0, 0),
            l(0.0, 0, -1, 0),
            l(0.0, 0, 1_000_000_000, 0),
            l(0.0, 0, 0, 8),
            l(0.0, 0, 0, 1 << 40),
        ] {
            assert!(
                matches!(p.resolve(bad), Err(Error::InvalidArgument(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn a_space_narrows_the_runtime_policy_and_never_widens_it() {
        let p = LimitsPolicy::default();
        let n = p.narrowed(&l(0.0, 0, 0, 256), &l(2.0, 512, 0, 0));
        assert_eq!(
            n.max,
            Limits {
                disk_mb: p.max.disk_mb,
                ..l(2.0, 512, p.max.pids, p.max.nofile)
            }
        );
        // Memory's default (1024) is lowered to the space's maximum; nofile takes the space's default.
        assert_eq!(
            n.default,
            Limits {
                disk_mb: 4096,
                ..l(1.0, 512, 512, 256)
            }
        );
        // A space's disk maximum lowers the default disk too.
        let small = p.narrowed(&Limits::default(), &disk(1024));
        assert_eq!((small.default.disk_mb, small.max.disk_mb), (1024, 1024));
        assert!(
            matches!(small.resolve(disk(2048)), Err(e @ Error::InvalidArgument(_)) if e.to_string().contains("disk_limit_mb") && e.field() == Some("disk_limit_mb"))
        );
        assert!(
            matches!(n.resolve(l(0.0, 1024, 0, 0)), Err(e @ Error::InvalidArgument(_)) if e.to_string().contains("..=512") && e.field() == Some("memory_limit_mb"))
        );
        // Even unchecked, a space cannot go above the runtime.
        assert_eq!(
            p.narrowed(&Limits::default(), &l(1e6, 0, 0, 0)).max.cpu,
            p.max.cpu
        );

        p.check_space(&l(0.0, 0, 0, 256), &l(2.0, 512, 0, 0))
            .unwrap();
        // The field is the space's (`memory_mb` in `limits.sandbox_default`), the message as before.
        let e = p
            .check_space(&l(0.0, 1024, 0, 0), &l(0.0, 512, 0, 0))
            .unwrap_err();
        assert_eq!(e.field(), Some("limits.sandbox_default.memory_mb"));
        assert!(
            e.to_string()
                .starts_with("space sandbox default: memory_limit_mb"),
            "{e}"
        );
        let e = p
            .check_space(&Limits::default(), &l(32.0, 0, 0, 0))
            .unwrap_err();
        assert_eq!(e.field(), Some("limits.sandbox_max.cpu"));
        for (default, max) in [
            (Limits::default(), l(32.0, 0, 0, 0)),
            (Limits::default(), l(0.0, 0, 0, 1 << 20)),
            (l(0.0, 1024, 0, 0), l(0.0, 512, 0, 0)),
            (l(0.0, 0, 0, 8), Limits::default()),
            (l(-1.0, 0, 0, 0), Limits::default()),
            (Limits::default(), disk(200 * 1024)),
            (disk(2048), disk(1024)),
        ] {
            assert!(
                matches!(
                    p.check_space(&default, &max),
                    Err(Error::InvalidArgument(_))
                ),
                "{default:?} {max:?}"
            );
        }
    }

    #[test]
    fn config_policies_are_checked() {
        LimitsPolicy::default().validate().unwrap();
        let mut p = LimitsPolicy::default();
        p.default.memory_mb = p.max.memory_mb + 1;
        assert!(p.validate().is_err());
        let mut p = LimitsPolicy::default();
        p.max.nofile = 1;
        assert!(p.validate().is_err());
        let mut p = LimitsPolicy::default();
        p.default.disk_mb = 8;
        assert!(p.validate().is_err());
        LimitsPolicy::default().without_disk().validate().unwrap();
    }

    #[test]
    fn without_disk_bounds_every_sandbox_gets_zero_and_asking_for_a_limit_is_refused() {
        let p = LimitsPolicy::default().without_disk();
        assert!(!p.bounds_disk() && LimitsPolicy::default().bounds_disk());
        assert_eq!(p.resolve(Limits::default()).unwrap().disk_mb, 0);
        assert!(
            matches!(p.resolve(disk(64)), Err(e @ Error::InvalidArgument(_)) if e.to_string().contains("MENTIS_DISK_LIMITS=off"))
        );
        // A space cannot ask for disk limits either, and narrowing keeps the disk unbounded.
        assert!(p.check_space(&Limits::default(), &disk(64)).is_err());
        let n = p.narrowed(&disk(64), &disk(128));
        assert_eq!((n.default.disk_mb, n.max.disk_mb), (0, 0));
        assert_eq!(n.resolve(Limits::default()).unwrap().disk_mb, 0);
    }
}
