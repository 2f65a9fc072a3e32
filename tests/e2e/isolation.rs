//! Network isolation: sandboxes reach neither each other's executors, nor the runtime's port, nor any host
//! service; without egress a sandbox has only the executor network (whose gateway forwards nothing); with
//! egress its default route goes through the egress network. No traffic is ever sent to an address outside
//! this machine.

use mentis_e2e::*;
use mentis_proto::api;

/// Networks a sandbox's container is attached to.
fn networks(sandbox: &str) -> anyhow::Result<Vec<String>> {
    let out = inspect(
        &container_of(sandbox),
        "{{range $k, $v := .NetworkSettings.Networks}}{{$k}} {{end}}",
    )?;
    let mut names: Vec<String> = out.split_whitespace().map(str::to_owned).collect();
    names.sort();
    Ok(names)
}

/// The gateway of the sandbox's default route, as a dotted address (read from /proc: no tools needed).
async fn default_gateway(h: &mut Harness, sandbox: &str) -> anyhow::Result<Option<String>> {
    let table = stdout(&h.sh(sandbox, "cat /proc/net/route").await?);
    // Destination 00000000 with mask 00000000 is the default route; the gateway is little-endian hex.
    Ok(table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.get(1) != Some(&"00000000") || f.get(7) != Some(&"00000000") {
            return None;
        }
        let g = u32::from_str_radix(f.get(2)?, 16).ok()?.to_le_bytes();
        Some(format!("{}.{}.{}.{}", g[0], g[1], g[2], g[3]))
    }))
}

/// Whether a TCP connection from the sandbox to `addr:port` succeeds within 3 s.
async fn connects(h: &mut Harness, sandbox: &str, addr: &str, port: u16) -> anyhow::Result<bool> {
    let obs = h
        .sh(
            sandbox,
            &format!("timeout 3 bash -c 'exec 3<>/dev/tcp/{addr}/{port}' 2>/dev/null"),
        )
        .await?;
    Ok(cmd_end(&obs)?.exit_code == 0)
}

#[tokio::test]
async fn sandboxes_reach_neither_each_other_nor_the_runtime_and_egress_is_opt_in()
-> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    check_network_isolation(&mut h).await?;
    h.stop().await
}

/// The isolation checks on a runtime started in this process (also run under gVisor).
pub(crate) async fn check_network_isolation(h: &mut Harness) -> anyhow::Result<()> {
    let runtime_port = h.runtime.as_ref().unwrap().addr.port();
    // A host service listening on every address (as the runtime would with MENTIS_LISTEN=0.0.0.0:...).
    let host_service = std::net::TcpListener::bind("0.0.0.0:0")?;
    let host_port = host_service.local_addr()?.port();
    let a = h.create_default().await?.sandbox_id;
    let b = h.create_default().await?.sandbox_id;
    let ip_of = |sandbox: &str| {
        inspect(
            &container_of(sandbox),
            "{{(index .NetworkSettings.Networks \"mentis-net\").IPAddress}}",
        )
    };
    let gateway = inspect(
        &container_of(&a),
        "{{(index .NetworkSettings.Networks \"mentis-net\").Gateway}}",
    )?;
    let b_ip = ip_of(&b)?;
    assert!(!b_ip.is_empty() && !gateway.is_empty());

    // The probe works: A reaches its own executor port.
    let a_ip = ip_of(&a)?;
    assert!(
        connects(h, &a, &a_ip, 50052).await?,
        "the probe itself must work"
    );
    // Not B's executor, not the runtime (on the host side of the network, or on loopback).
    assert!(
        !connects(h, &a, &b_ip, 50052).await?,
        "A reached B's executor"
    );
    assert!(
        !connects(h, &a, &gateway, runtime_port).await?,
        "A reached the runtime via the gateway"
    );
    assert!(
        !connects(h, &a, "127.0.0.1", runtime_port).await?,
        "A reached the runtime on loopback"
    );
    assert!(
        !connects(h, &a, &gateway, host_port).await?,
        "A reached a host service through its gateway"
    );
    // A container on Docker's default bridge, on this machine: reaching it means forwarding through
    // the host, which the executor network must not do.
    let outside = docker(&[
        "run",
        "-d",
        "--rm",
        "--entrypoint",
        "python3",
        &executor_image(),
        "-m",
        "http.server",
        "8000",
    ])?;
    let outside = outside.trim().to_owned();
    let outside_ip = inspect(&outside, "{{.NetworkSettings.IPAddress}}")?;
    let forwarded = connects(h, &a, &outside_ip, 8000).await;
    let _ = docker(&["rm", "-f", &outside]);
    assert!(!forwarded?, "A reached a container outside its network");

    // Egress denied (the default): only the executor network, no route out.
    let sb = h.get(&a).await?;
    assert_eq!(sb.egress, api::Egress::Deny as i32);
    assert_eq!(networks(&a)?, ["mentis-net"]);
    let a_route = default_gateway(h, &a).await?;
    assert!(
        a_route.is_none() || a_route.as_deref() == Some(gateway.as_str()),
        "{a_route:?}"
    );

    // Egress allowed: the egress network is attached, with a default route through it.
    let c = h
        .create(api::SandboxSpec {
            egress: api::Egress::Allow as i32,
            ..Default::default()
        })
        .await?;
    assert_eq!(c.egress, api::Egress::Allow as i32);
    let c = c.sandbox_id;
    assert_eq!(networks(&c)?, ["mentis-egress", "mentis-net"]);
    let egress_gateway = inspect(
        &container_of(&c),
        "{{(index .NetworkSettings.Networks \"mentis-egress\").Gateway}}",
    )?;
    assert_eq!(default_gateway(h, &c).await?, Some(egress_gateway));
    // Still no way to B on either network.
    assert!(
        !connects(h, &c, &b_ip, 50052).await?,
        "C reached B's executor"
    );
    // The executor works as usual.
    assert_eq!(stdout(&h.sh(&c, "echo ok").await?), "ok\n");
    Ok(())
}

