//! The backend's conversation with the Kubernetes API, scripted (the logic layer of issue 35's tests): a
//! kube client over a mock service (tower-test) that checks each request and answers as the API would:
//! created objects, a watch's events (newline-delimited JSON), lists, refusals. `Cluster` (a sandbox's
//! objects and its pod followed) and `KubernetesBackend` (prepare, list, reach, ping).

use std::collections::BTreeMap;
use std::time::Duration;

use http::{Method, Request, Response};
use kube::client::Body;
use mentis_backend_kubernetes::cluster::Cluster;
use mentis_backend_kubernetes::{KubernetesBackend, KubernetesConfig, Waits, Workspace};
use mentis_core::{BackendSpec, BackendState, Limits, Reason, SandboxBackend, SandboxId, SpaceId};
use serde_json::{Value, json};
use tower_test::mock::{Handle, SendResponse};

type ApiHandle = Handle<Request<Body>, Response<Body>>;

fn config() -> KubernetesConfig {
    KubernetesConfig {
        namespace: "sandboxes".to_owned(),
        instance: "i1".to_owned(),
        executor_image: "mentis/executor:latest".to_owned(),
        sandbox_user: "1000:1000".to_owned(),
        executor_env: Vec::new(),
        workspace: Workspace::EmptyDir,
        runtime_class: None,
        image_pull_policy: None,
        executor_port: 50052,
        runtime_pod_labels: BTreeMap::new(),
        runtime_namespace: "mentis".to_owned(),
        internal_cidrs: Vec::new(),
    }
}

fn spec() -> BackendSpec {
    BackendSpec {
        id: SandboxId::new(),
        space_id: Some(SpaceId::parse_or_default("").expect("the default space")),
        image: "team/tools:1".to_owned(),
        limits: Limits {
            cpu: 1.0,
            memory_mb: 512,
            pids: 256,
            nofile: 1024,
            disk_mb: 1024,
        },
        token: "secret-token".to_owned(),
        data_mounts: Vec::new(),
        executor_env: Vec::new(),
        egress: false,
        gateway: false,
        read_only_rootfs: true,
        runtime_class: None,
    }
}

fn cluster() -> (Cluster, ApiHandle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "sandboxes");
    (Cluster::new(client, config()), handle)
}

fn respond(send: SendResponse<Response<Body>>, status: u16, body: &Value) {
    send.send_response(
        Response::builder()
            .status(status)
            .body(Body::from(serde_json::to_vec(body).expect("json")))
            .expect("a response"),
    );
}

/// The next request, checked for its method and path; its JSON body (Null when none) and the answer's
/// sender.
async fn expect(
    handle: &mut ApiHandle,
    method: Method,
    path: &str,
) -> (String, Value, SendResponse<Response<Body>>) {
    let (request, send) = handle.next_request().await.expect("a request");
    assert_eq!(request.method(), method, "{}", request.uri());
    assert_eq!(request.uri().path(), path, "{}", request.uri());
    let query = request.uri().query().unwrap_or_default().to_owned();
    let bytes = request.into_body().collect_bytes().await.expect("the body");
    let body = if bytes.is_empty() {
        Value::Null
    } else {
        serde_json::from_slice(&bytes).expect("a JSON body")
    };
    (query, body, send)
}

fn with_version(mut object: Value, version: &str) -> Value {
    object["metadata"]["resourceVersion"] = json!(version);
    object
}

fn pod_with(pod: &Value, version: &str, status: Value) -> Value {
    let mut pod = with_version(pod.clone(), version);
    pod["status"] = status;
    pod
}

fn events(events: &[(&str, Value)]) -> Body {
    let mut lines = Vec::new();
    for (kind, object) in events {
        lines.extend(serde_json::to_vec(&json!({"type": kind, "object": object})).expect("json"));
        lines.push(b'\n');
    }
    Body::from(lines)
}

