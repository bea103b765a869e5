//! The Slack connector end to end: the real gateway binary over gRPC, pointed at the fake
//! Slack through `[connectors.slack]` in its toolgate.toml, credentials stored with the
//! `toolgate secrets put` CLI, and a Cedar policy that requires approval for posts outside an
//! allow-listed set of channels. (The approvals API has not landed yet, so a post outside the
//! list is asserted to stop at WAITING_APPROVAL with a pending invocation and nothing sent.)

use serde_json::Value;
use toolgate_e2e::{Gateway, Tenant, authed, slack_config};
use toolgate_proto::v1 as pb;
use toolgate_slack::testkit::{BOT_TOKEN, FakeSlack, HISTORY_CHANNEL, NOT_MEMBER_CHANNEL};

const TOOLS: &[&str] = &[
    "slack.post_message",
    "slack.post_blocks",
    "slack.post_threaded",
    "slack.channel_history",
];

const POLICY: &str = r#"
@id("base") permit(principal, action, resource);
@id("posts-outside-allowlist") @decision("require_expert_approval") @risk("medium")
permit(
  principal,
  action in [
    Toolgate::Action::"slack.post_message",
    Toolgate::Action::"slack.post_blocks",
    Toolgate::Action::"slack.post_threaded"
  ],
  resource
) when { !(["C0ALLOWED1", "C0ALLOWED2"].contains(context.args.channel)) };
"#;

/// `toolgate secrets put TENANT slack_default`, the value on standard input; the CLI never
/// prints it.
fn put_secret(gateway: &Gateway, tenant: &str, value: &str) {
    let printed = gateway.secrets_put(tenant, "slack_default", &[], &format!("{value}\n"));
    assert!(!printed.contains(value), "{printed}");
}

fn result(outcome: &pb::ToolCallResult) -> Value {
    serde_json::from_str(&outcome.result_json).unwrap_or_else(|_| panic!("{outcome:?}"))
}

