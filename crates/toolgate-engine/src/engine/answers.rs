//! A call's answer after the fact: the full answer sealed for replays (every field the agent
//! first got, the unredacted result included, for the configured retention), replays of a
//! repeated `tool_use_id`, refusals evaluated again (only an execution that started is
//! final), waiting for the outcome of a call a human approved, and the purge of answers past
//! their retention.

use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use toolgate_core::{
    AgentId, Decision, ErrorCode, RiskLevel, TenantId, ToolCallId, ToolCallStatus, ToolError,
};
use toolgate_ledger::{NewCall, RecordOutcome, SealedAnswer, ToolCallRecord};
use tracing::warn;

use super::Engine;
use super::record::outcome_from_record;
use crate::error::EngineError;
use crate::outcome::ExecuteOutcome;
use crate::trace;

/// How often a waiter re-reads a call when nothing announced a change (other replicas'
/// commits arrive through the store's feed, when it has one).
const AWAIT_POLL: Duration = Duration::from_millis(500);

/// How many times one request evaluates a refused call again when concurrent repeats keep
/// changing it under it, before it answers with the call as it stands.
const MAX_REEVALUATIONS: usize = 4;

/// Version tag of the sealed answer's JSON form.
const ANSWER_FORMAT: i64 = 1;

/// What `record` found when it wrote a new call.
pub(super) type Recorded = Option<Result<ExecuteOutcome, EngineError>>;

impl Engine {
    /// Writes a new call (`new_call`, whose row is `call`). `Some` carries the answer when the
    /// store recorded something other than what was asked: the budget was used up, or the
    /// tool_use_id was seen before. A repeat of a call refused before anything ran is
    /// evaluated again instead: this evaluation is recorded as the next evaluation of that
    /// call (same call id, `call` is updated to it) and the pipeline goes on with it.
    pub(super) async fn record(
        &self,
        new_call: NewCall,
        call: &mut ToolCallRecord,
    ) -> Result<Recorded, EngineError> {
        let mut attempt = new_call;
        // Every caller writes `call` as the new call's row, and `adopt` keeps the two alike.
        debug_assert_eq!(attempt.call, *call, "the new call's row is `call`");
        let mut observed_evaluation = None;
        for _ in 0..MAX_REEVALUATIONS {
            // What to evaluate again with, kept only when a repeat is possible at all: all but
            // the row, which `call` holds (one copy of it fewer on every call).
            let spare = call.tool_use_id.is_some().then(|| Spare::of(&attempt));
            let operation = attempt.call.status.as_str();
            let recorded = match observed_evaluation {
                None => {
                    trace::timed(
                        trace::ledger_span(operation),
                        self.store.record_call(attempt),
                    )
                    .await?
                }
                Some(observed) => {
                    trace::timed(
                        trace::ledger_span(operation),
                        self.store.retry_call(attempt, observed),
                    )
                    .await?
                }
            };
            self.announce_events();
            let existing = match recorded {
                RecordOutcome::Recorded => return Ok(None),
                RecordOutcome::BudgetExceeded(record) => {
                    return Ok(Some(Ok(outcome_from_record(&record, false))));
                }
                RecordOutcome::Duplicate(existing) => existing,
            };
            if let Err(conflict) = same_call(call, &existing) {
                return Ok(Some(Err(conflict)));
            }
            let Some(mut again) = spare
                .filter(|_| refused_before_execution(&existing))
                .map(|spare| spare.with_row(call))
            else {
                // A replay: boxed, so its state does not enlarge every call's future.
                return Ok(Some(Box::pin(self.answer_of(existing, true)).await));
            };
            adopt(&mut again, call, &existing);
            observed_evaluation = Some(existing.evaluation);
            attempt = again;
        }
        let current = self.get_tool_call(&call.tenant, &call.id).await?;
        Ok(Some(Box::pin(self.answer_of(current, true)).await))
    }

