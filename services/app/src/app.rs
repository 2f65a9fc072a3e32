//! The application assembled (docs/ARCHITECTURE.md, "Code map"): the data folder made private, the store
//! opened with its key, the keyring, the snapshot store, links and previews, and the sandbox manager started
//! on a backend. What the API is served over; nothing below it is handed out.

use std::net::SocketAddr;
use std::sync::Arc;

use mentis_core::{Result, SandboxBackend};
use tokio_util::sync::CancellationToken;

use crate::auth::link::Links;
use crate::auth::{self, Keyring};
use crate::config::{
    AuthConfig, BackendChoice, DiskLimits, KubernetesSettings, RuntimeConfig, SnapshotStoreConfig,
};
use crate::preview::Previews;
use crate::sandboxes::Manager;
use crate::snapshots::{LocalStore, S3Store, SnapshotStore, Snapshots};
use crate::store::Store;

/// The application services the API is served over.
#[derive(Debug)]
pub struct App {
    pub config: Arc<RuntimeConfig>,
    pub manager: Arc<Manager>,
    pub keyring: Arc<Keyring>,
    pub links: Links,
    pub previews: Arc<Previews>,
}

impl App {
    /// The backend `config` names (`MENTIS_BACKEND`), connected.
    pub async fn backend(config: &RuntimeConfig) -> Result<Arc<dyn SandboxBackend>> {
        match &config.backend {
            BackendChoice::Docker => Self::docker_backend(config).await,
            BackendChoice::Kubernetes(k8s) => Self::kubernetes_backend(config, k8s).await,
        }
    }

    /// The Kubernetes backend `config` and `k8s` describe, connected to its cluster (docs/KUBERNETES.md).
    async fn kubernetes_backend(
        config: &RuntimeConfig,
        k8s: &KubernetesSettings,
    ) -> Result<Arc<dyn SandboxBackend>> {
        let waits = mentis_backend_kubernetes::Waits {
            start: config.ready_timeout,
            stuck: k8s.unschedulable,
        };
        let backend = mentis_backend_kubernetes::KubernetesBackend::connect(
            k8s.kubeconfig.as_deref(),
            |own_namespace| {
                let namespace = k8s
                    .namespace
                    .clone()
                    .unwrap_or_else(|| own_namespace.to_owned());
                mentis_backend_kubernetes::KubernetesConfig {
                    runtime_namespace: k8s
                        .runtime_namespace
                        .clone()
                        .unwrap_or_else(|| namespace.clone()),
                    namespace,
                    instance: config.docker.instance.clone(),
                    executor_image: config.executor_image.clone(),
                    sandbox_user: config.docker.user.clone(),
                    executor_env: config.docker.executor_env.clone(),
                    workspace: k8s.workspace.clone(),
                    runtime_class: k8s.runtime_class.clone(),
                    image_pull_policy: k8s.image_pull_policy.clone(),
                    executor_port: mentis_core::layout::EXECUTOR_PORT,
                    runtime_pod_labels: k8s.runtime_pod_labels.clone(),
                    internal_cidrs: k8s.internal_cidrs.clone(),
                }
            },
            waits,
        )
        .await?;
        tracing::info!(backend = ?backend, "sandboxes run as pods of a Kubernetes cluster");
        Ok(Arc::new(backend))
    }

    /// The Docker backend `config` describes, connected (the embedded default).
    pub async fn docker_backend(config: &RuntimeConfig) -> Result<Arc<dyn SandboxBackend>> {
        let mut docker = config.docker.clone();
        // The default sandbox image also carries the executor every sandbox runs (whatever its image).
        docker.executor_image.clone_from(&config.executor_image);
        // One egress gateway per instance, each on a network of its own (it knows only its sandboxes).
        if docker.instance != "default" {
            docker.gateway_network = format!("{}-{}", docker.gateway_network, docker.instance);
        }
        // Images of bounded workspaces live beside the store; those made earlier are attached again even
        // with disk limits off.
        docker.disks_dir = Some(config.disks_dir());
        docker.disk_limits = config.disk_limits == DiskLimits::Loop;
        // The engine must run every class templates and spaces may name: checked when it connects.
        docker.runtime_classes = config.runtime_classes.names().map(str::to_owned).collect();
        Ok(Arc::new(
            mentis_backend_docker::DockerBackend::connect(docker).await?,
        ))
    }

    /// Opens the data folder and starts the manager on `backend` (reconciled with the store). `listening`
    /// is where the API serves, `http` where the HTTP listener does (preview URLs name it); `shutdown` stops
    /// the manager's tasks.
    pub async fn open(
        config: RuntimeConfig,
        backend: Arc<dyn SandboxBackend>,
        listening: SocketAddr,
        http: Option<SocketAddr>,
        shutdown: CancellationToken,
    ) -> Result<Self> {
        let mut config = config;
        if config.disk_limits == DiskLimits::Off {
            // GetSandbox never claims a limit nothing enforces.
            config.limits = config.limits.without_disk();
        }
        let config = Arc::new(config);
        // The data folder and everything in it private to this user before anything is read or written
        // there (the store, the keys and the journals are in it).
        crate::private::secure(&config.data_dir)?;
        let store = Arc::new(Store::open(&config.data_dir)?);
        // Which spaces exist, as which generation: the spaces keep it, the keyring reads it.
        let generations = Arc::new(auth::SpaceGenerations::default());
        let keyring = Arc::new(match &config.auth {
            AuthConfig::Keys { admin_key } => Keyring::new(
                &auth::admin_key(admin_key.as_deref(), &config.data_dir)?,
                Arc::clone(&store),
                Arc::clone(&generations),
            )?,
            AuthConfig::Disabled => {
                tracing::warn!(
                    "!!! AUTHENTICATION IS DISABLED (MENTIS_AUTH=disabled): anybody who reaches {listening} \
                     can create sandboxes and run code in them. Use this for local development only. !!!"
                );
                Keyring::disabled(Arc::clone(&store), Arc::clone(&generations))
            }
        });
        let archives: Arc<dyn SnapshotStore> = match &config.snapshot_store {
            SnapshotStoreConfig::Local => {
                Arc::new(LocalStore::open(config.data_dir.join("snapshots"))?)
            }
            SnapshotStoreConfig::S3(s3) => {
                tracing::info!(endpoint = %s3.endpoint, bucket = %s3.bucket, prefix = %s3.prefix, "snapshots go to S3");
                Arc::new(S3Store::open(s3)?)
            }
        };
        let snapshots = Arc::new(Snapshots::new(archives, Arc::clone(&store)));
        let links = Links::new(Arc::clone(&store), Arc::clone(&keyring));
        let previews = Arc::new(Previews::new(&config, http, Arc::clone(&store)));
        let manager = Manager::new(
            Arc::clone(&config),
            backend,
            store,
            snapshots,
            Arc::clone(&keyring),
            generations,
            shutdown,
        );
        manager.start().await?;
        Ok(Self {
            config,
            manager,
            keyring,
            links,
            previews,
        })
    }
}
