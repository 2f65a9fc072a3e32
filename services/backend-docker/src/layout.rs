//! Where our part of every sandbox lives (docs/ARCHITECTURE.md, "Any image"): the executor volume's mount
//! point and the entrypoint the runtime gives every container, whatever its image.

/// Where the executor's volume is mounted in every sandbox (read-only).
pub const MOUNT: &str = "/.mentis";

/// The entrypoint of every sandbox container: the launcher readies the container and execs tini (PID 1),
/// which starts the executor.
pub(crate) fn entrypoint() -> Vec<String> {
    [
        "bin/mentis-executor",
        "launch",
        "--",
        "bin/tini",
        "--",
        "bin/mentis-executor",
    ]
    .iter()
    .map(|part| {
        if part.starts_with("bin/") {
            format!("{MOUNT}/{part}")
        } else {
            (*part).to_owned()
        }
    })
    .collect()
}

/// The engine's name of this machine's architecture, as images state theirs.
pub(crate) fn docker_arch(rust_arch: &str) -> &str {
    match rust_arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "arm" => "arm",
        "powerpc64" => "ppc64le",
        "s390x" => "s390x",
        "riscv64" => "riscv64",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_entrypoint_runs_the_mounted_executor_under_tini() {
        assert_eq!(
            entrypoint(),
            [
                "/.mentis/bin/mentis-executor",
                "launch",
                "--",
                "/.mentis/bin/tini",
                "--",
                "/.mentis/bin/mentis-executor"
            ]
        );
        assert_eq!(docker_arch("x86_64"), "amd64");
        assert_eq!(docker_arch("aarch64"), "arm64");
    }
}
