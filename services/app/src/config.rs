//! Runtime configuration, read once from the environment into typed, validated settings. Bad config stops
//! the runtime at start with a message naming the variable.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

pub use mentis_backend_docker::ContainerRuntime;
use mentis_backend_docker::DockerConfig;
pub use mentis_core::DataMount;
use mentis_core::{Expiry, IdlePolicy, LimitsPolicy, SpaceId};

mod auth;
mod builds;
mod egress;
mod error;
mod kubernetes;
mod limits;
mod preview;
mod snapshots;
mod transport;

pub use error::ConfigError;
use error::err;

pub use auth::AuthConfig;
pub use builds::{BuildPolicy, MAX_BUILD_MEMORY_MB};
pub use egress::EgressConfig;
pub use kubernetes::{BackendChoice, KubernetesSettings, Workspace};
pub use limits::DiskLimits;
pub use snapshots::SnapshotStoreConfig;
pub use transport::{
    ConnectionLimits, DEFAULT_MAX_MESSAGE_BYTES, SIDE_LISTENER_CONNECTIONS, TlsFiles,
};

use crate::observations::LogLimits;

/// Default address of the public gRPC API.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:50051";
/// Default executor image, built by `deploy/build-executor-image.sh`.
pub const DEFAULT_EXECUTOR_IMAGE: &str = "mentis/executor:latest";

/// OCI runtime of sandbox containers: `runc` (default), `runsc` (gVisor; start fails when the engine lacks
/// it) or `auto` (runsc when the engine offers it).
pub const CONTAINER_RUNTIME_ENV: &str = "MENTIS_CONTAINER_RUNTIME";
/// Runtime classes templates and spaces may name, separated by commas (none by default).
pub const RUNTIME_CLASSES_ENV: &str = "MENTIS_RUNTIME_CLASSES";