#[tokio::test]
async fn slack_through_the_gateway_with_policy_and_credentials() {
    let fake = FakeSlack::start().await;
    let gateway = Gateway::options().config(&slack_config(&fake)).start();
    // The policy is accepted by the schema generated from the tools.
    let acme = Tenant::setup("acme")
        .tools(TOOLS)
        .policy(POLICY)
        .approver()
        .create(&gateway)
        .await;
    let token = acme.token.clone();
    put_secret(&gateway, "acme", BOT_TOKEN);
    let run = gateway.open_run(&token, "support", 0).await;

    // An allow-listed channel posts at once.
    let posted = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_01",
            "slack.post_message",
            r#"{"channel": "C0ALLOWED1", "text": "deploy finished"}"#,
        )
        .await;
    assert_eq!(posted.status(), pb::ToolCallStatus::Succeeded, "{posted:?}");
    assert_eq!(posted.decision, "allow");
    let value = result(&posted);
    assert_eq!(value["channel"], "C0ALLOWED1");
    assert!(value["ts"].as_str().is_some_and(|ts| ts.contains('.')));
    assert_eq!(fake.requests("chat.postMessage").await.len(), 1);

    // Any other channel waits for approval, with a pending invocation, and sends nothing.
    let held = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_02",
            "slack.post_message",
            r#"{"channel": "C0ELSEWHERE", "text": "hello"}"#,
        )
        .await;
    assert_eq!(
        held.status(),
        pb::ToolCallStatus::WaitingApproval,
        "{held:?}"
    );
    assert_eq!(held.decision, "require_expert_approval");
    assert!(!held.pending_invocation_id.is_empty());
    assert_eq!(fake.requests("chat.postMessage").await.len(), 1);

    // The same tool_use_id again is a replay: the post was executed once.
    let replay = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_01",
            "slack.post_message",
            r#"{"channel": "C0ALLOWED1", "text": "deploy finished"}"#,
        )
        .await;
    assert!(replay.replayed, "{replay:?}");
    assert_eq!(replay.status(), pb::ToolCallStatus::Succeeded);
    assert_eq!(fake.requests("chat.postMessage").await.len(), 1);

    // Reading needs no approval; pagination and normalization come through.
    let history = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_03",
            "slack.channel_history",
            &format!(r#"{{"channel": "{HISTORY_CHANNEL}", "limit": 3}}"#),
        )
        .await;
    assert_eq!(
        history.status(),
        pb::ToolCallStatus::Succeeded,
        "{history:?}"
    );
    let value = result(&history);
    assert_eq!(value["messages"].as_array().unwrap().len(), 3);
    assert_eq!(value["messages"][0]["reply_count"], 3);
    assert_eq!(value["has_more"], true);

    // A vendor error is an outcome with a stable code and Slack's error name.
    let refused = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_04",
            "slack.channel_history",
            &format!(r#"{{"channel": "{NOT_MEMBER_CHANNEL}"}}"#),
        )
        .await;
    assert_eq!(refused.status(), pb::ToolCallStatus::Failed);
    assert_eq!(refused.error_code, "VENDOR_ERROR");
    assert!(
        refused.error_message.starts_with("not_in_channel"),
        "{refused:?}"
    );

    // Block Kit limits are checked before sending.
    let too_long = format!(
        r#"{{"channel": "C0ALLOWED2", "blocks": [{{"type": "header", "text": {{"type": "plain_text", "text": "{}"}}}}]}}"#,
        "h".repeat(151)
    );
    let invalid = gateway
        .call_with_id(&token, &run, "toolu_05", "slack.post_blocks", &too_long)
        .await;
    assert_eq!(invalid.error_code, "INVALID_ARGUMENTS", "{invalid:?}");
    assert!(
        invalid
            .error_message
            .contains("at most 150 for header text"),
        "{invalid:?}"
    );
    assert_eq!(fake.requests("chat.postMessage").await.len(), 1);

    // An approver approves the held post: concurrent approvals post it exactly once.
    let approver = acme.approver().to_owned();
    let mut decisions = Vec::new();
    for _ in 0..3 {
        let mut approvals = gateway.approvals().await;
        let request = pb::ResumeRequest {
            run_id: run.clone(),
            invocation_id: held.pending_invocation_id.clone(),
            decision: pb::ResumeDecision::Approve.into(),
            reason: "announcement agreed".into(),
        };
        let approver = approver.clone();
        decisions.push(tokio::spawn(async move {
            approvals
                .resume(authed(request, &approver))
                .await
                .unwrap()
                .into_inner()
        }));
    }
    let mut executed = 0;
    for decision in decisions {
        let response = decision.await.unwrap();
        if response.outcome() == pb::ResumeOutcome::Executed {
            executed += 1;
            let posted = response.result.unwrap();
            assert_eq!(posted.status(), pb::ToolCallStatus::Succeeded, "{posted:?}");
        } else {
            assert_eq!(response.outcome(), pb::ResumeOutcome::ClaimLost);
        }
    }
    assert_eq!(executed, 1);
    assert_eq!(
        fake.requests("chat.postMessage").await.len(),
        2,
        "the approved post, once"
    );

    // The bot token never shows in anything the agent or the ledger gets back.
    let calls = gateway.tool_calls(&token, &run).await;
    assert!(!format!("{calls:?}").contains(BOT_TOKEN));
}

#[tokio::test]
async fn a_webhook_tenant_posts_but_cannot_read() {
    let fake = FakeSlack::start().await;
    let gateway = Gateway::options().config(&slack_config(&fake)).start();
    let token = gateway.tenant("globex", "support", TOOLS).await;
    put_secret(&gateway, "globex", &fake.webhook_url());
    let run = gateway.open_run(&token, "support", 0).await;

    let posted = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_01",
            "slack.post_message",
            r#"{"channel": "C0ANY", "text": "via webhook"}"#,
        )
        .await;
    assert_eq!(posted.status(), pb::ToolCallStatus::Succeeded, "{posted:?}");
    assert_eq!(result(&posted)["delivered_via"], "webhook");
    assert_eq!(
        fake.requests(toolgate_slack::testkit::WEBHOOK_PATH)
            .await
            .len(),
        1
    );

    let history = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_02",
            "slack.channel_history",
            &format!(r#"{{"channel": "{HISTORY_CHANNEL}"}}"#),
        )
        .await;
    assert_eq!(history.status(), pb::ToolCallStatus::Failed);
    assert_eq!(history.error_code, "CREDENTIALS_NOT_FOUND");
    assert!(
        history.error_message.contains("needs a Slack bot token"),
        "{history:?}"
    );
    assert_eq!(fake.requests("conversations.history").await.len(), 0);
}
