//! Variable summaries: JSON (the domain) → `google.protobuf.Struct` (the public API).

use mentis_core::VariableSummary;
use mentis_proto::api;
use prost_types::value::Kind;
use serde_json::{Map, Value};

fn json_to_value(v: &Value) -> prost_types::Value {
    let kind = match v {
        Value::Null => Kind::NullValue(0),
        Value::Bool(b) => Kind::BoolValue(*b),
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => Kind::StringValue(s.clone()),
        Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(json_to_value).collect(),
        }),
        Value::Object(o) => Kind::StructValue(json_to_struct(o)),
    };
    prost_types::Value { kind: Some(kind) }
}

fn json_to_struct(m: &Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: m
            .iter()
            .map(|(k, v)| (k.clone(), json_to_value(v)))
            .collect(),
    }
}

/// A summary for the public API.
pub fn summary_to_proto(s: &VariableSummary) -> api::VariableSummary {
    api::VariableSummary {
        name: s.name.clone(),
        r#type: s.type_name.clone(),
        summary: Some(json_to_struct(&s.summary)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn number(n: f64) -> prost_types::Value {
        prost_types::Value {
            kind: Some(Kind::NumberValue(n)),
        }
    }

    #[test]
    fn json_becomes_a_struct_value_by_value() {
        let json: Map<String, Value> = serde_json::from_str(
            r#"{"shape": [1000000, 3], "ok": true, "none": null, "x": 1.5, "nested": {"k": "v"}}"#,
        )
        .expect("valid json");
        let s = VariableSummary {
            name: "df".into(),
            type_name: "DataFrame".into(),
            summary: json,
        };
        let proto = summary_to_proto(&s);
        assert_eq!(
            (proto.name.as_str(), proto.r#type.as_str()),
            ("df", "DataFrame")
        );
        let fields = proto.summary.expect("a summary").fields;
        let nested = prost_types::Struct {
            fields: [(
                "k".to_owned(),
                prost_types::Value {
                    kind: Some(Kind::StringValue("v".into())),
                },
            )]
            .into(),
        };
        let want: [(&str, Kind); 5] = [
            (
                "shape",
                Kind::ListValue(prost_types::ListValue {
                    values: vec![number(1_000_000.0), number(3.0)],
                }),
            ),
            ("ok", Kind::BoolValue(true)),
            ("none", Kind::NullValue(0)),
            ("x", Kind::NumberValue(1.5)),
            ("nested", Kind::StructValue(nested)),
        ];
        assert_eq!(fields.len(), want.len());
        for (name, kind) in want {
            assert_eq!(fields[name].kind.as_ref(), Some(&kind), "{name}");
        }
    }
}
