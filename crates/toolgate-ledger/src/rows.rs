//! The SQL boundary shared by both backends: column lists, row-to-record conversion and sqlx
//! error classification. Everything that knows how a record is spelled in SQL lives here; the
//! backends differ only in how a row hands out a value ([`SqlRow`]).

use std::fmt::Display;
use std::str::FromStr;

use serde_json::Value;
use sqlx::Row;
use toolgate_core::{RunId, SecretName, TenantId, Timestamp, ToolCallId, ToolName};

use crate::error::LedgerError;
use crate::model::{
    Agent, AuditEvent, CredentialKind, CredentialRecord, PendingArguments, PendingInvocation,
    PendingOrigin, PendingState, Permission, PolicySetRecord, Role, RunRecord, RunStatus,
    SealedAnswer, Tenant, TokenRecord, ToolCallRecord,
};

/// The columns [`call_from_row`] reads, for `concat!` into queries.
macro_rules! call_columns {
    () => {
        "id, tenant, run, agent, tool, action, tool_use_id, correlation_id, status, args_hash, \
         input_redacted, output_redacted, error_code, error_text, policy_decision_id, \
         risk_level, duration_ms, attempts, evaluation, created_at, updated_at"
    };
}
pub(crate) use call_columns;

/// The columns [`event_from_row`] reads.
macro_rules! event_columns {
    () => {
        "seq, tenant, chain_seq, kind, run, tool_call_id, payload, at, prev_hash, hash"
    };
}
pub(crate) use event_columns;

/// The columns [`pending_from_row`] reads, in order.
macro_rules! pending_columns {
    () => {
        "id, tenant, run, tool_call_id, tool, arguments, arguments_sealed, arguments_key_id, \
         args_hash, manifest, policy_version, origin, decision, state, version, expires_at, \
         created_at, timeout_ms, trace_parent"
    };
}
pub(crate) use pending_columns;

/// The columns [`credential_from_row`] reads, in order.
macro_rules! credential_columns {
    () => {
        "tenant, name, kind, value, key_id, metadata, notes, created_by, created_at, updated_at"
    };
}
pub(crate) use credential_columns;

/// How a failed statement affects the batch it ran in.
#[derive(Debug)]
pub(crate) enum SqlFailure {
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
    pub(crate) fn classify(error: &sqlx::Error) -> SqlFailure {
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
pub(crate) enum Fail {
    /// The operation's answer is this error; the transaction is intact.
    Op(LedgerError),
    /// The transaction can no longer be trusted: the whole batch fails.
    Fatal(LedgerError),
}

/// Turns a failed write statement into the operation's failure. `exists` and `missing` say
/// what a unique or foreign key violation means for this statement.
pub(crate) fn write_failure(
    error: &sqlx::Error,
    exists: impl FnOnce() -> String,
    missing: impl FnOnce() -> LedgerError,
) -> Fail {
    match SqlFailure::classify(error) {
        SqlFailure::Unique => Fail::Op(LedgerError::AlreadyExists(exists())),
        SqlFailure::ForeignKey => Fail::Op(missing()),
        SqlFailure::Constraint(message) => Fail::Op(LedgerError::Constraint(message)),
        SqlFailure::Fatal(message) => Fail::Fatal(database_error(error, message)),
    }
}

/// A failed read inside the writer: undecodable rows are the operation's problem, anything
/// else is fatal for the batch.
pub(crate) fn read_failure(error: sqlx::Error) -> Fail {
    match error {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            Fail::Op(LedgerError::Corrupt(error.to_string()))
        }
        other => Fail::Fatal(database_error(&other, other.to_string())),
    }
}

/// A read failed. Undecodable values mean the file holds something this version cannot read.
pub(crate) fn read_error(error: sqlx::Error) -> LedgerError {
    match error {
        sqlx::Error::ColumnDecode { .. } | sqlx::Error::Decode(_) => {
            LedgerError::Corrupt(error.to_string())
        }
        other => database_error(&other, other.to_string()),
    }
}

/// `message` as the error it is: [`LedgerError::Unavailable`] when `error` is transient (a
/// later attempt may succeed), [`LedgerError::Database`] otherwise.
pub(crate) fn database_error(error: &sqlx::Error, message: String) -> LedgerError {
    if is_transient(error) {
        LedgerError::Unavailable(message)
    } else {
        LedgerError::Database(message)
    }
}

/// Whether the database is unreachable, busy or out of resources rather than refusing the
/// statement itself: lost connections, an exhausted pool, I/O errors, SQLite's busy, locked,
/// I/O, full, read-only and cannot-open codes, PostgreSQL's connection (08), resource (53),
/// operator (57: shutdown, cancel) and system (58) classes, serialization failures and
/// deadlocks (40001, 40P01) and lock timeouts (55P03).
pub(crate) fn is_transient(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => true,
        sqlx::Error::Database(db) => {
            let Some(code) = db.code() else {
                return false;
            };
            #[cfg(feature = "sqlite")]
            if db.try_downcast_ref::<sqlx::sqlite::SqliteError>().is_some()
                || db.try_downcast_ref::<crate::sqlite::LiteError>().is_some()
            {
                // Extended result codes carry the primary code in the low byte.
                let primary = code.parse::<u32>().map_or(0, |extended| extended & 0xff);
                // SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY, SQLITE_IOERR, SQLITE_FULL,
                // SQLITE_CANTOPEN.
                return matches!(primary, 5 | 6 | 8 | 10 | 13 | 14);
            }
            is_transient_sqlstate(&code)
        }
        _ => false,
    }
}

