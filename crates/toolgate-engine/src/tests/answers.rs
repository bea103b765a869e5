//! Replays are the answer they repeat (sealed full answers, kept for their retention), the
//! outcome of an approved call can be collected, and a refused call is evaluated again when
//! it is repeated.

use super::*;
use crate::ResumeDecision;

const SECRET: &str = "sk-live-0123456789abcdef";

fn keyed(h: &Harness, run: &RunId, tool: &str, arguments: &str, key: &str) -> ExecuteRequest {
    let mut request = h.request(run, tool, arguments);
    request.tool_use_id = key.to_owned();
    request
}

async fn approval_policy(h: &Harness) {
    h.engine
        .put_policy(&h.tenant, super::APPROVAL_POLICY, "test")
        .await
        .unwrap();
}

fn echo_arguments() -> String {
    json!({"message": "hi", "api_token": SECRET}).to_string()
}

async fn a_replay_is_the_full_answer_with_every_field(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    let request = keyed(&h, &run, "testkit.echo", &echo_arguments(), "toolu_1");
    let first = h.engine.execute(request.clone()).await.unwrap();
    assert_eq!(first.status, ToolCallStatus::Succeeded, "{first:?}");
    let again = h.engine.execute(request).await.unwrap();
    assert!(again.replayed && !again.redacted, "{again:?}");
    assert_eq!(
        ExecuteOutcome {
            replayed: false,
            ..again.clone()
        },
        first,
        "every field of the original answer"
    );
    assert_eq!(again.result.unwrap()["api_token"], SECRET);

    // At rest, the answer is sealed: neither the ledger row nor the sealed text holds it.
    let id = first.tool_call_id.unwrap();
    let row = h
        .store
        .get_tool_call(&h.tenant, &id)
        .await
        .unwrap()
        .unwrap();
    assert!(!row.output_redacted.unwrap().to_string().contains(SECRET));
    let sealed = h
        .store
        .get_call_answer(&h.tenant, &id)
        .await
        .unwrap()
        .unwrap();
    assert!(sealed.sealed.starts_with("tgs1.k1."), "{}", sealed.sealed);
    // Ciphertext, not an encoding of the answer: the secret is in neither the text nor the
    // decoded bytes.
    assert!(!sealed.sealed.contains(SECRET));
    let encoded = sealed.sealed.rsplit('.').next().unwrap();
    let bytes =
        base64::Engine::decode(&base64::engine::general_purpose::STANDARD, encoded).unwrap();
    assert!(bytes.len() > SECRET.len());
    assert!(!bytes.windows(SECRET.len()).any(|w| w == SECRET.as_bytes()));
}
ledger_test!(a_replay_is_the_full_answer_with_every_field);

async fn a_failed_call_replays_its_original_error(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    let arguments = json!({"code": "VENDOR_ERROR", "message": format!("bad key {SECRET}")});
    let request = keyed(&h, &run, "testkit.fail", &arguments.to_string(), "toolu_f");
    let first = h.engine.execute(request.clone()).await.unwrap();
    assert_eq!(first.status, ToolCallStatus::Failed, "{first:?}");
    let again = h.engine.execute(request).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.error, first.error);
    assert_eq!(again.attempts, first.attempts);
    // An execution that started is final: the replay did not run the connector again (a
    // second execution would have recorded a second outcome, and been a new evaluation).
    let row = h.ledger_row(&first).await;
    assert_eq!(row.evaluation, 1);
    let outcomes = h
        .event_kinds()
        .await
        .iter()
        .filter(|kind| *kind == "tool_call.failed")
        .count();
    assert_eq!(outcomes, 1, "the connector ran once");
}
ledger_test!(a_failed_call_replays_its_original_error);

async fn a_replay_of_a_waiting_call_names_its_pending_invocation(backend: Backend) {
    let h = harness(&backend).await;
    approval_policy(&h).await;
    let run = h.run(None).await;
    let arguments = r#"{"amount": 5000, "region": "us-east-1", "account": "a-1"}"#;
    let request = keyed(&h, &run, "testkit.transfer", arguments, "toolu_w");
    let first = h.engine.execute(request.clone()).await.unwrap();
    assert_eq!(first.status, ToolCallStatus::WaitingApproval);
    let again = h.engine.execute(request).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.status, ToolCallStatus::WaitingApproval);
    assert_eq!(again.pending_invocation_id, first.pending_invocation_id);
    assert_eq!(again.decision, Some(Decision::RequireExpertApproval));
    assert_eq!(again.risk, first.risk);
}
ledger_test!(a_replay_of_a_waiting_call_names_its_pending_invocation);