/// Everything the runtime needs to know at start.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// `MENTIS_LISTEN`.
    pub listen: SocketAddr,
    /// `MENTIS_METRICS_LISTEN`: where `GET /metrics` (Prometheus text format) is served; off when None.
    pub metrics_listen: Option<SocketAddr>,
    /// `MENTIS_HEALTH_LISTEN`: a second listener serving only `grpc.health.v1`, in plaintext whatever the
    /// API's transport, for probes that cannot speak TLS or carry a client certificate (Kubernetes' gRPC
    /// probes, Docker's HEALTHCHECK through `mentis-runtime healthcheck`); off when None.
    pub health_listen: Option<SocketAddr>,
    /// `MENTIS_HTTP_LISTEN`: where the web terminal is served (`GET /terminal`, its WebSocket
    /// `/terminal/ws`), in plaintext HTTP, reached with links TerminalService.CreateTerminalLink makes; off
    /// when None.
    pub http_listen: Option<SocketAddr>,
    /// `MENTIS_PREVIEW_BASE_URL`: the scheme, host and port clients reach the HTTP listener at, put in
    /// front of preview URLs (`http://` and the listener's address when None).
    pub preview_base_url: Option<String>,
    /// `MENTIS_PREVIEW_DOMAIN`: preview URLs are host-based, `<port>-<sandbox>.<domain>`, each app on an
    /// origin of its own (a wildcard DNS name pointing at the HTTP listener); path-based when None.
    pub preview_domain: Option<String>,
    /// `MENTIS_EXECUTOR_IMAGE`: image of sandboxes whose spec names none.
    pub executor_image: String,
    /// `MENTIS_DATA_DIR`: the durable store (`mentis.db`).
    pub data_dir: PathBuf,
    /// `MENTIS_INSTANCE`, `MENTIS_NETWORK`, `MENTIS_CONTAINER_RUNTIME` (the instance, the sandbox user and
    /// the executor's settings hold for either backend).
    pub docker: DockerConfig,
    /// `MENTIS_BACKEND` (docker|kubernetes, default docker) and the Kubernetes backend's `MENTIS_K8S_*`
    /// (docs/KUBERNETES.md).
    pub backend: BackendChoice,
    /// `MENTIS_SANDBOX_DEFAULT`, `MENTIS_SANDBOX_MAX`: default and maximum limits of a sandbox, as
    /// `cpu=1,memory_mb=1024,pids=512,nofile=1024,disk_mb=4096` (any subset). Spaces may narrow them.
    /// With `disk_limits` off the runtime starts with this policy's disk limits taken out.
    pub limits: LimitsPolicy,
    /// `MENTIS_DISK_LIMITS` (loop|off, default loop): whether each workspace is a filesystem of its own,
    /// sized by the sandbox's disk limit (images under `MENTIS_DATA_DIR/disks`).
    pub disk_limits: DiskLimits,
    /// `MENTIS_RUNTIME_CLASSES`: the runtime classes templates and spaces may name (`runtime_class`),
    /// separated by commas: engine runtimes on Docker (`runsc`), RuntimeClasses on Kubernetes (`gvisor`).
    /// None by default: every sandbox runs under the runtime's default (`MENTIS_CONTAINER_RUNTIME`,
    /// `MENTIS_K8S_RUNTIME_CLASS`).
    pub runtime_classes: mentis_core::runtime_class::Offered,
    /// `MENTIS_READ_ONLY_ROOTFS` (true|false, default true): root filesystem of sandboxes whose spec and
    /// space leave it unspecified. A writable root's layer is on the host's disk, outside any disk limit.
    pub read_only_rootfs: bool,
    /// `MENTIS_LOG_MAX_ENTRIES`, `MENTIS_LOG_MAX_BYTES`: bounds of each sandbox's observation log;
    /// `MENTIS_LOG_MEMORY_BYTES` (256 MiB): what all journaled logs together keep in memory.
    pub log_limits: LogLimits,
    /// `MENTIS_LOG_JOURNAL` (on|off, default on): each sandbox's log is also written to a journal under
    /// `MENTIS_DATA_DIR/logs`, so it survives a restart. `off` keeps logs in memory only (a restart then
    /// loses them); `make bench` uses it to show what the journal costs.
    pub log_journal: bool,
    /// `MENTIS_MAX_SANDBOXES`: live sandboxes at once.
    pub max_sandboxes: usize,
    /// `MENTIS_MAX_ACTIONS_PER_SANDBOX`: running actions per sandbox at once.
    pub max_actions_per_sandbox: usize,
    /// Terminals: `MENTIS_MAX_TERMINALS_PER_SANDBOX`, `MENTIS_TERMINAL_IDLE_SECS`,
    /// `MENTIS_TERMINAL_SCROLLBACK_BYTES`.
    pub terminals: TerminalPolicy,
    /// `MENTIS_READY_TIMEOUT_SECS`: how long a new sandbox's executor has to become healthy.
    pub ready_timeout: Duration,
    /// Upper bound of unary executor calls.
    pub executor_call_timeout: Duration,
    /// `MENTIS_EXECUTOR_KEEPALIVE_SECS`: HTTP/2 ping interval (and ping timeout) towards executors.
    pub executor_keepalive: Duration,
    /// `MENTIS_HEALTH_INTERVAL_SECS`: how often each sandbox's executor is health-checked.
    pub health_interval: Duration,
    /// `MENTIS_ENDED_RETENTION_SECS`: how long a deleted or failed sandbox stays readable (Get, its log).
    pub ended_retention: Duration,
    /// `MENTIS_STREAM_KEEPALIVE_SECS`, `MENTIS_STREAM_STALL_SECS`: keepalives on idle streams, and how long
    /// a client may stop reading before it is cut off.
    pub stream: StreamPolicy,
    /// `MENTIS_IDLE_TIMEOUT_SECS` (0 = never), `MENTIS_IDLE_POLICY` (pause|delete|keep),
    /// `MENTIS_MAX_LIFETIME_SECS` (0 = none): expiry of sandboxes whose spec leaves these at zero.
    pub expiry: Expiry,
    /// `MENTIS_EGRESS_DEFAULT` (deny|allow): egress of sandboxes whose spec leaves it unspecified.
    pub egress_default: bool,
    /// `MENTIS_EGRESS_HOSTS`, `MENTIS_EGRESS_CA_FILES`: the egress gateway's names and upstream CAs.
    pub egress: EgressConfig,
    /// `MENTIS_REAPER_INTERVAL_SECS`: how often expiry is checked.
    pub reaper_interval: Duration,
    /// `MENTIS_DATA_MOUNTS`: host folders mounted read-only into the sandboxes of a space, as
    /// `SPACE=HOST_DIR:TARGET` entries separated by `;` (`*` for every space), for example
    /// `research=/srv/datasets:/data`.
    pub data_mounts: Vec<SpaceMount>,
    /// `MENTIS_POOL`: warm pools, as `IMAGE=MIN_IDLE:MAX_TOTAL[:kernel]` entries separated by `;`
    /// (`default` = the default executor image; `:kernel` starts each member's IPython kernel ahead), for
    /// example `default=2:16:kernel`.
    pub pools: Vec<PoolConfig>,
    /// `MENTIS_AUTH` (keys|disabled), `MENTIS_ADMIN_KEY` or `MENTIS_ADMIN_KEY_FILE`.
    pub auth: AuthConfig,
    /// `MENTIS_TLS_CERT` and `MENTIS_TLS_KEY` (PEM files): the API over TLS instead of plaintext;
    /// `MENTIS_TLS_CLIENT_CA` (PEM): clients must also present a certificate this CA signed (mutual TLS).
    pub tls: Option<TlsFiles>,
    /// `MENTIS_MAX_MESSAGE_BYTES` (4 MiB): the largest message a client may send (ActionService always
    /// admits the largest action the model accepts).
    pub max_message_bytes: usize,
    /// `MENTIS_MAX_CONNECTIONS`, `MENTIS_MAX_CONNECTIONS_PER_ADDRESS`, `MENTIS_FIRST_REQUEST_SECS`,
    /// `MENTIS_CONNECTION_IDLE_SECS`: what each listener admits.
    pub connections: ConnectionLimits,
    /// `MENTIS_MCP_MAX_OUTPUT` (20000): bytes of one output the MCP tools at `/mcp` give back at most (head
    /// and tail, with a note of what was left out).
    pub mcp_max_output: usize,
    /// Where snapshots go: `MENTIS_DATA_DIR/snapshots`, or the bucket of `MENTIS_S3_ENDPOINT` (with
    /// `MENTIS_S3_BUCKET`, `MENTIS_S3_REGION` (us-east-1), `MENTIS_S3_PREFIX`; credentials from `AWS_*`).
    pub snapshot_store: SnapshotStoreConfig,
    /// `MENTIS_BUILD_LIMITS` (`cpu=1,memory_mb=1024`), `MENTIS_BUILD_EGRESS` (deny|allow, default deny):
    /// what each RUN step of an image build gets, and whether a build may ask for a route out.
    pub builds: BuildPolicy,
}

