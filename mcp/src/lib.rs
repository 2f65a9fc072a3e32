//! MentisSandbox for MCP clients (docs/MCP.md): the tools `create_sandbox`, `run_shell`, `run_python`,
//! `read_file`, `write_file`, `list_files` and `delete_sandbox`, each one or a few calls of the public gRPC
//! API. Two servers share them:
//! - `mentis mcp` (the CLI) serves them on stdio, calling a runtime over the network with the CLI's key;
//! - the runtime serves them over streamable HTTP at `/mcp` on its HTTP listener, calling its own services
//!   in-process ([`http_service`]) with the key of each HTTP request, so every call is authorised and scoped
//!   exactly as the same call over gRPC would be.
//!
//! A conversation finds its sandbox again by key: `create_sandbox` with a `key` (a conversation id, say)
//! returns the sandbox made with that key before, creating it only the first time. A command that fails is
//! data (its exit code is in the result); a call the API refuses is an MCP tool error whose text says why.

mod output;

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt as _;
use mentis_proto::api::{
    self, action_service_client::ActionServiceClient, file_service_client::FileServiceClient,
    sandbox_service_client::SandboxServiceClient,
};
use rmcp::handler::server::router::tool::ToolRouter;
use rmcp::handler::server::wrapper::Parameters;
use rmcp::model::{CallToolResult, ContentBlock, Implementation, ServerCapabilities, ServerConfig};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, schemars, tool, tool_handler, tool_router};
use serde::Deserialize;
use tonic::metadata::MetadataValue;
use tonic::{Code, Status};
use tower::ServiceExt as _;

pub use output::DEFAULT_MAX_OUTPUT;
use output::{Capped, capped, strip_ansi};

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// How the tools reach the API: a gRPC channel, or the runtime's own services in-process.
pub type Transport = tower::util::BoxCloneSyncService<
    http::Request<tonic::body::Body>,
    http::Response<tonic::body::Body>,
    TransportError,
>;

/// A [`Transport`]'s failure. A type of its own, not a bare `BoxError`: with the latter, rustc cannot prove
/// the tools' futures `Send` (the `From` impl it needs is not general enough over lifetimes). tonic finds
/// the status or connection error it maps to a code through [`std::error::Error::source`].
#[derive(Debug)]
pub struct TransportError(BoxError);

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for TransportError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// Boxes any gRPC client transport (a tonic `Channel`, an intercepted one, in-process services).
pub fn transport<S, B>(service: S) -> Transport
where
    S: tower::Service<http::Request<tonic::body::Body>, Response = http::Response<B>>
        + Clone
        + Send
        + Sync
        + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    tower::util::BoxCloneSyncService::new(
        service
            .map_response(|r| r.map(tonic::body::Body::new))
            .map_err(|e| TransportError(e.into())),
    )
}

/// The tools over streamable HTTP (the runtime mounts it at `/mcp`), stateless: every POST is one MCP
/// request answered as JSON, so any replica can answer it and a restart loses nothing. `any_host` turns off
/// the `Host` check against DNS rebinding (loopback names only otherwise): right when every call needs a
/// key, which a rebinding page does not have. Request bodies up to `max_body` bytes (a write_file's content).
pub fn http_service(
    api: Transport,
    max_output: usize,
    any_host: bool,
    max_body: usize,
    shutdown: tokio_util::sync::CancellationToken,
) -> HttpService {
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_max_request_body_bytes(max_body)
        .with_cancellation_token(shutdown);
    if any_host {
        config = config.disable_allowed_hosts();
    }
    StreamableHttpService::new(
        move || Ok(SandboxTools::new(api.clone(), max_output)),
        std::sync::Arc::new(NeverSessionManager::default()),
        config,
    )
}

/// The tools over streamable HTTP: a tower service of HTTP requests.
pub type HttpService = StreamableHttpService<SandboxTools, NeverSessionManager>;

/// Attempts of one action when the stream to the runtime breaks (each resubmits the same action id, which
/// replays the action's observations from its start instead of running it again).
const ATTEMPTS: u32 = 3;

