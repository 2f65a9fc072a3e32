//! The IPython side of the edge: IPython actions and InspectVariables names are validated by the model's
//! rules; cell outputs and results, and the kernel's variable summaries, become proto messages (JSON
//! becomes google.protobuf.Struct).

use std::collections::BTreeMap;

use mentis_model::kernel::validate_names;
use mentis_model::{IPythonAction, IPythonOutput, IPythonOutputKind, IPythonResult, IPythonStatus};
use mentis_proto::executor as api;
use prost_types::value::Kind;
use serde_json::Value;

use crate::error::Error;

/// Validates an IPython action.
pub(super) fn cell_action(cell: api::IPythonAction) -> Result<IPythonAction, Error> {
    let api::IPythonAction {
        code,
        timeout_seconds,
        rollback_on_error,
    } = cell;
    Ok(IPythonAction::validate(
        code,
        timeout_seconds,
        rollback_on_error.unwrap_or(true),
    )?)
}

/// Validates InspectVariables names: Python identifiers only, so they can be handed to the kernel as a
/// literal without any quoting concerns.
pub(crate) fn inspect_names(names: Vec<String>) -> Result<Vec<String>, Error> {
    validate_names(&names)?;
    Ok(names)
}

pub(super) fn cell_output(output: IPythonOutput) -> api::IPythonOutput {
    let kind = match output.kind {
        IPythonOutputKind::Stdout => api::IpythonOutputKind::StreamStdout,
        IPythonOutputKind::Stderr => api::IpythonOutputKind::StreamStderr,
        IPythonOutputKind::DisplayData => api::IpythonOutputKind::DisplayData,
        IPythonOutputKind::ExecuteResult => api::IpythonOutputKind::ExecuteResult,
        IPythonOutputKind::UpdateDisplayData => api::IpythonOutputKind::UpdateDisplayData,
    };
    api::IPythonOutput {
        kind: kind as i32,
        text: output.text,
        data: output.data.into_iter().collect(),
        display_id: output.display_id,
    }
}

pub(super) fn cell_result(result: IPythonResult) -> api::IPythonResult {
    let status = match result.status {
        IPythonStatus::Ok => api::IpythonStatus::Ok,
        IPythonStatus::Error => api::IpythonStatus::Error,
        IPythonStatus::Aborted => api::IpythonStatus::Aborted,
    };
    api::IPythonResult {
        status: status as i32,
        execution_count: result.execution_count,
        error_name: result.error_name,
        error_value: result.error_value,
        traceback: result.traceback,
        reason: result.reason,
        duration: prost_types::Duration::try_from(result.duration).ok(),
    }
}

/// The kernel helper's answer (a JSON list of `{name, type, summary}`) as proto summaries. Entries of any
/// other shape are skipped: the helper is ours, so they would be a bug, not user data.
pub(crate) fn variable_summaries(answer: Value) -> Vec<api::VariableSummary> {
    let Value::Array(entries) = answer else {
        return Vec::new();
    };
    entries
        .into_iter()
        .filter_map(|entry| {
            let Value::Object(mut entry) = entry else {
                return None;
            };
            let name = entry.remove("name")?.as_str()?.to_owned();
            let r#type = entry
                .remove("type")
                .and_then(|t| t.as_str().map(str::to_owned))
                .unwrap_or_default();
            let summary = match entry.remove("summary") {
                Some(Value::Object(fields)) => Some(to_struct(fields)),
                _ => None,
            };
            Some(api::VariableSummary {
                name,
                r#type,
                summary,
            })
        })
        .collect()
}

fn to_struct(fields: serde_json::Map<String, Value>) -> prost_types::Struct {
    prost_types::Struct {
        fields: fields
            .into_iter()
            .map(|(k, v)| (k, to_value(v)))
            .collect::<BTreeMap<_, _>>(),
    }
}

fn to_value(value: Value) -> prost_types::Value {
    let kind = match value {
        Value::Null => Kind::NullValue(prost_types::NullValue::NullValue as i32),
        Value::Bool(b) => Kind::BoolValue(b),
        // Struct numbers are doubles; the helper sends integers beyond 2^53 as strings already.
        Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(f64::NAN)),
        Value::String(s) => Kind::StringValue(s),
        Value::Array(items) => Kind::ListValue(prost_types::ListValue {
            values: items.into_iter().map(to_value).collect(),
        }),
        Value::Object(fields) => Kind::StructValue(to_struct(fields)),
    };
    prost_types::Value { kind: Some(kind) }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    use std::time::Duration;

    use mentis_model::action::MAX_CODE_BYTES;
    use mentis_model::kernel::MAX_INSPECT_NAMES;

    fn cell(code: &str) -> api::IPythonAction {
        api::IPythonAction {
            code: code.into(),
            timeout_seconds: 0,
            rollback_on_error: None,
        }
    }

    #[test]
    fn cells_are_validated() {
        assert!(matches!(
            cell_action(cell("  \n")),
            Err(Error::InvalidArgument(_))
        ));
        assert!(cell_action(cell(&"x".repeat(MAX_CODE_BYTES))).is_ok());
        let huge = "x".repeat(MAX_CODE_BYTES + 1);
        assert!(matches!(
            cell_action(cell(&huge)),
            Err(Error::InvalidArgument(m)) if m.contains("limit")
        ));
        let mut with_options = cell("1");
        with_options.timeout_seconds = 5;
        with_options.rollback_on_error = Some(false);
        let action = cell_action(with_options).unwrap();
        assert_eq!(action.timeout, Duration::from_secs(5));
        assert!(!action.rollback_on_error);
    }

    #[test]
    fn names_must_be_identifiers() {
        assert!(inspect_names(vec!["df".into(), "_x1".into(), "é".into()]).is_ok());
        for bad in ["", "1x", "a b", "a\"]", "x.y", "__import__('os')"] {
            assert!(inspect_names(vec![bad.into()]).is_err(), "{bad:?}");
        }
        assert!(inspect_names(vec!["a".into(); MAX_INSPECT_NAMES + 1]).is_err());
    }

    #[test]
    fn summaries_become_structs() {
        let answer = serde_json::json!([
            {"name": "df", "type": "DataFrame", "summary": {"shape": [3, 2], "head": [{"a": 1, "b": null}]}},
            {"name": "s", "type": "str", "summary": {"value": "hi", "flag": true}},
            "garbage",
        ]);
        let summaries = variable_summaries(answer);
        assert_eq!(summaries.len(), 2);
        assert_eq!(summaries[0].name, "df");
        assert_eq!(summaries[0].r#type, "DataFrame");
        let fields = &summaries[0].summary.as_ref().unwrap().fields;
        let Some(Kind::ListValue(shape)) = &fields["shape"].kind else {
            panic!("shape is a list")
        };
        assert_eq!(shape.values[0].kind, Some(Kind::NumberValue(3.0)));
        let fields = &summaries[1].summary.as_ref().unwrap().fields;
        assert_eq!(fields["value"].kind, Some(Kind::StringValue("hi".into())));
        assert_eq!(fields["flag"].kind, Some(Kind::BoolValue(true)));
    }
}