/// Terminals (TerminalService).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TerminalPolicy {
    /// Running terminals per sandbox at once (16).
    pub max_per_sandbox: usize,
    /// A terminal with no attached client for this long is closed, unless its start asked for another
    /// timeout (15 minutes).
    pub idle_timeout: Duration,
    /// Output kept per terminal for clients that attach again (1 MiB).
    pub scrollback_bytes: usize,
}

impl Default for TerminalPolicy {
    fn default() -> Self {
        Self {
            max_per_sandbox: 16,
            idle_timeout: Duration::from_secs(900),
            scrollback_bytes: 1 << 20,
        }
    }
}

/// A warm pool: containers of one image made ahead with a healthy executor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolConfig {
    pub image: String,
    /// Idle members kept ready.
    pub min_idle: usize,
    /// Members (idle and being made) at most.
    pub max_total: usize,
    /// Members start their IPython kernel ahead.
    pub kernel: bool,
}

fn parse_pools(value: &str, default_image: &str) -> Result<Vec<PoolConfig>, ConfigError> {
    const VAR: &str = "MENTIS_POOL";
    let mut out: Vec<PoolConfig> = Vec::new();
    for entry in value.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: &str| {
            err(
                VAR,
                value,
                format!("{entry:?}: {why} (use IMAGE=MIN_IDLE:MAX_TOTAL)"),
            )
        };
        let (image, sizes) = entry.rsplit_once('=').ok_or_else(|| bad("no '='"))?;
        let mut parts = sizes.split(':');
        let (min, max) = match (parts.next(), parts.next()) {
            (Some(min), Some(max)) => (min, max),
            _ => return Err(bad("no ':'")),
        };
        let kernel = match parts.next().map(str::trim) {
            None => false,
            Some("kernel") => true,
            Some(_) => return Err(bad("the third part may only be `kernel`")),
        };
        let min_idle: usize = min
            .trim()
            .parse()
            .map_err(|_| bad("MIN_IDLE is not a number"))?;
        let max_total: usize = max
            .trim()
            .parse()
            .map_err(|_| bad("MAX_TOTAL is not a number"))?;
        if max_total == 0 || min_idle > max_total || max_total > 1024 {
            return Err(bad(
                "need 0 <= MIN_IDLE <= MAX_TOTAL, 1 <= MAX_TOTAL <= 1024",
            ));
        }
        let image = match image.trim() {
            "default" => default_image.to_owned(),
            i => i.to_owned(),
        };
        // A name Docker would refuse can never make a member: say so at the start.
        if let Err(why) = mentis_core::image::check_reference(&image) {
            return Err(bad(&format!("not an image reference: {why}")));
        }
        if out.iter().any(|p| p.image == image) {
            return Err(bad("a second pool for the same image"));
        }
        out.push(PoolConfig {
            image,
            min_idle,
            max_total,
            kernel,
        });
    }
    Ok(out)
}

