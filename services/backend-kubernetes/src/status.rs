//! Where a sandbox's pod stands, read from the pod as the API (a watch) reports it: ready, with the address
//! the executor is reached at; still on its way; stuck (no node can take it: an autoscaler may still add
//! one, so the caller decides how long to wait); or failed, with the cause a client should see, the way the
//! Docker backend's `why_stopped` explains a container that exited as it started.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use mentis_core::{Error, Reason, quoted};

use crate::pod::{INSTALL_CONTAINER, SANDBOX_CONTAINER};

/// Where a pod stands.
#[derive(Debug)]
pub enum Progress {
    /// The sandbox's container runs and the pod has an address.
    Ready { ip: String },
    /// On its way (scheduled, pulling, copying the executor in, starting): what it waits for.
    Waiting(String),
    /// No node takes it (yet).
    Stuck(Error),
    /// It will not run: why.
    Failed(Error),
}

/// Waiting reasons of a container that mean its image cannot be had.
const PULL_FAILURES: &[&str] = &[
    "ErrImagePull",
    "ImagePullBackOff",
    "InvalidImageName",
    "ErrImageNeverPull",
];

/// Waiting reasons of a container that mean it cannot be made at all.
const CREATE_FAILURES: &[&str] = &[
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

/// Where `pod` stands.
pub fn progress(pod: &Pod) -> Progress {
    if pod.metadata.deletion_timestamp.is_some() {
        return Progress::Failed(Error::new(
            Reason::Unavailable,
            "the sandbox's pod is being deleted",
        ));
    }
    let Some(status) = &pod.status else {
        return Progress::Waiting("the pod to be seen by the cluster".to_owned());
    };
    let image = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    match status.phase.as_deref() {
        Some("Failed") => {
            let reason = status.reason.clone().unwrap_or_default();
            let message = status.message.clone().unwrap_or_default();
            let what = if reason == "Evicted" {
                format!("the sandbox's pod was evicted: {message}")
            } else {
                format!("the sandbox's pod failed: {reason} {message}")
            };
            return Progress::Failed(Error::new(Reason::FailedPrecondition, what.trim_end()));
        }
        Some("Succeeded") => {
            return Progress::Failed(Error::new(
                Reason::FailedPrecondition,
                "the sandbox's pod ended",
            ));
        }
        _ => {}
    }
    for c in status.init_container_statuses.iter().flatten() {
        if let Some(failed) = container_failure(c, &image, true) {
            return Progress::Failed(failed);
        }
    }
    let sandbox = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == SANDBOX_CONTAINER);
    if let Some(c) = sandbox
        && let Some(failed) = container_failure(c, &image, false)
    {
        return Progress::Failed(failed);
    }
    let unschedulable = status.conditions.iter().flatten().find(|c| {
        c.type_ == "PodScheduled"
            && c.status == "False"
            && c.reason.as_deref() == Some("Unschedulable")
    });
    if let Some(c) = unschedulable {
        return Progress::Stuck(Error::new(
            Reason::ResourceExhausted,
            format!(
                "no node of the cluster can run the sandbox's pod: {}",
                c.message.as_deref().unwrap_or("unschedulable")
            ),
        ));
    }
    let running = sandbox.is_some_and(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()));
    match (status.phase.as_deref(), running, status.pod_ip.as_deref()) {
        (Some("Running"), true, Some(ip)) if !ip.is_empty() => {
            Progress::Ready { ip: ip.to_owned() }
        }
        (Some("Running"), true, _) => Progress::Waiting("the pod's address".to_owned()),
        _ => Progress::Waiting(waiting_for(pod)),
    }
}

