//! What the backend does in the cluster for one sandbox: make its objects (the token's Secret, the workspace
//! claim, the pod), follow its pod with a watch until it is ready or cannot be (`status::progress`), and
//! remove them.

use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{Container, PersistentVolumeClaim, Pod, PodSpec, Secret};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use mentis_core::{BackendSpec, Endpoint, Error, Limits, Reason, Resource, Result, SandboxId};
use tokio::time::Instant;

use crate::config::KubernetesConfig;
use crate::error::{is_not_found, to_core};
use crate::pod::{self, claim_name, pod_name, secret_name};
use crate::status::{Progress, endpoint_uri, progress, resized};

/// The sandbox objects of one namespace.
#[derive(Clone)]
pub struct Cluster {
    config: KubernetesConfig,
    pods: Api<Pod>,
    secrets: Api<Secret>,
    claims: Api<PersistentVolumeClaim>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("namespace", &self.config.namespace)
            .finish_non_exhaustive()
    }
}

impl Cluster {
    pub fn new(client: kube::Client, config: KubernetesConfig) -> Self {
        let ns = config.namespace.as_str();
        Self {
            pods: Api::namespaced(client.clone(), ns),
            secrets: Api::namespaced(client.clone(), ns),
            claims: Api::namespaced(client, ns),
            config,
        }
    }

    /// Makes `spec`'s Secret, claim (when workspaces are claims) and pod, and returns the pod as created
    /// (its resource version is where a watch of it starts). What it made is removed when a step fails.
    pub async fn create(&self, spec: &BackendSpec) -> Result<Pod> {
        if !spec.data_mounts.is_empty() {
            return Err(Error::new(
                Reason::FailedPrecondition,
                "a pod has no host folders to mount: data mounts need the Docker backend",
            ));
        }
        let made = async {
            let post = PostParams::default();
            self.secrets
                .create(&post, &pod::secret(&self.config, spec))
                .await
                .map_err(|e| to_core("create the sandbox's token Secret", e))?;
            if let Some(claim) = pod::claim(&self.config, spec) {
                self.claims
                    .create(&post, &claim)
                    .await
                    .map_err(|e| to_core("create the sandbox's workspace claim", e))?;
            }
            self.pods
                .create(&post, &pod::pod(&self.config, spec))
                .await
                .map_err(|e| to_core("create the sandbox's pod", e))
        }
        .await;
        match made {
            Ok(pod) => Ok(pod),
            Err(e) => {
                if let Err(left) = self.remove(spec.id).await {
                    tracing::warn!(sandbox_id = %spec.id, error = %left.chain(), "could not remove a failed create's objects");
                }
                Err(e.about(Resource::sandbox(spec.id)))
            }
        }
    }

    /// Follows sandbox `id`'s pod from `version` until it is ready (the executor's address), or fails:
    /// at once with the cause when it cannot run, after `stuck_for` when no node takes it, after `within`
    /// in any case.
    pub async fn wait_ready(
        &self,
        id: SandboxId,
        version: &str,
        within: Duration,
        stuck_for: Duration,
    ) -> Result<Endpoint> {
        let deadline = Instant::now() + within;
        /// What the pod waits for in words, and since when it is stuck (no node takes it) and why.
        struct Wait {
            waiting_for: String,
            stuck: Option<(Instant, Error)>,
        }
        let mut wait = Wait {
            waiting_for: "the pod to be seen".to_owned(),
            stuck: None,
        };
        self.follow(
            id,
            version,
            &mut wait,
            // What a pod's state says: an end (ready or failed), or keep following.
            |pod, wait| match progress(pod) {
                Progress::Ready { ip } => Some(Ok(Endpoint {
                    uri: endpoint_uri(&ip, self.config.executor_port),
                    gateway_source: None,
                })),
                Progress::Failed(e) => Some(Err(e)),
                Progress::Waiting(what) => {
                    wait.waiting_for = what;
                    wait.stuck = None;
                    None
                }
                Progress::Stuck(e) => {
                    let since = wait.stuck.take().map_or_else(Instant::now, |(at, _)| at);
                    wait.stuck = Some((since, e));
                    None
                }
            },
            |wait| match &wait.stuck {
                Some((since, _)) => deadline.min(*since + stuck_for),
                None => deadline,
            },
            |wait| match wait.stuck.take() {
                Some((_, e)) => e,
                None => Error::new(
                    Reason::Unavailable,
                    format!(
                        "the sandbox's pod was not ready within {} s: it waits for {}",
                        within.as_secs(),
                        wait.waiting_for
                    ),
                ),
            },
            || {
                Error::new(
                    Reason::Unavailable,
                    "the sandbox's pod was deleted as it started",
                )
            },
        )
        .await
    }

