//! Resuming suspended calls: a human decision claims the pending invocation atomically (of
//! concurrent decisions exactly one wins), then an approval executes the call once, without
//! asking policy again but against the current tool configuration.

use std::sync::Arc;

use serde_json::json;
use toolgate_core::{Decision, ErrorCode, RunId, ToolCallStatus, ToolError};
use toolgate_ledger::{
    NewAuditEvent, PendingArguments, PendingInvocation, PendingOrigin, PendingState,
    ResolvePending, ToolCallRecord,
};

use tracing::warn;

use super::Engine;
use super::pipeline::{Execution, Tool};
use crate::error::EngineError;
use crate::outcome::{ResumeDecision, ResumeOutcome, ResumeRequest};
use crate::trace;

/// What sealed pending arguments are bound to, with the tenant and the call id: a re-pended
/// row (a new id, the same call) carries the same sealed text.
const PENDING_CONTEXT: &str = "pending_arguments";

fn pending_context(call: &ToolCallRecord) -> [&str; 3] {
    [PENDING_CONTEXT, call.tenant.as_str(), call.id.as_str()]
}

impl Engine {
    /// Applies a human decision to a pending invocation of `request.run`.
    pub async fn resume(&self, request: ResumeRequest) -> Result<ResumeOutcome, EngineError> {
        let action = match request.decision {
            ResumeDecision::Approve => "approve",
            ResumeDecision::Reject => "reject",
            ResumeDecision::Continue => "continue",
        };
        let span = trace::decision_span(action, request.tenant.as_str());
        let outcome = trace::in_span(&span, Box::pin(self.decide(request, &span))).await;
        trace::record_resume(&span, &outcome);
        outcome
    }

    /// [`Engine::resume`] inside the decision's span.
    async fn decide(
        &self,
        request: ResumeRequest,
        span: &trace::Span,
    ) -> Result<ResumeOutcome, EngineError> {
        let run = RunId::new(request.run.clone())
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        let pending = match self
            .store
            .get_pending(&request.tenant, &request.invocation)
            .await?
        {
            Some(pending) if pending.run == run => pending,
            _ => {
                return Err(EngineError::NotFound(format!(
                    "pending invocation `{}`",
                    request.invocation
                )));
            }
        };
        trace::record_pending(span, &pending);
        trace::link_to_call(span, pending.trace_parent.as_deref());
        if pending.state != PendingState::Pending {
            return Ok(ResumeOutcome::ClaimLost);
        }
        let call = self
            .store
            .get_tool_call(&request.tenant, &pending.tool_call_id)
            .await?
            .ok_or_else(|| {
                EngineError::NotFound(format!("tool call `{}`", pending.tool_call_id))
            })?;
        let reason = self
            .redactor
            .redact_output_text(&request.reason)
            .into_owned();

        if pending.expires_at <= self.clock.now() {
            return self
                .reject(
                    &request,
                    &pending,
                    &call,
                    "expired: nobody decided in time",
                    true,
                )
                .await;
        }
        match (request.decision, pending.origin) {
            (ResumeDecision::Reject, _) => {
                self.reject(&request, &pending, &call, &reason, false).await
            }
            (ResumeDecision::Continue, _) => self.skip(&request, &pending, &call, &reason).await,
            (ResumeDecision::Approve, PendingOrigin::PolicyDenied) => {
                self.refuse_override(&request, &pending, &call).await
            }
            (
                ResumeDecision::Approve,
                PendingOrigin::ApprovalRequired | PendingOrigin::ExecutionFailed,
            ) => {
                // The kill switch stops every execution, approved ones included; the same
                // lookup as the pipeline's step 2 (cached, refreshed when another replica
                // changes configuration). Reject and Continue execute nothing, so they stay
                // available with the switch off.
                if !self.tool_calling_enabled(&request.tenant).await? {
                    return self.refuse_disabled(&request, &pending, &call).await;
                }
                self.approve(&request, pending, call, reason).await
            }
        }
    }

    /// Resolves every expired pending invocation as rejected (audited), so none waits forever
    /// or vanishes silently. Returns how many it resolved; run it periodically.
    pub async fn expire_pending(&self) -> Result<u64, EngineError> {
        const PAGE: u32 = 200;
        let mut expired = 0;
        loop {
            let rows = self
                .store
                .list_expired_pending(self.clock.now(), PAGE)
                .await?;
            if rows.is_empty() {
                return Ok(expired);
            }
            let mut progressed = false;
            for pending in rows {
                let Some(call) = self
                    .store
                    .get_tool_call(&pending.tenant, &pending.tool_call_id)
                    .await?
                else {
                    continue;
                };
                let request = ResumeRequest {
                    tenant: pending.tenant.clone(),
                    approver: "system: expiry".to_owned(),
                    run: pending.run.to_string(),
                    invocation: pending.id.clone(),
                    decision: ResumeDecision::Reject,
                    reason: String::new(),
                };
                let outcome = self
                    .reject(
                        &request,
                        &pending,
                        &call,
                        "expired: nobody decided in time",
                        true,
                    )
                    .await?;
                if matches!(outcome, ResumeOutcome::Rejected { .. }) {
                    expired += 1;
                    progressed = true;
                }
            }
            if !progressed {
                return Ok(expired);
            }
        }
    }

