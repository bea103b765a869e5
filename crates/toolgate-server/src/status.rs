//! The one place a refusal becomes a gRPC status: engine errors, store failures (by kind,
//! never with the database's text), authentication refusals and malformed requests.

use std::sync::LazyLock;

use tonic::{Code, Status};
use toolgate_core::Redactor;
use toolgate_engine::EngineError;
use toolgate_ledger::{LedgerError, LedgerErrorKind, Role};

/// What a caller is told when the ledger is unreachable or busy: retrying later may work.
pub const LEDGER_UNAVAILABLE: &str =
    "the gateway's ledger is unavailable at the moment; retry later";
/// What a caller is told when the ledger refused a change through one of its constraints.
pub const LEDGER_CONSTRAINT: &str =
    "the ledger refused the change: it conflicts with what is recorded";
/// What a caller is told when the ledger failed in any other way. The detail is in the log.
pub const LEDGER_INTERNAL: &str = "the gateway's ledger failed; the gateway log has the detail";
/// What a call refused during a shutdown is told.
pub const SHUTTING_DOWN: &str =
    "the gateway is shutting down; retry on another replica or once it is back";

/// Why the gateway refused a request. Every service answers with one of these, and
/// [`status`] is the only function that turns one into a [`Status`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServiceError {
    /// The request carries no `authorization` metadata.
    #[error("UNAUTHENTICATED: missing `authorization: Bearer <token>` metadata")]
    MissingToken,
    /// The `authorization` metadata is not visible ASCII.
    #[error("UNAUTHENTICATED: the authorization header is not text")]
    TokenNotText,
    /// The `authorization` metadata is not a bearer token.
    #[error("UNAUTHENTICATED: the authorization header must be `Bearer <token>`")]
    NotBearer,
    /// No live token has this value.
    #[error("UNAUTHENTICATED: unknown or revoked token")]
    UnknownToken,
    /// A valid token of another role: the caller is known, the call is not theirs to make.
    #[error(
        "PERMISSION_DENIED: this call needs an {} token, not an {} token",
        needed.as_str(),
        held.as_str()
    )]
    WrongRole {
        /// The role the service serves.
        needed: Role,
        /// The role of the token presented.
        held: Role,
    },
    /// A call that acts within a tenant, made with a token of none.
    #[error("this call needs a tenant token")]
    NoTenant,
    /// A service was reached without the authentication layer in front of it (a wiring bug).
    #[error("the request was not authenticated")]
    NotAuthenticated,
    /// A field of the request is malformed; the message names the field.
    #[error("{0}")]
    InvalidArgument(String),
    /// The thing asked for does not exist for this caller (`what` names it).
    #[error("{0} not found")]
    NotFound(String),
    /// The caller may not do this (the message says why).
    #[error("{0}")]
    PermissionDenied(String),
    /// The request cannot be served in the current state (the message says why).
    #[error("{0}")]
    FailedPrecondition(String),
    /// A shutdown has begun.
    #[error("the gateway is shutting down")]
    ShuttingDown,
    /// The gateway is at its call limits (the message names them); nothing was started.
    #[error("{0}")]
    Overloaded(String),
    /// The client's deadline passed before the call could start; nothing was started.
    #[error("{0}")]
    DeadlineExceeded(String),
    /// The engine refused or failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// The store failed.
    #[error(transparent)]
    Ledger(#[from] LedgerError),
}

impl ServiceError {
    /// A malformed field: `field: problem`.
    pub fn invalid(field: &str, problem: impl std::fmt::Display) -> ServiceError {
        ServiceError::InvalidArgument(format!("{field}: {problem}"))
    }
}

impl From<ServiceError> for Status {
    fn from(error: ServiceError) -> Status {
        status(error)
    }
}

/// The status of a refusal: its code and the message the caller sees.
pub fn status(error: impl Into<ServiceError>) -> Status {
    let error = error.into();
    let (code, message) = code_and_message(error);
    Status::new(code, message)
}