/// A host folder the sandboxes of one space (or all) see read-only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpaceMount {
    /// `None` = every space.
    pub space: Option<String>,
    pub mount: DataMount,
}

impl RuntimeConfig {
    /// The egress of sandboxes whose spec and template leave it unspecified.
    pub fn default_egress(&self) -> mentis_core::egress::Egress {
        if self.egress_default {
            mentis_core::egress::Egress::Allow
        } else {
            mentis_core::egress::Egress::Deny
        }
    }

    /// The folder of the workspaces' filesystem images (`MENTIS_DATA_DIR/disks`).
    pub fn disks_dir(&self) -> PathBuf {
        self.data_dir.join("disks")
    }

    /// The folder of a sandbox's observation journal (`MENTIS_DATA_DIR/logs/<sandbox id>`).
    pub fn log_dir(&self, id: mentis_core::SandboxId) -> PathBuf {
        self.data_dir.join("logs").join(id.to_string())
    }

    /// The read-only mounts every space gets (what a warm pool member is made with).
    pub fn mounts_for_every_space(&self) -> Vec<DataMount> {
        self.data_mounts
            .iter()
            .filter(|m| m.space.is_none())
            .map(|m| m.mount.clone())
            .collect()
    }

    /// The read-only mounts of a sandbox in `space`.
    pub fn mounts_for(&self, space: &str) -> Vec<DataMount> {
        self.data_mounts
            .iter()
            .filter(|m| m.space.as_deref().is_none_or(|s| s == space))
            .map(|m| m.mount.clone())
            .collect()
    }
}

fn parse_mounts(value: &str) -> Result<Vec<SpaceMount>, ConfigError> {
    const VAR: &str = "MENTIS_DATA_MOUNTS";
    let mut out = Vec::new();
    for entry in value.split(';').map(str::trim).filter(|e| !e.is_empty()) {
        let bad = |why: &str| {
            err(
                VAR,
                value,
                format!("{entry:?}: {why} (use SPACE=HOST_DIR:TARGET)"),
            )
        };
        let (space, rest) = entry.split_once('=').ok_or_else(|| bad("no '='"))?;
        let (host, target) = rest.rsplit_once(':').ok_or_else(|| bad("no ':'"))?;
        let space = match space.trim() {
            "*" => None,
            s => Some(
                SpaceId::parse(s)
                    .map_err(|e| bad(&e.to_string()))?
                    .as_str()
                    .to_owned(),
            ),
        };
        let host = std::path::PathBuf::from(host.trim());
        if !host.is_absolute() || !host.is_dir() {
            return Err(bad(
                "the host folder must be an absolute path to an existing folder",
            ));
        }
        let target = target.trim();
        let target_ok = target.starts_with('/')
            && target != "/"
            && !target.split('/').any(|c| c == "..")
            && !(target == "/workspace" || target.starts_with("/workspace/"))
            && target.bytes().all(|b| b.is_ascii_graphic() && b != b',');
        if !target_ok {
            return Err(bad(
                "the target must be an absolute path outside /workspace",
            ));
        }
        out.push(SpaceMount {
            space,
            mount: DataMount {
                host,
                target: target.to_owned(),
            },
        });
    }
    Ok(out)
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            listen: DEFAULT_LISTEN
                .parse()
                .unwrap_or_else(|_| SocketAddr::from(([127, 0, 0, 1], 50051))),
            metrics_listen: None,
            health_listen: None,
            http_listen: None,
            preview_base_url: None,
            preview_domain: None,
            executor_image: DEFAULT_EXECUTOR_IMAGE.into(),
            data_dir: PathBuf::from("mentis-data"),
            docker: DockerConfig::default(),
            backend: BackendChoice::Docker,
            limits: LimitsPolicy::default(),
            disk_limits: DiskLimits::Loop,
            runtime_classes: mentis_core::runtime_class::Offered::default(),
            read_only_rootfs: true,
            log_limits: LogLimits::default(),
            log_journal: true,
            max_sandboxes: 256,
            max_actions_per_sandbox: 64,
            terminals: TerminalPolicy::default(),
            ready_timeout: Duration::from_secs(60),
            executor_call_timeout: Duration::from_secs(30),
            executor_keepalive: Duration::from_secs(10),
            health_interval: Duration::from_secs(5),
            ended_retention: Duration::from_secs(3600),
            stream: StreamPolicy::default(),
            expiry: Expiry {
                idle_timeout: Duration::from_secs(30 * 60),
                idle_policy: IdlePolicy::Pause,
                max_lifetime: Duration::ZERO,
                auto_resume: false,
            },
            reaper_interval: Duration::from_secs(10),
            data_mounts: Vec::new(),
            egress_default: false,
            egress: EgressConfig::default(),
            pools: Vec::new(),
            auth: AuthConfig::default(),
            tls: None,
            max_message_bytes: DEFAULT_MAX_MESSAGE_BYTES,
            connections: ConnectionLimits::default(),
            mcp_max_output: mentis_mcp::DEFAULT_MAX_OUTPUT,
            snapshot_store: SnapshotStoreConfig::Local,
            builds: BuildPolicy::default(),
        }
    }
}