    /// The answer for a recorded call: the sealed full answer while it is kept, otherwise the
    /// ledger's record (redacted, and said to be), with the pending invocation of a call that
    /// waits for (or was resolved by) a human decision.
    pub(super) async fn answer_of(
        &self,
        record: ToolCallRecord,
        replayed: bool,
    ) -> Result<ExecuteOutcome, EngineError> {
        if let Some(outcome) = self.sealed_answer(&record).await? {
            return Ok(ExecuteOutcome {
                replayed,
                ..outcome
            });
        }
        let mut outcome = outcome_from_record(&record, replayed);
        // What the agent got back for a call that reached its connector is only kept
        // redacted once its sealed copy is gone.
        outcome.redacted = record.duration_ms.is_some()
            && (record.output_redacted.is_some() || record.error_text.is_some());
        let human_decision = matches!(
            record.error_code,
            Some(ErrorCode::ExpertRejected | ErrorCode::ClientRejected | ErrorCode::Skipped)
        );
        let waiting = record.status == ToolCallStatus::WaitingApproval;
        if (waiting || human_decision)
            && let Some(pending) = self
                .store
                .pending_for_call(&record.tenant, &record.id)
                .await?
        {
            outcome.decision = Some(pending.decision);
            if waiting {
                outcome.pending_invocation_id = Some(pending.id);
            }
        }
        Ok(outcome)
    }

    /// Waits until a call of `tenant` (and of `agent`, for a token bound to one) is settled,
    /// at most `wait` (bounded by the gateway's maximum timeout), and answers with its
    /// outcome: the full answer while it is kept. A call still waiting or running when the
    /// wait ends is answered as it stands (the caller asks again).
    pub async fn await_tool_call(
        &self,
        tenant: &TenantId,
        agent: Option<&AgentId>,
        id: &ToolCallId,
        wait: Duration,
    ) -> Result<ExecuteOutcome, EngineError> {
        let deadline = Instant::now() + wait.min(self.config.max_timeout);
        let mut announcements = self.subscribe_events();
        loop {
            // Marked seen before reading, so a change committed after the read wakes us.
            announcements.borrow_and_update();
            let record = self.get_tool_call(tenant, id).await?;
            if agent.is_some_and(|agent| *agent != record.agent) {
                return Err(EngineError::NotFound(format!("tool call `{id}`")));
            }
            let settled = !matches!(
                record.status,
                ToolCallStatus::Running
                    | ToolCallStatus::WaitingApproval
                    | ToolCallStatus::Approved
            );
            let now = Instant::now();
            if settled || now >= deadline {
                return self.answer_of(record, false).await;
            }
            let pause = AWAIT_POLL.min(deadline - now);
            // A closed feed only means no more announcements: keep polling until the deadline.
            let _ = tokio::time::timeout(pause, announcements.changed()).await;
        }
    }

    /// Removes the sealed answers whose retention has ended; returns how many. The ledger's
    /// redacted copy of each call stays. Run it periodically.
    pub async fn purge_expired_answers(&self) -> Result<u64, EngineError> {
        const PAGE: u32 = 1_000;
        let mut purged = 0;
        loop {
            let removed = self.store.purge_answers(self.clock.now(), PAGE).await?;
            purged += removed;
            if removed < u64::from(PAGE) {
                return Ok(purged);
            }
        }
    }

    /// Seals the answer the agent is about to get, for replays, when a sealer is configured.
    pub(super) fn seal_answer(
        &self,
        call: &ToolCallRecord,
        outcome: &ExecuteOutcome,
    ) -> Option<SealedAnswer> {
        let sealer = self.sealer.as_ref()?;
        let retention_ms =
            i64::try_from(self.config.answer_retention.as_millis()).unwrap_or(i64::MAX);
        if retention_ms == 0 {
            return None;
        }
        let plaintext = zeroize::Zeroizing::new(encode_answer(outcome));
        Some(SealedAnswer {
            sealed: sealer.seal(&answer_context(call), plaintext.as_bytes()),
            expires_at: self.clock.now().plus_ms(retention_ms),
        })
    }

    /// The sealed full answer of a call, while it is kept and opens.
    async fn sealed_answer(
        &self,
        record: &ToolCallRecord,
    ) -> Result<Option<ExecuteOutcome>, EngineError> {
        let Some(sealer) = &self.sealer else {
            return Ok(None);
        };
        let Some(stored) = self
            .store
            .get_call_answer(&record.tenant, &record.id)
            .await?
        else {
            return Ok(None);
        };
        if stored.expires_at <= self.clock.now() {
            return Ok(None);
        }
        let plaintext = match sealer.open(&answer_context(record), &stored.sealed) {
            Ok(plaintext) => plaintext,
            Err(error) => {
                // A retired key, or a damaged row: the redacted copy is all there is.
                warn!(tool_call_id = %record.id, %error, "sealed answer does not open");
                return Ok(None);
            }
        };
        let decoded = serde_json::from_slice::<Value>(&plaintext)
            .ok()
            .and_then(|value| decode_answer(record, &value));
        if decoded.is_none() {
            warn!(tool_call_id = %record.id, "sealed answer is not in a known format");
        }
        Ok(decoded)
    }
}