/// How long an action's stream may stay silent before it is taken for broken (and resubmitted): the runtime
/// sends a keepalive on an idle stream every 15 s by default (`MENTIS_STREAM_KEEPALIVE_SECS`), so this is
/// four missed ones; a connection that died without a reset is found here.
const SILENCE: Duration = Duration::from_secs(60);

/// The tools, over one [`Transport`].
#[derive(Clone)]
pub struct SandboxTools {
    api: Transport,
    max_output: usize,
    tool_router: ToolRouter<Self>,
}

impl std::fmt::Debug for SandboxTools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SandboxTools")
            .field("max_output", &self.max_output)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateSandboxArgs {
    /// A key of your choosing (for example this conversation's id): the sandbox made before with the same
    /// key is returned instead of a new one. Without a key, every call creates a new sandbox.
    #[serde(default)]
    pub key: Option<String>,
    /// The space to create it in (default: "default").
    #[serde(default)]
    pub space: Option<String>,
    /// Environment variables for everything run in the sandbox.
    #[serde(default)]
    pub env: Option<HashMap<String, String>>,
    /// A template of the space to make it from (its image, limits, env, working directory and start-up
    /// commands), as the operator named it.
    #[serde(default)]
    pub template: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunShellArgs {
    /// The sandbox (from create_sandbox).
    pub sandbox_id: String,
    /// A bash command line, run with `bash -c` in /workspace.
    pub command: String,
    /// Seconds before the command is killed (default 300).
    #[serde(default)]
    pub timeout_seconds: Option<u32>,
    /// Run in this persistent shell session (its working directory and variables stay for the next
    /// command of the same session). Letters, digits, '.', '_', '-'.
    #[serde(default)]
    pub session: Option<String>,
    /// Working directory (relative to /workspace).
    #[serde(default)]
    pub work_dir: Option<String>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RunPythonArgs {
    /// The sandbox (from create_sandbox).
    pub sandbox_id: String,
    /// Python code, run as one cell of the sandbox's IPython kernel: variables, imports and functions stay
    /// defined for later calls. The last expression's value is returned, and plots as images.
    pub code: String,
    /// Seconds before the cell is interrupted (default 300); the kernel keeps its state.
    #[serde(default)]
    pub timeout_seconds: Option<u32>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadFileArgs {
    /// The sandbox (from create_sandbox).
    pub sandbox_id: String,
    /// The file, relative to /workspace (or absolute under it).
    pub path: String,
    /// The first byte to read (default 0): read a long file in parts.
    #[serde(default)]
    pub offset: Option<u64>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteFileArgs {
    /// The sandbox (from create_sandbox).
    pub sandbox_id: String,
    /// The file, relative to /workspace; missing parent directories are created.
    pub path: String,
    /// The whole new content of the file (UTF-8 text).
    pub content: String,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListFilesArgs {
    /// The sandbox (from create_sandbox).
    pub sandbox_id: String,
    /// The directory, relative to /workspace (default: /workspace itself).
    #[serde(default)]
    pub path: Option<String>,
    /// Everything below the directory, not only its entries.
    #[serde(default)]
    pub recursive: Option<bool>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewUrlArgs {
    /// The sandbox (from create_sandbox).
    pub sandbox_id: String,
    /// The port a server in the sandbox listens on (on 0.0.0.0, e.g. `python3 -m http.server 8000`).
    pub port: u32,
    /// Seconds the URL opens (default 3600, at most 7 days).
    #[serde(default)]
    pub ttl_seconds: Option<u32>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteSandboxArgs {
    /// The sandbox (from create_sandbox).
    pub sandbox_id: String,
}

/// Every tool's name and the first sentence of its description, as `tools/list` gives them (for
/// `mentis mcp --help`).
pub fn tools() -> Vec<(String, String)> {
    SandboxTools::tool_router()
        .list_all()
        .into_iter()
        .map(|t| {
            let description = t.description.as_deref().unwrap_or_default();
            let first = description
                .split_once(". ")
                .map_or(description, |(first, _)| first)
                .trim_end_matches('.');
            (t.name.to_string(), format!("{first}."))
        })
        .collect()
}

/// A tool's outcome before it becomes a [`CallToolResult`]: content for the model, or a refused call.
type Outcome = Result<Vec<ContentBlock>, Status>;

#[tool_router]
impl SandboxTools {
    /// The tools over `api`; each output given back is cut to `max_output` bytes (head and tail).
    pub fn new(api: Transport, max_output: usize) -> Self {
        Self {
            api,
            max_output: max_output.max(64),
            tool_router: Self::tool_router(),
        }
    }

    #[tool(
        description = "Create a sandbox: an isolated Linux machine with bash, Python 3 and a persistent IPython \
                       kernel, files under /workspace. Pass a `key` (e.g. the conversation id) to get the same \
                       sandbox back on later calls. Returns its sandbox_id, needed by the other tools."
    )]
    async fn create_sandbox(
        &self,
        Parameters(a): Parameters<CreateSandboxArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        reply(self.create(&ctx, a).await)
    }

    #[tool(
        description = "Run a bash command line in a sandbox and return its exit code, stdout and stderr. A \
                       non-zero exit code is a result, not an error. Long output is cut in the middle."
    )]
    async fn run_shell(
        &self,
        Parameters(a): Parameters<RunShellArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let shell = api::ShellAction {
            command: a.command,
            work_dir: a.work_dir.unwrap_or_default(),
            timeout_seconds: a.timeout_seconds.unwrap_or(0),
            session: a.session.unwrap_or_default(),
            ..Default::default()
        };
        reply(
            self.execute(&ctx, a.sandbox_id, api::action::Kind::Shell(shell))
                .await,
        )
    }

    #[tool(
        description = "Run Python code in the sandbox's IPython kernel (state persists between calls). Returns \
                       what it printed, the value of its last expression, images it displayed, and the error \
                       with its traceback if it raised."
    )]
    async fn run_python(
        &self,
        Parameters(a): Parameters<RunPythonArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let cell = api::IPythonAction {
            code: a.code,
            timeout_seconds: a.timeout_seconds.unwrap_or(0),
            ..Default::default()
        };
        reply(
            self.execute(&ctx, a.sandbox_id, api::action::Kind::Ipython(cell))
                .await,
        )
    }

    #[tool(
        description = "Read a text file of a sandbox. A long file is cut: read it further with `offset`."
    )]
    async fn read_file(
        &self,
        Parameters(a): Parameters<ReadFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        reply(self.read(&ctx, a).await)
    }

    #[tool(
        description = "Write a text file in a sandbox (replacing it whole; parent directories are created)."
    )]
    async fn write_file(
        &self,
        Parameters(a): Parameters<WriteFileArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        reply(self.write(&ctx, a).await)
    }

    #[tool(description = "List a directory of a sandbox (type, size and path of each entry).")]
    async fn list_files(
        &self,
        Parameters(a): Parameters<ListFilesArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        reply(self.list(&ctx, a).await)
    }

    #[tool(
        description = "A URL that opens a web app or server running in a sandbox (HTTP and WebSocket), to \
                       hand to a person or fetch: start the server in the background first, listening on \
                       0.0.0.0 (e.g. `nohup python3 -m http.server 8000 >/tmp/http.log 2>&1 &`). The URL \
                       carries its own expiring token; the runtime needs its HTTP listener for this."
    )]
    async fn preview_url(
        &self,
        Parameters(a): Parameters<PreviewUrlArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let req = request(
            &ctx,
            api::GetPreviewUrlRequest {
                sandbox_id: a.sandbox_id,
                port: a.port,
                ttl_seconds: a.ttl_seconds.unwrap_or(0),
            },
        );
        let got = self.sandboxes().get_preview_url(req).await;
        reply(got.map(|r| {
            let r = r.into_inner();
            let until = r
                .expire_time
                .map(|t| format!(" (opens until Unix time {})", t.seconds))
                .unwrap_or_default();
            vec![text(format!("{}{until}", r.url))]
        }))
    }

    #[tool(description = "Delete a sandbox and everything in it.")]
    async fn delete_sandbox(
        &self,
        Parameters(a): Parameters<DeleteSandboxArgs>,
        ctx: RequestContext<RoleServer>,
    ) -> Result<CallToolResult, ErrorData> {
        let req = request(
            &ctx,
            api::DeleteSandboxRequest {
                sandbox_id: a.sandbox_id.clone(),
            },
        );
        let done = self.sandboxes().delete_sandbox(req).await;
        reply(done.map(|r| {
            vec![text(if r.into_inner().found {
                format!("sandbox {} deleted", a.sandbox_id)
            } else {
                format!(
                    "no sandbox {} was there to delete (it had ended, or never existed)",
                    a.sandbox_id
                )
            })]
        }))
    }
}

