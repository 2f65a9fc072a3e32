//! Assembles the gRPC server: SandboxService, ActionService, grpc.health.v1 and server reflection (v1 and
//! v1alpha, since grpcurl speaks only v1alpha), on top of a started manager; and drains it on shutdown.

pub mod door;
mod health;
mod metrics_endpoint;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use mentis_core::SandboxBackend;
use mentis_core::action::MAX_REQUEST_BYTES;
use mentis_proto::api::action_service_server::ActionServiceServer;
use mentis_proto::api::file_service_server::FileServiceServer;
use mentis_proto::api::key_service_server::KeyServiceServer;
use mentis_proto::api::sandbox_service_server::SandboxServiceServer;
use mentis_proto::api::snapshot_service_server::SnapshotServiceServer;
use mentis_proto::api::space_service_server::SpaceServiceServer;
use mentis_proto::api::template_service_server::TemplateServiceServer;
use mentis_proto::api::terminal_service_server::TerminalServiceServer;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tonic::codec::CompressionEncoding;
use tonic::server::NamedService;
use tonic::transport::{Certificate, Identity, ServerTlsConfig};
use tracing::Instrument as _;

use crate::api::authenticate::AuthLayer;
use crate::api::{
    ActionApi, FileApi, KeyApi, SandboxApi, SnapshotApi, SpaceApi, TemplateApi, TerminalApi,
};
use crate::config::{RuntimeConfig, TlsFiles};
use crate::proxy::Proxy;
use door::{Guarded, MarkRequests};
use mentis_app::app::App;

/// How long open calls get to finish once the drain has begun.
const DRAIN_GRACE: Duration = Duration::from_secs(5);
/// How long stopping waits for the listeners beside the API (each ends within twice the drain's grace).
const LISTENERS_GRACE: Duration = Duration::from_secs(15);