    async fn reject(
        &self,
        request: &ResumeRequest,
        pending: &PendingInvocation,
        call: &ToolCallRecord,
        reason: &str,
        expired: bool,
    ) -> Result<ResumeOutcome, EngineError> {
        let code = if pending.decision == Decision::RequireClientApproval {
            ErrorCode::ClientRejected
        } else {
            ErrorCode::ExpertRejected
        };
        let message = if expired {
            "the approval request expired before anyone decided, so the call was not executed"
                .to_owned()
        } else {
            format!("the call was rejected by an approver: {reason}")
        };
        let event = self.decision_event(
            call,
            "tool_call.rejected",
            pending,
            &request.approver,
            reason,
        );
        let claimed = self
            .store
            .resolve_pending(ResolvePending {
                tenant: request.tenant.clone(),
                id: pending.id.clone(),
                observed_version: pending.version,
                state: PendingState::Rejected,
                decided_by: request.approver.clone(),
                reason: reason.to_owned(),
                at: self.clock.now(),
                call_status: ToolCallStatus::Blocked,
                error_code: Some(code),
                error_text: Some(message),
                events: vec![event],
            })
            .await?;
        if !claimed {
            return Ok(ResumeOutcome::ClaimLost);
        }
        self.announce_events();
        Ok(ResumeOutcome::Rejected {
            tool_call_id: call.id.clone(),
            expired,
        })
    }

    /// The non-executing resolution: claims the row like any decision (so it races fairly with
    /// approvals and rejections) and ends the call `blocked` with `SKIPPED`, letting the run
    /// move on without the tool having run.
    async fn skip(
        &self,
        request: &ResumeRequest,
        pending: &PendingInvocation,
        call: &ToolCallRecord,
        reason: &str,
    ) -> Result<ResumeOutcome, EngineError> {
        let event = self.decision_event(
            call,
            "tool_call.continued",
            pending,
            &request.approver,
            reason,
        );
        let message = if reason.is_empty() {
            "the call was not executed: a decision let the run continue without it".to_owned()
        } else {
            format!(
                "the call was not executed: a decision let the run continue without it: {reason}"
            )
        };
        let claimed = self
            .store
            .resolve_pending(ResolvePending {
                tenant: request.tenant.clone(),
                id: pending.id.clone(),
                observed_version: pending.version,
                state: PendingState::Continued,
                decided_by: request.approver.clone(),
                reason: reason.to_owned(),
                at: self.clock.now(),
                call_status: ToolCallStatus::Blocked,
                error_code: Some(ErrorCode::Skipped),
                error_text: Some(message),
                events: vec![event],
            })
            .await?;
        if !claimed {
            return Ok(ResumeOutcome::ClaimLost);
        }
        self.announce_events();
        Ok(ResumeOutcome::Continued {
            tool_call_id: call.id.clone(),
        })
    }

    /// Approve on a POLICY_DENIED row is refused; the row stays. The refusal is only given
    /// (and audited) if the row is still the one observed: a concurrent Reject means ClaimLost.
    async fn refuse_override(
        &self,
        request: &ResumeRequest,
        pending: &PendingInvocation,
        call: &ToolCallRecord,
    ) -> Result<ResumeOutcome, EngineError> {
        let current = self.store.get_pending(&request.tenant, &pending.id).await?;
        let still_current = current.as_ref().is_some_and(|row| {
            row.state == PendingState::Pending && row.version == pending.version
        });
        if !still_current {
            return Ok(ResumeOutcome::ClaimLost);
        }
        let event = self.decision_event(
            call,
            "tool_call.override_rejected",
            pending,
            &request.approver,
            "policy denial is terminal",
        );
        self.store.append_events(vec![event]).await?;
        self.announce_events();
        Ok(ResumeOutcome::PolicyDenialTerminal)
    }

    /// Approve while `tool_calling_enabled` is off: nothing runs and the invocation stays
    /// pending exactly as it was (unclaimed, same version), so it can be approved once the
    /// switch is on again. The refusal is audited.
    async fn refuse_disabled(
        &self,
        request: &ResumeRequest,
        pending: &PendingInvocation,
        call: &ToolCallRecord,
    ) -> Result<ResumeOutcome, EngineError> {
        let error = ToolError::new(
            ErrorCode::FeatureDisabled,
            "tool execution is not enabled for this organization, so the approved call was not executed; it is still pending and can be approved once an administrator turns on the `tool_calling_enabled` flag",
        );
        let event = self.event(
            call,
            "tool_call.approval_refused",
            json!({
                "pending_invocation_id": pending.id,
                "origin": pending.origin.as_str(),
                "decided_by": request.approver,
                "error_code": error.code.as_str(),
            }),
        );
        self.store.append_events(vec![event]).await?;
        self.announce_events();
        Ok(ResumeOutcome::FeatureDisabled {
            tool_call_id: call.id.clone(),
            error,
        })
    }

