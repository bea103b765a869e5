//! Slack's documented message limits, checked before anything is sent so that a message Slack
//! would reject (or silently truncate) fails at once with `INVALID_ARGUMENTS` naming the limit.
//!
//! Sources (Slack's reference documentation):
//! - Blocks: "You can include up to 50 blocks in each message"
//!   <https://docs.slack.dev/reference/block-kit/blocks>.
//! - Section block: `text` at most 3000 characters; `fields` at most 10 items of at most 2000
//!   characters each <https://docs.slack.dev/reference/block-kit/blocks/section-block>.
//! - Header block: `plain_text` only, at most 150 characters
//!   <https://docs.slack.dev/reference/block-kit/blocks/header-block>.
//! - Context block: at most 10 elements
//!   <https://docs.slack.dev/reference/block-kit/blocks/context-block>.
//! - Actions block: at most 25 elements
//!   <https://api.slack.com/reference/block-kit/blocks#actions>.
//! - Image block: `image_url` at most 3000 characters, `alt_text` at most 2000, `title` at most
//!   2000 <https://docs.slack.dev/reference/block-kit/blocks/image-block>.
//! - Markdown block: the `text` of all markdown blocks in one payload at most 12,000
//!   characters <https://docs.slack.dev/reference/block-kit/blocks/markdown-block>.
//! - Every block: `block_id` at most 255 characters (same references).
//! - Text objects: `type` is `plain_text` or `mrkdwn`, `text` at least 1 character
//!   <https://docs.slack.dev/reference/block-kit/composition-objects/text-object>.
//! - `chat.postMessage`: Slack truncates `text` longer than 40,000 characters
//!   <https://docs.slack.dev/reference/methods/chat.postMessage>; we refuse it instead.
//!
//! Lengths are counted in characters (Unicode scalar values), as Slack documents them. Block
//! types and fields not listed here pass through for Slack to judge.

use serde_json::Value;
use toolgate_core::{ErrorCode, ToolError};

/// The most blocks in one message.
pub const MAX_BLOCKS: usize = 50;
/// The longest top-level message `text`.
pub const MAX_MESSAGE_TEXT: usize = 40_000;
/// The longest section `text`.
pub const MAX_SECTION_TEXT: usize = 3_000;
/// The most section `fields`.
pub const MAX_SECTION_FIELDS: usize = 10;
/// The longest section field text.
pub const MAX_FIELD_TEXT: usize = 2_000;
/// The longest header text.
pub const MAX_HEADER_TEXT: usize = 150;
/// The most context elements.
pub const MAX_CONTEXT_ELEMENTS: usize = 10;
/// The most actions elements.
pub const MAX_ACTIONS_ELEMENTS: usize = 25;
/// The longest `block_id`.
pub const MAX_BLOCK_ID: usize = 255;
/// The longest image URL.
pub const MAX_IMAGE_URL: usize = 3_000;
/// The longest image alt text and title.
pub const MAX_IMAGE_TEXT: usize = 2_000;
/// The most characters across every markdown block of one message.
pub const MAX_MARKDOWN_TOTAL: usize = 12_000;

/// Turns the `blocks` argument (an array, or a string holding a JSON array, which LLMs often
/// send) into checked blocks.
pub(crate) fn parse_blocks(argument: &Value) -> Result<Vec<Value>, ToolError> {
    let parsed;
    let value = match argument {
        Value::String(text) => {
            parsed = serde_json::from_str::<Value>(text).map_err(|e| {
                invalid(format!(
                    "`blocks` is a string but not valid JSON (line {}, column {}); pass a JSON array of Block Kit blocks",
                    e.line(),
                    e.column()
                ))
            })?;
            &parsed
        }
        other => other,
    };
    let Value::Array(blocks) = value else {
        return Err(invalid(
            "`blocks` must be a JSON array of Block Kit blocks, e.g. [{\"type\": \"section\", \"text\": {\"type\": \"mrkdwn\", \"text\": \"hi\"}}]",
        ));
    };
    if blocks.is_empty() {
        return Err(invalid("`blocks` is empty; give at least one block"));
    }
    check_blocks(blocks)?;
    Ok(blocks.clone())
}

/// Checks the top-level message text.
pub(crate) fn check_message_text(text: &str) -> Result<(), ToolError> {
    let length = text.chars().count();
    if length > MAX_MESSAGE_TEXT {
        return Err(invalid(format!(
            "`text` has {length} characters; Slack allows at most {MAX_MESSAGE_TEXT} per message (chat.postMessage); split it into several messages"
        )));
    }
    Ok(())
}

