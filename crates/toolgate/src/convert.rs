//! Hand-written conversions between wire types and domain types, and the one place engine
//! errors become gRPC statuses.

use std::sync::LazyLock;

use tonic::Status;
use toolgate_core::{Redactor, ToolCallStatus, ToolSpec};
use toolgate_engine::{Catalog, EngineError, ExecuteOutcome, llm_tool_name};
use toolgate_ledger::{Agent, LedgerError, LedgerErrorKind, RunRecord, Tenant, ToolCallRecord};
use toolgate_proto::v1 as pb;

/// What a caller is told when the ledger is unreachable or busy: retrying later may work.
pub(crate) const LEDGER_UNAVAILABLE: &str =
    "the gateway's ledger is unavailable at the moment; retry later";
/// What a caller is told when the ledger refused a change through one of its constraints.
pub(crate) const LEDGER_CONSTRAINT: &str =
    "the ledger refused the change: it conflicts with what is recorded";
/// What a caller is told when the ledger failed in any other way. The detail is in the log.
pub(crate) const LEDGER_INTERNAL: &str =
    "the gateway's ledger failed; the gateway log has the detail";

/// Maps an engine error to a gRPC status.
pub(crate) fn status(err: EngineError) -> Status {
    match err {
        EngineError::InvalidRequest(m) => Status::invalid_argument(m),
        EngineError::NotFound(m) => Status::not_found(format!("{m} not found")),
        EngineError::Conflict(m) => Status::already_exists(m),
        EngineError::FailedPrecondition(m) => Status::failed_precondition(m),
        err @ EngineError::InvalidPolicy(_) => Status::invalid_argument(err.to_string()),
        EngineError::Unavailable(m) => Status::unavailable(m),
        EngineError::Ledger(e) => store_status(&e),
        other => Status::internal(other.to_string()),
    }
}

/// Maps a ledger error to a gRPC status.
pub(crate) fn ledger_status(err: LedgerError) -> Status {
    status(EngineError::from(err))
}

/// The status of a store failure, by its kind, with a message that names no SQL, table or
/// column (callers, unauthenticated ones included, learn nothing about the database). The
/// detail goes to the log, redacted.
pub(crate) fn store_status(err: &LedgerError) -> Status {
    static REDACTOR: LazyLock<Redactor> = LazyLock::new(Redactor::new);
    let detail = err.to_string();
    let detail = REDACTOR.redact_text(&detail);
    match err.kind() {
        LedgerErrorKind::AlreadyExists | LedgerErrorKind::NotFound => {
            // Our own messages (`tenant `acme` already exists`), never the database's.
            status(EngineError::from(copy(err)))
        }
        LedgerErrorKind::Transient => {
            tracing::warn!(error = %detail, "ledger unavailable");
            Status::unavailable(LEDGER_UNAVAILABLE)
        }
        LedgerErrorKind::Constraint => {
            tracing::warn!(error = %detail, "ledger constraint refused a change");
            Status::failed_precondition(LEDGER_CONSTRAINT)
        }
        _ => {
            tracing::error!(error = %detail, "ledger failed");
            Status::internal(LEDGER_INTERNAL)
        }
    }
}

/// The two ledger errors whose messages are ours, rebuilt (`LedgerError` is not `Clone`).
fn copy(err: &LedgerError) -> LedgerError {
    match err {
        LedgerError::AlreadyExists(what) => LedgerError::AlreadyExists(what.clone()),
        LedgerError::NotFound(what) => LedgerError::NotFound(what.clone()),
        _ => LedgerError::Database(String::new()),
    }
}

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

pub(crate) fn tool_definition(spec: &ToolSpec) -> pb::ToolDefinition {
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
) -> Result<T, Status> {
    parse(value.to_owned()).map_err(|e| Status::invalid_argument(format!("{field}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kind of store failure gets its status, and none of the database's words reach
    /// the caller.
    #[test]
    fn store_failures_map_by_kind_without_sql() {
        let sql = "no such table: api_tokens in SELECT id FROM api_tokens WHERE hash = ?";
        let cases: Vec<(LedgerError, tonic::Code, &str)> = vec![
            (
                LedgerError::Unavailable(format!("database is locked: {sql}")),
                tonic::Code::Unavailable,
                LEDGER_UNAVAILABLE,
            ),
            (
                LedgerError::Closed,
                tonic::Code::Unavailable,
                LEDGER_UNAVAILABLE,
            ),
            (
                LedgerError::Constraint(format!("CHECK constraint failed: {sql}")),
                tonic::Code::FailedPrecondition,
                LEDGER_CONSTRAINT,
            ),
            (
                LedgerError::Database(sql.to_owned()),
                tonic::Code::Internal,
                LEDGER_INTERNAL,
            ),
            (
                LedgerError::Corrupt(format!("column role: {sql}")),
                tonic::Code::Internal,
                LEDGER_INTERNAL,
            ),
            (
                LedgerError::AlreadyExists("tenant `acme`".into()),
                tonic::Code::AlreadyExists,
                "tenant `acme` already exists",
            ),
            (
                LedgerError::NotFound("run `r1`".into()),
                tonic::Code::NotFound,
                "run `r1` not found",
            ),
        ];
        for (error, code, message) in cases {
            let shown = format!("{error}");
            let through_engine = status(EngineError::from(error));
            assert_eq!(through_engine.code(), code, "{shown}");
            assert_eq!(through_engine.message(), message, "{shown}");
            for word in [
                "SELECT",
                "api_tokens",
                "table",
                "constraint failed",
                "locked",
            ] {
                assert!(
                    !through_engine.message().contains(word),
                    "{shown}: {}",
                    through_engine.message()
                );
            }
        }
    }
}
