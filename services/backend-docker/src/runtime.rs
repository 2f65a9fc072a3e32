//! The OCI runtime sandbox containers run under: runc (Docker's default) or gVisor's runsc, a user-space
//! kernel between the sandbox and the host. `auto` takes runsc when the engine offers it in a usable form.

use std::collections::HashMap;
use std::fmt;

use bollard::Docker;
use mentis_core::{Error, Reason, Result};

/// Docker's name of gVisor's runtime, as `deploy/ensure-runsc.sh` registers it.
pub const RUNSC: &str = "runsc";
/// Docker's name of its default runtime.
pub const RUNC: &str = "runc";

/// The runtime setting (`MENTIS_CONTAINER_RUNTIME`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ContainerRuntime {
    /// Docker's default runtime.
    #[default]
    Runc,
    /// gVisor; the runtime refuses to start when the engine does not offer it.
    Runsc,
    /// runsc when the engine offers it, else runc.
    Auto,
}

impl ContainerRuntime {
    /// Parses `runc`, `runsc` or `auto`.
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim() {
            "runc" => Some(Self::Runc),
            "runsc" => Some(Self::Runsc),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }
}

impl fmt::Display for ContainerRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Runc => "runc",
            Self::Runsc => "runsc",
            Self::Auto => "auto",
        })
    }
}

/// The runtime actually used: `Runc` (HostConfig.runtime left unset) or `Runsc`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Chosen {
    Runc,
    Runsc,
}

impl Chosen {
    /// What goes into HostConfig.runtime.
    pub(crate) fn docker_name(self) -> Option<String> {
        match self {
            Self::Runc => None,
            Self::Runsc => Some(RUNSC.to_owned()),
        }
    }
}

/// Why the engine's runsc cannot serve sandboxes, if it cannot. Under `--network=none` the control plane
/// could not reach the executor; Debian's runsc cannot run its own network stack on current kernels (see
/// `deploy/ensure-runsc.sh`), so only `--network=host` (the container's own namespace) serves.
fn unusable(args: &[String]) -> Option<String> {
    let network = args
        .iter()
        .rev()
        .find_map(|a| a.strip_prefix("--network="))
        .unwrap_or("sandbox");
    (network != "host").then(|| {
        format!(
            "the engine's runtime {RUNSC} runs with --network={network}, under which the control plane \
             cannot reach the executor; register it with --network=host (deploy/ensure-runsc.sh does)"
        )
    })
}

/// Decides from the engine's runtimes (name → runtime args).
pub(crate) fn choose(
    wanted: ContainerRuntime,
    runtimes: &HashMap<String, Vec<String>>,
) -> Result<Chosen> {
    let problem = match runtimes.get(RUNSC) {
        None => Some(format!(
            "the Docker engine has no runtime {RUNSC} (deploy/ensure-runsc.sh installs and registers it)"
        )),
        Some(args) => unusable(args),
    };
    match (wanted, problem) {
        (ContainerRuntime::Runc, _) => Ok(Chosen::Runc),
        (ContainerRuntime::Runsc | ContainerRuntime::Auto, None) => Ok(Chosen::Runsc),
        (ContainerRuntime::Runsc, Some(why)) => Err(Error::new(
            Reason::FailedPrecondition,
            format!("MENTIS_CONTAINER_RUNTIME=runsc: {why}"),
        )),
        (ContainerRuntime::Auto, Some(why)) => {
            tracing::info!(reason = %why, "container runtime auto: using runc");
            Ok(Chosen::Runc)
        }
    }
}

/// Checks that the engine runs every class the operator offers to templates and spaces
/// (`MENTIS_RUNTIME_CLASSES`): each an engine runtime, runsc one the control plane can reach.
pub(crate) fn check_offered(
    offered: &[String],
    runtimes: &HashMap<String, Vec<String>>,
) -> Result<()> {
    for class in offered {
        let problem = match runtimes.get(class) {
            None if class == RUNC => None,
            None => Some(format!(
                "the Docker engine has no runtime {class} (it has {})",
                {
                    let mut names: Vec<&str> = runtimes.keys().map(String::as_str).collect();
                    names.sort_unstable();
                    names.join(", ")
                }
            )),
            Some(args) if class == RUNSC => unusable(args),
            Some(_) => None,
        };
        if let Some(why) = problem {
            return Err(Error::new(
                Reason::FailedPrecondition,
                format!("MENTIS_RUNTIME_CLASSES offers {class}: {why}"),
            ));
        }
    }
    Ok(())
}