#[tokio::test]
async fn misbehaving_commands_end_and_the_sandbox_keeps_working() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let id = h
        .create(api::SandboxSpec {
            memory_limit_mb: 256,
            pids_limit: 128,
            cpu_limit: 0.5,
            ..Default::default()
        })
        .await?
        .sandbox_id;
    // User code is the OOM killer's first choice and runs at a lower priority; the executor (the parent of
    // a command's bash) is neither. Field 19 of /proc/PID/stat is the nice value.
    let standing = stdout(
        &h.sh(
            &id,
            "cat /proc/self/oom_score_adj /proc/$PPID/oom_score_adj /proc/$PPID/comm; \
             awk '{print $19}' /proc/$$/stat /proc/$PPID/stat",
        )
        .await?,
    );
    let standing: Vec<&str> = standing.split_whitespace().collect();
    assert_eq!(standing, ["1000", "0", "mentis-executor", "5", "0"]);

    // A memory hog far beyond the limit: the kernel's OOM killer ends it (SIGKILL), not the executor,
    // and cmd_end says so. Once exec'd by bash (the command is the hog), once as bash's child.
    for command in [
        "python3 -c 'b = bytearray(1024 * 1024 * 1024); print(len(b))'",
        "cd /tmp && python3 -c 'b = bytearray(1024 * 1024 * 1024); print(len(b))'; exit $?",
    ] {
        let hog = h.sh(&id, command).await?;
        let end = cmd_end(&hog)?;
        assert_eq!(end.exit_code, 137, "{hog:?}");
        assert_eq!(end.reason, api::EndReason::OomKilled as i32, "{end:?}");
        assert_eq!(
            end.message, "killed by the out-of-memory killer (memory limit 256 MiB)",
            "{end:?}"
        );
        assert_eq!(stdout(&h.sh(&id, "echo after-hog").await?), "after-hog\n");
    }

    // A fork bomb, bounded by the pids limit and by a timeout that kills its whole process group; cmd_end
    // names the limit.
    let bomb = h
        .exec(
            &id,
            api::ShellAction {
                command: "b() { b | b & }; b; sleep 5".into(),
                timeout_seconds: 5,
                ..Default::default()
            },
        )
        .await?;
    let end = cmd_end(&bomb)?;
    assert_eq!(
        end.reason,
        api::EndReason::PidsLimitReached as i32,
        "{end:?}"
    );
    assert!(
        end.message
            .starts_with("the pids limit (128) was reached: fork failed"),
        "{end:?}"
    );
    assert_eq!(stdout(&h.sh(&id, "echo after-bomb").await?), "after-bomb\n");
    // A command that does not fork too much is not blamed on the limit afterwards.
    assert_eq!(
        cmd_end(&h.sh(&id, "exit 3").await?)?.reason,
        api::EndReason::Exited as i32
    );

    // A memory hog in a cell: the kernel is OOM-killed, the cell says so, and the next cell runs on a
    // fresh kernel.
    let score = h
        .py(
            &id,
            "before = 1\nprint(open('/proc/self/oom_score_adj').read().strip())",
        )
        .await?;
    assert_eq!(cell_stdout(&score), "1000\n");
    let hog = h.py(&id, "b = bytearray(1024 * 1024 * 1024)").await?;
    let r = ipython_result(&hog)?;
    assert_eq!(r.status, api::IpythonStatus::Aborted as i32, "{r:?}");
    assert_eq!(
        r.reason,
        "the kernel was killed by the out-of-memory killer (memory limit 256 MiB) while running the cell",
        "{r:?}"
    );
    assert_eq!(
        cell_stdout(&h.py(&id, "print('before' in globals())").await?),
        "False\n"
    );

    // A CPU spinner ends at its timeout.
    let spin = h
        .exec(
            &id,
            api::ShellAction {
                command: "while :; do :; done".into(),
                timeout_seconds: 2,
                ..Default::default()
            },
        )
        .await?;
    assert_eq!(cmd_end(&spin)?.reason, api::EndReason::TimedOut as i32);
    assert_eq!(stdout(&h.sh(&id, "echo after-spin").await?), "after-spin\n");
    // No capabilities, not root.
    let status = stdout(&h.sh(&id, "id -u; grep CapEff /proc/self/status").await?);
    assert_eq!(status, "1000\nCapEff:\t0000000000000000\n");
    h.stop().await
}

