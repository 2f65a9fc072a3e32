//! Egress policies (docs/EGRESS.md): what a sandbox may reach outside this machine. `Deny` (no route out),
//! `Allow` (the egress network's route out) or `Rules`: only what a rule allows, through the runtime's egress
//! gateway, which decides by TLS server name or HTTP Host for domain rules and by address for network rules,
//! and answers the sandbox's DNS itself. Validation names the field of every problem; matching is what the
//! gateway asks. No I/O here.

use std::fmt;
use std::net::Ipv4Addr;

use crate::error::Error;
use mentis_model::quote::quoted;

/// At most this many rules per policy.
pub const MAX_RULES: usize = 256;
/// At most this many ports per rule.
pub const MAX_PORTS: usize = 32;
/// At most this many headers per rule.
pub const MAX_HEADERS: usize = 16;
/// A header value (before secrets are put in) is at most this long.
pub const MAX_HEADER_VALUE: usize = 4096;
/// The ports of a rule that names none.
pub const DEFAULT_PORTS: [u16; 2] = [443, 80];

/// What a sandbox may reach outside this machine.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Egress {
    /// No route out.
    #[default]
    Deny,
    /// The egress network's route out: anything.
    Allow,
    /// Only what these rules allow, through the egress gateway.
    Rules(Vec<EgressRule>),
}

/// The three kinds, without the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EgressMode {
    Deny,
    Allow,
    Rules,
}

impl Egress {
    pub fn mode(&self) -> EgressMode {
        match self {
            Egress::Deny => EgressMode::Deny,
            Egress::Allow => EgressMode::Allow,
            Egress::Rules(_) => EgressMode::Rules,
        }
    }

    /// The rules (none unless `Rules`).
    pub fn rules(&self) -> &[EgressRule] {
        match self {
            Egress::Rules(rules) => rules,
            _ => &[],
        }
    }

    /// Whether the sandbox has the egress network's open route out.
    pub fn is_allow(&self) -> bool {
        matches!(self, Egress::Allow)
    }

    /// The first rule that lets a connection with this server name (SNI or Host) reach `port`.
    pub fn rule_for_name(&self, name: &str, port: u16) -> Option<&EgressRule> {
        let name = normal_name(name);
        self.rules().iter().find(|r| {
            matches!(&r.target, Target::Domain(d) if d.matches(&name)) && r.ports.contains(&port)
        })
    }

    /// Whether some domain rule names `name` on any port: the gateway's resolver answers only those.
    pub fn resolves(&self, name: &str) -> bool {
        let name = normal_name(name);
        self.rules()
            .iter()
            .any(|r| matches!(&r.target, Target::Domain(d) if d.matches(&name)))
    }

    /// The first network rule that lets a connection reach `addr:port`.
    pub fn rule_for_addr(&self, addr: Ipv4Addr, port: u16) -> Option<&EgressRule> {
        self.rules().iter().find(|r| {
            matches!(&r.target, Target::Cidr(net) if net.contains(addr)) && r.ports.contains(&port)
        })
    }

    /// Its rules as a client would write them (to fill a request from a template).
    pub fn to_requests(&self) -> Vec<RuleRequest> {
        self.rules()
            .iter()
            .map(|r| {
                let (domain, cidr) = match &r.target {
                    Target::Domain(d) => (d.to_string(), String::new()),
                    Target::Cidr(c) => (String::new(), c.to_string()),
                };
                RuleRequest {
                    domain,
                    cidr,
                    ports: r.ports.iter().map(|p| u32::from(*p)).collect(),
                    headers: r
                        .headers
                        .iter()
                        .map(|h| (h.name.clone(), h.value.clone()))
                        .collect(),
                }
            })
            .collect()
    }