#[tool_handler(router = self.tool_router)]
impl ServerHandler for SandboxTools {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("mentis", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "MentisSandbox: isolated sandboxes to run code in. Call create_sandbox first (with a key \
                 such as the conversation id, to find the same sandbox again later), then run_shell, \
                 run_python and the file tools with its sandbox_id. Files live under /workspace.",
            )
    }
}

impl SandboxTools {
    fn sandboxes(&self) -> SandboxServiceClient<Transport> {
        SandboxServiceClient::new(self.api.clone())
    }

    fn actions(&self) -> ActionServiceClient<Transport> {
        ActionServiceClient::new(self.api.clone())
    }

    fn files(&self) -> FileServiceClient<Transport> {
        FileServiceClient::new(self.api.clone())
    }

    async fn create(&self, ctx: &RequestContext<RoleServer>, a: CreateSandboxArgs) -> Outcome {
        let key = a.key.unwrap_or_default();
        let space = a.space.unwrap_or_default();
        let spec = api::SandboxSpec {
            space_id: space.clone(),
            external_key: key.clone(),
            env: a.env.unwrap_or_default(),
            template: a.template.unwrap_or_default(),
            ..Default::default()
        };
        // With a key: the sandbox made with it, else a new one (a race with another creator is settled by
        // the runtime: ALREADY_EXISTS, and the other's sandbox is found on the next turn).
        for _ in 0..3 {
            if !key.is_empty() {
                let by_key = api::GetSandboxByKeyRequest {
                    space_id: space.clone(),
                    external_key: key.clone(),
                };
                match self
                    .sandboxes()
                    .get_sandbox_by_key(request(ctx, by_key))
                    .await
                {
                    Ok(r) => return Ok(vec![describe(r.into_inner().sandbox, false)]),
                    Err(s) if s.code() == Code::NotFound => {}
                    Err(s) => return Err(s),
                }
            }
            let create = api::CreateSandboxRequest {
                spec: Some(spec.clone()),
            };
            match self.sandboxes().create_sandbox(request(ctx, create)).await {
                Ok(r) => return Ok(vec![describe(r.into_inner().sandbox, true)]),
                Err(s) if s.code() == Code::AlreadyExists && !key.is_empty() => continue,
                Err(s) => return Err(s),
            }
        }
        Err(Status::aborted(
            "the sandbox of this key kept appearing and disappearing: try again",
        ))
    }

