//! Slack's failures as stable outcomes: `ok: false` answers of the Web API, incoming-webhook
//! error bodies, and transport failures, each turned into a core `ErrorCode` with a sanitized
//! message that starts with Slack's own error name (stable, matchable) and says what to do.
//!
//! Error names: <https://docs.slack.dev/reference/methods/chat.postMessage> and
//! <https://docs.slack.dev/reference/methods/conversations.history> (Errors sections);
//! webhook errors: <https://docs.slack.dev/messaging/sending-messages-using-incoming-webhooks>
//! (Handling errors).

use toolgate_core::{ErrorCode, ToolError};
use toolgate_http::{ErrorKind, HttpError};

/// What Slack's error names mean for the agent: (name, code, explanation).
const WEB_API_ERRORS: &[(&str, ErrorCode, &str)] = &[
    (
        "channel_not_found",
        ErrorCode::InvalidArguments,
        "the channel does not exist or the bot cannot see it; use a channel ID such as C0123456789 from a channel the bot was added to",
    ),
    (
        "not_in_channel",
        ErrorCode::VendorError,
        "the bot is not a member of this channel; someone must invite it (/invite @bot) first",
    ),
    (
        "is_archived",
        ErrorCode::VendorError,
        "the channel is archived and takes no new messages",
    ),
    (
        "restricted_action",
        ErrorCode::VendorError,
        "the workspace does not let this bot post in this channel",
    ),
    (
        "restricted_action_read_only_channel",
        ErrorCode::VendorError,
        "the channel is read-only for this bot",
    ),
    (
        "restricted_action_thread_only_channel",
        ErrorCode::VendorError,
        "the channel accepts thread replies only; use slack.post_threaded",
    ),
    (
        "restricted_action_non_threadable_channel",
        ErrorCode::VendorError,
        "the channel does not accept thread replies",
    ),
    (
        "cannot_reply_to_message",
        ErrorCode::InvalidArguments,
        "this message cannot be replied to in a thread",
    ),
    (
        "thread_not_found",
        ErrorCode::InvalidArguments,
        "no message with this thread_ts exists in the channel",
    ),
    (
        "msg_too_long",
        ErrorCode::InvalidArguments,
        "the message text is too long; shorten it or split it",
    ),
    (
        "msg_blocks_too_long",
        ErrorCode::InvalidArguments,
        "the blocks are too long in total; use fewer or shorter blocks",
    ),
    (
        "no_text",
        ErrorCode::InvalidArguments,
        "the message has no text and no blocks",
    ),
    (
        "invalid_blocks",
        ErrorCode::InvalidArguments,
        "Slack rejected the blocks; check them against the Block Kit reference",
    ),
    (
        "invalid_blocks_format",
        ErrorCode::InvalidArguments,
        "the blocks are not a JSON array of Block Kit blocks",
    ),
    (
        "too_many_attachments",
        ErrorCode::InvalidArguments,
        "too many attachments (at most 100)",
    ),
    (
        "invalid_cursor",
        ErrorCode::InvalidArguments,
        "the pagination cursor is invalid or expired; start again without a cursor",
    ),
    (
        "invalid_ts_latest",
        ErrorCode::InvalidArguments,
        "`latest` is not a valid Slack timestamp",
    ),
    (
        "invalid_ts_oldest",
        ErrorCode::InvalidArguments,
        "`oldest` is not a valid Slack timestamp",
    ),
    (
        "invalid_arguments",
        ErrorCode::InvalidArguments,
        "Slack found the arguments invalid",
    ),
    (
        "ratelimited",
        ErrorCode::VendorRateLimited,
        "Slack is rate limiting this app; wait before trying again",
    ),
    (
        "rate_limited",
        ErrorCode::VendorRateLimited,
        "Slack is rate limiting this app; wait before trying again",
    ),
    (
        "message_limit_exceeded",
        ErrorCode::VendorRateLimited,
        "the workspace reached its message limit",
    ),
    (
        "invalid_auth",
        ErrorCode::CredentialsNotFound,
        "Slack refused the tenant's token; an operator must store a valid bot token in slack_default",
    ),
    (
        "not_authed",
        ErrorCode::CredentialsNotFound,
        "no token reached Slack; an operator must store a bot token in slack_default",
    ),
    (
        "account_inactive",
        ErrorCode::CredentialsNotFound,
        "the token belongs to a deactivated bot or workspace; an operator must store a new bot token",
    ),
    (
        "token_revoked",
        ErrorCode::CredentialsNotFound,
        "the token was revoked; an operator must store a new bot token",
    ),
    (
        "token_expired",
        ErrorCode::CredentialsNotFound,
        "the token expired; an operator must store a new bot token",
    ),
    (
        "not_allowed_token_type",
        ErrorCode::CredentialsNotFound,
        "Slack does not accept this kind of token for this method; store a bot token (xoxb-)",
    ),
    (
        "missing_scope",
        ErrorCode::VendorError,
        "the bot token lacks a scope this method needs (chat:write to post; channels:history, groups:history, im:history or mpim:history to read)",
    ),
    (
        "no_permission",
        ErrorCode::VendorError,
        "the bot has no permission for this",
    ),
    (
        "team_access_not_granted",
        ErrorCode::VendorError,
        "the bot has not been granted access to this workspace",
    ),
    (
        "ekm_access_denied",
        ErrorCode::VendorError,
        "the workspace's encryption keys deny access",
    ),
    (
        "access_denied",
        ErrorCode::VendorError,
        "Slack denied access",
    ),
    (
        "internal_error",
        ErrorCode::VendorError,
        "Slack had an internal error",
    ),
    (
        "fatal_error",
        ErrorCode::VendorError,
        "Slack had an internal error",
    ),
    (
        "service_unavailable",
        ErrorCode::VendorError,
        "Slack is unavailable",
    ),
    (
        "request_timeout",
        ErrorCode::VendorError,
        "Slack did not receive the whole request",
    ),
];