    async fn approve(
        &self,
        request: &ResumeRequest,
        pending: PendingInvocation,
        call: ToolCallRecord,
        reason: String,
    ) -> Result<ResumeOutcome, EngineError> {
        // Policy is not asked again (the human decision supersedes it), but the tool and the
        // arguments must still be valid in the current configuration.
        let resolved = self.catalog.registry().get(pending.tool.as_str());
        let (spec, connector) = match resolved {
            Ok((spec, connector)) => (Arc::clone(spec), Arc::clone(connector)),
            Err(unknown) => {
                let message = format!("cannot execute the approved call: {unknown}");
                return self.reject(request, &pending, &call, &message, false).await;
            }
        };
        let arguments = match self.open_pending_arguments(&pending) {
            Ok(arguments) => arguments,
            Err(message) => {
                let message = format!("cannot execute the approved call: {message}");
                return self.reject(request, &pending, &call, &message, false).await;
            }
        };
        if let Err(message) = self.catalog.validate(&pending.tool, &arguments) {
            let message = format!("cannot execute the approved call: {message}");
            return self.reject(request, &pending, &call, &message, false).await;
        }
        let event = self.decision_event(
            &call,
            "tool_call.approved",
            &pending,
            &request.approver,
            &reason,
        );
        let claimed = self
            .store
            .resolve_pending(ResolvePending {
                tenant: request.tenant.clone(),
                id: pending.id.clone(),
                observed_version: pending.version,
                state: PendingState::Approved,
                decided_by: request.approver.clone(),
                reason,
                at: self.clock.now(),
                call_status: ToolCallStatus::Running,
                error_code: None,
                error_text: None,
                events: vec![event],
            })
            .await?;
        if !claimed {
            return Ok(ResumeOutcome::ClaimLost);
        }
        self.announce_events();
        // The timeout the agent asked for when it made the call, else the tool's default;
        // bounded by the gateway's maximum as it is now.
        let timeout = pending
            .timeout
            .unwrap_or(spec.default_timeout)
            .min(self.config.max_timeout);
        let verdict = (pending.decision, call.risk_level.unwrap_or(spec.risk));
        let idempotent = spec.idempotent;
        let execution = Execution {
            call: &call,
            tool: Tool { spec, connector },
            arguments,
            timeout,
            verdict,
        };
        let outcome = self.run_connector(execution).await?;
        if may_run_again(outcome.status, idempotent) {
            self.repend_after_failure(&pending, &call, &outcome.error)
                .await?;
        }
        Ok(ResumeOutcome::Executed(outcome))
    }

    /// Seals a suspended call's arguments for the pending row; in clear only when the engine
    /// has no sealer (library use: the gateway always configures one).
    pub(super) fn seal_pending_arguments(
        &self,
        call: &ToolCallRecord,
        arguments: &serde_json::Value,
    ) -> PendingArguments {
        let Some(sealer) = &self.sealer else {
            return PendingArguments::Clear(arguments.clone());
        };
        let plaintext = zeroize::Zeroizing::new(arguments.to_string());
        let sealed = sealer.seal(&pending_context(call), plaintext.as_bytes());
        PendingArguments::Sealed {
            key_id: sealer.key_id_of(&sealed).unwrap_or_default(),
            sealed,
        }
    }

