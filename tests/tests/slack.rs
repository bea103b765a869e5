//! The Slack connector end to end: the real gateway binary over gRPC, pointed at the fake
//! Slack through `[connectors.slack]` in its toolgate.toml, credentials stored with the
//! `toolgate secrets put` CLI, and a Cedar policy that requires approval for posts outside an
//! allow-listed set of channels. (The approvals API has not landed yet, so a post outside the
//! list is asserted to stop at WAITING_APPROVAL with a pending invocation and nothing sent.)

use std::io::Write as _;
use std::process::{Command, Stdio};

use serde_json::Value;
use toolgate_e2e::{Gateway, authed, execute, gateway_binary};
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

/// Starts a gateway whose Slack connector talks to `fake`.
fn start_gateway(fake: &FakeSlack, dir: &std::path::Path) -> Gateway {
    let toml = format!(
        "[connectors.slack]\napi_base_url = \"{}\"\nallow_hosts = [\"127.0.0.1\"]\nwebhook_hosts = [\"127.0.0.1\"]\n",
        fake.api_base_url()
    );
    std::fs::write(dir.join("toolgate.toml"), toml).unwrap();
    Gateway::start_in(dir, &[])
}

/// `toolgate secrets put TENANT slack_default`, the value on standard input.
fn put_secret(gateway: &Gateway, tenant: &str, value: &str) {
    let mut child = Command::new(gateway_binary())
        .args(["secrets", "put", tenant, "slack_default"])
        .current_dir(&gateway.dir)
        .env("TOOLGATE_ADDR", &gateway.url)
        .env_remove("TOOLGATE_BIN")
        .env_remove("TOOLGATE_TOKEN")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{value}\n").as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let printed = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "{printed}");
    assert!(!printed.contains(value), "{printed}");
}

async fn open_run(gateway: &Gateway, token: &str) -> String {
    gateway
        .agent()
        .await
        .create_run(authed(
            pb::CreateRunRequest {
                agent_id: "support".into(),
                run_id: String::new(),
                max_calls: 0,
            },
            token,
        ))
        .await
        .unwrap()
        .into_inner()
        .run_id
}

async fn call(
    gateway: &Gateway,
    token: &str,
    run: &str,
    tool_use_id: &str,
    tool: &str,
    arguments: &str,
) -> pb::ToolCallResult {
    let request = pb::ExecuteToolRequest {
        tool_use_id: tool_use_id.into(),
        ..execute(run, tool, arguments)
    };
    gateway
        .agent()
        .await
        .execute_tool(authed(request, token))
        .await
        .unwrap_or_else(|e| panic!("{tool}: {e}"))
        .into_inner()
}

fn result(outcome: &pb::ToolCallResult) -> Value {
    serde_json::from_str(&outcome.result_json).unwrap_or_else(|_| panic!("{outcome:?}"))
}

#[tokio::test]
async fn slack_through_the_gateway_with_policy_and_credentials() {
    let fake = FakeSlack::start().await;
    let temp = tempfile::tempdir().unwrap();
    let gateway = start_gateway(&fake, temp.path());
    let token = gateway.tenant("acme", "support", TOOLS).await;
    put_secret(&gateway, "acme", BOT_TOKEN);
    gateway
        .admin()
        .await
        .put_policy(authed(
            pb::PutPolicyRequest {
                tenant_id: "acme".into(),
                text: POLICY.into(),
            },
            &gateway.admin_token,
        ))
        .await
        .expect("policy accepted by the generated schema");
    let run = open_run(&gateway, &token).await;

    // An allow-listed channel posts at once.
    let posted = call(
        &gateway,
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
    let held = call(
        &gateway,
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
    let replay = call(
        &gateway,
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
    let history = call(
        &gateway,
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
    let refused = call(
        &gateway,
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
    let invalid = call(
        &gateway,
        &token,
        &run,
        "toolu_05",
        "slack.post_blocks",
        &too_long,
    )
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
    let approver = gateway
        .admin()
        .await
        .create_token(authed(
            pb::CreateTokenRequest {
                role: "approver".into(),
                tenant_id: "acme".into(),
                agent_id: String::new(),
                label: "ops-lead".into(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap()
        .into_inner()
        .token;
    let mut decisions = Vec::new();
    for _ in 0..3 {
        let mut approvals = toolgate_proto::v1::approval_service_client::ApprovalServiceClient::new(
            gateway.channel().await,
        );
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
    let calls = gateway
        .agent()
        .await
        .list_tool_calls(authed(
            pb::ListToolCallsRequest {
                run_id: run.clone(),
                ..Default::default()
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(!format!("{calls:?}").contains(BOT_TOKEN));
}

#[tokio::test]
async fn a_webhook_tenant_posts_but_cannot_read() {
    let fake = FakeSlack::start().await;
    let temp = tempfile::tempdir().unwrap();
    let gateway = start_gateway(&fake, temp.path());
    let token = gateway.tenant("globex", "support", TOOLS).await;
    put_secret(&gateway, "globex", &fake.webhook_url());
    let run = open_run(&gateway, &token).await;

    let posted = call(
        &gateway,
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

    let history = call(
        &gateway,
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