/// The executor apart from user code (docs/ARCHITECTURE.md, Security model): user code runs as 1000 with no
/// capability and no supplementary group, the executor and tini keep root as their real uid, so user code can
/// neither signal them (`kill -STOP`, `kill -9 -1`) nor reach their descriptors (`/proc/1/fd/1`, which would
/// forge lines in `docker logs`) or environment.
#[tokio::test]
async fn user_code_cannot_signal_trace_or_write_into_its_executor() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    let id = h.create_default().await?.sandbox_id;
    let container = container_of(&id);

    let ids = stdout(
        &h.sh(
            &id,
            "grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapAmb):' /proc/self/status | tr -s '\\t ' ' '; \
             echo home=$HOME",
        )
        .await?,
    );
    assert_eq!(
        ids,
        "Uid: 1000 1000 1000 1000\nGid: 1000 1000 1000 1000\nGroups: \nCapInh: 0000000000000000\n\
         CapPrm: 0000000000000000\nCapEff: 0000000000000000\nCapAmb: 0000000000000000\nhome=/tmp\n",
        "a command runs as the sandbox user with nothing else"
    );
    let cell = h
        .py(
            &id,
            "import os\nprint(os.getresuid(), os.getresgid(), os.getgroups())\nkept = 41",
        )
        .await?;
    assert_eq!(
        cell_stdout(&cell),
        "(1000, 1000, 1000) (1000, 1000, 1000) []\n"
    );
    // The executor (a command's parent) and tini (PID 1): root is their real and saved uid.
    let executor_pid = stdout(&h.sh(&id, "echo $PPID").await?).trim().to_owned();
    let theirs = stdout(
        &h.sh(
            &id,
            "grep -h '^Uid:' /proc/1/status /proc/$PPID/status | tr -s '\\t ' ' '",
        )
        .await?,
    );
    assert_eq!(theirs, "Uid: 0 0 0 0\nUid: 0 1000 0 1000\n");

    // Signals: refused, for the executor and for tini.
    let signals = h
        .sh(
            &id,
            "kill -STOP $PPID; echo stop=$?; kill -TERM $PPID; echo term=$?; kill -KILL 1; echo init=$?",
        )
        .await?;
    assert_eq!(stdout(&signals), "stop=1\nterm=1\ninit=1\n", "{signals:?}");
    assert!(
        stderr(&signals).contains("Operation not permitted"),
        "{signals:?}"
    );
    // Descriptors and environment: refused (ptrace access).
    let forged = h
        .sh(
            &id,
            "echo FORGED-LINE > /proc/1/fd/1; echo tini=$?; echo FORGED-LINE > /proc/$PPID/fd/2; \
             echo executor=$?; cat /proc/$PPID/environ >/dev/null; echo environ=$?",
        )
        .await?;
    assert_eq!(
        stdout(&forged),
        "tini=1\nexecutor=1\nenviron=1\n",
        "{forged:?}"
    );
    let logs = docker(&["logs", &container])?;
    assert!(!logs.contains("FORGED-LINE"), "{logs}");

    // `kill -9 -1` kills every process user code may signal but the caller: user code, not the executor.
    // The command goes on, the next one runs on the same executor, and the container was not restarted.
    let started_at = inspect(&container, "{{.State.StartedAt}}")?;
    let all = h.sh(&id, "kill -9 -1; echo rc=$?").await?;
    assert_eq!(stdout(&all), "rc=0\n", "{all:?}");
    assert_eq!(
        stdout(&h.sh(&id, "echo $PPID").await?).trim(),
        executor_pid,
        "the same executor serves on"
    );
    assert_eq!(inspect(&container, "{{.State.StartedAt}}")?, started_at);
    assert_eq!(inspect(&container, "{{.RestartCount}}")?.trim(), "0");
    // The kernel is user code too, so it went with the rest; cells run on a fresh one.
    let after = h.py(&id, "print('kept' in globals())").await?;
    assert_eq!(cell_stdout(&after), "False\n", "{after:?}");
    h.stop().await
}