/// The PostgreSQL SQLSTATEs of [`is_transient`].
pub(crate) fn is_transient_sqlstate(code: &str) -> bool {
    matches!(code.get(..2), Some("08" | "53" | "57" | "58"))
        || matches!(code, "40001" | "40P01" | "55P03")
}

/// A result row of either backend, read column by column.
pub(crate) trait SqlRow {
    fn text(&self, column: &str) -> Result<String, LedgerError>;
    fn text_opt(&self, column: &str) -> Result<Option<String>, LedgerError>;
    fn int(&self, column: &str) -> Result<i64, LedgerError>;
    fn int_opt(&self, column: &str) -> Result<Option<i64>, LedgerError>;
    /// SQLite keeps booleans as INTEGER 0/1, PostgreSQL as BOOLEAN.
    fn flag(&self, column: &str) -> Result<bool, LedgerError>;
}

fn column_error(column: &str, error: &sqlx::Error) -> LedgerError {
    LedgerError::Corrupt(format!("column {column}: {error}"))
}

/// Implements the typed getters of [`SqlRow`] for a row type.
macro_rules! typed_getters {
    () => {
        fn text(&self, column: &str) -> Result<String, LedgerError> {
            self.try_get(column).map_err(|e| column_error(column, &e))
        }
        fn text_opt(&self, column: &str) -> Result<Option<String>, LedgerError> {
            self.try_get(column).map_err(|e| column_error(column, &e))
        }
        fn int(&self, column: &str) -> Result<i64, LedgerError> {
            self.try_get(column).map_err(|e| column_error(column, &e))
        }
        fn int_opt(&self, column: &str) -> Result<Option<i64>, LedgerError> {
            self.try_get(column).map_err(|e| column_error(column, &e))
        }
    };
}

#[cfg(feature = "sqlite")]
impl SqlRow for sqlx::sqlite::SqliteRow {
    typed_getters!();
    fn flag(&self, column: &str) -> Result<bool, LedgerError> {
        int_flag(column, self.int(column)?)
    }
}

/// A boolean SQLite keeps as INTEGER 0/1; anything else is the file's fault.
#[cfg(feature = "sqlite")]
pub(crate) fn int_flag(column: &str, value: i64) -> Result<bool, LedgerError> {
    match value {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(LedgerError::Corrupt(format!(
            "column {column}: {other} is not a boolean"
        ))),
    }
}

#[cfg(feature = "postgres")]
impl SqlRow for sqlx::postgres::PgRow {
    typed_getters!();
    fn flag(&self, column: &str) -> Result<bool, LedgerError> {
        self.try_get(column).map_err(|e| column_error(column, &e))
    }
}

fn parse<T>(row: &impl SqlRow, column: &str) -> Result<T, LedgerError>
where
    T: FromStr,
    T::Err: Display,
{
    let text = row.text(column)?;
    text.parse()
        .map_err(|error| LedgerError::Corrupt(format!("column {column}: {error}")))
}

fn parse_optional<T>(row: &impl SqlRow, column: &str) -> Result<Option<T>, LedgerError>
where
    T: FromStr,
    T::Err: Display,
{
    let text = row.text_opt(column)?;
    text.map(|text| {
        text.parse()
            .map_err(|error| LedgerError::Corrupt(format!("column {column}: {error}")))
    })
    .transpose()
}

fn timestamp(row: &impl SqlRow, column: &str) -> Result<Timestamp, LedgerError> {
    Ok(Timestamp(row.int(column)?))
}

fn json(row: &impl SqlRow, column: &str) -> Result<Value, LedgerError> {
    let text = row.text(column)?;
    parse_json(&text, column)
}

fn json_optional(row: &impl SqlRow, column: &str) -> Result<Option<Value>, LedgerError> {
    let text = row.text_opt(column)?;
    text.map(|text| parse_json(&text, column)).transpose()
}

