//! Egress flags of `mentis sandbox create` and `mentis sandbox egress` (docs/EGRESS.md): `--egress MODE`,
//! `--allow TARGET[:PORT,...]` and `--header 'DOMAIN=Name: value'`, made into `SandboxSpec.egress` and
//! `egress_rules`; and a sandbox's rules as JSON and as text.
//!
//! Only the flags' own syntax is checked here. Names, networks, ports, header names and the secrets they
//! name are the runtime's to check: its INVALID_ARGUMENT names the rule (`spec.egress_rules[1].cidr`).

use clap::Args;
use mentis_proto::api;
use serde_json::{Value, json};

use crate::error::{Failure, Result};
use crate::output;

/// What code in a sandbox may reach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// Nothing: only the runtime reaches it.
    Deny,
    /// Anything outside the host.
    Allow,
    /// Only what its rules allow (--allow), through the runtime's egress gateway.
    Rules,
}

impl From<Mode> for api::Egress {
    fn from(m: Mode) -> Self {
        match m {
            Mode::Deny => Self::Deny,
            Mode::Allow => Self::Allow,
            Mode::Rules => Self::Rules,
        }
    }
}

#[derive(Args, Debug)]
pub struct EgressArgs {
    /// What code in the sandbox may reach: deny (nothing), allow (anything outside the host) or rules
    /// (only what --allow names). Default: the template's, else the space's, else the runtime's (deny
    /// unless set); --allow or --header alone mean rules.
    #[arg(long, value_enum, value_name = "MODE")]
    pub egress: Option<Mode>,
    /// A destination the sandbox may reach (repeatable): a host name (pkgs.example.org), every name under one
    /// ('*.files.example.org'), or an IPv4 network (10.0.0.0/8), with its ports after a colon
    /// (api.example.com:443, 10.0.0.0/8:5432,5433; default: 80 and 443).
    #[arg(long = "allow", value_name = "TARGET[:PORT,...]")]
    pub allow: Vec<String>,
    /// An HTTP header the egress gateway sets on every request to DOMAIN, replacing the sandbox's own
    /// (repeatable). `{secret:NAME}` in the value is the space's secret NAME (`mentis secret set`), which
    /// never enters the sandbox. A DOMAIN no --allow names is allowed on ports 80 and 443.
    #[arg(long = "header", value_name = "DOMAIN=NAME: VALUE")]
    pub headers: Vec<String>,
}

impl EgressArgs {
    /// Whether any egress flag was given.
    pub fn given(&self) -> bool {
        self.egress.is_some() || !self.allow.is_empty() || !self.headers.is_empty()
    }

    /// The mode asked for (None: none named) and the rules, in the order of the flags: one per --allow,
    /// then one per DOMAIN of a --header that no --allow named. Bad syntax is a usage error.
    pub fn policy(&self) -> Result<(Option<api::Egress>, Vec<api::EgressRule>)> {
        let rules = rules(&self.allow, &self.headers).map_err(Failure::Usage)?;
        if let Some(mode @ (Mode::Deny | Mode::Allow)) = self.egress
            && !rules.is_empty()
        {
            let mode = if mode == Mode::Deny { "deny" } else { "allow" };
            return Err(Failure::Usage(format!(
                "--allow and --header make rules, which are for --egress rules, not --egress {mode}"
            )));
        }
        Ok((self.egress.map(api::Egress::from), rules))
    }
}

/// The rules of `--allow` and `--header` flags.
fn rules(
    allow: &[String],
    headers: &[String],
) -> std::result::Result<Vec<api::EgressRule>, String> {
    let mut rules = allow
        .iter()
        .map(String::as_str)
        .map(parse_allow)
        .collect::<std::result::Result<Vec<_>, _>>()?;
    for h in headers {
        let (domain, header) = parse_header(h)?;
        let mut named = false;
        for r in rules
            .iter_mut()
            .filter(|r| !r.domain.is_empty() && r.domain.eq_ignore_ascii_case(&domain))
        {
            r.headers.push(header.clone());
            named = true;
        }
        if !named {
            rules.push(api::EgressRule {
                domain,
                headers: vec![header],
                ..Default::default()
            });
        }
    }
    Ok(rules)
}

