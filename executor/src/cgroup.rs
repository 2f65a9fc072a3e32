//! The sandbox's cgroup, read from inside its container: the counters of OOM kills and of forks refused by
//! the pids limit, read before and after an action to tell why it ended, and the limits to name.
//!
//! Docker mounts the container's own cgroup at `/sys/fs/cgroup`: per controller on cgroup v1
//! (`memory/memory.oom_control`, `pids/pids.events`), one unified directory on cgroup v2 (`memory.events`,
//! `pids.events`). Both are supported; a file that is missing or unreadable (an unusual runtime, gVisor) only
//! means that reason is never reported: the command's exit code and signal still say what happened.
//!
//! The counters are container-wide, so with commands running concurrently the attribution is approximate:
//! a command that fails with exit 137 while another one's memory hog is OOM-killed can be reported as
//! OOM-killed too. The kernel may also pick a different victim than the process that used the memory (the
//! largest process with the highest `oom_score_adj`, which user processes have: see `enter`).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Where Docker mounts the container's cgroup.
const ROOT: &str = "/sys/fs/cgroup";
/// Limits at or above this are "no limit" (cgroup v1 writes PAGE_COUNTER_MAX pages in bytes, ~2^63).
const UNLIMITED: u64 = 1 << 62;
const MIB: u64 = 1024 * 1024;

/// The files of the sandbox's cgroup that explain a death; `None` where the hierarchy has none.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Cgroup {
    /// Flat keyed, with an `oom_kill N` line: v1 `memory.oom_control`, v2 `memory.events`.
    oom_events: Option<PathBuf>,
    /// Flat keyed, with a `max N` line (forks refused by the limit): `pids.events` on v1 and v2.
    pids_events: Option<PathBuf>,
    /// Bytes or `max`: v1 `memory.limit_in_bytes`, v2 `memory.max`.
    memory_max: Option<PathBuf>,
    /// A count or `max`: `pids.max` on v1 and v2.
    pids_max: Option<PathBuf>,
    /// Bytes in use: v1 `memory.usage_in_bytes`, v2 `memory.current`.
    memory_current: Option<PathBuf>,
    /// CPU time used: v1 `cpuacct.usage` (nanoseconds), v2 `cpu.stat`'s `usage_usec`.
    cpu_usage: Option<CpuUsage>,
}

/// Where the CPU time is, and in which form.
#[derive(Debug, Clone, PartialEq, Eq)]
enum CpuUsage {
    /// v1: nanoseconds, the whole file.
    Nanos(PathBuf),
    /// v2: `usage_usec` in a flat keyed file.
    StatMicros(PathBuf),
}

/// The sandbox's resource use now (what the runtime's metrics show per sandbox).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Memory in use, in bytes (page cache included, as the memory limit counts it).
    pub(crate) memory_bytes: Option<u64>,
    /// CPU time used since the container started, in microseconds.
    pub(crate) cpu_usec: Option<u64>,
}

/// The counters at one moment; `None` where they could not be read.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counters {
    oom_kills: Option<u64>,
    fork_failures: Option<u64>,
}

/// What the sandbox's limits did between two readings of the counters.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LimitHits {
    /// Processes the OOM killer ended.
    pub(crate) oom_kills: u64,
    /// The memory limit in bytes, when there is one (read only after an OOM kill).
    pub(crate) memory_limit: Option<u64>,
    /// Forks refused because the pids limit was reached.
    pub(crate) fork_failures: u64,
    /// The pids limit, when there is one (read only after a refused fork).
    pub(crate) pids_limit: Option<u64>,
}

