//! `SandboxBackend` on a Docker engine, through bollard: one container and one named workspace volume per
//! sandbox, all on the dedicated network `mentis-net`, every object labelled so that nothing leaks.

mod config;
mod disk;
mod error;
mod gateway;
mod images;
mod inject;
mod labels;
mod layout;
mod network;
mod runtime;
mod volume;

use std::collections::HashMap;
use tracing::Instrument as _;

use bollard::Docker;
use bollard::models::{
    ContainerCreateBody, ContainerStateStatusEnum, EndpointSettings, HostConfig, NetworkingConfig,
    ResourcesUlimits,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, ListVolumesOptionsBuilder,
    RemoveContainerOptionsBuilder,
};
use mentis_core::{
    BackendSandbox, BackendSpec, BackendState, Endpoint, Error, Limits, Reason, Resource, Result,
    SandboxBackend, SandboxId,
};

pub use config::DockerConfig;
use error::{DockerCallExt, is_not_found};
pub use labels::{
    LABEL_DISK_IMAGE, LABEL_INSTANCE, LABEL_MANAGED, LABEL_POOL, LABEL_SANDBOX_ID, LABEL_SPACE_ID,
};
pub use runtime::{ContainerRuntime, RUNSC};

/// CONTAINER_GONE: the container of sandbox `id` vanished (the runtime ends the sandbox).
fn gone(id: SandboxId) -> Error {
    Error::new(
        Reason::ContainerGone,
        format!("the container of sandbox {id} is gone"),
    )
    .about(Resource::sandbox(id))
}

/// Memory in bytes and CPU in nano-CPUs, as the engine takes them.
fn docker_limits(limits: Limits) -> (i64, i64) {
    #[allow(clippy::cast_possible_truncation)]
    let nano_cpus = (limits.cpu * 1e9).round() as i64;
    (limits.memory_mb.saturating_mul(1024 * 1024), nano_cpus)
}

pub use mentis_core::layout::{EXECUTOR_PORT, SANDBOX_USER_ENV, TOKEN_ENV};

/// Docker implementation of [`SandboxBackend`].
pub struct DockerBackend {
    docker: Docker,
    config: DockerConfig,
    /// The runtime `config.runtime` resolved to against the engine, once at connect.
    runtime: runtime::Chosen,
    /// The workspaces' disk images (`config.disks_dir`).
    disks: Option<disk::Disks>,
    /// The engine's architecture (`amd64`, ...), which a sandbox's image must have.
    arch: String,
    /// The volume of `/.mentis` (see `inject`), once filled at `prepare`.
    executor_volume: std::sync::OnceLock<String>,
    /// The egress gateway's network and its bridge, once made (`gateway`).
    gateway: tokio::sync::OnceCell<(mentis_core::GatewayNetwork, String)>,
}

impl std::fmt::Debug for DockerBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DockerBackend")
            .field("config", &self.config)
            .field("runtime", &self.runtime)
            .finish()
    }
}

impl DockerBackend {
    /// Connects to the engine (DOCKER_HOST or the local socket) and negotiates the API version, because
    /// stock engines reject clients newer than themselves (Debian's 20.10 speaks API 1.41).
    pub async fn connect(config: DockerConfig) -> Result<Self> {
        let docker = Docker::connect_with_defaults().map_err(|e| {
            Error::new(Reason::EngineUnavailable, "cannot reach the Docker engine").with_source(e)
        })?;
        let docker = tokio::time::timeout(config.call_timeout, docker.negotiate_version())
            .await
            .map_err(|_| {
                Error::new(
                    Reason::EngineUnavailable,
                    "the Docker engine did not answer in time",
                )
            })?
            .map_err(|e| {
                Error::new(Reason::EngineUnavailable, "cannot reach the Docker engine")
                    .with_source(e)
            })?;
        let runtime = runtime::resolve(
            &docker,
            config.runtime,
            &config.runtime_classes,
            config.call_timeout,
        )
        .await?;
        let arch = tokio::time::timeout(config.call_timeout, docker.version())
            .await
            .ok()
            .and_then(Result::ok)
            .and_then(|v| v.arch)
            .unwrap_or_else(|| layout::docker_arch(std::env::consts::ARCH).to_owned());
        let disks = config
            .disks_dir
            .as_deref()
            .map(|dir| disk::Disks::new(dir, &config.user, config.call_timeout))
            .transpose()?;
        Ok(Self {
            docker,
            config,
            runtime,
            disks,
            arch,
            executor_volume: std::sync::OnceLock::new(),
            gateway: tokio::sync::OnceCell::new(),
        })
    }

