//! [`KubernetesBackend`], the `SandboxBackend` of a cluster (issue 35): create, delete, reach, list, ping;
//! a restart is the kubelet's (the pod's liveness probe); a pause removes the pod (the application keeps
//! the workspace in a snapshot: `pauses_in_place` is false); changing a running pod's limits is refused
//! with FAILED_PRECONDITION until in-place resize is built (a warm pool then serves the default limits only).

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Api, ListParams, Patch, PatchParams, WatchEvent, WatchParams};
use mentis_core::layout::{LABEL_INSTANCE, LABEL_MANAGED};
use mentis_core::{
    BackendSandbox, BackendSpec, BackendState, Endpoint, Error, Limits, Reason, Resource, Result,
    SandboxBackend, SandboxId,
};

use crate::cluster::Cluster;
use crate::config::KubernetesConfig;
use crate::error::{is_not_found, to_core};
use crate::pod::pod_name;
use crate::status::{Progress, endpoint_uri, progress};

/// How long a claimed warm pod's node may take to apply its new limits.
const RESIZE_WITHIN: Duration = Duration::from_secs(30);

/// How long following the pods waits before it tries again after an error.
const FOLLOW_RETRY: Duration = Duration::from_secs(5);

/// The field manager of what the runtime applies.
const FIELD_MANAGER: &str = "mentis-runtime";

/// How long a pod may take to become ready, and to find a node.
#[derive(Debug, Clone, Copy)]
pub struct Waits {
    /// From its creation to a running executor (images pulled, executor copied in).
    pub start: Duration,
    /// Unschedulable for this long: the create fails with the scheduler's words.
    pub stuck: Duration,
}

/// Sandboxes as pods of one namespace.
#[derive(Clone)]
pub struct KubernetesBackend {
    client: kube::Client,
    config: KubernetesConfig,
    cluster: Cluster,
    pods: Api<Pod>,
    policies: Api<NetworkPolicy>,
    waits: Waits,
    /// The API server can resize a running pod (1.33 or later), as `prepare` found it.
    resizes: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for KubernetesBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesBackend")
            .field("namespace", &self.config.namespace)
            .field("instance", &self.config.instance)
            .finish_non_exhaustive()
    }
}

impl KubernetesBackend {
    pub fn new(client: kube::Client, config: KubernetesConfig, waits: Waits) -> Self {
        let ns = config.namespace.as_str();
        Self {
            pods: Api::namespaced(client.clone(), ns),
            policies: Api::namespaced(client.clone(), ns),
            cluster: Cluster::new(client.clone(), config.clone()),
            client,
            config,
            waits,
            resizes: std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        }
    }

    /// A client of the cluster `kubeconfig` names, or else of the one the runtime runs in (its service
    /// account; `KUBECONFIG` or `~/.kube/config` first, as kubectl does).
    pub async fn client(kubeconfig: Option<&std::path::Path>) -> Result<kube::Client> {
        let unusable = |why: String| {
            Error::new(
                Reason::EngineUnavailable,
                format!("no Kubernetes cluster to reach: {why}"),
            )
        };
        let config = match kubeconfig {
            Some(path) => {
                let file = kube::config::Kubeconfig::read_from(path)
                    .map_err(|e| unusable(format!("kubeconfig {}: {e}", path.display())))?;
                kube::Config::from_custom_kubeconfig(file, &kube::config::KubeConfigOptions::default())
                    .await
                    .map_err(|e| unusable(format!("kubeconfig {}: {e}", path.display())))?
            }
            None => kube::Config::infer().await.map_err(|e| {
                unusable(format!(
                    "neither a kubeconfig nor the in-cluster service account gave a usable configuration: {e}"
                ))
            })?,
        };
        kube::Client::try_from(config).map_err(|e| unusable(format!("a client: {e}")))
    }

    /// A backend on the cluster [`KubernetesBackend::client`] reaches; `config` is made knowing the
    /// client's own namespace (where sandboxes go unless told otherwise).
    pub async fn connect(
        kubeconfig: Option<&std::path::Path>,
        config: impl FnOnce(&str) -> KubernetesConfig,
        waits: Waits,
    ) -> Result<Self> {
        let client = Self::client(kubeconfig).await?;
        let config = config(client.default_namespace());
        Ok(Self::new(client, config, waits))
    }

    fn instance_selector(&self) -> String {
        format!(
            "{LABEL_MANAGED}=true,{LABEL_INSTANCE}={}",
            self.config.instance
        )
    }
}

/// Images are the cluster's: the runtime has no engine to build or import one into that the nodes pull from.
fn no_images(what: &str) -> Error {
    Error::new(
        Reason::FailedPrecondition,
        format!(
            "images are not {what} on the Kubernetes backend: the nodes pull them, so build them where your \
             cluster pulls from and name them in a sandbox's spec or a template"
        ),
    )
}