    /// Runs one action with Execute and collects its observations into the tool's result. A stream that
    /// breaks is resubmitted with the same action id: the runtime replays the action from its start (it
    /// does not run again), so the result has every byte once.
    async fn execute(
        &self,
        ctx: &RequestContext<RoleServer>,
        sandbox_id: String,
        kind: api::action::Kind,
    ) -> Outcome {
        let action_id = uuid::Uuid::new_v4().to_string();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let req = api::ExecuteRequest {
                sandbox_id: sandbox_id.clone(),
                action: Some(api::Action {
                    kind: Some(kind.clone()),
                }),
                action_id: action_id.clone(),
            };
            let mut collect = Collect::new(self.max_output);
            let broke = match self.actions().execute(request(ctx, req)).await {
                Ok(stream) => {
                    let mut stream = stream.into_inner();
                    loop {
                        let Ok(next) = tokio::time::timeout(SILENCE, stream.next()).await else {
                            break Status::unavailable(format!(
                                "nothing from the runtime for {} s (idle streams carry keepalives): the \
                                 connection is taken for dead",
                                SILENCE.as_secs()
                            ));
                        };
                        match next {
                            Some(Ok(api::ExecuteResponse {
                                kind: Some(api::execute_response::Kind::Observation(o)),
                            })) => {
                                if let Some(done) = collect.feed(o) {
                                    return Ok(done);
                                }
                            }
                            Some(Ok(api::ExecuteResponse {
                                kind: Some(api::execute_response::Kind::Gap(g)),
                            })) => collect.gap(&g),
                            Some(Ok(_)) => {}
                            Some(Err(s)) => break s,
                            None => {
                                break Status::unavailable(
                                    "the stream ended before the action did",
                                );
                            }
                        }
                    }
                }
                Err(s) => s,
            };
            if attempt >= ATTEMPTS || !retryable(&broke) {
                return Err(broke);
            }
            tracing::debug!(%action_id, error = %broke, "the action's stream broke: resubmitting");
            tokio::time::sleep(Duration::from_millis(200 * u64::from(attempt))).await;
        }
    }

    async fn read(&self, ctx: &RequestContext<RoleServer>, a: ReadFileArgs) -> Outcome {
        let offset = a.offset.unwrap_or(0);
        let stat = self
            .files()
            .stat_file(request(
                ctx,
                api::StatFileRequest {
                    sandbox_id: a.sandbox_id.clone(),
                    path: a.path.clone(),
                },
            ))
            .await?
            .into_inner()
            .file
            .unwrap_or_default();
        if stat.r#type() == api::FileType::Directory {
            return Err(Status::invalid_argument(format!(
                "{} is a directory: list it with list_files",
                a.path
            )));
        }
        let req = api::ReadFileRequest {
            sandbox_id: a.sandbox_id,
            path: a.path.clone(),
            offset,
            length: self.max_output as u64,
        };
        let mut stream = self
            .files()
            .read_file(request(ctx, req))
            .await?
            .into_inner();
        let mut data = Vec::new();
        while let Some(chunk) = stream.next().await {
            data.extend_from_slice(&chunk?.data);
        }
        let end = offset + data.len() as u64;
        let Ok(mut body) = String::from_utf8(data) else {
            return Ok(vec![text(format!(
                "{} is not UTF-8 text ({} bytes): look at it with run_shell (file, xxd, head) or \
                 run_python",
                a.path, stat.size
            ))]);
        };
        if end < stat.size {
            body.push_str(&format!(
                "\n[... the file has {} bytes; this shows bytes {offset} to {end}: read_file with \
                 offset {end} reads on ...]",
                stat.size
            ));
        }
        Ok(vec![text(body)])
    }

    async fn write(&self, ctx: &RequestContext<RoleServer>, a: WriteFileArgs) -> Outcome {
        let size = a.content.len();
        let header = api::WriteFileRequest {
            kind: Some(api::write_file_request::Kind::Header(
                api::WriteFileHeader {
                    sandbox_id: a.sandbox_id,
                    path: a.path.clone(),
                    mode: 0,
                },
            )),
        };
        let data = a
            .content
            .into_bytes()
            .chunks(256 * 1024)
            .map(|c| api::WriteFileRequest {
                kind: Some(api::write_file_request::Kind::Data(c.to_vec().into())),
            })
            .collect::<Vec<_>>();
        let messages = futures::stream::iter(std::iter::once(header).chain(data));
        self.files().write_file(request(ctx, messages)).await?;
        Ok(vec![text(format!("wrote {size} bytes to {}", a.path))])
    }

    async fn list(&self, ctx: &RequestContext<RoleServer>, a: ListFilesArgs) -> Outcome {
        let mut lines = Capped::new(self.max_output);
        let mut page_token = String::new();
        let mut count = 0usize;
        loop {
            let req = api::ListFilesRequest {
                sandbox_id: a.sandbox_id.clone(),
                path: a.path.clone().unwrap_or_default(),
                recursive: a.recursive.unwrap_or(false),
                page_size: 0,
                page_token: page_token.clone(),
            };
            let page = self
                .files()
                .list_files(request(ctx, req))
                .await?
                .into_inner();
            for f in &page.files {
                count += 1;
                let kind = match f.r#type() {
                    api::FileType::Directory => "dir ",
                    api::FileType::Symlink => "link",
                    api::FileType::File => "file",
                    _ => "other",
                };
                let mut line = format!("{kind} {:>10} {}", f.size, f.path);
                if !f.symlink_target.is_empty() {
                    line.push_str(&format!(" -> {}", f.symlink_target));
                }
                line.push('\n');
                lines.push(line.as_bytes());
            }
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        if count == 0 {
            return Ok(vec![text("(empty directory)")]);
        }
        Ok(vec![text(format!(
            "{count} entries (paths relative to /workspace):\n{}",
            lines.text()
        ))])
    }
}

