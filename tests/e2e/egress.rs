//! Egress by name (docs/EGRESS.md), end to end: a real runtime puts a sandbox with EGRESS_RULES behind its
//! egress gateway on the Docker engine (the host's netfilter redirecting the gateway network's traffic), and
//! the sandbox's own tools (Python's urllib and sockets) try what agents and attackers would. There is no
//! internet here: the test makes its own, a container on a network of its own serving HTTP (80), HTTPS with a
//! test CA (443) and a raw TCP echo (7000), named through the gateway's resolver configuration
//! (`MENTIS_EGRESS_HOSTS`).

use std::time::Duration;

use mentis_e2e::*;
use mentis_proto::api;

/// The test's internet: one server container on a network of its own (both labelled with the instance,
/// removed when dropped), and the test CA its HTTPS certificate comes from.
struct Internet {
    network: String,
    container: String,
    ip: String,
    ca_pem: String,
    dir: tempfile::TempDir,
}

const SERVERS: &str = r#"
import http.server, socketserver, ssl, threading, socket, os, zipfile, io, hashlib, base64
EXPECTED = os.environ.get("EXPECTED_AUTH")
def auth(value):
    if value is None:
        return "none"
    return "match" if value == EXPECTED else "mismatch"
# A private package index (PEP 503) under /private/ of one wheel, mentis-demo 1.0, for requests that carry
# the expected token.
def wheel():
    files = {
        "mentis_demo/__init__.py": b"VALUE = 42\n",
        "mentis_demo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: mentis-demo\nVersion: 1.0\n",
        "mentis_demo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: mentis-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += "%s,sha256=%s,%d\n" % (name, digest, len(data))
    files["mentis_demo-1.0.dist-info/RECORD"] = (record + "mentis_demo-1.0.dist-info/RECORD,,\n").encode()
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return out.getvalue()
WHEEL = wheel()
WHEEL_NAME = "mentis_demo-1.0-py3-none-any.whl"
class H(http.server.BaseHTTPRequestHandler):
    def reply(self, code, body, kind):
        self.send_response(code)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        if self.path.startswith(("/private/simple/", "/private/packages/")):
            if auth(self.headers.get("Authorization")) != "match":
                return self.reply(401, b"unauthorized", "text/plain")
            if self.path.startswith("/private/packages/"):
                return self.reply(200, WHEEL, "application/octet-stream")
            link = '<a href="/private/packages/%s#sha256=%s">%s</a>' % (WHEEL_NAME, hashlib.sha256(WHEEL).hexdigest(), WHEEL_NAME)
            return self.reply(200, ("<html><body>%s</body></html>" % link).encode(), "text/html")
        body = ("%s %s auth=%s" % (self.headers.get("Host"), self.path, auth(self.headers.get("Authorization")))).encode()
        self.reply(200, body, "text/plain")
    def log_message(self, *a):
        pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
def serve(port, tls):
    s = S(("0.0.0.0", port), H)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain("/srv/cert.pem", "/srv/key.pem")
        s.socket = ctx.wrap_socket(s.socket, server_side=True)
    s.serve_forever()
def echo_one(c):
    while True:
        d = c.recv(4096)
        if not d:
            break
        c.sendall(d)
def echo():
    l = socket.socket()
    l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    l.bind(("0.0.0.0", 7000))
    l.listen()
    while True:
        c, _ = l.accept()
        threading.Thread(target=echo_one, args=(c,), daemon=True).start()
for target, args in [(serve, (80, False)), (serve, (443, True)), (echo, ())]:
    threading.Thread(target=target, args=args, daemon=True).start()
print("serving", flush=True)
threading.Event().wait()
"#;

impl Internet {
    /// The servers answer `auth=match` for requests whose Authorization is `expected_auth`.
    fn start(instance: &str, names: &[&str], expected_auth: &str) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let ca_key = rcgen::KeyPair::generate()?;
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(rcgen::DnType::CommonName, "test internet CA");
        let ca_cert = ca.self_signed(&ca_key)?;
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let key = rcgen::KeyPair::generate()?;
        let cert = rcgen::CertificateParams::new(
            names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>(),
        )?
        .signed_by(&key, &issuer)?;
        std::fs::write(dir.path().join("cert.pem"), cert.pem())?;
        std::fs::write(dir.path().join("key.pem"), key.serialize_pem())?;
        std::fs::write(dir.path().join("ca.pem"), ca_cert.pem())?;
        std::fs::write(dir.path().join("servers.py"), SERVERS)?;
        // Readable by the server's user whatever the umask.
        for f in ["cert.pem", "key.pem", "ca.pem", "servers.py"] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir.path().join(f), std::fs::Permissions::from_mode(0o644))?;
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
        let label = format!("io.mentis.instance={instance}");
        let network = format!("mentis-test-internet-{instance}");
        docker(&["network", "create", "--label", &label, &network])?;
        let mount = format!("{}:/srv:ro", dir.path().display());
        let expected = format!("EXPECTED_AUTH={expected_auth}");
        let container = docker(&[
            "run",
            "-d",
            "-e",
            &expected,
            "--label",
            &label,
            "--network",
            &network,
            "-v",
            &mount,
            "--entrypoint",
            "python3",
            "mentis/executor:latest",
            "/srv/servers.py",
        ])?
        .trim()
        .to_owned();
        let ip = inspect(
            &container,
            &format!("{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"),
        )?;
        let internet = Self {
            network,
            container,
            ip,
            ca_pem: ca_cert.pem(),
            dir,
        };
        // Serving once it said so.
        for _ in 0..100 {
            if docker(&["logs", &internet.container])?.contains("serving") {
                return Ok(internet);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        anyhow::bail!("the test internet did not start")
    }

    fn ca_file(&self) -> std::path::PathBuf {
        self.dir.path().join("ca.pem")
    }
}

impl Drop for Internet {
    fn drop(&mut self) {
        let _ = docker(&["rm", "-f", &self.container]);
        let _ = docker(&["network", "rm", &self.network]);
    }
}

/// A runtime whose egress gateway resolves `names` to the test internet and trusts its CA.
async fn runtime_behind(
    internet: &Internet,
    guard: InstanceGuard,
    names: &[&str],
) -> anyhow::Result<Harness> {
    let ip: std::net::Ipv4Addr = internet.ip.parse()?;
    let ca_file = internet.ca_file();
    Harness::start_in(guard, |c| {
        c.egress.hosts = names.iter().map(|n| ((*n).to_owned(), vec![ip])).collect();
        c.egress.upstream_ca_files = vec![ca_file];
    })
    .await
}

/// Sets a secret of the space `default`.
async fn set_secret(h: &mut Harness, name: &str, value: &str) -> anyhow::Result<()> {
    h.spaces
        .set_secret(api::SetSecretRequest {
            space_id: String::new(),
            name: name.into(),
            value: value.into(),
        })
        .await?;
    Ok(())
}

fn rule(domain: &str, cidr: &str, ports: &[u32]) -> api::EgressRule {
    api::EgressRule {
        domain: domain.into(),
        cidr: cidr.into(),
        ports: ports.to_vec(),
        headers: Vec::new(),
    }
}

/// Runs a Python program in the sandbox; its stdout (and the exit code).
async fn python(h: &mut Harness, sandbox: &str, program: &str) -> anyhow::Result<(String, i32)> {
    let obs = h
        .sh(sandbox, &format!("python3 - <<'EOF'\n{program}\nEOF"))
        .await?;
    Ok((stdout(&obs), cmd_end(&obs)?.exit_code))
}

/// A URL fetched with urllib: "ok <body>" or "error <why>".
const FETCH: &str = r#"
import sys, ssl, urllib.request
def fetch(url, ca=None):
    try:
        ctx = ssl.create_default_context(cafile=ca) if ca else None
        with urllib.request.urlopen(url, timeout=5, context=ctx) as r:
            return "ok " + r.read().decode()
    except Exception as e:
        return "error %s" % (getattr(e, "reason", e),)
"#;

#[tokio::test]
async fn a_sandbox_with_rules_reaches_only_what_they_allow_by_name_and_address()
-> anyhow::Result<()> {
    let names = ["pypi.test", "api.test", "blocked.test", "late.test"];
    let guard = Harness::new_instance();
    let internet = Internet::start(&guard.instance, &names, "")?;
    let ip = &internet.ip;
    let mut h = runtime_behind(&internet, guard, &names).await?;
    let sandbox = h
        .create(api::SandboxSpec {
            egress: api::Egress::Rules as i32,
            egress_rules: vec![
                rule("pypi.test", "", &[80]),
                rule("api.test", "", &[443]),
                rule("", &format!("{ip}/32"), &[7000]),
            ],
            ..Default::default()
        })
        .await?;
    assert_eq!(sandbox.egress, api::Egress::Rules as i32);
    assert_eq!(sandbox.egress_rules.len(), 3);
    let id = sandbox.sandbox_id.clone();
    h.sh(
        &id,
        &format!("cat > /tmp/ca.pem <<'EOF'\n{}\nEOF", internet.ca_pem),
    )
    .await?;

    // Allowed: HTTP by name, HTTPS by name (the upstream's own certificate: TLS passes through untouched).
    let (out, _) = python(
        &mut h,
        &id,
        &format!(
            "{FETCH}\nprint(fetch('http://pypi.test/simple/'))\nprint(fetch('https://api.test/v1', '/tmp/ca.pem'))"
        ),
    )
    .await?;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "ok pypi.test /simple/ auth=none", "{out}");
    assert_eq!(lines[1], "ok api.test /v1 auth=none", "{out}");

    // Refused: a name no rule allows does not resolve; an allowed name on another port, the server's
    // address written out, and the metadata address get no answer.
    let (out, _) = python(
        &mut h,
        &id,
        &format!(
            "{FETCH}\nfor u in ['http://blocked.test/', 'http://pypi.test:8080/', 'http://{ip}/', \
             'http://169.254.169.254/latest/meta-data/', 'https://pypi.test/']:\n    print(u, fetch(u))"
        ),
    )
    .await?;
    for line in out.lines() {
        assert!(line.contains(" error "), "{line}\n{out}");
    }
    assert!(
        out.lines()
            .next()
            .unwrap_or_default()
            .contains("Name or service not known")
            || out.lines().next().unwrap_or_default().contains("not known"),
        "a refused name does not resolve: {out}"
    );

    // A network rule passes any protocol to its address and port, and nothing else of it.
    let (out, _) = python(
        &mut h,
        &id,
        &format!(
            r#"
import socket
def echo(port):
    try:
        s = socket.create_connection(("{ip}", port), timeout=5)
        s.sendall(b"SSH-2.0-probe\r\n")
        s.settimeout(5)
        return s.recv(100).decode().strip() or "closed"
    except Exception as e:
        return "error %s" % e
print(echo(7000))
print(echo(7001))
"#
        ),
    )
    .await?;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "SSH-2.0-probe", "{out}");
    assert_ne!(lines[1], "SSH-2.0-probe", "{out}");

    // DNS to any other resolver is answered by the gateway (a refused name is NXDOMAIN, so nothing
    // tunnels out through questions); other UDP goes nowhere; IPv6 has no route.
    let (out, _) = python(
        &mut h,
        &id,
        r#"
import socket, struct
def ask(server, name):
    q = struct.pack(">HHHHHH", 0x1234, 0x0100, 1, 0, 0, 0)
    q += b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\x00" + struct.pack(">HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(3)
    s.sendto(q, (server, 53))
    try:
        r = s.recv(512)
        return "rcode=%d answers=%d" % (r[3] & 15, struct.unpack(">H", r[6:8])[0])
    except socket.timeout:
        return "no answer"
def udp(server, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(2)
    s.sendto(b"hello", (server, port))
    try:
        return "answer %r" % s.recv(100)
    except socket.timeout:
        return "no answer"
    except OSError as e:
        return "error %s" % e
def v6():
    try:
        socket.create_connection(("2001:db8::1", 80), timeout=3)
        return "connected"
    except OSError as e:
        return "error"
print(ask("8.8.8.8", "data-to-exfiltrate.blocked.test"))
print(ask("9.9.9.9", "pypi.test"))
print(udp("8.8.8.8", 443))
print(v6())
"#,
    )
    .await?;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines,
        [
            "rcode=3 answers=0",
            "rcode=0 answers=1",
            "no answer",
            "error"
        ],
        "{out}"
    );

    // Every refusal is in the sandbox's list, with what it was for.
    let denials = h
        .sandboxes
        .list_egress_denials(api::ListEgressDenialsRequest {
            sandbox_id: id.clone(),
        })
        .await?
        .into_inner()
        .denials;
    let said = |protocol: &str, name: &str| {
        denials
            .iter()
            .any(|d| d.protocol == protocol && d.name == name && !d.reason.is_empty())
    };
    assert!(said("dns", "blocked.test"), "{denials:#?}");
    assert!(
        said("dns", "data-to-exfiltrate.blocked.test"),
        "{denials:#?}"
    );
    assert!(
        denials.iter().any(|d| d.address == "169.254.169.254:80"),
        "{denials:#?}"
    );
    assert!(
        denials.iter().any(|d| d.address == format!("{ip}:7001")),
        "{denials:#?}"
    );

    // A rule added to the running sandbox holds at once.
    let (before, _) = python(
        &mut h,
        &id,
        &format!("{FETCH}\nprint(fetch('http://late.test/x'))"),
    )
    .await?;
    assert!(before.starts_with("error"), "{before}");
    let mut rules = sandbox.egress_rules.clone();
    rules.push(rule("late.test", "", &[80]));
    let updated = h
        .sandboxes
        .update_sandbox(api::UpdateSandboxRequest {
            sandbox: Some(api::Sandbox {
                sandbox_id: id.clone(),
                egress_rules: rules,
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: vec!["egress_rules".into()],
            }),
        })
        .await?
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(updated.egress_rules.len(), 4);
    let (after, _) = python(
        &mut h,
        &id,
        &format!("{FETCH}\nprint(fetch('http://late.test/x'))"),
    )
    .await?;
    assert_eq!(after.trim(), "ok late.test /x auth=none");
    h.stop().await?;
    drop(internet);
    Ok(())
}

