//! The simulated kubelet: each pod's containers on the Docker engine, its state reported through the API.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use k8s_openapi::api::core::v1::{Container, Pod, Volume};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::state::{SIM_LABEL, Sim, now};

/// Restarts of a container within [`CRASH_WINDOW`] before it is in CrashLoopBackOff (not started again).
const CRASH_RESTARTS: usize = 5;
const CRASH_WINDOW: Duration = Duration::from_secs(60);

/// The Docker container of pod `pod`'s container `container` (`pause` for the pod's network).
pub(super) fn container_name(sim: &str, pod: &str, container: &str) -> String {
    format!("ksim-{sim}-{pod}-{container}")
}

fn volume_name(sim: &str, pod: &str, volume: &str) -> String {
    format!("ksim-{sim}-{pod}-{volume}")
}

fn claim_volume(sim: &str, claim: &str) -> String {
    format!("ksim-{sim}-pvc-{claim}")
}

async fn docker(args: &[String]) -> Result<String> {
    let out = tokio::process::Command::new("docker")
        .args(args)
        .kill_on_drop(true)
        .output()
        .await
        .context("the docker CLI")?;
    if !out.status.success() {
        bail!(
            "docker {} failed: {}",
            args.first().map_or("", String::as_str),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

fn strings(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|s| (*s).to_owned()).collect()
}

/// The node's volume of claim `claim` (made when the claim is).
pub(super) async fn make_claim(sim: &Sim, claim: &str) -> Result<()> {
    docker(&strings(&[
        "volume",
        "create",
        "--label",
        &format!("{SIM_LABEL}={}", sim.id),
        &claim_volume(&sim.id, claim),
    ]))
    .await
    .map(drop)
}

pub(super) async fn remove_claim(sim: &Sim, claim: &str) {
    let _ = docker(&strings(&[
        "volume",
        "rm",
        "-f",
        &claim_volume(&sim.id, claim),
    ]))
    .await;
}

/// Applies a resize of pod `name`'s containers (name, resources) to their Docker containers, then reports
/// the resources in the pod's status.
pub(super) fn resize(sim: &Arc<Sim>, namespace: &str, name: &str, changed: Vec<(String, Value)>) {
    let sim = Arc::clone(sim);
    let (namespace, name) = (namespace.to_owned(), name.to_owned());
    let tasks = sim.tasks.clone();
    tasks.spawn(async move {
        for (container, resources) in changed {
            let limits = &resources["limits"];
            let mut args = strings(&["update"]);
            args.extend(limit_args(
                limits["cpu"].as_str(),
                limits["memory"].as_str(),
            ));
            args.push(container_name(&sim.id, &name, &container));
            if let Err(e) = docker(&args).await {
                sim.note(format!("pod {namespace}/{name}: resize of {container} failed: {e:#}"));
                sim.update_pod(&namespace, &name, |p| {
                    p["status"]["conditions"] = json!([{"type": "PodResizePending", "status": "True",
                        "reason": "Infeasible", "message": format!("{e:#}")}]);
                });
                continue;
            }
            sim.update_pod(&namespace, &name, |p| {
                if let Some(s) = p["status"]["containerStatuses"]
                    .as_array_mut()
                    .and_then(|l| l.iter_mut().find(|s| s["name"] == json!(container)))
                {
                    s["resources"] = resources.clone();
                }
            });
            sim.note(format!("pod {namespace}/{name}: container {container} resized"));
        }
    });
}

/// Runs pod `name` until `stop` (its deletion or the cluster's end), then removes it.
pub(super) fn spawn(sim: &Arc<Sim>, namespace: &str, name: &str, stop: CancellationToken) {
    let sim = Arc::clone(sim);
    let (namespace, name) = (namespace.to_owned(), name.to_owned());
    let tasks = sim.tasks.clone();
    tasks.spawn(async move {
        let started = tokio::select! {
            r = start(&sim, &namespace, &name) => Some(r),
            () = stop.cancelled() => None,
        };
        match started {
            Some(Ok(pod)) => supervise(&sim, &namespace, &name, &pod, &stop).await,
            Some(Err(e)) => {
                sim.note(format!("pod {namespace}/{name} cannot run: {e:#}"));
                stop.cancelled().await;
            }
            None => {}
        }
        remove(&sim, &namespace, &name).await;
    });
}

/// The pod's containers and volumes gone, then the pod (DELETED).
async fn remove(sim: &Sim, namespace: &str, name: &str) {
    let pod_filter = format!("label={SIM_LABEL}.pod={namespace}.{name}");
    let sim_filter = format!("label={SIM_LABEL}={}", sim.id);
    if let Ok(ids) = docker(&strings(&[
        "ps",
        "-aq",
        "--filter",
        &sim_filter,
        "--filter",
        &pod_filter,
    ]))
    .await
    {
        let mut args = strings(&["rm", "-f", "-v"]);
        args.extend(ids.split_whitespace().map(str::to_owned));
        if args.len() > 3 {
            let _ = docker(&args).await;
        }
    }
    if let Ok(vols) = docker(&strings(&[
        "volume",
        "ls",
        "-q",
        "--filter",
        &sim_filter,
        "--filter",
        &pod_filter,
    ]))
    .await
    {
        let mut args = strings(&["volume", "rm", "-f"]);
        args.extend(vols.split_whitespace().map(str::to_owned));
        if args.len() > 3 {
            let _ = docker(&args).await;
        }
    }
    let mut st = sim.state.lock().unwrap();
    st.pods.remove(&(namespace.to_owned(), name.to_owned()));
    let key = ("pods".to_owned(), namespace.to_owned(), name.to_owned());
    if let Some(pod) = st.objects.get(&key).cloned() {
        sim.commit(&mut st, "pods", namespace, "DELETED", pod);
    }
    drop(st);
    sim.note(format!("pod {namespace}/{name} removed from the node"));
}

/// A container's status as the kubelet reports it.
fn container_status(c: &Container, state: Value, restarts: usize, last: Option<Value>) -> Value {
    let ready = state.get("running").is_some();
    let mut s = json!({
        "name": c.name,
        "image": c.image.clone().unwrap_or_default(),
        "imageID": "",
        "ready": ready,
        "started": ready,
        "restartCount": restarts,
        "state": state,
    });
    if let Some(last) = last {
        s["lastState"] = last;
    }
    s
}

fn waiting(reason: &str, message: &str) -> Value {
    json!({"waiting": {"reason": reason, "message": message}})
}

fn terminated(code: i64, reason: &str) -> Value {
    json!({"terminated": {"exitCode": code, "reason": reason, "startedAt": now(), "finishedAt": now()}})
}

fn running() -> Value {
    json!({"running": {"startedAt": now()}})
}

fn condition(kind: &str, ok: bool) -> Value {
    json!({"type": kind, "status": if ok { "True" } else { "False" }, "lastTransitionTime": now()})
}

/// The pod's spec as stored.
fn read_pod(sim: &Sim, namespace: &str, name: &str) -> Result<Pod> {
    let pod = sim
        .get("pods", namespace, name)
        .context("the pod is gone")?;
    serde_json::from_value(pod).context("the stored pod is not a Pod")
}

/// Starts the pod's containers: the pause container, the volumes, the init containers one after the other,
/// the main containers. The pod as started.
async fn start(sim: &Sim, namespace: &str, name: &str) -> Result<Pod> {
    let pod = read_pod(sim, namespace, name)?;
    let spec = pod.spec.clone().context("a pod without a spec")?;
    let inits = spec.init_containers.clone().unwrap_or_default();
    sim.update_pod(namespace, name, |p| {
        p["spec"]["nodeName"] = json!("simulated-node");
        p["status"]["conditions"] = json!([
            condition("PodScheduled", true),
            condition("Initialized", false)
        ]);
        p["status"]["hostIP"] = json!("127.0.0.1");
        p["status"]["startTime"] = json!(now());
        p["status"]["initContainerStatuses"] = inits
            .iter()
            .map(|c| container_status(c, waiting("PodInitializing", ""), 0, None))
            .collect();
        p["status"]["containerStatuses"] = spec
            .containers
            .iter()
            .map(|c| container_status(c, waiting("PodInitializing", ""), 0, None))
            .collect();
    });
    // The node pulls nothing: an image the engine lacks cannot be had.
    for (init, c) in inits
        .iter()
        .map(|c| (true, c))
        .chain(spec.containers.iter().map(|c| (false, c)))
    {
        let image = c.image.clone().unwrap_or_default();
        if docker(&strings(&[
            "image", "inspect", "--format", "{{.Id}}", &image,
        ]))
        .await
        .is_err()
        {
            let message = format!(
                "failed to pull and unpack image \"{image}\": not found (the simulated node pulls nothing)"
            );
            set_status(
                sim,
                namespace,
                name,
                init,
                c,
                waiting("ErrImagePull", &message),
                0,
                None,
            );
            bail!("image {image} cannot be pulled");
        }
    }
    let labels = docker_labels(sim, namespace, name, &pod);
    // The pod's network: a pause container whose address is the pod's, whatever its containers do.
    let pause = container_name(&sim.id, name, "pause");
    let mut args = strings(&["run", "-d", "--name", &pause, "--network", &sim.network]);
    args.extend(labels.iter().cloned());
    args.extend(strings(&[
        "--entrypoint",
        "sleep",
        &sim.pause_image,
        "infinity",
    ]));
    docker(&args).await.context("the pod's pause container")?;
    let ip = docker(&strings(&[
        "inspect",
        "--format",
        &format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
            sim.network
        ),
        &pause,
    ]))
    .await?;
    sim.update_pod(namespace, name, |p| {
        p["status"]["podIP"] = json!(ip);
        p["status"]["podIPs"] = json!([{"ip": ip}]);
    });
    let volumes = spec.volumes.clone().unwrap_or_default();
    for v in &volumes {
        if v.empty_dir
            .as_ref()
            .is_some_and(|e| e.medium.as_deref() != Some("Memory"))
        {
            let mut args = strings(&["volume", "create"]);
            args.extend(labels.iter().cloned());
            args.push(volume_name(&sim.id, name, &v.name));
            docker(&args).await.context("an emptyDir")?;
        }
    }
    for c in &inits {
        set_status(sim, namespace, name, true, c, running(), 0, None);
        let mut args = strings(&["run", "--name", &container_name(&sim.id, name, &c.name)]);
        args.extend(container_args(
            sim, namespace, name, &pause, &labels, &volumes, c,
        )?);
        let exit = tokio::process::Command::new("docker")
            .args(&args)
            .kill_on_drop(true)
            .output()
            .await?;
        let code = i64::from(exit.status.code().unwrap_or(-1));
        if code != 0 {
            let last = terminated(code, "Error");
            let message = format!(
                "back-off restarting failed container {}: {}",
                c.name,
                String::from_utf8_lossy(&exit.stderr).trim()
            );
            set_status(
                sim,
                namespace,
                name,
                true,
                c,
                waiting("CrashLoopBackOff", &message),
                1,
                Some(last),
            );
            bail!("init container {} exited with {code}", c.name);
        }
        set_status(
            sim,
            namespace,
            name,
            true,
            c,
            terminated(0, "Completed"),
            0,
            None,
        );
        sim.note(format!(
            "pod {namespace}/{name}: init container {} completed",
            c.name
        ));
    }
    for c in &spec.containers {
        let docker_name = container_name(&sim.id, name, &c.name);
        let mut args = strings(&["create", "--name", &docker_name]);
        // The pod's RuntimeClass: its handler runs the main container (the API admitted only known ones).
        if let Some(handler) = spec
            .runtime_class_name
            .as_ref()
            .and_then(|class| sim.runtime_classes.lock().unwrap().get(class).cloned())
        {
            args.push(format!("--runtime={handler}"));
        }
        match container_args(sim, namespace, name, &pause, &labels, &volumes, c) {
            Ok(more) => args.extend(more),
            Err(e) => {
                let message = format!("{e:#}");
                set_status(
                    sim,
                    namespace,
                    name,
                    false,
                    c,
                    waiting("CreateContainerConfigError", &message),
                    0,
                    None,
                );
                bail!("container {}: {message}", c.name);
            }
        }
        if let Err(e) = docker(&args).await {
            let message = format!("{e:#}");
            set_status(
                sim,
                namespace,
                name,
                false,
                c,
                waiting("CreateContainerError", &message),
                0,
                None,
            );
            bail!("container {}: {message}", c.name);
        }
        docker(&strings(&["start", &docker_name])).await?;
        set_status(sim, namespace, name, false, c, running(), 0, None);
    }
    sim.update_pod(namespace, name, |p| {
        p["status"]["phase"] = json!("Running");
        p["status"]["conditions"] = json!([
            condition("PodScheduled", true),
            condition("Initialized", true),
            condition("ContainersReady", true),
            condition("Ready", true),
        ]);
    });
    sim.note(format!("pod {namespace}/{name} running at {ip}"));
    Ok(pod)
}

/// Sets one container's status in the pod (init or main).
#[allow(clippy::too_many_arguments)]
fn set_status(
    sim: &Sim,
    namespace: &str,
    name: &str,
    init: bool,
    c: &Container,
    state: Value,
    restarts: usize,
    last: Option<Value>,
) {
    let field = if init {
        "initContainerStatuses"
    } else {
        "containerStatuses"
    };
    sim.update_pod(namespace, name, |p| {
        let status = container_status(c, state, restarts, last);
        let list = p["status"][field].as_array_mut();
        match list {
            Some(list) => match list.iter_mut().find(|s| s["name"] == json!(c.name)) {
                Some(s) => *s = status,
                None => list.push(status),
            },
            None => p["status"][field] = json!([status]),
        }
        if !init && !status_running(p, &c.name) {
            p["status"]["conditions"] = json!([
                condition("PodScheduled", true),
                condition("Initialized", true),
                condition("ContainersReady", false),
                condition("Ready", false),
            ]);
        }
    });
}

fn status_running(p: &Value, container: &str) -> bool {
    p["status"]["containerStatuses"]
        .as_array()
        .and_then(|l| l.iter().find(|s| s["name"] == json!(container)))
        .is_some_and(|s| s["state"].get("running").is_some())
}

/// `--label` arguments: the pod's labels, and the cluster's and the pod's marks.
fn docker_labels(sim: &Sim, namespace: &str, name: &str, pod: &Pod) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in pod.metadata.labels.iter().flatten() {
        out.push("--label".to_owned());
        out.push(format!("{k}={v}"));
    }
    out.push("--label".to_owned());
    out.push(format!("{SIM_LABEL}={}", sim.id));
    out.push("--label".to_owned());
    out.push(format!("{SIM_LABEL}.pod={namespace}.{name}"));
    out
}

