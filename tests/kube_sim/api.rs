//! The simulated API server: the calls the Kubernetes backend makes, over HTTP, as the real API answers them.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::http::{Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio_stream::wrappers::BroadcastStream;

use super::kubelet;
use super::state::{Event, Sim, now};

/// Serves the API on `listener` until the cluster stops.
pub(super) fn serve(sim: &Arc<Sim>, listener: tokio::net::TcpListener) {
    let app = axum::Router::new()
        .fallback(handle)
        .with_state(Arc::clone(sim));
    let stop = sim.cancel.clone();
    sim.tasks.spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { stop.cancelled().await })
            .await;
    });
}

/// A Status object, as the API answers an error.
fn status(code: StatusCode, reason: &str, message: impl Into<String>) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message.into(),
        "reason": reason,
        "code": code.as_u16(),
    });
    object(code, body)
}

fn object(code: StatusCode, object: Value) -> Response {
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        serde_json::to_vec(&object).unwrap_or_default(),
    )
        .into_response()
}

/// The query's `name=value` pairs, decoded.
fn query(uri: &Uri) -> Vec<(String, String)> {
    uri.query()
        .unwrap_or_default()
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect()
}

/// Percent-decoding of a query part (`+` is a space).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
                if let Ok(b) = u8::from_str_radix(hex, 16) {
                    out.push(b);
                    i += 3;
                    continue;
                }
                out.push(b'%');
            }
            b'+' => out.push(b' '),
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// What a list or watch selects: `metadata.name=` (fieldSelector) and `k=v` pairs (labelSelector).
#[derive(Default)]
struct Selector {
    name: Option<String>,
    labels: Vec<(String, String)>,
}

impl Selector {
    /// The selector of query `q`; what the simulated API cannot select by, as a BadRequest's message.
    fn of(q: &[(String, String)]) -> Result<Self, String> {
        let mut s = Self::default();
        for (k, v) in q {
            match k.as_str() {
                "fieldSelector" => {
                    for term in v.split(',').filter(|t| !t.is_empty()) {
                        match term.split_once('=') {
                            Some(("metadata.name", name)) => s.name = Some(name.to_owned()),
                            _ => {
                                return Err(format!(
                                    "the simulated API selects by metadata.name only, not {term:?}"
                                ));
                            }
                        }
                    }
                }
                "labelSelector" => {
                    for term in v.split(',').filter(|t| !t.is_empty()) {
                        let Some((lk, lv)) = term.split_once('=') else {
                            return Err(format!(
                                "the simulated API selects labels by equality only, not {term:?}"
                            ));
                        };
                        s.labels.push((lk.to_owned(), lv.to_owned()));
                    }
                }
                _ => {}
            }
        }
        Ok(s)
    }

    fn matches(&self, object: &Value) -> bool {
        let meta = &object["metadata"];
        if let Some(name) = &self.name
            && meta["name"].as_str() != Some(name)
        {
            return false;
        }
        self.labels
            .iter()
            .all(|(k, v)| meta["labels"][k].as_str() == Some(v.as_str()))
    }
}

/// Where a request goes: `/api/v1/namespaces/NS/RESOURCE[/NAME[/SUB]]` or the same under
/// `/apis/GROUP/VERSION`.
struct Target {
    namespace: String,
    resource: String,
    name: Option<String>,
    sub: Option<String>,
    api_version: String,
}

fn target(path: &str) -> Option<Target> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (api_version, rest) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("v1".to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    match rest {
        ["namespaces", ns, resource, more @ ..] if more.len() <= 2 => Some(Target {
            namespace: (*ns).to_owned(),
            resource: (*resource).to_owned(),
            name: more.first().map(|s| (*s).to_owned()),
            sub: more.get(1).map(|s| (*s).to_owned()),
            api_version,
        }),
        _ => None,
    }
}

/// The kinds the simulated API serves, by (apiVersion, resource).
fn kind_of(api_version: &str, resource: &str) -> Option<&'static str> {
    Some(match (api_version, resource) {
        ("v1", "pods") => "Pod",
        ("v1", "secrets") => "Secret",
        ("v1", "persistentvolumeclaims") => "PersistentVolumeClaim",
        ("networking.k8s.io/v1", "networkpolicies") => "NetworkPolicy",
        _ => return None,
    })
}