/// Answers the Secret's and the pod's creation; the pod as created.
async fn created(handle: &mut ApiHandle) -> Value {
    let (_, secret, send) =
        expect(handle, Method::POST, "/api/v1/namespaces/sandboxes/secrets").await;
    assert_eq!(secret["stringData"]["token"], "secret-token");
    respond(send, 201, &with_version(secret, "1"));
    let (_, pod, send) = expect(handle, Method::POST, "/api/v1/namespaces/sandboxes/pods").await;
    assert!(
        !pod.to_string().contains("secret-token"),
        "the token in the pod: {pod}"
    );
    let pod = with_version(pod, "2");
    respond(send, 201, &pod);
    pod
}

/// The API's side of a create that is then followed: the Secret and the pod made, then one watch answered
/// with the pod in each of `statuses` in turn (ADDED, then MODIFIED). The watch's query, and the handle for
/// what comes after.
async fn create_then_watch(mut handle: ApiHandle, statuses: Vec<Value>) -> (String, ApiHandle) {
    let pod = created(&mut handle).await;
    let (query, _, send) = expect(
        &mut handle,
        Method::GET,
        "/api/v1/namespaces/sandboxes/pods",
    )
    .await;
    let seen: Vec<(&str, Value)> = statuses
        .into_iter()
        .enumerate()
        .map(|(i, status)| {
            let kind = if i == 0 { "ADDED" } else { "MODIFIED" };
            (kind, pod_with(&pod, &(3 + i).to_string(), status))
        })
        .collect();
    send.send_response(Response::builder().body(events(&seen)).expect("a response"));
    (query, handle)
}

/// The client's side: `spec` created and followed, unschedulable for at most `stuck`.
async fn create_and_wait(
    cluster: &Cluster,
    spec: &BackendSpec,
    stuck: Duration,
) -> mentis_core::Result<mentis_core::Endpoint> {
    let pod = cluster.create(spec).await.expect("created");
    let version = pod.metadata.resource_version.clone().unwrap_or_default();
    cluster
        .wait_ready(spec.id, &version, Duration::from_secs(10), stuck)
        .await
}

#[tokio::test]
async fn a_created_pod_is_followed_by_a_watch_until_the_executor_can_be_reached() {
    let (cluster, handle) = cluster();
    let spec = spec();
    let id = spec.id;
    let api = tokio::spawn(async move {
        let pending = json!({"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}]});
        let running = json!({"phase": "Running", "podIP": "10.1.2.3",
            "containerStatuses": [{"name": "sandbox", "image": "team/tools:1", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}}]});
        let (query, _) = create_then_watch(handle, vec![pending, running]).await;
        assert!(
            query.contains("watch=true") && query.contains("resourceVersion=2"),
            "{query}"
        );
        assert!(
            query.contains(&format!("metadata.name%3Dmentis-sb-{id}")),
            "{query}"
        );
    });
    let endpoint = create_and_wait(&cluster, &spec, Duration::from_secs(5))
        .await
        .expect("ready");
    assert_eq!(endpoint.uri, "http://10.1.2.3:50052");
    api.await.expect("the API's side");
}

#[tokio::test]
async fn an_image_the_cluster_cannot_pull_fails_the_create_with_its_cause() {
    let (cluster, handle) = cluster();
    let spec = spec();
    let api = tokio::spawn(async move {
        let pulling = json!({"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "True"}],
            "containerStatuses": [{"name": "sandbox", "image": "team/tools:1", "imageID": "", "ready": false,
                "restartCount": 0, "state": {"waiting": {"reason": "ErrImagePull",
                "message": "pull access denied for team/tools"}}}]});
        create_then_watch(handle, vec![pulling]).await;
    });
    let e = create_and_wait(&cluster, &spec, Duration::from_secs(5))
        .await
        .expect_err("it cannot run");
    assert_eq!(e.reason(), Reason::ImageMissing);
    assert!(e.to_string().contains("pull access denied"), "{e}");
    api.await.expect("the API's side");
}

/// A create whose pod the API refuses with 403 and `message`: what it made is removed; the error, and the
/// pod as it was sent.
async fn create_forbidden(spec: BackendSpec, message: &'static str) -> (mentis_core::Error, Value) {
    let (cluster, mut handle) = cluster();
    let id = spec.id;
    let api = tokio::spawn(async move {
        let (_, secret, send) = expect(
            &mut handle,
            Method::POST,
            "/api/v1/namespaces/sandboxes/secrets",
        )
        .await;
        respond(send, 201, &with_version(secret, "1"));
        let (_, pod, send) = expect(
            &mut handle,
            Method::POST,
            "/api/v1/namespaces/sandboxes/pods",
        )
        .await;
        respond(
            send,
            403,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 403,
            "reason": "Forbidden", "message": message}),
        );
        // What it made is removed (the pod was never made: 404 is fine).
        let (_, _, send) = expect(
            &mut handle,
            Method::DELETE,
            &format!("/api/v1/namespaces/sandboxes/pods/mentis-sb-{id}"),
        )
        .await;
        respond(
            send,
            404,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 404, "reason": "NotFound"}),
        );
        let (_, _, send) = expect(
            &mut handle,
            Method::DELETE,
            &format!("/api/v1/namespaces/sandboxes/secrets/mentis-sb-{id}-token"),
        )
        .await;
        respond(
            send,
            200,
            &json!({"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 200}),
        );
        pod
    });
    let e = cluster.create(&spec).await.expect_err("forbidden");
    (e, api.await.expect("the API's side"))
}