/// `TARGET[:PORT[,PORT...]]`: a CIDR when TARGET has a '/', else a domain.
fn parse_allow(arg: &str) -> std::result::Result<api::EgressRule, String> {
    const EXPECTED: &str = "expected a domain, *.domain or an IPv4 CIDR, optionally followed by \
                            :PORT[,PORT...] (pkgs.example.org, '*.files.example.org', 10.0.0.0/8:5432)";
    let (target, ports) = match arg.split_once(':') {
        Some((target, ports)) => (target.trim(), Some(ports)),
        None => (arg.trim(), None),
    };
    if target.is_empty() {
        return Err(format!("--allow {arg:?} names no destination: {EXPECTED}"));
    }
    let ports = match ports {
        None => Vec::new(),
        Some(ports) => ports
            .split(',')
            .map(|p| {
                p.trim()
                    .parse::<u16>()
                    .ok()
                    .filter(|p| *p != 0)
                    .map(u32::from)
                    .ok_or_else(|| {
                        format!("--allow {arg:?}: {p:?} is not a port (1-65535): {EXPECTED}")
                    })
            })
            .collect::<std::result::Result<Vec<_>, _>>()?,
    };
    let (domain, cidr) = if target.contains('/') {
        (String::new(), target.to_owned())
    } else {
        (target.to_owned(), String::new())
    };
    Ok(api::EgressRule {
        domain,
        cidr,
        ports,
        headers: Vec::new(),
    })
}

/// `DOMAIN=Name: value` (spaces after the colon are not part of the value).
fn parse_header(arg: &str) -> std::result::Result<(String, api::EgressHeader), String> {
    let bad = || {
        format!(
            "--header {arg:?} is not DOMAIN=NAME: VALUE (e.g. 'api.example.com=Authorization: Bearer {{secret:API_TOKEN}}')"
        )
    };
    let (domain, header) = arg.split_once('=').ok_or_else(bad)?;
    let (name, value) = header.split_once(':').ok_or_else(bad)?;
    let (domain, name) = (domain.trim(), name.trim());
    if domain.is_empty() || name.is_empty() {
        return Err(bad());
    }
    if domain.contains(':') {
        return Err(format!(
            "--header {arg:?}: DOMAIN is a name alone; give its ports with --allow DOMAIN:PORT"
        ));
    }
    Ok((
        domain.to_owned(),
        api::EgressHeader {
            name: name.to_owned(),
            value: value.trim_start_matches([' ', '\t']).to_owned(),
        },
    ))
}

/// Rules as JSON: the proto's field names.
pub fn rules_json(rules: &[api::EgressRule]) -> Value {
    Value::Array(
        rules
            .iter()
            .map(|r| {
                json!({
                    "domain": r.domain,
                    "cidr": r.cidr,
                    "ports": r.ports,
                    "headers": r.headers.iter().map(|h| json!({"name": h.name, "value": h.value})).collect::<Vec<_>>(),
                })
            })
            .collect(),
    )
}

/// A sandbox's policy as JSON: its id, mode and rules.
pub fn policy_json(s: &api::Sandbox) -> Value {
    json!({
        "sandbox_id": s.sandbox_id,
        "egress": mode_name(s),
        "egress_rules": rules_json(&s.egress_rules),
    })
}

/// The mode's name without its prefix: `RULES`.
pub fn mode_name(s: &api::Sandbox) -> String {
    output::enum_name(s.egress().as_str_name(), "EGRESS_")
}