/// Docker's flags for a container's CPU (millicores, as the backend writes them) and memory (`Mi`) limits,
/// with no swap beyond the memory.
fn limit_args(cpu: Option<&str>, memory: Option<&str>) -> Vec<String> {
    let mut args = Vec::new();
    if let Some(cpu) = cpu {
        let milli: f64 = cpu.trim_end_matches('m').parse().unwrap_or(1000.0);
        args.push(format!("--cpus={}", milli / 1000.0));
    }
    if let Some(mb) = memory.map(|m| m.trim_end_matches("Mi")) {
        args.push(format!("--memory={mb}m"));
        args.push(format!("--memory-swap={mb}m"));
    }
    args
}

/// What `docker run`/`create` needs for container `c` of the pod, image and command last.
fn container_args(
    sim: &Sim,
    namespace: &str,
    pod: &str,
    pause: &str,
    labels: &[String],
    volumes: &[Volume],
    c: &Container,
) -> Result<Vec<String>> {
    let mut args = labels.to_vec();
    args.push(format!("--network=container:{pause}"));
    for m in c.volume_mounts.iter().flatten() {
        let v = volumes
            .iter()
            .find(|v| v.name == m.name)
            .with_context(|| format!("volume {} is not in the pod", m.name))?;
        let ro = m.read_only == Some(true);
        if let Some(e) = &v.empty_dir {
            if e.medium.as_deref() == Some("Memory") {
                let size = e.size_limit.as_ref().map_or(String::new(), |q| {
                    format!(",size={}", q.0.trim_end_matches("Mi").to_owned() + "m")
                });
                args.push("--tmpfs".to_owned());
                args.push(format!("{}:rw,nosuid,nodev,mode=1777{size}", m.mount_path));
                continue;
            }
            // An emptyDir starts empty: nothing of the image is copied in.
            args.push("--mount".to_owned());
            args.push(format!(
                "type=volume,src={},dst={},volume-nocopy{}",
                volume_name(&sim.id, pod, &v.name),
                m.mount_path,
                if ro { ",readonly" } else { "" }
            ));
        } else if let Some(claim) = &v.persistent_volume_claim {
            if sim
                .get("persistentvolumeclaims", namespace, &claim.claim_name)
                .is_none()
            {
                bail!("persistentvolumeclaim \"{}\" not found", claim.claim_name);
            }
            args.push("--mount".to_owned());
            args.push(format!(
                "type=volume,src={},dst={}{}",
                claim_volume(&sim.id, &claim.claim_name),
                m.mount_path,
                if ro { ",readonly" } else { "" }
            ));
        } else {
            bail!(
                "the simulated kubelet mounts emptyDir and claims only ({})",
                v.name
            );
        }
    }
    for e in c.env.iter().flatten() {
        let value = match (&e.value, &e.value_from) {
            (Some(v), _) => v.clone(),
            (None, Some(from)) => {
                let r = from
                    .secret_key_ref
                    .as_ref()
                    .context("the simulated kubelet resolves secretKeyRef only")?;
                let secret = sim
                    .get("secrets", namespace, &r.name)
                    .with_context(|| format!("secret \"{}\" not found", r.name))?;
                secret["stringData"][&r.key]
                    .as_str()
                    .with_context(|| {
                        format!(
                            "couldn't find key {} in Secret {namespace}/{}",
                            r.key, r.name
                        )
                    })?
                    .to_owned()
            }
            (None, None) => String::new(),
        };
        args.push("--env".to_owned());
        args.push(format!("{}={value}", e.name));
    }
    if let Some(dir) = &c.working_dir {
        args.push(format!("--workdir={dir}"));
    }
    if let Some(limits) = c.resources.as_ref().and_then(|r| r.limits.as_ref()) {
        args.extend(limit_args(
            limits.get("cpu").map(|q| q.0.as_str()),
            limits.get("memory").map(|q| q.0.as_str()),
        ));
    }
    if let Some(sc) = &c.security_context {
        if let (Some(u), g) = (sc.run_as_user, sc.run_as_group) {
            args.push(format!("--user={u}:{}", g.unwrap_or(u)));
        }
        if sc.allow_privilege_escalation == Some(false) {
            args.push("--security-opt=no-new-privileges".to_owned());
        }
        if sc.read_only_root_filesystem == Some(true) {
            args.push("--read-only".to_owned());
        }
        if let Some(caps) = &sc.capabilities {
            for d in caps.drop.iter().flatten() {
                args.push(format!("--cap-drop={d}"));
            }
            for a in caps.add.iter().flatten() {
                args.push(format!("--cap-add={a}"));
            }
        }
    }
    let command = c.command.clone().unwrap_or_default();
    if let Some(first) = command.first() {
        args.push(format!("--entrypoint={first}"));
    }
    args.push(c.image.clone().unwrap_or_default());
    args.extend(command.iter().skip(1).cloned());
    args.extend(c.args.iter().flatten().cloned());
    Ok(args)
}

