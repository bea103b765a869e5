//! The connector against the fake Slack: a happy and an error path per tool, bot versus
//! webhook routing, bad input refused before anything is sent, retries of rate-limited history
//! and no retry of a rate-limited post.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_core::{
    AgentId, Connector, CorrelationId, ErrorCode, InvocationContext, RunId, SecretName,
    SecretValue, Secrets, TenantId, ToolCallId, ToolError, ToolName, ToolOutput, ToolRegistry,
};

use crate::testkit::{
    BOT_TOKEN, FakeSlack, HISTORY_CHANNEL, HISTORY_LENGTH, MISSING_CHANNEL, NOT_MEMBER_CHANNEL,
    WEBHOOK_PATH,
};
use crate::{SECRET_NAME, SlackConfig, SlackConnector};

const POST: &str = "chat.postMessage";
const HISTORY: &str = "conversations.history";

fn context(tool: &str, secret: Option<&str>) -> InvocationContext {
    let mut secrets = Secrets::empty();
    if let Some(value) = secret {
        secrets.insert(
            SecretName::new(SECRET_NAME).unwrap(),
            SecretValue::new(value),
        );
    }
    InvocationContext {
        tenant: TenantId::new("acme").unwrap(),
        agent: AgentId::new("support").unwrap(),
        run: RunId::new("run-1").unwrap(),
        tool_call_id: ToolCallId::new("call-1").unwrap(),
        correlation_id: CorrelationId::new("corr-1").unwrap(),
        tool: ToolName::new(tool).unwrap(),
        deadline: Instant::now() + Duration::from_secs(10),
        secrets,
    }
}

struct Setup {
    fake: FakeSlack,
    connector: SlackConnector,
}

impl Setup {
    async fn new() -> Setup {
        let fake = FakeSlack::start().await;
        let connector = SlackConnector::new(fake.config()).unwrap();
        Setup { fake, connector }
    }

    fn bot(&self) -> String {
        BOT_TOKEN.to_owned()
    }

    fn webhook(&self) -> String {
        self.fake.webhook_url()
    }

    fn both(&self) -> String {
        json!({"bot_token": BOT_TOKEN, "webhook_url": self.fake.webhook_url()}).to_string()
    }

    async fn call(
        &self,
        tool: &str,
        secret: &str,
        arguments: Value,
    ) -> Result<ToolOutput, ToolError> {
        let ctx = context(tool, Some(secret));
        let name = ctx.tool.clone();
        self.connector.invoke(ctx, &name, arguments).await
    }
}

fn blocks() -> Value {
    json!([
        {"type": "header", "text": {"type": "plain_text", "text": "Deploy done"}},
        {"type": "section", "text": {"type": "mrkdwn", "text": "*api* v2.4 is live"}}
    ])
}

#[test]
fn tools_register_with_schemas_tags_and_risk() {
    let connector = SlackConnector::new(SlackConfig::default()).unwrap();
    let specs = connector.tools();
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "slack.post_message",
            "slack.post_blocks",
            "slack.post_threaded",
            "slack.channel_history"
        ]
    );
    for spec in &specs {
        spec.validate().unwrap();
        assert_eq!(spec.required_secrets[0].as_str(), "slack_default");
        let posts = spec.name.action().starts_with("post");
        assert_eq!(spec.idempotent, !posts, "{}", spec.name);
        assert_eq!(spec.has_tag("write"), posts, "{}", spec.name);
        assert_eq!(spec.has_tag("read_only"), !posts, "{}", spec.name);
        assert_eq!(spec.input_schema["required"][0], "channel");
    }
    let mut registry = ToolRegistry::new();
    registry.register(std::sync::Arc::new(connector)).unwrap();
}

#[test]
fn configuration_is_checked() {
    let cases = [
        ("http://slack.example.com/api", "must use https"),
        ("not a url", "is not a URL"),
    ];
    for (base, expected) in cases {
        let config = SlackConfig {
            api_base_url: base.into(),
            ..SlackConfig::default()
        };
        let err = SlackConnector::new(config).unwrap_err().to_string();
        assert!(err.contains(expected), "{base}: {err}");
    }
}