impl Cgroup {
    /// The container's cgroup, found once.
    pub(crate) fn get() -> &'static Self {
        static CGROUP: OnceLock<Cgroup> = OnceLock::new();
        CGROUP.get_or_init(|| {
            let cgroup = Self::at(Path::new(ROOT));
            tracing::debug!(?cgroup, "cgroup files that explain deaths");
            cgroup
        })
    }

    /// Looks under `root` for the v1 files first (also right on hybrid hosts, where the memory and pids
    /// controllers are v1 and the unified directory is empty), then the v2 ones.
    pub(crate) fn at(root: &Path) -> Self {
        let first = |candidates: &[&str]| {
            candidates
                .iter()
                .map(|c| root.join(c))
                .find(|p| p.is_file())
        };
        Self {
            oom_events: first(&["memory/memory.oom_control", "memory.events"]),
            pids_events: first(&["pids/pids.events", "pids.events"]),
            memory_max: first(&["memory/memory.limit_in_bytes", "memory.max"]),
            pids_max: first(&["pids/pids.max", "pids.max"]),
            memory_current: first(&["memory/memory.usage_in_bytes", "memory.current"]),
            cpu_usage: first(&["cpuacct/cpuacct.usage", "cpu,cpuacct/cpuacct.usage"])
                .map(CpuUsage::Nanos)
                .or_else(|| first(&["cpu.stat"]).map(CpuUsage::StatMicros)),
        }
    }

    /// Memory and CPU time in use now; a file that cannot be read leaves its figure unknown.
    pub(crate) async fn usage(&self) -> Usage {
        let memory_bytes = read(self.memory_current.as_deref())
            .await
            .and_then(|t| t.trim().parse().ok());
        let cpu_usec = match &self.cpu_usage {
            Some(CpuUsage::Nanos(file)) => read(Some(file))
                .await
                .and_then(|t| t.trim().parse::<u64>().ok())
                .map(|ns| ns / 1000),
            Some(CpuUsage::StatMicros(file)) => {
                keyed(read(Some(file)).await.as_deref(), "usage_usec")
            }
            None => None,
        };
        Usage {
            memory_bytes,
            cpu_usec,
        }
    }

    pub(crate) async fn counters(&self) -> Counters {
        Counters {
            oom_kills: keyed(
                read(self.oom_events.as_deref()).await.as_deref(),
                "oom_kill",
            ),
            fork_failures: keyed(read(self.pids_events.as_deref()).await.as_deref(), "max"),
        }
    }

    /// The pids limit, when there is one.
    pub(crate) async fn pids_limit(&self) -> Option<u64> {
        limit(read(self.pids_max.as_deref()).await.as_deref())
    }

    /// What happened since `before`, with the limits that were hit.
    pub(crate) async fn hits_since(&self, before: Counters) -> LimitHits {
        let after = self.counters().await;
        let oom_kills = rise(before.oom_kills, after.oom_kills);
        let fork_failures = rise(before.fork_failures, after.fork_failures);
        LimitHits {
            oom_kills,
            memory_limit: limit_if_hit(self.memory_max.as_deref(), oom_kills).await,
            fork_failures,
            pids_limit: limit_if_hit(self.pids_max.as_deref(), fork_failures).await,
        }
    }
}

impl LimitHits {
    /// "killed by the out-of-memory killer (memory limit 256 MiB)".
    pub(crate) fn oom_text(&self) -> String {
        match self.memory_limit {
            Some(bytes) => format!(
                "killed by the out-of-memory killer (memory limit {} MiB)",
                bytes.div_ceil(MIB)
            ),
            None => "killed by the out-of-memory killer".to_owned(),
        }
    }

    /// "the pids limit (128) was reached: fork failed".
    pub(crate) fn pids_text(&self) -> String {
        match self.pids_limit {
            Some(n) => format!("the pids limit ({n}) was reached: fork failed"),
            None => "the pids limit was reached: fork failed".to_owned(),
        }
    }
}

async fn read(file: Option<&Path>) -> Option<String> {
    let file = file?;
    // cgroupfs files are made by the kernel on read, never wait on a disk: read in place, which spares a
    // hop through tokio's blocking pool (four of them a command).
    match std::fs::read_to_string(file) {
        Ok(text) => Some(text),
        Err(e) => {
            tracing::debug!(file = %file.display(), error = %e, "cannot read a cgroup file");
            None
        }
    }
}

/// The limit in `file`, read only when it was hit (the common case reads nothing more).
async fn limit_if_hit(file: Option<&Path>, hits: u64) -> Option<u64> {
    if hits == 0 {
        return None;
    }
    limit(read(file).await.as_deref())
}

/// The value of `key` in a flat keyed file (`key value` lines).
fn keyed(text: Option<&str>, key: &str) -> Option<u64> {
    text?.lines().find_map(|line| {
        let (k, v) = line.split_once(' ')?;
        if k == key {
            v.trim().parse().ok()
        } else {
            None
        }
    })
}

/// A limit file's value: a number, or `max` / a huge number for none.
fn limit(text: Option<&str>) -> Option<u64> {
    text?.trim().parse().ok().filter(|&n: &u64| n < UNLIMITED)
}

