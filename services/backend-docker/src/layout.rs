//! Where our part of every sandbox lives (docs/ARCHITECTURE.md, "Any image"): the executor volume's mount
//! point and the entrypoint the runtime gives every container, whatever its image (`mentis_core::layout`,
//! shared by every backend), and the engine's names of architectures.

pub use mentis_core::layout::{MOUNT, entrypoint};

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
    fn architectures_have_the_engine_s_names() {
        assert_eq!(docker_arch("x86_64"), "amd64");
        assert_eq!(docker_arch("aarch64"), "arm64");
    }
}
