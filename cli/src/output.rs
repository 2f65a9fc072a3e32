//! How records are printed: aligned text for people, JSON for programs (`--output json`).

use serde_json::{Value, json};

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Json,
}

/// A timestamp as RFC 3339 (UTC, seconds), or null.
pub fn time(t: Option<&prost_types::Timestamp>) -> Value {
    t.map_or(Value::Null, |t| Value::String(rfc3339(t)))
}

pub fn rfc3339(t: &prost_types::Timestamp) -> String {
    // prost-types prints RFC 3339 (with nanoseconds when any); keep whole seconds for readability.
    let t = prost_types::Timestamp {
        seconds: t.seconds,
        nanos: 0,
    };
    t.to_string()
}

/// An enum's proto name without its type prefix: `SANDBOX_STATE_RUNNING` -> `RUNNING`.
pub fn enum_name(name: &str, prefix: &str) -> String {
    name.strip_prefix(prefix).unwrap_or(name).to_owned()
}

/// A map as a JSON object with sorted keys.
pub fn map(m: &std::collections::HashMap<String, String>) -> Value {
    let sorted: std::collections::BTreeMap<_, _> = m.iter().collect();
    json!(sorted)
}

/// Prints rows as columns padded to the widest cell (the last column is not padded).
pub fn table(header: &[&str], rows: &[Vec<String>]) {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let n = cells.len();
        let mut s = String::new();
        for (i, (c, w)) in cells.into_iter().zip(&widths).enumerate() {
            if i + 1 == n {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  "));
            }
        }
        println!("{}", s.trim_end());
    };
    line(header.to_vec());
    for r in rows {
        line(r.iter().map(String::as_str).collect());
    }
}

/// Prints a JSON object's fields as `name  value` lines (strings bare, null empty, the rest as JSON).
pub fn fields(v: &Value) {
    if let Value::Object(m) = v {
        for (k, v) in m {
            let v = match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                other => other.to_string(),
            };
            field(k, &v);
        }
    }
}

/// Prints one `name  value` line, aligned as [`fields`] aligns them.
pub fn field(name: &str, value: &str) {
    println!("{name:<22}{value}");
}

/// Prints a JSON value, pretty.
pub fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).unwrap_or_else(|_| v.to_string())
    );
}