#[tokio::test]
async fn bad_policies_are_invalid_naming_the_field() -> anyhow::Result<()> {
    let mut h = Harness::start().await?;
    for (rules, field) in [
        (vec![rule("*", "", &[])], "spec.egress_rules[0].domain"),
        (
            vec![rule("a.test", "", &[]), rule("", "10.0.0.0/33", &[])],
            "spec.egress_rules[1].cidr",
        ),
        (
            vec![rule("", "10.0.0.1/8", &[])],
            "spec.egress_rules[0].cidr",
        ),
        (
            vec![rule("bad name.test", "", &[])],
            "spec.egress_rules[0].domain",
        ),
        (
            vec![rule("a.test", "", &[70000])],
            "spec.egress_rules[0].ports",
        ),
    ] {
        let (code, _, at) = refusal(
            h.sandboxes
                .create_sandbox(api::CreateSandboxRequest {
                    spec: Some(api::SandboxSpec {
                        egress: api::Egress::Rules as i32,
                        egress_rules: rules.clone(),
                        ..Default::default()
                    }),
                })
                .await,
        );
        assert_eq!(code, tonic::Code::InvalidArgument, "{rules:?}");
        assert_eq!(at.as_deref(), Some(field), "{rules:?}");
    }
    // Rules with EGRESS_DENY are a contradiction.
    let (code, _, at) = refusal(
        h.sandboxes
            .create_sandbox(api::CreateSandboxRequest {
                spec: Some(api::SandboxSpec {
                    egress: api::Egress::Deny as i32,
                    egress_rules: vec![rule("a.test", "", &[])],
                    ..Default::default()
                }),
            })
            .await,
    );
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert_eq!(at.as_deref(), Some("spec.egress_rules"));
    let plain = h.create_default().await?.sandbox_id;
    // A mask naming something else, or nothing.
    for paths in [vec![], vec!["image".to_owned()]] {
        let (code, _, at) = refusal(
            h.sandboxes
                .update_sandbox(api::UpdateSandboxRequest {
                    sandbox: Some(api::Sandbox {
                        sandbox_id: plain.clone(),
                        ..Default::default()
                    }),
                    update_mask: Some(prost_types::FieldMask { paths }),
                })
                .await,
        );
        assert_eq!(code, tonic::Code::InvalidArgument);
        assert_eq!(at.as_deref(), Some("update_mask"));
    }
    h.stop().await
}