/// Why the runtime could not start or serve.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("backend: {0}")]
    Backend(#[from] mentis_core::Error),
    #[error("reflection: {0}")]
    Reflection(#[from] tonic_reflection::server::Error),
    #[error("gRPC server: {0}")]
    Transport(#[from] tonic::transport::Error),
    #[error("TLS (MENTIS_TLS_CERT, MENTIS_TLS_KEY, MENTIS_TLS_CLIENT_CA): {0}")]
    Tls(String),
}

/// The server's TLS from the files `files` names, read and checked now: a file that is missing or cannot be
/// used stops the start, saying which and why.
fn server_tls(files: &TlsFiles) -> Result<ServerTlsConfig, ServeError> {
    let read = |path: &std::path::Path| {
        std::fs::read(path)
            .map_err(|e| ServeError::Tls(format!("cannot read {}: {e}", path.display())))
    };
    let mut tls =
        ServerTlsConfig::new().identity(Identity::from_pem(read(&files.cert)?, read(&files.key)?));
    if let Some(ca) = &files.client_ca {
        tls = tls.client_ca_root(Certificate::from_pem(read(ca)?));
    }
    tonic::transport::Server::builder()
        .tls_config(tls.clone())
        .map_err(|e| {
            let mut why = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                why = format!("{why}: {s}");
                source = s.source();
            }
            ServeError::Tls(why)
        })?;
    Ok(tls)
}

/// A started runtime.
#[derive(Debug)]
pub struct Runtime {
    /// The address it serves on (useful with port 0).
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ServeError>>,
    /// Owns the server and the listeners beside it (health, HTTP, metrics), each stopped by `shutdown`.
    tasks: TaskTracker,
}

impl Runtime {
    /// Connects the backend `config` names, reconciles, binds `config.listen` and serves in the background.
    pub async fn start(config: RuntimeConfig) -> Result<Self, ServeError> {
        let backend = App::backend(&config).await?;
        Self::start_with(config, backend).await
    }

    /// [`Runtime::start`] on any backend (the component tests bring a fake one).
    pub async fn start_with(
        config: RuntimeConfig,
        backend: Arc<dyn SandboxBackend>,
    ) -> Result<Self, ServeError> {
        crate::install_crypto_provider();
        let tls = config.tls.as_ref().map(server_tls).transpose()?;
        let listener =
            TcpListener::bind(config.listen)
                .await
                .map_err(|source| ServeError::Listen {
                    addr: config.listen,
                    source,
                })?;
        let addr = listener.local_addr().map_err(|source| ServeError::Listen {
            addr: config.listen,
            source,
        })?;
        let metrics_listener = match config.metrics_listen {
            Some(at) => Some(
                TcpListener::bind(at)
                    .await
                    .map_err(|source| ServeError::Listen { addr: at, source })?,
            ),
            None => None,
        };
        let http_listener = match config.http_listen {
            Some(at) => Some(
                TcpListener::bind(at)
                    .await
                    .map_err(|source| ServeError::Listen { addr: at, source })?,
            ),
            None => None,
        };
        let health_listener = match config.health_listen {
            Some(at) => Some(
                TcpListener::bind(at)
                    .await
                    .map_err(|source| ServeError::Listen { addr: at, source })?,
            ),
            None => None,
        };
        let limits = config.connections;
        let guard = |listener: Option<TcpListener>, name, limits| {
            listener.map(|l| Guarded::new(l, name, limits))
        };
        let metrics_listener = guard(metrics_listener, "metrics", limits.side());
        let health_listener = guard(health_listener, "health", limits.side());
        let http_listener = guard(http_listener, "http", limits);
        let listener = Guarded::new(listener, "api", limits);
        let shutdown = CancellationToken::new();
        let app = App::open(
            config,
            backend,
            addr,
            http_listener.as_ref().and_then(|l| l.local_addr().ok()),
            shutdown.child_token(),
        )
        .await?;
        let config = Arc::clone(&app.config);
        let tasks = TaskTracker::new();
        if let Some(export) = crate::metrics::export() {
            app.manager.observe(export);
            if let Some(listener) = metrics_listener {
                metrics_endpoint::serve(export, listener, shutdown.clone(), &tasks);
            }
        }
        let auth = if app.keyring.enabled() {
            "keys"
        } else {
            "DISABLED"
        };
        let scheme = match &config.tls {
            None => "plaintext",
            Some(t) if t.client_ca.is_some() => "mutual TLS",
            Some(_) => "TLS",
        };
        let task = tasks.spawn(serve(
            app,
            listener,
            SideListeners {
                health: health_listener,
                http: http_listener,
            },
            tls,
            shutdown.clone(),
            tasks.clone(),
        ));
        tasks.close();
        tracing::info!(%addr, image = %config.executor_image, instance = %config.docker.instance, auth, transport = scheme, "mentis-runtime serving");
        Ok(Self {
            addr,
            shutdown,
            task,
            tasks,
        })
    }

    /// Stops accepting calls, ends open streams and waits for the server to finish.
    pub async fn stop(mut self) -> Result<(), ServeError> {
        self.shutdown.cancel();
        self.wait().await
    }

    /// Serves until `stop` is called or the server fails; then waits for the listeners beside it.
    pub async fn wait(&mut self) -> Result<(), ServeError> {
        let served = match (&mut self.task).await {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "server task panicked");
                Ok(())
            }
        };
        // The server stops only after shutdown (or failing, when it cancels nothing): stop the rest too.
        self.shutdown.cancel();
        if tokio::time::timeout(LISTENERS_GRACE, self.tasks.wait())
            .await
            .is_err()
        {
            tracing::warn!(
                grace_secs = LISTENERS_GRACE.as_secs(),
                "listeners still open after the grace are left to the process's end"
            );
        }
        served
    }

    /// A token that stops the runtime when cancelled.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

