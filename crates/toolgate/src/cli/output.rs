//! What the commands print: the gateway's answers as proto3 JSON (through the serde support
//! generated in toolgate-proto), with the fields the contract carries as JSON text inlined.
#![allow(
    clippy::print_stdout,
    reason = "printing results is what the CLI is for"
)]

use anyhow::Context as _;
use serde::Serialize;
use serde_json::Value;

/// The suffix of the contract's fields that hold JSON as text (`result_json`, ...).
const JSON_TEXT_SUFFIX: &str = "_json";

/// Prints a protobuf message as proto3 JSON.
pub(crate) fn print_message<M: Serialize>(message: &M) -> anyhow::Result<()> {
    print_json(&message_json(message)?);
    Ok(())
}

/// A protobuf message as proto3 JSON (the .proto's field names, every field, enums by name,
/// 64-bit integers as strings), except that each field holding JSON text (`result_json`,
/// `arguments_json`, ...) is replaced by the JSON it holds, under the name without `_json`
/// (`result`, `arguments`, ...): null when empty, the text itself when it is not JSON.
pub(crate) fn message_json<M: Serialize>(message: &M) -> anyhow::Result<Value> {
    let mut value = serde_json::to_value(message).context("cannot print the gateway's answer")?;
    inline_json_text(&mut value);
    Ok(value)
}

/// Prints JSON, indented.
pub(crate) fn print_json(value: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).unwrap_or_else(|_| value.to_string())
    );
}

/// Prints a line of text.
pub(crate) fn print_text(text: &str) {
    println!("{text}");
}

/// Prints text as it is (it brings its own line ends).
pub(crate) fn print_raw(text: &str) {
    print!("{text}");
}

/// Replaces the JSON-text fields of every message in `value` (nested messages included, the
/// inlined JSON itself left alone), each in its place.
fn inline_json_text(value: &mut Value) {
    match value {
        Value::Object(fields) => {
            let names: Vec<String> = fields.keys().cloned().collect();
            let inlined_name = |name: &str| {
                name.strip_suffix(JSON_TEXT_SUFFIX)
                    .filter(|bare| !bare.is_empty() && !names.iter().any(|n| n == bare))
                    .map(str::to_owned)
            };
            *fields = std::mem::take(fields)
                .into_iter()
                .map(|(name, field)| match (inlined_name(&name), field) {
                    (Some(bare), Value::String(text)) if text.is_empty() => (bare, Value::Null),
                    (Some(bare), Value::String(text)) => {
                        let parsed = serde_json::from_str(&text).unwrap_or(Value::String(text));
                        (bare, parsed)
                    }
                    (_, mut other) => {
                        inline_json_text(&mut other);
                        (name, other)
                    }
                })
                .collect();
        }
        Value::Array(items) => items.iter_mut().for_each(inline_json_text),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use toolgate_proto::v1 as pb;

    use super::*;

    #[test]
    fn json_text_is_inlined_in_nested_messages_and_the_rest_is_proto3_json() {
        let cases = [
            ("", Value::Null),
            (
                r#"{"message": "hi", "raw_json": "{}"}"#,
                json!({"message": "hi", "raw_json": "{}"}),
            ),
            ("not json", json!("not json")),
        ];
        for (text, inlined) in cases {
            let response = pb::ResumeResponse {
                outcome: pb::ResumeOutcome::Executed.into(),
                result: Some(pb::ToolCallResult {
                    status: pb::ToolCallStatus::Succeeded.into(),
                    result_json: text.to_owned(),
                    duration_ms: 7,
                    ..Default::default()
                }),
                ..Default::default()
            };
            let printed = message_json(&[response]).unwrap();
            let expected = json!([{
                "outcome": "RESUME_OUTCOME_EXECUTED", "tool_call_id": "", "expired": false,
                "result": {
                    "tool_call_id": "", "status": "TOOL_CALL_STATUS_SUCCEEDED", "result": inlined,
                    "error_code": "", "error_message": "", "duration_ms": "7", "attempts": 0,
                    "decision": "", "risk_level": "", "pending_invocation_id": "",
                    "replayed": false, "redacted": false, "client_approval_url": "",
                },
            }]);
            assert_eq!(printed, expected, "{text:?}");
            // Each field keeps its place (serde_json keeps maps in order in this build:
            // cedar turns on its `preserve_order`).
            let names: Vec<&String> = printed[0]["result"].as_object().unwrap().keys().collect();
            assert_eq!(
                names[..4],
                ["tool_call_id", "status", "result", "error_code"]
            );
        }
    }
}
