//! The `slack` connector: arguments checked, credentials resolved, then one of three routes:
//! the Web API with the bot token (`chat.postMessage`, `conversations.history`), or the
//! incoming webhook for posts when the tenant has no bot token.

use std::sync::Arc;

use serde_json::{Map, Value, json};
use toolgate_core::{
    Connector, ErrorCode, InvocationContext, ToolError, ToolName, ToolOutput, ToolSpec,
};
use toolgate_http::{
    HttpClient, HttpError, HttpObserver, NoHttpObserver, Request, Response, RetryPolicy,
    VendorConfig,
};

use crate::blocks::{check_message_text, invalid, parse_blocks};
use crate::config::SlackConfig;
use crate::credentials::{Credentials, SECRET_NAME};
use crate::errors::{transport_error, web_api_error, webhook_error};
use crate::tools::{MAX_HISTORY_LIMIT, specs};

/// Slack recommends pages of at most 200 messages
/// (<https://docs.slack.dev/reference/methods/conversations.history>, `limit`).
const HISTORY_PAGE_SIZE: u64 = 200;

/// Serves `slack.*`. Build it once with [`SlackConnector::new`]; clones of its HTTP client
/// share connections, limits and the retry budget.
#[derive(Debug)]
pub struct SlackConnector {
    config: SlackConfig,
    http: HttpClient,
}

/// Why the connector could not be built (an invalid configuration).
#[derive(Debug)]
pub struct SlackConfigError(String);

impl std::fmt::Display for SlackConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid slack connector configuration: {}", self.0)
    }
}

impl std::error::Error for SlackConfigError {}

/// One post, checked.
#[derive(Debug)]
struct Post {
    channel: String,
    text: Option<String>,
    blocks: Option<Vec<Value>>,
    thread_ts: Option<String>,
    reply_broadcast: bool,
    unfurl_links: Option<bool>,
}

/// One history read, checked.
#[derive(Debug)]
struct History {
    channel: String,
    limit: u64,
    cursor: Option<String>,
    oldest: Option<String>,
    latest: Option<String>,
}

impl SlackConnector {
    /// Builds the connector; fails on an unusable API base URL.
    pub fn new(config: SlackConfig) -> Result<SlackConnector, SlackConfigError> {
        SlackConnector::with_http_observer(config, Arc::new(NoHttpObserver))
    }

    /// Like [`SlackConnector::new`], telling `observer` of every request sent to Slack
    /// (attempts, retries, rate-limit waits).
    pub fn with_http_observer(
        config: SlackConfig,
        observer: Arc<dyn HttpObserver>,
    ) -> Result<SlackConnector, SlackConfigError> {
        let base = config.api_base_url.trim_end_matches('/').to_owned();
        let host_allowed = |url: &url::Url| {
            let host = url.host_str().unwrap_or("");
            config
                .allow_hosts
                .iter()
                .any(|h| h.eq_ignore_ascii_case(host))
        };
        match url::Url::parse(&base) {
            Ok(url) if url.scheme() == "https" => {}
            Ok(url) if url.scheme() == "http" && host_allowed(&url) => {}
            Ok(_) => {
                return Err(SlackConfigError(format!(
                    "api_base_url `{base}` must use https (http only for hosts in allow_hosts)"
                )));
            }
            Err(e) => {
                return Err(SlackConfigError(format!(
                    "api_base_url `{base}` is not a URL: {e}"
                )));
            }
        }
        if config.webhook_hosts.is_empty() {
            return Err(SlackConfigError(
                "webhook_hosts is empty; the default is [\"hooks.slack.com\"]".to_owned(),
            ));
        }
        let mut vendor = VendorConfig::new(format!("{base}/"));
        vendor.allow_hosts = config.allow_hosts.clone();
        vendor.retry = RetryPolicy {
            cap: config.max_retry_wait,
            ..RetryPolicy::default()
        };
        vendor.observer = observer;
        let http = HttpClient::new(vendor).map_err(|e| SlackConfigError(e.to_string()))?;
        Ok(SlackConnector {
            config: SlackConfig {
                api_base_url: base,
                ..config
            },
            http,
        })
    }