async fn handle(
    axum::extract::State(sim): axum::extract::State<Arc<Sim>>,
    method: Method,
    uri: Uri,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let bearer = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if bearer != Some(sim.token.as_str()) {
        return status(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized");
    }
    let q = query(&uri);
    let watch = q
        .iter()
        .any(|(k, v)| k == "watch" && (v == "true" || v == "1"));
    let line = format!(
        "{method} {}{}",
        uri.path(),
        if watch { " (watch)" } else { "" }
    );
    sim.requests.lock().unwrap().push(line);
    if method == Method::GET && uri.path() == "/version" {
        return object(
            StatusCode::OK,
            json!({
                "major": "1", "minor": "33", "gitVersion": "v1.33.0-mentis-simulated",
                "gitCommit": "", "gitTreeState": "clean", "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "", "compiler": "", "platform": "linux/amd64",
            }),
        );
    }
    let Some(t) = target(uri.path()) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!("the simulated API has no {}", uri.path()),
        );
    };
    let Some(kind) = kind_of(&t.api_version, &t.resource) else {
        return status(
            StatusCode::NOT_FOUND,
            "NotFound",
            format!(
                "the simulated API serves no {} {}",
                t.api_version, t.resource
            ),
        );
    };
    let selector = match Selector::of(&q) {
        Ok(s) => s,
        Err(why) => return status(StatusCode::BAD_REQUEST, "BadRequest", why),
    };
    match (&method, t.name.as_deref(), t.sub.as_deref()) {
        (&Method::GET, None, None) if watch => {
            let version = q
                .iter()
                .find(|(k, _)| k == "resourceVersion")
                .map(|(_, v)| v.clone())
                .unwrap_or_default();
            let timeout = q
                .iter()
                .find(|(k, _)| k == "timeoutSeconds")
                .and_then(|(_, v)| v.parse().ok())
                .unwrap_or(290);
            watch_response(&sim, &t, selector, &version, Duration::from_secs(timeout))
        }
        (&Method::GET, None, None) => {
            let st = sim.state.lock().unwrap();
            let items: Vec<Value> = st
                .objects
                .iter()
                .filter(|((r, ns, _), o)| {
                    *r == t.resource && *ns == t.namespace && selector.matches(o)
                })
                .map(|(_, o)| o.clone())
                .collect();
            object(
                StatusCode::OK,
                json!({
                    "kind": format!("{kind}List"),
                    "apiVersion": t.api_version,
                    "metadata": {"resourceVersion": st.rv.to_string()},
                    "items": items,
                }),
            )
        }
        (&Method::POST, None, None) => create(&sim, &t, kind, &body).await,
        (&Method::GET, Some(name), None) => match sim.get(&t.resource, &t.namespace, name) {
            Some(o) => object(StatusCode::OK, o),
            None => not_found(&t, name),
        },
        (&Method::DELETE, Some(name), None) => delete(&sim, &t, name).await,
        (&Method::PATCH, Some(name), Some("resize")) if t.resource == "pods" => {
            resize(&sim, &t, name, &body)
        }
        (&Method::PATCH, Some(name), None) => {
            let apply = headers
                .get(header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("application/apply-patch"));
            if !apply {
                return status(
                    StatusCode::UNSUPPORTED_MEDIA_TYPE,
                    "UnsupportedMediaType",
                    "the simulated API takes server-side apply patches only",
                );
            }
            apply_patch(&sim, &t, kind, name, &body)
        }
        _ => status(
            StatusCode::METHOD_NOT_ALLOWED,
            "MethodNotAllowed",
            format!("the simulated API does not serve {method} {}", uri.path()),
        ),
    }
}

fn not_found(t: &Target, name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("{} \"{name}\" not found", t.resource),
    )
}

fn parse_body(body: &Bytes) -> Option<Value> {
    serde_json::from_slice::<Value>(body)
        .ok()
        .filter(Value::is_object)
}

fn not_an_object() -> Response {
    status(
        StatusCode::BAD_REQUEST,
        "BadRequest",
        "the body is not a JSON object",
    )
}

