//! Kernel outputs as events, bounded: stream text in pieces of at most 64 KiB cut on UTF-8 boundaries, MIME
//! bundles as text (JSON types serialised), and nothing so large that one gRPC message would exceed the
//! 4 MiB clients accept by default.

use std::collections::BTreeMap;

use mentis_model::{IPythonOutput, IPythonOutputKind};
use serde_json::Value;

/// Largest piece of stream text per event.
pub(crate) const MAX_TEXT_PIECE: usize = 64 * 1024;
/// Largest MIME bundle per event; larger entries are dropped (text/plain is kept, cut if need be).
pub(crate) const MAX_BUNDLE: usize = 3 * 1024 * 1024;
/// Largest error value, and the traceback's total size, in an `ipython_result`.
pub(crate) const MAX_ERROR_TEXT: usize = 256 * 1024;
/// The code echoed in `ipython_start` is cut beyond this (the client has the code it sent).
pub(crate) const MAX_CODE_ECHO: usize = 64 * 1024;

/// Splits `text` into pieces of at most `max` bytes (at least one character each), on char boundaries.
pub(crate) fn pieces(text: &str, max: usize) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut end = rest.len().min(max);
        while !rest.is_char_boundary(end) {
            end -= 1;
        }
        if end == 0 {
            // max is smaller than the first character: take the character whole.
            end = rest.chars().next().map_or(rest.len(), char::len_utf8);
        }
        let (piece, tail) = rest.split_at(end);
        rest = tail;
        Some(piece)
    })
}

/// `text` cut to at most `max` bytes on a char boundary, with a note saying how much was left out.
pub(crate) fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_owned();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}… [{} more bytes not shown]",
        &text[..end],
        text.len() - end
    )
}

/// A display_data / execute_result / update_display_data content as an output event, and the MIME types
/// dropped for size (for an informational `error` event).
pub(crate) fn rich(kind: IPythonOutputKind, content: &Value) -> (IPythonOutput, Vec<String>) {
    let mut data: Vec<(String, String)> = content
        .get("data")
        .and_then(Value::as_object)
        .map(|bundle| {
            bundle
                .iter()
                .map(|(mime, value)| (mime.clone(), mime_text(value)))
                .collect()
        })
        .unwrap_or_default();
    let dropped = fit(&mut data);
    let display_id = content
        .get("transient")
        .and_then(|t| t.get("display_id"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned();
    let output = IPythonOutput {
        kind,
        text: String::new(),
        data: data.into_iter().collect::<BTreeMap<_, _>>(),
        display_id,
    };
    (output, dropped)
}

/// A bundle value as text: strings as they are (images are base64 already), a list of strings (the
/// notebook's multi-line form) joined, anything else (application/json, */*+json) as JSON text.
fn mime_text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Array(lines) if lines.iter().all(Value::is_string) => {
            lines.iter().filter_map(Value::as_str).collect()
        }
        other => other.to_string(),
    }
}

/// Drops the largest entries (never text/plain) until the bundle fits; cuts text/plain if it alone is too
/// large. Returns the dropped MIME types.
fn fit(data: &mut Vec<(String, String)>) -> Vec<String> {
    let mut dropped = Vec::new();
    let size = |data: &Vec<(String, String)>| -> usize {
        data.iter().map(|(k, v)| k.len() + v.len()).sum()
    };
    while size(data) > MAX_BUNDLE {
        let largest = data
            .iter()
            .enumerate()
            .filter(|(_, (mime, _))| mime != "text/plain")
            .max_by_key(|(_, (_, value))| value.len())
            .map(|(i, _)| i);
        match largest {
            Some(i) => dropped.push(data.swap_remove(i).0),
            None => {
                for (_, value) in data.iter_mut() {
                    *value = cut(value, MAX_BUNDLE - 1024);
                }
                break;
            }
        }
    }
    dropped
}

