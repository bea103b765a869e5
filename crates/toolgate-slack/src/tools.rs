//! The four tool specs: names, JSON Schemas, descriptions written for an LLM, tags and risk.

use std::time::Duration;

use serde_json::{Value, json};
use toolgate_core::{RiskLevel, SecretName, Tag, ToolName, ToolSpec};

use crate::blocks::{MAX_BLOCKS, MAX_MESSAGE_TEXT};
use crate::credentials::SECRET_NAME;

/// The most messages one `slack.channel_history` call returns.
pub const MAX_HISTORY_LIMIT: u64 = 1000;

fn name(action: &str) -> ToolName {
    ToolName::new(format!("slack.{action}")).expect("static tool name")
}

fn secret() -> SecretName {
    SecretName::new(SECRET_NAME).expect("static secret name")
}

fn channel_property() -> Value {
    json!({
        "type": "string",
        "minLength": 1,
        "maxLength": 80,
        "description": "The channel: an ID such as C0123456789 (preferred), or a name such as #general when posting with a bot token."
    })
}

fn text_property(description: &str) -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": MAX_MESSAGE_TEXT, "description": description})
}

fn blocks_property() -> Value {
    json!({
        "type": ["array", "string"],
        "items": {"type": "object"},
        "minItems": 1,
        "maxItems": MAX_BLOCKS,
        "minLength": 2,
        "description": "Block Kit blocks as a JSON array (or a string holding that array), e.g. [{\"type\": \"header\", \"text\": {\"type\": \"plain_text\", \"text\": \"Deploy done\"}}, {\"type\": \"section\", \"text\": {\"type\": \"mrkdwn\", \"text\": \"*api* v2.4 is live\"}}]. Limits checked before sending: 50 blocks, section text 3000 characters, 10 section fields of 2000, header 150 (plain_text), context 10 elements, actions 25, block_id 255, markdown blocks 12000 in total."
    })
}

fn thread_ts_property() -> Value {
    json!({
        "type": "string",
        "pattern": "^[0-9]+\\.[0-9]+$",
        "description": "The `ts` of the thread's parent message, e.g. 1712345678.123456 (from a post's result or slack.channel_history)."
    })
}

fn post_output() -> Value {
    json!({
        "type": "object",
        "properties": {
            "channel": {"type": ["string", "null"]},
            "ts": {"type": ["string", "null"]},
            "thread_ts": {"type": ["string", "null"]},
            "delivered_via": {"enum": ["web_api", "webhook"]}
        }
    })
}

fn post(spec: ToolSpec) -> ToolSpec {
    spec.tag(Tag::WRITE)
        .tag("slack")
        .tag("messaging")
        .risk(RiskLevel::Medium)
        .idempotent(false)
        .secret(secret())
        .timeout(Duration::from_secs(15))
        .output_schema(post_output())
}

/// Every tool the connector serves.
pub(crate) fn specs() -> Vec<ToolSpec> {
    vec![
        post(ToolSpec::new(
            name("post_message"),
            "Posts a plain-text message to a Slack channel as the workspace's bot. Use for short \
             updates; Slack mrkdwn (*bold*, _italic_, <https://example.com|links>) is rendered. \
             Returns the channel and the message's `ts`, which slack.post_threaded takes as \
             thread_ts. Each call posts a new message: do not repeat a call that succeeded.",
            json!({
                "type": "object",
                "properties": {
                    "channel": channel_property(),
                    "text": text_property("The message, at most 40000 characters."),
                    "unfurl_links": {"type": "boolean", "description": "Whether Slack previews links in the text. Default: Slack's."}
                },
                "required": ["channel", "text"],
                "additionalProperties": false
            }),
        )),
        post(ToolSpec::new(
            name("post_blocks"),
            "Posts a formatted Block Kit message (headers, sections, fields, context, dividers, \
             buttons) to a Slack channel. Give `text` too: it is the notification and \
             screen-reader fallback. Block Kit limits are checked before sending and a broken \
             one is named in the error. Returns the channel and the message's `ts`.",
            json!({
                "type": "object",
                "properties": {
                    "channel": channel_property(),
                    "blocks": blocks_property(),
                    "text": text_property("Fallback text for notifications, at most 40000 characters.")
                },
                "required": ["channel", "blocks"],
                "additionalProperties": false
            }),
        )),
        post(ToolSpec::new(
            name("post_threaded"),
            "Replies in a Slack thread: posts `text` (and optionally Block Kit `blocks`) under the \
             message whose ts is `thread_ts`. Set reply_broadcast to also show the reply in the \
             channel. Returns the channel, the reply's `ts` and the thread_ts.",
            json!({
                "type": "object",
                "properties": {
                    "channel": channel_property(),
                    "thread_ts": thread_ts_property(),
                    "text": text_property("The reply, at most 40000 characters."),
                    "blocks": blocks_property(),
                    "reply_broadcast": {"type": "boolean", "description": "Also post the reply to the channel. Default false."}
                },
                "required": ["channel", "thread_ts", "text"],
                "additionalProperties": false
            }),
        )),
        ToolSpec::new(
            name("channel_history"),
            "Reads a Slack channel's recent messages, newest first: for each, the author's user \
             ID, text, ts, and for threads thread_ts and reply_count. Follows Slack's pagination \
             up to `limit` messages (default 100, at most 1000). Needs a bot token with the \
             history scope and the bot in the channel; webhooks cannot read. Pass the returned \
             next_cursor as `cursor` to continue.",
            json!({
                "type": "object",
                "properties": {
                    "channel": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 80,
                        "description": "The channel ID, e.g. C0123456789 (names are not accepted by Slack here)."
                    },
                    "limit": {"type": "integer", "minimum": 1, "maximum": MAX_HISTORY_LIMIT, "description": "How many messages to return at most. Default 100."},
                    "cursor": {"type": "string", "minLength": 1, "description": "next_cursor from a previous call, to continue."},
                    "oldest": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?$", "description": "Only messages after this ts (Unix time)."},
                    "latest": {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?$", "description": "Only messages before this ts (Unix time)."}
                },
                "required": ["channel"],
                "additionalProperties": false
            }),
        )
        .tag(Tag::READ_ONLY)
        .tag("slack")
        .tag("messaging")
        .risk(RiskLevel::Low)
        .idempotent(true)
        .secret(secret())
        .timeout(Duration::from_secs(30))
        .output_schema(json!({
            "type": "object",
            "properties": {
                "channel": {"type": "string"},
                "messages": {"type": "array", "items": {"type": "object", "properties": {
                    "user": {"type": ["string", "null"]},
                    "text": {"type": "string"},
                    "ts": {"type": "string"},
                    "thread_ts": {"type": ["string", "null"]},
                    "reply_count": {"type": "integer"}
                }}},
                "has_more": {"type": "boolean"},
                "next_cursor": {"type": ["string", "null"]}
            }
        })),
    ]
}
