//! The seam between the control plane and where sandboxes run. It speaks in sandbox terms (spec, endpoint),
//! never in Docker terms, so a Kubernetes backend can sit beside the Docker one. Readiness is not the
//! backend's business: the control plane waits for the executor's gRPC health check, the same for all.

use std::fmt;

use crate::error::{Error, Result};
use crate::ids::{SandboxId, SpaceId};
use crate::sandbox::Limits;

/// What a backend needs to start one sandbox.
#[derive(Clone)]
pub struct BackendSpec {
    pub id: SandboxId,
    /// `None` for a warm pool member: its space is bound when it is claimed (in the store; labels cannot
    /// change after creation).
    pub space_id: Option<SpaceId>,
    pub image: String,
    pub limits: Limits,
    /// The secret the executor will require on every call. Never logged.
    pub token: String,
    /// Host folders mounted read-only into the sandbox.
    pub data_mounts: Vec<DataMount>,
    /// `NAME=VALUE` settings for the executor of this sandbox only (never secrets).
    pub executor_env: Vec<String>,
    /// Attach the network with a route out (the executor network has none).
    pub egress: bool,
    /// Attach the network in front of the egress gateway (EGRESS_RULES): its only way out is the gateway.
    pub gateway: bool,
    /// Only /workspace and a /tmp tmpfs are writable.
    pub read_only_rootfs: bool,
    /// The runtime class to run under (an engine runtime on Docker, a RuntimeClass on Kubernetes); `None`:
    /// the backend's default.
    pub runtime_class: Option<String>,
}

/// A host folder a sandbox sees read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataMount {
    /// Absolute path on the host.
    pub host: std::path::PathBuf,
    /// Absolute path in the sandbox (for example `/data`).
    pub target: String,
}

impl fmt::Debug for BackendSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BackendSpec")
            .field("id", &self.id)
            .field("space_id", &self.space_id)
            .field("image", &self.image)
            .field("limits", &self.limits)
            .field("data_mounts", &self.data_mounts)
            .field("runtime_class", &self.runtime_class)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// Where the egress gateway must be for a backend's sandboxes with EGRESS_RULES.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GatewayNetwork {
    /// The address (on this host) the network's traffic is sent to: the gateway listens there.
    pub address: std::net::Ipv4Addr,
    /// The runtime's own networks: never reachable through the gateway.
    pub own_networks: Vec<crate::egress::Cidr>,
}

/// Where a sandbox's executor answers gRPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// For example `http://172.20.0.3:50052`.
    pub uri: String,
    /// Its address on the network in front of the egress gateway, when attached there: the gateway knows
    /// the sandbox by it.
    pub gateway_source: Option<std::net::IpAddr>,
}

/// How the backend finds a sandbox's container (or pod).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendState {
    Running,
    Paused,
    /// Created or exited: it can be started again.
    Stopped,
    /// Only the workspace is left.
    Missing,
}

/// A sandbox the backend holds, as found when listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendSandbox {
    pub id: SandboxId,
    pub state: BackendState,
}

/// An image to build from a Dockerfile and its context.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ImageBuild {
    /// The name to tag it with.
    pub image: String,
    /// The Dockerfile's path in the context.
    pub dockerfile: String,
    pub build_args: std::collections::BTreeMap<String, String>,
    pub no_cache: bool,
    /// RUN steps get a route out (as a sandbox with egress) instead of no network at all.
    pub egress: bool,
    /// CPU cores of each RUN step.
    pub cpu: f64,
    /// Memory of each RUN step in MiB, with no swap beyond it.
    pub memory_mb: i64,
    /// The space it is built for (the image is labelled with it).
    pub space: String,
}

/// Label of the images a runtime builds or imports for a space: the space's id.
pub const IMAGE_SPACE_LABEL: &str = "io.mentis.space";

/// An image as the engine knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImageInfo {
    /// The engine's id (`sha256:...`), which every name of the image shares.
    pub id: String,
    /// Its names, as the engine lists them (`RepoTags` and `RepoDigests`, in their familiar form).
    pub names: Vec<String>,
    /// Its [`IMAGE_SPACE_LABEL`], when a runtime made it for a space.
    pub space_label: Option<String>,
}