/// Incoming-webhook error bodies (plain text, with a 4xx status).
const WEBHOOK_ERRORS: &[(&str, ErrorCode, &str)] = &[
    (
        "invalid_payload",
        ErrorCode::InvalidArguments,
        "Slack could not read the message; check the text and blocks",
    ),
    (
        "no_text",
        ErrorCode::InvalidArguments,
        "the message has no text and no blocks",
    ),
    (
        "invalid_blocks",
        ErrorCode::InvalidArguments,
        "Slack rejected the blocks",
    ),
    (
        "too_many_attachments",
        ErrorCode::InvalidArguments,
        "too many attachments",
    ),
    (
        "channel_not_found",
        ErrorCode::VendorError,
        "the webhook's channel no longer exists; an operator must create a new webhook",
    ),
    (
        "channel_is_archived",
        ErrorCode::VendorError,
        "the webhook's channel is archived",
    ),
    (
        "action_prohibited",
        ErrorCode::VendorError,
        "a workspace admin restricted posting to the webhook's channel",
    ),
    (
        "posting_to_general_channel_denied",
        ErrorCode::VendorError,
        "only admins may post to the workspace's general channel",
    ),
    (
        "user_not_found",
        ErrorCode::VendorError,
        "the webhook's creator no longer exists",
    ),
    (
        "no_service",
        ErrorCode::CredentialsNotFound,
        "the webhook is disabled, removed or invalid; an operator must store a new webhook URL in slack_default",
    ),
    (
        "no_service_id",
        ErrorCode::CredentialsNotFound,
        "the webhook URL is invalid; an operator must store a new one in slack_default",
    ),
    (
        "no_team",
        ErrorCode::CredentialsNotFound,
        "the webhook's workspace no longer exists; an operator must store a new webhook URL",
    ),
    (
        "team_disabled",
        ErrorCode::CredentialsNotFound,
        "the webhook's workspace is disabled",
    ),
    (
        "invalid_token",
        ErrorCode::CredentialsNotFound,
        "the webhook URL is invalid; an operator must store a new one in slack_default",
    ),
];

/// A Web API `ok: false` answer.
pub(crate) fn web_api_error(method: &str, error: &str) -> ToolError {
    known(WEB_API_ERRORS, error).unwrap_or_else(|| {
        ToolError::new(
            ErrorCode::VendorError,
            format!("{}: Slack's {method} refused the call", sanitize(error)),
        )
    })
}

