//! toolgate's Slack connector: `slack.post_message`, `slack.post_blocks`,
//! `slack.post_threaded` and `slack.channel_history`.
//!
//! - **Credentials**: the tenant's `slack_default` secret, a bot token (`xoxb-`), an
//!   incoming-webhook URL, or a JSON object with both and an optional Web API base
//!   (see `credentials.rs`). The bot token wins when both are
//!   present; history needs it.
//! - **Limits**: Block Kit and message limits are checked before anything is sent
//!   (`INVALID_ARGUMENTS` naming the limit).
//! - **Errors**: Slack's `ok: false` names and webhook error bodies become stable codes with
//!   sanitized messages that start with Slack's error name.
//! - **Retries**: through `toolgate-http`: history (idempotent) honours 429 `Retry-After`;
//!   posts are never retried.
//! - **Configuration**: [`SlackConfig`], passed by the gateway; nothing is read from the
//!   environment.
//!
//! The `testkit` feature adds [`testkit::FakeSlack`], a wiremock server answering in Slack's
//! documented shapes; it is never part of a production build.

mod blocks;
mod config;
mod connector;
mod credentials;
mod errors;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
mod tools;

#[cfg(test)]
mod tests;

pub use blocks::{
    MAX_ACTIONS_ELEMENTS, MAX_BLOCK_ID, MAX_BLOCKS, MAX_CONTEXT_ELEMENTS, MAX_FIELD_TEXT,
    MAX_HEADER_TEXT, MAX_IMAGE_TEXT, MAX_IMAGE_URL, MAX_MARKDOWN_TOTAL, MAX_MESSAGE_TEXT,
    MAX_SECTION_FIELDS, MAX_SECTION_TEXT,
};
pub use config::{DEFAULT_API_BASE_URL, DEFAULT_WEBHOOK_HOST, SlackConfig};
pub use connector::{SlackConfigError, SlackConnector};
pub use credentials::SECRET_NAME;
pub use tools::MAX_HISTORY_LIMIT;
