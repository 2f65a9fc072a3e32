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
    use serde_json::Number;

    // The other way (what the executor client does with the executor's summaries), to read back.
    fn value_to_json(v: prost_types::Value) -> Value {
        match v.kind {
            None | Some(Kind::NullValue(_)) => Value::Null,
            Some(Kind::BoolValue(b)) => Value::Bool(b),
            // JSON numbers of the Struct are doubles; whole ones read back as integers.
            Some(Kind::NumberValue(n)) => {
                if n.fract() == 0.0 && n.abs() < 9.0e15 {
                    #[allow(clippy::cast_possible_truncation)]
                    Value::Number(Number::from(n as i64))
                } else {
                    Number::from_f64(n).map_or(Value::Null, Value::Number)
                }
            }
            Some(Kind::StringValue(s)) => Value::String(s),
            Some(Kind::ListValue(l)) => {
                Value::Array(l.values.into_iter().map(value_to_json).collect())
            }
            Some(Kind::StructValue(s)) => Value::Object(struct_to_json(s)),
        }
    }

    fn struct_to_json(s: prost_types::Struct) -> Map<String, Value> {
        s.fields
            .into_iter()
            .map(|(k, v)| (k, value_to_json(v)))
            .collect()
    }

    #[test]
    fn json_round_trips_through_struct() {
        let json: Map<String, Value> = serde_json::from_str(
            r#"{"shape": [1000000, 3], "columns": ["a", "b"], "ok": true, "none": null, "x": 1.5, "nested": {"k": "v"}}"#,
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
        assert_eq!(proto.summary.map(struct_to_json), Some(s.summary));
    }
}
