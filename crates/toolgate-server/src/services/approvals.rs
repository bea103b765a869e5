//! The approval service: approvers list, inspect and decide pending invocations of their own
//! tenant. Identity comes from the approver token and is recorded with every decision.

use tonic::{Request, Response, Status};
use toolgate_core::{RunId, TenantId, ToolName};
use toolgate_engine::{ResumeDecision, ResumeOutcome, ResumeRequest};
use toolgate_ledger::{PendingFilter, PendingInvocation, PendingOrigin};
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::approval_service_server::ApprovalService;

use super::{Shared, page_size};
use crate::auth::caller;
use crate::convert::{self, parse_id};
use crate::status::{ServiceError, status};

/// The approver-facing service.
#[derive(Debug, Clone)]
pub(crate) struct ApprovalApi(pub(crate) Shared);

#[tonic::async_trait]
impl ApprovalService for ApprovalApi {
    async fn list_pending(
        &self,
        request: Request<pb::ListPendingRequest>,
    ) -> Result<Response<pb::ListPendingResponse>, Status> {
        let caller = caller(&request)?;
        let tenant = caller.tenant()?.clone();
        let body = request.into_inner();
        let filter = PendingFilter {
            run: optional(&body.run_id, |v| parse_id("run_id", v, RunId::new))?,
            tool: optional(&body.tool_name, |v| parse_id("tool_name", v, ToolName::new))?,
            origin: optional(&body.origin, |v| {
                PendingOrigin::parse(v).ok_or_else(|| {
                    ServiceError::invalid(
                        "origin",
                        format!(
                            "`{v}` is not one of APPROVAL_REQUIRED, POLICY_DENIED, EXECUTION_FAILED"
                        ),
                    )
                })
            })?,
        };
        let limit = page_size(body.page_size);
        let rows = self
            .0
            .engine
            .store()
            .list_pending(&tenant, &filter, limit)
            .await
            .map_err(status)?;
        let mut invocations = Vec::with_capacity(rows.len());
        for row in &rows {
            invocations.push(self.pending(&tenant, row).await?);
        }
        Ok(Response::new(pb::ListPendingResponse { invocations }))
    }

    async fn get_pending(
        &self,
        request: Request<pb::GetPendingRequest>,
    ) -> Result<Response<pb::PendingInvocation>, Status> {
        let caller = caller(&request)?;
        let tenant = caller.tenant()?.clone();
        let id = request.into_inner().invocation_id;
        let row = self
            .0
            .engine
            .store()
            .get_pending(&tenant, &id)
            .await
            .map_err(status)?
            .ok_or_else(|| ServiceError::NotFound(format!("pending invocation `{id}`")))?;
        Ok(Response::new(self.pending(&tenant, &row).await?))
    }

