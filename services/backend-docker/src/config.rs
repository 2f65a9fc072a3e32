//! Settings of the Docker backend, read once by the runtime's config.

use std::path::PathBuf;
use std::time::Duration;

use crate::runtime::ContainerRuntime;

/// How the Docker backend names and bounds what it creates.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// Name of the control-plane instance; containers and volumes carry it in `io.mentis.instance`, and
    /// reconciliation only ever touches objects of its own instance.
    pub instance: String,
    /// Dedicated network of the executors (internal, inter-container traffic disabled).
    pub network: String,
    /// Second network, with a route out, attached to sandboxes whose spec allows egress.
    pub egress_network: String,
    /// The network in front of the egress gateway, attached to sandboxes with EGRESS_RULES: one per
    /// instance (its gateway knows only its own sandboxes), made at the first such sandbox.
    pub gateway_network: String,
    /// The sandbox user (uid:gid, numeric) that user code runs as and the workspace belongs to. The
    /// container starts as root so the executor can supervise it (docs/ARCHITECTURE.md, Security model).
    pub user: String,
    /// The image whose `/.mentis` (the static executor and tini) is brought into every sandbox, whatever
    /// its image (the runtime's default sandbox image, `MENTIS_EXECUTOR_IMAGE`).
    pub executor_image: String,
    /// Upper bound of any one Docker call.
    pub call_timeout: Duration,
    /// `NAME=VALUE` settings of the executor, given to every container (never secrets: they show in
    /// `docker inspect`; the token is the one secret and is removed by the executor from its env).
    pub executor_env: Vec<String>,
    /// OCI runtime of the sandbox containers: runc, runsc (gVisor) or auto.
    pub runtime: ContainerRuntime,
    /// Engine runtimes templates and spaces may name (`MENTIS_RUNTIME_CLASSES`), checked at connect.
    pub runtime_classes: Vec<String>,
    /// Folder of the workspaces' disk images (the runtime's `MENTIS_DATA_DIR/disks`). `None`: no sandbox
    /// can have a disk limit. Images there are attached again at start, whatever `disk_limits` says.
    pub disks_dir: Option<PathBuf>,
    /// New sandboxes may have disk limits (`MENTIS_DISK_LIMITS=loop`): the start checks the tools and loop
    /// devices they need.
    pub disk_limits: bool,
}

impl Default for DockerConfig {
    fn default() -> Self {
        Self {
            instance: "default".into(),
            network: "mentis-net".into(),
            egress_network: "mentis-egress".into(),
            gateway_network: "mentis-gw".into(),
            user: "1000:1000".into(),
            executor_image: "mentis/executor:latest".into(),
            call_timeout: Duration::from_secs(60),
            executor_env: Vec::new(),
            runtime: ContainerRuntime::Runc,
            runtime_classes: Vec::new(),
            disks_dir: None,
            disk_limits: false,
        }
    }
}