    async fn post(&self, ctx: &InvocationContext, post: Post) -> Result<ToolOutput, ToolError> {
        let credentials = self.credentials(ctx)?;
        let deadline = tokio::time::Instant::from_std(ctx.deadline);
        // The bot token wins when both are present: it can report the message's ts.
        if let Some(token) = &credentials.bot_token {
            let mut body = Map::new();
            body.insert("channel".into(), Value::String(post.channel.clone()));
            if let Some(text) = &post.text {
                body.insert("text".into(), Value::String(text.clone()));
            }
            if let Some(blocks) = &post.blocks {
                body.insert("blocks".into(), Value::Array(blocks.clone()));
            }
            if let Some(thread_ts) = &post.thread_ts {
                body.insert("thread_ts".into(), Value::String(thread_ts.clone()));
                if post.reply_broadcast {
                    body.insert("reply_broadcast".into(), Value::Bool(true));
                }
            }
            if let Some(unfurl) = post.unfurl_links {
                body.insert("unfurl_links".into(), Value::Bool(unfurl));
            }
            let url = format!("{}/chat.postMessage", self.api_base(&credentials));
            let request = Request::post(url)
                .header("authorization", &format!("Bearer {}", token.expose()))
                .header("content-type", "application/json; charset=utf-8")
                .body(Value::Object(body).to_string())
                .idempotent(false);
            let response = self
                .http
                .send(request, deadline)
                .await
                .map_err(|e| transport_error(&e, true))?;
            let answer = read_web_api("chat.postMessage", &response)
                .map_err(|e| e.with_attempts(response.attempts))?;
            let thread_ts = answer
                .pointer("/message/thread_ts")
                .and_then(Value::as_str)
                .map(str::to_owned)
                .or(post.thread_ts);
            let result = json!({
                "channel": answer.get("channel").and_then(Value::as_str),
                "ts": answer.get("ts").and_then(Value::as_str),
                "thread_ts": thread_ts,
                "delivered_via": "web_api",
            });
            return Ok(ToolOutput {
                result,
                attempts: response.attempts,
            });
        }
        let Some(webhook) = &credentials.webhook_url else {
            return Err(ToolError::new(
                ErrorCode::Internal,
                "the slack credential holds neither a bot token nor a webhook",
            ));
        };
        // Incoming webhooks post to the channel they were created for; `channel` is not sent
        // (https://docs.slack.dev/messaging/sending-messages-using-incoming-webhooks), and they
        // accept `thread_ts` for replies in that channel.
        let mut body = Map::new();
        if let Some(text) = &post.text {
            body.insert("text".into(), Value::String(text.clone()));
        }
        if let Some(blocks) = &post.blocks {
            body.insert("blocks".into(), Value::Array(blocks.clone()));
        }
        if let Some(thread_ts) = &post.thread_ts {
            body.insert("thread_ts".into(), Value::String(thread_ts.clone()));
            if post.reply_broadcast {
                body.insert("reply_broadcast".into(), Value::Bool(true));
            }
        }
        if let Some(unfurl) = post.unfurl_links {
            body.insert("unfurl_links".into(), Value::Bool(unfurl));
        }
        let request = Request::post(webhook.expose())
            .header("content-type", "application/json")
            .body(Value::Object(body).to_string())
            .idempotent(false);
        let response = match self.http.send(request, deadline).await {
            Ok(response) => response,
            Err(error) => return Err(webhook_failure(&error)),
        };
        refuse_redirect("incoming webhook", &response)?;
        let text = String::from_utf8_lossy(&response.body);
        if text.trim() != "ok" {
            return Err(
                webhook_error(response.status.as_u16(), &text).with_attempts(response.attempts)
            );
        }
        Ok(ToolOutput {
            result: json!({
                "channel": Value::Null,
                "ts": Value::Null,
                "thread_ts": post.thread_ts,
                "delivered_via": "webhook",
                "note": "posted through the tenant's incoming webhook, to the channel it was created for; webhooks return no ts",
            }),
            attempts: response.attempts,
        })
    }