    async fn container_status(&self, name: &str) -> Result<Option<ContainerStateStatusEnum>> {
        let info = self
            .call(
                "inspect container",
                self.docker.inspect_container(name, None),
            )
            .await
            .docker_ctx("inspect the container")?;
        Ok(info.state.and_then(|s| s.status))
    }

    /// The outcome of pause or unpause: NotFound when the container is gone; a refusal (409: already in
    /// that state, or not running) is success when the container is now `wanted`.
    async fn settle(
        &self,
        id: SandboxId,
        name: &str,
        result: Result<(), bollard::errors::Error>,
        wanted: ContainerStateStatusEnum,
        what: &str,
    ) -> Result<()> {
        match result {
            Ok(()) => Ok(()),
            Err(e) if is_not_found(&e) => Err(gone(id)),
            Err(e) if self.container_status(name).await? == Some(wanted) => {
                tracing::debug!(sandbox_id = %id, error = %e, "{what}: already done");
                Ok(())
            }
            Err(e) => Err(error::to_core(&format!("{what} the container"), e)),
        }
    }

    fn container_name(id: SandboxId) -> String {
        format!("mentis-{id}")
    }

    async fn call<T>(
        &self,
        what: &str,
        fut: impl std::future::Future<Output = Result<T, bollard::errors::Error>>,
    ) -> Result<T, bollard::errors::Error> {
        // A span per call made for a traced operation (`docker create container`, ...).
        let timed = tokio::time::timeout(self.config.call_timeout, fut);
        let result = if mentis_telemetry::in_trace() {
            timed
                .instrument(tracing::info_span!("docker", otel.name = %format!("docker {what}"), docker.call = what))
                .await
        } else {
            timed.await
        };
        if !matches!(result, Ok(Ok(_))) {
            docker_errors().add(1, &[opentelemetry::KeyValue::new("call", what.to_owned())]);
        }
        match result {
            Ok(r) => r,
            Err(_) => Err(bollard::errors::Error::RequestTimeoutError).inspect_err(|_| {
                tracing::warn!(what, "Docker call timed out");
            }),
        }
    }

    /// The containers (in every state) that `filters` select.
    async fn all_containers(
        &self,
        filters: &HashMap<String, Vec<String>>,
    ) -> Result<Vec<bollard::models::ContainerSummary>, bollard::errors::Error> {
        self.call(
            "list containers",
            self.docker.list_containers(Some(
                ListContainersOptionsBuilder::default()
                    .all(true)
                    .filters(filters)
                    .build(),
            )),
        )
        .await
    }

    /// The executor volume, filled at `prepare` (again, when it was removed by hand since).
    async fn executor_volume(&self) -> Result<String> {
        if let Some(volume) = self.executor_volume.get() {
            match self
                .call("inspect volume", self.docker.inspect_volume(volume))
                .await
            {
                Ok(_) => return Ok(volume.clone()),
                Err(e) if is_not_found(&e) => {
                    tracing::warn!(%volume, "the executor volume is gone: filling it again");
                }
                Err(e) => return Err(error::to_core("inspect the executor volume", e)),
            }
        }
        let volume = self.ensure_executor_volume().await?;
        let _ = self.executor_volume.set(volume.clone());
        Ok(volume)
    }