    /// The secrets its headers name, each once, in order.
    pub fn secrets(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for rule in self.rules() {
            for header in &rule.headers {
                for name in header.secrets() {
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
            }
        }
        names
    }
}

/// One thing a sandbox may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressRule {
    pub target: Target,
    /// The TCP ports it allows, sorted, each once.
    pub ports: Vec<u16>,
    /// Headers the gateway sets on each HTTP request (domain rules only).
    pub headers: Vec<EgressHeader>,
}

impl EgressRule {
    /// Whether the gateway must end TLS for this rule's connections (to set headers).
    pub fn intercepts(&self) -> bool {
        !self.headers.is_empty()
    }
}

/// Where a rule lets a sandbox go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    Domain(Domain),
    Cidr(Cidr),
}

/// A host name, or every name under one (`*.example.com`). Lowercase, without a trailing dot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Domain {
    Exact(String),
    /// Names under this one (not the name itself).
    Under(String),
}

impl Domain {
    pub fn matches(&self, name: &str) -> bool {
        match self {
            Domain::Exact(d) => name == d,
            Domain::Under(d) => name
                .strip_suffix(d.as_str())
                .is_some_and(|head| head.len() > 1 && head.ends_with('.')),
        }
    }

    /// Whether every name this one matches, `wider` matches too.
    pub fn within(&self, wider: &Domain) -> bool {
        match (self, wider) {
            (Domain::Exact(d), w) => w.matches(d),
            (Domain::Under(d), Domain::Under(w)) => d == w || Domain::Under(w.clone()).matches(d),
            (Domain::Under(_), Domain::Exact(_)) => false,
        }
    }
}

impl fmt::Display for Domain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Domain::Exact(d) => f.write_str(d),
            Domain::Under(d) => write!(f, "*.{d}"),
        }
    }
}

/// An IPv4 network.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub addr: Ipv4Addr,
    pub prefix: u8,
}

impl Cidr {
    fn mask(&self) -> u32 {
        if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix))
        }
    }

    pub fn contains(&self, addr: Ipv4Addr) -> bool {
        u32::from(addr) & self.mask() == u32::from(self.addr)
    }

    /// Whether every address in this network is in `wider`.
    pub fn within(&self, wider: &Cidr) -> bool {
        self.prefix >= wider.prefix && wider.contains(self.addr)
    }

    /// Parses `a.b.c.d/n` with no host bits set.
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let (addr, prefix) = s
            .split_once('/')
            .ok_or_else(|| "an IPv4 network is written a.b.c.d/n".to_owned())?;
        let addr: Ipv4Addr = addr
            .parse()
            .map_err(|_| format!("{} is not an IPv4 address", quoted(addr)))?;
        let prefix: u8 = prefix
            .parse()
            .ok()
            .filter(|p| *p <= 32)
            .ok_or_else(|| format!("/{prefix} is not a prefix length (0-32)"))?;
        let cidr = Cidr { addr, prefix };
        if u32::from(addr) & !cidr.mask() != 0 {
            let network = Ipv4Addr::from(u32::from(addr) & cidr.mask());
            return Err(format!(
                "{s} has host bits set: the network is {network}/{prefix}"
            ));
        }
        Ok(cidr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// A header the gateway sets; its value may name secrets (`{secret:NAME}`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EgressHeader {
    pub name: String,
    pub value: String,
}

const SECRET_OPEN: &str = "{secret:";

impl EgressHeader {
    /// The secrets its value names, in order.
    pub fn secrets(&self) -> impl Iterator<Item = &str> {
        self.value
            .split(SECRET_OPEN)
            .skip(1)
            .filter_map(|part| part.split_once('}').map(|(name, _)| name))
    }

    /// The value with each `{secret:NAME}` replaced by `lookup(NAME)`; `None` when one is missing.
    pub fn render(&self, lookup: impl Fn(&str) -> Option<String>) -> Option<String> {
        let mut out = String::with_capacity(self.value.len());
        let mut rest = self.value.as_str();
        while let Some(at) = rest.find(SECRET_OPEN) {
            out.push_str(&rest[..at]);
            let after = &rest[at + SECRET_OPEN.len()..];
            let (name, tail) = after.split_once('}')?;
            out.push_str(&lookup(name)?);
            rest = tail;
        }
        out.push_str(rest);
        Some(out)
    }
}

