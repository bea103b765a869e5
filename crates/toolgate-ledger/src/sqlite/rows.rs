//! The SQLite boundary: column lists, row-to-record conversion and sqlx error classification.
//! Everything that knows how a record is spelled in SQL lives here.

use std::fmt::Display;
use std::str::FromStr;

use serde_json::Value;
use sqlx::sqlite::SqliteRow;
use sqlx::{Row, Sqlite};
use toolgate_core::{Timestamp, ToolName};

use crate::error::LedgerError;
use crate::model::{
    Agent, AuditEvent, Permission, PolicySetRecord, Role, RunRecord, RunStatus, Tenant,
    TokenRecord, ToolCallRecord,
};

/// The columns [`call_from_row`] reads, for `concat!` into queries.
macro_rules! call_columns {
    () => {
        "id, tenant, run, agent, tool, action, tool_use_id, correlation_id, status, args_hash, \
         input_redacted, output_redacted, error_code, error_text, policy_decision_id, \
         risk_level, duration_ms, attempts, created_at, updated_at"
    };
}
pub(super) use call_columns;

/// The columns [`event_from_row`] reads.
macro_rules! event_columns {
    () => {
        "seq, tenant, chain_seq, kind, run, tool_call_id, payload, at, prev_hash, hash"
    };
}
pub(super) use event_columns;

/// How a failed statement affects the batch it ran in.
#[derive(Debug)]
pub(super) enum SqlFailure {
    /// A UNIQUE or PRIMARY KEY constraint refused the row.
    Unique,
    /// A FOREIGN KEY constraint refused the row.
    ForeignKey,
    /// Another constraint (NOT NULL, CHECK) refused the row.
    Constraint(String),
    /// Anything else (I/O, a full disk, a lost worker, a trigger): the state of the enclosing
    /// transaction is unknown.
    Fatal(String),
}

impl SqlFailure {
    /// Constraint failures undo only the failing statement; SQLite keeps the transaction.
    pub(super) fn classify(error: &sqlx::Error) -> SqlFailure {
        let sqlx::Error::Database(db) = error else {
            return SqlFailure::Fatal(error.to_string());
        };
        match db.kind() {
            sqlx::error::ErrorKind::UniqueViolation => SqlFailure::Unique,
            sqlx::error::ErrorKind::ForeignKeyViolation => SqlFailure::ForeignKey,
            sqlx::error::ErrorKind::NotNullViolation | sqlx::error::ErrorKind::CheckViolation => {
                SqlFailure::Constraint(db.message().to_owned())
            }
            _ => SqlFailure::Fatal(db.message().to_owned()),
        }
    }
}

/// How one write operation failed, as the writer sees it.
#[derive(Debug)]
pub(super) enum Fail {
    /// The operation's answer is this error; the transaction is intact.
    Op(LedgerError),
    /// The transaction can no longer be trusted: the whole batch fails.
    Fatal(LedgerError),
}

/// Turns a failed write statement into the operation's failure. `exists` and `missing` say
/// what a unique or foreign key violation means for this statement.
pub(super) fn write_failure(
    error: &sqlx::Error,
    exists: impl FnOnce() -> String,
    missing: impl FnOnce() -> LedgerError,
) -> Fail {
    match SqlFailure::classify(error) {
        SqlFailure::Unique => Fail::Op(LedgerError::AlreadyExists(exists())),
        SqlFailure::ForeignKey => Fail::Op(missing()),
        SqlFailure::Constraint(message) => Fail::Op(LedgerError::Database(message)),
        SqlFailure::Fatal(message) => Fail::Fatal(LedgerError::Database(message)),
    }
}

/// A failed read inside the writer: undecodable rows are the operation's problem, anything
/// else is fatal for the batch.
pub(super) fn read_failure(error: sqlx::Error) -> Fail {
    match error {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            Fail::Op(LedgerError::Corrupt(error.to_string()))
        }
        other => Fail::Fatal(LedgerError::Database(other.to_string())),
    }
}