    async fn resume(
        &self,
        request: Request<pb::ResumeRequest>,
    ) -> Result<Response<pb::ResumeResponse>, Status> {
        let caller = caller(&request)?;
        let tenant = caller.tenant()?.clone();
        let approver = if caller.label.is_empty() {
            caller.token_id.clone()
        } else {
            format!("{} ({})", caller.label, caller.token_id)
        };
        let body = request.into_inner();
        let invocation_id = body.invocation_id.clone();
        let decision = match pb::ResumeDecision::try_from(body.decision) {
            Ok(pb::ResumeDecision::Approve) => ResumeDecision::Approve,
            Ok(pb::ResumeDecision::Reject) => ResumeDecision::Reject,
            Ok(pb::ResumeDecision::Continue) => ResumeDecision::Continue,
            _ => {
                return Err(ServiceError::invalid(
                    "decision",
                    "must be APPROVE, REJECT or CONTINUE",
                )
                .into());
            }
        };
        let outcome = self
            .0
            .engine
            .resume(ResumeRequest {
                tenant,
                approver,
                run: body.run_id,
                invocation: body.invocation_id,
                decision,
                reason: body.reason,
            })
            .await
            .map_err(status)?;
        let response = match outcome {
            ResumeOutcome::Executed(outcome) => {
                let tool_call_id = outcome
                    .tool_call_id
                    .as_ref()
                    .map(ToString::to_string)
                    .unwrap_or_default();
                pb::ResumeResponse {
                    outcome: pb::ResumeOutcome::Executed.into(),
                    result: Some(convert::outcome(outcome)),
                    tool_call_id,
                    expired: false,
                }
            }
            ResumeOutcome::Rejected {
                tool_call_id,
                expired,
            } => pb::ResumeResponse {
                outcome: pb::ResumeOutcome::Rejected.into(),
                result: None,
                tool_call_id: tool_call_id.to_string(),
                expired,
            },
            ResumeOutcome::Continued { tool_call_id } => pb::ResumeResponse {
                outcome: pb::ResumeOutcome::Continued.into(),
                result: None,
                tool_call_id: tool_call_id.to_string(),
                expired: false,
            },
            ResumeOutcome::ClaimLost => pb::ResumeResponse {
                outcome: pb::ResumeOutcome::ClaimLost.into(),
                ..Default::default()
            },
            ResumeOutcome::PolicyDenialTerminal => pb::ResumeResponse {
                outcome: pb::ResumeOutcome::PolicyDenialTerminal.into(),
                ..Default::default()
            },
            // The call is still waiting: the answer says so with the stable code an approver
            // client (or an old client that ignores the new outcome) can act on.
            ResumeOutcome::FeatureDisabled {
                tool_call_id,
                error,
            } => pb::ResumeResponse {
                outcome: pb::ResumeOutcome::FeatureDisabled.into(),
                result: Some(pb::ToolCallResult {
                    tool_call_id: tool_call_id.to_string(),
                    status: pb::ToolCallStatus::WaitingApproval.into(),
                    error_code: error.code.as_str().to_owned(),
                    error_message: error.message,
                    pending_invocation_id: invocation_id,
                    ..Default::default()
                }),
                tool_call_id: tool_call_id.to_string(),
                expired: false,
            },
        };
        Ok(Response::new(response))
    }
}

impl ApprovalApi {
    /// The wire form of `row`, with where its call stands now (read from the ledger, so an
    /// approver sees e.g. that an approved execution ended `outcome_unknown`).
    async fn pending(
        &self,
        tenant: &TenantId,
        row: &PendingInvocation,
    ) -> Result<pb::PendingInvocation, ServiceError> {
        let call = self
            .0
            .engine
            .store()
            .get_tool_call(tenant, &row.tool_call_id)
            .await?;
        // What an approver sees of the arguments is what the ledger keeps of the call: its
        // redacted input (the row's own arguments are sealed, or not kept for a denial).
        let arguments_json = call
            .as_ref()
            .map(|call| call.input_redacted.to_string())
            .unwrap_or_default();
        Ok(pb::PendingInvocation {
            invocation_id: row.id.clone(),
            run_id: row.run.to_string(),
            tool_call_id: row.tool_call_id.to_string(),
            tool_name: row.tool.to_string(),
            arguments_json,
            args_hash: row.args_hash.clone(),
            origin: row.origin.as_str().to_owned(),
            decision: row.decision.as_str().to_owned(),
            state: row.state.as_str().to_owned(),
            version: row.version,
            policy_version: row.policy_version,
            expires_at_ms: row.expires_at.0,
            created_at_ms: row.created_at.0,
            tool_call_status: call
                .as_ref()
                .map(|call| call.status.as_str().to_owned())
                .unwrap_or_default(),
            timeout_ms: row.timeout.map_or(0, |timeout| {
                u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX)
            }),
        })
    }
}

fn optional<T>(
    value: &str,
    parse: impl FnOnce(&str) -> Result<T, ServiceError>,
) -> Result<Option<T>, ServiceError> {
    if value.is_empty() {
        Ok(None)
    } else {
        parse(value).map(Some)
    }
}
