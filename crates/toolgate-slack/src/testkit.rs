//! A fake Slack on loopback (wiremock) answering in Slack's documented shapes: the Web API's
//! `chat.postMessage` and `conversations.history` (cursor pagination), an incoming webhook,
//! and injected failures (`ok: false` errors, 429 with `Retry-After`, webhook error bodies).
//! Compiled for this crate's tests and with the `testkit` feature only.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use serde_json::{Value, json};
use wiremock::matchers::{method, path};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::config::SlackConfig;

/// The bot token the fake accepts; any other is `invalid_auth`.
pub const BOT_TOKEN: &str = "xoxb-1000000001-2000000002-fakeBotTokenValue";

/// The fake webhook's path (Slack's shape: `/services/T.../B.../secret`).
pub const WEBHOOK_PATH: &str = "/services/T00000000/B00000000/fakeWebhookSecret0000";

/// A channel whose history holds [`HISTORY_LENGTH`] messages.
pub const HISTORY_CHANNEL: &str = "C0HISTORY1";

/// Messages in [`HISTORY_CHANNEL`], newest first; every tenth starts a thread of 3 replies.
pub const HISTORY_LENGTH: usize = 250;

/// Posts to this channel answer `channel_not_found`.
pub const MISSING_CHANNEL: &str = "C0MISSING1";

/// Posts and reads here answer `not_in_channel`.
pub const NOT_MEMBER_CHANNEL: &str = "C0NOTMEMBER";

/// The running fake. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeSlack {
    server: MockServer,
}

impl FakeSlack {
    /// Starts the fake on 127.0.0.1 with its default (successful) behaviour.
    pub async fn start() -> FakeSlack {
        let server = MockServer::start().await;
        Mock::given(method("POST"))
            .and(path("/api/chat.postMessage"))
            .respond_with(PostMessage {
                next_ts: Arc::new(AtomicU64::new(1)),
            })
            .with_priority(5)
            .mount(&server)
            .await;
        Mock::given(method("GET"))
            .and(path("/api/conversations.history"))
            .respond_with(ConversationsHistory)
            .with_priority(5)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path(WEBHOOK_PATH))
            .respond_with(Webhook)
            .with_priority(5)
            .mount(&server)
            .await;
        FakeSlack { server }
    }

    /// `http://127.0.0.1:PORT`.
    pub fn uri(&self) -> String {
        self.server.uri()
    }

    /// The Web API base: `http://127.0.0.1:PORT/api`.
    pub fn api_base_url(&self) -> String {
        format!("{}/api", self.server.uri())
    }

    /// The incoming-webhook URL.
    pub fn webhook_url(&self) -> String {
        format!("{}{WEBHOOK_PATH}", self.server.uri())
    }

    /// A connector configuration pointing at this fake (loopback allowed).
    pub fn config(&self) -> SlackConfig {
        SlackConfig {
            api_base_url: self.api_base_url(),
            webhook_hosts: vec!["127.0.0.1".to_owned()],
            allow_hosts: vec!["127.0.0.1".to_owned()],
            ..SlackConfig::default()
        }
    }

    /// The next call of Web API `method` answers `{"ok": false, "error": error}`.
    pub async fn fail_next(&self, api_method: &str, error: &str) {
        Mock::given(path(format!("/api/{api_method}")))
            .respond_with(
                ResponseTemplate::new(200).set_body_json(json!({"ok": false, "error": error})),
            )
            .with_priority(1)
            .up_to_n_times(1)
            .mount(&self.server)
            .await;
    }

    /// The next call of Web API `method` answers 429 with `Retry-After: seconds`, as Slack's
    /// rate limits do (<https://docs.slack.dev/apis/web-api/rate-limits>).
    pub async fn rate_limit_next(&self, api_method: &str, seconds: u64) {
        Mock::given(path(format!("/api/{api_method}")))
            .respond_with(
                ResponseTemplate::new(429)
                    .insert_header("retry-after", seconds.to_string().as_str())
                    .set_body_json(json!({"ok": false, "error": "ratelimited"})),
            )
            .with_priority(1)
            .up_to_n_times(1)
            .mount(&self.server)
            .await;
    }

    /// The next webhook post answers `status` with the plain-text `body` (e.g. 404
    /// `no_service`).
    pub async fn webhook_fails_next(&self, status: u16, body: &str) {
        Mock::given(path(WEBHOOK_PATH))
            .respond_with(ResponseTemplate::new(status).set_body_string(body))
            .with_priority(1)
            .up_to_n_times(1)
            .mount(&self.server)
            .await;
    }

    /// The next request whose path ends with `path_suffix` answers `status` (a redirect)
    /// with a `Location` elsewhere and `body`, as a proxy or a moved endpoint might, even a
    /// body that reads like a success.
    pub async fn redirect_next(&self, path_suffix: &str, status: u16, body: &str) {
        let suffix = path_suffix.to_owned();
        Mock::given(move |request: &wiremock::Request| request.url.path().ends_with(&suffix))
            .respond_with(
                ResponseTemplate::new(status)
                    .insert_header("location", "https://elsewhere.example/moved")
                    .set_body_string(body),
            )
            .with_priority(1)
            .up_to_n_times(1)
            .mount(&self.server)
            .await;
    }

    /// Requests received at `path_suffix` (e.g. `chat.postMessage`, `conversations.history`,
    /// or [`WEBHOOK_PATH`]).
    pub async fn requests(&self, path_suffix: &str) -> Vec<Request> {
        self.server
            .received_requests()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.url.path().ends_with(path_suffix))
            .collect()
    }

    /// The JSON bodies posted to `path_suffix`.
    pub async fn bodies(&self, path_suffix: &str) -> Vec<Value> {
        self.requests(path_suffix)
            .await
            .iter()
            .map(|r| serde_json::from_slice(&r.body).unwrap_or(Value::Null))
            .collect()
    }

    /// Every request the fake received.
    pub async fn total_requests(&self) -> usize {
        self.server.received_requests().await.map_or(0, |r| r.len())
    }
}

