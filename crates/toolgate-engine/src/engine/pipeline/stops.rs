//! Where a call is written before its connector runs: a refusal (steps 2 to 6) is recorded
//! with its audit trail and answered; step 7 suspends a call that needs a human; step 8
//! commits the `running` row, which may answer instead (a replay, an exhausted budget).

use std::time::Duration;

use serde_json::{Value, json};
use toolgate_core::{Decision, ToolCallStatus, ToolName};
use toolgate_ledger::{
    NewCall, PendingArguments, PendingInvocation, PendingOrigin, PendingState,
    PolicyDecisionRecord, ToolCallRecord,
};
use toolgate_policy::PolicyDecision;
use tracing::debug;

use super::{Admitted, Call, Decided, Denial, Refusal};
use crate::engine::Engine;
use crate::engine::answers::Recorded;
use crate::error::EngineError;
use crate::outcome::ExecuteOutcome;
use crate::trace;

impl Engine {
    /// Records a call that stops before execution, with its audit trail, and answers with it.
    /// A policy block also leaves its POLICY_DENIED pending invocation.
    pub(super) async fn refuse(
        &self,
        mut call: Call,
        refusal: Refusal,
    ) -> Result<ExecuteOutcome, EngineError> {
        let Refusal {
            status,
            error,
            reason,
            denial,
        } = refusal;
        let mut payload = json!({"reason": reason, "error_code": error.code.as_str()});
        if let Some(denial) = &denial {
            let decision = &denial.decided.decision;
            payload["decision"] = json!(decision.decision.as_str());
            payload["policy_ids"] = json!(decision.policy_ids);
            payload["policy_version"] = json!(decision.policy_version);
        }
        let kind = if status == ToolCallStatus::Blocked {
            "tool_call.blocked"
        } else {
            "tool_call.failed"
        };
        let terminal = self.event(&call.record, kind, payload);
        call.record.status = status;
        call.record.error_code = Some(error.code);
        call.record.error_text = Some(self.redactor.redact_text(&error.message).into_owned());
        let (decision, pending, verdict) = match denial.map(|denial| *denial) {
            Some(Denial { decided, pending }) => {
                let verdict = (decided.decision.decision, decided.decision.risk);
                (Some(decided.record), Some(pending), Some(verdict))
            }
            None => (None, None, None),
        };
        let pending_invocation_id = pending.as_ref().map(|pending| pending.id.clone());
        let new_call = NewCall {
            call: call.record.clone(),
            count_against_budget: false,
            decision,
            pending,
            events: vec![call.requested, terminal],
        };
        if let Some(answer) = self.record(new_call, &mut call.record).await? {
            return answer;
        }
        debug!(tool = %call.record.tool, code = %error.code, reason, "tool call refused");
        Ok(ExecuteOutcome {
            tool_call_id: Some(call.record.id),
            status,
            result: None,
            error: Some(error),
            duration: Duration::ZERO,
            attempts: 0,
            decision: verdict.map(|(decision, _)| decision),
            risk: verdict.map(|(_, risk)| risk),
            pending_invocation_id,
            replayed: false,
            redacted: false,
        })
    }

    /// Step 7: a call that needs a human is suspended: its pending invocation is written with
    /// it, and the agent is told to wait.
    pub(super) async fn approval(
        &self,
        mut call: Call,
        admitted: Admitted,
    ) -> Result<ExecuteOutcome, EngineError> {
        let Admitted {
            name,
            arguments,
            decided: Decided { decision, record },
            ..
        } = admitted;
        let pending = self.pending_for(
            &call,
            &name,
            &arguments,
            &decision,
            PendingOrigin::ApprovalRequired,
        );
        let approval = self.event(
            &call.record,
            "tool_call.approval_requested",
            json!({
                "pending_invocation_id": pending.id,
                "decision": decision.decision.as_str(),
                "risk": decision.risk.as_str(),
                "policy_ids": decision.policy_ids,
                "policy_version": decision.policy_version,
            }),
        );
        call.record.status = ToolCallStatus::WaitingApproval;
        let pending_id = pending.id.clone();
        let new_call = NewCall {
            call: call.record.clone(),
            count_against_budget: true,
            decision: Some(record),
            pending: Some(pending),
            events: vec![call.requested, approval],
        };
        if let Some(answer) = self.record(new_call, &mut call.record).await? {
            return answer;
        }
        let who = if decision.decision == Decision::RequireClientApproval {
            "the client"
        } else {
            "an expert"
        };
        debug!(tool = %name, approver = who, "tool call awaits approval");
        Ok(ExecuteOutcome {
            tool_call_id: Some(call.record.id),
            status: ToolCallStatus::WaitingApproval,
            result: None,
            error: None,
            duration: Duration::ZERO,
            attempts: 0,
            decision: Some(decision.decision),
            risk: Some(decision.risk),
            pending_invocation_id: Some(pending_id),
            replayed: false,
            redacted: false,
        })
    }

    /// Step 8: the `running` row, durable before the connector is called. The ledger checks
    /// the budget and the idempotency key as it writes, and may answer instead (a replay of a
    /// call that ran, the budget used up): then the answer comes with the row. A call
    /// evaluated again gets the id of the call it repeats.
    pub(super) async fn record_running(
        &self,
        mut call: Call,
        decision: PolicyDecisionRecord,
    ) -> Result<(ToolCallRecord, Recorded), EngineError> {
        call.record.status = ToolCallStatus::Running;
        let new_call = NewCall {
            call: call.record.clone(),
            count_against_budget: true,
            decision: Some(decision),
            pending: None,
            events: vec![call.requested],
        };
        let answer = self.record(new_call, &mut call.record).await?;
        Ok((call.record, answer))
    }

    /// A pending invocation bound to this exact call: tool, arguments (and their hash), the
    /// run's manifest, the policy version that decided and the timeout the agent asked for.
    pub(super) fn pending_for(
        &self,
        call: &Call,
        tool: &ToolName,
        arguments: &Value,
        decision: &PolicyDecision,
        origin: PendingOrigin,
    ) -> PendingInvocation {
        let now = self.clock.now();
        let expiry_ms = i64::try_from(self.config.pending_expiry.as_millis()).unwrap_or(i64::MAX);
        // Approval can never run a policy denial, so its arguments are not kept at all.
        let arguments = match origin {
            PendingOrigin::PolicyDenied => PendingArguments::Dropped,
            PendingOrigin::ApprovalRequired | PendingOrigin::ExecutionFailed => {
                self.seal_pending_arguments(&call.record, arguments)
            }
        };
        PendingInvocation {
            id: format!("pi_{}", uuid::Uuid::now_v7().simple()),
            tenant: call.record.tenant.clone(),
            run: call.run.id.clone(),
            tool_call_id: call.record.id.clone(),
            tool: tool.clone(),
            arguments,
            args_hash: call.record.args_hash.clone(),
            manifest: call.run.manifest.clone(),
            policy_version: decision.policy_version,
            origin,
            decision: decision.decision,
            state: PendingState::Pending,
            version: 1,
            expires_at: now.plus_ms(expiry_ms),
            created_at: now,
            timeout: call.timeout,
            // The call's span (this runs inside it), for the decision's span to link to.
            trace_parent: trace::current_traceparent(),
        }
    }
}
