//! Component tests of the egress gateway on loopback: real sockets, real TLS (rustls) and HTTP (hyper), real
//! DNS messages. Two seams are fakes, labelled as such: the policies (`FakePolicies`: one sandbox at
//! 127.0.0.1, its policy and secrets set by the test) and the original destination (`FixedDestination`: what
//! netfilter's REDIRECT would have kept). The e2e tests (tests/e2e/egress.rs) drive the real ones.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use mentis_core::egress::{self, Egress, EgressMode, RuleRequest};
use mentis_core::{SandboxId, SpaceId};
use mentis_gateway::intercept::Interceptor;
use mentis_gateway::{
    Denial, Destinations, Gateway, GatewayConfig, Never, Policies, SandboxPolicy,
};
use rustls::pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UdpSocket};
use tokio_util::sync::CancellationToken;

/// Fake policies: the sandbox at 127.0.0.1 only.
struct FakePolicies {
    sandbox: SandboxId,
    egress: Mutex<Arc<Egress>>,
    secrets: HashMap<String, String>,
    denials: Mutex<Vec<Denial>>,
}

impl Policies for FakePolicies {
    fn policy(&self, source: IpAddr) -> Option<SandboxPolicy> {
        (source == IpAddr::V4(Ipv4Addr::LOCALHOST)).then(|| SandboxPolicy {
            sandbox: self.sandbox,
            space: SpaceId::default_space(),
            egress: self.egress.lock().unwrap().clone(),
        })
    }
    fn secret(&self, _space: &SpaceId, name: &str) -> Option<String> {
        self.secrets.get(name).cloned()
    }
    fn denied(&self, sandbox: SandboxId, denial: Denial) {
        assert_eq!(sandbox, self.sandbox);
        self.denials.lock().unwrap().push(denial);
    }
}

/// Fake original destination: the address the test says the connection was for.
struct FixedDestination(Mutex<SocketAddrV4>);

impl Destinations for FixedDestination {
    fn original(&self, _stream: &TcpStream) -> std::io::Result<SocketAddrV4> {
        Ok(*self.0.lock().unwrap())
    }
}

fn rule(domain: &str, cidr: &str, ports: &[u16], headers: &[(&str, &str)]) -> RuleRequest {
    RuleRequest {
        domain: domain.into(),
        cidr: cidr.into(),
        ports: ports.iter().map(|p| u32::from(*p)).collect(),
        headers: headers
            .iter()
            .map(|(n, v)| ((*n).to_owned(), (*v).to_owned()))
            .collect(),
    }
}

fn policy(rules: Vec<RuleRequest>) -> Arc<Egress> {
    Arc::new(egress::validate(Some(EgressMode::Rules), rules, &Egress::Deny, "egress").unwrap())
}

/// A test CA and a server certificate for `names` signed by it.
struct TestPki {
    ca_pem: String,
    server: Arc<rustls::ServerConfig>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn test_pki(names: &[&str]) -> TestPki {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::default();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "test upstream CA");
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::new(ca, ca_key);
    let key = rcgen::KeyPair::generate().unwrap();
    let params =
        rcgen::CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())
            .unwrap();
    let cert = params.signed_by(&key, &issuer).unwrap();
    let server = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(
            vec![cert.der().clone()],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
        )
        .unwrap();
    TestPki {
        ca_pem: ca_cert.pem(),
        server: Arc::new(server),
    }
}