async fn after_an_approval_the_agent_collects_the_full_outcome(backend: Backend) {
    let h = Arc::new(harness(&backend).await);
    approval_policy(&h).await;
    let run = h.run(None).await;
    let arguments = r#"{"amount": 5000, "region": "us-east-1", "account": "a-1"}"#;
    let request = keyed(&h, &run, "testkit.transfer", arguments, "toolu_a");
    let first = h.engine.execute(request.clone()).await.unwrap();
    let call = first.tool_call_id.clone().unwrap();
    let invocation = first.pending_invocation_id.clone().unwrap();

    // Nobody decided yet: the wait ends with the call as it stands.
    let waited = h
        .engine
        .await_tool_call(&h.tenant, None, &call, Duration::from_millis(50))
        .await
        .unwrap();
    assert_eq!(waited.status, ToolCallStatus::WaitingApproval);
    assert_eq!(
        waited.pending_invocation_id.as_deref(),
        Some(invocation.as_str())
    );

    // An agent waiting while an approver decides gets the executed outcome.
    let waiter = {
        let h = Arc::clone(&h);
        let call = call.clone();
        tokio::spawn(async move {
            h.engine
                .await_tool_call(&h.tenant, None, &call, Duration::from_secs(60))
                .await
        })
    };
    let decision = resume_request(&h, &run, &invocation, ResumeDecision::Approve, "alice");
    let resumed = h.engine.resume(decision).await.unwrap();
    assert!(
        matches!(resumed, crate::ResumeOutcome::Executed(_)),
        "{resumed:?}"
    );
    let collected = waiter.await.unwrap().unwrap();
    assert_eq!(collected.status, ToolCallStatus::Succeeded, "{collected:?}");
    assert_eq!(
        collected.result,
        Some(json!({"transferred": 5000, "status": "done"}))
    );
    assert!(!collected.redacted);

    // The replay of the same tool_use_id is that outcome too.
    let again = h.engine.execute(request).await.unwrap();
    assert!(again.replayed);
    assert_eq!(again.result, collected.result);
    assert_eq!(again.decision, Some(Decision::RequireExpertApproval));

    // Another tenant's (or another agent's) waiter finds nothing.
    let stranger = h
        .engine
        .await_tool_call(
            &TenantId::new("globex").unwrap(),
            None,
            &call,
            Duration::ZERO,
        )
        .await;
    assert!(
        matches!(stranger, Err(EngineError::NotFound(_))),
        "{stranger:?}"
    );
    let other_agent = AgentId::new("billing").unwrap();
    let stranger = h
        .engine
        .await_tool_call(&h.tenant, Some(&other_agent), &call, Duration::ZERO)
        .await;
    assert!(
        matches!(stranger, Err(EngineError::NotFound(_))),
        "{stranger:?}"
    );
}
ledger_test!(after_an_approval_the_agent_collects_the_full_outcome);

async fn answers_are_purged_after_their_retention(backend: Backend) {
    let config = EngineConfig {
        answer_retention: Duration::from_millis(200),
        ..EngineConfig::default()
    };
    let h = harness_with(&backend, config, None).await;
    let run = h.run(None).await;
    let request = keyed(&h, &run, "testkit.echo", &echo_arguments(), "toolu_p");
    let first = h.engine.execute(request.clone()).await.unwrap();
    let id = first.tool_call_id.clone().unwrap();
    assert!(
        h.store
            .get_call_answer(&h.tenant, &id)
            .await
            .unwrap()
            .is_some()
    );
    assert_eq!(h.engine.purge_expired_answers().await.unwrap(), 0);

    tokio::time::sleep(Duration::from_millis(300)).await;
    // Past its retention the answer is not given, even before the purge removes it.
    let late = h.engine.execute(request.clone()).await.unwrap();
    assert!(late.replayed && late.redacted, "{late:?}");
    assert_eq!(late.result.unwrap()["api_token"], "[REDACTED]");
    assert_eq!(h.engine.purge_expired_answers().await.unwrap(), 1);
    assert!(
        h.store
            .get_call_answer(&h.tenant, &id)
            .await
            .unwrap()
            .is_none()
    );
    let after = h.engine.execute(request).await.unwrap();
    assert!(after.replayed && after.redacted);
    assert_eq!(after.status, ToolCallStatus::Succeeded);
}
ledger_test!(answers_are_purged_after_their_retention);