/// Why a container of the pod will not run, if it will not: its image cannot be pulled, it cannot be
/// made, or it exited (the init container with an error; the sandbox's at all).
fn container_failure(c: &ContainerStatus, image: &str, init: bool) -> Option<Error> {
    let state = c.state.as_ref()?;
    if let Some(waiting) = &state.waiting {
        let reason = waiting.reason.as_deref().unwrap_or_default();
        let message = waiting.message.as_deref().unwrap_or(reason);
        let of = c.image.as_str();
        if PULL_FAILURES.contains(&reason) {
            let what = if init { "the executor image" } else { "image" };
            return Some(Error::new(
                Reason::ImageMissing,
                format!(
                    "{what} {} cannot be pulled by the cluster ({reason}): {message}",
                    quoted(of)
                ),
            ));
        }
        if CREATE_FAILURES.contains(&reason) {
            return Some(Error::new(
                Reason::FailedPrecondition,
                format!(
                    "the container {} cannot be made ({reason}): {message}",
                    quoted(&c.name)
                ),
            ));
        }
        if reason == "CrashLoopBackOff" {
            let last = c
                .last_state
                .as_ref()
                .and_then(|s| s.terminated.as_ref())
                .map(|t| exited(t.exit_code, t.reason.as_deref(), t.message.as_deref()))
                .unwrap_or_else(|| message.to_owned());
            return Some(start_failure(&c.name, image, init, &last));
        }
    }
    let terminated = state.terminated.as_ref()?;
    if init && terminated.exit_code == 0 {
        return None;
    }
    let why = exited(
        terminated.exit_code,
        terminated.reason.as_deref(),
        terminated.message.as_deref(),
    );
    Some(start_failure(&c.name, image, init, &why))
}

fn exited(code: i32, reason: Option<&str>, message: Option<&str>) -> String {
    let reason = match reason {
        Some("OOMKilled") => "killed for lack of memory".to_owned(),
        Some(r) => r.to_owned(),
        None => String::new(),
    };
    let mut why = format!("exit code {code}");
    for part in [reason.as_str(), message.unwrap_or_default().trim()] {
        if !part.is_empty() {
            why.push_str("; ");
            why.push_str(part);
        }
    }
    why
}

fn start_failure(name: &str, image: &str, init: bool, why: &str) -> Error {
    let message = if init || name == INSTALL_CONTAINER {
        format!("the executor could not be copied into the sandbox's pod ({why})")
    } else {
        format!(
            "the container of image {} exited as it started ({why}), so it cannot run a sandbox",
            quoted(image)
        )
    };
    Error::new(Reason::FailedPrecondition, message)
}

/// What a pod on its way waits for, in words.
fn waiting_for(pod: &Pod) -> String {
    let status = pod.status.as_ref();
    let scheduled = status
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "PodScheduled" && c.status == "True")
        });
    if !scheduled {
        return "a node".to_owned();
    }
    let waiting = status
        .into_iter()
        .flat_map(|s| {
            s.init_container_statuses
                .iter()
                .flatten()
                .chain(s.container_statuses.iter().flatten())
        })
        .find_map(|c| {
            let w = c.state.as_ref()?.waiting.as_ref()?;
            Some(format!(
                "container {} ({})",
                c.name,
                w.reason.as_deref().unwrap_or("waiting")
            ))
        });
    waiting.unwrap_or_else(|| "its containers to start".to_owned())
}

/// The executor's address in a pod at `ip` (brackets for IPv6).
pub fn endpoint_uri(ip: &str, port: u16) -> String {
    if ip.contains(':') {
        format!("http://[{ip}]:{port}")
    } else {
        format!("http://{ip}:{port}")
    }
}

/// A quantity of the API (`500m`, `2`, `1024Mi`, `1Gi`, `1G`) as a number (cores, bytes).
pub fn quantity(q: &str) -> Option<f64> {
    let q = q.trim();
    let (number, factor) = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("m", 1e-3),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
    ]
    .iter()
    .find_map(|(suffix, factor)| q.strip_suffix(suffix).map(|n| (n, *factor)))
    .unwrap_or((q, 1.0));
    number.parse::<f64>().ok().map(|n| n * factor)
}