/// A Slack that hangs up: a loopback server that reads each request whole, then closes the
/// connection without answering, as when the network fails after Slack received a post (the
/// message may have been posted). Point a tenant's `base_url` at [`HangUp::api_base_url`].
#[derive(Debug)]
pub struct HangUp {
    address: std::net::SocketAddr,
    received: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl HangUp {
    /// Starts the server on 127.0.0.1.
    pub async fn start() -> HangUp {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind a loopback port");
        let address = listener.local_addr().expect("local address");
        let received = Arc::new(AtomicU64::new(0));
        let counter = Arc::clone(&received);
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let counter = Arc::clone(&counter);
                tokio::spawn(async move {
                    if read_request(stream).await {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                });
            }
        });
        HangUp {
            address,
            received,
            task,
        }
    }

    /// The Web API base: `http://127.0.0.1:PORT/api`.
    pub fn api_base_url(&self) -> String {
        format!("http://{}/api", self.address)
    }

    /// How many whole requests it received (and hung up on).
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }
}

impl Drop for HangUp {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads one request (head and `content-length` body) and drops the connection. True when the
/// whole request arrived.
async fn read_request(mut stream: tokio::net::TcpStream) -> bool {
    use tokio::io::AsyncReadExt as _;
    let mut buffer = Vec::new();
    let mut chunk = [0_u8; 4096];
    loop {
        if let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&buffer[..end]).to_ascii_lowercase();
            let length: usize = head
                .lines()
                .find_map(|line| line.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(0);
            if buffer.len() >= end + 4 + length {
                return true;
            }
        }
        match stream.read(&mut chunk).await {
            Ok(0) | Err(_) => return false,
            Ok(n) => buffer.extend_from_slice(&chunk[..n]),
        }
    }
}

fn web_api_error(error: &str) -> ResponseTemplate {
    ResponseTemplate::new(200).set_body_json(json!({"ok": false, "error": error}))
}

fn authorized(request: &Request) -> bool {
    request
        .headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        == Some(format!("Bearer {BOT_TOKEN}").as_str())
}