#[tokio::test]
async fn post_message_with_a_bot_token() {
    let s = Setup::new().await;
    let out = s
        .call(
            "slack.post_message",
            &s.bot(),
            json!({"channel": "C0GENERAL1", "text": "hello"}),
        )
        .await
        .unwrap();
    assert_eq!(out.result["channel"], "C0GENERAL1");
    assert_eq!(out.result["delivered_via"], "web_api");
    assert!(out.result["ts"].as_str().unwrap().contains('.'));
    assert_eq!(out.result["thread_ts"], Value::Null);
    let sent = s.fake.bodies(POST).await;
    assert_eq!(sent, [json!({"channel": "C0GENERAL1", "text": "hello"})]);
    let auth = s.fake.requests(POST).await[0].headers["authorization"].clone();
    assert_eq!(auth.to_str().unwrap(), format!("Bearer {BOT_TOKEN}"));
}

#[tokio::test]
async fn post_message_errors_are_stable_codes() {
    let s = Setup::new().await;
    let cases = [
        (
            MISSING_CHANNEL,
            ErrorCode::InvalidArguments,
            "channel_not_found",
        ),
        (NOT_MEMBER_CHANNEL, ErrorCode::VendorError, "not_in_channel"),
    ];
    for (channel, code, name) in cases {
        let err = s
            .call(
                "slack.post_message",
                &s.bot(),
                json!({"channel": channel, "text": "x"}),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, code, "{err}");
        assert!(err.message.starts_with(name), "{err}");
    }
    for (error, code) in [
        ("invalid_auth", ErrorCode::CredentialsNotFound),
        ("account_inactive", ErrorCode::CredentialsNotFound),
        ("msg_too_long", ErrorCode::InvalidArguments),
        ("ratelimited", ErrorCode::VendorRateLimited),
    ] {
        s.fake.fail_next(POST, error).await;
        let err = s
            .call(
                "slack.post_message",
                &s.bot(),
                json!({"channel": "C0GENERAL1", "text": "x"}),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, code, "{error}: {err}");
        assert!(err.message.starts_with(error), "{err}");
        assert!(!err.message.contains(BOT_TOKEN), "{err}");
    }
    // A token Slack does not know.
    let err = s
        .call(
            "slack.post_message",
            "xoxb-9999999999-unknown-token",
            json!({"channel": "C0GENERAL1", "text": "x"}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::CredentialsNotFound);
    assert!(err.message.starts_with("invalid_auth"), "{err}");
}

#[tokio::test]
async fn post_blocks_happy_and_slack_rejection() {
    let s = Setup::new().await;
    let out = s
        .call(
            "slack.post_blocks",
            &s.bot(),
            json!({"channel": "C0GENERAL1", "blocks": blocks(), "text": "Deploy done"}),
        )
        .await
        .unwrap();
    assert_eq!(out.result["channel"], "C0GENERAL1");
    assert_eq!(s.fake.bodies(POST).await[0]["blocks"], blocks());
    // Blocks given as a JSON string are accepted and sent as an array.
    s.call(
        "slack.post_blocks",
        &s.bot(),
        json!({"channel": "C0GENERAL1", "blocks": blocks().to_string()}),
    )
    .await
    .unwrap();
    assert_eq!(s.fake.bodies(POST).await[1]["blocks"], blocks());

    s.fake.fail_next(POST, "invalid_blocks").await;
    let err = s
        .call(
            "slack.post_blocks",
            &s.bot(),
            json!({"channel": "C0GENERAL1", "blocks": blocks()}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArguments);
    assert!(err.message.starts_with("invalid_blocks"), "{err}");
}

#[tokio::test]
async fn post_threaded_happy_and_error() {
    let s = Setup::new().await;
    let out = s
        .call(
            "slack.post_threaded",
            &s.bot(),
            json!({"channel": "C0GENERAL1", "thread_ts": "1712000000.000001", "text": "reply", "reply_broadcast": true}),
        )
        .await
        .unwrap();
    assert_eq!(out.result["thread_ts"], "1712000000.000001");
    assert_ne!(out.result["ts"], out.result["thread_ts"]);
    let sent = &s.fake.bodies(POST).await[0];
    assert_eq!(sent["thread_ts"], "1712000000.000001");
    assert_eq!(sent["reply_broadcast"], true);

    s.fake.fail_next(POST, "thread_not_found").await;
    let err = s
        .call(
            "slack.post_threaded",
            &s.bot(),
            json!({"channel": "C0GENERAL1", "thread_ts": "1.2", "text": "reply"}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArguments);
    assert!(err.message.starts_with("thread_not_found"), "{err}");
}

#[tokio::test]
async fn channel_history_follows_cursors_up_to_the_limit() {
    let s = Setup::new().await;
    let out = s
        .call(
            "slack.channel_history",
            &s.bot(),
            json!({"channel": HISTORY_CHANNEL, "limit": 230}),
        )
        .await
        .unwrap();
    let messages = out.result["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 230);
    assert_eq!(
        messages[0],
        json!({"user": "U00000000", "text": "message 0", "ts": "1712400000.000100", "thread_ts": "1712400000.000100", "reply_count": 3})
    );
    assert_eq!(messages[1]["thread_ts"], Value::Null);
    assert_eq!(messages[1]["reply_count"], 0);
    assert_eq!(messages[229]["text"], "message 229");
    assert_eq!(out.result["has_more"], true);
    let cursor = out.result["next_cursor"].as_str().unwrap().to_owned();
    // Two pages: 200 then 30, each asking only for what is still needed.
    let limits: Vec<String> = s
        .fake
        .requests(HISTORY)
        .await
        .iter()
        .map(|r| {
            r.url
                .query_pairs()
                .find(|(k, _)| k == "limit")
                .unwrap()
                .1
                .into_owned()
        })
        .collect();
    assert_eq!(limits, ["200", "30"]);

    let rest = s
        .call(
            "slack.channel_history",
            &s.bot(),
            json!({"channel": HISTORY_CHANNEL, "limit": 1000, "cursor": cursor}),
        )
        .await
        .unwrap();
    let rest_messages = rest.result["messages"].as_array().unwrap();
    assert_eq!(rest_messages.len(), HISTORY_LENGTH - 230);
    assert_eq!(rest_messages[0]["text"], "message 230");
    assert_eq!(rest.result["has_more"], false);
    assert_eq!(rest.result["next_cursor"], Value::Null);
}

#[tokio::test]
async fn channel_history_errors() {
    let s = Setup::new().await;
    let err = s
        .call(
            "slack.channel_history",
            &s.bot(),
            json!({"channel": NOT_MEMBER_CHANNEL}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::VendorError);
    assert!(err.message.starts_with("not_in_channel"), "{err}");
    let err = s
        .call(
            "slack.channel_history",
            &s.bot(),
            json!({"channel": "#general"}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArguments);
    assert!(err.message.contains("channel ID"), "{err}");
    // A webhook alone cannot read: a clear error, nothing sent.
    let err = s
        .call(
            "slack.channel_history",
            &s.webhook(),
            json!({"channel": HISTORY_CHANNEL}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::CredentialsNotFound);
    assert!(err.message.contains("needs a Slack bot token"), "{err}");
    assert!(err.message.contains("never read"), "{err}");
    assert_eq!(s.fake.requests(HISTORY).await.len(), 1);
}

#[tokio::test]
async fn bot_versus_webhook_routing() {
    let s = Setup::new().await;
    // Webhook only: posts go to the webhook, without a channel field, and report no ts.
    for (tool, arguments) in [
        (
            "slack.post_message",
            json!({"channel": "C0GENERAL1", "text": "via hook"}),
        ),
        (
            "slack.post_blocks",
            json!({"channel": "C0GENERAL1", "blocks": blocks()}),
        ),
        (
            "slack.post_threaded",
            json!({"channel": "C0GENERAL1", "thread_ts": "1.2", "text": "r"}),
        ),
    ] {
        let out = s.call(tool, &s.webhook(), arguments).await.unwrap();
        assert_eq!(out.result["delivered_via"], "webhook", "{tool}");
        assert_eq!(out.result["ts"], Value::Null);
    }
    let hooked = s.fake.bodies(WEBHOOK_PATH).await;
    assert_eq!(hooked.len(), 3);
    assert_eq!(hooked[0], json!({"text": "via hook"}));
    assert_eq!(hooked[2]["thread_ts"], "1.2");
    assert_eq!(s.fake.requests(POST).await.len(), 0);

    // Both: the bot token wins.
    let out = s
        .call(
            "slack.post_message",
            &s.both(),
            json!({"channel": "C0GENERAL1", "text": "via bot"}),
        )
        .await
        .unwrap();
    assert_eq!(out.result["delivered_via"], "web_api");
    assert_eq!(s.fake.requests(POST).await.len(), 1);
    assert_eq!(s.fake.requests(WEBHOOK_PATH).await.len(), 3);
}

#[tokio::test]
async fn webhook_failures_become_stable_codes() {
    let s = Setup::new().await;
    let cases = [
        (404, "no_service", ErrorCode::CredentialsNotFound),
        (400, "invalid_payload", ErrorCode::InvalidArguments),
        (410, "channel_is_archived", ErrorCode::VendorError),
        (403, "action_prohibited", ErrorCode::VendorError),
        (500, "<html>oops</html>", ErrorCode::VendorError),
    ];
    for (status, body, code) in cases {
        s.fake.webhook_fails_next(status, body).await;
        let err = s
            .call(
                "slack.post_message",
                &s.webhook(),
                json!({"channel": "C0GENERAL1", "text": "x"}),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, code, "{status} {body}: {err}");
        assert!(!err.message.contains("html"), "{err}");
        assert!(!err.message.contains("fakeWebhookSecret"), "{err}");
    }
}

#[tokio::test]
async fn bad_input_is_refused_before_sending() {
    let s = Setup::new().await;
    let long_section =
        json!([{"type": "section", "text": {"type": "mrkdwn", "text": "a".repeat(3001)}}]);
    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "slack.post_message",
            json!({"text": "no channel"}),
            "`channel` is missing",
        ),
        (
            "slack.post_message",
            json!({"channel": "  ", "text": "x"}),
            "`channel` is empty",
        ),
        (
            "slack.post_message",
            json!({"channel": "C0GENERAL1", "text": "   "}),
            "`text` is empty",
        ),
        (
            "slack.post_message",
            json!({"channel": "C0GENERAL1"}),
            "`text` is missing",
        ),
        (
            "slack.post_message",
            json!({"channel": "a b", "text": "x"}),
            "channel ID",
        ),
        (
            "slack.post_message",
            json!({"channel": "C0GENERAL1", "text": "a".repeat(40_001)}),
            "at most 40000",
        ),
        (
            "slack.post_blocks",
            json!({"channel": "C0GENERAL1"}),
            "`blocks` is missing",
        ),
        (
            "slack.post_blocks",
            json!({"channel": "C0GENERAL1", "blocks": []}),
            "`blocks` is empty",
        ),
        (
            "slack.post_blocks",
            json!({"channel": "C0GENERAL1", "blocks": "[{\"type\": "}),
            "not valid JSON",
        ),
        (
            "slack.post_blocks",
            json!({"channel": "C0GENERAL1", "blocks": long_section}),
            "at most 3000 for section text",
        ),
        (
            "slack.post_threaded",
            json!({"channel": "C0GENERAL1", "thread_ts": "yesterday", "text": "x"}),
            "thread_ts",
        ),
        (
            "slack.channel_history",
            json!({"channel": HISTORY_CHANNEL, "limit": 0}),
            "`limit`",
        ),
    ];
    for (tool, arguments, expected) in cases {
        for secret in [s.bot(), s.webhook()] {
            let err = s.call(tool, &secret, arguments.clone()).await.unwrap_err();
            assert_eq!(
                err.code,
                ErrorCode::InvalidArguments,
                "{tool} {arguments}: {err}"
            );
            assert!(err.message.contains(expected), "{tool}: {err}");
            assert!(err.message.contains("nothing was sent"), "{err}");
        }
    }
    // Credentials of the wrong kind or shape.
    for (secret, expected) in [
        ("xoxp-1111-2222-user-token", "user token"),
        (
            "https://evil.example.com/services/T/B/X",
            "not a Slack incoming webhook",
        ),
        ("hunter2", "expected a bot token"),
    ] {
        let err = s
            .call(
                "slack.post_message",
                secret,
                json!({"channel": "C0GENERAL1", "text": "x"}),
            )
            .await
            .unwrap_err();
        assert_eq!(err.code, ErrorCode::CredentialsNotFound, "{err}");
        assert!(err.message.contains(expected), "{err}");
        assert!(!err.message.contains(secret), "{err}");
    }
    // No secret at all.
    let ctx = context("slack.post_message", None);
    let name = ctx.tool.clone();
    let err = s
        .connector
        .invoke(ctx, &name, json!({"channel": "C0GENERAL1", "text": "x"}))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::CredentialsNotFound);
    assert_eq!(s.fake.total_requests().await, 0, "nothing may reach Slack");
}

#[tokio::test]
async fn rate_limited_history_is_retried_and_a_post_is_not() {
    let s = Setup::new().await;
    s.fake.rate_limit_next(HISTORY, 1).await;
    let started = Instant::now();
    let out = s
        .call(
            "slack.channel_history",
            &s.bot(),
            json!({"channel": HISTORY_CHANNEL, "limit": 5}),
        )
        .await
        .unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(900),
        "Retry-After honoured"
    );
    assert_eq!(out.attempts, 2);
    assert_eq!(out.result["messages"].as_array().unwrap().len(), 5);
    assert_eq!(s.fake.requests(HISTORY).await.len(), 2);

    s.fake.rate_limit_next(POST, 1).await;
    let err = s
        .call(
            "slack.post_message",
            &s.bot(),
            json!({"channel": "C0GENERAL1", "text": "x"}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::VendorRateLimited, "{err}");
    assert!(err.message.contains("never retried"), "{err}");
    assert_eq!(s.fake.requests(POST).await.len(), 1, "a post is sent once");
}

#[tokio::test]
async fn a_tenant_base_url_overrides_the_connector_default() {
    let fake = FakeSlack::start().await;
    // The connector's own base points nowhere useful; the tenant's secret names the fake.
    let config = SlackConfig {
        api_base_url: "https://slack.com/api".into(),
        ..fake.config()
    };
    let connector = SlackConnector::new(config).unwrap();
    let secret = json!({"bot_token": BOT_TOKEN, "base_url": fake.api_base_url()}).to_string();
    let ctx = context("slack.post_message", Some(&secret));
    let name = ctx.tool.clone();
    let out = connector
        .invoke(ctx, &name, json!({"channel": "C0GENERAL1", "text": "hi"}))
        .await
        .unwrap();
    assert_eq!(out.result["channel"], "C0GENERAL1");
    assert_eq!(fake.requests(POST).await.len(), 1);
}

#[tokio::test]
async fn failures_report_the_attempts_the_http_client_made() {
    let s = Setup::new().await;
    // History is idempotent: two 429s are retried, the third answer is a refusal.
    s.fake.rate_limit_next(HISTORY, 0).await;
    s.fake.rate_limit_next(HISTORY, 0).await;
    s.fake.fail_next(HISTORY, "channel_not_found").await;
    let err = s
        .call(
            "slack.channel_history",
            &s.bot(),
            json!({"channel": HISTORY_CHANNEL, "limit": 5}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArguments, "{err}");
    assert_eq!(err.attempts, Some(3), "{err:?}");
    assert_eq!(s.fake.requests(HISTORY).await.len(), 3);

    // Throttled on every attempt: the HTTP client gives up after its three.
    for _ in 0..3 {
        s.fake.rate_limit_next(HISTORY, 0).await;
    }
    let err = s
        .call(
            "slack.channel_history",
            &s.bot(),
            json!({"channel": HISTORY_CHANNEL, "limit": 5}),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::VendorRateLimited, "{err}");
    assert_eq!(err.attempts, Some(3), "{err:?}");

    // A post is sent once, whatever the answer.
    s.fake.rate_limit_next(POST, 0).await;
    let err = s
        .call(
            "slack.post_message",
            &s.bot(),
            json!({"channel": "C0GENERAL1", "text": "x"}),
        )
        .await
        .unwrap_err();
    assert_eq!(
        (err.code, err.attempts),
        (ErrorCode::VendorRateLimited, Some(1))
    );
    s.fake.fail_next(POST, "not_in_channel").await;
    let err = s
        .call(
            "slack.post_message",
            &s.bot(),
            json!({"channel": "C0GENERAL1", "text": "x"}),
        )
        .await
        .unwrap_err();
    assert_eq!((err.code, err.attempts), (ErrorCode::VendorError, Some(1)));
}

#[tokio::test]
async fn a_post_whose_connection_breaks_after_sending_is_outcome_unknown() {
    let fake = FakeSlack::start().await;
    let hang_up = crate::testkit::HangUp::start().await;
    let connector = SlackConnector::new(fake.config()).unwrap();
    let secret = json!({"bot_token": BOT_TOKEN, "base_url": hang_up.api_base_url()}).to_string();
    let ctx = context("slack.post_message", Some(&secret));
    let name = ctx.tool.clone();
    let err = connector
        .invoke(ctx, &name, json!({"channel": "C0GENERAL1", "text": "hi"}))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::OutcomeUnknown, "{err}");
    assert_eq!(err.attempts, Some(1), "a post is never retried");
    assert!(err.message.contains("may or may not have posted"), "{err}");
    assert_eq!(hang_up.received(), 1, "Slack got the post");
}

#[tokio::test]
async fn a_redirect_is_never_a_success_whatever_its_body() {
    let s = Setup::new().await;
    let posted = r#"{"ok": true, "channel": "C0GENERAL1", "ts": "1712345678.000100"}"#;
    let history = r#"{"ok": true, "messages": [], "has_more": false}"#;
    // (tool, credential, arguments, the path that redirects, the body it sends)
    let cases = [
        (
            "slack.post_message",
            s.bot(),
            json!({"channel": "C0GENERAL1", "text": "x"}),
            POST,
            posted,
        ),
        (
            "slack.post_message",
            s.webhook(),
            json!({"channel": "C0GENERAL1", "text": "x"}),
            WEBHOOK_PATH,
            "ok",
        ),
        (
            "slack.channel_history",
            s.bot(),
            json!({"channel": HISTORY_CHANNEL}),
            HISTORY,
            history,
        ),
    ];
    for (tool, secret, arguments, path, body) in cases {
        for status in [301, 302, 303, 307, 308] {
            s.fake.redirect_next(path, status, body).await;
            let err = s
                .call(tool, &secret, arguments.clone())
                .await
                .expect_err(&format!("{tool} via {path}: a {status} is not a success"));
            assert_eq!(err.code, ErrorCode::VendorError, "{tool} {status}: {err}");
            assert!(err.message.contains("redirect"), "{err}");
            assert!(!err.message.contains("elsewhere"), "{err}");
        }
    }
}