    async fn create_inner(&self, spec: &BackendSpec) -> Result<Endpoint> {
        self.check_image(spec.id, &spec.image).await?;
        let executor_volume = self.executor_volume().await?;
        let labels = labels::for_sandbox(&self.config.instance, spec.id, spec.space_id.as_ref());
        let volume = self.create_volume(spec, labels.clone()).await?;

        let (memory, nano_cpus) = docker_limits(spec.limits);
        let host_config = HostConfig {
            binds: Some(
                [
                    format!("{volume}:/workspace"),
                    format!("{executor_volume}:{}:ro", layout::MOUNT),
                ]
                .into_iter()
                .chain(
                    spec.data_mounts
                        .iter()
                        .map(|m| format!("{}:{}:ro", m.host.display(), m.target)),
                )
                .collect(),
            ),
            network_mode: Some(self.config.network.clone()),
            memory: Some(memory),
            // Equal to memory: no swap beyond the memory limit.
            memory_swap: Some(memory),
            nano_cpus: Some(nano_cpus),
            pids_limit: Some(spec.limits.pids),
            // The executor starts as root with these three only: its launcher gives a root-owned workspace
            // (an image without /workspace) to the sandbox user and drops CHOWN; the executor uses the
            // other two to become the supervisor of user code (real uid root, effective uid the sandbox
            // user) and start user processes as the sandbox user; user code ends up with none (see the
            // executor's launch and identity modules).
            cap_drop: Some(vec!["ALL".into()]),
            cap_add: Some(vec!["SETUID".into(), "SETGID".into(), "CHOWN".into()]),
            security_opt: Some(vec!["no-new-privileges".into()]),
            ulimits: Some(vec![ResourcesUlimits {
                name: Some("nofile".into()),
                soft: Some(spec.limits.nofile),
                hard: Some(spec.limits.nofile),
            }]),
            readonly_rootfs: Some(spec.read_only_rootfs),
            // With a read-only root, /tmp is a tmpfs and HOME points there (IPython, matplotlib and pip
            // write under HOME). Its pages count in the memory limit and cannot be reclaimed, so it gets half
            // of it: a command that fills /tmp gets ENOSPC while the executor and the kernel keep the other
            // half. (As large as the limit, a full /tmp left no memory at all: the OOM killer took the
            // executor and the container restarted, losing the kernel and /tmp.)
            tmpfs: spec.read_only_rootfs.then(|| {
                HashMap::from([(
                    "/tmp".to_owned(),
                    format!(
                        "rw,nosuid,nodev,mode=1777,size={}m",
                        (spec.limits.memory_mb / 2).max(1)
                    ),
                )])
            }),
            // The sandbox's own class (its template's or space's), else the runtime's default.
            runtime: spec
                .runtime_class
                .clone()
                .or_else(|| self.runtime.docker_name()),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            // Ours, from the executor volume, whatever the image's entrypoint and command (which are not
            // kept: a command is only appended to the image's own entrypoint).
            entrypoint: Some(layout::entrypoint()),
            cmd: Some(Vec::new()),
            working_dir: Some("/workspace".to_owned()),
            // Root, numeric so it holds for any image; the executor takes the sandbox user's identity at
            // once and runs user code as that user, never as root.
            user: Some("0:0".to_owned()),
            env: Some(
                std::iter::once(format!("{TOKEN_ENV}={}", spec.token))
                    .chain(std::iter::once(format!(
                        "{SANDBOX_USER_ENV}={}",
                        disk::owner_of(&self.config.user)
                    )))
                    .chain(self.config.executor_env.iter().cloned())
                    .chain(spec.executor_env.iter().cloned())
                    .chain(spec.read_only_rootfs.then(|| "HOME=/tmp".to_owned()))
                    .collect(),
            ),
            labels: Some(labels),
            host_config: Some(host_config),
            networking_config: Some(NetworkingConfig {
                endpoints_config: Some(HashMap::from([(
                    self.config.network.clone(),
                    EndpointSettings::default(),
                )])),
            }),
            ..Default::default()
        };
        let name = Self::container_name(spec.id);
        self.call(
            "create container",
            self.docker.create_container(
                Some(CreateContainerOptionsBuilder::default().name(&name).build()),
                body,
            ),
        )
        .await
        .map_err(|e| match &e {
            bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                message,
            } => Error::new(
                Reason::ImageMissing,
                format!(
                    "image {} is not available: {message}",
                    mentis_core::quoted(&spec.image)
                ),
            )
            .about(Resource::sandbox(spec.id)),
            _ => error::to_core("create the container", e),
        })?;
        if spec.gateway {
            // Its way out goes through the egress gateway only (`gateway`).
            self.gateway_net().await?;
            self.call(
                "connect the gateway network",
                self.docker.connect_network(
                    &self.config.gateway_network,
                    bollard::models::NetworkConnectRequest {
                        container: name.clone(),
                        ..Default::default()
                    },
                ),
            )
            .await
            .docker_ctx("attach the egress gateway's network")?;
        }
        if spec.egress {
            // A second network with a route out (inter-container traffic off there too); the executor is
            // still reached on the executor network.
            self.call(
                "connect egress network",
                self.docker.connect_network(
                    &self.config.egress_network,
                    bollard::models::NetworkConnectRequest {
                        container: name.clone(),
                        ..Default::default()
                    },
                ),
            )
            .await
            .docker_ctx("attach the egress network")?;
        }
        self.call("start container", self.docker.start_container(&name, None))
            .await
            .docker_ctx("start the container")?;
        self.release_disk(spec.id).await;