/// `chat.postMessage` (<https://docs.slack.dev/reference/methods/chat.postMessage>).
struct PostMessage {
    next_ts: Arc<AtomicU64>,
}

impl Respond for PostMessage {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        if !authorized(request) {
            return web_api_error("invalid_auth");
        }
        let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
            return web_api_error("invalid_json");
        };
        let channel = body.get("channel").and_then(Value::as_str).unwrap_or("");
        match channel {
            "" => return web_api_error("channel_not_found"),
            MISSING_CHANNEL => return web_api_error("channel_not_found"),
            NOT_MEMBER_CHANNEL => return web_api_error("not_in_channel"),
            _ => {}
        }
        if body.get("text").is_none() && body.get("blocks").is_none() {
            return web_api_error("no_text");
        }
        let n = self.next_ts.fetch_add(1, Ordering::Relaxed);
        let ts = format!("1712345678.{n:06}");
        let mut message = json!({
            "type": "message",
            "subtype": "bot_message",
            "text": body.get("text").cloned().unwrap_or(Value::String(String::new())),
            "ts": ts,
            "bot_id": "B0FAKEBOT",
        });
        if let Some(thread_ts) = body.get("thread_ts") {
            message["thread_ts"] = thread_ts.clone();
        }
        ResponseTemplate::new(200).set_body_json(json!({
            "ok": true,
            "channel": channel.trim_start_matches('#'),
            "ts": ts,
            "message": message,
        }))
    }
}

/// `conversations.history` with cursor pagination
/// (<https://docs.slack.dev/reference/methods/conversations.history>).
struct ConversationsHistory;

impl Respond for ConversationsHistory {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        if !authorized(request) {
            return web_api_error("invalid_auth");
        }
        let query: std::collections::HashMap<String, String> =
            request.url.query_pairs().into_owned().collect();
        let channel = query.get("channel").map_or("", String::as_str);
        match channel {
            HISTORY_CHANNEL => {}
            NOT_MEMBER_CHANNEL => return web_api_error("not_in_channel"),
            _ => return web_api_error("channel_not_found"),
        }
        let limit: usize = query
            .get("limit")
            .and_then(|l| l.parse().ok())
            .unwrap_or(100)
            .clamp(1, 999);
        let start: usize = match query.get("cursor") {
            None => 0,
            Some(cursor) => match cursor
                .strip_prefix("bmV4dF9vZmZzZXQ6")
                .and_then(|n| n.parse().ok())
            {
                Some(offset) => offset,
                None => return web_api_error("invalid_cursor"),
            },
        };
        let end = (start + limit).min(HISTORY_LENGTH);
        let messages: Vec<Value> = (start..end).map(history_message).collect();
        let has_more = end < HISTORY_LENGTH;
        let mut answer = json!({
            "ok": true,
            "messages": messages,
            "has_more": has_more,
            "pin_count": 0,
        });
        if has_more {
            answer["response_metadata"] = json!({"next_cursor": format!("bmV4dF9vZmZzZXQ6{end}")});
        }
        ResponseTemplate::new(200).set_body_json(answer)
    }
}

/// Message `index` of the history channel, newest first.
fn history_message(index: usize) -> Value {
    let ts = format!("{}.000100", 1_712_400_000 - index);
    let mut message = json!({
        "type": "message",
        "user": format!("U{:08}", index % 7),
        "text": format!("message {index}"),
        "ts": ts,
    });
    if index.is_multiple_of(10) {
        message["thread_ts"] = Value::String(ts);
        message["reply_count"] = json!(3);
    }
    message
}

/// An incoming webhook: `ok` as plain text, or 400 `invalid_payload` / `no_text`
/// (<https://docs.slack.dev/messaging/sending-messages-using-incoming-webhooks>).
struct Webhook;

impl Respond for Webhook {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
            return ResponseTemplate::new(400).set_body_string("invalid_payload");
        };
        if body.get("text").is_none() && body.get("blocks").is_none() {
            return ResponseTemplate::new(400).set_body_string("no_text");
        }
        ResponseTemplate::new(200).set_body_string("ok")
    }
}
