//! Certificates the TLS tests make (rcgen), and TLS clients of a runtime or a proxy on localhost.

use std::path::PathBuf;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

/// A CA, a server certificate for localhost and 127.0.0.1 and a client certificate it signed, and a
/// second CA that signed nothing of ours; as PEM files in `dir`.
pub struct Pki {
    dir: tempfile::TempDir,
    pub ca: String,
    pub other_ca: String,
    pub client_cert: String,
    pub client_key: String,
}

fn new_ca(name: &str) -> anyhow::Result<(String, Issuer<'static, KeyPair>)> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate()?;
    let cert = params.self_signed(&key)?;
    Ok((cert.pem(), Issuer::new(params, key)))
}

fn leaf(
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
    issuer: &Issuer<'static, KeyPair>,
) -> anyhow::Result<(String, String)> {
    let mut params =
        CertificateParams::new(names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>())?;
    params.distinguished_name.push(DnType::CommonName, names[0]);
    params.extended_key_usages.push(usage);
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, issuer)?;
    Ok((cert.pem(), key.serialize_pem()))
}

impl Pki {
    pub fn make() -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let (ca, issuer) = new_ca("mentis test CA")?;
        let (other_ca, _) = new_ca("another CA")?;
        let (server_cert, server_key) = leaf(
            &["localhost", "127.0.0.1"],
            ExtendedKeyUsagePurpose::ServerAuth,
            &issuer,
        )?;
        let (client_cert, client_key) =
            leaf(&["agent-1"], ExtendedKeyUsagePurpose::ClientAuth, &issuer)?;
        for (name, pem) in [
            ("ca.pem", &ca),
            ("server.pem", &server_cert),
            ("server.key", &server_key),
            ("client.pem", &client_cert),
            ("client.key", &client_key),
        ] {
            std::fs::write(dir.path().join(name), pem)?;
        }
        Ok(Self {
            dir,
            ca,
            other_ca,
            client_cert,
            client_key,
        })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

pub async fn channel(port: u16, tls: ClientTlsConfig) -> anyhow::Result<Channel> {
    mentis_runtime::install_crypto_provider();
    Ok(Endpoint::from_shared(format!("https://localhost:{port}"))?
        .tls_config(tls)?
        .connect()
        .await?)
}

pub fn trusting(ca: &str) -> ClientTlsConfig {
    ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost")
}

/// Whether a health check through `channel` gets an answer.
pub async fn answers(channel: Channel) -> bool {
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest::default())
        .await
        .is_ok()
}
