//! A sandbox's processes: the domain's `ProcessInfo` → the public API's.

use mentis_core::process::ProcessInfo;
use mentis_proto::api;

use super::timestamp;

pub fn process_to_proto(p: ProcessInfo) -> api::ProcessInfo {
    api::ProcessInfo {
        pid: p.pid,
        ppid: p.ppid,
        pgid: p.pgid,
        uid: p.uid,
        user: p.user,
        command: p.command,
        name: p.name,
        state: p.state,
        cpu_seconds: p.cpu_seconds,
        cpu_percent: p.cpu_percent,
        memory_bytes: p.memory_bytes,
        start_time: p.start_time.map(timestamp),
        role: p.role,
    }
}
