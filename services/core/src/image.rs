//! The grammar of an image reference, checked before the engine sees one, so a name Docker would refuse
//! is INVALID_ARGUMENT naming the cause rather than an engine error (the grammar of the distribution
//! project's `reference` package, as Docker applies it):
//!
//! ```text
//! reference      := name [ ":" tag ] [ "@" digest ]
//! name           := [ domain "/" ] path-component { "/" path-component }     (at most 255 bytes)
//! domain         := domain-component { "." domain-component } [ ":" port ]   (or "[" IPv6 "]" [ ":" port ])
//! domain-comp.   := [a-zA-Z0-9] | [a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9]
//! path-component := [a-z0-9]+ { separator [a-z0-9]+ }     separator := "." | "_" | "__" | "-"+
//! tag            := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
//! digest         := algorithm ":" [0-9a-fA-F]{32,}        algorithm := [A-Za-z][A-Za-z0-9]* { [+._-] [A-Za-z][A-Za-z0-9]* }
//! ```
//!
//! The first component is a domain only when more follow and it has a '.' or a ':', is "localhost", or
//! has an upper-case letter (which a path component may not).

/// Longest name (the part before the tag and digest), as Docker bounds it.
pub const MAX_NAME_LEN: usize = 255;

/// Checks `s` against the grammar above; the error says what is wrong, in words for the client.
pub fn check_reference(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("it is empty".into());
    }
    let (rest, digest) = match s.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (s, None),
    };
    if let Some(d) = digest {
        check_digest(d)?;
    }
    // A ':' after the last '/' starts the tag (one before it is a registry's port).
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if let Some(t) = tag {
        check_tag(t)?;
    }
    if name.is_empty() {
        return Err("the name is empty".into());
    }
    if name.len() > MAX_NAME_LEN {
        return Err(format!("the name is longer than {MAX_NAME_LEN} bytes"));
    }
    let mut parts: Vec<&str> = name.split('/').collect();
    if parts.len() > 1 && is_domain_like(parts[0]) {
        check_domain(parts.remove(0))?;
    }
    for p in parts {
        check_path_component(p)?;
    }
    Ok(())
}

/// The short form Docker lists an image's names in (`RepoTags`, `RepoDigests`): the default registry and
/// `library/` left out, `:latest` when no tag or digest is given, only the digest when both are. Two
/// references name the same image exactly when their familiar forms are equal.
pub fn familiar(reference: &str) -> String {
    let (rest, digest) = match reference.split_once('@') {
        Some((r, d)) => (r, Some(d)),
        None => (reference, None),
    };
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    let (domain, path) = match name.split_once('/') {
        Some((first, path)) if is_domain_like(first) => (Some(first), path),
        _ => (None, name),
    };
    let name = match domain {
        None | Some("docker.io" | "index.docker.io") => {
            let path = path
                .strip_prefix("library/")
                .filter(|p| !p.contains('/'))
                .unwrap_or(path);
            path.to_owned()
        }
        Some(d) => format!("{d}/{path}"),
    };
    match (digest, tag) {
        (Some(d), _) => format!("{name}@{d}"),
        (None, Some(t)) => format!("{name}:{t}"),
        (None, None) => format!("{name}:latest"),
    }
}

fn is_domain_like(first: &str) -> bool {
    first.contains(['.', ':'])
        || first == "localhost"
        || first.bytes().any(|b| b.is_ascii_uppercase())
}

fn check_domain(d: &str) -> Result<(), String> {
    let bad = || {
        Err(format!(
            "the registry {} is not a host name with an optional port",
            mentis_model::quote::quoted(d)
        ))
    };
    let (host, port) = if let Some(v6) = d.strip_prefix('[') {
        let Some((addr, after)) = v6.split_once(']') else {
            return bad();
        };
        if addr.is_empty()
            || !addr
                .bytes()
                .all(|b| b.is_ascii_hexdigit() || b == b':' || b == b'.')
        {
            return bad();
        }
        match after {
            "" => (None, None),
            p => match p.strip_prefix(':') {
                Some(port) => (None, Some(port)),
                None => return bad(),
            },
        }
    } else {
        match d.split_once(':') {
            Some((h, p)) => (Some(h), Some(p)),
            None => (Some(d), None),
        }
    };
    if let Some(h) = host {
        let component_ok = |c: &str| {
            !c.is_empty()
                && c.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !c.starts_with('-')
                && !c.ends_with('-')
        };
        if !h.split('.').all(component_ok) {
            return bad();
        }
    }
    if let Some(p) = port
        && (p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return bad();
    }
    Ok(())
}