/// Where a resize of `pod`'s sandbox container to CPU and memory `want` (quantities) stands: applied, refused
/// by the node (why), or not yet (None).
pub fn resized(pod: &Pod, want: &BTreeMap<String, Quantity>) -> Option<Result<(), Error>> {
    let status = pod.status.as_ref()?;
    if let Some(pending) = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodResizePending" && c.status == "True")
        && pending.reason.as_deref() == Some("Infeasible")
    {
        return Some(Err(Error::new(
            Reason::ResourceExhausted,
            format!(
                "the node of the sandbox's pod cannot give it these limits: {}",
                pending.message.as_deref().unwrap_or("infeasible")
            ),
        )));
    }
    let have = status
        .container_statuses
        .iter()
        .flatten()
        .find(|c| c.name == SANDBOX_CONTAINER)?
        .resources
        .as_ref()?
        .limits
        .as_ref()?;
    let same = |name: &str| {
        let (Some(a), Some(b)) = (have.get(name), want.get(name)) else {
            return false;
        };
        match (quantity(&a.0), quantity(&b.0)) {
            (Some(a), Some(b)) => (a - b).abs() <= b.abs() * 1e-9,
            _ => false,
        }
    };
    (same("cpu") && same("memory")).then_some(Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A sandbox pod as the API reports it, with `status`.
    fn pod(status: serde_json::Value) -> Pod {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "mentis-sb-x", "namespace": "sandboxes"},
            "spec": {"containers": [{"name": "sandbox", "image": "team/tools:1"}]},
            "status": status,
        }))
        .expect("a pod")
    }

    fn failed(p: Progress) -> Error {
        match p {
            Progress::Failed(e) => e,
            other => panic!("not failed: {other:?}"),
        }
    }

    #[test]
    fn a_running_pod_with_an_address_is_ready_and_one_on_its_way_says_what_it_waits_for() {
        let ready = pod(serde_json::json!({
            "phase": "Running",
            "podIP": "10.1.2.3",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "sandbox", "image": "team/tools:1", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}}],
        }));
        assert!(matches!(progress(&ready), Progress::Ready { ip } if ip == "10.1.2.3"));
        assert_eq!(endpoint_uri("10.1.2.3", 50052), "http://10.1.2.3:50052");
        assert_eq!(endpoint_uri("fd00::7", 50052), "http://[fd00::7]:50052");

        let pending = pod(serde_json::json!({"phase": "Pending"}));
        assert!(matches!(progress(&pending), Progress::Waiting(w) if w == "a node"));
        let pulling = pod(serde_json::json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "initContainerStatuses": [{"name": "executor", "image": "mentis/executor", "imageID": "",
                "ready": false, "restartCount": 0, "state": {"waiting": {"reason": "PodInitializing"}}}],
        }));
        assert!(
            matches!(progress(&pulling), Progress::Waiting(w) if w == "container executor (PodInitializing)")
        );
    }

    #[test]
    fn a_pod_that_cannot_start_fails_with_its_cause() {
        let pull = failed(progress(&pod(serde_json::json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "sandbox", "image": "team/tools:1", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"waiting": {"reason": "ImagePullBackOff",
                "message": "Back-off pulling image \"team/tools:1\""}}}],
        }))));
        assert_eq!(pull.reason(), Reason::ImageMissing);
        assert!(
            pull.to_string()
                .contains("\"team/tools:1\" cannot be pulled"),
            "{pull}"
        );

        let crash = failed(progress(&pod(serde_json::json!({
            "phase": "Running",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "sandbox", "image": "team/tools:1", "imageID": "", "ready": false,
                "restartCount": 2, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}],
        }))));
        assert_eq!(crash.reason(), Reason::FailedPrecondition);
        assert!(
            crash
                .to_string()
                .contains("exited as it started (exit code 137; killed for lack of memory)"),
            "{crash}"
        );

        let install = failed(progress(&pod(serde_json::json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "initContainerStatuses": [{"name": "executor", "image": "mentis/executor", "imageID": "",
                "ready": false, "restartCount": 0,
                "state": {"terminated": {"exitCode": 1, "message": "no space left"}}}],
        }))));
        assert!(
            install.to_string().contains("executor could not be copied")
                && install.to_string().contains("no space left"),
            "{install}"
        );

        let evicted = failed(progress(&pod(serde_json::json!({
            "phase": "Failed", "reason": "Evicted",
            "message": "Usage of EmptyDir volume \"workspace\" exceeds the limit \"64Mi\".",
        }))));
        assert!(
            evicted
                .to_string()
                .starts_with("the sandbox's pod was evicted: Usage of EmptyDir"),
            "{evicted}"
        );

        // Waiting on a node is stuck, not failed: the caller decides how long an autoscaler may take.
        let unschedulable = progress(&pod(serde_json::json!({
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient memory."}],
        })));
        let Progress::Stuck(e) = unschedulable else {
            panic!("not stuck: {unschedulable:?}");
        };
        assert_eq!(e.reason(), Reason::ResourceExhausted);
        assert!(e.to_string().ends_with("3 Insufficient memory."), "{e}");
    }
}
