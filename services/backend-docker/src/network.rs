//! The networks: the executor network, a user-defined bridge, internal (no route out) and with
//! inter-container traffic disabled, so sandboxes reach neither each other nor the outside while the host
//! reaches executors; and the egress network, attached only to sandboxes whose spec allows egress: a bridge
//! with a route out, inter-container traffic disabled too.

use std::collections::HashMap;

use bollard::Docker;
use bollard::models::NetworkCreateRequest;
use mentis_core::{Error, Reason, Result};

use crate::config::DockerConfig;
use crate::error::{is_not_found, to_core};
use crate::labels::LABEL_MANAGED;

/// Creates both networks when missing, and keeps sandboxes from opening connections to the host itself.
pub(crate) async fn ensure(docker: &Docker, config: &DockerConfig) -> Result<()> {
    // Engines of API 1.41 accept two networks with one name, and iptables' check-then-insert is no better:
    // serialise the runtimes in this process (tests start many) so they never race into a duplicate.
    static ENSURE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _guard = ENSURE.lock().await;
    ensure_one(docker, &config.network, true).await?;
    ensure_one(docker, &config.egress_network, false).await?;
    for name in [&config.network, &config.egress_network] {
        guard_host(&bridge_of(docker, name).await?).await?;
    }
    Ok(())
}

/// The Linux bridge behind a network.
pub(crate) async fn bridge_of(docker: &Docker, name: &str) -> Result<String> {
    let net = docker
        .inspect_network(name, None)
        .await
        .map_err(|e| to_core("inspect a network", e))?;
    if let Some(bridge) = net
        .options
        .as_ref()
        .and_then(|o| o.get("com.docker.network.bridge.name"))
    {
        return Ok(bridge.clone());
    }
    let id = net.id.unwrap_or_default();
    match id.get(..12) {
        Some(short) => Ok(format!("br-{short}")),
        None => Err(Error::internal(format!("network {name} has no id"))),
    }
}

/// Docker's rules for an internal network drop traffic *through* the host, not traffic *to* it: a sandbox
/// could open connections to any host service listening on all addresses (the runtime's API with
/// `MENTIS_LISTEN=0.0.0.0:...`, for one) through its gateway. This drops new connections from the bridge to
/// the host; replies to connections the host opens (the runtime calling executors) still pass.
pub(crate) async fn guard_host(bridge: &str) -> Result<()> {
    let rule = [
        "INPUT",
        "-i",
        bridge,
        "-m",
        "conntrack",
        "--ctstate",
        "NEW",
        "-j",
        "DROP",
    ];
    let iptables = |op: &str| {
        let mut args = vec!["-w", op];
        args.extend(rule);
        tokio::process::Command::new("iptables")
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .output()
    };
    let check = iptables("-C")
        .await
        .map_err(|e| Error::unavailable("cannot run iptables to guard the host").with_source(e))?;
    if check.status.success() {
        return Ok(());
    }
    let insert = iptables("-I")
        .await
        .map_err(|e| Error::unavailable("cannot run iptables to guard the host").with_source(e))?;
    if !insert.status.success() {
        return Err(Error::unavailable(format!(
            "cannot keep sandboxes on {bridge} from the host (iptables: {})",
            String::from_utf8_lossy(&insert.stderr).trim()
        )));
    }
    tracing::info!(%bridge, "sandboxes on this bridge cannot open connections to the host");
    Ok(())
}

/// Creates a network when it is missing; checks that an existing one is as internal as it must be.
async fn ensure_one(docker: &Docker, name: &str, internal: bool) -> Result<()> {
    match docker.inspect_network(name, None).await {
        Ok(net) => {
            let icc_off = net
                .options
                .as_ref()
                .and_then(|o| o.get("com.docker.network.bridge.enable_icc"))
                .map(String::as_str)
                == Some("false");
            if net.internal.unwrap_or(false) != internal || !icc_off {
                return Err(Error::new(
                    Reason::FailedPrecondition,
                    format!(
                        "network {name} exists with other settings (internal={internal} and inter-container \
                     traffic off are needed); remove it and let the runtime create it"
                    ),
                ));
            }
            return Ok(());
        }
        Err(e) if is_not_found(&e) => {}
        Err(e) => return Err(to_core("inspect the executor network", e)),
    }
    let request = NetworkCreateRequest {
        name: name.to_owned(),
        driver: Some("bridge".into()),
        internal: Some(internal),
        options: Some(HashMap::from([(
            "com.docker.network.bridge.enable_icc".to_owned(),
            "false".to_owned(),
        )])),
        labels: Some(HashMap::from([(
            LABEL_MANAGED.to_owned(),
            "true".to_owned(),
        )])),
        ..Default::default()
    };
    match docker.create_network(request).await {
        Ok(_) => {
            tracing::info!(network = %name, internal, "created a network");
            Ok(())
        }
        // Another runtime instance created it at the same moment.
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => Ok(()),
        Err(e) => Err(to_core("create a network", e)),
    }
}

/// Runs `iptables -w <args>`: whether it succeeded (a check that does not match, a chain that exists).
/// Err only when iptables cannot be run.
pub(crate) async fn iptables(args: &[&str]) -> Result<bool> {
    Ok(run_iptables(args).await?.status.success())
}

/// Runs `iptables -w <args>`, which must succeed.
pub(crate) async fn iptables_ok(args: &[&str]) -> Result<()> {
    let out = run_iptables(args).await?;
    if out.status.success() {
        return Ok(());
    }
    Err(Error::unavailable(format!(
        "iptables {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    )))
}

async fn run_iptables(args: &[&str]) -> Result<std::process::Output> {
    tokio::process::Command::new("iptables")
        .arg("-w")
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .output()
        .await
        .map_err(|e| Error::unavailable("cannot run iptables").with_source(e))
}