impl RuntimeConfig {
    /// Reads the settings from the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Reads the settings through `get` (the environment, or a map in tests).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let disk_limits = limits::disk_limits(&get)?;
        let mut c = Self {
            auth: auth::from_lookup(&get)?,
            backend: kubernetes::backend(&get)?,
            tls: transport::tls(&get)?,
            connections: transport::connection_limits(&get)?,
            snapshot_store: snapshots::snapshot_store(&get)?,
            builds: builds::policy(&get)?,
            limits: limits::policy(&get, LimitsPolicy::default(), disk_limits)?,
            disk_limits,
            read_only_rootfs: limits::read_only(&get)?,
            ..Self::default()
        };
        if let BackendChoice::Kubernetes(k8s) = &c.backend
            && matches!(k8s.workspace, Workspace::Claim { .. })
            && disk_limits == DiskLimits::Off
        {
            return Err(err(
                "MENTIS_DISK_LIMITS",
                "off",
                "a workspace claim (MENTIS_K8S_WORKSPACE=pvc) is as large as the sandbox's disk limit: \
                 keep disk limits on",
            ));
        }
        if let Some(v) = get("MENTIS_LISTEN") {
            c.listen = parse("MENTIS_LISTEN", &v)?;
        }
        if let Some(v) = get("MENTIS_METRICS_LISTEN").filter(|v| !v.is_empty()) {
            c.metrics_listen = Some(parse("MENTIS_METRICS_LISTEN", &v)?);
        }
        if let Some(v) = get("MENTIS_HEALTH_LISTEN").filter(|v| !v.is_empty()) {
            c.health_listen = Some(parse("MENTIS_HEALTH_LISTEN", &v)?);
        }
        if let Some(v) = get("MENTIS_HTTP_LISTEN").filter(|v| !v.is_empty()) {
            c.http_listen = Some(parse("MENTIS_HTTP_LISTEN", &v)?);
        }
        if let Some(v) = get("MENTIS_PREVIEW_BASE_URL").filter(|v| !v.is_empty()) {
            c.preview_base_url = Some(preview::base_url(&v)?);
        }
        if let Some(v) = get("MENTIS_PREVIEW_DOMAIN").filter(|v| !v.is_empty()) {
            c.preview_domain = Some(preview::domain(&v)?);
        }
        if let Some(v) = get("MENTIS_MCP_MAX_OUTPUT").filter(|v| !v.is_empty()) {
            c.mcp_max_output = positive("MENTIS_MCP_MAX_OUTPUT", &v)?;
        }
        if let Some(v) = get("MENTIS_EXECUTOR_IMAGE").filter(|v| !v.is_empty()) {
            if let Err(why) = mentis_core::image::check_reference(&v) {
                return Err(err(
                    "MENTIS_EXECUTOR_IMAGE",
                    &v,
                    format!("not an image reference: {why}"),
                ));
            }
            c.executor_image = v;
        }
        if let Some(v) = get("MENTIS_DATA_DIR").filter(|v| !v.is_empty()) {
            c.data_dir = PathBuf::from(v);
        }
        if let Some(v) = get("MENTIS_INSTANCE") {
            let ok = !v.is_empty()
                && v.len() <= 63
                && v.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
            if !ok {
                return Err(err(
                    "MENTIS_INSTANCE",
                    &v,
                    "use 1-63 letters, digits, '-' or '_'",
                ));
            }
            c.docker.instance = v;
        }
        if let Some(v) = get("MENTIS_NETWORK").filter(|v| !v.is_empty()) {
            c.docker.network = v;
        }
        if let Some(v) = get(CONTAINER_RUNTIME_ENV) {
            c.docker.runtime = ContainerRuntime::parse(&v)
                .ok_or_else(|| err(CONTAINER_RUNTIME_ENV, &v, "use runc, runsc or auto"))?;
        }
        if let Some(v) = get(RUNTIME_CLASSES_ENV) {
            c.runtime_classes = mentis_core::runtime_class::Offered::parse(&v)
                .map_err(|why| err(RUNTIME_CLASSES_ENV, &v, why))?;
        }
        if let Some(v) = get("MENTIS_LOG_MAX_ENTRIES") {
            c.log_limits.max_entries = positive("MENTIS_LOG_MAX_ENTRIES", &v)?;
        }
        if let Some(v) = get("MENTIS_LOG_MAX_BYTES") {
            c.log_limits.max_bytes = positive("MENTIS_LOG_MAX_BYTES", &v)?;
        }
        if let Some(v) = get("MENTIS_LOG_MEMORY_BYTES") {
            let limit = positive("MENTIS_LOG_MEMORY_BYTES", &v)?;
            c.log_limits.memory =
                std::sync::Arc::new(crate::observations::MemoryBudget::new(limit));
        }
        match get("MENTIS_LOG_JOURNAL").as_deref() {
            None | Some("on") => {}
            Some("off") => c.log_journal = false,
            Some(v) => return Err(err("MENTIS_LOG_JOURNAL", v, "use on or off")),
        }
        if let Some(v) = get("MENTIS_MAX_SANDBOXES") {
            c.max_sandboxes = positive("MENTIS_MAX_SANDBOXES", &v)?;
        }
        if let Some(v) = get("MENTIS_MAX_ACTIONS_PER_SANDBOX") {
            c.max_actions_per_sandbox = positive("MENTIS_MAX_ACTIONS_PER_SANDBOX", &v)?;
        }
        if let Some(v) = get("MENTIS_MAX_TERMINALS_PER_SANDBOX") {
            c.terminals.max_per_sandbox = positive("MENTIS_MAX_TERMINALS_PER_SANDBOX", &v)?;
        }
        if let Some(v) = get("MENTIS_TERMINAL_IDLE_SECS") {
            c.terminals.idle_timeout = secs("MENTIS_TERMINAL_IDLE_SECS", &v)?;
        }
        if let Some(v) = get("MENTIS_TERMINAL_SCROLLBACK_BYTES") {
            c.terminals.scrollback_bytes = positive("MENTIS_TERMINAL_SCROLLBACK_BYTES", &v)?;
        }
        if let Some(v) = get("MENTIS_EXECUTOR_KEEPALIVE_SECS") {
            c.executor_keepalive = secs("MENTIS_EXECUTOR_KEEPALIVE_SECS", &v)?;
        }
        if let Some(v) = get("MENTIS_HEALTH_INTERVAL_SECS") {
            c.health_interval = secs("MENTIS_HEALTH_INTERVAL_SECS", &v)?;
        }
        if let Some(v) = get("MENTIS_ENDED_RETENTION_SECS") {
            c.ended_retention = secs("MENTIS_ENDED_RETENTION_SECS", &v)?;
        }
        if let Some(v) = get("MENTIS_STREAM_KEEPALIVE_SECS") {
            c.stream.keepalive = secs("MENTIS_STREAM_KEEPALIVE_SECS", &v)?;
        }
        if let Some(v) = get("MENTIS_STREAM_STALL_SECS") {
            c.stream.stall = secs("MENTIS_STREAM_STALL_SECS", &v)?;
        }
        if let Some(v) = get("MENTIS_IDLE_TIMEOUT_SECS") {
            c.expiry.idle_timeout = Duration::from_secs(parse("MENTIS_IDLE_TIMEOUT_SECS", &v)?);
        }
        if let Some(v) = get("MENTIS_IDLE_POLICY") {
            c.expiry.idle_policy = IdlePolicy::parse(&v)
                .ok_or_else(|| err("MENTIS_IDLE_POLICY", &v, "use pause, delete or keep"))?;
        }
        if let Some(v) = get("MENTIS_MAX_LIFETIME_SECS") {
            c.expiry.max_lifetime = Duration::from_secs(parse("MENTIS_MAX_LIFETIME_SECS", &v)?);
        }
        if let Some(v) = get("MENTIS_REAPER_INTERVAL_SECS") {
            c.reaper_interval = secs("MENTIS_REAPER_INTERVAL_SECS", &v)?;
        }
        if let Some(v) = get("MENTIS_EGRESS_DEFAULT") {
            c.egress_default = match v.as_str() {
                "deny" => false,
                "allow" => true,
                _ => return Err(err("MENTIS_EGRESS_DEFAULT", &v, "use deny or allow")),
            };
        }
        if let Some(v) = get("MENTIS_EGRESS_HOSTS") {
            c.egress.hosts = egress::hosts(&v)?;
        }
        if let Some(v) = get("MENTIS_EGRESS_CA_FILES") {
            c.egress.upstream_ca_files = egress::ca_files(&v)?;
        }
        if let Some(v) = get("MENTIS_DATA_MOUNTS") {
            c.data_mounts = parse_mounts(&v)?;
        }
        if let Some(v) = get("MENTIS_EXECUTOR_MAX_WRITE_BYTES") {
            let n = positive("MENTIS_EXECUTOR_MAX_WRITE_BYTES", &v)?;
            c.docker
                .executor_env
                .push(format!("MENTIS_EXECUTOR_MAX_WRITE_BYTES={n}"));
        }
        // Executors keep their spans for us to relay when we export traces (the executor's TRACES_ENV).
        if crate::telemetry::traces_endpoint(&get).is_some() {
            c.docker
                .executor_env
                .push("MENTIS_EXECUTOR_TRACES=1".to_owned());
        }
        if let Some(v) = get("MENTIS_POOL") {
            c.pools = parse_pools(&v, &c.executor_image)?;
        }
        if let Some(v) = get("MENTIS_MAX_MESSAGE_BYTES") {
            c.max_message_bytes = positive("MENTIS_MAX_MESSAGE_BYTES", &v)?;
        }
        if let Some(v) = get("MENTIS_READY_TIMEOUT_SECS") {
            c.ready_timeout =
                Duration::from_secs(positive("MENTIS_READY_TIMEOUT_SECS", &v)? as u64);
        }
        Ok(c)
    }
}