/// Checks every limit above over a block list.
pub(crate) fn check_blocks(blocks: &[Value]) -> Result<(), ToolError> {
    if blocks.len() > MAX_BLOCKS {
        return Err(invalid(format!(
            "{} blocks given; Slack allows at most {MAX_BLOCKS} blocks per message",
            blocks.len()
        )));
    }
    let mut markdown_total = 0usize;
    for (index, block) in blocks.iter().enumerate() {
        let at = |what: &str| format!("blocks[{index}]{what}");
        let Value::Object(fields) = block else {
            return Err(invalid(format!("{} must be an object", at(""))));
        };
        let Some(kind) = fields.get("type").and_then(Value::as_str) else {
            return Err(invalid(format!(
                "{} has no string `type` (section, header, divider, context, actions, image, markdown, ...)",
                at("")
            )));
        };
        if let Some(id) = fields.get("block_id") {
            check_len(id, &at(".block_id"), MAX_BLOCK_ID, "block_id")?;
        }
        match kind {
            "section" => {
                let text = fields.get("text");
                let section_fields = fields.get("fields");
                if text.is_none() && section_fields.is_none() {
                    return Err(invalid(format!(
                        "{} is a section with neither `text` nor `fields`",
                        at("")
                    )));
                }
                if let Some(text) = text {
                    check_text_object(text, &at(".text"), MAX_SECTION_TEXT, "section text")?;
                }
                if let Some(section_fields) = section_fields {
                    let Value::Array(items) = section_fields else {
                        return Err(invalid(format!("{} must be an array", at(".fields"))));
                    };
                    if items.len() > MAX_SECTION_FIELDS {
                        return Err(invalid(format!(
                            "{} has {} items; Slack allows at most {MAX_SECTION_FIELDS} section fields",
                            at(".fields"),
                            items.len()
                        )));
                    }
                    for (i, item) in items.iter().enumerate() {
                        check_text_object(
                            item,
                            &at(&format!(".fields[{i}]")),
                            MAX_FIELD_TEXT,
                            "section field text",
                        )?;
                    }
                }
            }
            "header" => {
                let Some(text) = fields.get("text") else {
                    return Err(invalid(format!("{} is a header without `text`", at(""))));
                };
                check_text_object(text, &at(".text"), MAX_HEADER_TEXT, "header text")?;
                if text.get("type").and_then(Value::as_str) != Some("plain_text") {
                    return Err(invalid(format!(
                        "{} must be a plain_text object (Slack headers do not take mrkdwn)",
                        at(".text")
                    )));
                }
            }
            "context" => {
                check_elements(
                    fields.get("elements"),
                    &at(".elements"),
                    MAX_CONTEXT_ELEMENTS,
                    "context",
                )?;
            }
            "actions" => {
                check_elements(
                    fields.get("elements"),
                    &at(".elements"),
                    MAX_ACTIONS_ELEMENTS,
                    "actions",
                )?;
            }
            "image" => {
                if let Some(url) = fields.get("image_url") {
                    check_len(url, &at(".image_url"), MAX_IMAGE_URL, "image URL")?;
                }
                if let Some(alt) = fields.get("alt_text") {
                    check_len(alt, &at(".alt_text"), MAX_IMAGE_TEXT, "image alt text")?;
                }
                if let Some(title) = fields.get("title") {
                    check_text_object(title, &at(".title"), MAX_IMAGE_TEXT, "image title")?;
                }
            }
            "markdown" => {
                let Some(text) = fields.get("text").and_then(Value::as_str) else {
                    return Err(invalid(format!("{} must be a string", at(".text"))));
                };
                markdown_total += text.chars().count();
                if markdown_total > MAX_MARKDOWN_TOTAL {
                    return Err(invalid(format!(
                        "the markdown blocks up to {} have {markdown_total} characters; Slack allows at most {MAX_MARKDOWN_TOTAL} across all markdown blocks of a message",
                        at("")
                    )));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

fn check_elements(
    elements: Option<&Value>,
    at: &str,
    max: usize,
    block: &str,
) -> Result<(), ToolError> {
    let Some(Value::Array(items)) = elements else {
        return Err(invalid(format!("{at} must be an array")));
    };
    if items.is_empty() {
        return Err(invalid(format!("{at} is empty")));
    }
    if items.len() > max {
        return Err(invalid(format!(
            "{at} has {} elements; Slack allows at most {max} in one {block} block",
            items.len()
        )));
    }
    Ok(())
}

/// A text object: `{"type": "plain_text" | "mrkdwn", "text": "..."}` within `max` characters.
fn check_text_object(value: &Value, at: &str, max: usize, what: &str) -> Result<(), ToolError> {
    let kind = value.get("type").and_then(Value::as_str);
    if !matches!(kind, Some("plain_text" | "mrkdwn")) {
        return Err(invalid(format!(
            "{at} must be a text object with \"type\": \"plain_text\" or \"mrkdwn\""
        )));
    }
    let Some(text) = value.get("text") else {
        return Err(invalid(format!("{at} has no `text`")));
    };
    check_len(text, &format!("{at}.text"), max, what)
}

fn check_len(value: &Value, at: &str, max: usize, what: &str) -> Result<(), ToolError> {
    let Some(text) = value.as_str() else {
        return Err(invalid(format!("{at} must be a string")));
    };
    let length = text.chars().count();
    if length == 0 {
        return Err(invalid(format!("{at} is empty")));
    }
    if length > max {
        return Err(invalid(format!(
            "{at} has {length} characters; Slack allows at most {max} for {what}"
        )));
    }
    Ok(())
}

pub(crate) fn invalid(message: impl Into<String>) -> ToolError {
    let message: String = message.into();
    ToolError::new(
        ErrorCode::InvalidArguments,
        format!("{message}; nothing was sent to Slack"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn section(text: &str) -> Value {
        json!({"type": "section", "text": {"type": "mrkdwn", "text": text}})
    }

    /// One case: blocks, and `None` when they pass or a fragment the error must contain.
    fn check(blocks: Value, expected: Option<&str>) {
        let outcome = parse_blocks(&blocks);
        match (outcome, expected) {
            (Ok(_), None) => {}
            (Err(err), Some(fragment)) => {
                assert_eq!(err.code, ErrorCode::InvalidArguments);
                assert!(
                    err.message.contains(fragment),
                    "{fragment}: {}",
                    err.message
                );
            }
            (outcome, expected) => panic!("{blocks}: {outcome:?}, expected {expected:?}"),
        }
    }

    #[test]
    fn limits_at_and_over_the_edge() {
        let a = |n: usize| "a".repeat(n);
        let cases: Vec<(Value, Option<&str>)> = vec![
            (json!([section("hello")]), None),
            (json!(vec![json!({"type": "divider"}); 50]), None),
            (
                json!(vec![json!({"type": "divider"}); 51]),
                Some("at most 50 blocks"),
            ),
            (json!([section(&a(3000))]), None),
            (
                json!([section(&a(3001))]),
                Some(
                    "blocks[0].text.text has 3001 characters; Slack allows at most 3000 for section text",
                ),
            ),
            // Characters, not bytes: 3000 two-byte characters pass.
            (json!([section(&"é".repeat(3000))]), None),
            (
                json!([{"type": "section", "fields": vec![json!({"type": "mrkdwn", "text": "x"}); 10]}]),
                None,
            ),
            (
                json!([{"type": "section", "fields": vec![json!({"type": "mrkdwn", "text": "x"}); 11]}]),
                Some("at most 10 section fields"),
            ),
            (
                json!([{"type": "section", "fields": [{"type": "mrkdwn", "text": a(2001)}]}]),
                Some("blocks[0].fields[0].text has 2001 characters; Slack allows at most 2000"),
            ),
            (
                json!([{"type": "header", "text": {"type": "plain_text", "text": a(150)}}]),
                None,
            ),
            (
                json!([{"type": "header", "text": {"type": "plain_text", "text": a(151)}}]),
                Some("at most 150 for header text"),
            ),
            (
                json!([{"type": "header", "text": {"type": "mrkdwn", "text": "x"}}]),
                Some("plain_text"),
            ),
            (
                json!([{"type": "context", "elements": vec![json!({"type": "mrkdwn", "text": "x"}); 11]}]),
                Some("at most 10 in one context block"),
            ),
            (
                json!([{"type": "actions", "elements": vec![json!({"type": "button"}); 26]}]),
                Some("at most 25 in one actions block"),
            ),
            (
                json!([{"type": "divider", "block_id": a(256)}]),
                Some("block_id has 256 characters"),
            ),
            (
                json!([{"type": "image", "image_url": "https://x/y.png", "alt_text": a(2001)}]),
                Some("image alt text"),
            ),
            (
                json!([{"type": "markdown", "text": a(6000)}, {"type": "markdown", "text": a(6001)}]),
                Some("at most 12000 across all markdown blocks"),
            ),
            (
                json!([{"type": "section"}]),
                Some("neither `text` nor `fields`"),
            ),
            (
                json!([{"type": "section", "text": {"type": "html", "text": "x"}}]),
                Some("plain_text\" or \"mrkdwn"),
            ),
            (
                json!([{"type": "section", "text": {"type": "mrkdwn", "text": ""}}]),
                Some("is empty"),
            ),
            (json!([{"text": "no type"}]), Some("no string `type`")),
            (
                json!(["not an object"]),
                Some("blocks[0] must be an object"),
            ),
            (json!([]), Some("`blocks` is empty")),
            (json!({"type": "section"}), Some("must be a JSON array")),
            (json!("[{\"type\": \"divider\"}]"), None),
            (json!("[{\"type\": \"divider\""), Some("not valid JSON")),
        ];
        for (blocks, expected) in cases {
            check(blocks, expected);
        }
    }

    #[test]
    fn message_text_limit() {
        assert!(check_message_text(&"a".repeat(40_000)).is_ok());
        let err = check_message_text(&"a".repeat(40_001)).unwrap_err();
        assert!(err.message.contains("at most 40000"), "{}", err.message);
    }
}
