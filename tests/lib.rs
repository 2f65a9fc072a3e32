//! Harness of the end-to-end tests: a real mentis-runtime (in this process, on 127.0.0.1:0) driving a real
//! Docker engine and the real executor image, reached over real gRPC. Each test gets its own runtime
//! instance name, so reconciliation never touches another test's containers, and a guard that removes
//! everything of that instance when the test ends, even by panic.
#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use mentis_proto::api::{
    self, action_service_client::ActionServiceClient, sandbox_service_client::SandboxServiceClient,
    space_service_client::SpaceServiceClient,
};
use mentis_runtime::config::AuthConfig;
use mentis_runtime::{Runtime, RuntimeConfig};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

pub use mentis_proto::api::observation::Kind;

pub mod kube_sim;
pub mod ws;

/// The image under test: `MENTIS_EXECUTOR_IMAGE` or the runtime's default.
pub fn executor_image() -> String {
    std::env::var("MENTIS_EXECUTOR_IMAGE")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| mentis_runtime::config::DEFAULT_EXECUTOR_IMAGE.to_owned())
}

/// Runs the docker CLI and returns its stdout; fails (never skips) when Docker is missing.
pub fn docker(args: &[&str]) -> Result<String> {
    let out = Command::new("docker")
        .args(args)
        .output()
        .context("the docker CLI is missing: these tests need a Docker engine (run `make test`)")?;
    if !out.status.success() {
        bail!(
            "docker {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Removes every container and volume of one runtime instance when dropped, the disk images of its
/// workspaces with their loop devices, and the images a test tagged with the instance's name.
pub struct InstanceGuard {
    pub instance: String,
    /// Data folders of this instance's runtimes: a loop device whose image lies under one is detached even
    /// when no volume names it (a create that failed half-way).
    pub data_dirs: Vec<std::path::PathBuf>,
}

impl InstanceGuard {
    fn filter(&self) -> String {
        format!("label=io.mentis.instance={}", self.instance)
    }

    /// Ids of this instance's containers (all states).
    pub fn containers(&self) -> Vec<String> {
        docker(&["ps", "-aq", "--filter", &self.filter()])
            .map(|s| s.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Names of this instance's volumes.
    pub fn volumes(&self) -> Vec<String> {
        docker(&["volume", "ls", "-q", "--filter", &self.filter()])
            .map(|s| s.split_whitespace().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// Loop devices (with their image) whose image lies under one of the watched data folders.
    pub fn loop_devices(&self) -> Vec<String> {
        loop_devices()
            .into_iter()
            .filter(|(_, file)| {
                self.data_dirs
                    .iter()
                    .any(|d| std::path::Path::new(file).starts_with(d))
            })
            .map(|(device, file)| format!("{device} ({file})"))
            .collect()
    }

    /// Also clean up after a runtime whose data folder is `dir`.
    pub fn watch(&mut self, dir: &std::path::Path) {
        self.data_dirs
            .push(std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_owned()));
    }

    /// The disk images (`io.mentis.disk-image`) of these volumes.
    fn disk_images(volumes: &[String]) -> Vec<String> {
        if volumes.is_empty() {
            return Vec::new();
        }
        let mut args = vec![
            "volume",
            "inspect",
            "--format",
            "{{index .Labels \"io.mentis.disk-image\"}}",
        ];
        args.extend(volumes.iter().map(String::as_str));
        docker(&args)
            .map(|s| {
                s.lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && *l != "<no value>")
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// Attached loop devices with their backing files (` (deleted)` taken off).
pub fn loop_devices() -> Vec<(String, String)> {
    let Ok(entries) = std::fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let file = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
            let file = file.trim_end_matches('\n');
            let file = file.strip_suffix(" (deleted)").unwrap_or(file).to_owned();
            Some((format!("/dev/{name}"), file))
        })
        .collect()
}

impl Drop for InstanceGuard {
    fn drop(&mut self) {
        let containers = self.containers();
        if !containers.is_empty() {
            let mut args = vec!["rm", "-f", "-v"];
            args.extend(containers.iter().map(String::as_str));
            let _ = docker(&args);
        }
        let volumes = self.volumes();
        let images = Self::disk_images(&volumes);
        if !volumes.is_empty() {
            let mut args = vec!["volume", "rm", "-f"];
            args.extend(volumes.iter().map(String::as_str));
            let _ = docker(&args);
        }
        // Networks of the instance (its egress gateway's), with the gateway's netfilter chains of their
        // bridges, when the runtime could not take them away itself.
        let networks =
            docker(&["network", "ls", "-q", "--filter", &self.filter()]).unwrap_or_default();
        for id in networks.split_whitespace() {
            let bridge = format!("br-{}", &id[..id.len().min(12)]);
            let chain = format!("MGW-{bridge}");
            for args in [
                vec!["-t", "nat", "-D", "PREROUTING", "-i", &bridge, "-j", &chain],
                vec!["-D", "INPUT", "-i", &bridge, "-j", &chain],
                vec!["-D", "DOCKER-USER", "-i", &bridge, "-j", "DROP"],
                vec![
                    "-D",
                    "INPUT",
                    "-i",
                    &bridge,
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "NEW",
                    "-j",
                    "DROP",
                ],
                vec!["-t", "nat", "-F", &chain],
                vec!["-t", "nat", "-X", &chain],
                vec!["-F", &chain],
                vec!["-X", &chain],
            ] {
                let _ = Command::new("iptables").arg("-w").args(&args).output();
            }
            let _ = docker(&["network", "rm", id]);
        }
        // Images a test tagged with the instance's name (`mentis/e2e-...:<instance>`), also when it failed
        // before removing them.
        let tagged = docker(&[
            "image",
            "ls",
            "--format",
            "{{.Repository}}:{{.Tag}}",
            "--filter",
            &format!("reference=*:{}", self.instance),
            "--filter",
            &format!("reference=*/*:{}", self.instance),
        ])
        .unwrap_or_default();
        let tagged: Vec<&str> = tagged.split_whitespace().collect();
        if !tagged.is_empty() {
            let mut args = vec!["image", "rm", "--force"];
            args.extend(tagged);
            let _ = docker(&args);
        }
        for (device, file) in loop_devices() {
            let ours = images.contains(&file)
                || self
                    .data_dirs
                    .iter()
                    .any(|d| std::path::Path::new(&file).starts_with(d));
            if ours {
                let _ = Command::new("losetup").args(["-d", &device]).status();
                let _ = std::fs::remove_file(&file);
            }
        }
    }
}

/// Adds `authorization: Bearer <key>` to every call (none: no header).
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl Bearer {
    pub fn new(key: Option<&str>) -> Self {
        Self(key.map(|k| format!("Bearer {k}").parse().unwrap()))
    }
}

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// A channel to the public API that presents a key.
pub type ApiChannel = InterceptedService<Channel, Bearer>;

/// A random admin key.
pub fn random_key() -> String {
    format!("test-admin-{}", uuid::Uuid::new_v4().simple())
}

/// A runtime of this test, with clients (presenting the admin key).
pub struct Harness {
    pub runtime: Option<Runtime>,
    pub sandboxes: SandboxServiceClient<ApiChannel>,
    pub actions: ActionServiceClient<ApiChannel>,
    pub spaces: SpaceServiceClient<ApiChannel>,
    pub channel: ApiChannel,
    /// The bare channel: add a key with [`Harness::with_key`].
    pub raw: Channel,
    /// The runtime's MENTIS_DATA_DIR (its store), removed at the end.
    pub data_dir: tempfile::TempDir,
    // Last, so it runs after the runtime is gone.
    pub guard: InstanceGuard,
}

impl Harness {
    /// Starts a runtime with its own instance name; `tweak` may adjust the config.
    pub async fn start_with(tweak: impl FnOnce(&mut RuntimeConfig)) -> Result<Self> {
        Self::start_in(Self::new_instance(), tweak).await
    }

    /// [`Harness::start_with`] under an instance made beforehand (whose name the test used already).
    pub async fn start_in(
        guard: InstanceGuard,
        tweak: impl FnOnce(&mut RuntimeConfig),
    ) -> Result<Self> {
        mentis_runtime::install_crypto_provider();
        // RUST_LOG=debug shows what the runtime did, for a failing test.
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .with_test_writer()
            .try_init();
        docker(&["info", "--format", "{{.ServerVersion}}"])
            .context("no Docker engine answers: run `make test`, which starts one")?;
        let image = executor_image();
        docker(&["image", "inspect", "--format", "{{.Id}}", &image]).with_context(|| {
            format!(
                "executor image {image} is missing: run `make test` (or `make image`) to build it"
            )
        })?;
        let instance = guard.instance.clone();
        let data_dir = tempfile::tempdir()?;
        let mut config = RuntimeConfig {
            listen: "127.0.0.1:0".parse()?,
            executor_image: image,
            data_dir: data_dir.path().to_owned(),
            ..RuntimeConfig::default()
        };
        config.docker.instance = instance;
        let admin_key = random_key();
        config.auth = AuthConfig::Keys {
            admin_key: Some(admin_key.clone()),
        };
        // Tests read streams strictly; a test about keepalives shortens this.
        config.stream.keepalive = Duration::from_secs(600);
        tweak(&mut config);
        let runtime = Runtime::start(config).await?;
        let raw = tonic::transport::Endpoint::from_shared(format!("http://{}", runtime.addr))?
            .connect()
            .await?;
        // With MENTIS_AUTH=disabled (a tweak) the key is simply not looked at.
        let mut h = Self::over(raw, Some(&admin_key), data_dir, guard);
        h.runtime = Some(runtime);
        Ok(h)
    }

    /// `raw` presenting `key` (or nothing).
    pub fn with_key(&self, key: Option<&str>) -> ApiChannel {
        InterceptedService::new(self.raw.clone(), Bearer::new(key))
    }

    pub async fn start() -> Result<Self> {
        Self::start_with(|_| {}).await
    }

    /// Clients presenting `key` over a runtime that runs elsewhere (a [`RuntimeProcess`]); `data_dir` and
    /// `guard` are that runtime's.
    pub fn over(
        raw: Channel,
        key: Option<&str>,
        data_dir: tempfile::TempDir,
        mut guard: InstanceGuard,
    ) -> Self {
        guard.watch(data_dir.path());
        let channel = InterceptedService::new(raw.clone(), Bearer::new(key));
        Self {
            runtime: None,
            sandboxes: SandboxServiceClient::new(channel.clone()),
            actions: ActionServiceClient::new(channel.clone()),
            spaces: SpaceServiceClient::new(channel.clone()),
            channel,
            raw,
            data_dir,
            guard,
        }
    }

    /// A fresh instance name and its cleanup guard.
    pub fn new_instance() -> InstanceGuard {
        InstanceGuard {
            instance: format!("e2e-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]),
            data_dirs: Vec::new(),
        }
    }

    /// GetSandbox.
    pub async fn get(&mut self, sandbox: &str) -> Result<api::Sandbox> {
        self.sandboxes
            .get_sandbox(api::GetSandboxRequest {
                sandbox_id: sandbox.to_owned(),
            })
            .await?
            .into_inner()
            .sandbox
            .context("GetSandbox returned no sandbox")
    }

    /// Polls GetSandbox until the sandbox is in `state` (or NotFound, when `state` is TERMINATED and the
    /// sandbox was forgotten), for at most `within`.
    pub async fn wait_state(
        &mut self,
        sandbox: &str,
        state: api::SandboxState,
        within: Duration,
    ) -> Result<api::Sandbox> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let sb = self.get(sandbox).await?;
            if sb.state == state as i32 {
                return Ok(sb);
            }
            if tokio::time::Instant::now() > deadline {
                bail!("sandbox {sandbox} did not reach {state:?} within {within:?}: {sb:?}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Creates a sandbox with `spec` and returns it.
    pub async fn create(&mut self, spec: api::SandboxSpec) -> Result<api::Sandbox> {
        let resp = self
            .sandboxes
            .create_sandbox(api::CreateSandboxRequest { spec: Some(spec) })
            .await?;
        resp.into_inner()
            .sandbox
            .context("CreateSandbox returned no sandbox")
    }

    /// The runtime's warm pools now (ListPools).
    pub async fn pools(&self) -> Result<Vec<api::Pool>> {
        Ok(self
            .sandboxes
            .clone()
            .list_pools(api::ListPoolsRequest {})
            .await?
            .into_inner()
            .pools)
    }

    /// Waits until the pool of `template` (empty: the `MENTIS_POOL` pool) has `idle` idle members; fails
    /// after `within`, showing the pools.
    pub async fn wait_pool_idle(&self, template: &str, idle: u32, within: Duration) -> Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let pools = self.pools().await?;
            if pools
                .iter()
                .any(|p| p.template == template && p.idle >= idle)
            {
                return Ok(());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("the pool has not {idle} idle members within {within:?}: {pools:?}");
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Creates a sandbox with the default spec.
    pub async fn create_default(&mut self) -> Result<api::Sandbox> {
        self.create(api::SandboxSpec::default()).await
    }

    /// Runs `action` with Execute and collects every observation up to the end of the stream.
    async fn execute(
        &mut self,
        sandbox: &str,
        action: api::Action,
        within: Duration,
    ) -> Result<Vec<api::Observation>> {
        let stream = self
            .actions
            .execute(api::ExecuteRequest {
                sandbox_id: sandbox.to_owned(),
                action: Some(action),
                action_id: String::new(),
            })
            .await?
            .into_inner();
        collect(stream, within).await
    }

    /// Runs a shell action with Execute and collects its observations.
    pub async fn exec(
        &mut self,
        sandbox: &str,
        shell: api::ShellAction,
    ) -> Result<Vec<api::Observation>> {
        self.execute(sandbox, shell_action(shell), Duration::from_secs(120))
            .await
    }

    /// Runs a plain command with Execute.
    pub async fn sh(&mut self, sandbox: &str, command: &str) -> Result<Vec<api::Observation>> {
        self.exec(sandbox, cmd(command)).await
    }

    /// The first `n` observations of a sandbox's log after `after_seq` (a gap is an error).
    pub async fn read_log(
        &mut self,
        sandbox: &str,
        after_seq: u64,
        n: usize,
    ) -> Result<Vec<api::Observation>> {
        use futures::StreamExt;
        let mut s = self
            .actions
            .stream_observations(api::StreamObservationsRequest {
                sandbox_id: sandbox.to_owned(),
                after_seq,
                action_id: String::new(),
            })
            .await?
            .into_inner();
        let mut out = Vec::new();
        while out.len() < n {
            let m = tokio::time::timeout(Duration::from_secs(30), s.next())
                .await?
                .ok_or_else(|| anyhow::anyhow!("stream ended early"))??;
            match m.kind {
                Some(api::stream_observations_response::Kind::Observation(o)) => out.push(o),
                Some(api::stream_observations_response::Kind::Keepalive(_)) => {}
                other => bail!("unexpected {other:?}"),
            }
        }
        Ok(out)
    }

    /// Stops the runtime (the guard still removes what is left).
    pub async fn stop(mut self) -> Result<()> {
        if let Some(rt) = self.runtime.take() {
            rt.stop().await?;
        }
        Ok(())
    }
}

/// The status code of a call's outcome (`Ok` when it succeeded).
pub fn code<T>(r: std::result::Result<T, tonic::Status>) -> tonic::Code {
    match r {
        Ok(_) => tonic::Code::Ok,
        Err(s) => s.code(),
    }
}

/// What a refusal tells a program (`google.rpc` details, docs/ARCHITECTURE.md "Errors and statuses"): the
/// code, ErrorInfo's reason (empty when the call succeeded or the status has none) and BadRequest's field.
pub fn refusal<T>(
    r: std::result::Result<T, tonic::Status>,
) -> (tonic::Code, String, Option<String>) {
    use tonic_types::StatusExt;
    let Err(s) = r else {
        return (tonic::Code::Ok, String::new(), None);
    };
    let details = s.get_error_details();
    let reason = details
        .error_info()
        .filter(|i| i.domain == "mentis.dev")
        .map(|i| i.reason.clone())
        .unwrap_or_default();
    let field = details
        .bad_request()
        .and_then(|b| b.field_violations.first())
        .map(|v| v.field.clone());
    (s.code(), reason, field)
}

/// A shell action running `command`.
pub fn cmd(command: &str) -> api::ShellAction {
    api::ShellAction {
        command: command.to_owned(),
        ..Default::default()
    }
}

/// Wraps a shell action.
pub fn shell_action(shell: api::ShellAction) -> api::Action {
    api::Action {
        kind: Some(api::action::Kind::Shell(shell)),
    }
}

/// Reads an Execute stream to its end (bounded by `within`).
pub async fn collect(
    mut stream: tonic::Streaming<api::ExecuteResponse>,
    within: Duration,
) -> Result<Vec<api::Observation>> {
    let mut out = Vec::new();
    tokio::time::timeout(within, async {
        while let Some(msg) = stream.next().await {
            match msg?.kind {
                Some(api::execute_response::Kind::Observation(o)) => out.push(o),
                Some(api::execute_response::Kind::Gap(g)) => bail!("unexpected gap {g:?}"),
                Some(api::execute_response::Kind::Keepalive(_)) => {}
                None => bail!("empty ExecuteResponse"),
            }
        }
        Ok(())
    })
    .await
    .context("Execute stream did not end in time")??;
    Ok(out)
}

/// Concatenated output of one stream.
pub fn output(obs: &[api::Observation], stream: api::OutputStream) -> Vec<u8> {
    obs.iter()
        .filter_map(|o| match &o.kind {
            Some(Kind::CmdOutput(c)) if c.stream == stream as i32 => Some(c.data.to_vec()),
            _ => None,
        })
        .flatten()
        .collect()
}

/// Stdout as text (lossy).
pub fn stdout(obs: &[api::Observation]) -> String {
    String::from_utf8_lossy(&output(obs, api::OutputStream::Stdout)).into_owned()
}

/// Stderr as text (lossy).
pub fn stderr(obs: &[api::Observation]) -> String {
    String::from_utf8_lossy(&output(obs, api::OutputStream::Stderr)).into_owned()
}

/// The terminal observations (cmd_end / ipython_result) among `obs`.
pub fn terminals(obs: &[api::Observation]) -> Vec<&api::Observation> {
    obs.iter()
        .filter(|o| matches!(o.kind, Some(Kind::CmdEnd(_)) | Some(Kind::IpythonResult(_))))
        .collect()
}

/// The one cmd_end of `obs`; fails unless there is exactly one terminal observation.
pub fn cmd_end(obs: &[api::Observation]) -> Result<api::CmdEnd> {
    let t = terminals(obs);
    if t.len() != 1 {
        bail!(
            "expected exactly one terminal observation, got {}: {obs:#?}",
            t.len()
        );
    }
    match &t[0].kind {
        Some(Kind::CmdEnd(e)) => Ok(e.clone()),
        other => bail!("terminal is not cmd_end: {other:?}"),
    }
}

/// Inspects a container with a Go template.
pub fn inspect(container: &str, format: &str) -> Result<String> {
    Ok(docker(&["inspect", "--format", format, container])?
        .trim()
        .to_owned())
}

/// The container name of a sandbox.
pub fn container_of(sandbox_id: &str) -> String {
    format!("mentis-{sandbox_id}")
}

/// Labels of a container as a map.
pub fn labels_of(container: &str) -> Result<HashMap<String, String>> {
    let json = inspect(container, "{{json .Config.Labels}}")?;
    Ok(serde_json::from_str(&json)?)
}

/// An IPython action running `code`.
pub fn cell(code: &str) -> api::Action {
    cell_with(api::IPythonAction {
        code: code.to_owned(),
        ..Default::default()
    })
}

/// Wraps an IPython action.
pub fn cell_with(c: api::IPythonAction) -> api::Action {
    api::Action {
        kind: Some(api::action::Kind::Ipython(c)),
    }
}

impl Harness {
    /// Runs a cell with Execute and collects its observations.
    pub async fn run_cell(
        &mut self,
        sandbox: &str,
        c: api::IPythonAction,
    ) -> Result<Vec<api::Observation>> {
        self.execute(sandbox, cell_with(c), Duration::from_secs(180))
            .await
    }

    /// Runs a plain cell with Execute.
    pub async fn py(&mut self, sandbox: &str, code: &str) -> Result<Vec<api::Observation>> {
        self.run_cell(
            sandbox,
            api::IPythonAction {
                code: code.to_owned(),
                ..Default::default()
            },
        )
        .await
    }
}

/// The one ipython_result of `obs`; fails unless there is exactly one terminal observation.
pub fn ipython_result(obs: &[api::Observation]) -> Result<api::IPythonResult> {
    let t = terminals(obs);
    if t.len() != 1 {
        bail!(
            "expected exactly one terminal observation, got {}: {obs:#?}",
            t.len()
        );
    }
    match &t[0].kind {
        Some(Kind::IpythonResult(r)) => Ok(r.clone()),
        other => bail!("terminal is not ipython_result: {other:?}"),
    }
}

/// The ipython_output observations of one kind.
pub fn ipython_outputs(
    obs: &[api::Observation],
    kind: api::IpythonOutputKind,
) -> Vec<api::IPythonOutput> {
    obs.iter()
        .filter_map(|o| match &o.kind {
            Some(Kind::IpythonOutput(out)) if out.kind == kind as i32 => Some(out.clone()),
            _ => None,
        })
        .collect()
}

/// Concatenated stdout stream text of a cell.
pub fn cell_stdout(obs: &[api::Observation]) -> String {
    ipython_outputs(obs, api::IpythonOutputKind::StreamStdout)
        .into_iter()
        .map(|o| o.text)
        .collect()
}

/// The text/plain of a cell's execute_result.
pub fn cell_value(obs: &[api::Observation]) -> Option<String> {
    ipython_outputs(obs, api::IpythonOutputKind::ExecuteResult)
        .first()
        .and_then(|o| o.data.get("text/plain").cloned())
}

/// A port on 127.0.0.1 nothing listens on now.
/// Runs a browser script of `web/` (`node web/SCRIPT ARGS...`, Debian's chromium driven headless by
/// playwright-core) for at most 3 minutes and returns the one JSON line it prints; fails with its output
/// when it fails.
pub async fn drive_browser(script: &str, args: &[String]) -> Result<serde_json::Value> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = tokio::process::Command::new("node")
        .arg(root.join("web").join(script))
        .args(args)
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(180), out)
        .await
        .context("the browser test took over 3 minutes")?
        .context("node (run deploy/ensure-tools.sh: it installs chromium and web/node_modules)")?;
    let printed = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "the browser test failed: {printed}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    serde_json::from_str(printed.trim()).with_context(|| format!("not one JSON line: {printed}"))
}

pub fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// The real mentis-runtime as a separate process (the `mentis-runtime-under-test` binary), for tests that
/// kill it with SIGKILL and start it again on the same store and instance.
pub struct RuntimeProcess {
    child: std::process::Child,
    pub addr: std::net::SocketAddr,
    data_dir: std::path::PathBuf,
}

impl RuntimeProcess {
    /// Starts the process (`bin`: `env!("CARGO_BIN_EXE_mentis-runtime-under-test")`, known only to the
    /// test binary) on a free port with this instance and data folder; waits until it serves.
    pub async fn start(bin: &str, instance: &str, data_dir: &std::path::Path) -> Result<Self> {
        Self::start_with_env(bin, instance, data_dir, &[]).await
    }

    /// [`RuntimeProcess::start`] with more settings in its environment.
    pub async fn start_with_env(
        bin: &str,
        instance: &str,
        data_dir: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Result<Self> {
        Self::start_at(
            bin,
            instance,
            data_dir,
            ([127, 0, 0, 1], free_port()?).into(),
            env,
        )
        .await
    }

    /// As [`RuntimeProcess::start_with_env`], on `addr` (a restart on the address its clients know).
    pub async fn start_at(
        bin: &str,
        instance: &str,
        data_dir: &std::path::Path,
        addr: std::net::SocketAddr,
        env: &[(&str, &str)],
    ) -> Result<Self> {
        // This process's TLS clients (the tls and pki tests) need a provider named too.
        mentis_runtime::install_crypto_provider();
        let child = Command::new(bin)
            .env("MENTIS_LISTEN", addr.to_string())
            .env("MENTIS_INSTANCE", instance)
            .env("MENTIS_DATA_DIR", data_dir)
            .env("MENTIS_EXECUTOR_IMAGE", executor_image())
            .env("MENTIS_HEALTH_INTERVAL_SECS", "1")
            .envs(env.iter().copied())
            .stdout(std::process::Stdio::null())
            .spawn()
            .context("start mentis-runtime-under-test")?;
        let mut process = Self {
            child,
            addr,
            data_dir: data_dir.to_owned(),
        };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = process.child.try_wait()? {
                bail!("the runtime process exited at start: {status}");
            }
            if serves(addr).await {
                return Ok(process);
            }
            if tokio::time::Instant::now() > deadline {
                process.kill();
                bail!("the runtime process did not listen within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The admin key it made in its data folder on first start (waited for a few seconds: a slow start,
    /// under a profiler say, may listen before the file is there).
    pub fn admin_key(&self) -> Result<String> {
        let path = self.data_dir.join(mentis_app::auth::ADMIN_KEY_FILE);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !path.exists() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(std::fs::read_to_string(&path)
            .with_context(|| format!("read {}", path.display()))?
            .trim()
            .to_owned())
    }

    /// Clients of its API presenting its admin key.
    pub async fn harness(
        &self,
        data_dir: tempfile::TempDir,
        guard: InstanceGuard,
    ) -> Result<Harness> {
        Ok(Harness::over(
            self.channel().await?,
            Some(&self.admin_key()?),
            data_dir,
            guard,
        ))
    }

    /// A bare channel to its API.
    pub async fn channel(&self) -> Result<Channel> {
        Ok(
            tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))?
                .connect()
                .await?,
        )
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The process's resident memory (VmRSS), in KiB.
    pub fn rss_kib(&self) -> Result<u64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id()))
            .context("read the runtime's /proc status")?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .context("no VmRSS in the runtime's /proc status")
    }

    /// Sends `signal` (a name for kill(1): TERM, INT, ...).
    pub fn signal(&self, signal: &str) -> Result<()> {
        let status = Command::new("kill")
            .arg(format!("-{signal}"))
            .arg(self.child.id().to_string())
            .status()
            .context("run kill")?;
        if !status.success() {
            bail!("kill -{signal} failed: {status}");
        }
        Ok(())
    }

    /// Waits up to `within` for the process to exit; its status, or `None` when it still runs.
    pub async fn exited_within(
        &mut self,
        within: Duration,
    ) -> Result<Option<std::process::ExitStatus>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if tokio::time::Instant::now() > deadline {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// SIGKILL: no shutdown code runs.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Whether the runtime on `addr` serves: its socket is bound before it prepares its backend (so that early
/// clients wait rather than be refused), and it accepts connections only once that is done. Any answer to an
/// HTTP/2 preface (the server's SETTINGS over plaintext, a TLS alert or a closed connection over TLS) says it
/// accepts; silence says the connection still waits in the backlog. A test that kills a runtime right after
/// it started must not kill it in the middle of its preparation (an executor installer half made).
async fn serves(addr: std::net::SocketAddr) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let Ok(mut stream) = tokio::net::TcpStream::connect(addr).await else {
        return false;
    };
    if stream
        .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .is_err()
    {
        return true;
    }
    let mut byte = [0u8; 1];
    tokio::time::timeout(Duration::from_millis(300), stream.read(&mut byte))
        .await
        .is_ok()
}

impl Drop for RuntimeProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The images of the "any image" tests (tests/images/build.sh): built once per test process, cached
/// across runs. Fails (never skips) when they cannot be built.
pub fn test_images() -> Result<()> {
    static BUILT: std::sync::OnceLock<std::result::Result<(), String>> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| run_script(concat!(env!("CARGO_MANIFEST_DIR"), "/images/build.sh")))
        .clone()
        .map_err(|e| anyhow::anyhow!(e))
}

/// Runs a set-up script; its stderr in the error when it fails.
pub fn run_script(script: &str) -> std::result::Result<(), String> {
    let out = Command::new(script)
        .output()
        .map_err(|e| format!("cannot run {script}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{script} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
