//! Nothing sensitive at rest, as an operator would check it: secrets sent through every door
//! an agent or approver has (arguments, tool name, ids, error texts, vendor answers,
//! suspended and denied calls, a decision's reason) are not in the raw database files once
//! the gateway has stopped; the files are private; key and token files others can read are
//! refused with the fix.

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use toolgate_e2e::{Gateway, Tenant, execute, gateway_binary, serve_until_exit};
use toolgate_proto::v1 as pb;

const POLICY: &str = r#"
    @id("base") permit(principal, action, resource);
    @id("big") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.amount > 1000 };
    @id("no-paris") forbid(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.region == "eu-west-3" };
"#;

/// One secret per door, each of a kind the redactor knows, each unique to its door so a
/// finding says which door leaked.
const IN_ARGUMENTS: &str = "AKIAQ3EGRVP5ARGSX7JM";
const AS_TOOL_NAME: &str = "xoxb-210987654321-1098765432109-toolnamesecretvaluexyz12";
const AS_TOOL_USE_ID: &str = "xoxp-310987654321-2098765432109-tooluseidsecretvalue34";
const AS_CORRELATION_ID: &str = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiJjb3JyZWxhdGlvbiJ9.Q29ycmVsYXRpb25TZWNyZXRTaWduYXR1cmUxMjM0";
const IN_ERROR_TEXT: &str = "shpat_0123456789abcdef0123456789abcdef";
const IN_ANSWER: &str = "ghp_AnswerSecretValue0123456789abcdefABCD";
const IN_PENDING: &str = "xoxb-410987654321-3098765432109-pendingsecretvalue5678";
const IN_DENIED: &str = "xoxb-510987654321-4098765432109-deniedsecretvalue90ab";
const IN_UNPARSABLE: &str = "AKIAQ3EGRVP5UNPARSD9";
const IN_REASON: &str = "xoxb-610987654321-5098765432109-reasonsecretvaluecdef";

fn secrets() -> [(&'static str, &'static str); 10] {
    [
        ("arguments", IN_ARGUMENTS),
        ("tool name", AS_TOOL_NAME),
        ("tool_use_id", AS_TOOL_USE_ID),
        ("correlation_id", AS_CORRELATION_ID),
        ("error text", IN_ERROR_TEXT),
        ("vendor answer", IN_ANSWER),
        ("pending call", IN_PENDING),
        ("denied call", IN_DENIED),
        ("unparsable arguments", IN_UNPARSABLE),
        ("approver's reason", IN_REASON),
    ]
}