/// Where sandboxes run.
#[async_trait::async_trait]
pub trait SandboxBackend: Send + Sync + 'static {
    /// Prepares what all sandboxes share (networks, ...). Idempotent; called once at start.
    async fn prepare(&self) -> Result<()>;

    /// Creates and starts a sandbox and returns its executor's endpoint. On failure nothing is left behind.
    async fn create(&self, spec: &BackendSpec) -> Result<Endpoint>;

    /// While the runtime waits for a new sandbox's executor: when its container stopped already (an image
    /// that cannot run a sandbox: no shell, a program that exits), the error that says why, so the create
    /// fails within seconds rather than at the ready timeout. None while it runs (or cannot tell).
    async fn why_stopped(&self, _id: SandboxId) -> Result<Option<Error>> {
        Ok(None)
    }

    /// The image `image` names, None when the engine has none (or this backend cannot tell).
    async fn image_info(&self, _image: &str) -> Result<Option<ImageInfo>> {
        Ok(None)
    }

    /// Whether the engine has `image` (a build's FROM must name one it has: there is no registry).
    async fn has_image(&self, _image: &str) -> Result<bool> {
        Ok(true)
    }

    /// Builds `build` from the context in the tar file `context`, handing its output to `output` as it
    /// comes; the image's id. FAILED_PRECONDITION when a step fails.
    async fn build_image(
        &self,
        _build: &ImageBuild,
        _context: &std::path::Path,
        _output: &(dyn Fn(String) + Send + Sync),
    ) -> Result<String> {
        Err(Error::new(
            crate::Reason::FailedPrecondition,
            "this backend cannot build images",
        ))
    }

    /// Makes image `image` from the root filesystem in the tar file `rootfs`, with Dockerfile
    /// instructions `changes`; its id.
    async fn import_image(
        &self,
        _image: &str,
        _changes: &[String],
        _rootfs: &std::path::Path,
    ) -> Result<String> {
        Err(Error::new(
            crate::Reason::FailedPrecondition,
            "this backend cannot import images",
        ))
    }

    /// Removes the sandbox and its workspace. Idempotent: succeeds when it is already gone.
    async fn delete(&self, id: SandboxId) -> Result<()>;

    /// Makes sure the sandbox's container runs (starting it again when it stopped) and returns its
    /// executor's endpoint, which may have changed. NotFound when the sandbox is gone from the backend;
    /// FailedPrecondition when it is paused.
    async fn ensure_running(&self, id: SandboxId) -> Result<Endpoint>;

    /// Stops the sandbox's container at once and starts it again, for an executor that runs but does not
    /// answer (stopped by a signal, wedged): every process in it ends, the workspace stays. Returns the
    /// executor's endpoint, which may have changed. NotFound when the sandbox is gone.
    async fn restart(&self, id: SandboxId) -> Result<Endpoint>;

    /// Changes the CPU, memory and pids limits of a running sandbox (binding a claimed pool member).
    async fn update_limits(&self, id: SandboxId, limits: Limits) -> Result<()>;

    /// Whether [`SandboxBackend::update_limits`] works here; when not, a pool member serves only requests
    /// with the default limits (gVisor's runsc cannot change a running container's limits).
    fn updates_limits(&self) -> bool {
        true
    }

    /// Whether a running sandbox made with limits `from` under `runtime_class` (`None`: the default) can be
    /// given limits `to` (a pool member claimed for a request): where not, the request is served by a
    /// sandbox made for it.
    fn changes_limits(&self, from: &Limits, to: &Limits, runtime_class: Option<&str>) -> bool {
        let _ = runtime_class;
        from == to || self.updates_limits()
    }

    /// Freezes every process of the sandbox (memory kept, no CPU). Idempotent. Where
    /// [`SandboxBackend::pauses_in_place`] is false: removes what runs (the workspace taken before by the
    /// application), as [`SandboxBackend::delete`] does.
    async fn pause(&self, id: SandboxId) -> Result<()>;

    /// Thaws a paused sandbox. Idempotent. Not called where [`SandboxBackend::pauses_in_place`] is false:
    /// the application creates the sandbox again and restores its workspace.
    async fn resume(&self, id: SandboxId) -> Result<()>;

    /// Whether a pause freezes the sandbox where it runs, its processes and memory kept (a container's
    /// cgroup freezer). When not (a pod cannot be frozen), the application pauses by snapshot: it takes
    /// the workspace, [`SandboxBackend::pause`] removes what runs, and a resume creates the sandbox again
    /// (same id and token) and restores the workspace; processes and the kernel's state do not survive.
    fn pauses_in_place(&self) -> bool {
        true
    }

    /// Every sandbox of this control-plane instance that the backend holds.
    async fn list(&self) -> Result<Vec<BackendSandbox>>;

    /// Whether the engine answers now (Unavailable when it does not): the runtime's health says
    /// NOT_SERVING while it does not.
    async fn ping(&self) -> Result<()>;

    /// The network in front of the egress gateway (EGRESS_RULES): where the gateway must listen to be
    /// reached from it, made at the first call. `None`: this backend cannot put sandboxes behind a gateway,
    /// and EGRESS_RULES is refused.
    async fn gateway_network(&self) -> Result<Option<GatewayNetwork>> {
        Ok(None)
    }

    /// Sends every TCP connection and DNS question of sandboxes on the gateway network to the gateway's
    /// ports on [`GatewayNetwork::address`], and forwards nothing else out of it. Idempotent.
    async fn route_to_gateway(&self, _tcp_port: u16, _dns_port: u16) -> Result<()> {
        Err(Error::new(
            crate::Reason::FailedPrecondition,
            "this backend cannot put sandboxes behind an egress gateway",
        ))
    }

    /// Whether sandboxes can be put behind an egress gateway here (EGRESS_RULES).
    fn supports_gateway(&self) -> bool {
        false
    }

    /// Attaches or detaches a running sandbox's networks for a changed egress policy: the egress network
    /// (`egress`, EGRESS_ALLOW) and the gateway's (`gateway`, EGRESS_RULES; routed with
    /// [`SandboxBackend::route_to_gateway`] first), leaving before joining, so it never has two ways out.
    /// Its address on the gateway network after. FAILED_PRECONDITION where a sandbox's networks are fixed.
    async fn set_egress(
        &self,
        _id: SandboxId,
        _egress: bool,
        _gateway: bool,
    ) -> Result<Option<std::net::IpAddr>> {
        Err(Error::new(
            crate::Reason::FailedPrecondition,
            "this backend cannot change a sandbox's egress in place: make a new sandbox with the policy",
        ))
    }

    /// Follows what happens to this instance's sandboxes from outside (a pod deleted by someone else,
    /// evicted, or on a node that was lost), calling `gone` with the id of each that went or will not run
    /// again, until the future is dropped; the health check of each such sandbox then runs at once rather
    /// than at its next interval. Ours may be among them (a delete, a pause by snapshot): `gone` is a hint.
    /// Backends that cannot tell return at once; the health checks notice in their time.
    async fn follow(&self, _gone: &(dyn Fn(SandboxId) + Send + Sync)) {}
}