/// A secret's name: `[A-Za-z_][A-Za-z0-9_]*`, at most 64 characters.
pub fn check_secret_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(format!(
            "{} is not a secret name (letters, digits and '_', not starting with a digit, at most 64)",
            quoted(name)
        ))
    }
}

/// A name as matched: lowercase, without a trailing dot.
pub fn normal_name(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// A rule as it came from a client.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuleRequest {
    pub domain: String,
    pub cidr: String,
    pub ports: Vec<u32>,
    pub headers: Vec<(String, String)>,
}

/// Validates a policy: `mode` `None` takes `default`; rules are only for `Rules`. Errors name the field
/// under `field` (`spec.egress_rules[2].cidr`).
pub fn validate(
    mode: Option<EgressMode>,
    rules: Vec<RuleRequest>,
    default: &Egress,
    field: &str,
) -> Result<Egress, Error> {
    let mode = match mode {
        Some(mode) => mode,
        // Rules alone ask for rules.
        None if !rules.is_empty() => EgressMode::Rules,
        None => return Ok(default.clone()),
    };
    match mode {
        EgressMode::Deny | EgressMode::Allow if !rules.is_empty() => Err(Error::invalid(format!(
            "{field}_rules are only for EGRESS_RULES"
        ))
        .at(format!("{field}_rules"))),
        EgressMode::Deny => Ok(Egress::Deny),
        EgressMode::Allow => Ok(Egress::Allow),
        EgressMode::Rules => {
            if rules.len() > MAX_RULES {
                return Err(Error::invalid(format!(
                    "{field}_rules has more than {MAX_RULES} rules"
                ))
                .at(format!("{field}_rules")));
            }
            rules
                .into_iter()
                .enumerate()
                .map(|(i, r)| {
                    check_rule(r).map_err(|(sub, msg)| {
                        let at = format!("{field}_rules[{i}]{sub}");
                        Error::invalid(format!("{at}: {msg}")).at(at)
                    })
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Egress::Rules)
        }
    }
}

/// One rule; on error the sub-field (`.cidr`) and what is wrong.
fn check_rule(r: RuleRequest) -> Result<EgressRule, (&'static str, String)> {
    let target = match (r.domain.is_empty(), r.cidr.is_empty()) {
        (false, true) => Target::Domain(parse_domain(&r.domain).map_err(|e| (".domain", e))?),
        (true, false) => Target::Cidr(Cidr::parse(r.cidr.trim()).map_err(|e| (".cidr", e))?),
        (true, true) => return Err(("", "names neither a domain nor a cidr".to_owned())),
        (false, false) => return Err(("", "names both a domain and a cidr: one each".to_owned())),
    };
    if r.ports.len() > MAX_PORTS {
        return Err((".ports", format!("more than {MAX_PORTS} ports")));
    }
    let mut ports = Vec::with_capacity(r.ports.len());
    for p in r.ports {
        let port = u16::try_from(p)
            .ok()
            .filter(|p| *p != 0)
            .ok_or((".ports", format!("{p} is not a port (1-65535)")))?;
        ports.push(port);
    }
    if ports.is_empty() {
        ports.extend(DEFAULT_PORTS);
    }
    ports.sort_unstable();
    ports.dedup();
    if !r.headers.is_empty() && matches!(target, Target::Cidr(_)) {
        return Err((
            ".headers",
            "headers are set by name: only a domain rule may have them".to_owned(),
        ));
    }
    if r.headers.len() > MAX_HEADERS {
        return Err((".headers", format!("more than {MAX_HEADERS} headers")));
    }
    let mut headers = Vec::with_capacity(r.headers.len());
    for (name, value) in r.headers {
        headers.push(check_header(name, value).map_err(|e| (".headers", e))?);
    }
    Ok(EgressRule {
        target,
        ports,
        headers,
    })
}

/// Headers the gateway will not set: they frame the request or the connection.
const FORBIDDEN_HEADERS: [&str; 8] = [
    "host",
    "connection",
    "content-length",
    "transfer-encoding",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
];

fn check_header(name: String, value: String) -> Result<EgressHeader, String> {
    let token = |b: u8| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b);
    if name.is_empty() || name.len() > 128 || !name.bytes().all(token) {
        return Err(format!("{} is not an HTTP header name", quoted(&name)));
    }
    if FORBIDDEN_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
        return Err(format!(
            "{name} frames the request: the gateway does not set it"
        ));
    }
    if value.len() > MAX_HEADER_VALUE || value.bytes().any(|b| b.is_ascii_control() && b != b'\t') {
        return Err(format!(
            "the value of {name} is longer than {MAX_HEADER_VALUE} bytes or has control characters"
        ));
    }
    let header = EgressHeader { name, value };
    // Every `{secret:` must close, with a valid name.
    let opened = header.value.matches(SECRET_OPEN).count();
    let names: Vec<&str> = header.secrets().collect();
    if names.len() != opened {
        return Err(format!(
            "the value of {} has a {SECRET_OPEN} without its closing brace",
            header.name
        ));
    }
    for n in names {
        check_secret_name(n)?;
    }
    Ok(header)
}

