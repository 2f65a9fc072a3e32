//! What the simulated API server holds (objects, their changes, resource versions) and the cluster's shared
//! parts, which the API and the kubelet both use.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use serde_json::{Value, json};
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Label of every Docker object the simulated kubelet makes, with the cluster's id.
pub const SIM_LABEL: &str = "io.mentis.k8s-sim";

/// A change of one object, as a watch reports it.
#[derive(Debug, Clone)]
pub(super) struct Event {
    pub(super) rv: u64,
    pub(super) resource: String,
    pub(super) namespace: String,
    /// ADDED, MODIFIED or DELETED.
    pub(super) kind: &'static str,
    pub(super) object: Value,
}

/// What the API server holds.
#[derive(Default)]
pub(super) struct State {
    /// The last resource version given out.
    pub(super) rv: u64,
    /// Objects by (resource, namespace, name).
    pub(super) objects: BTreeMap<(String, String, String), Value>,
    /// Every change, oldest first (never compacted).
    pub(super) history: Vec<Event>,
    /// The kubelet's stop of each pod, by (namespace, name).
    pub(super) pods: HashMap<(String, String), CancellationToken>,
}

/// The cluster's shared parts.
pub(super) struct Sim {
    pub(super) id: String,
    pub(super) state: Mutex<State>,
    pub(super) events: broadcast::Sender<Event>,
    /// The bearer token the kubeconfig carries; any other is 401.
    pub(super) token: String,
    /// The Docker network of every pod.
    pub(super) network: String,
    /// The image of the pause containers (any image with `sleep`).
    pub(super) pause_image: String,
    /// What the API was asked, in order (`POST pods mentis-sb-…`), for a test's log.
    pub(super) requests: Mutex<Vec<String>>,
    /// What the kubelet did, in order, for a test's log.
    pub(super) log: Mutex<Vec<String>>,
    /// The cluster's RuntimeClasses: name → the node's handler (a Docker runtime here).
    pub(super) runtime_classes: Mutex<BTreeMap<String, String>>,
    pub(super) tasks: TaskTracker,
    pub(super) cancel: CancellationToken,
}

impl Sim {
    pub(super) fn note(&self, line: String) {
        eprintln!("k8s-sim {}: {line}", self.id);
        self.log.lock().unwrap().push(line);
    }

    /// Stores `object` as a change of kind `kind` (its resource version set) and tells the watchers.
    pub(super) fn commit(
        &self,
        st: &mut State,
        resource: &str,
        namespace: &str,
        kind: &'static str,
        mut object: Value,
    ) -> Value {
        st.rv += 1;
        object["metadata"]["resourceVersion"] = json!(st.rv.to_string());
        let name = object["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let key = (resource.to_owned(), namespace.to_owned(), name);
        if kind == "DELETED" {
            st.objects.remove(&key);
        } else {
            st.objects.insert(key, object.clone());
        }
        let event = Event {
            rv: st.rv,
            resource: resource.to_owned(),
            namespace: namespace.to_owned(),
            kind,
            object: object.clone(),
        };
        st.history.push(event.clone());
        let _ = self.events.send(event);
        object
    }

    /// Changes pod `name` with `change` (one MODIFIED event); false when it is gone.
    pub(super) fn update_pod(
        &self,
        namespace: &str,
        name: &str,
        change: impl FnOnce(&mut Value),
    ) -> bool {
        let mut st = self.state.lock().unwrap();
        let key = ("pods".to_owned(), namespace.to_owned(), name.to_owned());
        let Some(mut pod) = st.objects.get(&key).cloned() else {
            return false;
        };
        change(&mut pod);
        self.commit(&mut st, "pods", namespace, "MODIFIED", pod);
        true
    }

    /// The object `resource`/`name`, as stored.
    pub(super) fn get(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.state
            .lock()
            .unwrap()
            .objects
            .get(&(resource.to_owned(), namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Starts deleting pod `name` as the API does: marked (`deletionTimestamp`), then its kubelet stops its
    /// containers and it is gone (DELETED). The pod as marked; None when there is none.
    pub(super) fn delete_pod(&self, namespace: &str, name: &str) -> Option<Value> {
        let mut st = self.state.lock().unwrap();
        let key = ("pods".to_owned(), namespace.to_owned(), name.to_owned());
        let mut pod = st.objects.get(&key).cloned()?;
        if pod["metadata"]["deletionTimestamp"].is_null() {
            pod["metadata"]["deletionTimestamp"] = json!(now());
            pod["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            pod = self.commit(&mut st, "pods", namespace, "MODIFIED", pod);
        }
        if let Some(stop) = st.pods.get(&(namespace.to_owned(), name.to_owned())) {
            stop.cancel();
        }
        Some(pod)
    }
}

/// The time as the API writes it.
pub(super) fn now() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    // Days and seconds of the day to a civil date (Howard Hinnant's algorithm).
    let days = i64::try_from(secs / 86_400).unwrap_or_default();
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}
