//! Errors of engine requests that are not tool outcomes: the request itself was bad, or the
//! gateway could not do its job. Tool failures are [`crate::ExecuteOutcome`]s, not errors.

use toolgate_ledger::LedgerError;

/// A request the engine could not serve.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// A field of the request is malformed; the message names it.
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The run, call or agent does not exist in the caller's tenant.
    #[error("{0} not found")]
    NotFound(String),
    /// The request conflicts with recorded state (e.g. a reused tool_use_id with other
    /// arguments, or a run id that is taken).
    #[error("{0}")]
    Conflict(String),
    /// The request cannot be served in the current configuration (e.g. a permission names a
    /// tool this gateway does not serve).
    #[error("{0}")]
    FailedPrecondition(String),
    /// Policy text did not load; every problem is listed.
    #[error("invalid policy: {}", .0.join("; "))]
    InvalidPolicy(Vec<String>),
    /// The gateway cannot start calls for now (e.g. a PostgreSQL replica lost the lock that
    /// shows it alive); the message says why. Retrying, later or elsewhere, may succeed.
    #[error("{0}")]
    Unavailable(String),
    /// The ledger failed.
    #[error("ledger unavailable: {0}")]
    Ledger(#[source] LedgerError),
}

impl From<LedgerError> for EngineError {
    fn from(err: LedgerError) -> EngineError {
        match err {
            LedgerError::NotFound(what) => EngineError::NotFound(what),
            LedgerError::AlreadyExists(what) => {
                EngineError::Conflict(format!("{what} already exists"))
            }
            LedgerError::NotLive(why) => EngineError::Unavailable(why),
            other => EngineError::Ledger(other),
        }
    }
}