/// A tool call's request to the API, carrying the `authorization` of the HTTP request the MCP call came in
/// (over stdio there is none: the CLI's channel adds its own key).
fn request<T>(ctx: &RequestContext<RoleServer>, message: T) -> tonic::Request<T> {
    let mut req = tonic::Request::new(message);
    if let Some(parts) = ctx.extensions.get::<http::request::Parts>()
        && let Some(v) = parts.headers.get(http::header::AUTHORIZATION)
        && let Ok(v) = MetadataValue::try_from(v.as_bytes())
    {
        req.metadata_mut().insert("authorization", v);
    }
    req
}

/// Whether an action's broken stream is worth resubmitting (the connection, not the request, failed).
fn retryable(s: &Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    ) || (s.code() == Code::ResourceExhausted && s.message().contains("stopped reading"))
}

fn text(t: impl Into<String>) -> ContentBlock {
    ContentBlock::text(t)
}

fn describe(sandbox: Option<api::Sandbox>, created: bool) -> ContentBlock {
    let sb = sandbox.unwrap_or_default();
    let state = enum_name(sb.state().as_str_name(), "SANDBOX_STATE_");
    let how = if created {
        "created"
    } else {
        "found (made before with this key)"
    };
    text(format!(
        "sandbox_id: {}\nstate: {state}\n{how}",
        sb.sandbox_id
    ))
}