    /// Changes the CPU and memory of sandbox `id`'s running pod in place (the `resize` subresource, Kubernetes
    /// 1.33+) and follows the pod until its node has applied them, refused them, or `within` ran out.
    pub async fn resize(&self, id: SandboxId, limits: &Limits, within: Duration) -> Result<()> {
        let name = pod_name(id);
        let resources = pod::resources(limits);
        let want = resources.limits.clone().unwrap_or_default();
        // A strategic merge: the container of that name gets these resources, nothing else changes.
        let patch = Pod {
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: pod::SANDBOX_CONTAINER.to_owned(),
                    resources: Some(resources),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let pod = self
            .pods
            .patch_subresource(
                "resize",
                &name,
                &PatchParams::default(),
                &Patch::Strategic(&patch),
            )
            .await
            .map_err(|e| to_core("resize the sandbox's pod", e).about(Resource::sandbox(id)))?;
        if let Some(done) = resized(&pod, &want) {
            return done.map_err(|e| e.about(Resource::sandbox(id)));
        }
        let version = pod.metadata.resource_version.clone().unwrap_or_default();
        let deadline = Instant::now() + within;
        self.follow(
            id,
            &version,
            &mut (),
            |pod, ()| resized(pod, &want),
            |()| deadline,
            |()| {
                Error::new(
                    Reason::Unavailable,
                    format!(
                        "the node of the sandbox's pod did not apply its new limits within {} s",
                        within.as_secs()
                    ),
                )
            },
            || {
                Error::new(
                    Reason::ContainerGone,
                    "the sandbox's pod was deleted while it was resized",
                )
            },
        )
        .await
    }

    /// Follows sandbox `id`'s pod with a watch from `version` (watched again where the API ended the watch,
    /// read afresh after a 410, too old a version) and hands each state of it to `judge`, until `judge`
    /// ends it, the pod is deleted (`deleted`), or `until` passes (`late`). `state` is what the three
    /// closures share. Every error is about the sandbox.
    #[allow(clippy::too_many_arguments)]
    async fn follow<S, T>(
        &self,
        id: SandboxId,
        version: &str,
        state: &mut S,
        mut judge: impl FnMut(&Pod, &mut S) -> Option<Result<T>>,
        until: impl Fn(&S) -> Instant,
        late: impl Fn(&mut S) -> Error,
        deleted: impl Fn() -> Error,
    ) -> Result<T> {
        let name = pod_name(id);
        let mut version = version.to_owned();
        let about = |e: Error| e.about(Resource::sandbox(id));
        loop {
            let params = WatchParams::default()
                .fields(&format!("metadata.name={name}"))
                .timeout(290);
            let events =
                match tokio::time::timeout_at(until(state), self.pods.watch(&params, &version))
                    .await
                {
                    Err(_) => return Err(about(late(state))),
                    Ok(watch) => watch.map_err(|e| to_core("follow the sandbox's pod", e))?,
                };
            futures::pin_mut!(events);
            loop {
                let next = tokio::time::timeout_at(until(state), events.try_next()).await;
                let event = match next {
                    Err(_) => return Err(about(late(state))),
                    Ok(Err(e)) => return Err(to_core("follow the sandbox's pod", e)),
                    // The API ended the watch (its timeout): watch again from where it was.
                    Ok(Ok(None)) => break,
                    Ok(Ok(Some(event))) => event,
                };
                match event {
                    WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                        if let Some(v) = &pod.metadata.resource_version {
                            version.clone_from(v);
                        }
                        if let Some(end) = judge(&pod, state) {
                            return end.map_err(about);
                        }
                    }
                    WatchEvent::Deleted(_) => return Err(about(deleted())),
                    WatchEvent::Bookmark(b) => version = b.metadata.resource_version,
                    // Too old a version (the API compacted its history): the pod as it is now, then on.
                    WatchEvent::Error(status) if status.code == 410 => {
                        let pod = self
                            .pods
                            .get(&name)
                            .await
                            .map_err(|e| to_core("read the sandbox's pod", e))?;
                        version = pod.metadata.resource_version.clone().unwrap_or_default();
                        if let Some(end) = judge(&pod, state) {
                            return end.map_err(about);
                        }
                        break;
                    }
                    WatchEvent::Error(status) => {
                        return Err(to_core(
                            "follow the sandbox's pod",
                            kube::Error::Api(status),
                        ));
                    }
                }
            }
        }
    }

    /// Removes sandbox `id`'s pod (at once: no grace), Secret and claim; those already gone are fine.
    pub async fn remove(&self, id: SandboxId) -> Result<()> {
        let now = DeleteParams {
            grace_period_seconds: Some(0),
            ..DeleteParams::default()
        };
        let gone = |r: std::result::Result<(), kube::Error>, what: &str| match r {
            Err(e) if !is_not_found(&e) => Err(to_core(what, e)),
            _ => Ok(()),
        };
        gone(
            self.pods.delete(&pod_name(id), &now).await.map(drop),
            "delete the sandbox's pod",
        )?;
        gone(
            self.secrets
                .delete(&secret_name(id), &DeleteParams::default())
                .await
                .map(drop),
            "delete the sandbox's token Secret",
        )?;
        if matches!(
            self.config.workspace,
            crate::config::Workspace::Claim { .. }
        ) {
            gone(
                self.claims
                    .delete(&claim_name(id), &DeleteParams::default())
                    .await
                    .map(drop),
                "delete the sandbox's workspace claim",
            )?;
        }
        Ok(())
    }
}