fn gone(id: SandboxId) -> Error {
    Error::new(
        Reason::ContainerGone,
        format!("the pod of sandbox {id} is gone"),
    )
    .about(Resource::sandbox(id))
}

#[async_trait::async_trait]
impl SandboxBackend for KubernetesBackend {
    async fn prepare(&self) -> Result<()> {
        for policy in crate::policy::policies(&self.config) {
            let name = policy.metadata.name.clone().unwrap_or_default();
            self.policies
                .patch(
                    &name,
                    &PatchParams::apply(FIELD_MANAGER).force(),
                    &Patch::Apply(&policy),
                )
                .await
                .map_err(|e| to_core("apply the sandboxes' NetworkPolicies", e))?;
        }
        // In-place resize is on by default from 1.33: before, a warm pool serves the default limits only.
        match self.client.apiserver_version().await {
            Ok(v) => {
                let minor: u32 = v
                    .minor
                    .trim_end_matches(|c: char| !c.is_ascii_digit())
                    .parse()
                    .unwrap_or(0);
                let resizes = v.major == "1" && minor >= 33;
                self.resizes
                    .store(resizes, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(version = %v.git_version, resizes, "the cluster's API server");
            }
            Err(e) => return Err(to_core("ask the API server its version", e)),
        }
        // What every create needs, asked once here so that a missing grant stops the start.
        self.pods
            .list(
                &ListParams::default()
                    .labels(&self.instance_selector())
                    .limit(1),
            )
            .await
            .map_err(|e| to_core("list the sandboxes' pods", e))?;
        Ok(())
    }

    async fn create(&self, spec: &BackendSpec) -> Result<Endpoint> {
        let pod = self.cluster.create(spec).await?;
        let version = pod.metadata.resource_version.clone().unwrap_or_default();
        match self
            .cluster
            .wait_ready(spec.id, &version, self.waits.start, self.waits.stuck)
            .await
        {
            Ok(endpoint) => Ok(endpoint),
            Err(e) => {
                if let Err(left) = self.cluster.remove(spec.id).await {
                    tracing::warn!(sandbox_id = %spec.id, error = %left.chain(), "could not remove a failed create's objects");
                }
                Err(e)
            }
        }
    }

    async fn build_image(
        &self,
        _build: &mentis_core::ImageBuild,
        _context: &std::path::Path,
        _output: &(dyn Fn(String) + Send + Sync),
    ) -> Result<String> {
        Err(no_images("built"))
    }

    async fn import_image(
        &self,
        _image: &str,
        _changes: &[String],
        _rootfs: &std::path::Path,
    ) -> Result<String> {
        Err(no_images("imported"))
    }

    async fn delete(&self, id: SandboxId) -> Result<()> {
        self.cluster.remove(id).await
    }

    async fn ensure_running(&self, id: SandboxId) -> Result<Endpoint> {
        let pod = match self.pods.get(&pod_name(id)).await {
            Ok(pod) => pod,
            Err(e) if is_not_found(&e) => return Err(gone(id)),
            Err(e) => return Err(to_core("read the sandbox's pod", e)),
        };
        match progress(&pod) {
            Progress::Ready { ip } => Ok(Endpoint {
                uri: endpoint_uri(&ip, self.config.executor_port),
                gateway_source: None,
            }),
            Progress::Failed(e) => Err(e.about(Resource::sandbox(id))),
            Progress::Waiting(_) | Progress::Stuck(_) => {
                let version = pod.metadata.resource_version.clone().unwrap_or_default();
                self.cluster
                    .wait_ready(id, &version, self.waits.start, self.waits.stuck)
                    .await
            }
        }
    }

    /// The kubelet restarts the container of an executor that stops answering (the pod's liveness probe,
    /// in place: the workspace stays); the runtime asks after its own ready timeout, by when it has:
    /// the pod's executor as it runs now.
    async fn restart(&self, id: SandboxId) -> Result<Endpoint> {
        self.ensure_running(id).await
    }

    /// In place (`pods/resize`): a claimed warm pod's CPU and memory, applied by its node.
    async fn update_limits(&self, id: SandboxId, limits: Limits) -> Result<()> {
        if !self.updates_limits() {
            return Err(Error::new(
                Reason::FailedPrecondition,
                "this cluster cannot change a running pod's limits (in-place resize needs Kubernetes 1.33)",
            ));
        }
        self.cluster.resize(id, &limits, RESIZE_WITHIN).await
    }

    /// Where the API server is 1.33 or later (in-place resize on by default), as `prepare` found it.
    fn updates_limits(&self) -> bool {
        self.resizes.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// More CPU or less, more memory, never less: a running container's memory limit cannot shrink in place
    /// (below what it uses, the kernel could not hold it). Whatever the pod's runtime class: the kubelet
    /// resizes through the class's handler.
    fn changes_limits(&self, from: &Limits, to: &Limits, _runtime_class: Option<&str>) -> bool {
        from == to
            || (self.updates_limits()
                && to.memory_mb >= from.memory_mb
                && to.pids == from.pids
                && to.nofile == from.nofile
                && to.disk_mb == from.disk_mb)
    }

    /// A pod cannot be frozen: the application took the workspace, and the pod (with its token's Secret
    /// and its claim) goes.
    async fn pause(&self, id: SandboxId) -> Result<()> {
        self.cluster.remove(id).await
    }

    async fn resume(&self, _id: SandboxId) -> Result<()> {
        Err(Error::new(
            Reason::FailedPrecondition,
            "a paused sandbox's pod is made again by the application (pause by snapshot), not resumed",
        ))
    }

    fn pauses_in_place(&self) -> bool {
        false
    }

    async fn list(&self) -> Result<Vec<BackendSandbox>> {
        let pods = self
            .pods
            .list(&ListParams::default().labels(&self.instance_selector()))
            .await
            .map_err(|e| to_core("list the sandboxes' pods", e))?;
        Ok(pods
            .items
            .iter()
            .filter_map(|pod| {
                let id = pod
                    .metadata
                    .labels
                    .as_ref()?
                    .get(mentis_core::layout::LABEL_SANDBOX_ID)
                    .and_then(|s| SandboxId::parse(s).ok())?;
                // A pod runs, or will; one that failed or is going has nothing left (an emptyDir goes with
                // it).
                let state = match progress(pod) {
                    Progress::Failed(_) => BackendState::Missing,
                    _ => BackendState::Running,
                };
                Some(BackendSandbox { id, state })
            })
            .collect())
    }

    /// A watch of the instance's pods (listed first for a resource version, listed again when the API has
    /// compacted past it): a pod deleted, failed or being deleted names its sandbox to `gone`.
    async fn follow(&self, gone: &(dyn Fn(SandboxId) + Send + Sync)) {
        let selector = self.instance_selector();
        let id_of = |pod: &Pod| {
            pod.metadata
                .labels
                .as_ref()?
                .get(mentis_core::layout::LABEL_SANDBOX_ID)
                .and_then(|s| SandboxId::parse(s).ok())
        };
        let report = |pod: &Pod, deleted: bool| {
            if let Some(id) = id_of(pod)
                && (deleted || matches!(progress(pod), Progress::Failed(_)))
            {
                gone(id);
            }
        };
        loop {
            let listed = self
                .pods
                .list(&ListParams::default().labels(&selector))
                .await;
            let mut version = match listed {
                Ok(list) => {
                    for pod in &list.items {
                        report(pod, false);
                    }
                    list.metadata.resource_version.unwrap_or_default()
                }
                Err(e) => {
                    tracing::debug!(error = %e, "could not list the sandboxes' pods to follow them; trying again");
                    tokio::time::sleep(FOLLOW_RETRY).await;
                    continue;
                }
            };
            // Watches from `version` until the API says it is too old.
            loop {
                let params = WatchParams::default().labels(&selector).timeout(290);
                let events = match self.pods.watch(&params, &version).await {
                    Ok(events) => events,
                    Err(e) => {
                        tracing::debug!(error = %e, "could not follow the sandboxes' pods; trying again");
                        tokio::time::sleep(FOLLOW_RETRY).await;
                        break;
                    }
                };
                futures::pin_mut!(events);
                let mut stale = false;
                while let Some(event) = events.next().await {
                    match event {
                        Ok(WatchEvent::Added(pod) | WatchEvent::Modified(pod)) => {
                            if let Some(v) = &pod.metadata.resource_version {
                                version.clone_from(v);
                            }
                            report(&pod, false);
                        }
                        Ok(WatchEvent::Deleted(pod)) => {
                            if let Some(v) = &pod.metadata.resource_version {
                                version.clone_from(v);
                            }
                            report(&pod, true);
                        }
                        Ok(WatchEvent::Bookmark(b)) => version = b.metadata.resource_version,
                        Ok(WatchEvent::Error(status)) => {
                            // 410: compacted past our version; anything else: start afresh too.
                            tracing::debug!(code = status.code, message = %status.message, "the watch of the sandboxes' pods ended");
                            stale = true;
                            break;
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "the watch of the sandboxes' pods failed");
                            stale = true;
                            break;
                        }
                    }
                }
                if stale {
                    tokio::time::sleep(FOLLOW_RETRY / 5).await;
                    break;
                }
            }
        }
    }

    async fn ping(&self) -> Result<()> {
        self.client
            .apiserver_version()
            .await
            .map(drop)
            .map_err(|e| to_core("ask the API server its version", e))
    }
}