/// Parses a domain rule's name: `name` or `*.name`, letters, digits and '-' in labels of 1-63, at most 253
/// in all; a wildcard needs at least two labels under it.
pub fn parse_domain(s: &str) -> Result<Domain, String> {
    let lower = normal_name(s.trim());
    let (wild, name) = match lower.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, lower.as_str()),
    };
    if name.is_empty() || lower == "*" {
        return Err("a lone * would allow every name: list the names".to_owned());
    }
    if name.len() > 253 {
        return Err(format!("{} is longer than 253 characters", quoted(s)));
    }
    for label in name.split('.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && !label.starts_with('-')
            && !label.ends_with('-')
            && label
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-');
        if !ok {
            return Err(format!(
                "{} is not a host name (labels of letters, digits and '-'; '*.' only in front)",
                quoted(s)
            ));
        }
    }
    if name.parse::<Ipv4Addr>().is_ok() {
        return Err(format!("{} is an address: use cidr {name}/32", quoted(s)));
    }
    if wild {
        if !name.contains('.') {
            return Err(format!(
                "{} would allow a whole top-level domain: name one under it",
                quoted(s)
            ));
        }
        Ok(Domain::Under(name.to_owned()))
    } else {
        Ok(Domain::Exact(name.to_owned()))
    }
}

/// What a space lets its sandboxes have. A sandbox's policy must be within it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum EgressCap {
    /// Anything (the default).
    #[default]
    Any,
    /// Nothing: EGRESS_DENY only.
    Deny,
    /// EGRESS_DENY, or rules each within one of these (their ports among its ports; headers are the
    /// sandbox's own).
    Rules(Vec<EgressRule>),
}

impl EgressCap {
    /// The cap a client wrote as a mode and rules (`{field}` and `{field}_rules`): no mode and no rules, or
    /// EGRESS_ALLOW, is no cap; EGRESS_DENY, none; EGRESS_RULES, rules checked as a sandbox's are, but
    /// without headers (a cap says where, not what is sent). INVALID_ARGUMENT naming the field.
    pub fn validate(
        mode: Option<EgressMode>,
        rules: Vec<RuleRequest>,
        field: &str,
    ) -> Result<EgressCap, Error> {
        if let Some(i) = rules.iter().position(|r| !r.headers.is_empty()) {
            return Err(Error::invalid(format!(
                "{field}_rules[{i}].headers: a cap's rules carry no headers (they say where a sandbox may \
                 go; its own rules say what is sent)"
            ))
            .at(format!("{field}_rules[{i}].headers")));
        }
        Ok(Self::from_egress(validate(
            mode,
            rules,
            &Egress::Allow,
            field,
        )?))
    }