    async fn history(
        &self,
        ctx: &InvocationContext,
        history: History,
    ) -> Result<ToolOutput, ToolError> {
        let credentials = self.credentials(ctx)?;
        let Some(token) = &credentials.bot_token else {
            return Err(ToolError::new(
                ErrorCode::CredentialsNotFound,
                format!(
                    "reading channel history needs a Slack bot token (xoxb-) in the tenant's `{SECRET_NAME}` secret; it holds only an incoming webhook, which can post but never read; nothing was sent to Slack"
                ),
            ));
        };
        let deadline = tokio::time::Instant::from_std(ctx.deadline);
        let url = format!("{}/conversations.history", self.api_base(&credentials));
        let mut messages: Vec<Value> = Vec::new();
        let mut cursor = history.cursor.clone();
        let mut attempts: u32 = 0;
        let mut has_more;
        let mut pages: u32 = 0;
        loop {
            let remaining = history.limit - u64::try_from(messages.len()).unwrap_or(u64::MAX);
            let page_size = remaining.min(HISTORY_PAGE_SIZE);
            let mut request = Request::get(url.clone())
                .header("authorization", &format!("Bearer {}", token.expose()))
                .query("channel", history.channel.clone())
                .query("limit", page_size.to_string())
                .idempotent(true);
            if let Some(cursor) = &cursor {
                request = request.query("cursor", cursor.clone());
            }
            if let Some(oldest) = &history.oldest {
                request = request.query("oldest", oldest.clone());
            }
            if let Some(latest) = &history.latest {
                request = request.query("latest", latest.clone());
            }
            // Errors count every attempt of every page read so far.
            let response = match self.http.send(request, deadline).await {
                Ok(response) => response,
                Err(error) => {
                    let failed = transport_error(&error, false);
                    return Err(failed.with_attempts(attempts + error.attempts()));
                }
            };
            attempts += response.attempts;
            pages += 1;
            let answer = read_web_api("conversations.history", &response)
                .map_err(|e| e.with_attempts(attempts))?;
            let page = answer
                .get("messages")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            let page_len = u64::try_from(page.len()).unwrap_or(u64::MAX);
            messages.extend(
                page.iter()
                    .take(usize::try_from(remaining).unwrap_or(usize::MAX))
                    .map(normalize_message),
            );
            has_more = answer
                .get("has_more")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            cursor = answer
                .pointer("/response_metadata/next_cursor")
                .and_then(Value::as_str)
                .filter(|c| !c.is_empty())
                .map(str::to_owned);
            let filled = u64::try_from(messages.len()).unwrap_or(u64::MAX) >= history.limit;
            if filled || !has_more || cursor.is_none() || page_len == 0 {
                break;
            }
            if pages >= self.config.max_history_pages {
                break;
            }
        }
        let next_cursor = if has_more { cursor } else { None };
        Ok(ToolOutput {
            result: json!({
                "channel": history.channel,
                "messages": messages,
                "has_more": has_more && next_cursor.is_some(),
                "next_cursor": next_cursor,
            }),
            attempts: attempts.max(1),
        })
    }

    fn credentials(&self, ctx: &InvocationContext) -> Result<Credentials, ToolError> {
        let Some(secret) = ctx.secrets.get(SECRET_NAME) else {
            return Err(ToolError::new(
                ErrorCode::CredentialsNotFound,
                format!(
                    "the tenant has no `{SECRET_NAME}` secret; an operator stores a bot token (xoxb-) or an incoming-webhook URL with `toolgate secrets put TENANT {SECRET_NAME}`"
                ),
            ));
        };
        Credentials::parse(secret.expose(), &self.config)
    }

    fn api_base<'a>(&'a self, credentials: &'a Credentials) -> &'a str {
        credentials
            .api_base_url
            .as_deref()
            .unwrap_or(&self.config.api_base_url)
    }
}

