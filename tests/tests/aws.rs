//! The AWS connector end to end, as the "AWS Pulse" scenario: the real gateway binary over
//! gRPC with `[connectors.aws]` pointing at moto (seeded with instances, security groups,
//! users, buckets, addresses), credentials stored with `toolgate secrets put`, an agent run
//! that audits the account with several tools and then posts a summary to the fake Slack under
//! a Cedar policy that holds the post for an approver; the ledger shows every call, redacted.

use serde_json::Value;
use toolgate_aws::testkit::{Moto, TEST_ACCESS_KEY, TEST_SECRET_KEY, secret_json};
use toolgate_e2e::{Gateway, Tenant, serve_until_exit, slack_config};
use toolgate_proto::v1 as pb;
use toolgate_slack::testkit::{BOT_TOKEN, FakeSlack};

const AUDIT_TOOLS: &[&str] = &[
    "aws.ec2_inventory",
    "aws.security_groups_audit",
    "aws.iam_audit",
    "aws.s3_inventory",
    "aws.eips_audit",
];

const POLICY: &str = r#"
@id("base") permit(principal, action, resource);
@id("summaries-need-a-human") @decision("require_expert_approval") @risk("medium")
permit(principal, action == Toolgate::Action::"slack.post_message", resource);
"#;

/// The gateway's `toolgate.toml`: Slack at `slack`, AWS at `moto`.
fn config(moto: &Moto, slack: &FakeSlack) -> String {
    format!(
        "{}[connectors.aws]\nendpoint_url = \"{}\"\npage_size = 5\n",
        slack_config(slack),
        moto.endpoint_url()
    )
}

/// Starts a gateway on `config` that never asks the instance metadata service.
fn start_gateway(moto: &Moto, slack: &FakeSlack) -> Gateway {
    Gateway::options()
        .config(&config(moto, slack))
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .start()
}

/// `toolgate secrets put TENANT NAME`, the value on standard input (no newline); the CLI
/// never prints the AWS secret key.
fn put_secret(gateway: &Gateway, tenant: &str, name: &str, value: &str) {
    let printed = gateway.secrets_put(tenant, name, &[], value);
    assert!(!printed.contains(TEST_SECRET_KEY), "{printed}");
}

fn succeeded(outcome: &pb::ToolCallResult) -> Value {
    assert_eq!(
        outcome.status(),
        pb::ToolCallStatus::Succeeded,
        "{outcome:?}"
    );
    serde_json::from_str(&outcome.result_json).unwrap()
}