#[tokio::test]
async fn a_forbidden_create_says_what_the_role_lacks_and_removes_what_it_made() {
    let (e, _) = create_forbidden(
        spec(),
        "pods is forbidden: User \"system:serviceaccount:mentis:mentis\" cannot create resource \"pods\"",
    )
    .await;
    assert_eq!(e.reason(), Reason::FailedPrecondition);
    let text = e.to_string();
    assert!(
        text.contains("forbids the runtime to create the sandbox's pod") && text.contains("Role"),
        "{text}"
    );
}

#[tokio::test]
async fn a_runtime_class_the_cluster_lacks_refuses_the_pod_in_the_admission_s_words_not_the_role_s()
{
    let mut spec = spec();
    spec.runtime_class = Some("gvisor".to_owned());
    // The RuntimeClass admission plugin's refusal: 403, but no Role would change it.
    let (e, pod) = create_forbidden(
        spec,
        "pods \"mentis-sb-x\" is forbidden: pod rejected: RuntimeClass \"gvisor\" not found",
    )
    .await;
    assert_eq!(pod["spec"]["runtimeClassName"], "gvisor", "{pod}");
    assert_eq!(e.reason(), Reason::FailedPrecondition);
    let text = e.to_string();
    assert!(
        text.contains("the cluster refused to create the sandbox's pod")
            && text.contains("RuntimeClass \"gvisor\" not found")
            && !text.contains("Role"),
        "{text}"
    );
}

#[tokio::test]
async fn a_pod_no_node_takes_fails_after_its_stuck_time_with_the_scheduler_s_words() {
    let (cluster, handle) = cluster();
    let spec = spec();
    let api = tokio::spawn(async move {
        let unschedulable = json!({"phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                "message": "0/3 nodes are available: 3 Insufficient memory."}]});
        let (_, mut handle) = create_then_watch(handle, vec![unschedulable]).await;
        // The watch ended: it is watched again from where it was, and nothing more comes.
        let (query, _, send) = expect(
            &mut handle,
            Method::GET,
            "/api/v1/namespaces/sandboxes/pods",
        )
        .await;
        assert!(query.contains("resourceVersion=3"), "{query}");
        (handle, send)
    });
    let started = std::time::Instant::now();
    let e = create_and_wait(&cluster, &spec, Duration::from_millis(300))
        .await
        .expect_err("stuck");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(e.reason(), Reason::ResourceExhausted);
    assert!(e.to_string().contains("3 Insufficient memory"), "{e}");
    drop(api.await.expect("the API's side"));
}

fn backend(config: KubernetesConfig) -> (KubernetesBackend, ApiHandle) {
    let (service, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "sandboxes");
    let waits = Waits {
        start: Duration::from_secs(10),
        stuck: Duration::from_secs(5),
    };
    (KubernetesBackend::new(client, config, waits), handle)
}

/// What `/version` answers for Kubernetes 1.`minor`.
fn version(minor: &str) -> Value {
    json!({"major": "1", "minor": minor, "gitVersion": format!("v1.{minor}.0"), "gitCommit": "",
        "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z", "goVersion": "", "compiler": "",
        "platform": "linux/amd64"})
}

fn status(code: u16, reason: &str, message: &str) -> Value {
    json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
        "message": message})
}