#[tokio::test]
async fn headers_naming_a_space_secret_are_set_by_the_gateway_and_the_secret_never_enters_the_sandbox()
-> anyhow::Result<()> {
    let secret = format!("mentis-test-secret-{}", uuid::Uuid::new_v4().simple());
    let guard = Harness::new_instance();
    let internet = Internet::start(&guard.instance, &["api.test"], &format!("Bearer {secret}"))?;
    let mut h = runtime_behind(&internet, guard, &["api.test"]).await?;
    let header_rule = api::EgressRule {
        domain: "api.test".into(),
        ports: vec![443, 80],
        headers: vec![api::EgressHeader {
            name: "Authorization".into(),
            value: "Bearer {secret:API_TOKEN}".into(),
        }],
        ..Default::default()
    };
    let spec = api::SandboxSpec {
        egress: api::Egress::Rules as i32,
        egress_rules: vec![header_rule],
        ..Default::default()
    };
    // A rule naming a secret the space does not have is refused, naming the rule's headers.
    let (code, _, at) = refusal(
        h.sandboxes
            .create_sandbox(api::CreateSandboxRequest {
                spec: Some(spec.clone()),
            })
            .await,
    );
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert_eq!(at.as_deref(), Some("spec.egress_rules[0].headers"));
    // Bad secrets are refused too.
    for (name, value, field) in [
        ("1BAD", "v", "name"),
        ("OK", "a\nb", "value"),
        ("OK", "", "value"),
    ] {
        let (code, _, at) = refusal(
            h.spaces
                .set_secret(api::SetSecretRequest {
                    space_id: String::new(),
                    name: name.into(),
                    value: value.into(),
                })
                .await,
        );
        assert_eq!(
            (code, at.as_deref()),
            (tonic::Code::InvalidArgument, Some(field)),
            "{name}"
        );
    }
    set_secret(&mut h, "API_TOKEN", &secret).await?;
    let names = h
        .spaces
        .list_secrets(api::ListSecretsRequest::default())
        .await?
        .into_inner()
        .names;
    assert_eq!(names, ["API_TOKEN"]);
    let sandbox = h.create(spec).await?;
    let id = sandbox.sandbox_id;
    // The gateway's CA is in the sandbox's trust store (the launcher put it there, and the env points the
    // usual tools at it): urllib's default context trusts the gateway for the names it ends TLS for.
    let gateway_ca = std::fs::read_to_string(h.data_dir.path().join("egress-ca.pem"))?;
    assert!(!gateway_ca.contains("PRIVATE"));
    let (out, _) = python(
        &mut h,
        &id,
        &format!(
            "{FETCH}\nprint(fetch('https://api.test/v1/user'))\nprint(fetch('http://api.test/plain'))\n\
             print(fetch('https://api.test/v1/user', '/tmp/.mentis-ca/ca.pem'))\n\
             import os\nprint(open(os.environ['SSL_CERT_FILE']).read().count('BEGIN CERTIFICATE') > 1)"
        ),
    )
    .await?;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "ok api.test /v1/user auth=match", "{out}");
    assert_eq!(lines[1], "ok api.test /plain auth=match", "{out}");
    assert_eq!(lines[2], "ok api.test /v1/user auth=match", "{out}");
    // The bundle is the image's trust store with the CA after it, not the CA alone.
    assert_eq!(lines[3], "True", "{out}");
    let ca_in_sandbox = stdout(&h.sh(&id, "cat /tmp/.mentis-ca/ca.pem").await?);
    assert_eq!(ca_in_sandbox.trim(), gateway_ca.trim());

    // The secret is nowhere in the sandbox: not in its files, not in any process's environment or
    // memory. (The search carries the secret reversed, so the searching processes' own memory never
    // holds it; each reads what it can as the sandbox user, and scans every process but itself.)
    let reversed: String = secret.chars().rev().collect();
    let (found, code) = python(
        &mut h,
        &id,
        &format!(
            r#"
import os, re, subprocess, time
needle = "{reversed}"[::-1].encode()
# Positive controls: a file and a process's memory that hold a known string, which the search must find.
control = "lortnoc-hcraes-lanif"[::-1]
open("/tmp/control.txt", "w").write(control)
holder = subprocess.Popen(["python3", "-c", "import time; s = 'lortnoc-hcraes-lanif'[::-1] * 3; time.sleep(60)"])
time.sleep(1)
found = set()
hits = []
for root, dirs, files in os.walk("/"):
    if root == "/" :
        dirs[:] = [d for d in dirs if d not in ("proc", "sys", "dev")]
    for f in files:
        p = os.path.join(root, f)
        try:
            if os.path.isfile(p) and not os.path.islink(p):
                data = open(p, "rb").read()
                if needle in data:
                    hits.append(p)
                if control.encode() in data:
                    found.add("file")
        except OSError:
            pass
me = os.getpid()
for pid in [p for p in os.listdir("/proc") if p.isdigit() and int(p) != me]:
    for name in ("environ", "cmdline"):
        try:
            if needle in open("/proc/%s/%s" % (pid, name), "rb").read():
                hits.append("/proc/%s/%s" % (pid, name))
        except OSError:
            pass
    try:
        maps = open("/proc/%s/maps" % pid).read().splitlines()
        mem = open("/proc/%s/mem" % pid, "rb", 0)
        for line in maps:
            m = re.match(r"([0-9a-f]+)-([0-9a-f]+) r", line)
            if not m:
                continue
            start, end = int(m.group(1), 16), int(m.group(2), 16)
            try:
                mem.seek(start)
                data = mem.read(end - start)
                if needle in data:
                    hits.append("/proc/%s/mem" % pid)
                if control.encode() in data and int(pid) == holder.pid:
                    found.add("memory")
            except (OSError, ValueError, OverflowError):
                pass
    except OSError:
        pass
holder.kill()
print("hits", hits, "controls", sorted(found))
"#
        ),
    )
    .await?;
    assert_eq!(code, 0, "{found}");
    assert_eq!(found.trim(), "hits [] controls ['file', 'memory']");
    // Nor does any call answer it.
    let got = h.get(&id).await?;
    assert!(!format!("{got:?}").contains(&secret));
    assert_eq!(
        got.egress_rules[0].headers[0].value,
        "Bearer {secret:API_TOKEN}"
    );

    // Deleted, the secret is no longer sent: the request is refused and says why.
    h.spaces
        .delete_secret(api::DeleteSecretRequest {
            space_id: String::new(),
            name: "API_TOKEN".into(),
        })
        .await?;
    let (out, _) = python(
        &mut h,
        &id,
        &format!("{FETCH}\nprint(fetch('http://api.test/plain'))"),
    )
    .await?;
    assert!(out.starts_with("error"), "{out}");
    let denials = h
        .sandboxes
        .list_egress_denials(api::ListEgressDenialsRequest {
            sandbox_id: id.clone(),
        })
        .await?
        .into_inner()
        .denials;
    assert!(
        denials
            .iter()
            .any(|d| d.reason.contains("no secret API_TOKEN")),
        "{denials:#?}"
    );
    h.stop().await?;
    drop(internet);
    Ok(())
}