/// How much a counter rose; 0 when either reading is missing (or the counter went back, which it cannot).
fn rise(before: Option<u64>, after: Option<u64>) -> u64 {
    match (before, after) {
        (Some(before), Some(after)) => after.saturating_sub(before),
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn keyed_files_of_both_versions_parse() {
        let v1_memory = "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n";
        assert_eq!(keyed(Some(v1_memory), "oom_kill"), Some(3));
        // v2 also has oom_group_kill, which must not be mistaken for oom_kill.
        let v2_memory = "low 0\nhigh 0\nmax 12\noom 2\noom_group_kill 7\noom_kill 1\n";
        assert_eq!(keyed(Some(v2_memory), "oom_kill"), Some(1));
        assert_eq!(keyed(Some("max 42\n"), "max"), Some(42));
        assert_eq!(keyed(Some("max 0"), "max"), Some(0));
        assert_eq!(keyed(Some("under_oom 0\n"), "oom_kill"), None);
        assert_eq!(keyed(Some("oom_kill x\n"), "oom_kill"), None);
        assert_eq!(keyed(None, "max"), None);
    }

    #[test]
    fn limits_parse_and_none_means_none() {
        assert_eq!(limit(Some("268435456\n")), Some(256 * MIB));
        assert_eq!(limit(Some("128\n")), Some(128));
        assert_eq!(limit(Some("max\n")), None);
        // cgroup v1's "no limit".
        assert_eq!(limit(Some("9223372036854771712\n")), None);
        assert_eq!(limit(None), None);
    }

    #[test]
    fn rises_need_both_readings() {
        assert_eq!(rise(Some(1), Some(3)), 2);
        assert_eq!(rise(Some(3), Some(3)), 0);
        assert_eq!(rise(None, Some(3)), 0);
        assert_eq!(rise(Some(3), None), 0);
        assert_eq!(rise(Some(3), Some(1)), 0);
    }

    #[test]
    fn texts_name_the_limits() {
        let hits = LimitHits {
            oom_kills: 1,
            memory_limit: Some(256 * MIB),
            fork_failures: 5,
            pids_limit: Some(128),
        };
        assert_eq!(
            hits.oom_text(),
            "killed by the out-of-memory killer (memory limit 256 MiB)"
        );
        assert_eq!(
            hits.pids_text(),
            "the pids limit (128) was reached: fork failed"
        );
        let unknown = LimitHits::default();
        assert_eq!(unknown.oom_text(), "killed by the out-of-memory killer");
        assert_eq!(
            unknown.pids_text(),
            "the pids limit was reached: fork failed"
        );
    }

    fn write(root: &Path, file: &str, text: &str) {
        let path = root.join(file);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    }

    #[tokio::test]
    async fn v1_hierarchy_counts_and_limits() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(
            r,
            "memory/memory.oom_control",
            "oom_kill_disable 0\noom_kill 0\n",
        );
        write(r, "memory/memory.limit_in_bytes", "268435456\n");
        write(r, "pids/pids.events", "max 0\n");
        write(r, "pids/pids.max", "128\n");
        let cgroup = Cgroup::at(r);
        let before = cgroup.counters().await;
        assert_eq!(
            cgroup.hits_since(before).await,
            LimitHits::default(),
            "nothing happened: nothing is reported, and no limit is read"
        );
        write(
            r,
            "memory/memory.oom_control",
            "oom_kill_disable 0\noom_kill 1\n",
        );
        write(r, "pids/pids.events", "max 7\n");
        let hits = cgroup.hits_since(before).await;
        assert_eq!(
            hits,
            LimitHits {
                oom_kills: 1,
                memory_limit: Some(256 * MIB),
                fork_failures: 7,
                pids_limit: Some(128),
            }
        );
    }

    #[tokio::test]
    async fn v2_hierarchy_counts_and_limits() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        write(
            r,
            "memory.events",
            "low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n",
        );
        write(r, "memory.max", "max\n");
        write(r, "pids.events", "max 0\n");
        write(r, "pids.max", "64\n");
        let cgroup = Cgroup::at(r);
        let before = cgroup.counters().await;
        write(
            r,
            "memory.events",
            "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n",
        );
        let hits = cgroup.hits_since(before).await;
        assert_eq!((hits.oom_kills, hits.memory_limit), (1, None));
        assert_eq!((hits.fork_failures, hits.pids_limit), (0, None));
        write(r, "pids.events", "max 2\n");
        assert_eq!(cgroup.hits_since(before).await.pids_limit, Some(64));
    }

    #[tokio::test]
    async fn missing_files_report_nothing() {
        let root = tempfile::tempdir().unwrap();
        let cgroup = Cgroup::at(root.path());
        assert_eq!(cgroup, Cgroup::default());
        let before = cgroup.counters().await;
        assert_eq!(before, Counters::default());
        assert_eq!(cgroup.hits_since(before).await, LimitHits::default());
        // A file that vanishes after discovery (or cannot be read) is no count either.
        write(root.path(), "pids.events", "max 0\n");
        let cgroup = Cgroup::at(root.path());
        std::fs::remove_file(root.path().join("pids.events")).unwrap();
        assert_eq!(cgroup.counters().await, Counters::default());
    }

    #[tokio::test]
    async fn usage_reads_both_versions() {
        let v1 = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(v1.path().join("memory")).unwrap();
        std::fs::create_dir_all(v1.path().join("cpuacct")).unwrap();
        std::fs::write(v1.path().join("memory/memory.usage_in_bytes"), "1048576\n").unwrap();
        std::fs::write(v1.path().join("cpuacct/cpuacct.usage"), "2500000000\n").unwrap();
        let usage = Cgroup::at(v1.path()).usage().await;
        assert_eq!(usage.memory_bytes, Some(1 << 20));
        assert_eq!(usage.cpu_usec, Some(2_500_000));

        let v2 = tempfile::tempdir().unwrap();
        std::fs::write(v2.path().join("memory.current"), "4096\n").unwrap();
        std::fs::write(
            v2.path().join("cpu.stat"),
            "usage_usec 1234\nuser_usec 1000\nsystem_usec 234\n",
        )
        .unwrap();
        let usage = Cgroup::at(v2.path()).usage().await;
        assert_eq!(
            (usage.memory_bytes, usage.cpu_usec),
            (Some(4096), Some(1234))
        );

        let none = tempfile::tempdir().unwrap();
        assert_eq!(Cgroup::at(none.path()).usage().await, Usage::default());
    }
}