fn parse_json(text: &str, column: &str) -> Result<Value, LedgerError> {
    serde_json::from_str(text)
        .map_err(|error| LedgerError::Corrupt(format!("column {column}: invalid JSON: {error}")))
}

/// A JSON array of tool names, as runs and pending invocations keep their manifests.
pub(crate) fn manifest_json(manifest: &[ToolName]) -> String {
    let names = manifest
        .iter()
        .map(|tool| Value::String(tool.as_str().to_owned()))
        .collect();
    Value::Array(names).to_string()
}

fn manifest(row: &impl SqlRow, column: &str) -> Result<Vec<ToolName>, LedgerError> {
    let text = row.text(column)?;
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

pub(crate) fn tenant_from_row(row: &impl SqlRow) -> Result<Tenant, LedgerError> {
    Ok(Tenant {
        id: parse(row, "id")?,
        name: row.text("name")?,
        created_at: timestamp(row, "created_at")?,
    })
}

pub(crate) fn agent_from_row(row: &impl SqlRow) -> Result<Agent, LedgerError> {
    Ok(Agent {
        tenant: parse(row, "tenant")?,
        id: parse(row, "id")?,
        name: row.text("name")?,
        created_at: timestamp(row, "created_at")?,
    })
}

pub(crate) fn token_from_row(row: &impl SqlRow) -> Result<TokenRecord, LedgerError> {
    let role_name = row.text("role")?;
    let role = Role::parse(&role_name)
        .ok_or_else(|| LedgerError::Corrupt(format!("column role: unknown role `{role_name}`")))?;
    Ok(TokenRecord {
        id: row.text("id")?,
        hash: row.text("hash")?,
        role,
        tenant: parse_optional(row, "tenant")?,
        agent: parse_optional(row, "agent")?,
        label: row.text("label")?,
        created_at: timestamp(row, "created_at")?,
        revoked: row.flag("revoked")?,
    })
}

pub(crate) fn permission_from_row(row: &impl SqlRow) -> Result<Permission, LedgerError> {
    Ok(Permission {
        tenant: parse(row, "tenant")?,
        agent: parse_optional(row, "agent")?,
        tool: parse(row, "tool")?,
        enabled: row.flag("enabled")?,
        updated_at: timestamp(row, "updated_at")?,
    })
}

pub(crate) fn policy_set_from_row(row: &impl SqlRow) -> Result<PolicySetRecord, LedgerError> {
    Ok(PolicySetRecord {
        tenant: parse(row, "tenant")?,
        version: row.int("version")?,
        text: row.text("text")?,
        created_by: row.text("created_by")?,
        created_at: timestamp(row, "created_at")?,
    })
}

pub(crate) fn run_from_row(row: &impl SqlRow) -> Result<RunRecord, LedgerError> {
    let status_name = row.text("status")?;
    let status = RunStatus::parse(&status_name).ok_or_else(|| {
        LedgerError::Corrupt(format!("column status: unknown run status `{status_name}`"))
    })?;
    Ok(RunRecord {
        tenant: parse(row, "tenant")?,
        id: parse(row, "id")?,
        agent: parse(row, "agent")?,
        manifest: manifest(row, "manifest")?,
        status,
        calls_used: row.int("calls_used")?,
        max_calls: row.int("max_calls")?,
        pending_approvals: row.int("pending_approvals")?,
        created_at: timestamp(row, "created_at")?,
    })
}

pub(crate) fn call_from_row(row: &impl SqlRow) -> Result<ToolCallRecord, LedgerError> {
    Ok(ToolCallRecord {
        id: parse(row, "id")?,
        tenant: parse(row, "tenant")?,
        run: parse(row, "run")?,
        agent: parse(row, "agent")?,
        tool: row.text("tool")?,
        action: row.text_opt("action")?,
        tool_use_id: parse_optional(row, "tool_use_id")?,
        correlation_id: parse(row, "correlation_id")?,
        status: parse(row, "status")?,
        args_hash: row.text("args_hash")?,
        input_redacted: json(row, "input_redacted")?,
        output_redacted: json_optional(row, "output_redacted")?,
        error_code: parse_optional(row, "error_code")?,
        error_text: row.text_opt("error_text")?,
        policy_decision_id: row.text_opt("policy_decision_id")?,
        risk_level: parse_optional(row, "risk_level")?,
        duration_ms: row.int_opt("duration_ms")?,
        attempts: row.int("attempts")?,
        evaluation: row.int("evaluation")?,
        created_at: timestamp(row, "created_at")?,
        updated_at: timestamp(row, "updated_at")?,
    })
}

/// A sealed answer (`answer_sealed`, `answer_expires_at`).
pub(crate) fn answer_from_row(row: &impl SqlRow) -> Result<SealedAnswer, LedgerError> {
    Ok(SealedAnswer {
        sealed: row.text("answer_sealed")?,
        expires_at: timestamp(row, "answer_expires_at")?,
    })
}

pub(crate) fn event_from_row(row: &impl SqlRow) -> Result<AuditEvent, LedgerError> {
    Ok(AuditEvent {
        seq: row.int("seq")?,
        tenant: parse(row, "tenant")?,
        chain_seq: row.int("chain_seq")?,
        kind: row.text("kind")?,
        run: parse_optional(row, "run")?,
        tool_call_id: parse_optional(row, "tool_call_id")?,
        payload: json(row, "payload")?,
        at: timestamp(row, "at")?,
        prev_hash: row.text("prev_hash")?,
        hash: row.text("hash")?,
    })
}

pub(crate) fn credential_from_row(row: &impl SqlRow) -> Result<CredentialRecord, LedgerError> {
    let get_text = |column: &str| row.text(column);
    let corrupt = |what: String| LedgerError::Corrupt(format!("tenant_tool_secrets: {what}"));
    let tenant = TenantId::new(get_text("tenant")?).map_err(|e| corrupt(e.to_string()))?;
    let name = SecretName::new(get_text("name")?).map_err(|e| corrupt(e.to_string()))?;
    let kind_text = get_text("kind")?;
    let kind =
        CredentialKind::parse(&kind_text).ok_or_else(|| corrupt(format!("kind `{kind_text}`")))?;
    let key_id = row.text_opt("key_id")?;
    let metadata = serde_json::from_str(&get_text("metadata")?)
        .map_err(|e| corrupt(format!("metadata: {e}")))?;
    let created_at = row.int("created_at")?;
    let updated_at = row.int("updated_at")?;
    Ok(CredentialRecord {
        tenant,
        name,
        kind,
        value: get_text("value")?,
        key_id,
        metadata,
        notes: get_text("notes")?,
        created_by: get_text("created_by")?,
        created_at: Timestamp(created_at),
        updated_at: Timestamp(updated_at),
    })
}

pub(crate) fn pending_from_row(row: &impl SqlRow) -> Result<PendingInvocation, LedgerError> {
    let corrupt = |what: String| LedgerError::Corrupt(format!("pending_invocations: {what}"));
    let text = |column: &str| row.text(column);
    let number = |column: &str| row.int(column);
    let arguments = match (
        row.text_opt("arguments_sealed")?,
        row.text_opt("arguments")?,
    ) {
        (Some(sealed), _) => PendingArguments::Sealed {
            key_id: row.text_opt("arguments_key_id")?.unwrap_or_default(),
            sealed,
        },
        (None, Some(text)) => PendingArguments::Clear(
            serde_json::from_str(&text).map_err(|e| corrupt(format!("arguments: {e}")))?,
        ),
        (None, None) => PendingArguments::Dropped,
    };
    let manifest: Vec<String> =
        serde_json::from_str(&text("manifest")?).map_err(|e| corrupt(format!("manifest: {e}")))?;
    let manifest = manifest
        .into_iter()
        .map(|name| ToolName::new(name).map_err(|e| corrupt(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let timeout = match row.int_opt("timeout_ms")? {
        None => None,
        Some(ms) => {
            let ms = u64::try_from(ms)
                .ok()
                .filter(|ms| *ms > 0)
                .ok_or_else(|| corrupt(format!("timeout_ms {ms}")))?;
            Some(std::time::Duration::from_millis(ms))
        }
    };
    let origin_text = text("origin")?;
    let state_text = text("state")?;
    let decision_text = text("decision")?;
    Ok(PendingInvocation {
        id: text("id")?,
        tenant: TenantId::new(text("tenant")?).map_err(|e| corrupt(e.to_string()))?,
        run: RunId::new(text("run")?).map_err(|e| corrupt(e.to_string()))?,
        tool_call_id: ToolCallId::new(text("tool_call_id")?).map_err(|e| corrupt(e.to_string()))?,
        tool: ToolName::new(text("tool")?).map_err(|e| corrupt(e.to_string()))?,
        arguments,
        args_hash: text("args_hash")?,
        manifest,
        policy_version: number("policy_version")?,
        origin: PendingOrigin::parse(&origin_text)
            .ok_or_else(|| corrupt(format!("origin `{origin_text}`")))?,
        decision: decision_text.parse().map_err(corrupt)?,
        state: PendingState::parse(&state_text)
            .ok_or_else(|| corrupt(format!("state `{state_text}`")))?,
        version: number("version")?,
        expires_at: Timestamp(number("expires_at")?),
        created_at: Timestamp(number("created_at")?),
        timeout,
        trace_parent: row.text_opt("trace_parent")?,
    })
}