#[tokio::test]
async fn a_template_gives_its_egress_to_sandboxes_whose_spec_names_none() -> anyhow::Result<()> {
    use mentis_proto::api::template_service_client::TemplateServiceClient;
    let mut h = Harness::start().await?;
    let mut templates = TemplateServiceClient::new(h.channel.clone());
    let rules = vec![
        rule("*.pkg.test", "", &[443]),
        rule("", "10.9.0.0/16", &[5432]),
    ];
    let made = templates
        .create_template(api::CreateTemplateRequest {
            template: Some(api::Template {
                name: "reach-pkgs".into(),
                egress: api::Egress::Rules as i32,
                egress_rules: rules.clone(),
                ..Default::default()
            }),
        })
        .await?
        .into_inner()
        .template
        .unwrap();
    assert_eq!(made.egress, api::Egress::Rules as i32);
    assert_eq!(made.egress_rules, rules);
    let from_template = h
        .create(api::SandboxSpec {
            template: "reach-pkgs".into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(from_template.egress, api::Egress::Rules as i32);
    assert_eq!(from_template.egress_rules, rules);
    // A spec's own egress wins.
    let own = h
        .create(api::SandboxSpec {
            template: "reach-pkgs".into(),
            egress: api::Egress::Deny as i32,
            ..Default::default()
        })
        .await?;
    assert_eq!(own.egress, api::Egress::Deny as i32);
    assert!(own.egress_rules.is_empty());
    // A bad rule in a template is refused naming it.
    let (code, _, at) = refusal(
        templates
            .create_template(api::CreateTemplateRequest {
                template: Some(api::Template {
                    name: "bad".into(),
                    egress_rules: vec![rule("", "300.0.0.0/8", &[])],
                    ..Default::default()
                }),
            })
            .await,
    );
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert_eq!(at.as_deref(), Some("template.egress_rules[0].cidr"));
    h.stop().await
}

#[tokio::test]
async fn a_space_defaults_and_caps_its_sandboxes_egress() -> anyhow::Result<()> {
    // The runtime's own default is ALLOW here: the space's cap turns it into DENY, where nothing named one.
    let mut h = Harness::start_with(|c| c.egress_default = true).await?;
    let cap = vec![
        rule("*.pkg.test", "", &[443]),
        rule("", "10.0.0.0/8", &[5432]),
    ];
    let default = vec![rule("pypi.pkg.test", "", &[443])];
    let space = |egress: api::Egress, rules: Vec<api::EgressRule>| api::Space {
        space_id: "capped".into(),
        egress: egress as i32,
        egress_rules: rules,
        egress_cap: api::Egress::Rules as i32,
        egress_cap_rules: cap.clone(),
        ..Default::default()
    };
    // A default outside the cap, and a cap with headers, are refused naming the field.
    let (code, _, at) = refusal(
        h.spaces
            .create_space(api::CreateSpaceRequest {
                space: Some(space(api::Egress::Allow, vec![])),
            })
            .await,
    );
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert_eq!(at.as_deref(), Some("space.egress"));
    let mut with_header = space(api::Egress::Unspecified, vec![]);
    with_header.egress_cap_rules[0].headers = vec![api::EgressHeader {
        name: "Authorization".into(),
        value: "x".into(),
    }];
    let (code, _, at) = refusal(
        h.spaces
            .create_space(api::CreateSpaceRequest {
                space: Some(with_header),
            })
            .await,
    );
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert_eq!(at.as_deref(), Some("space.egress_cap_rules[0].headers"));
    let made = h
        .spaces
        .create_space(api::CreateSpaceRequest {
            space: Some(space(api::Egress::Rules, default.clone())),
        })
        .await?
        .into_inner()
        .space
        .unwrap();
    assert_eq!(
        (
            made.egress,
            &made.egress_rules,
            made.egress_cap,
            &made.egress_cap_rules
        ),
        (
            api::Egress::Rules as i32,
            &default,
            api::Egress::Rules as i32,
            &cap
        )
    );
    // A spec that names none gets the space's default; one within the cap is made as asked.
    let defaulted = h
        .create(api::SandboxSpec {
            space_id: "capped".into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(defaulted.egress, api::Egress::Rules as i32);
    assert_eq!(defaulted.egress_rules, default);
    let within = vec![
        rule("*.eu.pkg.test", "", &[443]),
        rule("", "10.2.0.0/16", &[5432]),
    ];
    let own = h
        .create(api::SandboxSpec {
            space_id: "capped".into(),
            egress_rules: within.clone(),
            ..Default::default()
        })
        .await?;
    assert_eq!(own.egress_rules, within);
    // Outside the cap: another name, another port, a wider CIDR, ALLOW.
    for (egress, rules, field) in [
        (
            api::Egress::Rules,
            vec![rule("pkg.test", "", &[443])],
            "spec.egress_rules[0]",
        ),
        (
            api::Egress::Rules,
            vec![
                rule("a.pkg.test", "", &[443]),
                rule("a.pkg.test", "", &[80]),
            ],
            "spec.egress_rules[1]",
        ),
        (
            api::Egress::Rules,
            vec![rule("", "10.0.0.0/7", &[5432])],
            "spec.egress_rules[0]",
        ),
        (api::Egress::Allow, vec![], "spec.egress"),
    ] {
        let result = h
            .sandboxes
            .create_sandbox(api::CreateSandboxRequest {
                spec: Some(api::SandboxSpec {
                    space_id: "capped".into(),
                    egress: egress as i32,
                    egress_rules: rules.clone(),
                    ..Default::default()
                }),
            })
            .await;
        let message = result
            .as_ref()
            .err()
            .map(|s| s.message().to_owned())
            .unwrap_or_default();
        let (code, _, at) = refusal(result);
        assert_eq!(code, tonic::Code::InvalidArgument, "{rules:?}: {message}");
        assert_eq!(at.as_deref(), Some(field), "{rules:?}: {message}");
        assert!(message.contains("egress_cap"), "{message}");
    }
    // UpdateSandbox is held to the cap too.
    let update = |rules: Vec<api::EgressRule>| api::UpdateSandboxRequest {
        sandbox: Some(api::Sandbox {
            sandbox_id: own.sandbox_id.clone(),
            egress: api::Egress::Rules as i32,
            egress_rules: rules,
            ..Default::default()
        }),
        update_mask: Some(prost_types::FieldMask {
            paths: vec!["egress_rules".into()],
        }),
    };
    let (code, _, at) = refusal(
        h.sandboxes
            .update_sandbox(update(vec![rule("evil.test", "", &[443])]))
            .await,
    );
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert_eq!(at.as_deref(), Some("sandbox.egress_rules[0]"));
    let changed = h
        .sandboxes
        .update_sandbox(update(default.clone()))
        .await?
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(changed.egress_rules, default);
    // A cap that no longer admits the space's default is refused; both changed at once are taken. With
    // the cap at DENY and no default of the space's, the runtime's ALLOW becomes DENY.
    let mask = |paths: &[&str]| {
        Some(prost_types::FieldMask {
            paths: paths.iter().map(|p| (*p).to_owned()).collect(),
        })
    };
    let deny_cap = api::Space {
        space_id: "capped".into(),
        egress_cap: api::Egress::Deny as i32,
        ..Default::default()
    };
    let (code, _, at) = refusal(
        h.spaces
            .update_space(api::UpdateSpaceRequest {
                space: Some(deny_cap.clone()),
                update_mask: mask(&["egress_cap"]),
            })
            .await,
    );
    assert_eq!(code, tonic::Code::InvalidArgument);
    assert_eq!(at.as_deref(), Some("space.egress"));
    let updated = h
        .spaces
        .update_space(api::UpdateSpaceRequest {
            space: Some(deny_cap),
            update_mask: mask(&["egress", "egress_cap"]),
        })
        .await?
        .into_inner()
        .space
        .unwrap();
    assert_eq!(
        (updated.egress, updated.egress_cap),
        (api::Egress::Unspecified as i32, api::Egress::Deny as i32)
    );
    let closed = h
        .create(api::SandboxSpec {
            space_id: "capped".into(),
            ..Default::default()
        })
        .await?;
    assert_eq!(closed.egress, api::Egress::Deny as i32);
    // Elsewhere the runtime's default holds.
    assert_eq!(h.create_default().await?.egress, api::Egress::Allow as i32);
    h.stop().await
}

#[tokio::test]
async fn curl_and_pip_reach_allowed_names_and_fail_clearly_for_others() -> anyhow::Result<()> {
    // A private package index behind a token: the rule's header carries it, the sandbox never has it.
    let secret = format!("mentis-index-token-{}", uuid::Uuid::new_v4().simple());
    let guard = Harness::new_instance();
    let internet = Internet::start(
        &guard.instance,
        &["pypi.pkg.test"],
        &format!("Bearer {secret}"),
    )?;
    let ip = &internet.ip;
    let mut h = runtime_behind(&internet, guard, &["pypi.pkg.test"]).await?;
    set_secret(&mut h, "INDEX_TOKEN", &secret).await?;
    let spec = api::SandboxSpec {
        egress_rules: vec![api::EgressRule {
            domain: "pypi.pkg.test".into(),
            ports: vec![443],
            headers: vec![api::EgressHeader {
                name: "Authorization".into(),
                value: "Bearer {secret:INDEX_TOKEN}".into(),
            }],
            ..Default::default()
        }],
        ..Default::default()
    };
    let id = h.create(spec.clone()).await?.sandbox_id;
    let mut sh = async |command: &str| -> anyhow::Result<String> {
        Ok(stdout(
            &h.sh(&id, &format!("{{ {command}; }} 2>&1; echo exit=$?"))
                .await?,
        ))
    };
    // curl trusts the gateway through CURL_CA_BUNDLE; its errors say what happened.
    let out = sh("curl -sS https://pypi.pkg.test/private/simple/mentis-demo/").await?;
    assert!(
        out.contains("mentis_demo-1.0-py3-none-any.whl") && out.ends_with("exit=0\n"),
        "{out}"
    );
    let out = sh("curl -sS https://files.pkg.test/").await?;
    assert!(
        out.contains("curl: (6) Could not resolve host: files.pkg.test"),
        "{out}"
    );
    assert!(out.ends_with("exit=6\n"), "{out}");
    // An IP literal (the index's own address) on a port a rule names: no name, so refused.
    let out = sh(&format!("curl -sS --max-time 5 -k https://{ip}/simple/")).await?;
    assert!(
        out.starts_with("curl: (") && !out.ends_with("exit=0\n"),
        "{out}"
    );
    // pip installs from the index with the token it never sees (PIP_CERT trusts the gateway).
    let pip =
        "pip install --user --no-cache-dir --disable-pip-version-check --break-system-packages";
    let out = sh(&format!(
        "{pip} --index-url https://pypi.pkg.test/private/simple mentis-demo && \
         python3 -c 'import mentis_demo; print(\"value\", mentis_demo.VALUE)'"
    ))
    .await?;
    assert!(
        out.contains("Successfully installed mentis-demo-1.0"),
        "{out}"
    );
    assert!(out.ends_with("value 42\nexit=0\n"), "{out}");
    // A denied index fails at once; its one retry says the name does not resolve.
    let started = std::time::Instant::now();
    let out = sh(&format!(
        "{pip} --retries 1 --timeout 5 --index-url https://files.pkg.test/simple mentis-other"
    ))
    .await?;
    assert!(out.contains("Name or service not known"), "{out}");
    assert!(
        out.contains("No matching distribution found for mentis-other"),
        "{out}"
    );
    assert!(out.ends_with("exit=1\n"), "{out}");
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "{:?}",
        started.elapsed()
    );
    assert!(!out.contains(&secret));
    // The next sandbox is known to the gateway, though the engine gives it the deleted one's address on
    // the gateway network (it reuses freed addresses) while the ended record stays in the registry.
    let source = |id: &str| {
        inspect(
            &container_of(id),
            "{{range $n, $e := .NetworkSettings.Networks}}{{if ne $n \"mentis-net\"}}{{$e.IPAddress}}{{end}}{{end}}",
        )
    };
    let before = source(&id)?;
    h.sandboxes
        .delete_sandbox(api::DeleteSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    let next = h.create(spec).await?.sandbox_id;
    let out = stdout(
        &h.sh(
            &next,
            "curl -sS https://pypi.pkg.test/private/simple/mentis-demo/ 2>&1",
        )
        .await?,
    );
    assert!(out.contains("mentis_demo-1.0-py3-none-any.whl"), "{out}");
    eprintln!("gateway address before {before}, after {}", source(&next)?);
    h.stop().await?;
    drop(internet);
    Ok(())
}

#[tokio::test]
async fn sandboxes_with_rules_stay_fenced_while_the_runtime_is_down_and_are_served_after_a_restart()
-> anyhow::Result<()> {
    let bin = env!("CARGO_BIN_EXE_mentis-runtime-under-test");
    let guard = Harness::new_instance();
    let instance = guard.instance.clone();
    let internet = Internet::start(&instance, &["api.test"], "unused")?;
    let hosts = format!("api.test={}", internet.ip);
    let env = [("MENTIS_EGRESS_HOSTS", hosts.as_str())];
    let data_dir = tempfile::tempdir()?;
    let mut first = RuntimeProcess::start_with_env(bin, &instance, data_dir.path(), &env).await?;
    let mut h = first.harness(data_dir, guard).await?;
    let id = h
        .create(api::SandboxSpec {
            egress_rules: vec![rule("api.test", "", &[80])],
            ..Default::default()
        })
        .await?
        .sandbox_id;
    let fetch = "curl -sS --max-time 5 http://api.test/up 2>&1";
    assert_eq!(stdout(&h.sh(&id, fetch).await?), "api.test /up auth=none");

    // The runtime stops; the sandbox runs on behind the same netfilter: forwarding out of the gateway's
    // network stays dropped and its connections are still redirected (to no listener now), so it reaches
    // nothing, by name or by address, until the next gateway.
    first.signal("TERM")?;
    assert!(
        first
            .exited_within(Duration::from_secs(30))
            .await?
            .is_some(),
        "the runtime did not stop"
    );
    let network_id = docker(&[
        "network",
        "inspect",
        "--format",
        "{{.Id}}",
        &format!("mentis-gw-{instance}"),
    ])?;
    let bridge = format!("br-{}", &network_id.trim()[..12]);
    let iptables = |args: &[&str]| {
        std::process::Command::new("iptables")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
    };
    let forward = iptables(&["-S", "DOCKER-USER"])?;
    assert!(
        forward.contains(&format!("-i {bridge} -j DROP")),
        "{bridge}: {forward}"
    );
    let nat = iptables(&["-t", "nat", "-S", &format!("MGW-{bridge}")])?;
    assert!(nat.contains("REDIRECT"), "{nat}");
    let direct = docker(&[
        "exec",
        &container_of(&id),
        "sh",
        "-c",
        &format!(
            "curl -sS --max-time 5 http://{}/direct 2>&1; {fetch}; echo",
            internet.ip
        ),
    ])
    .unwrap_or_else(|e| e.to_string());
    assert!(!direct.contains("auth="), "{direct}");

    // The next runtime starts the gateway at once for the sandboxes with rules it finds: no new sandbox
    // is needed for this one to be served again.
    let Harness {
        data_dir, guard, ..
    } = h;
    let second = RuntimeProcess::start_with_env(bin, &instance, data_dir.path(), &env).await?;
    let mut h = second.harness(data_dir, guard).await?;
    assert_eq!(stdout(&h.sh(&id, fetch).await?), "api.test /up auth=none");
    h.stop().await?;
    drop(internet);
    Ok(())
}

#[tokio::test]
async fn a_running_sandbox_changes_egress_mode_in_place() -> anyhow::Result<()> {
    let guard = Harness::new_instance();
    let internet = Internet::start(&guard.instance, &["api.test"], "Bearer mode-token")?;
    let mut h = runtime_behind(&internet, guard, &["api.test"]).await?;
    set_secret(&mut h, "TOKEN", "mode-token").await?;
    // Made with EGRESS_DENY (the default): nothing resolves.
    let id = h.create_default().await?.sandbox_id;
    let fetch = "curl -sS --max-time 5 http://api.test/plain 2>&1; curl -sS --max-time 5 https://api.test/tls 2>&1";
    let out = stdout(&h.sh(&id, fetch).await?);
    assert!(!out.contains("auth="), "{out}");
    let networks = || {
        inspect(
            &container_of(&id),
            "{{range $n, $e := .NetworkSettings.Networks}}{{$n}} {{end}}",
        )
        .map(|n| {
            // By kind (an instance may suffix its networks' names).
            let mut n: Vec<String> = n
                .split_whitespace()
                .map(|x| {
                    ["mentis-gw", "mentis-egress", "mentis-net"]
                        .into_iter()
                        .find(|kind| x.starts_with(kind))
                        .unwrap_or(x)
                        .to_owned()
                })
                .collect();
            n.sort();
            n
        })
    };
    assert_eq!(networks()?, ["mentis-net"]);
    let update = |egress: api::Egress, rules: Vec<api::EgressRule>, paths: &[&str]| {
        api::UpdateSandboxRequest {
            sandbox: Some(api::Sandbox {
                sandbox_id: id.clone(),
                egress: egress as i32,
                egress_rules: rules,
                ..Default::default()
            }),
            update_mask: Some(prost_types::FieldMask {
                paths: paths.iter().map(|p| (*p).to_owned()).collect(),
            }),
        }
    };
    // To EGRESS_RULES, with a header rule: the sandbox, made without rules, trusts the gateway's CA too.
    let rules = vec![api::EgressRule {
        domain: "api.test".into(),
        ports: vec![80, 443],
        headers: vec![api::EgressHeader {
            name: "Authorization".into(),
            value: "Bearer {secret:TOKEN}".into(),
        }],
        ..Default::default()
    }];
    let changed = h
        .sandboxes
        .update_sandbox(update(
            api::Egress::Rules,
            rules.clone(),
            &["egress", "egress_rules"],
        ))
        .await?
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(
        (changed.egress, changed.egress_rules),
        (api::Egress::Rules as i32, rules)
    );
    assert_eq!(networks()?, ["mentis-gw", "mentis-net"]);
    let out = stdout(&h.sh(&id, fetch).await?);
    assert_eq!(
        out, "api.test /plain auth=matchapi.test /tls auth=match",
        "{out}"
    );
    // To EGRESS_ALLOW: off the gateway's network first, then on the egress network; the gateway no longer
    // answers it.
    let changed = h
        .sandboxes
        .update_sandbox(update(
            api::Egress::Allow,
            vec![],
            &["egress", "egress_rules"],
        ))
        .await?
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(changed.egress, api::Egress::Allow as i32);
    assert!(changed.egress_rules.is_empty());
    assert_eq!(networks()?, ["mentis-egress", "mentis-net"]);
    let out = stdout(&h.sh(&id, fetch).await?);
    assert!(!out.contains("auth="), "{out}");
    // A PAUSED sandbox keeps its mode (its networks change only while it runs).
    h.sandboxes
        .pause_sandbox(api::PauseSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    let (code, _, _) = refusal(
        h.sandboxes
            .update_sandbox(update(api::Egress::Deny, vec![], &["egress"]))
            .await,
    );
    assert_eq!(code, tonic::Code::FailedPrecondition);
    h.sandboxes
        .resume_sandbox(api::ResumeSandboxRequest {
            sandbox_id: id.clone(),
        })
        .await?;
    // Back to EGRESS_DENY.
    let changed = h
        .sandboxes
        .update_sandbox(update(api::Egress::Deny, vec![], &["egress"]))
        .await?
        .into_inner()
        .sandbox
        .unwrap();
    assert_eq!(changed.egress, api::Egress::Deny as i32);
    assert_eq!(networks()?, ["mentis-net"]);
    // And once more to rules: served again at once.
    h.sandboxes
        .update_sandbox(update(
            api::Egress::Rules,
            vec![rule("api.test", "", &[80])],
            &["egress", "egress_rules"],
        ))
        .await?;
    let out = stdout(
        &h.sh(&id, "curl -sS --max-time 5 http://api.test/again 2>&1")
            .await?,
    );
    assert_eq!(out, "api.test /again auth=none");
    h.stop().await?;
    drop(internet);
    Ok(())
}