    /// Re-seals the arguments of every pending invocation not sealed under `active` (the
    /// ring's active key), so the old key can be retired without losing a call an approval
    /// would run, and seals those still in clear (rows written before arguments were
    /// sealed). Returns how many were sealed and how many were skipped (decided meanwhile,
    /// or not opening: those are logged and keep their old key).
    pub async fn rewrap_pending_arguments(&self, active: &str) -> Result<(u64, u64), EngineError> {
        let Some(sealer) = &self.sealer else {
            return Ok((0, 0));
        };
        let (mut rewrapped, mut skipped) = (0, 0);
        let mut seen = std::collections::HashSet::new();
        loop {
            let batch = self
                .store
                .list_pending_sealed_not_under(active, 200)
                .await?;
            let fresh: Vec<PendingInvocation> = batch
                .into_iter()
                .filter(|pending| seen.insert((pending.tenant.clone(), pending.id.clone())))
                .collect();
            if fresh.is_empty() {
                return Ok((rewrapped, skipped));
            }
            for pending in fresh {
                let context = [
                    PENDING_CONTEXT,
                    pending.tenant.as_str(),
                    pending.tool_call_id.as_str(),
                ];
                let (expected, plaintext) = match &pending.arguments {
                    PendingArguments::Sealed { sealed, .. } => {
                        match sealer.open(&context, sealed) {
                            Ok(plaintext) => (Some(sealed.as_str()), plaintext),
                            Err(error) => {
                                warn!(pending_invocation_id = %pending.id, %error, "pending arguments do not open; they keep their key");
                                skipped += 1;
                                continue;
                            }
                        }
                    }
                    PendingArguments::Clear(value) => (
                        None,
                        zeroize::Zeroizing::new(value.to_string().into_bytes()),
                    ),
                    PendingArguments::Dropped => continue,
                };
                let resealed = sealer.seal(&context, &plaintext);
                let key_id = sealer.key_id_of(&resealed).unwrap_or_default();
                let replaced = self
                    .store
                    .replace_pending_arguments(
                        &pending.tenant,
                        &pending.id,
                        expected,
                        &resealed,
                        &key_id,
                    )
                    .await?;
                if replaced {
                    rewrapped += 1;
                } else {
                    skipped += 1;
                }
            }
        }
    }

    /// The arguments an approval executes with, or why they cannot be had.
    fn open_pending_arguments(
        &self,
        pending: &PendingInvocation,
    ) -> Result<serde_json::Value, String> {
        match &pending.arguments {
            PendingArguments::Clear(value) => Ok(value.clone()),
            PendingArguments::Dropped => {
                Err("the gateway did not keep this call's arguments".to_owned())
            }
            PendingArguments::Sealed { sealed, .. } => {
                let Some(sealer) = &self.sealer else {
                    return Err(
                        "the arguments are sealed and this gateway has no master keys".to_owned(),
                    );
                };
                let context = [
                    PENDING_CONTEXT,
                    pending.tenant.as_str(),
                    pending.tool_call_id.as_str(),
                ];
                let plaintext = sealer
                    .open(&context, sealed)
                    .map_err(|error| format!("the sealed arguments do not open: {error}"))?;
                serde_json::from_slice(&plaintext)
                    .map_err(|error| format!("the sealed arguments are not JSON: {error}"))
            }
        }
    }

    /// An approved execution failed without acting: a fresh pending row (origin
    /// EXECUTION_FAILED, same arguments and timeout) gives an operator a further decision point.
    async fn repend_after_failure(
        &self,
        pending: &PendingInvocation,
        call: &ToolCallRecord,
        error: &Option<ToolError>,
    ) -> Result<(), EngineError> {
        let now = self.clock.now();
        let fresh = PendingInvocation {
            id: format!("pi_{}", uuid::Uuid::now_v7().simple()),
            origin: PendingOrigin::ExecutionFailed,
            state: PendingState::Pending,
            version: 1,
            created_at: now,
            expires_at: now.plus_ms(
                pending
                    .expires_at
                    .0
                    .saturating_sub(pending.created_at.0)
                    .max(1),
            ),
            ..pending.clone()
        };
        let event = NewAuditEvent {
            tenant: call.tenant.clone(),
            kind: "tool_call.approval_requested".into(),
            run: Some(call.run.clone()),
            tool_call_id: Some(call.id.clone()),
            payload: json!({
                "pending_invocation_id": fresh.id,
                "origin": PendingOrigin::ExecutionFailed.as_str(),
                "previous_error_code": error.as_ref().map(|e| e.code.as_str()),
            }),
            at: now,
        };
        self.store.add_pending(fresh, vec![event]).await?;
        self.announce_events();
        Ok(())
    }

    fn decision_event(
        &self,
        call: &ToolCallRecord,
        kind: &str,
        pending: &PendingInvocation,
        approver: &str,
        reason: &str,
    ) -> NewAuditEvent {
        self.event(
            call,
            kind,
            json!({
                "pending_invocation_id": pending.id,
                "origin": pending.origin.as_str(),
                "decided_by": approver,
                "reason": reason,
            }),
        )
    }
}

/// Whether an approved execution that ended with `status` may be offered for another approval:
/// only when the attempt is known not to have acted. `failed` is (the connector or the gateway
/// refused or failed before the vendor acted, by the connector's own account); `timed_out` is
/// only for an idempotent tool, which is safe to run again whatever the vendor did. An
/// `outcome_unknown` call (the vendor may have acted: a timeout of a write, a connection lost
/// after a post was sent) stays as it is, so a second approval cannot repeat the write; someone
/// must check with the vendor first.
fn may_run_again(status: ToolCallStatus, idempotent: bool) -> bool {
    match status {
        ToolCallStatus::Failed => true,
        ToolCallStatus::TimedOut => idempotent,
        _ => false,
    }
}