fn client_config(ca_pem: &str) -> Arc<rustls::ClientConfig> {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls::pki_types::CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(c.unwrap()).unwrap();
    }
    Arc::new(
        rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

/// What an upstream HTTP server saw: each request's path and Authorization header.
type Seen = Arc<Mutex<Vec<(String, Option<String>)>>>;

/// An HTTP server (over TLS when `tls` is given) on loopback that answers "hello from <path>".
async fn upstream(tls: Option<Arc<rustls::ServerConfig>>, seen: Seen) -> (u16, CancellationToken) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let cancel = CancellationToken::new();
    let stop = cancel.clone();
    tokio::spawn(async move {
        loop {
            let (stream, _) = tokio::select! {
                () = stop.cancelled() => return,
                a = listener.accept() => a.unwrap(),
            };
            let seen = seen.clone();
            let tls = tls.clone();
            tokio::spawn(async move {
                let service = hyper::service::service_fn(
                    move |req: hyper::Request<hyper::body::Incoming>| {
                        let seen = seen.clone();
                        async move {
                            let auth = req
                                .headers()
                                .get("authorization")
                                .map(|v| v.to_str().unwrap().to_owned());
                            seen.lock()
                                .unwrap()
                                .push((req.uri().path().to_owned(), auth));
                            Ok::<_, hyper::Error>(hyper::Response::new(Full::new(Bytes::from(
                                format!("hello from {}", req.uri().path()),
                            ))))
                        }
                    },
                );
                let builder = hyper::server::conn::http1::Builder::new();
                match tls {
                    Some(config) => {
                        let Ok(s) = tokio_rustls::TlsAcceptor::from(config).accept(stream).await
                        else {
                            return;
                        };
                        let _ = builder.serve_connection(TokioIo::new(s), service).await;
                    }
                    None => {
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                }
            });
        }
    });
    (port, cancel)
}

struct Fixture {
    policies: Arc<FakePolicies>,
    destination: Arc<FixedDestination>,
    tcp: SocketAddr,
    dns: SocketAddr,
    ca_pem: String,
    cancel: CancellationToken,
    run: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

impl Fixture {
    async fn start(rules: Vec<RuleRequest>, hosts: &[(&str, Ipv4Addr)]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let policies = Arc::new(FakePolicies {
            sandbox: SandboxId::new(),
            egress: Mutex::new(policy(rules)),
            secrets: HashMap::from([("TOKEN".to_owned(), "s3cret-value".to_owned())]),
            denials: Mutex::new(Vec::new()),
        });
        let destination = Arc::new(FixedDestination(Mutex::new(SocketAddrV4::new(
            Ipv4Addr::new(203, 0, 113, 9),
            443,
        ))));
        let mut config = GatewayConfig::new(
            "127.0.0.1:0".parse().unwrap(),
            "127.0.0.1:0".parse().unwrap(),
            Vec::new(),
        )
        .unwrap();
        // Loopback is where this test's upstreams are: nothing is never-reachable here.
        config.never = Never::default();
        config.sniff_timeout = Duration::from_secs(2);
        config.hosts = hosts
            .iter()
            .map(|(n, a)| ((*n).to_owned(), vec![*a]))
            .collect();
        let interceptor = Interceptor::load_or_create(dir.path(), upstream_roots()).unwrap();
        let ca_pem = interceptor.ca_pem().to_owned();
        config.intercept = Some(Arc::new(interceptor));
        let gateway = Gateway::bind(config, policies.clone(), destination.clone())
            .await
            .unwrap();
        let (tcp, dns) = (gateway.tcp_addr().unwrap(), gateway.dns_addr().unwrap());
        let cancel = CancellationToken::new();
        let run = tokio::spawn(gateway.run(cancel.clone()));
        Self {
            policies,
            destination,
            tcp,
            dns,
            ca_pem,
            cancel,
            run,
            _dir: dir,
        }
    }

    fn going_to(&self, addr: Ipv4Addr, port: u16) {
        *self.destination.0.lock().unwrap() = SocketAddrV4::new(addr, port);
    }

    fn denials(&self) -> Vec<Denial> {
        self.policies.denials.lock().unwrap().clone()
    }

    async fn stop(self) {
        self.cancel.cancel();
        tokio::time::timeout(Duration::from_secs(5), self.run)
            .await
            .unwrap()
            .unwrap();
    }
}

static UPSTREAM_CA: Mutex<Option<String>> = Mutex::new(None);

fn upstream_roots() -> rustls::RootCertStore {
    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    if let Some(pem) = UPSTREAM_CA.lock().unwrap().as_ref() {
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(pem.as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
    }
    roots
}

/// GET `path` over TLS to the gateway with server name `name`, trusting `ca_pem`; the body, or the error.
async fn https_get(
    gateway: SocketAddr,
    name: &str,
    ca_pem: &str,
    path: &str,
) -> Result<String, String> {
    let stream = TcpStream::connect(gateway)
        .await
        .map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(client_config(ca_pem))
        .connect(ServerName::try_from(name.to_owned()).unwrap(), stream)
        .await
        .map_err(|e| e.to_string())?;
    http_get(tls, name, path).await
}

async fn http_get<S>(stream: S, name: &str, path: &str) -> Result<String, String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    let driver = tokio::spawn(conn);
    let req = hyper::Request::get(path)
        .header("host", name)
        .body(Empty::<Bytes>::new())
        .unwrap();
    let result = async {
        let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
        let body = resp
            .into_body()
            .collect()
            .await
            .map_err(|e| e.to_string())?;
        Ok(String::from_utf8_lossy(&body.to_bytes()).into_owned())
    }
    .await;
    driver.abort();
    result
}

#[tokio::test]
async fn an_allowed_name_passes_through_tls_untouched_and_others_are_refused_with_a_denial() {
    let pki = test_pki(&["api.test", "other.test"]);
    let seen = Seen::default();
    let (port, up) = upstream(Some(pki.server.clone()), seen.clone()).await;
    let f = Fixture::start(
        vec![rule("api.test", "", &[port], &[])],
        &[
            ("api.test", Ipv4Addr::LOCALHOST),
            ("other.test", Ipv4Addr::LOCALHOST),
        ],
    )
    .await;
    // The sandbox asked for some address: the gateway connects to the name as it resolves it.
    f.going_to(Ipv4Addr::new(198, 51, 100, 1), port);
    let body = https_get(f.tcp, "api.test", &pki.ca_pem, "/a")
        .await
        .unwrap();
    assert_eq!(body, "hello from /a");
    // The upstream's own certificate reached the client: TLS was not ended on the way.
    assert_eq!(seen.lock().unwrap().as_slice(), [("/a".to_owned(), None)]);

    let refused = https_get(f.tcp, "other.test", &pki.ca_pem, "/b").await;
    assert!(refused.is_err(), "{refused:?}");
    // Another port for the allowed name is refused too.
    f.going_to(Ipv4Addr::new(198, 51, 100, 1), port + 1);
    assert!(
        https_get(f.tcp, "api.test", &pki.ca_pem, "/c")
            .await
            .is_err()
    );
    let denials = f.denials();
    assert_eq!(denials.len(), 2, "{denials:?}");
    assert_eq!(denials[0].protocol, "tls");
    assert_eq!(denials[0].name.as_deref(), Some("other.test"));
    assert_eq!(
        denials[0].reason,
        format!("no rule allows other.test on port {port}")
    );
    assert_eq!(
        denials[1].reason,
        format!("no rule allows api.test on port {}", port + 1)
    );
    assert_eq!(seen.lock().unwrap().len(), 1);
    f.stop().await;
    up.cancel();
}

#[tokio::test]
async fn plain_http_is_decided_by_its_host_and_a_forged_host_reaches_only_the_named_server() {
    let seen = Seen::default();
    let (port, up) = upstream(None, seen.clone()).await;
    let f = Fixture::start(
        vec![rule("pkg.test", "", &[port], &[])],
        &[("pkg.test", Ipv4Addr::LOCALHOST)],
    )
    .await;
    f.going_to(Ipv4Addr::new(192, 0, 2, 50), port);
    let stream = TcpStream::connect(f.tcp).await.unwrap();
    assert_eq!(
        http_get(stream, "pkg.test:80", "/simple/").await.unwrap(),
        "hello from /simple/"
    );
    let stream = TcpStream::connect(f.tcp).await.unwrap();
    assert!(http_get(stream, "evil.test", "/").await.is_err());
    let denials = f.denials();
    assert_eq!(denials.len(), 1);
    assert_eq!(denials[0].protocol, "http");
    assert_eq!(
        denials[0].address,
        Some(SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 50), port))
    );
    f.stop().await;
    up.cancel();
}

