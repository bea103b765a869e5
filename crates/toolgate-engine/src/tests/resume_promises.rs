//! What an approval promises: it runs under the timeout the agent asked for, never repeats a
//! write whose outcome is unknown, stops at the kill switch, and records the status and
//! attempts the connector reported.

use std::sync::Arc;
use std::time::Duration;

use toolgate_core::{ErrorCode, ToolCallStatus};
use toolgate_ledger::{PendingFilter, PendingOrigin, PendingState, TOOL_CALLING_ENABLED};

use super::ledgers::{self, Backend, ledger_test};
use super::{ADMIN_TOKEN, EngineConfig, Harness, admin, harness, harness_with, resume_request};
use crate::{ExecuteOutcome, ResumeDecision, ResumeOutcome};

/// Approval for the sleepers and the failer; everything else runs.
const POLICY: &str = r#"
    @id("base") permit(principal, action, resource);
    @id("sleep-needs-approval") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.sleep", resource);
    @id("write-needs-approval") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.sleep_write", resource);
    @id("fail-needs-approval") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.fail", resource);
    @id("big") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.amount > 1000 };
"#;

pub(super) const TRANSFER: &str = r#"{"amount": 5000, "region": "us-east-1", "account": "a"}"#;

pub(super) async fn approving(backend: &Backend) -> Harness {
    let h = harness(backend).await;
    h.engine
        .put_policy(&h.tenant, POLICY, "test")
        .await
        .unwrap();
    h
}

/// Suspends `tool` with `arguments` and an optional per-call timeout; the pending id.
pub(super) async fn suspend(
    h: &Harness,
    run: &toolgate_core::RunId,
    tool: &str,
    arguments: &str,
    timeout: Option<Duration>,
) -> String {
    let mut request = h.request(run, tool, arguments);
    request.timeout = timeout;
    let outcome = h.engine.execute(request).await.unwrap();
    assert_eq!(
        outcome.status,
        ToolCallStatus::WaitingApproval,
        "{outcome:?}"
    );
    outcome.pending_invocation_id.unwrap()
}

pub(super) async fn decide(
    h: &Harness,
    run: &toolgate_core::RunId,
    pending: &str,
    decision: ResumeDecision,
) -> ResumeOutcome {
    h.engine
        .resume(resume_request(h, run, pending, decision, "alice"))
        .await
        .unwrap()
}

fn executed(outcome: ResumeOutcome) -> ExecuteOutcome {
    match outcome {
        ResumeOutcome::Executed(executed) => executed,
        other => panic!("not executed: {other:?}"),
    }
}

async fn open_pending(h: &Harness) -> Vec<toolgate_ledger::PendingInvocation> {
    h.store
        .list_pending(&h.tenant, &PendingFilter::default(), 100)
        .await
        .unwrap()
}

async fn an_approved_call_runs_under_the_timeout_it_asked_for(backend: Backend) {
    let h = approving(&backend).await;
    let run = h.run(None).await;
    // 400 ms fits the tool's default of 500 ms, but not the 100 ms the agent asked for.
    let short = Duration::from_millis(100);
    let pending = suspend(&h, &run, "testkit.sleep", r#"{"ms": 400}"#, Some(short)).await;
    let row = h.store.get_pending(&h.tenant, &pending).await.unwrap();
    assert_eq!(
        row.unwrap().timeout,
        Some(short),
        "kept with the invocation"
    );
    let outcome = executed(decide(&h, &run, &pending, ResumeDecision::Approve).await);
    assert_eq!(outcome.status, ToolCallStatus::TimedOut, "{outcome:?}");
    assert!(
        outcome.error.as_ref().unwrap().message.contains("100 ms"),
        "{outcome:?}"
    );
    // An idempotent tool that timed out is safe to run again: it is offered once more, under
    // the same timeout.
    let open = open_pending(&h).await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].origin, PendingOrigin::ExecutionFailed);
    assert_eq!(open[0].timeout, Some(short), "carried over to the re-pend");
    let again = executed(decide(&h, &run, &open[0].id, ResumeDecision::Approve).await);
    assert_eq!(again.status, ToolCallStatus::TimedOut, "{again:?}");

    // Without a per-call timeout the tool's default applies, as before.
    let pending = suspend(&h, &run, "testkit.sleep", r#"{"ms": 50}"#, None).await;
    let row = h.store.get_pending(&h.tenant, &pending).await.unwrap();
    assert_eq!(row.unwrap().timeout, None);
    let outcome = executed(decide(&h, &run, &pending, ResumeDecision::Approve).await);
    assert_eq!(outcome.status, ToolCallStatus::Succeeded, "{outcome:?}");
}
ledger_test!(an_approved_call_runs_under_the_timeout_it_asked_for);