async fn a_refused_call_is_evaluated_again_when_repeated(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    h.engine
        .set_flag(&h.tenant, TOOL_CALLING_ENABLED, false, ADMIN_TOKEN)
        .await
        .unwrap();
    let request = keyed(&h, &run, "testkit.echo", r#"{"message": "hi"}"#, "toolu_r");
    let refused = h.engine.execute(request.clone()).await.unwrap();
    assert_eq!(refused.error_code(), Some(ErrorCode::FeatureDisabled));
    // While the cause stands, a repeat is refused again (and recorded as another evaluation).
    let still = h.engine.execute(request.clone()).await.unwrap();
    assert_eq!(still.error_code(), Some(ErrorCode::FeatureDisabled));
    assert!(!still.replayed);
    assert_eq!(still.tool_call_id, refused.tool_call_id);

    h.engine
        .set_flag(&h.tenant, TOOL_CALLING_ENABLED, true, ADMIN_TOKEN)
        .await
        .unwrap();
    let executed = h.engine.execute(request.clone()).await.unwrap();
    assert_eq!(executed.status, ToolCallStatus::Succeeded, "{executed:?}");
    assert!(!executed.replayed);
    assert_eq!(
        executed.tool_call_id, refused.tool_call_id,
        "another evaluation of that call"
    );
    let row = h.ledger_row(&executed).await;
    assert_eq!((row.status, row.evaluation), (ToolCallStatus::Succeeded, 3));
    let run_record = h.engine.get_run(&h.tenant, &run).await.unwrap();
    assert_eq!(
        run_record.calls_used, 1,
        "refusals are not counted, the execution is"
    );

    // Once it ran, it is final.
    let replay = h.engine.execute(request.clone()).await.unwrap();
    assert!(replay.replayed);
    assert_eq!(replay.result, executed.result);
    let calls = h
        .store
        .list_tool_calls(&h.tenant, &run, None, 10)
        .await
        .unwrap();
    assert_eq!(calls.len(), 1);
    let requested = h
        .event_kinds()
        .await
        .iter()
        .filter(|kind| *kind == "tool_call.requested")
        .count();
    assert_eq!(requested, 3, "each evaluation is audited");

    // A repeat with other arguments is still an error.
    let mut other = request;
    other.arguments_json = r#"{"message": "other"}"#.into();
    let error = h.engine.execute(other).await.unwrap_err();
    assert!(matches!(error, EngineError::Conflict(_)), "{error}");
    assert!(
        h.store
            .verify_chains()
            .await
            .unwrap()
            .first_problem
            .is_none()
    );
}
ledger_test!(a_refused_call_is_evaluated_again_when_repeated);

async fn a_policy_denial_is_evaluated_again_after_the_policy_changed(backend: Backend) {
    let h = harness(&backend).await;
    approval_policy(&h).await;
    let run = h.run(None).await;
    let arguments = r#"{"amount": 10, "region": "eu-west-3", "account": "a-1"}"#;
    let request = keyed(&h, &run, "testkit.transfer", arguments, "toolu_d");
    let denied = h.engine.execute(request.clone()).await.unwrap();
    assert_eq!(denied.error_code(), Some(ErrorCode::PolicyBlocked));
    let denial = denied.pending_invocation_id.clone().unwrap();

    h.engine
        .put_policy(
            &h.tenant,
            r#"@id("all") permit(principal, action, resource);"#,
            "test",
        )
        .await
        .unwrap();
    let executed = h.engine.execute(request).await.unwrap();
    assert_eq!(executed.status, ToolCallStatus::Succeeded, "{executed:?}");
    // The earlier denial no longer waits for a decision, and a late one changes nothing.
    let row = h
        .store
        .get_pending(&h.tenant, &denial)
        .await
        .unwrap()
        .unwrap();
    assert_ne!(row.state, toolgate_ledger::PendingState::Pending);
    let late = resume_request(&h, &run, &denial, ResumeDecision::Reject, "alice");
    assert_eq!(
        h.engine.resume(late).await.unwrap(),
        crate::ResumeOutcome::ClaimLost
    );
    assert_eq!(
        h.ledger_row(&executed).await.status,
        ToolCallStatus::Succeeded
    );
    let run_record = h.engine.get_run(&h.tenant, &run).await.unwrap();
    assert_eq!(run_record.pending_approvals, 0);
}
ledger_test!(a_policy_denial_is_evaluated_again_after_the_policy_changed);

async fn a_human_rejection_is_final(backend: Backend) {
    let h = harness(&backend).await;
    approval_policy(&h).await;
    let run = h.run(None).await;
    let arguments = r#"{"amount": 5000, "region": "us-east-1", "account": "a-1"}"#;
    let request = keyed(&h, &run, "testkit.transfer", arguments, "toolu_x");
    let first = h.engine.execute(request.clone()).await.unwrap();
    let invocation = first.pending_invocation_id.clone().unwrap();
    let reject = resume_request(&h, &run, &invocation, ResumeDecision::Reject, "alice");
    h.engine.resume(reject).await.unwrap();
    let again = h.engine.execute(request).await.unwrap();
    assert!(again.replayed, "{again:?}");
    assert_eq!(again.error_code(), Some(ErrorCode::ExpertRejected));
    assert_eq!(again.decision, Some(Decision::RequireExpertApproval));
    assert_eq!(h.ledger_row(&first).await.evaluation, 1);
}
ledger_test!(a_human_rejection_is_final);

async fn concurrent_repeats_of_a_refusal_execute_once(backend: Backend) {
    let h = Arc::new(harness(&backend).await);
    let run = h.run(None).await;
    h.engine
        .set_flag(&h.tenant, TOOL_CALLING_ENABLED, false, ADMIN_TOKEN)
        .await
        .unwrap();
    let request = keyed(&h, &run, "testkit.echo", r#"{"message": "hi"}"#, "toolu_c");
    h.engine.execute(request.clone()).await.unwrap();
    h.engine
        .set_flag(&h.tenant, TOOL_CALLING_ENABLED, true, ADMIN_TOKEN)
        .await
        .unwrap();
    let tasks: Vec<_> = (0..12)
        .map(|_| {
            let h = Arc::clone(&h);
            let request = request.clone();
            tokio::spawn(async move { h.engine.execute(request).await.unwrap() })
        })
        .collect();
    let mut fresh = 0;
    for task in tasks {
        let outcome = task.await.unwrap();
        assert_ne!(
            outcome.error_code(),
            Some(ErrorCode::FeatureDisabled),
            "{outcome:?}"
        );
        if !outcome.replayed {
            fresh += 1;
        }
    }
    assert_eq!(fresh, 1, "exactly one repeat evaluated the call again");
    let succeeded = h
        .event_kinds()
        .await
        .iter()
        .filter(|kind| *kind == "tool_call.succeeded")
        .count();
    assert_eq!(succeeded, 1, "executed once");
}
ledger_test!(concurrent_repeats_of_a_refusal_execute_once);

async fn a_repeat_over_budget_is_refused_again_without_counting(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(Some(1)).await;
    h.call(&run, "testkit.noop", "{}").await;
    let request = keyed(&h, &run, "testkit.noop", "{}", "toolu_b");
    let over = h.engine.execute(request.clone()).await.unwrap();
    assert_eq!(
        over.error_code(),
        Some(ErrorCode::BudgetExceeded),
        "{over:?}"
    );
    let again = h.engine.execute(request).await.unwrap();
    assert_eq!(
        again.error_code(),
        Some(ErrorCode::BudgetExceeded),
        "{again:?}"
    );
    assert!(!again.replayed);
    assert_eq!(again.tool_call_id, over.tool_call_id);
    let row = h.ledger_row(&again).await;
    assert_eq!((row.status, row.evaluation), (ToolCallStatus::Blocked, 2));
    let run_record = h.engine.get_run(&h.tenant, &run).await.unwrap();
    assert_eq!(run_record.calls_used, 1);
    assert!(
        h.store
            .verify_chains()
            .await
            .unwrap()
            .first_problem
            .is_none()
    );
}
ledger_test!(a_repeat_over_budget_is_refused_again_without_counting);
