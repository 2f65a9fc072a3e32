//! `MENTIS_EGRESS_HOSTS`, `MENTIS_EGRESS_CA_FILES`: what the egress gateway resolves by itself and which
//! CAs it trusts for upstreams besides the host's (docs/EGRESS.md).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;

use super::error::{ConfigError, err};

/// The egress gateway's own settings.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EgressConfig {
    /// Names the gateway answers from here before the host's resolver (lowercase).
    pub hosts: HashMap<String, Vec<Ipv4Addr>>,
    /// PEM files of CAs trusted for upstreams besides the host's trust store.
    pub upstream_ca_files: Vec<PathBuf>,
}

/// `name=1.2.3.4,name=5.6.7.8,other=9.9.9.9`: a name may appear more than once.
pub(super) fn hosts(v: &str) -> Result<HashMap<String, Vec<Ipv4Addr>>, ConfigError> {
    let var = "MENTIS_EGRESS_HOSTS";
    let mut out: HashMap<String, Vec<Ipv4Addr>> = HashMap::new();
    for entry in v.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, addr) = entry
            .split_once('=')
            .ok_or_else(|| err(var, v, "entries are name=IPv4 address, separated by ','"))?;
        let name = mentis_core::egress::parse_domain(name)
            .ok()
            .filter(|d| matches!(d, mentis_core::egress::Domain::Exact(_)))
            .ok_or_else(|| err(var, v, format!("{name} is not a host name")))?;
        let addr: Ipv4Addr = addr
            .trim()
            .parse()
            .map_err(|_| err(var, v, format!("{addr} is not an IPv4 address")))?;
        out.entry(name.to_string()).or_default().push(addr);
    }
    Ok(out)
}

/// Paths separated by ','; each must exist.
pub(super) fn ca_files(v: &str) -> Result<Vec<PathBuf>, ConfigError> {
    let var = "MENTIS_EGRESS_CA_FILES";
    v.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let path = PathBuf::from(p);
            if path.is_file() {
                Ok(path)
            } else {
                Err(err(var, v, format!("{p} is not a file")))
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn hosts_are_names_with_addresses_and_bad_entries_are_refused() {
        let h = hosts("PyPI.test=10.0.0.2, pypi.test=10.0.0.3,api.test=10.0.0.9").unwrap();
        assert_eq!(
            h["pypi.test"],
            [
                "10.0.0.2".parse::<Ipv4Addr>().unwrap(),
                "10.0.0.3".parse().unwrap()
            ]
        );
        assert_eq!(h["api.test"].len(), 1);
        for bad in [
            "pypi.test",
            "*.x.test=1.2.3.4",
            "a.test=::1",
            "a.test=1.2.3",
        ] {
            assert!(hosts(bad).is_err(), "{bad}");
        }
        assert!(ca_files("/nonexistent/ca.pem").is_err());
    }
}