#[tokio::test]
async fn prepare_applies_the_network_policies_and_a_missing_grant_stops_the_start() {
    let (backend, mut handle) = backend(config());
    let api = tokio::spawn(async move {
        for name in ["ingress", "no-egress", "egress"] {
            let path = format!(
                "/apis/networking.k8s.io/v1/namespaces/sandboxes/networkpolicies/mentis-i1-{name}"
            );
            let (query, policy, send) = expect(&mut handle, Method::PATCH, &path).await;
            assert!(
                query.contains("fieldManager=mentis-runtime") && query.contains("force=true"),
                "{query}"
            );
            assert_eq!(policy["kind"], "NetworkPolicy");
            respond(send, 200, &policy);
        }
        // The version says whether pods can be resized in place.
        let (_, _, send) = expect(&mut handle, Method::GET, "/version").await;
        respond(send, 200, &version("33"));
        let (query, _, send) = expect(
            &mut handle,
            Method::GET,
            "/api/v1/namespaces/sandboxes/pods",
        )
        .await;
        assert!(
            query.contains("labelSelector=io.mentis.managed%3Dtrue%2Cio.mentis.instance%3Di1"),
            "{query}"
        );
        respond(
            send,
            403,
            &status(
                403,
                "Forbidden",
                "pods is forbidden: cannot list resource \"pods\"",
            ),
        );
    });
    let e = backend.prepare().await.expect_err("no grant to list pods");
    assert_eq!(e.reason(), Reason::FailedPrecondition);
    assert!(
        e.to_string()
            .contains("forbids the runtime to list the sandboxes' pods"),
        "{e}"
    );
    api.await.expect("the API's side");
}

#[tokio::test]
async fn list_tells_the_instance_s_pods_apart_and_a_pod_gone_is_container_gone() {
    let (backend, mut handle) = backend(config());
    let (running, failed) = (SandboxId::new(), SandboxId::new());
    let api = tokio::spawn(async move {
        let pod = |id: SandboxId, status: Value| {
            json!({"metadata": {"name": format!("mentis-sb-{id}"), "namespace": "sandboxes",
                "labels": {"io.mentis.sandbox-id": id.to_string(), "io.mentis.instance": "i1"}},
                "spec": {"containers": [{"name": "sandbox", "image": "team/tools:1"}]}, "status": status})
        };
        let (_, _, send) = expect(
            &mut handle,
            Method::GET,
            "/api/v1/namespaces/sandboxes/pods",
        )
        .await;
        respond(
            send,
            200,
            &json!({"kind": "PodList", "apiVersion": "v1", "metadata": {"resourceVersion": "9"},
            "items": [
                pod(running, json!({"phase": "Running", "podIP": "10.0.0.9",
                    "containerStatuses": [{"name": "sandbox", "image": "team/tools:1", "imageID": "",
                        "ready": true, "restartCount": 0, "state": {"running": {}}}]})),
                pod(failed, json!({"phase": "Failed", "reason": "Evicted", "message": "low on memory"})),
            ]}),
        );
        let path = format!("/api/v1/namespaces/sandboxes/pods/mentis-sb-{failed}");
        let (_, _, send) = expect(&mut handle, Method::GET, &path).await;
        respond(send, 404, &status(404, "NotFound", "pods not found"));
        let (_, _, send) = expect(&mut handle, Method::GET, "/version").await;
        respond(
            send,
            200,
            &json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0", "gitCommit": "",
            "gitTreeState": "", "buildDate": "", "goVersion": "", "compiler": "", "platform": ""}),
        );
    });
    let mut listed = backend.list().await.expect("listed");
    listed.sort_by_key(|s| s.state != BackendState::Running);
    assert_eq!(
        listed.iter().map(|s| (s.id, s.state)).collect::<Vec<_>>(),
        [
            (running, BackendState::Running),
            (failed, BackendState::Missing)
        ]
    );
    let e = backend.ensure_running(failed).await.expect_err("gone");
    assert_eq!(e.reason(), Reason::ContainerGone);
    backend.ping().await.expect("the API answers");
    api.await.expect("the API's side");
}

