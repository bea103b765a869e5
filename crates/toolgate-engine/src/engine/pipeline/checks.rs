//! Steps 2 to 6: the checks every call passes before anything is written for it. Each step
//! lets the call on or refuses it (`Stop::Refused`); a store failure stops the request.

use std::sync::Arc;

use serde_json::Value;
use toolgate_core::{Decision, ErrorCode, ToolCallStatus, ToolError, ToolName};
use toolgate_ledger::PendingOrigin;
use toolgate_policy::PolicyRequest;

use super::{Call, Decided, Denial, Refusal, Stop, Tool};
use crate::engine::Engine;
use crate::engine::caches::PolicyState;
use crate::trace;

impl Refusal {
    fn new(
        status: ToolCallStatus,
        code: ErrorCode,
        message: impl Into<String>,
        reason: &'static str,
    ) -> Refusal {
        Refusal {
            status,
            error: ToolError::new(code, message),
            reason,
            denial: None,
        }
    }
}

impl Engine {
    /// Step 2: the tenant's kill switch.
    pub(super) async fn kill_switch(&self, call: &Call) -> Result<(), Stop> {
        if self.tool_calling_enabled(&call.record.tenant).await? {
            return Ok(());
        }
        Err(Refusal::new(
            ToolCallStatus::Blocked,
            ErrorCode::FeatureDisabled,
            "tool execution is not enabled for this organization; an administrator can turn on the `tool_calling_enabled` flag",
            "feature_disabled",
        )
        .into())
    }

    /// Step 3: the run's manifest.
    pub(super) fn manifest(&self, call: &mut Call) -> Result<ToolName, Stop> {
        if let Some(name) = call.name.take_if(|name| call.run.manifest.contains(name)) {
            return Ok(name);
        }
        let available: Vec<&str> = call.run.manifest.iter().map(ToolName::as_str).collect();
        let allowed = if available.is_empty() {
            "none".to_owned()
        } else {
            available.join(", ")
        };
        Err(Refusal::new(
            ToolCallStatus::Blocked,
            ErrorCode::NotInManifest,
            format!(
                "tool `{}` is not allowed in this run; allowed tools: {allowed}",
                call.record.tool
            ),
            "not_in_manifest",
        )
        .into())
    }

    /// Step 4: the tool resolved to its connector.
    pub(super) fn resolve(&self, name: &ToolName) -> Result<Tool, Stop> {
        match self.catalog.registry().get(name.as_str()) {
            Ok((spec, connector)) => Ok(Tool {
                spec: Arc::clone(spec),
                connector: Arc::clone(connector),
            }),
            Err(unknown) => Err(Refusal::new(
                ToolCallStatus::Failed,
                ErrorCode::UnknownTool,
                unknown.to_string(),
                "unknown_tool",
            )
            .into()),
        }
    }

    /// Step 5: the arguments, decoded at step 1, against the tool's schema.
    pub(super) fn validate(
        &self,
        name: &ToolName,
        arguments: Result<Value, String>,
    ) -> Result<Value, Stop> {
        let checked =
            arguments.and_then(|value| self.catalog.validate(name, &value).map(|()| value));
        checked.map_err(|message| {
            Refusal::new(
                ToolCallStatus::Failed,
                ErrorCode::InvalidArguments,
                message,
                "invalid_arguments",
            )
            .into()
        })
    }

    /// Step 6: the tenant's policy decides. The decision is kept on the call (and the deciding
    /// policies on its span, `span`); a block leaves a POLICY_DENIED pending invocation that
    /// only a Reject resolves.
    pub(super) async fn policy(
        &self,
        call: &mut Call,
        name: &ToolName,
        tool: &Tool,
        arguments: &Value,
        span: &trace::Span,
    ) -> Result<Decided, Stop> {
        let policy = match self.tenant_policy(&call.record.tenant).await? {
            PolicyState::Ready(policy) => policy,
            PolicyState::Broken(reason) => {
                return Err(Refusal::new(
                    ToolCallStatus::Blocked,
                    ErrorCode::PolicyBlocked,
                    reason,
                    "policy_unavailable",
                )
                .into());
            }
        };
        let mut policy_span = trace::policy_span();
        let decision = policy.evaluate(&PolicyRequest {
            tenant: &call.record.tenant,
            agent: &call.run.agent,
            run: &call.run.id,
            tool: &tool.spec,
            arguments,
        });
        trace::record_decision(policy_span.as_mut(), span, &decision);
        drop(policy_span);
        let record = self.decision_record(&call.record, name, &decision);
        call.record.policy_decision_id = Some(record.id.clone());
        call.record.risk_level = Some(decision.risk);
        let decided = Decided { decision, record };
        if decided.decision.decision != Decision::Block {
            return Ok(decided);
        }
        let pending = self.pending_for(
            call,
            name,
            arguments,
            &decided.decision,
            PendingOrigin::PolicyDenied,
        );
        let mut refusal = Refusal::new(
            ToolCallStatus::Blocked,
            ErrorCode::PolicyBlocked,
            format!("policy blocked this call: {}", decided.decision.reason),
            "policy_blocked",
        );
        refusal.denial = Some(Box::new(Denial { decided, pending }));
        Err(refusal.into())
    }
}