/// `SANDBOX_STATE_RUNNING` → `running`.
fn enum_name(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_lowercase()
}

/// The tool's result: the content, or a tool error (`isError`) whose text says what the API refused and why.
fn reply(outcome: Outcome) -> Result<CallToolResult, ErrorData> {
    Ok(match outcome {
        Ok(content) => CallToolResult::success(content),
        Err(s) => CallToolResult::error(vec![text(refusal(&s))]),
    })
}

/// `NOT_FOUND: sandbox sb-1 not found`, with the reason (`google.rpc.ErrorInfo`) and a retry delay when the
/// status carries them.
fn refusal(s: &Status) -> String {
    use tonic_types::StatusExt as _;
    let mut out = format!("{}: {}", mentis_proto::code_name(s.code()), s.message());
    let details = s.get_error_details();
    if let Some(info) = details.error_info() {
        out.push_str(&format!(" (reason {})", info.reason));
    }
    if let Some(retry) = details.retry_info()
        && let Some(delay) = retry.retry_delay
    {
        out.push_str(&format!("; retry after {} s", delay.as_secs_f64().ceil()));
    }
    out
}

/// Collects one action's observations into the tool's content.
struct Collect {
    limit: usize,
    stdout: Capped,
    stderr: Capped,
    /// A cell's outputs in order: stream text and results' plain text.
    cell: Capped,
    images: Vec<ContentBlock>,
    notes: Vec<String>,
}

/// Images a cell's result carries at most (each is a whole PNG or JPEG).
const MAX_IMAGES: usize = 4;

impl Collect {
    fn new(limit: usize) -> Self {
        Self {
            limit,
            stdout: Capped::new(limit),
            stderr: Capped::new(limit),
            cell: Capped::new(limit),
            images: Vec::new(),
            notes: Vec::new(),
        }
    }

