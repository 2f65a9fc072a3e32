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
}

/// Smallest memory limit we accept: below this not even the executor and a shell fit.
pub const MIN_MEMORY_MB: i64 = 32;
/// Smallest pids limit we accept: the executor, its runtime threads and a shell need this many.
pub const MIN_PIDS: i64 = 16;
/// Smallest open-files limit we accept: the executor and a kernel need this many descriptors.
pub const MIN_NOFILE: i64 = 64;
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
            },
            max: Limits {
                cpu: 16.0,
                memory_mb: 64 * 1024,
                pids: 32_768,
                nofile: 65_536,
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
        ))),
    }
}

impl LimitsPolicy {
    /// Resolves requested limits (0 = default) and rejects negative, non-finite, too small or too big ones.
    pub fn resolve(&self, want: Limits) -> Result<Limits, Error> {
        let (d, m) = (self.default, self.max);
        let cpu = if want.cpu == 0.0 {
            d.cpu
        } else if !want.cpu.is_finite() || want.cpu < MIN_CPU || want.cpu > m.cpu {
            return Err(Error::invalid(format!(
                "cpu_limit {} is out of range: use 0 (default {}) or {MIN_CPU}..={}",
                want.cpu, d.cpu, m.cpu
            )));
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
        };
        let default = Limits {
            cpu: f(self.default.cpu, default.cpu).min(max.cpu),
            memory_mb: i(self.default.memory_mb, default.memory_mb).min(max.memory_mb),
            pids: i(self.default.pids, default.pids).min(max.pids),
            nofile: i(self.default.nofile, default.nofile).min(max.nofile),
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
        unbounded_default
            .resolve(*max)
            .map_err(|e| Error::invalid(format!("space sandbox maximum: {e}")))?;
        let space_max = self.narrowed(&Limits::default(), max).max;
        Self {
            default: space_max,
            max: space_max,
        }
        .resolve(*default)
        .map_err(|e| Error::invalid(format!("space sandbox default: {e}")))?;
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
        }
    }

    #[test]
    fn zero_takes_the_default_and_out_of_range_is_invalid() {
        let p = LimitsPolicy::default();
        assert_eq!(p.resolve(Limits::default()).ok(), Some(p.default));
        assert_eq!(
            p.resolve(l(0.5, 256, 64, 128)).ok(),
            Some(l(0.5, 256, 64, 128))
        );
        for bad in [
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
        assert_eq!(n.max, l(2.0, 512, p.max.pids, p.max.nofile));
        // Memory's default (1024) is lowered to the space's maximum; nofile takes the space's default.
        assert_eq!(n.default, l(1.0, 512, 512, 256));
        assert!(
            matches!(n.resolve(l(0.0, 1024, 0, 0)), Err(Error::InvalidArgument(m)) if m.contains("..=512"))
        );
        // Even unchecked, a space cannot go above the runtime.
        assert_eq!(
            p.narrowed(&Limits::default(), &l(1e6, 0, 0, 0)).max.cpu,
            p.max.cpu
        );

        p.check_space(&l(0.0, 0, 0, 256), &l(2.0, 512, 0, 0))
            .unwrap();
        for (default, max) in [
            (Limits::default(), l(32.0, 0, 0, 0)),
            (Limits::default(), l(0.0, 0, 0, 1 << 20)),
            (l(0.0, 1024, 0, 0), l(0.0, 512, 0, 0)),
            (l(0.0, 0, 0, 8), Limits::default()),
            (l(-1.0, 0, 0, 0), Limits::default()),
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
    }
}
