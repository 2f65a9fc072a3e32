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

/// Where the CLI reached for the runtime and its key, for the hints of a failed call.
#[derive(Debug, Clone)]
pub struct Reach {
    /// The address as the channel dials it (`http://127.0.0.1:50051`).
    pub addr: String,
    /// Where the key came from: `--api-key`/`MENTIS_API_KEY`, the admin key file, or nowhere.
    pub key: KeySource,
}

#[derive(Debug, Clone)]
pub enum KeySource {
    Given,
    File(PathBuf),
    /// No key was given and this admin key file could not be read.
    Missing(PathBuf),
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
        let addr = full_addr(addr);
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
        let (key, _) = find_key(key);
        let header = key
            .map(|k| format!("Bearer {k}").parse())
            .transpose()
            .context("the API key has characters a header cannot carry")?;
        Ok(Self {
            channel: InterceptedService::new(endpoint.connect_lazy(), Bearer(header)),
        })
    }

    /// The sandbox `typed` names: a whole id as it is; else the one sandbox whose id starts with it, as
    /// Docker takes a prefix of a container's id. NOT_FOUND when none does; several: a usage error that
    /// lists them.
    pub async fn sandbox_id(&self, typed: &str) -> crate::error::Result<String> {
        let prefix = typed.to_ascii_lowercase();
        if uuid::Uuid::parse_str(typed).is_ok()
            || prefix.is_empty()
            || !prefix.chars().all(|c| c.is_ascii_hexdigit() || c == '-')
        {
            // A whole id, or something that is no id at all: the runtime says what is wrong with it.
            return Ok(typed.to_owned());
        }
        let mut ids = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = self
                .sandboxes()
                .list_sandboxes(mentis_proto::api::ListSandboxesRequest {
                    page_size: 1000,
                    page_token,
                    ..Default::default()
                })
                .await?
                .into_inner();
            ids.extend(page.sandboxes.into_iter().map(|s| s.sandbox_id));
            if page.next_page_token.is_empty() {
                break;
            }
            page_token = page.next_page_token;
        }
        pick(typed, ids)
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

/// The one of `ids` that starts with `typed` (any case): NOT_FOUND for none, a usage error listing them
/// for several.
fn pick(typed: &str, ids: Vec<String>) -> crate::error::Result<String> {
    let prefix = typed.to_ascii_lowercase();
    let mut found: Vec<String> = ids
        .into_iter()
        .filter(|id| id.starts_with(&prefix))
        .collect();
    match found.len() {
        0 => Err(tonic::Status::not_found(format!(
            "no sandbox has an id starting with {typed:?} (`mentis sandbox list` lists them)"
        ))
        .into()),
        1 => Ok(found.remove(0)),
        n => Err(crate::error::Failure::Usage(format!(
            "{typed:?} is the start of {n} sandboxes' ids ({}): type more of it",
            found.join(", ")
        ))),
    }
}

/// The address with a scheme (`127.0.0.1:50051` is `http://127.0.0.1:50051`).
pub fn full_addr(addr: &str) -> String {
    if addr.contains("://") {
        addr.to_owned()
    } else {
        format!("http://{addr}")
    }
}

/// The key to present, and where it came from: `given`, else the admin key file's.
pub fn find_key(given: Option<&str>) -> (Option<String>, KeySource) {
    if let Some(k) = given.filter(|k| !k.is_empty()) {
        return (Some(k.to_owned()), KeySource::Given);
    }
    let file = admin_key_file();
    match std::fs::read_to_string(&file)
        .ok()
        .map(|k| k.trim().to_owned())
        .filter(|k| !k.is_empty())
    {
        Some(k) => (Some(k), KeySource::File(file)),
        None => (None, KeySource::Missing(file)),
    }
}

impl Reach {
    pub fn new(addr: &str, key: Option<&str>) -> Self {
        Self {
            addr: full_addr(addr),
            key: find_key(key).1,
        }
    }

    /// What to do about a call that failed with `status`, when the cause is likely on this side: the
    /// runtime not running at the address, or no key.
    pub fn hint(&self, status: &tonic::Status) -> Option<String> {
        match status.code() {
            tonic::Code::Unavailable if is_connect_failure(status) => Some(format!(
                "is the runtime running at {}? Start one with `make run` (docs/CLI.md), or point \
                 --addr or MENTIS_ADDR at it",
                self.addr
            )),
            tonic::Code::Unauthenticated => Some(match &self.key {
                KeySource::Given => "the key given by --api-key or MENTIS_API_KEY was refused: \
                                     is it a key of this runtime (its admin key file, or one made \
                                     with CreateApiKey)?"
                    .to_owned(),
                KeySource::File(f) => format!(
                    "the admin key file {} holds a key this runtime refused: is it the file of the \
                     runtime at {}? Set MENTIS_DATA_DIR to its data folder, or give a key with \
                     --api-key or MENTIS_API_KEY",
                    f.display(),
                    self.addr
                ),
                KeySource::Missing(f) => format!(
                    "no key was sent: give one with --api-key or MENTIS_API_KEY, or let mentis read \
                     the runtime's admin key file (looked for at {}; MENTIS_DATA_DIR is its folder)",
                    f.display()
                ),
            }),
            _ => None,
        }
    }
}

/// Whether a call failed because no connection could be made (the address, not the call).
fn is_connect_failure(status: &tonic::Status) -> bool {
    let text = format!("{}{}", status.message(), causes(status));
    text.contains("tcp connect error")
        || text.contains("Connection refused")
        || text.contains("dns error")
        || text.contains("No route to host")
}

/// The chain of causes under a status's message (`tcp connect error: Connection refused (os error 111)`).
pub fn causes(status: &tonic::Status) -> String {
    let mut text = String::new();
    let mut source = std::error::Error::source(status);
    while let Some(e) = source {
        let s = e.to_string();
        if !status.message().contains(&s) && !text.contains(&s) {
            text.push_str(&format!(": {s}"));
        }
        source = e.source();
    }
    text
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Failure;

    #[test]
    fn a_prefix_names_the_one_sandbox_it_starts_and_says_when_it_starts_none_or_several() {
        let ids = || {
            [
                "8fe0d6af-1111-4000-8000-000000000001",
                "8fe0d6af-2222-4000-8000-000000000002",
                "3c2b0000-3333-4000-8000-000000000003",
            ]
            .map(str::to_owned)
            .to_vec()
        };
        assert!(matches!(pick("3c", ids()), Ok(id) if id.starts_with("3c2b")));
        assert!(matches!(pick("8FE0D6AF-2", ids()), Ok(id) if id.contains("-2222-")));
        match pick("8fe0d6af", ids()) {
            Err(Failure::Usage(m)) => {
                assert!(
                    m.contains("2 sandboxes") && m.contains("-1111-") && m.contains("-2222-"),
                    "{m}"
                )
            }
            other => panic!("not ambiguous: {other:?}"),
        }
        match pick("ab", ids()) {
            Err(Failure::Rpc(s)) => assert_eq!(s.code(), tonic::Code::NotFound),
            other => panic!("found: {other:?}"),
        }
    }
}
