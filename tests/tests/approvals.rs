//! Approvals over gRPC and the CLI against the real gateway: of concurrent approvals exactly
//! one executes, approvers only see their own tenant, and agents cannot decide.

use std::process::Command;

use toolgate_e2e::{Gateway, authed, execute, gateway_binary};
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::approval_service_client::ApprovalServiceClient;

const POLICY: &str = r#"
    @id("base") permit(principal, action, resource);
    @id("big") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.amount > 1000 };
"#;

async fn suspended_transfer(gateway: &Gateway, token: &str) -> (String, pb::ToolCallResult) {
    let run = gateway.open_run(token, "support", 0).await;
    let result = gateway
        .agent()
        .await
        .execute_tool(authed(execute(&run, "testkit.transfer", r#"{"amount": 5000, "region": "us-east-1", "account": "acct-1", "api_key": "k-123456"}"#), token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        result.status(),
        pb::ToolCallStatus::WaitingApproval,
        "{result:?}"
    );
    (run, result)
}

#[tokio::test]
async fn concurrent_approvals_execute_the_call_exactly_once() {
    let gateway = Gateway::start();
    let agent_token = gateway
        .tenant("acme", "support", &["testkit.transfer"])
        .await;
    gateway.put_policy("acme", POLICY).await;
    let approver = gateway.approver_token("acme").await;
    let (run, suspended) = suspended_transfer(&gateway, &agent_token).await;

    let mut approvals = ApprovalServiceClient::new(gateway.channel().await);
    let listed = approvals
        .list_pending(authed(
            pb::ListPendingRequest {
                run_id: run.clone(),
                ..Default::default()
            },
            &approver,
        ))
        .await
        .unwrap()
        .into_inner()
        .invocations;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].invocation_id, suspended.pending_invocation_id);
    assert!(
        listed[0].arguments_json.contains("acct-1"),
        "approvers see what they approve"
    );
    assert!(
        !listed[0].arguments_json.contains("k-123456"),
        "but not its secrets"
    );

    let mut tasks = Vec::new();
    for _ in 0..8 {
        let mut client = ApprovalServiceClient::new(gateway.channel().await);
        let request = pb::ResumeRequest {
            run_id: run.clone(),
            invocation_id: suspended.pending_invocation_id.clone(),
            decision: pb::ResumeDecision::Approve.into(),
            reason: "customer confirmed".into(),
        };
        let token = approver.clone();
        tasks.push(tokio::spawn(async move {
            client
                .resume(authed(request, &token))
                .await
                .unwrap()
                .into_inner()
        }));
    }
    let mut executed = Vec::new();
    let mut lost = 0;
    for task in tasks {
        let response = task.await.unwrap();
        match response.outcome() {
            pb::ResumeOutcome::Executed => executed.push(response),
            pb::ResumeOutcome::ClaimLost => lost += 1,
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!((executed.len(), lost), (1, 7));
    let result = executed[0].result.as_ref().unwrap();
    assert_eq!(result.status(), pb::ToolCallStatus::Succeeded, "{result:?}");
    let recorded = gateway
        .agent()
        .await
        .get_tool_call(authed(
            pb::GetToolCallRequest {
                tool_call_id: suspended.tool_call_id.clone(),
            },
            &agent_token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(recorded.status(), pb::ToolCallStatus::Succeeded);
}

#[tokio::test]
async fn approvals_are_scoped_to_approvers_of_the_tenant() {
    let gateway = Gateway::start();
    let acme = gateway
        .tenant("acme", "support", &["testkit.transfer"])
        .await;
    gateway
        .tenant("globex", "support", &["testkit.transfer"])
        .await;
    gateway.put_policy("acme", POLICY).await;
    let (run, suspended) = suspended_transfer(&gateway, &acme).await;
    let globex_approver = gateway.approver_token("globex").await;
    let mut approvals = ApprovalServiceClient::new(gateway.channel().await);
    let foreign = approvals
        .list_pending(authed(pb::ListPendingRequest::default(), &globex_approver))
        .await
        .unwrap()
        .into_inner()
        .invocations;
    assert!(foreign.is_empty());
    let resume = pb::ResumeRequest {
        run_id: run,
        invocation_id: suspended.pending_invocation_id,
        decision: pb::ResumeDecision::Approve.into(),
        reason: String::new(),
    };
    let err = approvals
        .resume(authed(resume.clone(), &globex_approver))
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    let err = approvals.resume(authed(resume, &acme)).await.unwrap_err();
    assert_eq!(
        err.code(),
        tonic::Code::PermissionDenied,
        "agent tokens cannot decide"
    );
}

#[tokio::test]
async fn the_cli_lists_and_approves() {
    let gateway = Gateway::start();
    let agent_token = gateway
        .tenant("acme", "support", &["testkit.transfer"])
        .await;
    gateway.put_policy("acme", POLICY).await;
    let approver = gateway.approver_token("acme").await;
    let (run, suspended) = suspended_transfer(&gateway, &agent_token).await;
    let cli = |args: &[&str]| {
        Command::new(gateway_binary())
            .args(args)
            .env("TOOLGATE_ADDR", &gateway.url)
            .env("TOOLGATE_APPROVER_TOKEN", &approver)
            .env_remove("TOOLGATE_BIN")
            .output()
            .unwrap()
    };
    let listed = cli(&["approvals", "list"]);
    assert!(
        listed.status.success(),
        "{}",
        String::from_utf8_lossy(&listed.stderr)
    );
    assert!(String::from_utf8_lossy(&listed.stdout).contains(&suspended.pending_invocation_id));
    let approved = cli(&[
        "approvals",
        "approve",
        &run,
        &suspended.pending_invocation_id,
        "--reason",
        "ok",
    ]);
    let stdout = String::from_utf8_lossy(&approved.stdout);
    assert!(approved.status.success(), "{stdout}");
    assert!(
        stdout.contains("\"outcome\": \"RESUME_OUTCOME_EXECUTED\"")
            && stdout.contains("\"status\": \"TOOL_CALL_STATUS_SUCCEEDED\""),
        "{stdout}"
    );
    let again = cli(&[
        "approvals",
        "reject",
        &run,
        &suspended.pending_invocation_id,
    ]);
    assert_eq!(
        again.status.code(),
        Some(5),
        "a decision that did not apply exits 5"
    );
    assert!(String::from_utf8_lossy(&again.stdout).contains("RESUME_OUTCOME_CLAIM_LOST"));
}