/// The code and message of every refusal, in one match.
fn code_and_message(error: ServiceError) -> (Code, String) {
    match error {
        error @ (ServiceError::MissingToken
        | ServiceError::TokenNotText
        | ServiceError::NotBearer
        | ServiceError::UnknownToken) => (Code::Unauthenticated, error.to_string()),
        error @ (ServiceError::WrongRole { .. }
        | ServiceError::NoTenant
        | ServiceError::PermissionDenied(_)) => (Code::PermissionDenied, error.to_string()),
        error @ ServiceError::NotAuthenticated => (Code::Internal, error.to_string()),
        ServiceError::InvalidArgument(message) => (Code::InvalidArgument, message),
        error @ ServiceError::NotFound(_) => (Code::NotFound, error.to_string()),
        ServiceError::FailedPrecondition(message) => (Code::FailedPrecondition, message),
        ServiceError::ShuttingDown => (Code::Unavailable, SHUTTING_DOWN.to_owned()),
        ServiceError::Overloaded(message) => (Code::ResourceExhausted, message),
        ServiceError::DeadlineExceeded(message) => (Code::DeadlineExceeded, message),
        ServiceError::Engine(error) => engine(error),
        ServiceError::Ledger(error) => engine(EngineError::from(error)),
    }
}

fn engine(error: EngineError) -> (Code, String) {
    match error {
        EngineError::InvalidRequest(m) => (Code::InvalidArgument, m),
        EngineError::NotFound(m) => (Code::NotFound, format!("{m} not found")),
        EngineError::Conflict(m) => (Code::AlreadyExists, m),
        EngineError::FailedPrecondition(m) => (Code::FailedPrecondition, m),
        error @ EngineError::InvalidPolicy(_) => (Code::InvalidArgument, error.to_string()),
        EngineError::Unavailable(m) => (Code::Unavailable, m),
        EngineError::Ledger(error) => store(&error),
        other => (Code::Internal, other.to_string()),
    }
}

