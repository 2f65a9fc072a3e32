//! Headers set outside the sandbox (docs/EGRESS.md, "Secrets"). For a domain rule with headers the gateway
//! ends the sandbox's TLS itself, with a certificate for that name signed by the runtime's own CA (made once
//! per data folder; sandboxes trust it), sets the rule's headers on each HTTP/1.1 request (secrets put in
//! here, never sent into the sandbox), and sends it on over TLS to the name's server, verified as usual. Plain
//! HTTP to such a name gets the headers the same way, without TLS.

use std::collections::HashMap;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{HeaderName, HeaderValue};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use mentis_core::egress::EgressRule;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

/// The CA's certificate in the data folder (public: sandboxes get it).
pub const CA_CERT_FILE: &str = "egress-ca.pem";
/// Its key (0600).
pub const CA_KEY_FILE: &str = "egress-ca.key";
const CA_NAME: &str = "MentisSandbox egress gateway CA";

/// The rule's headers with its secrets put in; `Err(name)` for a secret the space does not have (or whose
/// value cannot be a header).
pub fn render(
    rule: &EgressRule,
    secret: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(HeaderName, HeaderValue)>, String> {
    let mut out = Vec::with_capacity(rule.headers.len());
    for h in &rule.headers {
        let missing = || h.secrets().next().unwrap_or("").to_owned();
        let value = h.render(&secret).ok_or_else(missing)?;
        let name = HeaderName::from_bytes(h.name.as_bytes()).map_err(|_| missing())?;
        let mut value = HeaderValue::from_str(&value).map_err(|_| missing())?;
        value.set_sensitive(true);
        out.push((name, value));
    }
    Ok(out)
}

/// The CA and what it signs.
pub struct Interceptor {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    ca_pem: String,
    /// Certificates made so far, by name.
    certs: Mutex<HashMap<String, Arc<rustls::sign::CertifiedKey>>>,
    upstream: Arc<rustls::ClientConfig>,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl std::fmt::Debug for Interceptor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interceptor").finish_non_exhaustive()
    }
}

fn ca_params() -> rcgen::CertificateParams {
    let mut params = rcgen::CertificateParams::default();
    params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Constrained(0));
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, CA_NAME);
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::KeyCertSign,
        rcgen::KeyUsagePurpose::CrlSign,
        rcgen::KeyUsagePurpose::DigitalSignature,
    ];
    params
}

fn invalid(what: &str, e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("{what}: {e}"))
}

