//! `MENTIS_PREVIEW_BASE_URL`, `MENTIS_PREVIEW_DOMAIN`: how preview URLs are written.

use super::error::{ConfigError, err};

/// `http(s)://host[:port]`, without a path or a trailing slash.
pub(super) fn base_url(v: &str) -> Result<String, ConfigError> {
    let var = "MENTIS_PREVIEW_BASE_URL";
    let uri: http::Uri = v
        .parse()
        .map_err(|_| err(var, v, "not a URL like https://sandboxes.example.com"))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) || uri.host().is_none() {
        return Err(err(var, v, "not an http:// or https:// URL with a host"));
    }
    if uri.path_and_query().is_some_and(|p| p.as_str() != "/") {
        return Err(err(
            var,
            v,
            "must have no path: preview URLs are served at /preview/ (or on their own hosts)",
        ));
    }
    Ok(v.trim_end_matches('/').to_owned())
}

/// A DNS name whose subdomains `<port>-<sandbox>` lead to the HTTP listener, lowercase.
pub(super) fn domain(v: &str) -> Result<String, ConfigError> {
    let var = "MENTIS_PREVIEW_DOMAIN";
    let d = v.trim_end_matches('.').to_ascii_lowercase();
    let label_ok = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
    };
    // Room for the longest `<port>-<sandbox>.` (5 + 1 + 36 + 1) within a name's 253 bytes.
    if d.len() > 253 - 43 || !d.split('.').all(label_ok) {
        return Err(err(
            var,
            v,
            "not a DNS name like preview.example.com (letters, digits, '-', dots)",
        ));
    }
    Ok(d)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn base_urls_and_domains_are_checked() {
        assert_eq!(
            base_url("https://sb.example.com:8443/").unwrap(),
            "https://sb.example.com:8443"
        );
        assert_eq!(
            base_url("http://127.0.0.1:8080").unwrap(),
            "http://127.0.0.1:8080"
        );
        for bad in ["ftp://x", "sb.example.com", "https://x/app", "http://"] {
            assert!(base_url(bad).is_err(), "{bad}");
        }
        assert_eq!(
            domain("Preview.Example.com.").unwrap(),
            "preview.example.com"
        );
        assert_eq!(domain("localhost").unwrap(), "localhost");
        for bad in ["", "a..b", "-a.b", "a_b.c", "x y"] {
            assert!(domain(bad).is_err(), "{bad}");
        }
    }
}
