//! A SIMULATED Kubernetes cluster, for the Kubernetes backend's end-to-end tests (issue 35; tests/e2e/
//! kubernetes.rs). It is a test double, not a product: no kube-apiserver can run on the machines this project
//! is built and tested on, so the runtime's Kubernetes backend is driven against this instead, with real
//! executors in real containers.
//!
//! - **The API** ([`api`]): an HTTP server speaking the part of the Kubernetes API the backend calls, as the
//!   real one does it: pods (create, get, list by label, delete, watch from a resource version with a field
//!   selector), Secrets and PersistentVolumeClaims (create, delete), NetworkPolicies (server-side apply),
//!   `/version`; RuntimeClasses as the admission plugin checks them; one resource version for everything, Status objects for errors (404 NotFound, 409
//!   AlreadyExists, 401 without the kubeconfig's token). The runtime reaches it through a kubeconfig
//!   ([`Cluster::kubeconfig`]), as it would a real cluster.
//! - **A kubelet** ([`kubelet`]): each pod runs on the Docker engine as a real node would run it: a pause
//!   container holds the pod's network (its address is the pod IP, stable across container restarts), the
//!   init containers run to completion in order, then the main container starts with the pod's volumes,
//!   environment (Secrets resolved), capabilities, read-only root and limits; it is restarted when it exits
//!   (`restartPolicy: Always`), under its RuntimeClass's handler (a Docker runtime: runsc). Phases, container states and conditions are reported as the kubelet does,
//!   through the API (so through the backend's watch). An image the engine lacks is `ErrImagePull`: the
//!   simulated node pulls nothing.
//!
//! Not simulated: NetworkPolicies are stored, not enforced (every pod is on one internal Docker network);
//! scheduling (one node that takes every pod); DNS policy; an `emptyDir`'s `sizeLimit` (the kubelet's
//! eviction); watch history compaction (410 Gone: the logic tests script it, services/backend-kubernetes/
//! tests/cluster.rs). What was run on a real cluster: nothing (docs/KUBERNETES.md says so).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use anyhow::{Context, Result};
use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

mod api;
mod kubelet;
mod state;

pub use state::SIM_LABEL;
use state::{Sim, State};

/// A simulated cluster: its API on 127.0.0.1 and its kubelet on the Docker engine. Dropping it stops both
/// and removes every container, volume and the network it made.
pub struct Cluster {
    sim: Arc<Sim>,
    pub addr: SocketAddr,
    /// A kubeconfig naming this cluster (with its token), for `KUBECONFIG` or `MENTIS_*`'s `kubeconfig`.
    pub kubeconfig: PathBuf,
    /// The namespace the kubeconfig's context names.
    pub namespace: String,
    _dir: tempfile::TempDir,
}

impl Cluster {
    /// Starts a cluster whose pause containers are of image `pause_image` (any image with `sleep`). The
    /// containers of a pod carry its labels (the runtime's instance among them, so a test's guard removes
    /// them too).
    pub async fn start(pause_image: &str) -> Result<Self> {
        let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_owned();
        let network = format!("ksim-{id}");
        crate::docker(&[
            "network",
            "create",
            "--internal",
            "--label",
            &format!("{SIM_LABEL}={id}"),
            &network,
        ])
        .context("the simulated cluster's network")?;
        let (events, _) = broadcast::channel(4096);
        let sim = Arc::new(Sim {
            id: id.clone(),
            state: Mutex::new(State::default()),
            events,
            token: format!("sim-{}", uuid::Uuid::new_v4().simple()),
            network,
            pause_image: pause_image.to_owned(),
            requests: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
            runtime_classes: Mutex::new(std::collections::BTreeMap::new()),
            tasks: TaskTracker::new(),
            cancel: CancellationToken::new(),
        });
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        api::serve(&sim, listener);
        let dir = tempfile::tempdir()?;
        let namespace = "sandboxes".to_owned();
        let kubeconfig = dir.path().join("kubeconfig");
        let config = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "sim", "cluster": {"server": format!("http://{addr}")}}],
            "users": [{"name": "sim", "user": {"token": sim.token}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim", "namespace": namespace}}],
            "current-context": "sim",
        });
        std::fs::write(&kubeconfig, serde_json::to_vec_pretty(&config)?)?;
        sim.note(format!(
            "API server on http://{addr}, kubeconfig {}",
            kubeconfig.display()
        ));
        Ok(Self {
            sim,
            addr,
            kubeconfig,
            namespace,
            _dir: dir,
        })
    }

    /// Adds RuntimeClass `name`, whose pods' main containers the node runs under Docker runtime `handler`
    /// (runsc for gVisor). A pod naming a class the cluster lacks is refused as the RuntimeClass admission
    /// plugin refuses it (403, `pod rejected: RuntimeClass "…" not found`).
    pub fn add_runtime_class(&self, name: &str, handler: &str) {
        self.sim
            .runtime_classes
            .lock()
            .unwrap()
            .insert(name.to_owned(), handler.to_owned());
    }

    /// The object `resource`/`name` of `namespace` as the API holds it (`pods`, `secrets`,
    /// `networkpolicies`, ...).
    pub fn object(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.sim.get(resource, namespace, name)
    }

    /// The names of the `resource` objects of `namespace`.
    pub fn names(&self, resource: &str, namespace: &str) -> Vec<String> {
        self.sim
            .state
            .lock()
            .unwrap()
            .objects
            .keys()
            .filter(|(r, ns, _)| r == resource && ns == namespace)
            .map(|(_, _, name)| name.clone())
            .collect()
    }

    /// Deletes pod `name` as someone else would (`kubectl delete pod`, an eviction); false when there is
    /// none.
    pub fn delete_pod(&self, namespace: &str, name: &str) -> bool {
        self.sim
            .note(format!("pod {namespace}/{name} deleted from outside"));
        self.sim.delete_pod(namespace, name).is_some()
    }

    /// The Docker container of pod `name`'s container `container` (for a test that stops it as a node would).
    pub fn container_of(&self, name: &str, container: &str) -> String {
        kubelet::container_name(&self.sim.id, name, container)
    }

    /// What the API was asked, in order.
    pub fn requests(&self) -> Vec<String> {
        self.sim.requests.lock().unwrap().clone()
    }

    /// What the API and the kubelet did, in order.
    pub fn log(&self) -> Vec<String> {
        self.sim.log.lock().unwrap().clone()
    }

    /// Stops the API and the kubelet and removes what they made.
    pub async fn stop(self) {
        self.sim.cancel.cancel();
        self.sim.tasks.close();
        self.sim.tasks.wait().await;
        // Drop removes the rest.
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.sim.cancel.cancel();
        let filter = format!("label={SIM_LABEL}={}", self.sim.id);
        if let Ok(ids) = crate::docker(&["ps", "-aq", "--filter", &filter]) {
            let ids: Vec<&str> = ids.split_whitespace().collect();
            if !ids.is_empty() {
                let mut args = vec!["rm", "-f", "-v"];
                args.extend(ids);
                let _ = crate::docker(&args);
            }
        }
        if let Ok(vols) = crate::docker(&["volume", "ls", "-q", "--filter", &filter]) {
            let vols: Vec<&str> = vols.split_whitespace().collect();
            if !vols.is_empty() {
                let mut args = vec!["volume", "rm", "-f"];
                args.extend(vols);
                let _ = crate::docker(&args);
            }
        }
        let _ = crate::docker(&["network", "rm", &self.sim.network]);
    }
}
