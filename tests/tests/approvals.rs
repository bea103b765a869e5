//! Approvals over gRPC and the CLI against the real gateway: of concurrent approvals exactly
//! one executes, approvers only see their own tenant, and agents cannot decide.

use std::process::Command;

use toolgate_e2e::{BIG_TRANSFERS_NEED_APPROVAL, Gateway, Tenant, authed, gateway_binary};
use toolgate_proto::v1 as pb;

async fn suspended_transfer(gateway: &Gateway, token: &str) -> (String, pb::ToolCallResult) {
    let run = gateway.open_run(token, "support", 0).await;
    let arguments =
        r#"{"amount": 5000, "region": "us-east-1", "account": "acct-1", "api_key": "k-123456"}"#;
    let result = gateway
        .call(token, &run, "testkit.transfer", arguments)
        .await;
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
    let acme = gateway.transfer_tenant("acme").await;
    let (run, suspended) = suspended_transfer(&gateway, &acme.token).await;

    let listed = gateway.list_pending(acme.approver(), &run).await;
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
        let mut client = gateway.approvals().await;
        let request = pb::ResumeRequest {
            run_id: run.clone(),
            invocation_id: suspended.pending_invocation_id.clone(),
            decision: pb::ResumeDecision::Approve.into(),
            reason: "customer confirmed".into(),
        };
        let token = acme.approver().to_owned();
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
        .get_tool_call(&acme.token, &suspended.tool_call_id)
        .await;
    assert_eq!(recorded.status(), pb::ToolCallStatus::Succeeded);
}

#[tokio::test]
async fn approvals_are_scoped_to_approvers_of_the_tenant() {
    let gateway = Gateway::start();
    let acme = Tenant::setup("acme")
        .tools(&["testkit.transfer"])
        .policy(BIG_TRANSFERS_NEED_APPROVAL)
        .create(&gateway)
        .await
        .token;
    let globex = Tenant::setup("globex")
        .tools(&["testkit.transfer"])
        .approver()
        .create(&gateway)
        .await;
    let (run, suspended) = suspended_transfer(&gateway, &acme).await;
    let globex_approver = globex.approver();
    let foreign = gateway.list_pending(globex_approver, "").await;
    assert!(foreign.is_empty());
    let resume = pb::ResumeRequest {
        run_id: run,
        invocation_id: suspended.pending_invocation_id,
        decision: pb::ResumeDecision::Approve.into(),
        reason: String::new(),
    };
    let mut approvals = gateway.approvals().await;
    let err = approvals
        .resume(authed(resume.clone(), globex_approver))
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
    let acme = gateway.transfer_tenant("acme").await;
    let approver = acme.approver();
    let (run, suspended) = suspended_transfer(&gateway, &acme.token).await;
    let cli = |args: &[&str]| {
        Command::new(gateway_binary())
            .args(args)
            .env("TOOLGATE_ADDR", &gateway.url)
            .env("TOOLGATE_APPROVER_TOKEN", approver)
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
