//! Warm pools: a claim binds env, labels, space and limits (another disk limit starts cold); the pool
//! refills; racing claims get different sandboxes; a member killed behind the runtime's back is replaced; a
//! restart tells members and claimed sandboxes apart.

use std::collections::BTreeSet;
use std::time::Duration;

use mentis_e2e::*;
use mentis_proto::api;
use mentis_runtime::config::PoolConfig;

fn pool(min_idle: usize, max_total: usize) -> PoolConfig {
    PoolConfig {
        image: executor_image(),
        min_idle,
        max_total,
        kernel: false,
    }
}

async fn pools(h: &mut Harness) -> anyhow::Result<api::Pool> {
    let mut all = h
        .sandboxes
        .list_pools(api::ListPoolsRequest {})
        .await?
        .into_inner()
        .pools;
    anyhow::ensure!(all.len() == 1, "{all:?}");
    Ok(all.remove(0))
}

/// Waits until the pool has `idle` members ready.
async fn wait_idle(h: &mut Harness, idle: u32) -> anyhow::Result<api::Pool> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(90);
    loop {
        let p = pools(h).await?;
        if p.idle == idle && p.creating == 0 {
            return Ok(p);
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "pool did not reach {idle} idle: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Ids of this instance's containers labelled as pool members (idle or claimed).
fn member_containers(h: &Harness) -> anyhow::Result<BTreeSet<String>> {
    let out = docker(&[
        "ps",
        "-a",
        "--filter",
        &format!("label=io.mentis.instance={}", h.guard.instance),
        "--filter",
        "label=io.mentis.pool=true",
        "--format",
        "{{.Names}}",
    ])?;
    Ok(out.split_whitespace().map(str::to_owned).collect())
}

#[tokio::test]
async fn a_claim_binds_env_labels_space_and_limits_and_the_pool_refills() -> anyhow::Result<()> {
    // Members start their kernel ahead: the claimed sandbox's first cell must still see its env.
    let mut h = Harness::start_with(|c| {
        c.pools = vec![PoolConfig {
            kernel: true,
            ..pool(2, 4)
        }]
    })
    .await?;
    wait_idle(&mut h, 2).await?;
    let before = member_containers(&h)?;
    h.spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(api::Space {
                space_id: "warm".into(),
                ..Default::default()
            }),
        })
        .await?;
    let sb = h
        .create(api::SandboxSpec {
            space_id: "warm".into(),
            env: [("MODE".to_owned(), "warm".to_owned())].into(),
            labels: [("conversation".to_owned(), "c1".to_owned())].into(),
            cpu_limit: 0.5,
            memory_limit_mb: 256,
            pids_limit: 128,
            ..Default::default()
        })
        .await?;
    // It was one of the members made ahead.
    assert!(
        before.contains(&container_of(&sb.sandbox_id)),
        "{before:?} {sb:?}"
    );
    assert_eq!(
        (sb.state, sb.space_id.as_str()),
        (api::SandboxState::Running as i32, "warm")
    );
    assert_eq!(
        sb.labels.get("conversation").map(String::as_str),
        Some("c1")
    );
    let p = pools(&mut h).await?;
    assert_eq!((p.hits, p.misses), (1, 0));

    let id = sb.sandbox_id.clone();
    assert_eq!(stdout(&h.sh(&id, "echo $MODE").await?), "warm\n");
    // The kernel sees the sandbox's env too.
    assert_eq!(
        cell_value(&h.py(&id, "import os; os.environ['MODE']").await?).as_deref(),
        Some("'warm'")
    );
    let container = container_of(&id);
    assert_eq!(
        inspect(
            &container,
            "{{.HostConfig.Memory}} {{.HostConfig.NanoCpus}} {{.HostConfig.PidsLimit}}"
        )?,
        "268435456 500000000 128"
    );
    let memory = h
        .sh(
            &id,
            "cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes",
        )
        .await?;
    assert_eq!(stdout(&memory), "268435456\n", "cgroup limit inside");
    assert_eq!(sb.disk_limit_mb, 4096);

    // The pool makes another member to get back to its minimum.
    wait_idle(&mut h, 2).await?;
    // A workspace's filesystem keeps the size it was made with: another disk limit starts cold.
    let members = member_containers(&h)?;
    let cold = h
        .create(api::SandboxSpec {
            disk_limit_mb: 128,
            ..Default::default()
        })
        .await?;
    assert!(!members.contains(&container_of(&cold.sandbox_id)));
    assert_eq!(cold.disk_limit_mb, 128);
    let p = pools(&mut h).await?;
    assert_eq!((p.hits, p.idle), (1, 2), "{p:?}");
    h.stop().await
}

