//! The Kubernetes backend end to end, against a SIMULATED cluster (tests/kube_sim.rs: an API server speaking
//! the calls the backend makes, and a kubelet that runs each pod's containers on the Docker engine; no real
//! cluster can run here). The real runtime, configured with a kubeconfig naming the simulated API, makes
//! pods, follows them with a watch, reaches real executors at their pod IPs over real gRPC, and removes them
//! (issue 35; docs/KUBERNETES.md says what the simulation does not cover).

use std::time::Duration;

use futures::StreamExt;
use mentis_e2e::kube_sim::Cluster;
use mentis_e2e::*;
use mentis_proto::api;
use mentis_runtime::config::{BackendChoice, KubernetesSettings};

/// Labels of "the runtime's pods" in the ingress NetworkPolicy (the simulation does not enforce it).
fn runtime_labels() -> std::collections::BTreeMap<String, String> {
    [("app.kubernetes.io/name".to_owned(), "mentis-e2e".to_owned())].into()
}

/// A runtime whose sandboxes are pods of `cluster`.
async fn runtime_on(cluster: &Cluster) -> anyhow::Result<Harness> {
    runtime_checking_every(cluster, Duration::from_secs(1)).await
}

/// [`runtime_on`] with health checks every `interval`.
async fn runtime_checking_every(cluster: &Cluster, interval: Duration) -> anyhow::Result<Harness> {
    let kubeconfig = cluster.kubeconfig.clone();
    Harness::start_with(move |c| {
        c.backend = BackendChoice::Kubernetes(Box::new(KubernetesSettings {
            kubeconfig: Some(kubeconfig),
            runtime_pod_labels: runtime_labels(),
            unschedulable: Duration::from_secs(10),
            ..KubernetesSettings::default()
        }));
        c.health_interval = interval;
    })
    .await
}

fn pod_of(sandbox: &str) -> String {
    format!("mentis-sb-{sandbox}")
}

