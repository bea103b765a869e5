//! WatchRun: an agent runtime waiting on an approval sees the outcome of the resumed execution
//! as it happens, and a client reconnecting from its last cursor misses nothing.

use std::time::Duration;

use toolgate_e2e::{BIG_TRANSFER, Gateway, PgSchema};
use toolgate_proto::v1 as pb;

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
    let acme = gateway.transfer_tenant("acme").await;
    let token = acme.token.clone();
    let other = gateway
        .tenant("globex", "support", &["testkit.transfer"])
        .await;
    let run = gateway.open_run(&token, "support", 0).await;

    let foreign = gateway.try_watch_run(&other, &run, 0).await.unwrap_err();
    assert_eq!(foreign.code(), tonic::Code::NotFound);

    let mut stream = gateway.watch_run(&token, &run, 0).await;
    let held = gateway
        .call(&token, &run, "testkit.transfer", BIG_TRANSFER)
        .await;
    assert_eq!(held.status(), pb::ToolCallStatus::WaitingApproval);
    let mut seen = Vec::new();
    until(&mut stream, "tool_call.approval_requested", &mut seen).await;
    let approval_cursor = seen.last().unwrap().cursor;

    gateway
        .resume(
            acme.approver(),
            &run,
            &held.pending_invocation_id,
            pb::ResumeDecision::Approve,
            "ok",
        )
        .await;
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
    let mut resumed = gateway.watch_run(&token, &run, approval_cursor).await;
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
    let acme = first.transfer_tenant("acme").await;
    let token = acme.token.clone();
    let run = first.open_run(&token, "support", 0).await;

    let mut stream = first.watch_run(&token, &run, 0).await;
    let held = second
        .call(&token, &run, "testkit.transfer", BIG_TRANSFER)
        .await;
    assert_eq!(held.status(), pb::ToolCallStatus::WaitingApproval);
    let mut seen = Vec::new();
    until(&mut stream, "tool_call.approval_requested", &mut seen).await;

    let outcome = second
        .resume(
            acme.approver(),
            &run,
            &held.pending_invocation_id,
            pb::ResumeDecision::Approve,
            "ok",
        )
        .await;
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
    let call = first.get_tool_call(&token, &held.tool_call_id).await;
    assert_eq!(call.status(), pb::ToolCallStatus::Succeeded);
}
