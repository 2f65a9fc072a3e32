//! The connection to the runtime: its address, the key every call presents, the generated clients.

use std::path::{Path, PathBuf};

use anyhow::Context;
use mentis_proto::api::{
    action_service_client::ActionServiceClient, file_service_client::FileServiceClient,
    sandbox_service_client::SandboxServiceClient, snapshot_service_client::SnapshotServiceClient,
    space_service_client::SpaceServiceClient, template_service_client::TemplateServiceClient,
    terminal_service_client::TerminalServiceClient,
};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

pub const DEFAULT_ADDR: &str = "http://127.0.0.1:50051";

/// Adds `authorization: Bearer <key>` to every call (no key: no header).
#[derive(Clone)]
pub struct Bearer(Option<MetadataValue<Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

pub type Api = InterceptedService<Channel, Bearer>;

pub struct Conn {
    channel: Api,
}

/// The admin key file the runtime keeps in its data folder (services/runtime/src/auth.rs).
fn admin_key_file() -> PathBuf {
    let dir = std::env::var_os("MENTIS_DATA_DIR")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("mentis-data"));
    dir.join("admin.key")
}

impl Conn {
    /// A channel to `addr` (connected at the first call) presenting `key`, else the admin key file's.
    pub fn new(addr: &str, key: Option<&str>, ca_cert: Option<&Path>) -> anyhow::Result<Self> {
        let addr = if addr.contains("://") {
            addr.to_owned()
        } else {
            format!("http://{addr}")
        };
        let mut endpoint = Endpoint::from_shared(addr.clone())
            .with_context(|| format!("bad address {addr:?} (expected e.g. {DEFAULT_ADDR})"))?
            // HTTP/2 pings find a connection that died without a reset (a long `exec`, `mcp`, `logs -f`).
            .http2_keep_alive_interval(std::time::Duration::from_secs(30))
            .keep_alive_timeout(std::time::Duration::from_secs(20))
            .keep_alive_while_idle(true);
        if addr.starts_with("https://") {
            let mut tls = ClientTlsConfig::new();
            if let Some(ca) = ca_cert {
                let pem = std::fs::read(ca)
                    .with_context(|| format!("reading the CA certificate {}", ca.display()))?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            endpoint = endpoint.tls_config(tls).context("TLS configuration")?;
        }
        let key = match key.filter(|k| !k.is_empty()) {
            Some(k) => Some(k.to_owned()),
            None => std::fs::read_to_string(admin_key_file())
                .ok()
                .map(|k| k.trim().to_owned())
                .filter(|k| !k.is_empty()),
        };
        let header = key
            .map(|k| format!("Bearer {k}").parse())
            .transpose()
            .context("the API key has characters a header cannot carry")?;
        Ok(Self {
            channel: InterceptedService::new(endpoint.connect_lazy(), Bearer(header)),
        })
    }

    pub fn sandboxes(&self) -> SandboxServiceClient<Api> {
        SandboxServiceClient::new(self.channel.clone())
    }

    pub fn actions(&self) -> ActionServiceClient<Api> {
        ActionServiceClient::new(self.channel.clone())
    }

    pub fn files(&self) -> FileServiceClient<Api> {
        FileServiceClient::new(self.channel.clone())
    }

    /// The channel for `mentis-mcp`'s tools.
    pub fn transport(&self) -> mentis_mcp::Transport {
        mentis_mcp::transport(self.channel.clone())
    }

    pub fn terminals(&self) -> TerminalServiceClient<Api> {
        TerminalServiceClient::new(self.channel.clone())
    }

    pub fn snapshots(&self) -> SnapshotServiceClient<Api> {
        SnapshotServiceClient::new(self.channel.clone())
    }

    pub fn templates(&self) -> TemplateServiceClient<Api> {
        TemplateServiceClient::new(self.channel.clone())
    }

    pub fn spaces(&self) -> SpaceServiceClient<Api> {
        SpaceServiceClient::new(self.channel.clone())
    }
}

/// `K=V` pairs of repeatable flags as a map.
pub fn pairs(
    items: &[String],
    what: &str,
) -> anyhow::Result<std::collections::HashMap<String, String>> {
    items
        .iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .with_context(|| format!("{what} {kv:?} is not KEY=VALUE"))
        })
        .collect()
}