#[tokio::test]
async fn racing_claims_get_different_sandboxes() -> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| c.pools = vec![pool(1, 1)]).await?;
    wait_idle(&mut h, 1).await?;
    let (mut a, mut b) = (h.sandboxes.clone(), h.sandboxes.clone());
    let req = || api::CreateSandboxRequest {
        spec: Some(api::SandboxSpec::default()),
    };
    let (ra, rb) = tokio::join!(a.create_sandbox(req()), b.create_sandbox(req()));
    let (sa, sb) = (
        ra?.into_inner().sandbox.unwrap(),
        rb?.into_inner().sandbox.unwrap(),
    );
    assert_ne!(sa.sandbox_id, sb.sandbox_id);
    for s in [&sa, &sb] {
        assert_eq!(s.state, api::SandboxState::Running as i32);
        assert_eq!(stdout(&h.sh(&s.sandbox_id, "echo ok").await?), "ok\n");
    }
    let p = pools(&mut h).await?;
    assert_eq!((p.hits, p.misses), (1, 1), "{p:?}");
    h.stop().await
}

#[tokio::test]
async fn a_member_killed_behind_the_runtimes_back_is_replaced() -> anyhow::Result<()> {
    let mut h = Harness::start_with(|c| {
        c.pools = vec![pool(1, 2)];
        c.health_interval = Duration::from_secs(1);
    })
    .await?;
    wait_idle(&mut h, 1).await?;
    let before = member_containers(&h)?;
    let victim = before.iter().next().unwrap().clone();
    docker(&["rm", "-f", &victim])?;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let now = member_containers(&h)?;
        let p = pools(&mut h).await?;
        if p.idle == 1 && !now.is_empty() && !now.contains(&victim) {
            break;
        }
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "not replaced: {now:?} {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The replacement serves a claim.
    let sb = h.create_default().await?;
    assert_eq!(stdout(&h.sh(&sb.sandbox_id, "echo ok").await?), "ok\n");
    assert_eq!(pools(&mut h).await?.hits, 1);
    h.stop().await
}

#[tokio::test]
async fn after_a_restart_members_and_claimed_sandboxes_are_told_apart() -> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let data_dir = tempfile::tempdir()?;
    let env = [("MENTIS_POOL", "default=2:3")];
    let mut first = RuntimeProcess::start_with_env(bin, &instance, data_dir.path(), &env).await?;
    let mut h = first.harness(data_dir, guard).await?;
    wait_idle(&mut h, 2).await?;
    let claimed = h
        .create(api::SandboxSpec {
            labels: [("kind".to_owned(), "claimed".to_owned())].into(),
            ..Default::default()
        })
        .await?
        .sandbox_id;
    wait_idle(&mut h, 2).await?;
    let containers = member_containers(&h)?;
    assert_eq!(containers.len(), 3, "{containers:?}");

    first.kill();
    let Harness {
        data_dir, guard, ..
    } = h;
    let second = RuntimeProcess::start_with_env(bin, &instance, data_dir.path(), &env).await?;
    let mut h = second.harness(data_dir, guard).await?;

    // The claimed one is still a sandbox, the two idle members are members again, nothing was remade.
    let sb = h.get(&claimed).await?;
    assert_eq!(sb.state, api::SandboxState::Running as i32, "{sb:?}");
    assert_eq!(sb.labels.get("kind").map(String::as_str), Some("claimed"));
    let p = wait_idle(&mut h, 2).await?;
    assert_eq!((p.hits, p.misses), (0, 0));
    assert_eq!(member_containers(&h)?, containers);
    let listed = h
        .sandboxes
        .list_sandboxes(api::ListSandboxesRequest::default())
        .await?
        .into_inner();
    assert_eq!(
        listed.sandboxes.len(),
        1,
        "members are not sandboxes: {listed:?}"
    );
    // And a member serves the next claim.
    let next = h.create_default().await?;
    assert!(containers.contains(&container_of(&next.sandbox_id)));
    drop(second);
    Ok(())
}