fn labelled_pod(id: SandboxId, version: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": format!("mentis-sb-{id}"), "namespace": "sandboxes", "resourceVersion": version,
            "labels": {"io.mentis.managed": "true", "io.mentis.instance": "i1",
                "io.mentis.sandbox-id": id.to_string()}},
        "spec": {"containers": [{"name": "sandbox", "image": "team/tools:1"}]},
        "status": {"phase": "Running", "podIP": "10.1.2.3",
            "containerStatuses": [{"name": "sandbox", "image": "team/tools:1", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}}]}})
}

#[tokio::test]
async fn following_the_pods_names_each_one_deleted_or_failing_and_lists_again_when_the_watch_is_too_old()
 {
    let (backend, mut handle) = backend(config());
    let (deleted, evicted, fine) = (SandboxId::new(), SandboxId::new(), SandboxId::new());
    let api = tokio::spawn(async move {
        let pods = "/api/v1/namespaces/sandboxes/pods";
        // The list the watch starts from.
        let (query, _, send) = expect(&mut handle, Method::GET, pods).await;
        assert!(!query.contains("watch=true"), "{query}");
        assert!(query.contains("io.mentis.instance%3Di1"), "{query}");
        respond(
            send,
            200,
            &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "10"},
                "items": [labelled_pod(fine, "9")]}),
        );
        // A watch from there: one pod deleted, one evicted, one that runs on; then the API says the version
        // is too old.
        let (query, _, send) = expect(&mut handle, Method::GET, pods).await;
        assert!(
            query.contains("watch=true") && query.contains("resourceVersion=10"),
            "{query}"
        );
        let mut evicted_pod = labelled_pod(evicted, "12");
        evicted_pod["status"] = json!({"phase": "Failed", "reason": "Evicted",
            "message": "the node was low on resource: ephemeral-storage"});
        send.send_response(
            Response::builder()
                .body(events(&[
                    ("DELETED", labelled_pod(deleted, "11")),
                    ("MODIFIED", evicted_pod),
                    ("MODIFIED", labelled_pod(fine, "13")),
                    (
                        "ERROR",
                        status(410, "Expired", "too old resource version: 10 (20)"),
                    ),
                ]))
                .expect("a response"),
        );
        // Listed again, then watched from the new version.
        let (query, _, send) = expect(&mut handle, Method::GET, pods).await;
        assert!(!query.contains("watch=true"), "{query}");
        respond(
            send,
            200,
            &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "20"},
                "items": [labelled_pod(fine, "13")]}),
        );
        let (query, _, _send) = expect(&mut handle, Method::GET, pods).await;
        assert!(
            query.contains("watch=true") && query.contains("resourceVersion=20"),
            "{query}"
        );
        handle
    });
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let gone = move |id: SandboxId| {
        let _ = tx.send(id);
    };
    tokio::time::pause();
    let followed = tokio::time::timeout(Duration::from_secs(60), backend.follow(&gone)).await;
    assert!(followed.is_err(), "follow ends only when dropped");
    let mut named = Vec::new();
    while let Ok(id) = rx.try_recv() {
        named.push(id);
    }
    assert_eq!(named, [deleted, evicted]);
    drop(api.await.expect("the API's side"));
}

