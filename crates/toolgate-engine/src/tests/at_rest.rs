//! Nothing the caller sends is kept in clear: a suspended call's arguments are sealed (and
//! open for the approved execution), a policy denial keeps none, a credential given as the
//! tool name is recorded redacted, and identifiers holding one are refused.

use super::*;
use crate::ResumeDecision;

/// A Slack bot token the redactor recognises.
const TOKEN: &str = "xoxb-123456789012-1234567890123-abcdefghijklmnopqrstuvwx";

/// Everything the ledger keeps of the tenant, as text: calls, pending rows and events.
async fn ledger_text(h: &Harness, run: &RunId) -> String {
    let mut text = String::new();
    for call in h
        .store
        .list_tool_calls(&h.tenant, run, None, 1000)
        .await
        .unwrap()
    {
        text.push_str(&format!("{call:?}\n"));
    }
    for pending in h
        .store
        .list_pending(&h.tenant, &toolgate_ledger::PendingFilter::default(), 1000)
        .await
        .unwrap()
    {
        text.push_str(&format!("{pending:?}\n"));
    }
    for event in h.store.list_events(&h.tenant, 0, 10_000).await.unwrap() {
        text.push_str(&format!("{event:?}\n"));
    }
    text
}

async fn suspended_arguments_are_sealed_and_open_for_the_approval(backend: Backend) {
    let h = harness(&backend).await;
    h.engine
        .put_policy(&h.tenant, APPROVAL_POLICY, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    // A credential where a plain value belongs: the ledger's redacted input hides it, and the
    // pending row must not keep it in clear either.
    let account = TOKEN;
    let arguments = json!({"amount": 5000, "region": "us-east-1", "account": account});
    let pending = suspended(&h, &run, &arguments.to_string()).await;
    let row = h
        .store
        .get_pending(&h.tenant, &pending)
        .await
        .unwrap()
        .unwrap();
    let toolgate_ledger::PendingArguments::Sealed { sealed, .. } = &row.arguments else {
        panic!("the arguments are not sealed: {:?}", row.arguments);
    };
    assert!(!sealed.contains("abcdefghijkl"), "{sealed}");
    let text = ledger_text(&h, &run).await;
    assert!(!text.contains("abcdefghijkl"), "{text}");

    let outcome = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &pending,
            ResumeDecision::Approve,
            "alice",
        ))
        .await
        .unwrap();
    let crate::ResumeOutcome::Executed(outcome) = outcome else {
        panic!("not executed: {outcome:?}");
    };
    assert_eq!(outcome.status, ToolCallStatus::Succeeded, "{outcome:?}");
    assert_eq!(
        outcome.result,
        Some(json!({"transferred": 5000, "status": "done"})),
        "the approved execution ran with the original arguments"
    );
    let row = h
        .store
        .get_pending(&h.tenant, &pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.arguments, toolgate_ledger::PendingArguments::Dropped);
}
ledger_test!(suspended_arguments_are_sealed_and_open_for_the_approval);

async fn a_policy_denial_keeps_no_arguments(backend: Backend) {
    let h = harness(&backend).await;
    h.engine
        .put_policy(&h.tenant, APPROVAL_POLICY, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    let blocked = h
        .call(
            &run,
            "testkit.transfer",
            r#"{"amount": 5, "region": "eu-west-3", "account": "acct-denied-81b2"}"#,
        )
        .await;
    assert_eq!(blocked.error_code(), Some(ErrorCode::PolicyBlocked));
    let pending = blocked.pending_invocation_id.expect("a POLICY_DENIED row");
    let row = h
        .store
        .get_pending(&h.tenant, &pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.arguments, toolgate_ledger::PendingArguments::Dropped);
    // Only Reject resolves it, which needs no arguments.
    let rejected = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &pending,
            ResumeDecision::Reject,
            "alice",
        ))
        .await
        .unwrap();
    assert!(matches!(rejected, crate::ResumeOutcome::Rejected { .. }));
}
ledger_test!(a_policy_denial_keeps_no_arguments);

