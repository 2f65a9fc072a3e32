//! `MENTIS_TLS_CERT`, `MENTIS_TLS_KEY`, `MENTIS_TLS_CLIENT_CA`, `MENTIS_MAX_MESSAGE_BYTES`: how the public API
//! is spoken on the wire; `MENTIS_MAX_CONNECTIONS`, `MENTIS_MAX_CONNECTIONS_PER_ADDRESS`,
//! `MENTIS_FIRST_REQUEST_SECS`, `MENTIS_CONNECTION_IDLE_SECS`: what every listener admits.

use std::path::PathBuf;
use std::time::Duration;

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

/// What each listener (the API's, HTTP, health, metrics) admits, so that connections that send nothing, or
/// one client's many, cannot exhaust the runtime's file descriptors or memory (docs/ARCHITECTURE.md,
/// "Security").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// `MENTIS_MAX_CONNECTIONS` (4096): open connections of one listener (health and metrics, which serve
    /// probes and a scraper, admit at most [`SIDE_LISTENER_CONNECTIONS`]); above it a new connection is
    /// closed as soon as it is accepted.
    pub total: usize,
    /// `MENTIS_MAX_CONNECTIONS_PER_ADDRESS` (256): open connections of one listener from one client
    /// address. Behind a proxy or mesh every connection comes from the proxy: raise it there.
    pub per_address: usize,
    /// `MENTIS_FIRST_REQUEST_SECS` (10): a connection whose first request (its headers, after TLS) has not
    /// arrived by then is closed.
    pub first_request: Duration,
    /// `MENTIS_CONNECTION_IDLE_SECS` (300; 0 = never): a connection that carried no byte either way for
    /// this long is closed. gRPC connections see the server's HTTP/2 pings every 30 s, and the web
    /// terminal's sockets the server's WebSocket pings, so only connections whose client is gone, or a
    /// preview tunnel nobody uses, reach it.
    pub idle: Option<Duration>,
}

/// The most connections the health and metrics listeners admit, whatever `MENTIS_MAX_CONNECTIONS` says.
pub const SIDE_LISTENER_CONNECTIONS: usize = 64;

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            total: 4096,
            per_address: 256,
            first_request: Duration::from_secs(10),
            idle: Some(Duration::from_secs(300)),
        }
    }
}

impl ConnectionLimits {
    /// The limits of the health and metrics listeners: these, within [`SIDE_LISTENER_CONNECTIONS`].
    #[must_use]
    pub fn side(self) -> Self {
        Self {
            total: self.total.min(SIDE_LISTENER_CONNECTIONS),
            per_address: self.per_address.min(SIDE_LISTENER_CONNECTIONS / 2),
            ..self
        }
    }
}

pub(super) fn connection_limits(
    get: &impl Fn(&str) -> Option<String>,
) -> Result<ConnectionLimits, ConfigError> {
    let mut limits = ConnectionLimits::default();
    let number = |name: &'static str, value: &str| {
        value
            .parse::<u64>()
            .map_err(|e| err(name, value, e.to_string()))
    };
    let at_least_one = |name: &'static str| -> Result<Option<u64>, ConfigError> {
        match get(name) {
            None => Ok(None),
            Some(v) => match number(name, &v)? {
                0 => Err(err(name, &v, "must be at least 1")),
                n => Ok(Some(n)),
            },
        }
    };
    if let Some(n) = at_least_one("MENTIS_MAX_CONNECTIONS")? {
        limits.total = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = at_least_one("MENTIS_MAX_CONNECTIONS_PER_ADDRESS")? {
        limits.per_address = usize::try_from(n).unwrap_or(usize::MAX);
    }
    if let Some(n) = at_least_one("MENTIS_FIRST_REQUEST_SECS")? {
        limits.first_request = Duration::from_secs(n);
    }
    if let Some(v) = get("MENTIS_CONNECTION_IDLE_SECS") {
        limits.idle = match number("MENTIS_CONNECTION_IDLE_SECS", &v)? {
            0 => None,
            n => Some(Duration::from_secs(n)),
        };
    }
    Ok(limits)
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

    #[test]
    fn connection_limits_have_defaults_and_refuse_zero_where_it_means_nothing() {
        let of = |pairs: &[(&str, &str)]| {
            connection_limits(&|k: &str| {
                pairs
                    .iter()
                    .find(|(name, _)| *name == k)
                    .map(|(_, v)| (*v).to_owned())
            })
        };
        assert_eq!(of(&[]).expect("defaults"), ConnectionLimits::default());
        let set = of(&[
            ("MENTIS_MAX_CONNECTIONS", "100"),
            ("MENTIS_MAX_CONNECTIONS_PER_ADDRESS", "7"),
            ("MENTIS_FIRST_REQUEST_SECS", "3"),
            ("MENTIS_CONNECTION_IDLE_SECS", "0"),
        ])
        .expect("accepted");
        assert_eq!(
            set,
            ConnectionLimits {
                total: 100,
                per_address: 7,
                first_request: Duration::from_secs(3),
                idle: None
            }
        );
        assert_eq!(set.side().total, 64);
        assert_eq!(set.side().per_address, 7);
        for name in [
            "MENTIS_MAX_CONNECTIONS",
            "MENTIS_MAX_CONNECTIONS_PER_ADDRESS",
            "MENTIS_FIRST_REQUEST_SECS",
        ] {
            let e = of(&[(name, "0")]).expect_err("zero refused").to_string();
            assert!(e.contains(name), "{e}");
        }
        assert!(of(&[("MENTIS_MAX_CONNECTIONS", "lots")]).is_err());
    }
}