#[tokio::test]
async fn a_network_rule_passes_any_protocol_and_other_protocols_without_one_are_refused() {
    // A raw TCP echo server.
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let echo = tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    let f = Fixture::start(vec![rule("", "127.0.0.0/8", &[port], &[])], &[]).await;
    f.going_to(Ipv4Addr::LOCALHOST, port);
    let mut s = TcpStream::connect(f.tcp).await.unwrap();
    s.write_all(b"SSH-2.0-test\r\n").await.unwrap();
    let mut buf = [0u8; 14];
    s.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"SSH-2.0-test\r\n");
    drop(s);
    // Another port of the same network: the bytes name nothing, so it is refused and closed.
    f.going_to(Ipv4Addr::LOCALHOST, port + 1);
    let mut s = TcpStream::connect(f.tcp).await.unwrap();
    s.write_all(b"SSH-2.0-test\r\n").await.unwrap();
    let mut rest = Vec::new();
    let n = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap_or(0);
    assert_eq!(n, 0);
    let denials = f.denials();
    assert_eq!(denials.len(), 1, "{denials:?}");
    assert!(
        denials[0]
            .reason
            .contains("only a cidr rule allows other protocols"),
        "{denials:?}"
    );
    f.stop().await;
    echo.abort();
}

#[tokio::test]
async fn headers_with_secrets_are_set_by_the_gateway_over_its_own_tls() {
    let pki = test_pki(&["api.test"]);
    *UPSTREAM_CA.lock().unwrap() = Some(pki.ca_pem.clone());
    let seen = Seen::default();
    let (port, up) = upstream(Some(pki.server.clone()), seen.clone()).await;
    let f = Fixture::start(
        vec![rule(
            "api.test",
            "",
            &[port],
            &[("Authorization", "Bearer {secret:TOKEN}")],
        )],
        &[("api.test", Ipv4Addr::LOCALHOST)],
    )
    .await;
    f.going_to(Ipv4Addr::new(198, 51, 100, 1), port);
    // The client trusts the gateway's CA (as sandboxes do), not the upstream's.
    let body = https_get(f.tcp, "api.test", &f.ca_pem, "/user")
        .await
        .unwrap();
    assert_eq!(body, "hello from /user");
    assert_eq!(
        seen.lock().unwrap().as_slice(),
        [("/user".to_owned(), Some("Bearer s3cret-value".to_owned()))]
    );
    // A client that trusts only the upstream's CA cannot be fooled into thinking it reached it directly.
    assert!(
        https_get(f.tcp, "api.test", &pki.ca_pem, "/x")
            .await
            .is_err()
    );
    f.stop().await;
    up.cancel();
}