async fn an_approved_write_with_an_unknown_outcome_is_not_offered_again(backend: Backend) {
    let h = approving(&backend).await;
    let run = h.run(None).await;
    // A write that outlives its timeout: the vendor may have acted.
    let pending = suspend(
        &h,
        &run,
        "testkit.sleep_write",
        r#"{"ms": 5000}"#,
        Some(Duration::from_millis(50)),
    )
    .await;
    let outcome = executed(decide(&h, &run, &pending, ResumeDecision::Approve).await);
    assert_eq!(
        outcome.status,
        ToolCallStatus::OutcomeUnknown,
        "{outcome:?}"
    );
    assert!(open_pending(&h).await.is_empty(), "no plain re-run");
    let row = h
        .store
        .get_pending(&h.tenant, &pending)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(row.state, PendingState::Approved);
    let call = outcome.tool_call_id.clone().unwrap();
    assert_eq!(h.call_status(&call).await, ToolCallStatus::OutcomeUnknown);
    assert_eq!(
        decide(&h, &run, &pending, ResumeDecision::Approve).await,
        ResumeOutcome::ClaimLost,
        "a second approval executes nothing"
    );

    // The connector's own OUTCOME_UNKNOWN (a post sent, then the connection lost) likewise.
    let pending = suspend(
        &h,
        &run,
        "testkit.fail",
        r#"{"code": "OUTCOME_UNKNOWN", "message": "connection lost after sending"}"#,
        None,
    )
    .await;
    let outcome = executed(decide(&h, &run, &pending, ResumeDecision::Approve).await);
    assert_eq!(
        outcome.status,
        ToolCallStatus::OutcomeUnknown,
        "{outcome:?}"
    );
    assert!(open_pending(&h).await.is_empty(), "no plain re-run");

    // A failure known not to have acted is offered again (the existing promise).
    let pending = suspend(
        &h,
        &run,
        "testkit.fail",
        r#"{"code": "VENDOR_ERROR"}"#,
        None,
    )
    .await;
    let outcome = executed(decide(&h, &run, &pending, ResumeDecision::Approve).await);
    assert_eq!(outcome.status, ToolCallStatus::Failed, "{outcome:?}");
    let open = open_pending(&h).await;
    assert_eq!(open.len(), 1, "{open:?}");
    assert_eq!(open[0].origin, PendingOrigin::ExecutionFailed);

    let kinds = h.event_kinds().await;
    assert_eq!(
        kinds
            .iter()
            .filter(|k| *k == "tool_call.outcome_unknown")
            .count(),
        2,
        "{kinds:?}"
    );
    let run_after = h.engine.get_run(&h.tenant, &run).await.unwrap();
    assert_eq!(run_after.pending_approvals, 1, "only the failed call waits");
}
ledger_test!(an_approved_write_with_an_unknown_outcome_is_not_offered_again);

async fn the_kill_switch_stops_approvals_but_not_rejections(backend: Backend) {
    let h = approving(&backend).await;
    let run = h.run(None).await;
    let first = suspend(&h, &run, "testkit.transfer", TRANSFER, None).await;
    let second = suspend(&h, &run, "testkit.transfer", TRANSFER, None).await;
    let third = suspend(&h, &run, "testkit.transfer", TRANSFER, None).await;
    let before = h.store.get_pending(&h.tenant, &first).await.unwrap();
    h.engine
        .set_flag(&h.tenant, TOOL_CALLING_ENABLED, false, ADMIN_TOKEN)
        .await
        .unwrap();

    let refused = decide(&h, &run, &first, ResumeDecision::Approve).await;
    let ResumeOutcome::FeatureDisabled {
        tool_call_id,
        error,
    } = &refused
    else {
        panic!("{refused:?}");
    };
    assert_eq!(error.code, ErrorCode::FeatureDisabled);
    assert!(error.message.contains("still pending"), "{error:?}");
    assert_eq!(
        h.store.get_pending(&h.tenant, &first).await.unwrap(),
        before,
        "unclaimed, same version"
    );
    assert_eq!(
        h.call_status(tool_call_id).await,
        ToolCallStatus::WaitingApproval
    );
    let kinds = h.event_kinds().await;
    assert!(kinds.contains(&"tool_call.approval_refused".to_owned()));
    assert!(
        !kinds.contains(&"tool_call.approved".to_owned()),
        "{kinds:?}"
    );
    assert!(
        !kinds.contains(&"tool_call.succeeded".to_owned()),
        "{kinds:?}"
    );

    // Decisions that execute nothing still work.
    assert!(matches!(
        decide(&h, &run, &second, ResumeDecision::Reject).await,
        ResumeOutcome::Rejected { .. }
    ));
    assert!(matches!(
        decide(&h, &run, &third, ResumeDecision::Continue).await,
        ResumeOutcome::Continued { .. }
    ));

    // Switched on again, the same invocation executes, once.
    h.engine
        .set_flag(&h.tenant, TOOL_CALLING_ENABLED, true, ADMIN_TOKEN)
        .await
        .unwrap();
    let outcome = executed(decide(&h, &run, &first, ResumeDecision::Approve).await);
    assert_eq!(outcome.status, ToolCallStatus::Succeeded, "{outcome:?}");
    assert_eq!(
        decide(&h, &run, &first, ResumeDecision::Approve).await,
        ResumeOutcome::ClaimLost
    );
    let kinds = h.event_kinds().await;
    assert_eq!(
        kinds.iter().filter(|k| *k == "tool_call.succeeded").count(),
        1,
        "{kinds:?}"
    );
}
ledger_test!(the_kill_switch_stops_approvals_but_not_rejections);