#[tokio::test]
async fn a_sandbox_is_a_pod_whose_executor_runs_shell_and_ipython_and_goes_with_its_delete()
-> anyhow::Result<()> {
    let cluster = Cluster::start(&executor_image()).await?;
    let mut h = runtime_on(&cluster).await?;
    let ns = cluster.namespace.clone();
    // The instance's NetworkPolicies, applied at start.
    let mut policies = cluster.names("networkpolicies", &ns);
    policies.sort();
    let instance = h.guard.instance.clone();
    assert_eq!(
        policies,
        ["egress", "ingress", "no-egress"].map(|p| format!("mentis-{instance}-{p}")),
    );

    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    assert_eq!(sb.state, api::SandboxState::Running as i32, "{sb:?}");
    let pod = cluster
        .object("pods", &ns, &pod_of(&id))
        .expect("the sandbox's pod");
    assert_eq!(
        pod["metadata"]["labels"]["io.mentis.sandbox-id"],
        id.as_str()
    );
    assert_eq!(
        pod["metadata"]["labels"]["io.mentis.instance"],
        instance.as_str()
    );
    // The token is in a Secret the pod names, never in the pod's spec.
    let text = pod.to_string();
    let env = &pod["spec"]["containers"][0]["env"];
    let token = env
        .as_array()
        .and_then(|e| e.iter().find(|v| v["name"] == "MENTIS_EXECUTOR_TOKEN"))
        .expect("the token's variable");
    assert!(token.get("value").is_none(), "{token}");
    assert_eq!(
        token["valueFrom"]["secretKeyRef"]["name"],
        format!("mentis-sb-{id}-token")
    );
    let secret = cluster
        .object("secrets", &ns, &format!("mentis-sb-{id}-token"))
        .expect("the token's Secret");
    let token = secret["stringData"]["token"].as_str().unwrap_or_default();
    assert!(!token.is_empty() && !text.contains(token));

    // Shell, as the sandbox user, in the pod's workspace.
    let obs = h.sh(&id, "echo hello; id -u; pwd").await?;
    assert_eq!(stdout(&obs), "hello\n1000\n/workspace\n");
    assert_eq!(cmd_end(&obs)?.exit_code, 0);
    // A session's state, and a failing command as data.
    let obs = h
        .exec(
            &id,
            api::ShellAction {
                command: "export GREETING=pods".into(),
                session: "s".into(),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(cmd_end(&obs)?.exit_code, 0);
    let obs = h
        .exec(
            &id,
            api::ShellAction {
                command: "echo $GREETING; (exit 3)".into(),
                session: "s".into(),
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(stdout(&obs), "pods\n");
    assert_eq!(cmd_end(&obs)?.exit_code, 3);
    // IPython keeps its state between cells.
    let obs = h.py(&id, "x = 41").await?;
    ipython_result(&obs)?;
    let obs = h.py(&id, "x + 1").await?;
    assert_eq!(cell_value(&obs).as_deref(), Some("42"));

    // Egress by rules needs the gateway, which this backend does not have yet: refused, saying so, and
    // nothing is left behind; nor does a pod's egress mode change in place.
    let rules = api::SandboxSpec {
        egress_rules: vec![api::EgressRule {
            domain: "pkgs.example.org".into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let refused = h
        .sandboxes
        .create_sandbox(api::CreateSandboxRequest { spec: Some(rules) })
        .await
        .expect_err("EGRESS_RULES on the Kubernetes backend");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(refused.message().contains("EGRESS_RULES"), "{refused:?}");
    let refused = h
        .sandboxes
        .update_sandbox(api::UpdateSandboxRequest {
            sandbox: Some(api::Sandbox {
                sandbox_id: id.clone(),
                egress: api::Egress::Allow as i32,
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["egress".into()],
            }),
        })
        .await
        .expect_err("a mode change on the Kubernetes backend");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );

    // Images are the cluster's: a build is refused, saying so.
    let mut templates =
        mentis_proto::api::template_service_client::TemplateServiceClient::new(h.channel.clone());
    let (_, built) = crate::templates::build_with(
        &mut templates,
        api::BuildImageHeader {
            image: "mentis-e2e/k8s-built:1".into(),
            ..Default::default()
        },
        crate::templates::context(&[("Dockerfile", "FROM mentis/executor:latest\nRUN true\n")])?,
    )
    .await?;
    let refused = built.expect_err("a build on the Kubernetes backend");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("Kubernetes backend"),
        "{refused:?}"
    );

    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while cluster.object("pods", &ns, &pod_of(&id)).is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod outlived its sandbox"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        cluster
            .object("secrets", &ns, &format!("mentis-sb-{id}-token"))
            .is_none()
    );
    h.stop().await?;
    cluster.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_pod_deleted_under_a_running_action_ends_it_lost_once_and_ends_the_sandbox()
-> anyhow::Result<()> {
    let cluster = Cluster::start(&executor_image()).await?;
    // Health checks far apart: only the pods' watch can tell the runtime soon that the pod went.
    let mut h = runtime_checking_every(&cluster, Duration::from_secs(600)).await?;
    let ns = cluster.namespace.clone();
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    let (stream, mut seen) =
        crate::faults::start_until_ready(&mut h, &id, "echo ready; sleep 1000").await?;
    // Someone else deletes the pod (kubectl delete pod, an eviction): its containers go.
    assert!(cluster.delete_pod(&ns, &pod_of(&id)));
    seen.extend(collect(stream, Duration::from_secs(120)).await?);
    let ends: Vec<_> = seen
        .iter()
        .filter(|o| matches!(o.kind, Some(api::observation::Kind::CmdEnd(_))))
        .collect();
    assert_eq!(ends.len(), 1, "{seen:?}");
    let end = cmd_end(&seen)?;
    println!("the action's end: {end:?}");
    assert_eq!(end.reason, api::EndReason::Lost as i32, "{end:?}");
    // It says why: the pod went, not a delete of the sandbox.
    assert!(end.message.contains("is gone"), "{end:?}");
    // An emptyDir went with its pod: nothing is left to bring back, so the sandbox ends, noticed through
    // the watch (the next health check is ten minutes away).
    let ended = h
        .wait_state(&id, api::SandboxState::Terminated, Duration::from_secs(30))
        .await?;
    assert!(ended.state_reason.contains("gone"), "{ended:?}");
    println!("sandbox {id} ended: {ended:?}");
    h.stop().await?;
    cluster.stop().await;
    Ok(())
}

#[tokio::test]
async fn an_image_the_cluster_cannot_pull_fails_the_create_within_seconds_with_its_cause()
-> anyhow::Result<()> {
    let cluster = Cluster::start(&executor_image()).await?;
    let mut h = runtime_on(&cluster).await?;
    let ns = cluster.namespace.clone();
    let started = tokio::time::Instant::now();
    let refused = h
        .sandboxes
        .create_sandbox(api::CreateSandboxRequest {
            spec: Some(api::SandboxSpec {
                image: "mentis-e2e/no-such-image:1".into(),
                ..Default::default()
            }),
        })
        .await
        .expect_err("an image nobody can pull");
    let took = started.elapsed();
    println!("refused after {took:?}: {refused:?}");
    assert!(took < Duration::from_secs(30), "took {took:?}");
    assert_ne!(refused.code(), tonic::Code::Internal, "{refused:?}");
    assert!(
        refused.message().contains("mentis-e2e/no-such-image:1"),
        "{refused:?}"
    );
    // Nothing of the failed create is left in the cluster.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let left: Vec<String> = cluster
            .names("pods", &ns)
            .into_iter()
            .chain(cluster.names("secrets", &ns))
            .collect();
        if left.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "left behind: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    h.stop().await?;
    cluster.stop().await;
    Ok(())
}

/// The runtime's settings for a cluster, as a process's environment.
fn env_for(cluster: &Cluster) -> Vec<(&'static str, String)> {
    vec![
        ("MENTIS_BACKEND", "kubernetes".to_owned()),
        ("KUBECONFIG", cluster.kubeconfig.display().to_string()),
        (
            "MENTIS_K8S_RUNTIME_POD_LABELS",
            "app.kubernetes.io/name=mentis-e2e".to_owned(),
        ),
        // One warm pod, two at most.
        ("MENTIS_POOL", "default=1:2:kernel".to_owned()),
    ]
}

/// Waits until the runtime's pool has an idle member (its executor answering, its kernel started) and
/// `cluster` holds its pod besides `claimed` (a claimed pod keeps its pool label: labels do not change);
/// the pod's name.
async fn warm_pod(h: &Harness, cluster: &Cluster, claimed: &[&str]) -> anyhow::Result<String> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let pools = h.pools().await?;
        let idle = pools.first().is_some_and(|p| p.idle > 0 && p.creating == 0);
        let warm: Vec<String> = cluster
            .names("pods", &cluster.namespace)
            .into_iter()
            .filter(|name| {
                !claimed.contains(&name.as_str())
                    && cluster
                        .object("pods", &cluster.namespace, name)
                        .is_some_and(|p| p["metadata"]["labels"]["io.mentis.pool"] == "true")
            })
            .collect();
        if idle && let [one] = warm.as_slice() {
            return Ok(one.clone());
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "no warm pod: {pools:?}, {:?}",
            cluster.names("pods", &cluster.namespace)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn a_warm_pod_is_claimed_and_a_runtime_killed_mid_action_finds_its_pods_again()
-> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let cluster = Cluster::start(&executor_image()).await?;
    let env = env_for(&cluster);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let mut first = RuntimeProcess::start_with_env(bin, &instance, data_dir.path(), &env).await?;
    let mut h = first.harness(data_dir, guard).await?;

    // A create with the default limits is served by the warm pod (late binding: its space is bound in the
    // store, the pod is as it was made).
    let warm = warm_pod(&h, &cluster, &[]).await?;
    let sb = h.create_default().await?;
    let id = sb.sandbox_id.clone();
    assert_eq!(warm, pod_of(&id), "the create did not claim the warm pod");
    // The pool makes another.
    warm_pod(&h, &cluster, &[&warm]).await?;

    h.py(&id, "kept = 'in the kernel'").await?;
    h.sh(&id, "echo on-disk > /workspace/kept.txt").await?;
    let action = api::ExecuteRequest {
        sandbox_id: id.clone(),
        action: Some(shell_action(cmd(
            "for i in $(seq 1 20); do echo line-$i; sleep 0.1; done",
        ))),
        action_id: "numbered".into(),
    };
    let mut stream = h.actions.execute(action).await?.into_inner();
    let mut before = Vec::new();
    while !stdout(&before).contains("line-1\n") {
        let m = tokio::time::timeout(Duration::from_secs(60), stream.next())
            .await?
            .ok_or_else(|| anyhow::anyhow!("stream ended early"))??;
        if let Some(api::execute_response::Kind::Observation(o)) = m.kind {
            before.push(o);
        }
    }
    // SIGKILL: the runtime says nothing to anyone; the pods run on.
    first.kill();
    drop(stream);
    let Harness {
        data_dir, guard, ..
    } = h;
    let second = RuntimeProcess::start_with_env(bin, &instance, data_dir.path(), &env).await?;
    let mut h = second.harness(data_dir, guard).await?;

    // The action resumes from the last line seen to its own end, every line once.
    let mut rest = h
        .actions
        .stream_observations(api::StreamObservationsRequest {
            sandbox_id: id.clone(),
            after_seq: before.last().map_or(0, |o| o.seq),
            action_id: "numbered".into(),
        })
        .await?
        .into_inner();
    let mut all = before;
    while let Some(item) = tokio::time::timeout(Duration::from_secs(60), rest.next()).await? {
        if let Some(api::stream_observations_response::Kind::Observation(o)) = item?.kind {
            all.push(o);
        }
    }
    let expected: String = (1..=20).map(|i| format!("line-{i}\n")).collect();
    assert_eq!(stdout(&all), expected);
    assert_eq!(cmd_end(&all)?.reason, api::EndReason::Exited as i32);
    // The same pod: its kernel's state and its workspace are there.
    let obs = h.py(&id, "kept").await?;
    assert_eq!(cell_value(&obs).as_deref(), Some("'in the kernel'"));
    assert_eq!(
        stdout(&h.sh(&id, "cat /workspace/kept.txt").await?),
        "on-disk\n"
    );
    let pods = cluster.names("pods", &cluster.namespace);
    assert!(pods.contains(&pod_of(&id)), "{pods:?}");
    assert!(pods.len() <= 3, "the restart made pods again: {pods:?}");
    h.stop().await?;
    drop(second);
    cluster.stop().await;
    Ok(())
}

#[tokio::test]
async fn files_a_terminal_and_a_snapshot_work_on_a_pod_and_the_snapshot_comes_back_in_a_new_pod()
-> anyhow::Result<()> {
    let cluster = Cluster::start(&executor_image()).await?;
    let mut h = runtime_on(&cluster).await?;
    let id = h.create_default().await?.sandbox_id;

    // Files, through the executor at the pod's address.
    let mut files = crate::files::files(&h);
    let body = bytes::Bytes::from(vec![b'k'; 300_000]);
    crate::files::write(&mut files, &id, "data/pods.bin", vec![body.clone()]).await?;
    let read = crate::files::read(&mut files, &id, "data/pods.bin").await?;
    assert_eq!(read, body.to_vec());

    // A terminal.
    let mut terminals = crate::terminal::terminals(&h);
    let mut term = crate::terminal::Term::open(
        &mut terminals,
        crate::terminal::start(&id, &["bash"], 80, 24),
    )
    .await?;
    term.type_in("echo $((6 * 7))-from-a-pod\n").await?;
    term.expect("42-from-a-pod").await?;
    drop(term);

    // A snapshot, the sandbox deleted (its pod and emptyDir gone), restored into a new pod.
    let snap = crate::snapshots::take(&h, &id, &[]).await;
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    let restored = h
        .create(crate::snapshots::from_snapshot(&snap.snapshot_id))
        .await?;
    assert!(
        cluster
            .object("pods", &cluster.namespace, &pod_of(&restored.sandbox_id))
            .is_some()
    );
    let obs = h
        .sh(&restored.sandbox_id, "wc -c < /workspace/data/pods.bin")
        .await?;
    assert_eq!(stdout(&obs), "300000\n");
    h.stop().await?;
    cluster.stop().await;
    Ok(())
}

/// The snapshots of a pause (by snapshot) of `sandbox`.
async fn pause_snapshots(h: &Harness, sandbox: &str) -> anyhow::Result<Vec<api::Snapshot>> {
    Ok(crate::snapshots::snapshots(h)
        .list_snapshots(api::ListSnapshotsRequest {
            sandbox_id: sandbox.to_owned(),
            labels: [(
                "io.mentis.trigger".to_owned(),
                "pause-by-snapshot".to_owned(),
            )]
            .into(),
            ..Default::default()
        })
        .await?
        .into_inner()
        .snapshots)
}

#[tokio::test]
async fn a_pause_keeps_the_workspace_in_a_snapshot_and_removes_the_pod_and_a_resume_makes_it_again()
-> anyhow::Result<()> {
    let cluster = Cluster::start(&executor_image()).await?;
    let mut h = runtime_on(&cluster).await?;
    let ns = cluster.namespace.clone();
    let id = h.create_default().await?.sandbox_id;
    h.sh(
        &id,
        "mkdir -p /workspace/w && echo kept > /workspace/w/file.txt",
    )
    .await?;
    h.py(&id, "in_memory = 1").await?;

    let paused = h
        .sandboxes
        .pause_sandbox(api::PauseSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?
        .into_inner()
        .sandbox
        .unwrap_or_default();
    assert_eq!(paused.state, api::SandboxState::Paused as i32, "{paused:?}");
    // Nothing runs while paused: the pod and its token's Secret are gone, the workspace is a snapshot.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while cluster.object("pods", &ns, &pod_of(&id)).is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the pod outlived the pause"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(cluster.names("secrets", &ns).is_empty());
    assert_eq!(pause_snapshots(&h, &id).await?.len(), 1);
    // A call that needs the executor says the sandbox is paused (no auto-resume asked for).
    let refused = h
        .actions
        .execute(api::ExecuteRequest {
            sandbox_id: id.clone(),
            action: Some(shell_action(cmd("true"))),
            action_id: String::new(),
        })
        .await;
    assert_eq!(code(refused), tonic::Code::FailedPrecondition);

    let resumed = h
        .sandboxes
        .resume_sandbox(api::ResumeSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?
        .into_inner()
        .sandbox
        .unwrap_or_default();
    assert_eq!(
        resumed.state,
        api::SandboxState::Running as i32,
        "{resumed:?}"
    );
    assert!(cluster.object("pods", &ns, &pod_of(&id)).is_some());
    // The workspace came back; the kernel's state did not (a new pod, new processes).
    assert_eq!(
        stdout(&h.sh(&id, "cat /workspace/w/file.txt").await?),
        "kept\n"
    );
    let obs = h.py(&id, "in_memory").await?;
    let result = ipython_result(&obs)?;
    assert!(
        format!("{result:?}").contains("NameError"),
        "the kernel's state survived a pause by snapshot: {result:?}"
    );
    // The pause's snapshot went once restored.
    assert!(pause_snapshots(&h, &id).await?.is_empty());
    h.stop().await?;
    cluster.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_warm_pod_claimed_for_other_limits_is_resized_in_place_and_less_memory_gets_a_pod_of_its_own()
-> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let cluster = Cluster::start(&executor_image()).await?;
    let env = env_for(&cluster);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let runtime = RuntimeProcess::start_with_env(bin, &instance, data_dir.path(), &env).await?;
    let mut h = runtime.harness(data_dir, guard).await?;
    let ns = cluster.namespace.clone();

    // Half a CPU and more memory than the pool's default: the warm pod, resized in place.
    let warm = warm_pod(&h, &cluster, &[]).await?;
    let sb = h
        .create(api::SandboxSpec {
            cpu_limit: 0.5,
            memory_limit_mb: 1536,
            ..Default::default()
        })
        .await?;
    assert_eq!(pod_of(&sb.sandbox_id), warm, "not served by the warm pod");
    let pod = cluster.object("pods", &ns, &warm).expect("the pod");
    let limits = &pod["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(
        (limits["cpu"].as_str(), limits["memory"].as_str()),
        (Some("500m"), Some("1536Mi"))
    );
    // What its node (the simulated kubelet) applied to the running container.
    let applied = docker(&[
        "inspect",
        "--format",
        "{{.HostConfig.NanoCpus}} {{.HostConfig.Memory}}",
        &cluster.container_of(&warm, "sandbox"),
    ])?;
    assert_eq!(applied.trim(), format!("500000000 {}", 1536u64 << 20));
    assert_eq!(
        stdout(&h.sh(&sb.sandbox_id, "echo resized").await?),
        "resized\n"
    );

    // Less memory than the pool's pods have cannot be had in place: a pod made for it.
    let next = warm_pod(&h, &cluster, &[&warm]).await?;
    let small = h
        .create(api::SandboxSpec {
            memory_limit_mb: 512,
            ..Default::default()
        })
        .await?;
    assert_ne!(pod_of(&small.sandbox_id), next);
    let pod = cluster
        .object("pods", &ns, &pod_of(&small.sandbox_id))
        .expect("its own pod");
    assert!(
        pod["metadata"]["labels"]["io.mentis.pool"].is_null(),
        "{pod}"
    );
    h.stop().await?;
    drop(runtime);
    cluster.stop().await;
    Ok(())
}

#[tokio::test]
async fn a_template_s_runtime_class_names_the_pod_s_and_a_class_the_cluster_lacks_fails_the_create()
-> anyhow::Result<()> {
    use mentis_proto::api::template_service_client::TemplateServiceClient;
    crate::gvisor::ensure_runsc()?;
    let cluster = Cluster::start(&executor_image()).await?;
    // The cluster has gVisor (its node's handler runsc); the operator offers it and kata, which the
    // cluster lacks.
    cluster.add_runtime_class("gvisor", "runsc");
    let kubeconfig = cluster.kubeconfig.clone();
    let offered = mentis_runtime::RuntimeConfig::from_lookup(|k| {
        (k == "MENTIS_RUNTIME_CLASSES").then(|| "gvisor,kata".to_owned())
    })?
    .runtime_classes;
    let mut h = Harness::start_with(move |c| {
        c.backend = BackendChoice::Kubernetes(Box::new(KubernetesSettings {
            kubeconfig: Some(kubeconfig),
            runtime_pod_labels: runtime_labels(),
            ..KubernetesSettings::default()
        }));
        c.runtime_classes = offered;
    })
    .await?;
    let ns = cluster.namespace.clone();
    let mut templates = TemplateServiceClient::new(h.channel.clone());
    for (name, class) in [("boxed", "gvisor"), ("kata", "kata")] {
        templates
            .create_template(api::CreateTemplateRequest {
                template: Some(api::Template {
                    name: name.into(),
                    runtime_class: class.into(),
                    ..Default::default()
                }),
            })
            .await?;
    }

    // The template's class is the pod's runtimeClassName, and the node runs it under gVisor.
    let sb = h
        .create(api::SandboxSpec {
            template: "boxed".into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(sb.runtime_class, "gvisor");
    let pod = cluster
        .object("pods", &ns, &pod_of(&sb.sandbox_id))
        .expect("the sandbox's pod");
    assert_eq!(pod["spec"]["runtimeClassName"], "gvisor", "{pod}");
    let main = cluster.container_of(&pod_of(&sb.sandbox_id), "sandbox");
    assert_eq!(inspect(&main, "{{.HostConfig.Runtime}}")?, "runsc");
    let dmesg = stdout(&h.sh(&sb.sandbox_id, "dmesg 2>&1 | head -n 3").await?);
    assert!(dmesg.contains("Starting gVisor"), "dmesg: {dmesg:?}");
    let obs = h.py(&sb.sandbox_id, "6 * 7").await?;
    assert_eq!(cell_value(&obs).as_deref(), Some("42"));

    // A class the cluster lacks: the API refuses the pod, and the create fails at once with its words,
    // leaving nothing behind.
    let started = std::time::Instant::now();
    let refused = h
        .create(api::SandboxSpec {
            template: "kata".into(),
            ..Default::default()
        })
        .await
        .expect_err("no RuntimeClass kata");
    let status = refused
        .downcast_ref::<tonic::Status>()
        .expect("a gRPC status");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition, "{status:?}");
    assert!(
        status.message().contains("RuntimeClass \"kata\" not found"),
        "{status:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(10));
    let pods = cluster.names("pods", &ns);
    assert_eq!(
        pods,
        [pod_of(&sb.sandbox_id)],
        "only the gVisor pod is left"
    );
    assert_eq!(cluster.names("secrets", &ns).len(), 1);
    h.stop().await?;
    cluster.stop().await;
    Ok(())
}