/// The API's side of `prepare` on Kubernetes 1.`minor`: the policies applied, the version, the pods listed.
async fn prepared(handle: &mut ApiHandle, minor: &str) {
    for name in ["ingress", "no-egress", "egress"] {
        let path = format!(
            "/apis/networking.k8s.io/v1/namespaces/sandboxes/networkpolicies/mentis-i1-{name}"
        );
        let (_, policy, send) = expect(handle, Method::PATCH, &path).await;
        respond(send, 200, &policy);
    }
    let (_, _, send) = expect(handle, Method::GET, "/version").await;
    respond(send, 200, &version(minor));
    let (_, _, send) = expect(handle, Method::GET, "/api/v1/namespaces/sandboxes/pods").await;
    respond(
        send,
        200,
        &json!({"apiVersion": "v1", "kind": "PodList", "metadata": {"resourceVersion": "1"}, "items": []}),
    );
}

fn limits(cpu: f64, memory_mb: i64) -> Limits {
    Limits {
        cpu,
        memory_mb,
        pids: 256,
        nofile: 1024,
        disk_mb: 1024,
    }
}

#[tokio::test]
async fn a_warm_pod_is_resized_in_place_on_1_33_and_the_node_refusing_it_is_a_clear_error() {
    // Before 1.33: no resize, a pool serves the default limits only.
    let (old, mut handle) = backend(config());
    let api = tokio::spawn(async move {
        prepared(&mut handle, "32").await;
        handle
    });
    old.prepare().await.expect("prepared");
    drop(api.await.expect("the API's side"));
    assert!(!old.updates_limits());
    assert!(!old.changes_limits(&limits(1.0, 1024), &limits(2.0, 1024), None));
    assert!(old.changes_limits(&limits(1.0, 1024), &limits(1.0, 1024), None));

    let (backend, mut handle) = backend(config());
    let id = SandboxId::new();
    let api = tokio::spawn(async move {
        prepared(&mut handle, "33+").await;
        // The resize: a strategic merge of the sandbox container's resources, on the resize subresource.
        let path = format!("/api/v1/namespaces/sandboxes/pods/mentis-sb-{id}/resize");
        let (_, patch, send) = expect(&mut handle, Method::PATCH, &path).await;
        let container = &patch["spec"]["containers"][0];
        assert_eq!(container["name"], "sandbox");
        assert_eq!(container["resources"]["limits"]["cpu"], "2000m");
        assert_eq!(container["resources"]["requests"]["memory"], "2048Mi");
        let mut pod = labelled_pod(id, "5");
        respond(send, 200, &pod);
        // Followed until the node has applied it (its status in canonical quantities).
        let (query, _, send) = expect(
            &mut handle,
            Method::GET,
            "/api/v1/namespaces/sandboxes/pods",
        )
        .await;
        assert!(
            query.contains("watch=true") && query.contains("resourceVersion=5"),
            "{query}"
        );
        pod["metadata"]["resourceVersion"] = json!("6");
        pod["status"]["containerStatuses"][0]["resources"] = json!({"limits": {"cpu": "2", "memory": "2Gi"}, "requests": {"cpu": "2", "memory": "2Gi"}});
        send.send_response(
            Response::builder()
                .body(events(&[("MODIFIED", pod.clone())]))
                .expect("a response"),
        );
        // A second resize the node cannot fit.
        let (_, _, send) = expect(&mut handle, Method::PATCH, &path).await;
        pod["metadata"]["resourceVersion"] = json!("7");
        pod["status"]["conditions"] = json!([{"type": "PodResizePending", "status": "True",
            "reason": "Infeasible", "message": "Node didn't have enough capacity: cpu, requested: 64000"}]);
        respond(send, 200, &pod);
        handle
    });
    backend.prepare().await.expect("prepared");
    assert!(backend.updates_limits());
    // More CPU, more memory: in place; less memory: never.
    assert!(backend.changes_limits(&limits(1.0, 1024), &limits(0.5, 2048), None));
    assert!(!backend.changes_limits(&limits(1.0, 1024), &limits(1.0, 512), None));
    backend
        .update_limits(id, limits(2.0, 2048))
        .await
        .expect("resized");
    let e = backend
        .update_limits(id, limits(64.0, 2048))
        .await
        .expect_err("infeasible");
    assert_eq!(e.reason(), Reason::ResourceExhausted);
    assert!(e.to_string().contains("enough capacity"), "{e}");
    drop(api.await.expect("the API's side"));
}