fn parse<T: std::str::FromStr>(var: &'static str, value: &str) -> Result<T, ConfigError>
where
    T::Err: std::fmt::Display,
{
    value
        .parse()
        .map_err(|e: T::Err| err(var, value, e.to_string()))
}

fn secs(var: &'static str, value: &str) -> Result<Duration, ConfigError> {
    Ok(Duration::from_secs(positive(var, value)? as u64))
}

fn positive(var: &'static str, value: &str) -> Result<usize, ConfigError> {
    match parse::<usize>(var, value)? {
        0 => Err(err(var, value, "must be at least 1")),
        n => Ok(n),
    }
}

/// Timing and bounds of outgoing streams.
#[derive(Debug, Clone, Copy)]
pub struct StreamPolicy {
    /// Idle time after which a keepalive is sent.
    pub keepalive: Duration,
    /// How long a client may leave a full buffer unread before it is cut off.
    pub stall: Duration,
    /// Messages buffered per stream.
    pub buffer: usize,
}

impl Default for StreamPolicy {
    fn default() -> Self {
        Self {
            keepalive: Duration::from_secs(15),
            stall: Duration::from_secs(60),
            buffer: 64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn cfg(pairs: &[(&str, &str)]) -> Result<RuntimeConfig, ConfigError> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).into(), (*v).into()))
            .collect();
        RuntimeConfig::from_lookup(|k| m.get(k).cloned())
    }

    #[test]
    fn defaults_and_overrides() {
        let c = cfg(&[]).expect("defaults");
        assert_eq!(c.listen.to_string(), DEFAULT_LISTEN);
        assert_eq!(c.executor_image, DEFAULT_EXECUTOR_IMAGE);
        let c = cfg(&[
            ("MENTIS_LISTEN", "127.0.0.1:0"),
            ("MENTIS_EXECUTOR_IMAGE", "x:y"),
        ])
        .expect("ok");
        assert_eq!(c.listen.port(), 0);
        assert_eq!(c.executor_image, "x:y");
    }

    #[test]
    fn the_journal_is_on_unless_turned_off() {
        assert!(cfg(&[]).expect("defaults").log_journal);
        assert!(
            cfg(&[("MENTIS_LOG_JOURNAL", "on")])
                .expect("on")
                .log_journal
        );
        assert!(
            !cfg(&[("MENTIS_LOG_JOURNAL", "off")])
                .expect("off")
                .log_journal
        );
        let e = cfg(&[("MENTIS_LOG_JOURNAL", "maybe")]).expect_err("refused");
        assert_eq!(e.var, "MENTIS_LOG_JOURNAL");
    }

    #[test]
    fn data_mounts_parse_and_are_checked() {
        let c = cfg(&[(
            "MENTIS_DATA_MOUNTS",
            "research=/tmp:/data; *=/usr/share:/ref",
        )])
        .expect("ok");
        assert_eq!(c.mounts_for("research").len(), 2);
        assert_eq!(c.mounts_for("default").len(), 1);
        assert_eq!(c.mounts_for("default")[0].target, "/ref");
        for bad in [
            "research=/tmp",
            "research=tmp:/data",
            "research=/no/such/dir:/data",
            "research=/tmp:/workspace/x",
            "research=/tmp:/../etc",
            "Bad Space=/tmp:/data",
        ] {
            assert!(cfg(&[("MENTIS_DATA_MOUNTS", bad)]).is_err(), "{bad}");
        }
    }

    #[test]
    fn pools_parse_and_are_checked() {
        let c = cfg(&[
            ("MENTIS_EXECUTOR_IMAGE", "x:y"),
            ("MENTIS_POOL", "default=2:8; other:1=0:1:kernel"),
        ])
        .expect("ok");
        assert_eq!(c.pools.len(), 2);
        assert_eq!(
            (
                c.pools[0].image.as_str(),
                c.pools[0].min_idle,
                c.pools[0].max_total
            ),
            ("x:y", 2, 8)
        );
        assert_eq!(
            (
                c.pools[1].image.as_str(),
                c.pools[0].kernel,
                c.pools[1].kernel
            ),
            ("other:1", false, true)
        );
        for bad in [
            "default=3:2",
            "default=1",
            "default=a:b",
            "default=0:0",
            "default=1:2;default=1:2",
            "default=1:2:x",
            "../../etc=1:2",
            "UPPER/../x=1:2",
        ] {
            assert!(cfg(&[("MENTIS_POOL", bad)]).is_err(), "{bad}");
        }
        let e = cfg(&[("MENTIS_EXECUTOR_IMAGE", "mentis/Executor")]).expect_err("refused");
        assert!(e.to_string().contains("MENTIS_EXECUTOR_IMAGE"), "{e}");
    }

    #[test]
    fn runtime_classes_are_read_and_checked() {
        assert!(cfg(&[]).expect("default").runtime_classes.is_empty());
        let c = cfg(&[(RUNTIME_CLASSES_ENV, "runsc, kata-qemu")]).expect("two");
        assert_eq!(
            c.runtime_classes.names().collect::<Vec<_>>(),
            ["kata-qemu", "runsc"]
        );
        let e = cfg(&[(RUNTIME_CLASSES_ENV, "runsc,Kata")]).expect_err("upper case");
        assert_eq!(e.var, RUNTIME_CLASSES_ENV);
        assert!(e.to_string().contains("Kata"), "{e}");
    }

    #[test]
    fn container_runtime_is_read_and_checked() {
        assert_eq!(
            cfg(&[]).expect("defaults").docker.runtime,
            ContainerRuntime::Runc
        );
        for (value, want) in [
            ("runc", ContainerRuntime::Runc),
            ("runsc", ContainerRuntime::Runsc),
            ("auto", ContainerRuntime::Auto),
        ] {
            let c = cfg(&[(CONTAINER_RUNTIME_ENV, value)]).expect(value);
            assert_eq!(c.docker.runtime, want);
        }
        for bad in ["", "gvisor", "kata"] {
            let e = cfg(&[(CONTAINER_RUNTIME_ENV, bad)]).expect_err(bad);
            assert_eq!(e.var, CONTAINER_RUNTIME_ENV);
            assert!(e.to_string().contains("runc, runsc or auto"), "{e}");
        }
    }

    #[test]
    fn bad_values_name_the_variable() {
        let e = cfg(&[("MENTIS_LISTEN", "nope")]).expect_err("bad");
        assert_eq!(e.var, "MENTIS_LISTEN");
        assert!(cfg(&[("MENTIS_MAX_SANDBOXES", "0")]).is_err());
        assert!(cfg(&[("MENTIS_INSTANCE", "a b")]).is_err());
    }
}