/// Asks the engine which runtimes it offers, then decides, and checks the classes offered.
pub(crate) async fn resolve(
    docker: &Docker,
    wanted: ContainerRuntime,
    offered: &[String],
    timeout: std::time::Duration,
) -> Result<Chosen> {
    if wanted == ContainerRuntime::Runc && offered.is_empty() {
        return Ok(Chosen::Runc);
    }
    let info = tokio::time::timeout(timeout, docker.info())
        .await
        .map_err(|_| {
            Error::new(
                Reason::EngineUnavailable,
                "the Docker engine did not answer in time",
            )
        })?
        .map_err(|e| crate::error::to_core("describe itself", e))?;
    let runtimes: HashMap<String, Vec<String>> = info
        .runtimes
        .unwrap_or_default()
        .into_iter()
        .map(|(name, r)| (name, r.runtime_args.unwrap_or_default()))
        .collect();
    check_offered(offered, &runtimes)?;
    let chosen = choose(wanted, &runtimes)?;
    tracing::info!(setting = %wanted, runtime = ?chosen, "container runtime");
    Ok(chosen)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn engine(entries: &[(&str, &[&str])]) -> HashMap<String, Vec<String>> {
        entries
            .iter()
            .map(|(n, a)| ((*n).to_owned(), a.iter().map(|s| (*s).to_owned()).collect()))
            .collect()
    }

    #[test]
    fn parse_accepts_the_three_settings() {
        assert_eq!(
            ContainerRuntime::parse("runc"),
            Some(ContainerRuntime::Runc)
        );
        assert_eq!(
            ContainerRuntime::parse(" runsc "),
            Some(ContainerRuntime::Runsc)
        );
        assert_eq!(
            ContainerRuntime::parse("auto"),
            Some(ContainerRuntime::Auto)
        );
        for bad in ["", "kata", "RUNSC", "runsc,runc"] {
            assert_eq!(ContainerRuntime::parse(bad), None, "{bad}");
        }
        for r in [
            ContainerRuntime::Runc,
            ContainerRuntime::Runsc,
            ContainerRuntime::Auto,
        ] {
            assert_eq!(ContainerRuntime::parse(&r.to_string()), Some(r));
        }
    }

    #[test]
    fn runc_needs_nothing_from_the_engine() {
        let none = engine(&[("runc", &[])]);
        assert_eq!(choose(ContainerRuntime::Runc, &none), Ok(Chosen::Runc));
        assert_eq!(Chosen::Runc.docker_name(), None);
    }

    #[test]
    fn runsc_is_used_when_registered_with_host_networking() {
        let ok = engine(&[("runc", &[]), (RUNSC, &["--network=host"])]);
        assert_eq!(choose(ContainerRuntime::Runsc, &ok), Ok(Chosen::Runsc));
        assert_eq!(choose(ContainerRuntime::Auto, &ok), Ok(Chosen::Runsc));
        assert_eq!(Chosen::Runsc.docker_name().as_deref(), Some(RUNSC));
    }

    #[test]
    fn offered_classes_must_be_engine_runtimes_the_control_plane_can_reach() {
        let ok = engine(&[("runc", &[]), (RUNSC, &["--network=host"]), ("kata", &[])]);
        let offered = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
        check_offered(&offered(&[]), &ok).expect("none");
        check_offered(&offered(&["runc", "runsc", "kata"]), &ok).expect("all there");
        // runc is always there, even when the engine's list does not name it.
        check_offered(&offered(&["runc"]), &engine(&[])).expect("runc");
        let err = check_offered(&offered(&["youki"]), &ok).expect_err("missing");
        assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
        assert!(
            err.to_string()
                .contains("no runtime youki (it has kata, runc, runsc)"),
            "{err}"
        );
        let no_net = engine(&[(RUNSC, &["--network=none"])]);
        let err = check_offered(&offered(&["runsc"]), &no_net).expect_err("unreachable");
        assert!(err.to_string().contains("ensure-runsc.sh"), "{err}");
    }

    #[test]
    fn runsc_missing_or_unreachable_fails_but_auto_falls_back() {
        let missing = engine(&[("runc", &[])]);
        let no_net = engine(&[(RUNSC, &["--network=none"])]);
        let netstack = engine(&[(RUNSC, &[])]);
        for runtimes in [&missing, &no_net, &netstack] {
            let err = choose(ContainerRuntime::Runsc, runtimes).expect_err("unusable");
            assert!(matches!(err, Error::FailedPrecondition(_)), "{err:?}");
            assert!(err.to_string().contains("ensure-runsc.sh"), "{err}");
            assert_eq!(choose(ContainerRuntime::Auto, runtimes), Ok(Chosen::Runc));
        }
    }
}