/// The status of a store failure, by its kind, with a message that names no SQL, table or
/// column (callers, unauthenticated ones included, learn nothing about the database). The
/// detail goes to the log, redacted.
fn store(error: &LedgerError) -> (Code, String) {
    static REDACTOR: LazyLock<Redactor> = LazyLock::new(Redactor::new);
    let detail = error.to_string();
    let detail = REDACTOR.redact_text(&detail);
    match error.kind() {
        // Our own messages (`tenant `acme` already exists`), never the database's.
        LedgerErrorKind::AlreadyExists => (Code::AlreadyExists, error.to_string()),
        LedgerErrorKind::NotFound => (Code::NotFound, error.to_string()),
        LedgerErrorKind::Transient => {
            tracing::warn!(error = %detail, "ledger unavailable");
            (Code::Unavailable, LEDGER_UNAVAILABLE.to_owned())
        }
        LedgerErrorKind::Constraint => {
            tracing::warn!(error = %detail, "ledger constraint refused a change");
            (Code::FailedPrecondition, LEDGER_CONSTRAINT.to_owned())
        }
        _ => {
            tracing::error!(error = %detail, "ledger failed");
            (Code::Internal, LEDGER_INTERNAL.to_owned())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One row per kind of refusal: what the caller sees.
    fn check(error: ServiceError, code: Code, message: &str) {
        let shown = format!("{error:?}");
        let status = status(error);
        assert_eq!(status.code(), code, "{shown}");
        assert_eq!(status.message(), message, "{shown}");
    }

    /// Every variant of every error a service can answer with has its row here: the match
    /// names each one (no wildcard), so a new variant does not compile until it has a row.
    #[test]
    fn every_refusal_has_its_code_and_message() {
        let sql = "no such table: api_tokens in SELECT id FROM api_tokens WHERE hash = ?";
        let rows: Vec<(ServiceError, Code, String)> = vec![
            (
                ServiceError::MissingToken,
                Code::Unauthenticated,
                "UNAUTHENTICATED: missing `authorization: Bearer <token>` metadata".into(),
            ),
            (
                ServiceError::TokenNotText,
                Code::Unauthenticated,
                "UNAUTHENTICATED: the authorization header is not text".into(),
            ),
            (
                ServiceError::NotBearer,
                Code::Unauthenticated,
                "UNAUTHENTICATED: the authorization header must be `Bearer <token>`".into(),
            ),
            (
                ServiceError::UnknownToken,
                Code::Unauthenticated,
                "UNAUTHENTICATED: unknown or revoked token".into(),
            ),
            (
                ServiceError::WrongRole {
                    needed: Role::Admin,
                    held: Role::Agent,
                },
                Code::PermissionDenied,
                "PERMISSION_DENIED: this call needs an admin token, not an agent token".into(),
            ),
            (
                ServiceError::NoTenant,
                Code::PermissionDenied,
                "this call needs a tenant token".into(),
            ),
            (
                ServiceError::NotAuthenticated,
                Code::Internal,
                "the request was not authenticated".into(),
            ),
            (
                ServiceError::invalid("run_id", "must not be empty"),
                Code::InvalidArgument,
                "run_id: must not be empty".into(),
            ),
            (
                ServiceError::NotFound("run `r1`".into()),
                Code::NotFound,
                "run `r1` not found".into(),
            ),
            (
                ServiceError::PermissionDenied("bound elsewhere".into()),
                Code::PermissionDenied,
                "bound elsewhere".into(),
            ),
            (
                ServiceError::FailedPrecondition("key in use".into()),
                Code::FailedPrecondition,
                "key in use".into(),
            ),
            (
                ServiceError::ShuttingDown,
                Code::Unavailable,
                SHUTTING_DOWN.into(),
            ),
            (
                ServiceError::Overloaded("at the limit of 2 (server.max_concurrent_calls)".into()),
                Code::ResourceExhausted,
                "at the limit of 2 (server.max_concurrent_calls)".into(),
            ),
            (
                ServiceError::DeadlineExceeded("passed while waiting".into()),
                Code::DeadlineExceeded,
                "passed while waiting".into(),
            ),
            (
                EngineError::InvalidRequest("tool_name: empty".into()).into(),
                Code::InvalidArgument,
                "tool_name: empty".into(),
            ),
            (
                EngineError::NotFound("run `r2`".into()).into(),
                Code::NotFound,
                "run `r2` not found".into(),
            ),
            (
                EngineError::Conflict("run `r3` already exists".into()).into(),
                Code::AlreadyExists,
                "run `r3` already exists".into(),
            ),
            (
                EngineError::FailedPrecondition("not served".into()).into(),
                Code::FailedPrecondition,
                "not served".into(),
            ),
            (
                EngineError::InvalidPolicy(vec!["a".into(), "b".into()]).into(),
                Code::InvalidArgument,
                "invalid policy: a; b".into(),
            ),
            (
                EngineError::Unavailable("lock lost".into()).into(),
                Code::Unavailable,
                "lock lost".into(),
            ),
            (
                EngineError::Ledger(LedgerError::Closed).into(),
                Code::Unavailable,
                LEDGER_UNAVAILABLE.into(),
            ),
            (
                LedgerError::Unavailable(format!("database is locked: {sql}")).into(),
                Code::Unavailable,
                LEDGER_UNAVAILABLE.into(),
            ),
            (
                LedgerError::Closed.into(),
                Code::Unavailable,
                LEDGER_UNAVAILABLE.into(),
            ),
            (
                LedgerError::NotLive("the instance lock was lost".into()).into(),
                Code::Unavailable,
                "the instance lock was lost".into(),
            ),
            (
                LedgerError::Constraint(format!("CHECK constraint failed: {sql}")).into(),
                Code::FailedPrecondition,
                LEDGER_CONSTRAINT.into(),
            ),
            (
                LedgerError::Database(sql.to_owned()).into(),
                Code::Internal,
                LEDGER_INTERNAL.into(),
            ),
            (
                LedgerError::Corrupt(format!("column role: {sql}")).into(),
                Code::Internal,
                LEDGER_INTERNAL.into(),
            ),
            (
                LedgerError::InUse(format!("held by pid 1: {sql}")).into(),
                Code::Internal,
                LEDGER_INTERNAL.into(),
            ),
            (
                LedgerError::ReadOnly.into(),
                Code::Internal,
                LEDGER_INTERNAL.into(),
            ),
            (
                LedgerError::AlreadyExists("tenant `acme`".into()).into(),
                Code::AlreadyExists,
                "tenant `acme` already exists".into(),
            ),
            (
                LedgerError::NotFound("run `r1`".into()).into(),
                Code::NotFound,
                "run `r1` not found".into(),
            ),
        ];
        let mut seen = std::collections::BTreeSet::new();
        for (error, code, message) in rows {
            seen.insert(variant(&error));
            check(error, code, &message);
        }
        assert_eq!(seen.len(), VARIANTS, "a variant has no row: {seen:?}");
    }

    /// How many variants [`variant`] names.
    const VARIANTS: usize = 31;

    /// A name per variant, the engine's and the ledger's included.
    fn variant(error: &ServiceError) -> &'static str {
        match error {
            ServiceError::MissingToken => "MissingToken",
            ServiceError::TokenNotText => "TokenNotText",
            ServiceError::NotBearer => "NotBearer",
            ServiceError::UnknownToken => "UnknownToken",
            ServiceError::WrongRole { .. } => "WrongRole",
            ServiceError::NoTenant => "NoTenant",
            ServiceError::NotAuthenticated => "NotAuthenticated",
            ServiceError::InvalidArgument(_) => "InvalidArgument",
            ServiceError::NotFound(_) => "NotFound",
            ServiceError::PermissionDenied(_) => "PermissionDenied",
            ServiceError::FailedPrecondition(_) => "FailedPrecondition",
            ServiceError::ShuttingDown => "ShuttingDown",
            ServiceError::Overloaded(_) => "Overloaded",
            ServiceError::DeadlineExceeded(_) => "DeadlineExceeded",
            ServiceError::Engine(error) => match error {
                EngineError::InvalidRequest(_) => "Engine::InvalidRequest",
                EngineError::NotFound(_) => "Engine::NotFound",
                EngineError::Conflict(_) => "Engine::Conflict",
                EngineError::FailedPrecondition(_) => "Engine::FailedPrecondition",
                EngineError::InvalidPolicy(_) => "Engine::InvalidPolicy",
                EngineError::Unavailable(_) => "Engine::Unavailable",
                EngineError::Ledger(_) => "Engine::Ledger",
                // Both foreign enums are non_exhaustive: a new variant answers INTERNAL until
                // it is given a name and a row.
                _ => "Engine::other",
            },
            ServiceError::Ledger(error) => match error {
                LedgerError::AlreadyExists(_) => "Ledger::AlreadyExists",
                LedgerError::NotFound(_) => "Ledger::NotFound",
                LedgerError::Corrupt(_) => "Ledger::Corrupt",
                LedgerError::Constraint(_) => "Ledger::Constraint",
                LedgerError::Unavailable(_) => "Ledger::Unavailable",
                LedgerError::Database(_) => "Ledger::Database",
                LedgerError::Closed => "Ledger::Closed",
                LedgerError::InUse(_) => "Ledger::InUse",
                LedgerError::NotLive(_) => "Ledger::NotLive",
                LedgerError::ReadOnly => "Ledger::ReadOnly",
                _ => "Ledger::other",
            },
        }
    }

    #[test]
    fn a_wrong_role_is_permission_denied_and_says_so() {
        let cases = [
            (
                Role::Admin,
                Role::Agent,
                "needs an admin token, not an agent token",
            ),
            (
                Role::Agent,
                Role::Admin,
                "needs an agent token, not an admin token",
            ),
            (
                Role::Approver,
                Role::Agent,
                "needs an approver token, not an agent token",
            ),
        ];
        for (needed, held, says) in cases {
            let status = status(ServiceError::WrongRole { needed, held });
            assert_eq!(status.code(), Code::PermissionDenied);
            assert!(status.message().contains(says), "{}", status.message());
            assert!(
                !status.message().contains("UNAUTHENTICATED"),
                "{}",
                status.message()
            );
        }
    }

    /// None of the database's words reach the caller, whatever the kind of store failure.
    #[test]
    fn store_failures_name_no_sql() {
        let sql = "no such table: api_tokens in SELECT id FROM api_tokens WHERE hash = ?";
        let errors = [
            LedgerError::Unavailable(format!("database is locked: {sql}")),
            LedgerError::Constraint(format!("CHECK constraint failed: {sql}")),
            LedgerError::Database(sql.to_owned()),
            LedgerError::Corrupt(format!("column role: {sql}")),
            LedgerError::InUse(sql.to_owned()),
        ];
        for error in errors {
            let shown = error.to_string();
            let status = status(EngineError::from(error));
            for word in [
                "SELECT",
                "api_tokens",
                "table",
                "constraint failed",
                "locked",
            ] {
                assert!(
                    !status.message().contains(word),
                    "{shown}: {}",
                    status.message()
                );
            }
        }
    }
}