/// A read failed. Undecodable values mean the file holds something this version cannot read.
pub(super) fn read_error(error: sqlx::Error) -> LedgerError {
    match error {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            LedgerError::Corrupt(error.to_string())
        }
        other => LedgerError::Database(other.to_string()),
    }
}

fn get<'r, T>(row: &'r SqliteRow, column: &str) -> Result<T, LedgerError>
where
    T: sqlx::Decode<'r, Sqlite> + sqlx::Type<Sqlite>,
{
    row.try_get(column)
        .map_err(|error| LedgerError::Corrupt(format!("column {column}: {error}")))
}

fn parse<T>(row: &SqliteRow, column: &str) -> Result<T, LedgerError>
where
    T: FromStr,
    T::Err: Display,
{
    let text: String = get(row, column)?;
    text.parse()
        .map_err(|error| LedgerError::Corrupt(format!("column {column}: {error}")))
}

fn parse_optional<T>(row: &SqliteRow, column: &str) -> Result<Option<T>, LedgerError>
where
    T: FromStr,
    T::Err: Display,
{
    let text: Option<String> = get(row, column)?;
    text.map(|text| {
        text.parse()
            .map_err(|error| LedgerError::Corrupt(format!("column {column}: {error}")))
    })
    .transpose()
}

fn timestamp(row: &SqliteRow, column: &str) -> Result<Timestamp, LedgerError> {
    Ok(Timestamp(get(row, column)?))
}

fn flag(row: &SqliteRow, column: &str) -> Result<bool, LedgerError> {
    let value: i64 = get(row, column)?;
    match value {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(LedgerError::Corrupt(format!(
            "column {column}: {other} is not a boolean"
        ))),
    }
}

fn json(row: &SqliteRow, column: &str) -> Result<Value, LedgerError> {
    let text: String = get(row, column)?;
    parse_json(&text, column)
}

fn json_optional(row: &SqliteRow, column: &str) -> Result<Option<Value>, LedgerError> {
    let text: Option<String> = get(row, column)?;
    text.map(|text| parse_json(&text, column)).transpose()
}

fn parse_json(text: &str, column: &str) -> Result<Value, LedgerError> {
    serde_json::from_str(text)
        .map_err(|error| LedgerError::Corrupt(format!("column {column}: invalid JSON: {error}")))
}

/// A JSON array of tool names, as runs and pending invocations keep their manifests.
pub(super) fn manifest_json(manifest: &[ToolName]) -> String {
    let names = manifest
        .iter()
        .map(|tool| Value::String(tool.as_str().to_owned()))
        .collect();
    Value::Array(names).to_string()
}

fn manifest(row: &SqliteRow, column: &str) -> Result<Vec<ToolName>, LedgerError> {
    let text: String = get(row, column)?;
    let names: Vec<String> = serde_json::from_str(&text).map_err(|error| {
        LedgerError::Corrupt(format!(
            "column {column}: not a JSON array of names: {error}"
        ))
    })?;
    names
        .into_iter()
        .map(|name| {
            ToolName::new(name)
                .map_err(|error| LedgerError::Corrupt(format!("column {column}: {error}")))
        })
        .collect()
}

pub(super) fn tenant_from_row(row: &SqliteRow) -> Result<Tenant, LedgerError> {
    Ok(Tenant {
        id: parse(row, "id")?,
        name: get(row, "name")?,
        created_at: timestamp(row, "created_at")?,
    })
}

pub(super) fn agent_from_row(row: &SqliteRow) -> Result<Agent, LedgerError> {
    Ok(Agent {
        tenant: parse(row, "tenant")?,
        id: parse(row, "id")?,
        name: get(row, "name")?,
        created_at: timestamp(row, "created_at")?,
    })
}