    /// The cap as a policy's shape: ANY is ALLOW, DENY is DENY, rules are rules.
    pub fn from_egress(egress: Egress) -> Self {
        match egress {
            Egress::Allow => EgressCap::Any,
            Egress::Deny => EgressCap::Deny,
            Egress::Rules(rules) => EgressCap::Rules(rules),
        }
    }

    /// See [`EgressCap::from_egress`].
    pub fn to_egress(&self) -> Egress {
        match self {
            EgressCap::Any => Egress::Allow,
            EgressCap::Deny => Egress::Deny,
            EgressCap::Rules(rules) => Egress::Rules(rules.clone()),
        }
    }

    /// INVALID_ARGUMENT when `egress` (a policy at `field`, with its rules at `{field}_rules`) is not within
    /// the cap of `space`.
    pub fn admit(&self, egress: &Egress, space: &str, field: &str) -> Result<(), Error> {
        self.check(egress).map_err(|(rule, why)| {
            let at = match rule {
                Some(i) => format!("{field}_rules[{i}]"),
                None => field.to_owned(),
            };
            Error::invalid(format!("{at}: {why} (space {space}, egress_cap)")).at(at)
        })
    }

    /// Ok when `egress` is within the cap; else what is not, in words, and the index of the rule.
    pub fn check(&self, egress: &Egress) -> Result<(), (Option<usize>, String)> {
        match (self, egress) {
            (EgressCap::Any, _) | (_, Egress::Deny) => Ok(()),
            (EgressCap::Deny, _) => {
                Err((None, "the space allows its sandboxes no egress".to_owned()))
            }
            (EgressCap::Rules(_), Egress::Allow) => Err((
                None,
                "the space allows only listed destinations: EGRESS_ALLOW is refused".to_owned(),
            )),
            (EgressCap::Rules(cap), Egress::Rules(rules)) => {
                for (i, rule) in rules.iter().enumerate() {
                    let covered = cap.iter().any(|c| {
                        let target = match (&rule.target, &c.target) {
                            (Target::Domain(d), Target::Domain(w)) => d.within(w),
                            (Target::Cidr(n), Target::Cidr(w)) => n.within(w),
                            _ => false,
                        };
                        target && rule.ports.iter().all(|p| c.ports.contains(p))
                    });
                    if !covered {
                        return Err((
                            Some(i),
                            format!(
                                "{} on ports {:?} is not within what the space allows",
                                rule.target, rule.ports
                            ),
                        ));
                    }
                }
                Ok(())
            }
        }
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Target::Domain(d) => d.fmt(f),
            Target::Cidr(c) => c.fmt(f),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn rule(domain: &str, cidr: &str, ports: &[u32]) -> RuleRequest {
        RuleRequest {
            domain: domain.into(),
            cidr: cidr.into(),
            ports: ports.to_vec(),
            headers: Vec::new(),
        }
    }

    fn rules(rs: Vec<RuleRequest>) -> Result<Egress, Error> {
        validate(Some(EgressMode::Rules), rs, &Egress::Deny, "spec.egress")
    }

    fn field_of(e: Error) -> String {
        e.field().unwrap_or_default().to_owned()
    }

    #[test]
    fn names_match_exactly_or_under_a_wildcard_whatever_their_case() {
        let p = rules(vec![
            rule("Pkgs.example.org", "", &[]),
            rule("*.files.example.org", "", &[443]),
        ])
        .unwrap();
        assert!(p.rule_for_name("pkgs.example.org", 443).is_some());
        assert!(p.rule_for_name("PKGS.EXAMPLE.ORG.", 80).is_some());
        assert!(p.rule_for_name("pkgs.example.org", 22).is_none());
        assert!(p.rule_for_name("evilpkgs.example.org", 443).is_none());
        assert!(p.rule_for_name("files.files.example.org", 443).is_some());
        assert!(p.rule_for_name("a.b.files.example.org", 443).is_some());
        // The wildcard is for names under it, not the name itself, and only on its ports.
        assert!(p.rule_for_name("files.example.org", 443).is_none());
        assert!(p.rule_for_name("xfiles.example.org", 443).is_none());
        assert!(p.rule_for_name("files.files.example.org", 80).is_none());
        assert!(p.resolves("files.files.example.org"));
        assert!(!p.resolves("example.com"));
    }

    #[test]
    fn networks_match_by_address_and_port() {
        let p = rules(vec![
            rule("", "10.1.2.0/24", &[5432]),
            rule("", "0.0.0.0/0", &[7]),
        ])
        .unwrap();
        assert!(
            p.rule_for_addr("10.1.2.77".parse().unwrap(), 5432)
                .is_some()
        );
        assert!(p.rule_for_addr("10.1.3.1".parse().unwrap(), 5432).is_none());
        assert!(p.rule_for_addr("10.1.2.77".parse().unwrap(), 443).is_none());
        assert!(p.rule_for_addr("8.8.8.8".parse().unwrap(), 7).is_some());
    }

    #[test]
    fn bad_rules_are_invalid_naming_the_field() {
        for (r, field, words) in [
            (rule("*", "", &[]), "spec.egress_rules[0].domain", "lone"),
            (rule("*.", "", &[]), "spec.egress_rules[0].domain", "lone"),
            (
                rule("*.com", "", &[]),
                "spec.egress_rules[0].domain",
                "top-level",
            ),
            (
                rule("exa mple.com", "", &[]),
                "spec.egress_rules[0].domain",
                "host name",
            ),
            (
                rule("a.*.com", "", &[]),
                "spec.egress_rules[0].domain",
                "host name",
            ),
            (
                rule("-a.com", "", &[]),
                "spec.egress_rules[0].domain",
                "host name",
            ),
            (
                rule("1.2.3.4", "", &[]),
                "spec.egress_rules[0].domain",
                "cidr 1.2.3.4/32",
            ),
            (
                rule("", "10.0.0.0/33", &[]),
                "spec.egress_rules[0].cidr",
                "prefix",
            ),
            (
                rule("", "10.0.0.1/24", &[]),
                "spec.egress_rules[0].cidr",
                "10.0.0.0/24",
            ),
            (
                rule("", "10.0.0/24", &[]),
                "spec.egress_rules[0].cidr",
                "IPv4",
            ),
            (
                rule("", "10.0.0.0", &[]),
                "spec.egress_rules[0].cidr",
                "a.b.c.d/n",
            ),
            (rule("", "", &[]), "spec.egress_rules[0]", "neither"),
            (
                rule("a.com", "1.0.0.0/8", &[]),
                "spec.egress_rules[0]",
                "both",
            ),
            (
                rule("a.com", "", &[0]),
                "spec.egress_rules[0].ports",
                "not a port",
            ),
            (
                rule("a.com", "", &[65536]),
                "spec.egress_rules[0].ports",
                "not a port",
            ),
        ] {
            let e = rules(vec![r.clone()]).unwrap_err();
            assert_eq!(e.reason(), crate::Reason::InvalidArgument, "{r:?}");
            assert!(e.to_string().contains(words), "{r:?}: {e}");
            assert_eq!(field_of(e), field, "{r:?}");
        }
        let mut with_header = rule("", "10.0.0.0/8", &[]);
        with_header.headers.push(("X-Key".into(), "v".into()));
        assert_eq!(
            field_of(rules(vec![with_header]).unwrap_err()),
            "spec.egress_rules[0].headers"
        );
        for (name, value) in [
            ("Host", "x"),
            ("bad name", "x"),
            ("X-Key", "a\nb"),
            ("X-Key", "{secret:NAME"),
            ("X-Key", "{secret:1X}"),
            ("X-Key", "{secret:}"),
        ] {
            let mut r = rule("a.com", "", &[]);
            r.headers.push((name.into(), value.into()));
            let e = rules(vec![rule("b.com", "", &[]), r]).unwrap_err();
            assert_eq!(
                field_of(e),
                "spec.egress_rules[1].headers",
                "{name}: {value}"
            );
        }
        let e = validate(
            Some(EgressMode::Deny),
            vec![rule("a.com", "", &[])],
            &Egress::Deny,
            "spec.egress",
        )
        .unwrap_err();
        assert_eq!(field_of(e), "spec.egress_rules");
    }

    #[test]
    fn rules_alone_ask_for_rules_and_nothing_takes_the_default() {
        let p = validate(
            None,
            vec![rule("a.com", "", &[443, 443, 80])],
            &Egress::Allow,
            "spec.egress",
        )
        .unwrap();
        assert_eq!(p.rules()[0].ports, [80, 443]);
        assert_eq!(
            validate(None, vec![], &Egress::Allow, "spec.egress").unwrap(),
            Egress::Allow
        );
        assert_eq!(p.rules().len(), 1);
        let empty = validate(
            Some(EgressMode::Rules),
            vec![],
            &Egress::Allow,
            "spec.egress",
        )
        .unwrap();
        assert_eq!(empty, Egress::Rules(vec![]));
        assert!(!empty.resolves("a.com"));
    }

    #[test]
    fn header_values_name_secrets_that_are_put_in_only_when_all_are_known() {
        let mut r = rule("api.example.com", "", &[]);
        r.headers
            .push(("Authorization".into(), "Bearer {secret:TOKEN}".into()));
        r.headers
            .push(("X-Both".into(), "{secret:A}-{secret:TOKEN}".into()));
        let p = rules(vec![r]).unwrap();
        assert_eq!(p.secrets(), ["TOKEN", "A"]);
        assert!(p.rules()[0].intercepts());
        let lookup = |n: &str| (n != "MISSING").then(|| format!("<{n}>"));
        assert_eq!(
            p.rules()[0].headers[0].render(lookup).unwrap(),
            "Bearer <TOKEN>"
        );
        assert_eq!(
            p.rules()[0].headers[1].render(lookup).unwrap(),
            "<A>-<TOKEN>"
        );
        let missing = EgressHeader {
            name: "X".into(),
            value: "{secret:MISSING}".into(),
        };
        assert_eq!(missing.render(lookup), None);
    }

    #[test]
    fn a_space_caps_what_its_sandboxes_may_allow() {
        let cap = EgressCap::Rules(
            rules(vec![
                rule("*.example.com", "", &[443]),
                rule("", "10.0.0.0/8", &[5432, 6379]),
            ])
            .unwrap()
            .rules()
            .to_vec(),
        );
        let ok = rules(vec![
            rule("api.example.com", "", &[443]),
            rule("*.eu.example.com", "", &[443]),
            rule("", "10.2.0.0/16", &[5432]),
        ])
        .unwrap();
        assert_eq!(cap.check(&ok), Ok(()));
        assert_eq!(cap.check(&Egress::Deny), Ok(()));
        assert!(cap.check(&Egress::Allow).is_err());
        for (bad, index) in [
            (rule("example.com", "", &[443]), 0),
            (rule("*.example.com", "", &[80]), 0),
            (rule("", "10.0.0.0/7", &[5432]), 0),
            (rule("", "11.0.0.0/8", &[5432]), 0),
        ] {
            let p = rules(vec![bad.clone()]).unwrap();
            assert_eq!(cap.check(&p).unwrap_err().0, Some(index), "{bad:?}");
        }
        assert!(EgressCap::Deny.check(&ok).is_err());
        assert_eq!(EgressCap::Any.check(&Egress::Allow), Ok(()));
    }
}