/// `MENTIS_HEALTH_LISTEN`: the same health service (so it follows the drain: NOT_SERVING first), alone and in
/// plaintext, until the runtime stops. Health carries no secret and needs no key.
fn serve_health<T: tonic_health::pb::health_server::Health>(
    listener: Guarded,
    health: tonic_health::pb::health_server::HealthServer<T>,
    shutdown: CancellationToken,
    tasks: &TaskTracker,
) {
    if let Ok(at) = listener.local_addr() {
        tracing::info!(%at, "grpc.health.v1 served in plaintext");
    }
    // Reflection of health alone, so grpcurl finds it there.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
    };
    let (v1, v1alpha) = (reflection().build_v1(), reflection().build_v1alpha());
    let serving = async move {
        let (v1, v1alpha) = match (v1, v1alpha) {
            (Ok(v1), Ok(v1alpha)) => (v1, v1alpha),
            (Err(e), _) | (_, Err(e)) => {
                tracing::error!(error = %e, "the health listener's reflection failed to build");
                return;
            }
        };
        let stopping = shutdown.clone();
        let server = tonic::transport::Server::builder()
            .layer(MarkRequests)
            .add_service(health)
            .add_service(v1)
            .add_service(v1alpha)
            .serve_with_incoming_shutdown(listener.incoming(), async move {
                stopping.cancelled().await;
                // Probes see NOT_SERVING during the drain's grace, like the API port's health.
                tokio::time::sleep(DRAIN_GRACE).await;
            });
        // An open Health/Watch stream never ends by itself: after the grace the listener stops regardless.
        let served = tokio::select! {
            served = server => served,
            () = async {
                shutdown.cancelled().await;
                tokio::time::sleep(2 * DRAIN_GRACE).await;
            } => Ok(()),
        };
        if let Err(e) = served {
            tracing::error!(error = %e, "the health listener failed");
        }
    };
    tasks.spawn(serving.instrument(
        tracing::info_span!(target: mentis_telemetry::UNTRACED, parent: None, "health listener"),
    ));
}

/// The listeners beside the API's: `MENTIS_HEALTH_LISTEN` and `MENTIS_HTTP_LISTEN` (the web terminal).
struct SideListeners {
    health: Option<Guarded>,
    http: Option<Guarded>,
}