pub(super) fn token_from_row(row: &SqliteRow) -> Result<TokenRecord, LedgerError> {
    let role_name: String = get(row, "role")?;
    let role = Role::parse(&role_name)
        .ok_or_else(|| LedgerError::Corrupt(format!("column role: unknown role `{role_name}`")))?;
    Ok(TokenRecord {
        id: get(row, "id")?,
        hash: get(row, "hash")?,
        role,
        tenant: parse_optional(row, "tenant")?,
        agent: parse_optional(row, "agent")?,
        label: get(row, "label")?,
        created_at: timestamp(row, "created_at")?,
        revoked: flag(row, "revoked")?,
    })
}

pub(super) fn permission_from_row(row: &SqliteRow) -> Result<Permission, LedgerError> {
    Ok(Permission {
        tenant: parse(row, "tenant")?,
        agent: parse_optional(row, "agent")?,
        tool: parse(row, "tool")?,
        enabled: flag(row, "enabled")?,
        updated_at: timestamp(row, "updated_at")?,
    })
}

pub(super) fn policy_set_from_row(row: &SqliteRow) -> Result<PolicySetRecord, LedgerError> {
    Ok(PolicySetRecord {
        tenant: parse(row, "tenant")?,
        version: get(row, "version")?,
        text: get(row, "text")?,
        created_by: get(row, "created_by")?,
        created_at: timestamp(row, "created_at")?,
    })
}

pub(super) fn run_from_row(row: &SqliteRow) -> Result<RunRecord, LedgerError> {
    let status_name: String = get(row, "status")?;
    let status = RunStatus::parse(&status_name).ok_or_else(|| {
        LedgerError::Corrupt(format!("column status: unknown run status `{status_name}`"))
    })?;
    Ok(RunRecord {
        tenant: parse(row, "tenant")?,
        id: parse(row, "id")?,
        agent: parse(row, "agent")?,
        manifest: manifest(row, "manifest")?,
        status,
        calls_used: get(row, "calls_used")?,
        max_calls: get(row, "max_calls")?,
        pending_approvals: get(row, "pending_approvals")?,
        created_at: timestamp(row, "created_at")?,
    })
}

pub(super) fn call_from_row(row: &SqliteRow) -> Result<ToolCallRecord, LedgerError> {
    Ok(ToolCallRecord {
        id: parse(row, "id")?,
        tenant: parse(row, "tenant")?,
        run: parse(row, "run")?,
        agent: parse(row, "agent")?,
        tool: get(row, "tool")?,
        action: get(row, "action")?,
        tool_use_id: parse_optional(row, "tool_use_id")?,
        correlation_id: parse(row, "correlation_id")?,
        status: parse(row, "status")?,
        args_hash: get(row, "args_hash")?,
        input_redacted: json(row, "input_redacted")?,
        output_redacted: json_optional(row, "output_redacted")?,
        error_code: parse_optional(row, "error_code")?,
        error_text: get(row, "error_text")?,
        policy_decision_id: get(row, "policy_decision_id")?,
        risk_level: parse_optional(row, "risk_level")?,
        duration_ms: get(row, "duration_ms")?,
        attempts: get(row, "attempts")?,
        created_at: timestamp(row, "created_at")?,
        updated_at: timestamp(row, "updated_at")?,
    })
}

pub(super) fn event_from_row(row: &SqliteRow) -> Result<AuditEvent, LedgerError> {
    Ok(AuditEvent {
        seq: get(row, "seq")?,
        tenant: parse(row, "tenant")?,
        chain_seq: get(row, "chain_seq")?,
        kind: get(row, "kind")?,
        run: parse_optional(row, "run")?,
        tool_call_id: parse_optional(row, "tool_call_id")?,
        payload: json(row, "payload")?,
        at: timestamp(row, "at")?,
        prev_hash: get(row, "prev_hash")?,
        hash: get(row, "hash")?,
    })
}