        match self.endpoint_of(&name).await {
            Ok(endpoint) => Ok(endpoint),
            // Stopped already (it has no address then): why, rather than the missing address.
            Err(e) => match self.why_stopped(spec.id).await {
                Ok(Some(stopped)) => Err(stopped),
                _ => Err(e),
            },
        }
    }

    /// The executor endpoint of a running container.
    async fn endpoint_of(&self, name: &str) -> Result<Endpoint> {
        let info = self
            .call(
                "inspect container",
                self.docker.inspect_container(name, None),
            )
            .await
            .docker_ctx("inspect the container")?;
        let mut networks = info
            .network_settings
            .and_then(|s| s.networks)
            .unwrap_or_default();
        let gateway_source = networks
            .remove(&self.config.gateway_network)
            .and_then(|e| e.ip_address)
            .and_then(|ip| ip.parse().ok());
        let ip = networks
            .remove(&self.config.network)
            .and_then(|e| e.ip_address)
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| {
                Error::internal(format!(
                    "container {name} has no address on network {}",
                    self.config.network
                ))
            })?;
        Ok(Endpoint {
            uri: format!("http://{ip}:{EXECUTOR_PORT}"),
            gateway_source,
        })
    }

    /// The egress gateway's network, made at the first call.
    async fn gateway_net(&self) -> Result<&(mentis_core::GatewayNetwork, String)> {
        self.gateway
            .get_or_try_init(|| gateway::ensure(&self.docker, &self.config))
            .await
    }
}

#[async_trait::async_trait]
impl SandboxBackend for DockerBackend {
    async fn prepare(&self) -> Result<()> {
        network::ensure(&self.docker, &self.config).await?;
        // Workspaces first: existing sandboxes need them; only new ones need the executor volume.
        self.reconcile_disks().await?;
        let volume = self.ensure_executor_volume().await?;
        let _ = self.executor_volume.set(volume);
        Ok(())
    }

    async fn create(&self, spec: &BackendSpec) -> Result<Endpoint> {
        let result = self.create_inner(spec).await;
        if result.is_err() {
            // Nothing may be left behind by a failed create.
            if let Err(e) = self.delete(spec.id).await {
                tracing::warn!(sandbox_id = %spec.id, error = %e, "cleanup after a failed create failed");
            }
        }
        result
    }

    async fn has_image(&self, image: &str) -> Result<bool> {
        self.has_image_inner(image).await
    }

    async fn gateway_network(&self) -> Result<Option<mentis_core::GatewayNetwork>> {
        Ok(Some(self.gateway_net().await?.0.clone()))
    }

    async fn route_to_gateway(&self, tcp_port: u16, dns_port: u16) -> Result<()> {
        let (_, bridge) = self.gateway_net().await?;
        gateway::route(bridge, tcp_port, dns_port).await
    }

    fn supports_gateway(&self) -> bool {
        true
    }