/// The database files in `dir` whose raw bytes contain `needle` or any 12-byte piece of it
/// (a partial secret is a leak too).
fn leaks(dir: &Path, needle: &str) -> Vec<String> {
    let pieces: Vec<&[u8]> = needle.as_bytes().windows(12).collect();
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("toolgate.db") {
            continue;
        }
        let bytes = std::fs::read(&path).unwrap();
        if pieces
            .iter()
            .any(|piece| bytes.windows(piece.len()).any(|window| window == *piece))
        {
            found.push(name);
        }
    }
    found
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test]
async fn secrets_sent_through_every_door_are_not_in_the_database_files() {
    let mut gateway = Gateway::start();
    let acme = Tenant::setup("acme")
        .tools(&["testkit.echo", "testkit.fail", "testkit.transfer"])
        .policy(POLICY)
        .approver()
        .create(&gateway)
        .await;
    let token = acme.token.clone();
    let run = gateway.open_run(&token, "support", 0).await;

    // Arguments (a value under an innocent field name) and the vendor's answer (echo answers
    // with its arguments).
    let echoed = gateway
        .call(
            &token,
            &run,
            "testkit.echo",
            &format!(r#"{{"message": "key {IN_ARGUMENTS} and {IN_ANSWER}"}}"#),
        )
        .await;
    assert_eq!(echoed.status(), pb::ToolCallStatus::Succeeded, "{echoed:?}");
    assert!(
        echoed.result_json.contains(IN_ANSWER),
        "the agent gets the whole answer"
    );
    // A credential as the tool name.
    let named = gateway.call(&token, &run, AS_TOOL_NAME, "{}").await;
    assert_eq!(named.error_code, "NOT_IN_MANIFEST", "{named:?}");
    // Credentials as identifiers are refused.
    let mut with_use_id = execute(&run, "testkit.echo", r#"{"message": "hi"}"#);
    with_use_id.tool_use_id = AS_TOOL_USE_ID.into();
    let refused = gateway.try_execute(&token, with_use_id).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert!(!refused.message().contains(AS_TOOL_USE_ID));
    let mut with_correlation = execute(&run, "testkit.echo", r#"{"message": "hi"}"#);
    with_correlation.correlation_id = AS_CORRELATION_ID.into();
    let refused = gateway
        .try_execute(&token, with_correlation)
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    // An error text from the vendor.
    let failed = gateway.call(&token, &run, "testkit.fail", &serde_json::json!({"code": "VENDOR_ERROR", "message": format!("vendor says token {IN_ERROR_TEXT} is wrong")}).to_string()).await;
    assert_eq!(failed.error_code, "VENDOR_ERROR", "{failed:?}");
    // Arguments that are not JSON.
    let unparsable = gateway
        .call(
            &token,
            &run,
            "testkit.echo",
            &format!("{{message: {IN_UNPARSABLE}"),
        )
        .await;
    assert_eq!(unparsable.error_code, "INVALID_ARGUMENTS", "{unparsable:?}");
    // A call waiting for approval, one approved and executed, one denied by policy.
    let mut pending_ids = Vec::new();
    for _ in 0..2 {
        let suspended = gateway
            .call(
                &token,
                &run,
                "testkit.transfer",
                &format!(r#"{{"amount": 5000, "region": "us-east-1", "account": "{IN_PENDING}"}}"#),
            )
            .await;
        assert_eq!(
            suspended.status(),
            pb::ToolCallStatus::WaitingApproval,
            "{suspended:?}"
        );
        pending_ids.push(suspended.pending_invocation_id);
    }
    let denied = gateway
        .call(
            &token,
            &run,
            "testkit.transfer",
            &format!(r#"{{"amount": 5, "region": "eu-west-3", "account": "{IN_DENIED}"}}"#),
        )
        .await;
    assert_eq!(denied.error_code, "POLICY_BLOCKED", "{denied:?}");
    let reason = format!("customer confirmed, the bot token is {IN_REASON}");
    let resumed = gateway
        .resume(
            acme.approver(),
            &run,
            &pending_ids[0],
            pb::ResumeDecision::Approve,
            &reason,
        )
        .await;
    assert_eq!(
        resumed.outcome(),
        pb::ResumeOutcome::Executed,
        "{resumed:?}"
    );
    let listed = gateway.list_pending(acme.approver(), &run).await;
    assert!(
        listed
            .iter()
            .any(|p| p.invocation_id == pending_ids[1] && p.arguments_json.contains("5000")),
        "approvers still see what they decide: {listed:?}"
    );

    // Stopped as an operator stops it.
    gateway.signal("TERM");
    let status = gateway.wait_exit(Duration::from_secs(30)).await;
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let mut found = Vec::new();
    for (door, secret) in secrets() {
        for file in leaks(&gateway.dir, secret) {
            found.push(format!("{door} secret in {file}"));
        }
    }
    assert!(found.is_empty(), "secrets at rest: {found:#?}");

    // The scan can see what it looks for: the approver's reason is in the ledger.
    assert!(!leaks(&gateway.dir, "customer confirmed").is_empty());
}

#[tokio::test]
async fn the_files_are_private_and_shared_ones_are_refused_with_the_fix() {
    let gateway = Gateway::start();
    let dir = gateway.dir.clone();
    let _ = gateway.tenant("acme", "support", &["testkit.echo"]).await;
    for name in [
        "toolgate.db",
        "toolgate.db-wal",
        "toolgate.db-shm",
        "toolgate-keys",
        "toolgate-admin.token",
    ] {
        assert_eq!(mode(&dir.join(name)), 0o600, "{name}");
    }
    let _temp = gateway.stop();

    for (name, what) in [
        ("toolgate-keys", "key file"),
        ("toolgate-admin.token", "admin token file"),
        ("toolgate.db", "ledger file"),
    ] {
        let path = dir.join(name);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let output = serve_until_exit(&dir);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{name}: {stderr}");
        assert!(
            stderr.contains(what) && stderr.contains("chmod 600") && stderr.contains(name),
            "{name}: {stderr}"
        );
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }

    // The CLI refuses a token file others can read, before sending anything.
    let token_file = dir.join("toolgate-admin.token");
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o640)).unwrap();
    let output = Command::new(gateway_binary())
        .args(["admin", "--token-file"])
        .arg(&token_file)
        .args(["tenants", "list"])
        .current_dir(&dir)
        .env_remove("TOOLGATE_BIN")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "{stderr}");
    assert!(stderr.contains("chmod 600"), "{stderr}");
}