async fn create(sim: &Arc<Sim>, t: &Target, kind: &str, body: &Bytes) -> Response {
    let Some(mut o) = parse_body(body) else {
        return not_an_object();
    };
    if o["kind"].as_str() != Some(kind) || o["apiVersion"].as_str() != Some(t.api_version.as_str())
    {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("expected a {kind} of {}", t.api_version),
        );
    }
    let Some(name) = o["metadata"]["name"].as_str().map(str::to_owned) else {
        return status(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Invalid",
            "metadata.name: Required value",
        );
    };
    if t.resource == "pods"
        && let Some(class) = o["spec"]["runtimeClassName"].as_str()
        && !sim.runtime_classes.lock().unwrap().contains_key(class)
    {
        // As the RuntimeClass admission plugin refuses it.
        return status(
            StatusCode::FORBIDDEN,
            "Forbidden",
            format!(
                "pods \"{name}\" is forbidden: pod rejected: RuntimeClass \"{class}\" not found"
            ),
        );
    }
    if t.resource == "persistentvolumeclaims" {
        // Bound at once: the node's volume is made now (a real provisioner may take a while).
        if let Err(e) = kubelet::make_claim(sim, &name).await {
            return status(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                e.to_string(),
            );
        }
        o["status"] = json!({"phase": "Bound"});
    }
    let created = {
        let mut st = sim.state.lock().unwrap();
        let key = (t.resource.clone(), t.namespace.clone(), name.clone());
        if st.objects.contains_key(&key) {
            return status(
                StatusCode::CONFLICT,
                "AlreadyExists",
                format!("{} \"{name}\" already exists", t.resource),
            );
        }
        o["metadata"]["namespace"] = json!(t.namespace);
        o["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
        o["metadata"]["creationTimestamp"] = json!(now());
        if t.resource == "pods" {
            o["status"] = json!({"phase": "Pending", "qosClass": "Guaranteed"});
        }
        let created = sim.commit(&mut st, &t.resource, &t.namespace, "ADDED", o);
        if t.resource == "pods" {
            let stop = sim.cancel.child_token();
            st.pods
                .insert((t.namespace.clone(), name.clone()), stop.clone());
            kubelet::spawn(sim, &t.namespace, &name, stop);
        }
        created
    };
    sim.note(format!("{kind} {}/{name} created", t.namespace));
    object(StatusCode::CREATED, created)
}

async fn delete(sim: &Arc<Sim>, t: &Target, name: &str) -> Response {
    if t.resource == "pods" {
        return match sim.delete_pod(&t.namespace, name) {
            Some(pod) => {
                sim.note(format!("Pod {}/{name} deleted", t.namespace));
                object(StatusCode::OK, pod)
            }
            None => not_found(t, name),
        };
    }
    let gone = {
        let mut st = sim.state.lock().unwrap();
        let key = (t.resource.clone(), t.namespace.clone(), name.to_owned());
        match st.objects.get(&key).cloned() {
            Some(o) => sim.commit(&mut st, &t.resource, &t.namespace, "DELETED", o),
            None => return not_found(t, name),
        }
    };
    if t.resource == "persistentvolumeclaims" {
        kubelet::remove_claim(sim, name).await;
    }
    sim.note(format!("{} {}/{name} deleted", t.resource, t.namespace));
    object(StatusCode::OK, gone)
}

/// A pod's CPU and memory changed in place (a strategic merge of its containers' resources): the spec at
/// once, then the kubelet applies it to the container and reports it in the status.
fn resize(sim: &Arc<Sim>, t: &Target, name: &str, body: &Bytes) -> Response {
    let Some(patch) = parse_body(body) else {
        return not_an_object();
    };
    let Some(containers) = patch["spec"]["containers"].as_array().cloned() else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            "a resize patches spec.containers",
        );
    };
    let mut st = sim.state.lock().unwrap();
    let key = ("pods".to_owned(), t.namespace.clone(), name.to_owned());
    let Some(mut pod) = st.objects.get(&key).cloned() else {
        return not_found(t, name);
    };
    let mut changed = Vec::new();
    for c in &containers {
        let Some(spec) = pod["spec"]["containers"]
            .as_array_mut()
            .and_then(|l| l.iter_mut().find(|s| s["name"] == c["name"]))
        else {
            return status(
                StatusCode::UNPROCESSABLE_ENTITY,
                "Invalid",
                format!("no container {} in the pod", c["name"]),
            );
        };
        spec["resources"] = c["resources"].clone();
        changed.push((
            c["name"].as_str().unwrap_or_default().to_owned(),
            c["resources"].clone(),
        ));
    }
    let pod = sim.commit(&mut st, "pods", &t.namespace, "MODIFIED", pod);
    drop(st);
    sim.note(format!("Pod {}/{name} resized", t.namespace));
    kubelet::resize(sim, &t.namespace, name, changed);
    object(StatusCode::OK, pod)
}