/// The associated data of a call's sealed answer: its tenant and its id.
fn answer_context(call: &ToolCallRecord) -> [&str; 3] {
    ["tool_call_answer", call.tenant.as_str(), call.id.as_str()]
}

/// A repeat must be the same call: same tool, same arguments.
fn same_call(attempted: &ToolCallRecord, existing: &ToolCallRecord) -> Result<(), EngineError> {
    let use_id = attempted
        .tool_use_id
        .as_ref()
        .map(ToString::to_string)
        .unwrap_or_default();
    if existing.tool != attempted.tool {
        return Err(EngineError::Conflict(format!(
            "tool_use_id `{use_id}` was already used in this run for tool `{}`, not `{}`; use a new tool_use_id for a new call",
            existing.tool, attempted.tool
        )));
    }
    if existing.args_hash != attempted.args_hash {
        return Err(EngineError::Conflict(format!(
            "tool_use_id `{use_id}` was already used in this run with different arguments; use a new tool_use_id for a new call"
        )));
    }
    Ok(())
}

/// Whether a recorded call was refused before its connector ran, so that a repeat evaluates
/// it again: the pipeline's own refusals (kill switch, manifest, unknown tool, arguments,
/// policy, budget) and missing credentials. A human's rejection and every outcome of an
/// execution that started are final.
pub(super) fn refused_before_execution(call: &ToolCallRecord) -> bool {
    if !matches!(
        call.status,
        ToolCallStatus::Blocked | ToolCallStatus::Failed
    ) {
        return false;
    }
    match call.error_code {
        Some(
            ErrorCode::FeatureDisabled
            | ErrorCode::NotInManifest
            | ErrorCode::UnknownTool
            | ErrorCode::PolicyBlocked
            | ErrorCode::BudgetExceeded,
        ) => true,
        // Also a connector's word; the pipeline's refusal is the one recorded without ever
        // reaching the connector.
        Some(ErrorCode::InvalidArguments) => call.duration_ms.is_none(),
        // Found missing, or unreadable, before the connector was called.
        Some(ErrorCode::CredentialsNotFound | ErrorCode::CredentialsUnavailable) => {
            call.attempts == 0
        }
        _ => false,
    }
}

/// A new call but for its row, kept to evaluate the call again should the store find its
/// `tool_use_id` taken.
struct Spare {
    count_against_budget: bool,
    decision: Option<toolgate_ledger::PolicyDecisionRecord>,
    pending: Option<toolgate_ledger::PendingInvocation>,
    events: Vec<toolgate_ledger::NewAuditEvent>,
}

impl Spare {
    fn of(new_call: &NewCall) -> Spare {
        Spare {
            count_against_budget: new_call.count_against_budget,
            decision: new_call.decision.clone(),
            pending: new_call.pending.clone(),
            events: new_call.events.clone(),
        }
    }

    /// The new call again, with `row` as its row.
    fn with_row(self, row: &ToolCallRecord) -> NewCall {
        NewCall {
            call: row.clone(),
            count_against_budget: self.count_against_budget,
            decision: self.decision,
            pending: self.pending,
            events: self.events,
        }
    }
}

/// Points a fresh evaluation at the existing call it evaluates again.
fn adopt(again: &mut NewCall, call: &mut ToolCallRecord, existing: &ToolCallRecord) {
    let evaluation = existing.evaluation + 1;
    call.id = existing.id.clone();
    call.created_at = existing.created_at;
    call.evaluation = evaluation;
    again.call.id = existing.id.clone();
    again.call.created_at = existing.created_at;
    again.call.evaluation = evaluation;
    if let Some(decision) = &mut again.decision {
        decision.tool_call_id = existing.id.clone();
    }
    if let Some(pending) = &mut again.pending {
        pending.tool_call_id = existing.id.clone();
    }
    for event in &mut again.events {
        event.tool_call_id = Some(existing.id.clone());
        if event.kind == "tool_call.requested" {
            event.payload["evaluation"] = json!(evaluation);
        }
    }
}