    async fn set_egress(
        &self,
        id: SandboxId,
        egress: bool,
        gateway: bool,
    ) -> Result<Option<std::net::IpAddr>> {
        let name = Self::container_name(id);
        let info = self
            .call(
                "inspect container",
                self.docker.inspect_container(&name, None),
            )
            .await
            .docker_ctx("inspect the container")?;
        let attached: Vec<String> = info
            .network_settings
            .and_then(|s| s.networks)
            .map(|n| n.into_keys().collect())
            .unwrap_or_default();
        let has = |network: &str| attached.iter().any(|a| a == network);
        let wanted = [
            (&self.config.egress_network, egress),
            (&self.config.gateway_network, gateway),
        ];
        // Off first: never two ways out at once.
        for (network, want) in wanted {
            if !want && has(network) {
                self.call(
                    "disconnect a network",
                    self.docker.disconnect_network(
                        network,
                        bollard::models::NetworkDisconnectRequest {
                            container: name.clone(),
                            force: Some(true),
                        },
                    ),
                )
                .await
                .docker_ctx("detach a network")?;
            }
        }
        for (network, want) in wanted {
            if want && !has(network) {
                if *network == self.config.gateway_network {
                    self.gateway_net().await?;
                }
                self.call(
                    "connect a network",
                    self.docker.connect_network(
                        network,
                        bollard::models::NetworkConnectRequest {
                            container: name.clone(),
                            ..Default::default()
                        },
                    ),
                )
                .await
                .docker_ctx("attach a network")?;
            }
        }
        Ok(self.endpoint_of(&name).await?.gateway_source)
    }

    async fn image_info(&self, image: &str) -> Result<Option<mentis_core::ImageInfo>> {
        self.image_info_inner(image).await
    }

    async fn build_image(
        &self,
        build: &mentis_core::ImageBuild,
        context: &std::path::Path,
        output: &(dyn Fn(String) + Send + Sync),
    ) -> Result<String> {
        self.build_image_inner(build, context, output).await
    }

    async fn import_image(
        &self,
        image: &str,
        changes: &[String],
        rootfs: &std::path::Path,
    ) -> Result<String> {
        self.import_image_inner(image, changes, rootfs).await
    }

    async fn why_stopped(&self, id: SandboxId) -> Result<Option<Error>> {
        DockerBackend::why_stopped(self, id).await
    }

    async fn delete(&self, id: SandboxId) -> Result<()> {
        let name = Self::container_name(id);
        match self
            .call(
                "remove container",
                self.docker.remove_container(
                    &name,
                    Some(
                        RemoveContainerOptionsBuilder::default()
                            .force(true)
                            .v(true)
                            .build(),
                    ),
                ),
            )
            .await
        {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(error::to_core("remove the container", e)),
        }
        self.remove_volume(id).await
    }

    async fn ensure_running(&self, id: SandboxId) -> Result<Endpoint> {
        use ContainerStateStatusEnum as S;
        let name = Self::container_name(id);
        let info = match self
            .call(
                "inspect container",
                self.docker.inspect_container(&name, None),
            )
            .await
        {
            Ok(info) => info,
            Err(e) if is_not_found(&e) => {
                return Err(gone(id));
            }
            Err(e) => return Err(error::to_core("inspect the container", e)),
        };
        match info.state.and_then(|s| s.status) {
            Some(S::RUNNING) => {}
            Some(S::PAUSED) => {
                return Err(Error::new(
                    Reason::SandboxPaused,
                    format!("the container of sandbox {id} is paused"),
                )
                .about(Resource::sandbox(id)));
            }
            // Exited or created: the executor died and took the container with it; start it again (the
            // workspace volume and the token in its env are unchanged).
            _ => {
                tracing::info!(sandbox_id = %id, "starting the sandbox's stopped container again");
                self.attach_disk(id).await?;
                self.call("start container", self.docker.start_container(&name, None))
                    .await
                    .docker_ctx("start the container")?;
                self.release_disk(id).await;
            }
        }
        self.endpoint_of(&name).await
    }

    fn updates_limits(&self) -> bool {
        // runsc has no `update` command: the engine fails every update of a gVisor container.
        self.runtime == runtime::Chosen::Runc
    }

    /// Only under runc: runsc cannot change a running container's limits, and of another engine runtime
    /// (an operator's) nothing is known.
    fn changes_limits(&self, from: &Limits, to: &Limits, runtime_class: Option<&str>) -> bool {
        from == to
            || match runtime_class {
                None => self.updates_limits(),
                Some(class) => class == runtime::RUNC,
            }
    }