#[async_trait::async_trait]
impl Connector for SlackConnector {
    fn family(&self) -> &str {
        "slack"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        specs()
    }

    async fn invoke(
        &self,
        ctx: InvocationContext,
        tool: &ToolName,
        arguments: Value,
    ) -> Result<ToolOutput, ToolError> {
        match tool.action() {
            "post_message" => {
                let post = Post {
                    channel: channel(&arguments, false)?,
                    text: Some(text(&arguments, true)?.unwrap_or_default()),
                    blocks: None,
                    thread_ts: None,
                    reply_broadcast: false,
                    unfurl_links: arguments.get("unfurl_links").and_then(Value::as_bool),
                };
                self.post(&ctx, post).await
            }
            "post_blocks" => {
                let post = Post {
                    channel: channel(&arguments, false)?,
                    text: text(&arguments, false)?,
                    blocks: Some(blocks(&arguments, true)?.unwrap_or_default()),
                    thread_ts: None,
                    reply_broadcast: false,
                    unfurl_links: None,
                };
                self.post(&ctx, post).await
            }
            "post_threaded" => {
                let post = Post {
                    channel: channel(&arguments, false)?,
                    text: Some(text(&arguments, true)?.unwrap_or_default()),
                    blocks: blocks(&arguments, false)?,
                    thread_ts: Some(thread_ts(&arguments)?),
                    reply_broadcast: arguments
                        .get("reply_broadcast")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                    unfurl_links: None,
                };
                self.post(&ctx, post).await
            }
            "channel_history" => {
                let history = History {
                    channel: channel(&arguments, true)?,
                    limit: limit(&arguments)?,
                    cursor: optional_string(&arguments, "cursor")?,
                    oldest: optional_string(&arguments, "oldest")?,
                    latest: optional_string(&arguments, "latest")?,
                };
                self.history(&ctx, history).await
            }
            other => Err(ToolError::new(
                ErrorCode::UnknownTool,
                format!("the slack connector has no tool `{other}`"),
            )),
        }
    }
}

/// The Web API answers 200 with `{"ok": false, "error": "..."}` for refusals.
fn read_web_api(method: &str, response: &Response) -> Result<Value, ToolError> {
    refuse_redirect(&format!("{method} method"), response)?;
    let Ok(answer) = serde_json::from_slice::<Value>(&response.body) else {
        return Err(ToolError::new(
            ErrorCode::VendorError,
            format!("Slack's {method} answered with something that is not JSON"),
        ));
    };
    match answer.get("ok").and_then(Value::as_bool) {
        Some(true) => Ok(answer),
        _ => {
            let error = answer
                .get("error")
                .and_then(Value::as_str)
                .unwrap_or("unknown_error");
            Err(web_api_error(method, error))
        }
    }
}

/// Redirects are not followed (the HTTP client's default), so a 3xx that reaches here is an
/// answer from somewhere other than the endpoint asked (a proxy, a moved or spoofed endpoint):
/// never a success, whatever its body says. The client reports 4xx and 5xx as errors itself;
/// this also refuses any other status that is not 2xx.
fn refuse_redirect(what: &str, response: &Response) -> Result<(), ToolError> {
    if response.status.is_success() {
        return Ok(());
    }
    let status = response.status.as_u16();
    let message = if response.status.is_redirection() {
        format!(
            "Slack's {what} answered HTTP {status}, a redirect, which is not followed; the answer is not a success"
        )
    } else {
        format!("Slack's {what} answered HTTP {status}, which is not a success")
    };
    Err(ToolError::new(ErrorCode::VendorError, message).with_attempts(response.attempts))
}

/// A webhook answers failures with a 4xx and a plain-text error name in the body.
fn webhook_failure(error: &HttpError) -> ToolError {
    match error.response() {
        Some(response) if response.status.as_u16() != 429 => webhook_error(
            response.status.as_u16(),
            &String::from_utf8_lossy(&response.body),
        )
        .with_attempts(error.attempts()),
        _ => transport_error(error, true),
    }
}