fn check_path_component(p: &str) -> Result<(), String> {
    let msg = || {
        Err(format!(
            "the name component {} must be lower-case letters and digits, separated by '.', '_', '__' or '-'",
            mentis_model::quote::quoted(p)
        ))
    };
    let b = p.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return msg();
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator: ".", "_", "__" or a run of '-', between alphanumerics.
        let sep_len = match b[i] {
            b'.' => 1,
            b'_' if b.get(i + 1) == Some(&b'_') => 2,
            b'_' => 1,
            b'-' => b[i..].iter().take_while(|&&c| c == b'-').count(),
            _ => return msg(),
        };
        i += sep_len;
        if !b.get(i).copied().is_some_and(alnum) {
            return msg();
        }
    }
    Ok(())
}

fn check_tag(t: &str) -> Result<(), String> {
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let b = t.as_bytes();
    if b.is_empty()
        || b.len() > 128
        || !word(b[0])
        || !b.iter().all(|&c| word(c) || c == b'.' || c == b'-')
    {
        return Err(format!(
            "the tag {} must be 1-128 letters, digits, '_', '.' or '-', not starting with '.' or '-'",
            mentis_model::quote::quoted(t)
        ));
    }
    Ok(())
}

fn check_digest(d: &str) -> Result<(), String> {
    let bad = || {
        Err(format!(
            "the digest {} is not ALGORITHM:HEX (at least 32 hex digits)",
            mentis_model::quote::quoted(d)
        ))
    };
    let Some((alg, hex)) = d.split_once(':') else {
        return bad();
    };
    let alg_ok = alg.split(['+', '.', '_', '-']).all(|c| {
        let mut bytes = c.bytes();
        bytes.next().is_some_and(|b| b.is_ascii_alphabetic())
            && bytes.all(|b| b.is_ascii_alphanumeric())
    });
    if !alg_ok || hex.len() < 32 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return bad();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn references_docker_takes_are_valid() {
        for ok in [
            "python",
            "python:3.12-slim",
            "mentis/executor:wt-a",
            "mentis/base:bookworm-0123abcd",
            "library/ubuntu",
            "localhost/x",
            "localhost:5000/team/app:v1.2",
            "registry.example/a/b/c",
            "my-reg.example:443/a__b/c.d/e--f:TAG_1",
            "[::1]:5000/x",
            "UPPER/x",
            "a",
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "python@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
            "python:3@sha256:0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(check_reference(ok), Ok(()), "{ok}");
        }
    }

    #[test]
    fn references_to_one_image_have_one_familiar_form() {
        let digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        for (given, want) in [
            ("python", "python:latest"),
            ("python:3.12-slim", "python:3.12-slim"),
            ("library/python:3", "python:3"),
            ("docker.io/library/python:3", "python:3"),
            ("index.docker.io/library/python", "python:latest"),
            ("docker.io/team/app:1", "team/app:1"),
            ("team/app", "team/app:latest"),
            ("library/a/b", "library/a/b:latest"),
            ("localhost:5000/team/app:v1", "localhost:5000/team/app:v1"),
            ("localhost/x", "localhost/x:latest"),
            (
                "registry.example/library/x:1",
                "registry.example/library/x:1",
            ),
            (&format!("python@{digest}"), &format!("python@{digest}")),
            (
                &format!("docker.io/library/python:3@{digest}"),
                &format!("python@{digest}"),
            ),
        ] {
            assert_eq!(familiar(given), want, "{given}");
        }
    }

    #[test]
    fn references_docker_refuses_are_invalid_with_their_cause() {
        for (bad, cause) in [
            ("", "empty"),
            ("../../etc", "\"..\""),
            ("UPPER/../x", "\"..\""),
            ("Upper", "\"Upper\""),
            ("a//b", "\"\""),
            ("a/", "\"\""),
            ("/a", "\"\""),
            ("-a", "\"-a\""),
            ("a-", "\"a-\""),
            ("a___b", "\"a___b\""),
            ("a..b", "\"a..b\""),
            ("a b", "\"a b\""),
            ("a:", "tag \"\""),
            ("a:.x", "tag \".x\""),
            ("a:b:c", "\"a:b\""),
            ("a@sha256:12", "digest"),
            ("a@", "digest"),
            ("bad_host-.x/a", "registry"),
            ("host:port/a", "registry"),
            ("[zz]:5/a", "registry"),
            ("a:b@c:d", "digest"),
        ] {
            let err = check_reference(bad).expect_err(bad);
            assert!(err.contains(cause), "{bad}: {err}");
        }
        let long = "a".repeat(MAX_NAME_LEN + 1);
        assert!(check_reference(&long).expect_err("long").contains("255"));
        let tag = format!("a:{}", "t".repeat(129));
        assert!(check_reference(&tag).is_err());
    }
}