/// What a stopped runtime leaves (docs/SANDBOXES.md, "What outlives a stop"): its sandboxes, its pool's
/// members, their volumes, the egress gateway's network and netfilter chains. `make
/// clean-sandboxes INSTANCE=NAME` (`deploy/clean-sandboxes.sh --instance NAME`) removes them all, and nothing
/// of another instance.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_clean_up_removes_what_a_stopped_runtime_left_and_nothing_of_another()
-> anyhow::Result<()> {
    use anyhow::Context as _;
    let mut a = Harness::start_with(|c| c.pools = vec![pool(1, 1)]).await?;
    let mut b = Harness::start().await?;
    wait_idle(&mut a, 1).await?;
    // A sandbox with egress rules: the instance's gateway, its network and its chains.
    let ruled = a
        .create(api::SandboxSpec {
            egress_rules: vec![api::EgressRule {
                domain: "pkgs.example.test".into(),
                ports: vec![443],
                ..Default::default()
            }],
            ..Default::default()
        })
        .await?
        .sandbox_id;
    let kept = b.create_default().await?.sandbox_id;
    wait_idle(&mut a, 1).await?;
    let filter = format!("label=io.mentis.instance={}", a.guard.instance);
    let networks = || -> anyhow::Result<Vec<String>> {
        Ok(docker(&["network", "ls", "-q", "--filter", &filter])?
            .split_whitespace()
            .map(str::to_owned)
            .collect())
    };
    let bridge = {
        let nets = networks()?;
        anyhow::ensure!(nets.len() == 1, "the gateway's network: {nets:?}");
        format!(
            "br-{}",
            &docker(&["network", "inspect", "--format", "{{.Id}}", &nets[0]])?[..12]
        )
    };
    let chains = |table: &str| -> anyhow::Result<String> {
        let out = std::process::Command::new("iptables")
            .args(["-t", table, "-S"])
            .output()
            .context("iptables")?;
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(&bridge))
            .collect::<Vec<_>>()
            .join("\n"))
    };
    anyhow::ensure!(!chains("nat")?.is_empty(), "no chain for {bridge}");

    // The runtime stops: everything stays, for the next runtime of the instance to take over.
    a.runtime.take().context("no runtime")?.stop().await?;
    let left = a.guard.containers();
    // The sandbox and the pool's member (the gateway runs in the runtime's process: its network and
    // chains stay, checked below).
    assert_eq!(left.len(), 2, "{left:?}");
    assert_eq!(networks()?.len(), 1);
    assert!(!chains("nat")?.is_empty());
    assert!(
        !docker(&[
            "ps",
            "-q",
            "--filter",
            &format!("label=io.mentis.sandbox-id={ruled}")
        ])?
        .trim()
        .is_empty()
    );

    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("no workspace")?
        .join("deploy/clean-sandboxes.sh");
    let out = tokio::process::Command::new(&script)
        .args(["--instance", &a.guard.instance])
        .output()
        .await?;
    assert!(out.status.success(), "{out:?}");
    assert_eq!(a.guard.containers(), Vec::<String>::new());
    assert_eq!(a.guard.volumes(), Vec::<String>::new());
    assert_eq!(networks()?, Vec::<String>::new());
    assert_eq!(chains("nat")?, "");
    assert_eq!(chains("filter")?, "");
    // The other instance's sandbox is untouched.
    assert_eq!(stdout(&b.sh(&kept, "echo alive").await?), "alive\n");
    Ok(())
}