#[tokio::test]
async fn dns_answers_allowed_names_only_and_refuses_strangers() {
    let f = Fixture::start(
        vec![rule("*.pkg.test", "", &[], &[])],
        &[("files.pkg.test", Ipv4Addr::new(10, 20, 30, 40))],
    )
    .await;
    let ask = |from: &'static str, name: &'static str, kind: RecordType| {
        let dns = f.dns;
        async move {
            let socket = UdpSocket::bind(from).await.unwrap();
            let mut m = Message::new(99, MessageType::Query, OpCode::Query);
            m.add_query(Query::query(Name::from_ascii(name).unwrap(), kind));
            socket.send_to(&m.to_vec().unwrap(), dns).await.unwrap();
            let mut buf = [0u8; 1500];
            let (n, _) = tokio::time::timeout(Duration::from_secs(5), socket.recv_from(&mut buf))
                .await
                .unwrap()
                .unwrap();
            Message::from_vec(&buf[..n]).unwrap()
        }
    };
    let r = ask("127.0.0.1:0", "FILES.pkg.test.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert_eq!(r.answers.len(), 1);
    assert!(matches!(r.answers[0].data, RData::A(a) if a.0 == Ipv4Addr::new(10, 20, 30, 40)));
    let r = ask("127.0.0.1:0", "files.pkg.test.", RecordType::AAAA).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NoError);
    assert!(r.answers.is_empty());
    let r = ask("127.0.0.1:0", "pkg.test.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
    let r = ask("127.0.0.1:0", "data.tunnel.example.", RecordType::TXT).await;
    assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
    // Not a sandbox the gateway knows.
    let r = ask("127.0.0.2:0", "files.pkg.test.", RecordType::A).await;
    assert_eq!(r.metadata.response_code, ResponseCode::Refused);
    let names: Vec<_> = f
        .denials()
        .into_iter()
        .map(|d| (d.protocol, d.name))
        .collect();
    assert_eq!(
        names,
        [
            ("dns", Some("pkg.test".to_owned())),
            ("dns", Some("data.tunnel.example".to_owned()))
        ]
    );
    f.stop().await;
}

#[tokio::test]
async fn a_changed_policy_is_in_force_for_the_next_connection() {
    let seen = Seen::default();
    let (port, up) = upstream(None, seen.clone()).await;
    let f = Fixture::start(vec![], &[("late.test", Ipv4Addr::LOCALHOST)]).await;
    f.going_to(Ipv4Addr::new(192, 0, 2, 1), port);
    let s = TcpStream::connect(f.tcp).await.unwrap();
    assert!(http_get(s, "late.test", "/").await.is_err());
    *f.policies.egress.lock().unwrap() = policy(vec![rule("late.test", "", &[port], &[])]);
    let s = TcpStream::connect(f.tcp).await.unwrap();
    assert_eq!(
        http_get(s, "late.test", "/now").await.unwrap(),
        "hello from /now"
    );
    f.stop().await;
    up.cancel();
}