    fn gap(&mut self, g: &api::LogGap) {
        self.notes.push(format!(
            "[the runtime's log no longer holds observations {} to {} of this action: some output is missing]",
            g.after_seq + 1,
            g.first_available_seq.saturating_sub(1)
        ));
    }

    /// The content when `o` is the action's end.
    fn feed(&mut self, o: api::Observation) -> Option<Vec<ContentBlock>> {
        use api::observation::Kind;
        match o.kind? {
            Kind::CmdOutput(out) => {
                if out.stream() == api::OutputStream::Stderr {
                    self.stderr.push(&out.data);
                } else {
                    self.stdout.push(&out.data);
                }
                None
            }
            Kind::IpythonOutput(out) => {
                use api::IpythonOutputKind as K;
                match out.kind() {
                    K::StreamStdout | K::StreamStderr => self.cell.push(out.text.as_bytes()),
                    _ => {
                        for mime in ["image/png", "image/jpeg"] {
                            if let Some(data) = out.data.get(mime) {
                                if self.images.len() < MAX_IMAGES {
                                    self.images.push(ContentBlock::image(data.trim(), mime));
                                } else {
                                    self.notes.push(format!(
                                        "[an {mime} image left out: over {MAX_IMAGES} images]"
                                    ));
                                }
                            }
                        }
                        if let Some(plain) = out.data.get("text/plain") {
                            self.cell.push(plain.as_bytes());
                            self.cell.push(b"\n");
                        }
                    }
                }
                None
            }
            Kind::Error(e) => {
                self.notes.push(format!("[{}]", e.message));
                None
            }
            Kind::CmdEnd(end) => Some(self.command_result(&end)),
            Kind::IpythonResult(r) => Some(self.cell_result(&r)),
            _ => None,
        }
    }

    fn command_result(&mut self, end: &api::CmdEnd) -> Vec<ContentBlock> {
        use api::EndReason;
        let mut out = match end.reason() {
            EndReason::Exited | EndReason::Unspecified if end.signal != 0 => {
                format!(
                    "exit code: {} (killed by signal {})",
                    end.exit_code, end.signal
                )
            }
            EndReason::Exited | EndReason::Unspecified => format!("exit code: {}", end.exit_code),
            reason => {
                let name = enum_name(reason.as_str_name(), "END_REASON_").replace('_', " ");
                let mut s = format!("exit code: {}; the command {name}", end.exit_code);
                if !end.message.is_empty() {
                    s.push_str(&format!(": {}", end.message));
                }
                s
            }
        };
        for (name, stream) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
            if !stream.is_empty() {
                let text = stream.text();
                let text = text.strip_suffix('\n').unwrap_or(&text);
                out.push_str(&format!("\n--- {name} ---\n{text}"));
            }
        }
        if self.stdout.is_empty() && self.stderr.is_empty() {
            out.push_str("\n(no output)");
        }
        self.finish(out)
    }

    fn cell_result(&mut self, r: &api::IPythonResult) -> Vec<ContentBlock> {
        let mut out = String::new();
        if !self.cell.is_empty() {
            out.push_str(&self.cell.text());
        }
        match r.status() {
            api::IpythonStatus::Ok => {
                if out.is_empty() && self.images.is_empty() {
                    out.push_str("(no output)");
                }
            }
            api::IpythonStatus::Error => {
                let tb = if r.traceback.is_empty() {
                    format!("{}: {}", r.error_name, r.error_value)
                } else {
                    strip_ansi(&r.traceback.join("\n"))
                };
                out.push_str(&format!(
                    "\n--- error: {}: {} ---\n{}",
                    r.error_name,
                    r.error_value,
                    capped(&tb, self.limit)
                ));
            }
            _ => out.push_str(&format!("\n--- the cell was aborted: {} ---", r.reason)),
        }
        self.finish(out)
    }

    fn finish(&mut self, mut body: String) -> Vec<ContentBlock> {
        for note in &self.notes {
            body.push('\n');
            body.push_str(note);
        }
        let mut content = vec![text(body.trim_matches('\n').to_owned())];
        content.append(&mut self.images);
        content
    }
}
