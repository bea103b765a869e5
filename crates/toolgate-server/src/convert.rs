//! Hand-written conversions between wire types and domain types (wire types never leak past
//! this module and the services).

use toolgate_core::{ToolCallStatus, ToolSpec};
use toolgate_engine::{Catalog, ExecuteOutcome, llm_tool_name};
use toolgate_ledger::{Agent, RunRecord, Tenant, ToolCallRecord};
use toolgate_proto::v1 as pb;

use crate::status::ServiceError;

pub(crate) fn call_status(status: ToolCallStatus) -> pb::ToolCallStatus {
    match status {
        ToolCallStatus::Running => pb::ToolCallStatus::Running,
        ToolCallStatus::Succeeded => pb::ToolCallStatus::Succeeded,
        ToolCallStatus::Failed => pb::ToolCallStatus::Failed,
        ToolCallStatus::Blocked => pb::ToolCallStatus::Blocked,
        ToolCallStatus::WaitingApproval => pb::ToolCallStatus::WaitingApproval,
        ToolCallStatus::Approved => pb::ToolCallStatus::Approved,
        ToolCallStatus::TimedOut => pb::ToolCallStatus::TimedOut,
        ToolCallStatus::OutcomeUnknown => pb::ToolCallStatus::OutcomeUnknown,
    }
}

pub(crate) fn tenant(tenant: &Tenant) -> pb::Tenant {
    pb::Tenant {
        tenant_id: tenant.id.to_string(),
        name: tenant.name.clone(),
        created_at_ms: tenant.created_at.0,
    }
}

pub(crate) fn agent(agent: &Agent) -> pb::Agent {
    pb::Agent {
        tenant_id: agent.tenant.to_string(),
        agent_id: agent.id.to_string(),
        name: agent.name.clone(),
        created_at_ms: agent.created_at.0,
    }
}

pub(crate) fn run(record: &RunRecord) -> pb::Run {
    pb::Run {
        run_id: record.id.to_string(),
        tenant_id: record.tenant.to_string(),
        agent_id: record.agent.to_string(),
        manifest: record.manifest.iter().map(ToString::to_string).collect(),
        status: record.status.as_str().to_owned(),
        calls_used: record.calls_used,
        max_calls: record.max_calls,
        pending_approvals: record.pending_approvals,
        created_at_ms: record.created_at.0,
    }
}

/// A tool as `ListTools` and `toolgate tools --json` show it.
pub fn tool_definition(spec: &ToolSpec) -> pb::ToolDefinition {
    let (anthropic, openai) = Catalog::llm_definitions(spec);
    pb::ToolDefinition {
        name: spec.name.to_string(),
        llm_name: llm_tool_name(&spec.name),
        description: spec.description.clone(),
        input_schema_json: spec.input_schema.to_string(),
        output_schema_json: spec
            .output_schema
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        tags: spec.tags.iter().map(ToString::to_string).collect(),
        risk_level: spec.risk.as_str().to_owned(),
        idempotent: spec.idempotent,
        default_timeout_ms: u64::try_from(spec.default_timeout.as_millis()).unwrap_or(u64::MAX),
        anthropic_json: anthropic.to_string(),
        openai_json: openai.to_string(),
    }
}

pub(crate) fn outcome(outcome: ExecuteOutcome) -> pb::ToolCallResult {
    let (error_code, error_message) = match &outcome.error {
        Some(e) => (e.code.as_str().to_owned(), e.message.clone()),
        None if outcome.status == ToolCallStatus::WaitingApproval => (
            String::new(),
            "the call awaits a human decision; it runs once approved".to_owned(),
        ),
        None => (String::new(), String::new()),
    };
    pb::ToolCallResult {
        tool_call_id: outcome
            .tool_call_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        status: call_status(outcome.status).into(),
        result_json: outcome.result.map(|r| r.to_string()).unwrap_or_default(),
        error_code,
        error_message,
        duration_ms: u64::try_from(outcome.duration.as_millis()).unwrap_or(u64::MAX),
        attempts: outcome.attempts,
        decision: outcome
            .decision
            .map(|d| d.as_str().to_owned())
            .unwrap_or_default(),
        risk_level: outcome
            .risk
            .map(|r| r.as_str().to_owned())
            .unwrap_or_default(),
        pending_invocation_id: outcome.pending_invocation_id.unwrap_or_default(),
        replayed: outcome.replayed,
        redacted: outcome.redacted,
        // Set by the agent service when it minted a client approval link.
        client_approval_url: String::new(),
    }
}

pub(crate) fn tool_call(record: &ToolCallRecord) -> pb::ToolCall {
    pb::ToolCall {
        tool_call_id: record.id.to_string(),
        run_id: record.run.to_string(),
        agent_id: record.agent.to_string(),
        tool_name: record.tool.clone(),
        tool_use_id: record
            .tool_use_id
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        correlation_id: record.correlation_id.to_string(),
        status: call_status(record.status).into(),
        input_redacted_json: record.input_redacted.to_string(),
        output_redacted_json: record
            .output_redacted
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default(),
        error_code: record
            .error_code
            .map(|c| c.as_str().to_owned())
            .unwrap_or_default(),
        error_message: record.error_text.clone().unwrap_or_default(),
        risk_level: record
            .risk_level
            .map(|r| r.as_str().to_owned())
            .unwrap_or_default(),
        policy_decision_id: record.policy_decision_id.clone().unwrap_or_default(),
        duration_ms: u64::try_from(record.duration_ms.unwrap_or(0)).unwrap_or(0),
        attempts: u32::try_from(record.attempts).unwrap_or(u32::MAX),
        created_at_ms: record.created_at.0,
        updated_at_ms: record.updated_at.0,
    }
}

/// Parses a required id field, naming the field in the error.
pub(crate) fn parse_id<T, E: std::fmt::Display>(
    field: &str,
    value: &str,
    parse: impl FnOnce(String) -> Result<T, E>,
) -> Result<T, ServiceError> {
    parse(value.to_owned()).map_err(|e| ServiceError::invalid(field, e))
}
