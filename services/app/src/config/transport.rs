//! `MENTIS_TLS_CERT`, `MENTIS_TLS_KEY`, `MENTIS_TLS_CLIENT_CA`, `MENTIS_MAX_MESSAGE_BYTES`: how the public API
//! is spoken on the wire.

use std::path::PathBuf;

use super::error::{ConfigError, err};

/// gRPC's default limit of a message a server decodes.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 4 * 1024 * 1024;

/// The API over TLS: the server's certificate chain and key (PEM files), and, for mutual TLS, the CA whose
/// certificates clients must present.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

pub(super) fn tls(get: &impl Fn(&str) -> Option<String>) -> Result<Option<TlsFiles>, ConfigError> {
    let var = |name: &str| get(name).filter(|v| !v.is_empty());
    let (cert, key, client_ca) = (
        var("MENTIS_TLS_CERT"),
        var("MENTIS_TLS_KEY"),
        var("MENTIS_TLS_CLIENT_CA"),
    );
    match (cert, key) {
        (Some(cert), Some(key)) => Ok(Some(TlsFiles {
            cert: cert.into(),
            key: key.into(),
            client_ca: client_ca.map(PathBuf::from),
        })),
        (Some(cert), None) => Err(err(
            "MENTIS_TLS_CERT",
            &cert,
            "needs MENTIS_TLS_KEY (the certificate's private key) too",
        )),
        (None, Some(key)) => Err(err(
            "MENTIS_TLS_KEY",
            &key,
            "needs MENTIS_TLS_CERT (the server's certificate chain) too",
        )),
        (None, None) => match client_ca {
            Some(ca) => Err(err(
                "MENTIS_TLS_CLIENT_CA",
                &ca,
                "client certificates are checked over TLS only: set MENTIS_TLS_CERT and MENTIS_TLS_KEY too",
            )),
            None => Ok(None),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tls_of(pairs: &[(&str, &str)]) -> Result<Option<TlsFiles>, ConfigError> {
        tls(&|k: &str| {
            pairs
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn tls_needs_a_certificate_and_its_key_and_a_client_ca_needs_both() {
        assert_eq!(tls_of(&[]).expect("accepted"), None);
        assert_eq!(
            tls_of(&[("MENTIS_TLS_CERT", "c.pem"), ("MENTIS_TLS_KEY", "k.pem")]).expect("accepted"),
            Some(TlsFiles {
                cert: "c.pem".into(),
                key: "k.pem".into(),
                client_ca: None
            })
        );
        let mtls = tls_of(&[
            ("MENTIS_TLS_CERT", "c.pem"),
            ("MENTIS_TLS_KEY", "k.pem"),
            ("MENTIS_TLS_CLIENT_CA", "ca.pem"),
        ])
        .expect("accepted")
        .expect("accepted");
        assert_eq!(mtls.client_ca, Some("ca.pem".into()));
        assert_eq!(
            tls_of(&[("MENTIS_TLS_CERT", "c.pem")])
                .expect_err("refused")
                .var,
            "MENTIS_TLS_CERT"
        );
        assert_eq!(
            tls_of(&[("MENTIS_TLS_KEY", "k.pem")])
                .expect_err("refused")
                .var,
            "MENTIS_TLS_KEY"
        );
        assert_eq!(
            tls_of(&[("MENTIS_TLS_CLIENT_CA", "ca.pem")])
                .expect_err("refused")
                .var,
            "MENTIS_TLS_CLIENT_CA"
        );
    }
}