async fn serve(
    app: App,
    listener: Guarded,
    side: SideListeners,
    tls: Option<ServerTlsConfig>,
    shutdown: CancellationToken,
    tasks: TaskTracker,
) -> Result<(), ServeError> {
    let (health_reporter, health_service) = tonic_health::server::health_reporter();
    let health = health::Health::new(
        health_reporter,
        &[
            SandboxServiceServer::<SandboxApi>::NAME,
            SpaceServiceServer::<SpaceApi>::NAME,
            ActionServiceServer::<ActionApi>::NAME,
            FileServiceServer::<FileApi>::NAME,
            KeyServiceServer::<KeyApi>::NAME,
            TerminalServiceServer::<TerminalApi>::NAME,
            SnapshotServiceServer::<SnapshotApi>::NAME,
            TemplateServiceServer::<TemplateApi>::NAME,
        ],
    );
    health.serving(true).await;
    tasks.spawn(
        Arc::clone(&health)
            .watch(Arc::clone(&app.manager), shutdown.clone())
            .instrument(tracing::info_span!(target: mentis_telemetry::UNTRACED, parent: None, "health watch")),
    );
    if let Some(listener) = side.health {
        serve_health(listener, health_service.clone(), shutdown.clone(), &tasks);
    }
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(mentis_proto::PUBLIC_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(mentis_proto::PUBLIC_FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()?;

    let App {
        manager,
        keyring,
        links,
        previews,
        ..
    } = app;
    let sessions = TaskTracker::new();
    let sandbox_api = SandboxApi::new(Arc::clone(&manager), Arc::clone(&previews));
    let action_api = ActionApi::new(
        Arc::clone(&manager),
        shutdown.clone(),
        sessions.clone(),
        manager.config().stream,
    );
    let file_api = FileApi::new(
        Arc::clone(&manager),
        shutdown.clone(),
        manager.config().stream.keepalive,
    );
    let terminal_api = TerminalApi::new(
        Arc::clone(&manager),
        shutdown.clone(),
        sessions.clone(),
        manager.config().stream,
        links.clone(),
        Arc::clone(&previews),
    );
    if let Some(listener) = side.http {
        // MCP's tools call the API in-process: the same services behind the same key check, with the key
        // of each MCP request.
        let max = manager.config().max_message_bytes;
        let api = tonic::service::Routes::new(SandboxServiceServer::new(sandbox_api.clone()))
            .add_service(ActionServiceServer::new(action_api.clone()))
            .add_service(file_api.clone().into_service(max));
        let api = tower::ServiceBuilder::new()
            .layer(AuthLayer::new(Arc::clone(&keyring)))
            .service(api);
        let mcp = crate::web::Mcp {
            service: mentis_mcp::http_service(
                mentis_mcp::transport(api),
                manager.config().mcp_max_output,
                keyring.enabled(),
                max,
                shutdown.clone(),
            ),
            keyring: Arc::clone(&keyring),
            max_body: max,
        };
        crate::web::serve(
            listener,
            terminal_api.clone(),
            links,
            mcp,
            Arc::new(Proxy::new(
                previews,
                Arc::clone(&manager),
                tasks.clone(),
                shutdown.clone(),
            )),
            shutdown.clone(),
            &tasks,
        );
    }

    // The drain: health says NOT_SERVING first (a balancer or mesh stops sending), then the server stops
    // accepting (new calls are refused: UNAVAILABLE) while open streams end with UNAVAILABLE telling the
    // client to resume from its last seq. Sandboxes, executors and their actions keep running.
    let draining = {
        let shutdown = shutdown.clone();
        async move {
            shutdown.cancelled().await;
            health.drain().await;
            tracing::info!("draining: health is NOT_SERVING, open streams are told to resume");
        }
    };
    let mut builder = tonic::transport::Server::builder()
        .http2_keepalive_interval(Some(Duration::from_secs(30)))
        .http2_keepalive_timeout(Some(Duration::from_secs(20)));
    if let Some(tls) = tls {
        builder = builder.tls_config(tls)?;
    }
    // Requests up to `MENTIS_MAX_MESSAGE_BYTES`, gzip-compressed or not. An action with the largest code and
    // stdin the model accepts is above gRPC's default of 4 MiB: ActionService always admits it, and the
    // executor's server admits the same size.
    let max = manager.config().max_message_bytes;
    let gzip = CompressionEncoding::Gzip;
    let server = builder
        // A connection's first request is marked (see `door`): until then it has a deadline.
        .layer(MarkRequests)
        // Every call in a span continuing the caller's trace, when traces are on (outermost, so refused
        // calls are traced too).
        .layer(mentis_telemetry::GrpcTraceLayer)
        // A request tonic cannot decode is the client's mistake, not INTERNAL (see `api::decode`).
        .layer(crate::api::decode::DecodeErrorLayer)
        // Every call but health and reflection needs a key (see `api::authenticate`).
        .layer(AuthLayer::new(Arc::clone(&keyring)))
        .add_service(health_service)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(
            SandboxServiceServer::new(sandbox_api)
                .max_decoding_message_size(max)
                .accept_compressed(gzip),
        )
        .add_service(
            SpaceServiceServer::new(SpaceApi::new(Arc::clone(&manager)))
                .max_decoding_message_size(max)
                .accept_compressed(gzip),
        )
        .add_service(
            ActionServiceServer::new(action_api)
                .max_decoding_message_size(max.max(MAX_REQUEST_BYTES))
                .accept_compressed(gzip),
        )
        .add_service(file_api.into_service(max))
        .add_service(
            KeyServiceServer::new(KeyApi::new(Arc::clone(&manager), keyring))
                .max_decoding_message_size(max)
                .accept_compressed(gzip),
        )
        .add_service(
            SnapshotServiceServer::new(SnapshotApi::new(Arc::clone(&manager)))
                .max_decoding_message_size(max)
                .accept_compressed(gzip),
        )
        .add_service(
            TemplateServiceServer::new(TemplateApi::new(Arc::clone(&manager)))
                .max_decoding_message_size(max)
                .accept_compressed(gzip),
        )
        .add_service(
            TerminalServiceServer::new(terminal_api)
                .max_decoding_message_size(max)
                .accept_compressed(gzip),
        )
        // Connections come through the listener's door (limits, deadlines, no Nagle: see `door`).
        .serve_with_incoming_shutdown(listener.incoming(), draining);
    // Open calls get a grace to finish; an open Health/Watch stream never ends by itself, so after the
    // grace the server stops regardless.
    let result = tokio::select! {
        r = server => r,
        () = async {
            shutdown.cancelled().await;
            tokio::time::sleep(DRAIN_GRACE).await;
        } => {
            tracing::info!(grace_secs = DRAIN_GRACE.as_secs(), "calls still open after the drain grace are closed");
            Ok(())
        }
    };
    sessions.close();
    sessions.wait().await;
    manager.shutdown().await;
    tracing::info!("mentis-runtime stopped");
    result.map_err(ServeError::from)
}
