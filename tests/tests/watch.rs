//! WatchRun: an agent runtime waiting on an approval sees the outcome of the resumed execution
//! as it happens, and a client reconnecting from its last cursor misses nothing.

use std::time::Duration;

use toolgate_e2e::{Gateway, PgSchema, authed, execute};
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::approval_service_client::ApprovalServiceClient;

const POLICY: &str = r#"
    @id("base") permit(principal, action, resource);
    @id("big") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.amount > 1000 };
"#;

/// Reads events until one of `kind` arrives (or 10 s pass).
async fn until(
    stream: &mut tonic::Streaming<pb::RunEvent>,
    kind: &str,
    seen: &mut Vec<pb::RunEvent>,
) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let next = tokio::time::timeout_at(deadline, stream.message())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "no `{kind}` event within 10 s; saw {:?}",
                    seen.iter().map(|e| &e.kind).collect::<Vec<_>>()
                )
            })
            .expect("stream error")
            .expect("stream ended");
        let done = next.kind == kind;
        seen.push(next);
        if done {
            return;
        }
    }
}

#[tokio::test]
async fn a_waiting_runtime_sees_the_approved_outcome_and_can_resume_from_a_cursor() {
    let gateway = Gateway::start();
    let token = gateway
        .tenant("acme", "support", &["testkit.transfer"])
        .await;
    let other = gateway
        .tenant("globex", "support", &["testkit.transfer"])
        .await;
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
        .unwrap();
    let approver = gateway
        .admin()
        .await
        .create_token(authed(
            pb::CreateTokenRequest {
                role: "approver".into(),
                tenant_id: "acme".into(),
                agent_id: String::new(),
                label: "alice".into(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap()
        .into_inner()
        .token;
    let mut agent = gateway.agent().await;
    let run = agent
        .create_run(authed(
            pb::CreateRunRequest {
                agent_id: "support".into(),
                run_id: String::new(),
                max_calls: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner()
        .run_id;
    let watch = |after: i64, token: &str| {
        authed(
            pb::WatchRunRequest {
                run_id: run.clone(),
                after_cursor: after,
            },
            token,
        )
    };

    let foreign = agent.watch_run(watch(0, &other)).await.unwrap_err();
    assert_eq!(foreign.code(), tonic::Code::NotFound);

    let mut stream = gateway
        .agent()
        .await
        .watch_run(watch(0, &token))
        .await
        .unwrap()
        .into_inner();
    let held = agent
        .execute_tool(authed(
            execute(
                &run,
                "testkit.transfer",
                r#"{"amount": 5000, "region": "us-east-1", "account": "a"}"#,
            ),
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.status(), pb::ToolCallStatus::WaitingApproval);
    let mut seen = Vec::new();
    until(&mut stream, "tool_call.approval_requested", &mut seen).await;
    let approval_cursor = seen.last().unwrap().cursor;

    let mut approvals = ApprovalServiceClient::new(gateway.channel().await);
    approvals
        .resume(authed(
            pb::ResumeRequest {
                run_id: run.clone(),
                invocation_id: held.pending_invocation_id.clone(),
                decision: pb::ResumeDecision::Approve.into(),
                reason: "ok".into(),
            },
            &approver,
        ))
        .await
        .unwrap();
    until(&mut stream, "tool_call.succeeded", &mut seen).await;
    let kinds: Vec<&str> = seen.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "tool_call.requested",
            "tool_call.approval_requested",
            "tool_call.approved",
            "tool_call.succeeded"
        ]
    );
    assert!(
        seen.windows(2).all(|w| w[0].cursor < w[1].cursor),
        "cursors increase"
    );
    assert!(seen.iter().all(|e| e.tool_call_id == held.tool_call_id));

    // A client that reconnects from the cursor it last saw gets exactly what came after.
    let mut resumed = gateway
        .agent()
        .await
        .watch_run(watch(approval_cursor, &token))
        .await
        .unwrap()
        .into_inner();
    let mut again = Vec::new();
    until(&mut resumed, "tool_call.succeeded", &mut again).await;
    let kinds: Vec<&str> = again.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(kinds, ["tool_call.approved", "tool_call.succeeded"]);
}

/// On PostgreSQL, a runtime watching its run on one replica sees a decision made, and the call
/// executed, on another replica (their commits reach every replica's watchers).
#[tokio::test]
async fn pg_a_runtime_watching_one_replica_sees_a_decision_made_on_another() {
    let schema = PgSchema::new().await;
    let first = Gateway::start_pg(&schema);
    let second = first.replica(schema.options());
    let token = first.tenant("acme", "support", &["testkit.transfer"]).await;
    first.put_policy("acme", POLICY).await;
    let approver = first.approver_token("acme").await;
    let run = first.open_run(&token, "support", 0).await;

    let mut stream = first
        .agent()
        .await
        .watch_run(authed(
            pb::WatchRunRequest {
                run_id: run.clone(),
                after_cursor: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    let held = second
        .agent()
        .await
        .execute_tool(authed(
            execute(
                &run,
                "testkit.transfer",
                r#"{"amount": 5000, "region": "us-east-1", "account": "a"}"#,
            ),
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(held.status(), pb::ToolCallStatus::WaitingApproval);
    let mut seen = Vec::new();
    until(&mut stream, "tool_call.approval_requested", &mut seen).await;

    let outcome = ApprovalServiceClient::new(second.channel().await)
        .resume(authed(
            pb::ResumeRequest {
                run_id: run.clone(),
                invocation_id: held.pending_invocation_id.clone(),
                decision: pb::ResumeDecision::Approve.into(),
                reason: "ok".into(),
            },
            &approver,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(outcome.outcome(), pb::ResumeOutcome::Executed);
    until(&mut stream, "tool_call.succeeded", &mut seen).await;
    let kinds: Vec<&str> = seen.iter().map(|e| e.kind.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "tool_call.requested",
            "tool_call.approval_requested",
            "tool_call.approved",
            "tool_call.succeeded"
        ]
    );
    assert!(seen.windows(2).all(|w| w[0].cursor < w[1].cursor));
    // GetToolCall on either replica returns the outcome too.
    let call = first
        .agent()
        .await
        .get_tool_call(authed(
            pb::GetToolCallRequest {
                tool_call_id: held.tool_call_id.clone(),
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(call.status(), pb::ToolCallStatus::Succeeded);
}