/// A sandbox's policy as text, in the flags' own terms: `egress RULES`, then `allow TARGET:PORTS` a rule
/// and `header DOMAIN=Name: value` a header.
pub fn policy_lines(s: &api::Sandbox) -> Vec<(&'static str, String)> {
    let mut lines = vec![("egress", mode_name(s))];
    for r in &s.egress_rules {
        let target = if r.domain.is_empty() {
            &r.cidr
        } else {
            &r.domain
        };
        let ports = r
            .ports
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(",");
        lines.push((
            "allow",
            if ports.is_empty() {
                target.clone()
            } else {
                format!("{target}:{ports}")
            },
        ));
        for h in &r.headers {
            lines.push(("header", format!("{target}={}: {}", h.name, h.value)));
        }
    }
    lines
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn args(egress: Option<Mode>, allow: &[&str], headers: &[&str]) -> EgressArgs {
        EgressArgs {
            egress,
            allow: allow.iter().map(|s| (*s).to_owned()).collect(),
            headers: headers.iter().map(|s| (*s).to_owned()).collect(),
        }
    }

    fn rule(domain: &str, cidr: &str, ports: &[u32], headers: &[(&str, &str)]) -> api::EgressRule {
        api::EgressRule {
            domain: domain.into(),
            cidr: cidr.into(),
            ports: ports.to_vec(),
            headers: headers
                .iter()
                .map(|(n, v)| api::EgressHeader {
                    name: (*n).into(),
                    value: (*v).into(),
                })
                .collect(),
        }
    }

    #[test]
    fn allow_and_header_flags_make_rules_in_their_order() {
        let a = args(
            None,
            &[
                "pkgs.example.org",
                "*.files.example.org",
                "10.0.0.0/8:5432",
                "api.example.com:443, 8443",
            ],
            &[
                "API.example.com=Authorization: Bearer {secret:API_TOKEN}",
                "index.example.com=X-Key:{secret:KEY}",
                "index.example.com=X-Team:  ml",
            ],
        );
        let (mode, rules) = a.policy().unwrap();
        assert_eq!(mode, None);
        assert_eq!(
            rules,
            vec![
                rule("pkgs.example.org", "", &[], &[]),
                rule("*.files.example.org", "", &[], &[]),
                rule("", "10.0.0.0/8", &[5432], &[]),
                rule(
                    "api.example.com",
                    "",
                    &[443, 8443],
                    &[("Authorization", "Bearer {secret:API_TOKEN}")]
                ),
                // The second header of index.example.com joins the rule its first one made.
                rule(
                    "index.example.com",
                    "",
                    &[],
                    &[("X-Key", "{secret:KEY}"), ("X-Team", "ml")]
                ),
            ]
        );
        assert_eq!(
            args(Some(Mode::Rules), &[], &[]).policy().unwrap(),
            (Some(api::Egress::Rules), vec![])
        );
        assert_eq!(
            args(Some(Mode::Deny), &[], &[]).policy().unwrap(),
            (Some(api::Egress::Deny), vec![])
        );
    }

    #[test]
    fn bad_flags_are_usage_errors_and_names_are_left_to_the_runtime() {
        for (a, says) in [
            (args(None, &["a b:xx"], &[]), "\"xx\" is not a port"),
            (args(None, &["pkgs.example.org:0"], &[]), "is not a port"),
            (
                args(None, &["pkgs.example.org:70000"], &[]),
                "is not a port",
            ),
            (args(None, &["pkgs.example.org:"], &[]), "is not a port"),
            (args(None, &["pkgs.example.org:443,"], &[]), "is not a port"),
            (args(None, &[":443"], &[]), "names no destination"),
            (
                args(None, &[], &["api.example.com"]),
                "is not DOMAIN=NAME: VALUE",
            ),
            (
                args(None, &[], &["api.example.com=NoColon"]),
                "is not DOMAIN",
            ),
            (args(None, &[], &["=X: y"]), "is not DOMAIN"),
            (args(None, &[], &["a.test=: y"]), "is not DOMAIN"),
            (
                args(None, &[], &["a.test:443=X: y"]),
                "give its ports with --allow",
            ),
            (
                args(Some(Mode::Deny), &["pkgs.example.org"], &[]),
                "not --egress deny",
            ),
            (
                args(Some(Mode::Allow), &[], &["a.test=X: y"]),
                "not --egress allow",
            ),
        ] {
            match a.policy() {
                Err(Failure::Usage(m)) => assert!(m.contains(says), "{a:?}: {m}"),
                other => panic!("{a:?}: {other:?}"),
            }
        }
        // What only the runtime knows is sent as given.
        let (_, rules) = args(None, &["*", "a b", "10.0.0.1/33:22"], &[])
            .policy()
            .unwrap();
        assert_eq!(
            rules,
            vec![
                rule("*", "", &[], &[]),
                rule("a b", "", &[], &[]),
                rule("", "10.0.0.1/33", &[22], &[]),
            ]
        );
    }

    #[test]
    fn a_policy_prints_in_the_flags_terms() {
        let s = api::Sandbox {
            egress: api::Egress::Rules as i32,
            egress_rules: vec![
                rule("pkgs.example.org", "", &[80, 443], &[]),
                rule("", "10.0.0.0/8", &[5432], &[]),
                rule(
                    "api.test",
                    "",
                    &[443],
                    &[("Authorization", "Bearer {secret:T}")],
                ),
            ],
            ..Default::default()
        };
        assert_eq!(
            policy_lines(&s),
            vec![
                ("egress", "RULES".to_owned()),
                ("allow", "pkgs.example.org:80,443".to_owned()),
                ("allow", "10.0.0.0/8:5432".to_owned()),
                ("allow", "api.test:443".to_owned()),
                (
                    "header",
                    "api.test=Authorization: Bearer {secret:T}".to_owned()
                ),
            ]
        );
        assert_eq!(
            policy_json(&s)["egress_rules"][2]["headers"][0]["value"],
            "Bearer {secret:T}"
        );
    }
}