/// Restarts the pod's main container whenever it exits (`restartPolicy: Always`), until `stop`; a
/// container that keeps exiting is left in CrashLoopBackOff.
async fn supervise(sim: &Sim, namespace: &str, name: &str, pod: &Pod, stop: &CancellationToken) {
    let Some(c) = pod.spec.as_ref().and_then(|s| s.containers.first()) else {
        stop.cancelled().await;
        return;
    };
    let docker_name = container_name(&sim.id, name, &c.name);
    let mut exits: Vec<tokio::time::Instant> = Vec::new();
    let wait = strings(&["wait", &docker_name]);
    loop {
        let waited = tokio::select! {
            () = stop.cancelled() => return,
            r = docker(&wait) => r,
        };
        let code: i64 = match waited {
            Ok(code) => code.trim().parse().unwrap_or(-1),
            Err(_) => {
                // Removed from under the kubelet (a lost node): nothing to restart.
                stop.cancelled().await;
                return;
            }
        };
        let oom = docker(&strings(&[
            "inspect",
            "--format",
            "{{.State.OOMKilled}}",
            &docker_name,
        ]))
        .await
        .is_ok_and(|s| s == "true");
        let reason = if oom { "OOMKilled" } else { "Error" };
        sim.note(format!(
            "pod {namespace}/{name}: container {} exited ({code}, {reason})",
            c.name
        ));
        let now = tokio::time::Instant::now();
        exits.retain(|at| now.duration_since(*at) < CRASH_WINDOW);
        exits.push(now);
        let restarts = exits.len();
        let last = Some(terminated(code, reason));
        if restarts > CRASH_RESTARTS {
            set_status(
                sim,
                namespace,
                name,
                false,
                c,
                waiting("CrashLoopBackOff", "back-off restarting failed container"),
                restarts,
                last,
            );
            stop.cancelled().await;
            return;
        }
        set_status(
            sim,
            namespace,
            name,
            false,
            c,
            terminated(code, reason),
            restarts,
            last.clone(),
        );
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(Duration::from_millis(500)) => {}
        }
        if docker(&strings(&["start", &docker_name])).await.is_err() {
            stop.cancelled().await;
            return;
        }
        set_status(sim, namespace, name, false, c, running(), restarts, last);
        sim.update_pod(namespace, name, |p| {
            p["status"]["conditions"] = json!([
                condition("PodScheduled", true),
                condition("Initialized", true),
                condition("ContainersReady", true),
                condition("Ready", true),
            ]);
        });
    }
}