async fn a_credential_given_as_the_tool_name_is_recorded_redacted(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    for tool in [
        TOKEN.to_owned(),
        format!("slack.{TOKEN}"),
        format!("call {TOKEN} now"),
    ] {
        let outcome = h.call(&run, &tool, "{}").await;
        assert_eq!(
            outcome.error_code(),
            Some(ErrorCode::NotInManifest),
            "{outcome:?}"
        );
        let row = h.ledger_row(&outcome).await;
        assert!(!row.tool.contains("abcdefghijkl"), "{row:?}");
    }
    let text = ledger_text(&h, &run).await;
    assert!(!text.contains("abcdefghijkl"), "{text}");
    assert!(!text.contains("123456789012"), "{text}");
}
ledger_test!(a_credential_given_as_the_tool_name_is_recorded_redacted);

async fn identifiers_holding_a_credential_are_refused_without_repeating_it(backend: Backend) {
    let h = harness(&backend).await;
    let run = h.run(None).await;
    let jwt = "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U";
    for field in ["tool_use_id", "correlation_id"] {
        let mut request = h.request(&run, "testkit.noop", "{}");
        match field {
            "tool_use_id" => request.tool_use_id = TOKEN.to_owned(),
            _ => request.correlation_id = jwt.to_owned(),
        }
        match h.engine.execute(request).await {
            Err(EngineError::InvalidRequest(message)) => {
                assert!(message.contains(field), "{message}");
                assert!(!message.contains("abcdefghijkl") && !message.contains("eyJ"));
            }
            other => panic!("{field}: {other:?}"),
        }
    }
    let text = ledger_text(&h, &run).await;
    assert!(!text.contains("abcdefghijkl"), "{text}");
    assert!(!text.contains("dozjgNryP4J3"), "{text}");
    assert_eq!(
        h.event_kinds()
            .await
            .iter()
            .filter(|k| *k == "request.rejected")
            .count(),
        2
    );
}
ledger_test!(identifiers_holding_a_credential_are_refused_without_repeating_it);

async fn clear_arguments_left_by_an_engine_without_keys_are_sealed_by_a_rewrap(backend: Backend) {
    let h = harness(&backend).await;
    h.engine
        .put_policy(&h.tenant, APPROVAL_POLICY, "test")
        .await
        .unwrap();
    // An engine without a sealer, as a version before sealing was: it keeps them in clear.
    let mut registry = ToolRegistry::new();
    registry
        .register(Arc::new(TestkitConnector) as Arc<dyn Connector>)
        .unwrap();
    let unsealed = Engine::new(
        Arc::clone(&h.store),
        Arc::new(Catalog::new(registry).unwrap()),
        Arc::new(SystemClock),
        EngineConfig::default(),
    )
    .unwrap();
    let run = h.run(None).await;
    let outcome = unsealed
        .execute(h.request(
            &run,
            "testkit.transfer",
            &json!({"amount": 5000, "region": "us-east-1", "account": TOKEN}).to_string(),
        ))
        .await
        .unwrap();
    let pending = outcome.pending_invocation_id.expect("suspended");
    let read = || async {
        h.store
            .get_pending(&h.tenant, &pending)
            .await
            .unwrap()
            .unwrap()
            .arguments
    };
    assert!(matches!(
        read().await,
        toolgate_ledger::PendingArguments::Clear(_)
    ));

    assert_eq!(
        h.engine.rewrap_pending_arguments("k1").await.unwrap(),
        (1, 0)
    );
    let toolgate_ledger::PendingArguments::Sealed { key_id, sealed } = read().await else {
        panic!("not sealed");
    };
    assert_eq!(key_id, "k1");
    assert!(!sealed.contains("abcdefghijkl"));
    assert_eq!(
        h.engine.rewrap_pending_arguments("k1").await.unwrap(),
        (0, 0),
        "nothing is left to seal"
    );
    let outcome = h
        .engine
        .resume(resume_request(
            &h,
            &run,
            &pending,
            ResumeDecision::Approve,
            "alice",
        ))
        .await
        .unwrap();
    assert!(
        matches!(&outcome, crate::ResumeOutcome::Executed(o) if o.status == ToolCallStatus::Succeeded),
        "{outcome:?}"
    );
}
ledger_test!(clear_arguments_left_by_an_engine_without_keys_are_sealed_by_a_rewrap);
