//! A call settled by someone else while it ran: the engine answers what the ledger recorded,
//! never what its connector said. (The PostgreSQL replica that loses its instance lock while a
//! call runs is in `postgres.rs`.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use toolgate_core::{ErrorCode, ToolCallStatus};
use toolgate_ledger::{FinishCall, ToolCallRecord};

use super::ledgers::{self, Backend, ledger_test};
use super::{Harness, harness};
use crate::{EngineError, ExecuteOutcome};

/// How long the slow write sleeps: long enough for the test to settle it meanwhile, on a busy
/// machine too.
pub(super) const SLOW_MS: u64 = 5_000;

/// Starts `testkit.sleep_write` (a write that is not idempotent) sleeping `ms`, on its own task,
/// and returns the task and the call once its `running` row is committed.
pub(super) async fn start_slow_write(
    h: &Arc<Harness>,
    run: &toolgate_core::RunId,
    ms: u64,
) -> (
    tokio::task::JoinHandle<Result<ExecuteOutcome, EngineError>>,
    ToolCallRecord,
) {
    let task = {
        let h = Arc::clone(h);
        let mut request = h.request(run, "testkit.sleep_write", &json!({"ms": ms}).to_string());
        request.timeout = Some(Duration::from_secs(120));
        tokio::spawn(async move { h.engine.execute(request).await })
    };
    let started = Instant::now();
    loop {
        let calls = h
            .store
            .list_tool_calls(&h.tenant, run, None, 1000)
            .await
            .unwrap();
        if let Some(call) = calls
            .into_iter()
            .find(|c| c.tool.as_str() == "testkit.sleep_write")
        {
            assert_eq!(call.status, ToolCallStatus::Running, "{call:?}");
            return (task, call);
        }
        assert!(!task.is_finished(), "the slow call ended: {task:?}");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the slow call never got its running row"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What recovery writes for a call it takes for interrupted.
fn settle(call: &ToolCallRecord) -> FinishCall {
    FinishCall {
        tenant: call.tenant.clone(),
        id: call.id.clone(),
        status: ToolCallStatus::OutcomeUnknown,
        output_redacted: None,
        error_code: Some(ErrorCode::OutcomeUnknown),
        error_text: Some("settled elsewhere while it ran".to_owned()),
        duration_ms: 0,
        attempts: call.attempts,
        at: toolgate_core::Timestamp(2),
        answer: None,
        events: Vec::new(),
    }
}

/// The connector succeeds, but by the time the engine records that, the call is no longer
/// `running` (settled as `outcome_unknown` meanwhile): the agent is told `outcome_unknown` with
/// the ledger's error, not `succeeded`, and the ledger row stays as it was.
async fn a_finish_that_finds_the_call_settled_answers_what_the_ledger_recorded(backend: Backend) {
    let h = Arc::new(harness(&backend).await);
    let run = h.run(None).await;
    let (task, running) = start_slow_write(&h, &run, SLOW_MS).await;
    assert!(h.store.finish_call(settle(&running)).await.unwrap());

    let outcome = task.await.unwrap().unwrap();
    assert_eq!(
        outcome.status,
        ToolCallStatus::OutcomeUnknown,
        "{outcome:?}"
    );
    assert_eq!(outcome.error_code(), Some(ErrorCode::OutcomeUnknown));
    assert_eq!(
        outcome.error.as_ref().map(|e| e.message.as_str()),
        Some("settled elsewhere while it ran")
    );
    assert_eq!(outcome.result, None, "no result the ledger does not have");
    assert_eq!(outcome.tool_call_id.as_ref(), Some(&running.id));
    let row = h.ledger_row(&outcome).await;
    assert_eq!(row.status, ToolCallStatus::OutcomeUnknown);
    assert_eq!(
        row.error_text.as_deref(),
        Some("settled elsewhere while it ran")
    );
}
ledger_test!(a_finish_that_finds_the_call_settled_answers_what_the_ledger_recorded);