/// A traceback bounded in total size: frames are kept from the start (where the cell is) and the end
/// (where the error is), with a note in between.
pub(crate) fn bounded_traceback(frames: Vec<String>) -> Vec<String> {
    let total: usize = frames.iter().map(String::len).sum();
    if total <= MAX_ERROR_TEXT {
        return frames;
    }
    let half = MAX_ERROR_TEXT / 2;
    let mut head = Vec::new();
    let mut used = 0;
    let mut iter = frames.into_iter();
    let mut tail_rev = Vec::new();
    let mut rest: Vec<String> = Vec::new();
    for frame in iter.by_ref() {
        if used + frame.len() > half {
            rest.push(frame);
            break;
        }
        used += frame.len();
        head.push(frame);
    }
    rest.extend(iter);
    let mut tail_used = 0;
    while let Some(frame) = rest.pop() {
        if tail_used + frame.len() > half {
            rest.push(frame);
            break;
        }
        tail_used += frame.len();
        tail_rev.push(frame);
    }
    let left_out: usize = rest.iter().map(String::len).sum();
    if head.is_empty() && tail_rev.is_empty() {
        // One enormous frame: keep its ends.
        let joined: String = rest.concat();
        return vec![cut(&joined, MAX_ERROR_TEXT)];
    }
    head.push(format!(
        "… [{} traceback entries, {left_out} bytes, not shown]",
        rest.len()
    ));
    head.extend(tail_rev.into_iter().rev());
    head
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use serde_json::json;

    #[test]
    fn pieces_respect_the_bound_and_utf8() {
        let text = "aé€😀".repeat(10_000);
        let parts: Vec<&str> = pieces(&text, 1000).collect();
        assert!(parts.iter().all(|p| p.len() <= 1000 && !p.is_empty()));
        assert_eq!(parts.concat(), text);
        assert_eq!(pieces("😀", 2).collect::<Vec<_>>(), vec!["😀"]);
        assert_eq!(pieces("", 10).count(), 0);
    }

    #[test]
    fn bundles_become_text() {
        let content = json!({
            "data": {
                "text/plain": "df",
                "text/html": ["<b>", "x</b>"],
                "application/json": {"a": [1, 2]},
                "image/png": "iVBORw0KGgo=",
            },
            "metadata": {},
            "transient": {"display_id": "d1"},
        });
        let (output, dropped) = rich(IPythonOutputKind::DisplayData, &content);
        assert!(dropped.is_empty());
        assert_eq!(output.display_id, "d1");
        assert_eq!(output.data["text/html"], "<b>x</b>");
        assert_eq!(output.data["application/json"], r#"{"a":[1,2]}"#);
        assert_eq!(output.data["image/png"], "iVBORw0KGgo=");
    }

    #[test]
    fn oversized_bundles_drop_their_largest_entries() {
        let big = "A".repeat(MAX_BUNDLE);
        let content =
            json!({"data": {"text/plain": "<Figure>", "image/png": big, "text/html": "<img>"}});
        let (output, dropped) = rich(IPythonOutputKind::DisplayData, &content);
        assert_eq!(dropped, vec!["image/png".to_owned()]);
        assert_eq!(output.data["text/plain"], "<Figure>");
        assert!(output.data.contains_key("text/html"));
    }

    #[test]
    fn tracebacks_are_bounded() {
        let frames: Vec<String> = (0..2000)
            .map(|i| format!("{i}:{}", "x".repeat(1000)))
            .collect();
        let kept = bounded_traceback(frames);
        let total: usize = kept.iter().map(String::len).sum();
        assert!(total <= MAX_ERROR_TEXT + 200, "{total}");
        assert!(kept[0].starts_with("0:"));
        assert!(kept.last().unwrap().starts_with("1999:"));
        assert!(kept.iter().any(|f| f.contains("not shown")));
        let small = vec!["a".to_owned(), "b".to_owned()];
        assert_eq!(bounded_traceback(small.clone()), small);
    }
}