    async fn update_limits(&self, id: SandboxId, limits: Limits) -> Result<()> {
        if !self.updates_limits() {
            return Err(Error::new(
                Reason::FailedPrecondition,
                format!(
                    "the limits of sandbox {id} cannot change: gVisor (runsc) containers keep the limits \
                 they were created with"
                ),
            ));
        }
        let (memory, nano_cpus) = docker_limits(limits);
        let update = bollard::models::ContainerUpdateBody {
            memory: Some(memory),
            memory_swap: Some(memory),
            nano_cpus: Some(nano_cpus),
            pids_limit: Some(limits.pids),
            ..Default::default()
        };
        self.call(
            "update container",
            self.docker
                .update_container(&Self::container_name(id), update),
        )
        .await
        .docker_ctx("update the container's limits")
    }

    async fn restart(&self, id: SandboxId) -> Result<Endpoint> {
        let name = Self::container_name(id);
        // Stop, attach, start rather than the engine's restart: a bounded workspace's loop device goes
        // with the container's stop (see `disk`) and must be attached again before the start mounts it.
        // No grace: the executor does not answer, and a stopped process would not act on SIGTERM anyway.
        let options = bollard::query_parameters::StopContainerOptionsBuilder::default()
            .t(0)
            .build();
        match self
            .call(
                "stop container",
                self.docker.stop_container(&name, Some(options)),
            )
            .await
        {
            Ok(()) => {}
            Err(e) if is_not_found(&e) => {
                return Err(gone(id));
            }
            // 304: stopped already.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 304, ..
            }) => {}
            Err(e) => return Err(error::to_core("stop the container", e)),
        }
        tracing::info!(sandbox_id = %id, "stopped the sandbox's container to start it afresh");
        // ensure_running attaches the disk, starts the stopped container and releases the disk.
        self.ensure_running(id).await
    }

    async fn pause(&self, id: SandboxId) -> Result<()> {
        let name = Self::container_name(id);
        let paused = self
            .call("pause container", self.docker.pause_container(&name))
            .await;
        self.settle(id, &name, paused, ContainerStateStatusEnum::PAUSED, "pause")
            .await
    }

    async fn resume(&self, id: SandboxId) -> Result<()> {
        let name = Self::container_name(id);
        let resumed = self
            .call("unpause container", self.docker.unpause_container(&name))
            .await;
        self.settle(
            id,
            &name,
            resumed,
            ContainerStateStatusEnum::RUNNING,
            "unpause",
        )
        .await
    }

    async fn ping(&self) -> Result<()> {
        self.call("ping", self.docker.ping())
            .await
            .map(|_| ())
            .map_err(|e| {
                Error::new(Reason::EngineUnavailable, "cannot reach the Docker engine")
                    .with_source(e)
            })
    }

    async fn list(&self) -> Result<Vec<BackendSandbox>> {
        let filters = labels::instance_filter(&self.config.instance);
        let containers = self
            .all_containers(&filters)
            .await
            .docker_ctx("list containers")?;
        let volumes = self
            .call(
                "list volumes",
                self.docker.list_volumes(Some(
                    ListVolumesOptionsBuilder::default()
                        .filters(&filters)
                        .build(),
                )),
            )
            .await
            .docker_ctx("list volumes")?;

        let mut found: HashMap<SandboxId, BackendState> = HashMap::new();
        for c in containers {
            let Some(id) = c.labels.as_ref().and_then(labels::sandbox_id) else {
                continue;
            };
            use bollard::models::ContainerSummaryStateEnum as S;
            let state = match c.state {
                Some(S::RUNNING) => BackendState::Running,
                Some(S::PAUSED) => BackendState::Paused,
                _ => BackendState::Stopped,
            };
            found.insert(id, state);
        }
        for v in volumes.volumes.unwrap_or_default() {
            if let Some(id) = labels::sandbox_id(&v.labels) {
                found.entry(id).or_insert(BackendState::Missing);
            }
        }
        Ok(found
            .into_iter()
            .map(|(id, state)| BackendSandbox { id, state })
            .collect())
    }
}

/// Docker calls that failed or timed out (`mentis.docker.errors`, by call); a no-op unless the runtime
/// installed a metrics provider.
fn docker_errors() -> &'static opentelemetry::metrics::Counter<u64> {
    static ERRORS: std::sync::LazyLock<opentelemetry::metrics::Counter<u64>> =
        std::sync::LazyLock::new(|| {
            opentelemetry::global::meter("mentis-backend-docker")
                .u64_counter("mentis.docker.errors")
                .with_description("Docker API calls that failed or timed out, by call")
                .build()
        });
    &ERRORS
}