fn findings_of(value: &Value, kind: &str) -> Vec<Value> {
    value["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["kind"] == kind)
        .cloned()
        .collect()
}

#[tokio::test]
async fn an_agent_audits_the_account_and_an_approver_releases_the_summary() {
    let moto = Moto::start();
    let seeded = moto.seed_account().await;
    let slack = FakeSlack::start().await;
    let gateway = start_gateway(&moto, &slack);

    let mut tools: Vec<&str> = AUDIT_TOOLS.to_vec();
    tools.push("slack.post_message");
    let acme = Tenant::setup("acme")
        .agent("pulse")
        .tools(&tools)
        .policy(POLICY)
        .approver()
        .create(&gateway)
        .await;
    let token = acme.token.clone();
    put_secret(&gateway, "acme", "aws_default", &secret_json("us-east-1"));
    put_secret(&gateway, "acme", "slack_default", BOT_TOKEN);
    let run = gateway.open_run(&token, "pulse", 0).await;
    let listed = gateway.list_tools(&token, &run).await;
    let names: Vec<&str> = listed.iter().map(|t| t.name.as_str()).collect();
    for tool in AUDIT_TOOLS {
        assert!(names.contains(tool), "{tool} not listed: {names:?}");
    }

    let inventory = succeeded(
        &gateway
            .call_with_id(
                &token,
                &run,
                "toolu_1",
                "aws.ec2_inventory",
                r#"{"regions": ["us-east-1", "eu-west-1"]}"#,
            )
            .await,
    );
    assert_eq!(inventory["count"], 13, "{inventory}");
    assert_eq!(inventory["by_state"]["stopped"], 2);
    let groups = succeeded(
        &gateway
            .call_with_id(&token, &run, "toolu_2", "aws.security_groups_audit", "{}")
            .await,
    );
    let open = findings_of(&groups, "ingress_open_to_internet");
    assert!(
        open.iter()
            .any(|f| f["resource"] == seeded.open_ssh_group.as_str() && f["ports"] == "22"),
        "{groups}"
    );
    let iam = succeeded(
        &gateway
            .call_with_id(&token, &run, "toolu_3", "aws.iam_audit", "{}")
            .await,
    );
    assert_eq!(iam["count"], 7, "{iam}");
    let user2 = iam["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|u| u["user_name"] == "user-2")
        .unwrap();
    assert_eq!(
        user2["access_keys"].as_array().unwrap().len(),
        2,
        "the agent gets the full answer, key ids included"
    );
    let s3 = succeeded(
        &gateway
            .call_with_id(&token, &run, "toolu_4", "aws.s3_inventory", "{}")
            .await,
    );
    assert_eq!(s3["count"], 4, "{s3}");
    let eips = succeeded(
        &gateway
            .call_with_id(&token, &run, "toolu_5", "aws.eips_audit", "{}")
            .await,
    );
    assert_eq!(eips["unassociated"], 2, "{eips}");

    // A region that does not exist is refused before anything is sent.
    let refused = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_6",
            "aws.ec2_inventory",
            r#"{"regions": ["us-east-9"]}"#,
        )
        .await;
    assert_eq!(refused.status(), pb::ToolCallStatus::Failed, "{refused:?}");
    assert_eq!(refused.error_code, "INVALID_ARGUMENTS");

    // The summary waits for an approver, then is posted once.
    let summary = format!(
        "AWS pulse: {} instances ({} stopped), {} security group rules open to the internet, {} IAM users without MFA, {} unassociated Elastic IPs",
        inventory["count"],
        inventory["by_state"]["stopped"],
        open.len(),
        iam["users_without_mfa"],
        eips["unassociated"]
    );
    let arguments = serde_json::json!({"channel": "C0OPSAUDIT", "text": summary}).to_string();
    let held = gateway
        .call_with_id(&token, &run, "toolu_7", "slack.post_message", &arguments)
        .await;
    assert_eq!(
        held.status(),
        pb::ToolCallStatus::WaitingApproval,
        "{held:?}"
    );
    assert!(slack.requests("chat.postMessage").await.is_empty());
    let resumed = gateway
        .resume(
            acme.approver(),
            &run,
            &held.pending_invocation_id,
            pb::ResumeDecision::Approve,
            "summary checked",
        )
        .await;
    assert_eq!(
        resumed.outcome(),
        pb::ResumeOutcome::Executed,
        "{resumed:?}"
    );
    let posts = slack.requests("chat.postMessage").await;
    assert_eq!(posts.len(), 1);
    assert!(
        String::from_utf8_lossy(&posts[0].body).contains("AWS pulse: 13 instances"),
        "{}",
        String::from_utf8_lossy(&posts[0].body)
    );

    // The ledger has every call, with redacted inputs and outputs.
    let calls = gateway.tool_calls(&token, &run).await;
    let mut seen: Vec<(&str, pb::ToolCallStatus)> = calls
        .iter()
        .map(|c| (c.tool_use_id.as_str(), c.status()))
        .collect();
    seen.sort_unstable_by_key(|(id, _)| *id);
    assert_eq!(
        seen,
        [
            ("toolu_1", pb::ToolCallStatus::Succeeded),
            ("toolu_2", pb::ToolCallStatus::Succeeded),
            ("toolu_3", pb::ToolCallStatus::Succeeded),
            ("toolu_4", pb::ToolCallStatus::Succeeded),
            ("toolu_5", pb::ToolCallStatus::Succeeded),
            ("toolu_6", pb::ToolCallStatus::Failed),
            ("toolu_7", pb::ToolCallStatus::Succeeded),
        ]
    );
    let iam_row = calls.iter().find(|c| c.tool_use_id == "toolu_3").unwrap();
    assert!(iam_row.output_redacted_json.contains("user-2"));
    for key in &seeded.access_keys {
        assert!(
            !iam_row.output_redacted_json.contains(key.as_str()),
            "access key id {key} stored unredacted"
        );
    }
    for row in &calls {
        assert!(!row.input_redacted_json.contains(TEST_SECRET_KEY));
        assert!(!row.output_redacted_json.contains(TEST_SECRET_KEY));
        assert!(!row.output_redacted_json.contains(TEST_ACCESS_KEY));
    }
    assert!(gateway.verify_ledger().await.ok, "the audit chains verify");
}

#[tokio::test]
async fn tenant_credentials_are_required_and_cannot_move_the_endpoint() {
    let moto = Moto::start();
    let slack = FakeSlack::start().await;
    let gateway = start_gateway(&moto, &slack);

    let none = gateway
        .tenant("initech", "pulse", &["aws.eips_audit"])
        .await;
    let run = gateway.open_run(&none, "pulse", 0).await;
    let missing = gateway
        .call_with_id(&none, &run, "toolu_1", "aws.eips_audit", "{}")
        .await;
    assert_eq!(missing.error_code, "CREDENTIALS_NOT_FOUND", "{missing:?}");

    let sneaky = gateway.tenant("globex", "pulse", &["aws.eips_audit"]).await;
    let value = serde_json::json!({
        "access_key_id": TEST_ACCESS_KEY,
        "secret_access_key": TEST_SECRET_KEY,
        "endpoint_url": "http://169.254.169.254"
    })
    .to_string();
    put_secret(&gateway, "globex", "aws_default", &value);
    let run = gateway.open_run(&sneaky, "pulse", 0).await;
    let refused = gateway
        .call_with_id(&sneaky, &run, "toolu_1", "aws.eips_audit", "{}")
        .await;
    assert_eq!(refused.status(), pb::ToolCallStatus::Failed);
    assert_eq!(refused.error_code, "CREDENTIALS_UNAVAILABLE", "{refused:?}");
    assert!(
        refused.error_message.contains("[connectors.aws]"),
        "{refused:?}"
    );
}

#[test]
fn an_invalid_aws_configuration_stops_the_gateway_before_it_listens() {
    let temp = tempfile::tempdir().unwrap();
    std::fs::write(
        temp.path().join("toolgate.toml"),
        "[connectors.aws]\ndefault_region = \"us-east-7\"\n",
    )
    .unwrap();
    let output = serve_until_exit(temp.path());
    assert!(!output.status.success());
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!stdout.contains("listening"), "{stdout}");
    assert!(
        stderr.contains("connectors.aws") && stderr.contains("did you mean `us-east-1`"),
        "{stderr}"
    );
}