/// An incoming-webhook failure with its status and body.
pub(crate) fn webhook_error(status: u16, body: &str) -> ToolError {
    let name = body.trim();
    if let Some(error) = known(WEBHOOK_ERRORS, name) {
        return error;
    }
    let code = match status {
        429 => ErrorCode::VendorRateLimited,
        400 => ErrorCode::InvalidArguments,
        401 | 403 | 404 | 410 => ErrorCode::CredentialsNotFound,
        _ => ErrorCode::VendorError,
    };
    ToolError::new(
        code,
        format!(
            "{}: the Slack webhook answered HTTP {status}",
            sanitize(name)
        ),
    )
}

/// A transport failure. For posts (`write`), a failure after the request may have reached
/// Slack is `OUTCOME_UNKNOWN`: the message may have been posted, and must not be resent blindly.
/// The error carries the attempts the HTTP client made.
pub(crate) fn transport_error(error: &HttpError, write: bool) -> ToolError {
    classify_transport(error, write).with_attempts(error.attempts())
}

fn classify_transport(error: &HttpError, write: bool) -> ToolError {
    let uncertain = write
        && error.may_have_reached_vendor()
        && matches!(error.kind(), ErrorKind::Transient | ErrorKind::Timeout);
    if uncertain {
        return ToolError::new(
            ErrorCode::OutcomeUnknown,
            format!(
                "{error}; Slack may or may not have posted the message: read the channel before posting again"
            ),
        );
    }
    if error.kind() == ErrorKind::Throttling {
        let wait = error
            .response()
            .and_then(|r| r.headers.get("retry-after"))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok());
        let advice = match (wait, write) {
            (Some(seconds), true) => format!(
                "; Slack asks to wait {seconds} s; posts are never retried automatically, so try again later"
            ),
            (Some(seconds), false) => format!("; Slack asks to wait {seconds} s"),
            (None, _) => String::new(),
        };
        return ToolError::new(
            ErrorCode::VendorRateLimited,
            format!("ratelimited: {error}{advice}"),
        );
    }
    error.to_tool_error()
}

fn known(table: &[(&str, ErrorCode, &str)], name: &str) -> Option<ToolError> {
    table
        .iter()
        .find(|(known, _, _)| *known == name)
        .map(|(name, code, why)| ToolError::new(*code, format!("{name}: {why}")))
}

/// Slack's error names are `snake_case`; anything else (HTML, long text) is not repeated.
fn sanitize(name: &str) -> String {
    let plain = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        name.to_owned()
    } else {
        "unknown_error".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn web_api_errors_map_to_stable_codes() {
        let cases = [
            ("channel_not_found", "INVALID_ARGUMENTS"),
            ("not_in_channel", "VENDOR_ERROR"),
            ("invalid_auth", "CREDENTIALS_NOT_FOUND"),
            ("account_inactive", "CREDENTIALS_NOT_FOUND"),
            ("msg_too_long", "INVALID_ARGUMENTS"),
            ("ratelimited", "VENDOR_RATE_LIMITED"),
            ("missing_scope", "VENDOR_ERROR"),
            ("something_new", "VENDOR_ERROR"),
        ];
        for (name, code) in cases {
            let err = web_api_error("chat.postMessage", name);
            assert_eq!(err.code.as_str(), code, "{name}");
            assert!(err.message.starts_with(name), "{}", err.message);
        }
    }

    #[test]
    fn unexpected_bodies_are_not_repeated() {
        let err = webhook_error(500, "<html>secret stack trace</html>");
        assert_eq!(err.code, ErrorCode::VendorError);
        assert!(!err.message.contains("secret"), "{}", err.message);
        assert!(err.message.starts_with("unknown_error"), "{}", err.message);
        let err = webhook_error(404, "no_service");
        assert_eq!(err.code, ErrorCode::CredentialsNotFound);
        let err = webhook_error(400, "invalid_payload");
        assert_eq!(err.code, ErrorCode::InvalidArguments);
    }
}
