//! What a connection is for, from its first bytes: a TLS ClientHello's server name (read by rustls'
//! `Acceptor`, so no parser of our own) or an HTTP request's Host (httparse). The bytes read are kept: a
//! connection passed through sends them upstream first.

use tokio::io::{AsyncRead, AsyncReadExt};

/// At most this much is read before a connection must have said what it is for.
pub const MAX_HELLO: usize = 16 * 1024;

/// What the first bytes said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sniffed {
    /// A TLS ClientHello, with its server name when it sent one.
    Tls(Option<String>),
    /// An HTTP/1 request, with its Host (without a port) when it sent one.
    Http(Option<String>),
    /// Neither (or the client closed first).
    Other,
}

/// Reads from `stream` until its first bytes say what it is; returns that and every byte read.
pub async fn sniff<S: AsyncRead + Unpin>(stream: &mut S) -> std::io::Result<(Sniffed, Vec<u8>)> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok((Sniffed::Other, buf));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(sniffed) = decide(&buf) {
            return Ok((sniffed, buf));
        }
        if buf.len() >= MAX_HELLO {
            return Ok((Sniffed::Other, buf));
        }
    }
}

/// What `buf` is, or `None` while more bytes are needed.
pub fn decide(buf: &[u8]) -> Option<Sniffed> {
    let first = *buf.first()?;
    // A TLS record of type handshake.
    if first == 0x16 {
        return tls(buf);
    }
    if first.is_ascii_uppercase() {
        return http(buf);
    }
    Some(Sniffed::Other)
}

fn tls(buf: &[u8]) -> Option<Sniffed> {
    let mut acceptor = rustls::server::Acceptor::default();
    let mut reader = buf;
    // The acceptor takes whole records; what it has not seen yet is fed on the next call.
    while !reader.is_empty() {
        match acceptor.read_tls(&mut reader) {
            Ok(0) => break,
            Ok(_) => {}
            Err(_) => return Some(Sniffed::Other),
        }
    }
    match acceptor.accept() {
        Ok(Some(accepted)) => Some(Sniffed::Tls(
            accepted
                .client_hello()
                .server_name()
                .map(mentis_core::egress::normal_name),
        )),
        Ok(None) => None,
        Err(_) => Some(Sniffed::Tls(None)),
    }
}

fn http(buf: &[u8]) -> Option<Sniffed> {
    let mut headers = [httparse::EMPTY_HEADER; 64];
    let mut req = httparse::Request::new(&mut headers);
    match req.parse(buf) {
        Ok(httparse::Status::Complete(_)) => Some(Sniffed::Http(host_of(req.headers))),
        Ok(httparse::Status::Partial) => None,
        Err(_) => Some(Sniffed::Other),
    }
}

/// The Host header's name, lowercase, without its port.
fn host_of(headers: &[httparse::Header<'_>]) -> Option<String> {
    let value = headers
        .iter()
        .find(|h| h.name.eq_ignore_ascii_case("host"))?
        .value;
    let host = std::str::from_utf8(value).ok()?.trim();
    let name = match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    };
    (!name.is_empty()).then(|| mentis_core::egress::normal_name(name))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A real ClientHello, as rustls' client writes it for `name`.
    pub(crate) fn client_hello(name: &str) -> Vec<u8> {
        let roots = rustls::RootCertStore::empty();
        let config = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let mut conn = rustls::ClientConnection::new(
            std::sync::Arc::new(config),
            rustls::pki_types::ServerName::try_from(name.to_owned()).unwrap(),
        )
        .unwrap();
        let mut out = Vec::new();
        conn.write_tls(&mut out).unwrap();
        out
    }

    #[tokio::test]
    async fn a_client_hello_gives_its_server_name_and_every_byte_read() {
        let hello = client_hello("Files.Example.ORG");
        let mut stream = &hello[..];
        let (sniffed, read) = sniff(&mut stream).await.unwrap();
        assert_eq!(sniffed, Sniffed::Tls(Some("files.example.org".into())));
        assert_eq!(read, hello);
    }

    #[test]
    fn a_client_hello_cut_short_asks_for_more() {
        let hello = client_hello("pkgs.example.org");
        assert_eq!(decide(&hello[..3]), None);
        assert_eq!(decide(&hello[..hello.len() - 1]), None);
        assert_eq!(
            decide(&hello),
            Some(Sniffed::Tls(Some("pkgs.example.org".into())))
        );
    }

    #[test]
    fn an_http_request_gives_its_host_without_the_port() {
        let req = b"GET /simple/ HTTP/1.1\r\nHost: Pkgs.example.org:8080\r\nAccept: */*\r\n\r\n";
        assert_eq!(
            decide(req),
            Some(Sniffed::Http(Some("pkgs.example.org".into())))
        );
        assert_eq!(decide(&req[..20]), None);
        assert_eq!(decide(b"GET / HTTP/1.0\r\n\r\n"), Some(Sniffed::Http(None)));
    }

    #[test]
    fn anything_else_is_other() {
        assert_eq!(decide(b"SSH-2.0-OpenSSH_9.2\r\n"), Some(Sniffed::Other));
        assert_eq!(decide(b"\x00\x01binary"), Some(Sniffed::Other));
        assert_eq!(decide(b""), None);
        // A handshake record that is not a ClientHello.
        assert_eq!(
            decide(&[0x16, 3, 1, 0, 4, 2, 0, 0, 0]),
            Some(Sniffed::Tls(None))
        );
    }
}