/// One history message in the normalized shape.
fn normalize_message(message: &Value) -> Value {
    let field = |name: &str| message.get(name).and_then(Value::as_str);
    json!({
        "user": field("user").or(field("bot_id")),
        "text": field("text").unwrap_or(""),
        "ts": field("ts"),
        "thread_ts": field("thread_ts"),
        "reply_count": message.get("reply_count").and_then(Value::as_u64).unwrap_or(0),
    })
}

fn channel(arguments: &Value, id_only: bool) -> Result<String, ToolError> {
    let Some(channel) = arguments.get("channel").and_then(Value::as_str) else {
        return Err(invalid(
            "`channel` is missing; give a channel ID such as C0123456789",
        ));
    };
    let channel = channel.trim();
    if channel.is_empty() {
        return Err(invalid(
            "`channel` is empty; give a channel ID such as C0123456789",
        ));
    }
    if channel.chars().count() > 80 {
        return Err(invalid("`channel` is longer than 80 characters"));
    }
    if id_only {
        let mut chars = channel.chars();
        let prefix_ok = matches!(chars.next(), Some('C' | 'G' | 'D'));
        let rest_ok =
            channel.len() >= 2 && chars.all(|c| c.is_ascii_uppercase() || c.is_ascii_digit());
        if !(prefix_ok && rest_ok) {
            return Err(invalid(
                "`channel` must be a channel ID such as C0123456789 (conversations.history does not take names)",
            ));
        }
        return Ok(channel.to_owned());
    }
    let name = channel.strip_prefix('#').unwrap_or(channel);
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !valid {
        return Err(invalid(
            "`channel` must be a channel ID such as C0123456789 or a name such as #general",
        ));
    }
    Ok(channel.to_owned())
}

fn text(arguments: &Value, required: bool) -> Result<Option<String>, ToolError> {
    match arguments.get("text") {
        None | Some(Value::Null) if required => {
            Err(invalid("`text` is missing; give the message to post"))
        }
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if text.trim().is_empty() => {
            Err(invalid("`text` is empty; give the message to post"))
        }
        Some(Value::String(text)) => {
            check_message_text(text)?;
            Ok(Some(text.clone()))
        }
        Some(_) => Err(invalid("`text` must be a string")),
    }
}

fn blocks(arguments: &Value, required: bool) -> Result<Option<Vec<Value>>, ToolError> {
    match arguments.get("blocks") {
        None | Some(Value::Null) if required => Err(invalid(
            "`blocks` is missing; give a JSON array of Block Kit blocks",
        )),
        None | Some(Value::Null) => Ok(None),
        Some(value) => parse_blocks(value).map(Some),
    }
}

fn thread_ts(arguments: &Value) -> Result<String, ToolError> {
    let value = arguments
        .get("thread_ts")
        .and_then(Value::as_str)
        .unwrap_or("");
    let valid = value.split_once('.').is_some_and(|(secs, micros)| {
        !secs.is_empty()
            && !micros.is_empty()
            && secs.chars().all(|c| c.is_ascii_digit())
            && micros.chars().all(|c| c.is_ascii_digit())
    });
    if !valid {
        return Err(invalid(
            "`thread_ts` must be the parent message's ts, such as 1712345678.123456",
        ));
    }
    Ok(value.to_owned())
}

fn limit(arguments: &Value) -> Result<u64, ToolError> {
    match arguments.get("limit") {
        None | Some(Value::Null) => Ok(100),
        Some(value) => match value.as_u64() {
            Some(n) if (1..=MAX_HISTORY_LIMIT).contains(&n) => Ok(n),
            _ => Err(invalid(format!(
                "`limit` must be an integer from 1 to {MAX_HISTORY_LIMIT}"
            ))),
        },
    }
}

fn optional_string(arguments: &Value, name: &str) -> Result<Option<String>, ToolError> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) if !text.trim().is_empty() => Ok(Some(text.trim().to_owned())),
        Some(_) => Err(invalid(format!("`{name}` must be a non-empty string"))),
    }
}
