//! A sandbox's egress policy in its row: `egress` 0 (deny), 1 (allow) or 2 (rules), and the rules as JSON
//! in `egress_rules`, read back through the same validation as a request's (a row that no longer passes is
//! read as deny: closed, never open).

use mentis_core::egress::{self, Egress, EgressCap, EgressMode, RuleRequest};
use serde_json::{Value, json};

pub fn mode_to_sql(e: &Egress) -> i64 {
    match e {
        Egress::Deny => 0,
        Egress::Allow => 1,
        Egress::Rules(_) => 2,
    }
}

pub fn rules_to_sql(e: &Egress) -> String {
    let rules: Vec<Value> = e
        .to_requests()
        .into_iter()
        .map(
            |r| json!({"domain": r.domain, "cidr": r.cidr, "ports": r.ports, "headers": r.headers}),
        )
        .collect();
    Value::Array(rules).to_string()
}

pub fn from_sql(mode: i64, rules: &str) -> Egress {
    match mode {
        0 => Egress::Deny,
        1 => Egress::Allow,
        _ => {
            let requests = parse(rules).unwrap_or_default();
            egress::validate(Some(EgressMode::Rules), requests, &Egress::Deny, "egress").unwrap_or_else(|e| {
                tracing::warn!(error = %e, "store: a sandbox's egress rules do not read: it has none now");
                Egress::Rules(Vec::new())
            })
        }
    }
}

/// A space's cap in its row, stored as a policy's shape (`EgressCap::to_egress`); rules that do not read
/// are read as none (the cap then allows nothing beyond DENY).
pub fn cap_from_sql(mode: i64, rules: &str) -> EgressCap {
    EgressCap::from_egress(from_sql(mode, rules))
}

fn parse(rules: &str) -> Option<Vec<RuleRequest>> {
    let Value::Array(items) = serde_json::from_str::<Value>(rules).ok()? else {
        return None;
    };
    items
        .into_iter()
        .map(|r| {
            let text = |k: &str| {
                r.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            Some(RuleRequest {
                domain: text("domain"),
                cidr: text("cidr"),
                ports: r
                    .get("ports")?
                    .as_array()?
                    .iter()
                    .filter_map(|p| p.as_u64().and_then(|p| u32::try_from(p).ok()))
                    .collect(),
                headers: r
                    .get("headers")?
                    .as_array()?
                    .iter()
                    .filter_map(|h| {
                        Some((
                            h.get(0)?.as_str()?.to_owned(),
                            h.get(1)?.as_str()?.to_owned(),
                        ))
                    })
                    .collect(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_policy_reads_back_as_written() {
        let rules = egress::validate(
            None,
            vec![
                RuleRequest {
                    domain: "*.files.example.org".into(),
                    ..Default::default()
                },
                RuleRequest {
                    cidr: "10.0.0.0/8".into(),
                    ports: vec![5432],
                    ..Default::default()
                },
                RuleRequest {
                    domain: "api.example.com".into(),
                    ports: vec![443],
                    headers: vec![("Authorization".into(), "Bearer {secret:TOKEN}".into())],
                    ..Default::default()
                },
            ],
            &Egress::Deny,
            "egress",
        )
        .unwrap();
        for e in [
            Egress::Deny,
            Egress::Allow,
            Egress::Rules(Vec::new()),
            rules,
        ] {
            assert_eq!(from_sql(mode_to_sql(&e), &rules_to_sql(&e)), e);
        }
        // A damaged row closes.
        assert_eq!(from_sql(2, "not json"), Egress::Rules(Vec::new()));
    }
}