/// A sealed answer's plaintext: a JSON object read back by `decode_answer`.
#[derive(Serialize)]
struct AnswerText<'a> {
    format: i64,
    status: &'a str,
    result: Option<&'a Value>,
    error_code: Option<&'a str>,
    error_message: Option<&'a str>,
    duration_ns: u64,
    attempts: u32,
    decision: Option<&'a str>,
    risk: Option<&'a str>,
}

/// The answer as the JSON text to seal, written straight from the outcome: the result is not
/// copied into a tree of values first (one copy of the plaintext fewer, and the larger the
/// result the more that saves).
fn encode_answer(outcome: &ExecuteOutcome) -> String {
    serde_json::to_string(&AnswerText {
        format: ANSWER_FORMAT,
        status: outcome.status.as_str(),
        result: outcome.result.as_ref(),
        error_code: outcome.error.as_ref().map(|e| e.code.as_str()),
        error_message: outcome.error.as_ref().map(|e| e.message.as_str()),
        duration_ns: u64::try_from(outcome.duration.as_nanos()).unwrap_or(u64::MAX),
        attempts: outcome.attempts,
        decision: outcome.decision.map(Decision::as_str),
        risk: outcome.risk.map(RiskLevel::as_str),
    })
    .expect("an answer serializes: its keys are strings")
}

fn decode_answer(record: &ToolCallRecord, value: &Value) -> Option<ExecuteOutcome> {
    if value.get("format")?.as_i64()? != ANSWER_FORMAT {
        return None;
    }
    let text = |key: &str| value.get(key).and_then(Value::as_str);
    let error = match (text("error_code"), text("error_message")) {
        (Some(code), Some(message)) => Some(ToolError::new(code.parse().ok()?, message)),
        _ => None,
    };
    Some(ExecuteOutcome {
        tool_call_id: Some(record.id.clone()),
        status: text("status")?.parse().ok()?,
        result: value
            .get("result")
            .filter(|result| !result.is_null())
            .cloned(),
        error,
        duration: Duration::from_nanos(value.get("duration_ns")?.as_u64()?),
        attempts: u32::try_from(value.get("attempts")?.as_u64()?).ok()?,
        decision: text("decision").and_then(|d| d.parse().ok()),
        risk: text("risk").and_then(|r| r.parse().ok()),
        pending_invocation_id: None,
        replayed: false,
        redacted: false,
    })
}

#[cfg(test)]
mod tests {
    use toolgate_core::{ErrorCode, ToolCallStatus, ToolError};

    use super::*;

    fn outcome(result: Option<Value>, error: Option<ToolError>) -> ExecuteOutcome {
        ExecuteOutcome {
            tool_call_id: None,
            status: if error.is_some() {
                ToolCallStatus::Failed
            } else {
                ToolCallStatus::Succeeded
            },
            result,
            error,
            duration: Duration::from_nanos(1_234_567),
            attempts: 2,
            decision: Some(Decision::Allow),
            risk: Some(RiskLevel::Low),
            pending_invocation_id: None,
            replayed: false,
            redacted: false,
        }
    }

    #[test]
    fn an_answer_is_sealed_as_the_json_object_its_reader_expects() {
        let result = json!({"ok": true, "text": "quote \" and \u{e9}", "n": [1, 2.5, null]});
        let text = encode_answer(&outcome(Some(result.clone()), None));
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            json!({
                "format": ANSWER_FORMAT, "status": "succeeded", "result": result,
                "error_code": null, "error_message": null, "duration_ns": 1_234_567,
                "attempts": 2, "decision": "allow", "risk": "low",
            })
        );

        let failed = outcome(None, Some(ToolError::new(ErrorCode::VendorError, "no")));
        let text = encode_answer(&failed);
        assert_eq!(
            serde_json::from_str::<Value>(&text).unwrap(),
            json!({
                "format": ANSWER_FORMAT, "status": "failed", "result": null,
                "error_code": "VENDOR_ERROR", "error_message": "no", "duration_ns": 1_234_567,
                "attempts": 2, "decision": "allow", "risk": "low",
            })
        );
    }
}