fn apply_patch(sim: &Arc<Sim>, t: &Target, kind: &str, name: &str, body: &Bytes) -> Response {
    let Some(mut o) = parse_body(body) else {
        return not_an_object();
    };
    if o["kind"].as_str() != Some(kind) || o["metadata"]["name"].as_str() != Some(name) {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("an apply patch must be the whole {kind} named {name}"),
        );
    }
    let mut st = sim.state.lock().unwrap();
    let key = (t.resource.clone(), t.namespace.clone(), name.to_owned());
    let (code, event) = match st.objects.get(&key) {
        Some(old) => {
            o["metadata"]["uid"] = old["metadata"]["uid"].clone();
            o["metadata"]["creationTimestamp"] = old["metadata"]["creationTimestamp"].clone();
            (StatusCode::OK, "MODIFIED")
        }
        None => {
            o["metadata"]["uid"] = json!(uuid::Uuid::new_v4().to_string());
            o["metadata"]["creationTimestamp"] = json!(now());
            (StatusCode::CREATED, "ADDED")
        }
    };
    o["metadata"]["namespace"] = json!(t.namespace);
    let applied = sim.commit(&mut st, &t.resource, &t.namespace, event, o);
    drop(st);
    sim.note(format!("{kind} {}/{name} applied", t.namespace));
    object(code, applied)
}

/// A watch: the changes after `version` (or, from "" or "0", every object as ADDED), then those to come,
/// as JSON lines, until `timeout` (the API ends every watch) or the cluster stops.
fn watch_response(
    sim: &Arc<Sim>,
    t: &Target,
    selector: Selector,
    version: &str,
    timeout: Duration,
) -> Response {
    let Ok(from) = (if version.is_empty() {
        Ok(0)
    } else {
        version.parse::<u64>()
    }) else {
        return status(
            StatusCode::BAD_REQUEST,
            "BadRequest",
            format!("resourceVersion {version:?} is not a version"),
        );
    };
    let (backlog, live, mut last) = {
        let st = sim.state.lock().unwrap();
        let live = sim.events.subscribe();
        let backlog: Vec<Event> = if from == 0 {
            st.objects
                .iter()
                .filter(|((r, ns, _), _)| *r == t.resource && *ns == t.namespace)
                .map(|(_, o)| Event {
                    rv: st.rv,
                    resource: t.resource.clone(),
                    namespace: t.namespace.clone(),
                    kind: "ADDED",
                    object: o.clone(),
                })
                .collect()
        } else {
            st.history.iter().filter(|e| e.rv > from).cloned().collect()
        };
        // Whatever comes live is newer than what the backlog holds.
        (backlog, live, st.rv)
    };
    let resource = t.resource.clone();
    let namespace = t.namespace.clone();
    let selects = move |e: &Event| {
        e.resource == resource && e.namespace == namespace && selector.matches(&e.object)
    };
    let backlog: Vec<Event> = backlog.into_iter().filter(|e| selects(e)).collect();
    let live = BroadcastStream::new(live)
        // A watcher that fell behind is ended: the client watches again from its last version.
        .take_while(|e| std::future::ready(e.is_ok()))
        .filter_map(|e| std::future::ready(e.ok()))
        .filter(move |e| {
            let fresh = e.rv > last;
            if fresh {
                last = e.rv;
            }
            std::future::ready(fresh)
        });
    let stop = sim.cancel.clone();
    let lines = futures::stream::iter(backlog)
        .chain(live.filter(move |e| std::future::ready(selects(e))))
        .map(|e| {
            let mut line = serde_json::to_vec(&json!({"type": e.kind, "object": e.object}))
                .unwrap_or_default();
            line.push(b'\n');
            Ok::<_, Infallible>(Bytes::from(line))
        })
        .take_until(async move {
            tokio::select! {
                () = tokio::time::sleep(timeout) => {}
                () = stop.cancelled() => {}
            }
        });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(lines))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}