/// A kill switch thrown behind this engine's back (on the store, as another process sharing
/// it does) stops an approval once the engine drops its cached configuration, though the flag
/// was cached as on; the invocation stays pending.
async fn a_kill_switch_thrown_elsewhere_stops_approvals_once_the_cache_is_dropped(
    backend: Backend,
) {
    let config = EngineConfig {
        cache_ttl: Duration::from_secs(3600),
        ..EngineConfig::default()
    };
    let h = harness_with(&backend, config, None).await;
    h.engine
        .put_policy(&h.tenant, POLICY, "test")
        .await
        .unwrap();
    let run = h.run(None).await;
    let pending = suspend(&h, &run, "testkit.transfer", TRANSFER, None).await;
    h.store
        .set_flag(&h.tenant, TOOL_CALLING_ENABLED, false, &admin())
        .await
        .unwrap();
    h.engine.forget_cached_configuration();
    let refused = decide(&h, &run, &pending, ResumeDecision::Approve).await;
    assert!(
        matches!(refused, ResumeOutcome::FeatureDisabled { .. }),
        "{refused:?}"
    );
    let row = h.store.get_pending(&h.tenant, &pending).await.unwrap();
    assert_eq!(row.unwrap().state, PendingState::Pending);
}
ledger_test!(a_kill_switch_thrown_elsewhere_stops_approvals_once_the_cache_is_dropped);

/// The status and attempts a connector's error reports reach the outcome, the ledger row and
/// the terminal audit event.
async fn a_connectors_error_is_recorded_as_it_says(backend: Backend) {
    let h = Arc::new(harness(&backend).await);
    let run = h.run(None).await;
    // (arguments of testkit.fail, status, attempts, audit event)
    let cases = [
        (
            r#"{"code": "OUTCOME_UNKNOWN", "attempts": 1}"#,
            ToolCallStatus::OutcomeUnknown,
            1,
            "tool_call.outcome_unknown",
        ),
        (
            r#"{"code": "TIMEOUT", "attempts": 2}"#,
            ToolCallStatus::TimedOut,
            2,
            "tool_call.timed_out",
        ),
        (
            r#"{"code": "VENDOR_RATE_LIMITED", "attempts": 3}"#,
            ToolCallStatus::Failed,
            3,
            "tool_call.failed",
        ),
        (
            r#"{"code": "POLICY_BLOCKED", "attempts": 0}"#,
            ToolCallStatus::Failed,
            0,
            "tool_call.failed",
        ),
        // A connector that does not count was invoked once.
        (
            r#"{"code": "VENDOR_ERROR"}"#,
            ToolCallStatus::Failed,
            1,
            "tool_call.failed",
        ),
    ];
    for (arguments, status, attempts, kind) in cases {
        let outcome = h.call(&run, "testkit.fail", arguments).await;
        assert_eq!(
            (outcome.status, outcome.attempts),
            (status, attempts),
            "{arguments}: {outcome:?}"
        );
        let row = h.ledger_row(&outcome).await;
        assert_eq!(
            (row.status, row.attempts),
            (status, i64::from(attempts)),
            "{arguments}"
        );
        let events = h.store.list_events(&h.tenant, 0, 10_000).await.unwrap();
        let terminal = events
            .iter()
            .rev()
            .find(|e| e.tool_call_id.as_ref() == Some(&row.id) && e.kind != "tool_call.requested")
            .expect("a terminal event");
        assert_eq!(terminal.kind, kind, "{arguments}");
        assert_eq!(
            terminal.payload["attempts"],
            serde_json::json!(attempts),
            "{arguments}"
        );
    }
}
ledger_test!(a_connectors_error_is_recorded_as_it_says);