impl Interceptor {
    /// The CA in `dir` (made there at the first call: the key 0600), and `roots` to verify upstreams with.
    pub fn load_or_create(dir: &Path, roots: rustls::RootCertStore) -> io::Result<Self> {
        let cert_path = dir.join(CA_CERT_FILE);
        let key_path = dir.join(CA_KEY_FILE);
        let (key, ca_pem) = if key_path.exists() && cert_path.exists() {
            let key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(&key_path)?)
                .map_err(|e| invalid("the egress CA's key", e))?;
            (key, std::fs::read_to_string(&cert_path)?)
        } else {
            let key = rcgen::KeyPair::generate().map_err(|e| invalid("an egress CA key", e))?;
            let mut params = ca_params();
            params.not_before = rcgen::date_time_ymd(2025, 1, 1);
            params.not_after = rcgen::date_time_ymd(2045, 1, 1);
            let cert = params
                .self_signed(&key)
                .map_err(|e| invalid("the egress CA", e))?;
            write_private(&key_path, key.serialize_pem().as_bytes())?;
            std::fs::write(&cert_path, cert.pem())?;
            (key, cert.pem())
        };
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let upstream = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("TLS", e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut upstream = upstream;
        upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            issuer: rcgen::Issuer::new(ca_params(), key),
            ca_pem,
            certs: Mutex::new(HashMap::new()),
            upstream: Arc::new(upstream),
            provider,
        })
    }

    /// The CA's certificate (PEM), for sandboxes' trust stores.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    fn cert_for(&self, name: &str) -> io::Result<Arc<rustls::sign::CertifiedKey>> {
        if let Some(c) = self
            .certs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
        {
            return Ok(c.clone());
        }
        let key = rcgen::KeyPair::generate().map_err(|e| invalid("a key", e))?;
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()])
            .map_err(|e| invalid("a certificate", e))?;
        params.not_before = rcgen::date_time_ymd(2025, 1, 1);
        params.not_after = rcgen::date_time_ymd(2045, 1, 1);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let cert = params
            .signed_by(&key, &self.issuer)
            .map_err(|e| invalid("a certificate", e))?;
        let der_key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let signing = self
            .provider
            .key_provider
            .load_private_key(der_key)
            .map_err(|e| invalid("a key", e))?;
        let certified = Arc::new(rustls::sign::CertifiedKey::new(
            vec![cert.der().clone()],
            signing,
        ));
        let mut certs = self.certs.lock().unwrap_or_else(|p| p.into_inner());
        // Bounded: a sandbox naming many hosts makes many; they are cheap to make again.
        if certs.len() >= 1024 {
            certs.clear();
        }
        certs.insert(name.to_owned(), certified.clone());
        Ok(certified)
    }

    /// Serves one connection: `head` is what was already read from `client`; `upstream` is connected to
    /// the name's server. `tls`: the client speaks TLS (and so does the upstream).
    pub async fn serve(
        &self,
        client: TcpStream,
        head: Vec<u8>,
        upstream: TcpStream,
        name: &str,
        tls: bool,
        headers: Vec<(HeaderName, HeaderValue)>,
    ) {
        let client = Prefixed {
            head,
            at: 0,
            inner: client,
        };
        let result = if tls {
            self.serve_tls(client, upstream, name, headers).await
        } else {
            proxy(client, upstream, headers).await
        };
        if let Err(e) = result {
            tracing::debug!(%name, error = %e, "egress gateway: an intercepted connection ended");
        }
    }

    async fn serve_tls(
        &self,
        client: Prefixed,
        upstream: TcpStream,
        name: &str,
        headers: Vec<(HeaderName, HeaderValue)>,
    ) -> io::Result<()> {
        let certified = self.cert_for(name)?;
        let mut server = rustls::ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid("TLS", e))?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(rustls::sign::SingleCertAndKey::from(
                certified.as_ref().clone(),
            )));
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let client = tokio_rustls::TlsAcceptor::from(Arc::new(server))
            .accept(client)
            .await?;
        let server_name =
            ServerName::try_from(name.to_owned()).map_err(|e| invalid("a server name", e))?;
        let upstream = tokio_rustls::TlsConnector::from(self.upstream.clone())
            .connect(server_name, upstream)
            .await?;
        proxy(client, upstream, headers).await
    }
}

/// HTTP/1.1 from `client` to `upstream`, request by request, with `headers` set on each.
async fn proxy<C, U>(
    client: C,
    upstream: U,
    headers: Vec<(HeaderName, HeaderValue)>,
) -> io::Result<()>
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (sender, upstream_conn) =
        hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(upstream))
            .await
            .map_err(io::Error::other)?;
    let sender = Arc::new(tokio::sync::Mutex::new(sender));
    let headers = Arc::new(headers);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let sender = sender.clone();
        let headers = headers.clone();
        async move {
            for (name, value) in headers.iter() {
                req.headers_mut().insert(name.clone(), value.clone());
            }
            let mut sender = sender.lock().await;
            sender.ready().await?;
            sender.send_request(req).await
        }
    });
    let server_conn = hyper::server::conn::http1::Builder::new()
        .keep_alive(true)
        .serve_connection(TokioIo::new(client), service);
    let mut server_conn = std::pin::pin!(server_conn);
    let mut upstream_conn = std::pin::pin!(upstream_conn);
    // Both connections are driven here; once the upstream is done, the client's side finishes what it
    // has (a later request gets an error).
    tokio::select! {
        r = &mut server_conn => return r.map_err(io::Error::other),
        _ = &mut upstream_conn => {}
    }
    server_conn.await.map_err(io::Error::other)
}

fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}

/// A stream whose first bytes were read already: they are read again first.
struct Prefixed {
    head: Vec<u8>,
    at: usize,
    inner: TcpStream,
}

impl AsyncRead for Prefixed {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.at < self.head.len() {
            let n = buf.remaining().min(self.head.len() - self.at);
            let at = self.at;
            buf.put_slice(&self.head[at..at + n]);
            self.at += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Prefixed {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Roots for upstreams: the host's trust store and the PEM files named.
pub fn roots(extra: &[&Path]) -> io::Result<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_native_certs::load_native_certs().certs {
        let _ = roots.add(cert);
    }
    for path in extra {
        let pem = std::fs::read(path)?;
        for cert in rustls_pemfile_certs(&pem) {
            roots
                .add(cert)
                .map_err(|e| invalid(&format!("a certificate in {}", path.display()), e))?;
        }
    }
    Ok(roots)
}

/// The certificates of a PEM file.
fn rustls_pemfile_certs(pem: &[u8]) -> Vec<CertificateDer<'static>> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem)
        .filter_map(Result::ok)
        .collect()
}
