//! The ledger's error type.

/// A store operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LedgerError {
    /// The thing to create exists already.
    #[error("{0} already exists")]
    AlreadyExists(String),
    /// A referenced thing does not exist.
    #[error("{0} not found")]
    NotFound(String),
    /// The database holds something this version cannot read.
    #[error("corrupt ledger row: {0}")]
    Corrupt(String),
    /// A constraint (NOT NULL, CHECK) refused a write: the request conflicts with what the
    /// ledger holds.
    #[error("ledger constraint refused the change: {0}")]
    Constraint(String),
    /// The database cannot be reached or is busy (connection lost, pool exhausted, I/O, a full
    /// disk, a lock held too long, a serialization failure): a later attempt may succeed.
    #[error("ledger database unavailable: {0}")]
    Unavailable(String),
    /// The database could not be opened, migrated or written, for any other reason.
    #[error("ledger database error: {0}")]
    Database(String),
    /// The store's writer has stopped (the process is shutting down).
    #[error("ledger writer has stopped")]
    Closed,
    /// Another process owns the ledger (a SQLite file has one owner); the message names it.
    #[error("{0}")]
    InUse(String),
    /// The store refuses to start calls for now (PostgreSQL: this process lost the lock that
    /// tells other replicas it is alive); the message says why. Retrying later may succeed.
    #[error("{0}")]
    NotLive(String),
    /// The store was opened read-only (for `ledger verify` beside a running gateway).
    #[error("ledger opened read-only: it cannot be written")]
    ReadOnly,
}

/// What kind of failure a [`LedgerError`] is: decides the gRPC status the gateway answers
/// with and whether the caller may retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum LedgerErrorKind {
    /// The thing to create exists already.
    AlreadyExists,
    /// A referenced thing does not exist.
    NotFound,
    /// A constraint refused the change.
    Constraint,
    /// The database is unreachable, busy or shutting down: retry later.
    Transient,
    /// Anything else (a corrupt row, a missing table, a bug): not worth retrying.
    Internal,
}

impl LedgerError {
    /// The kind of failure.
    pub fn kind(&self) -> LedgerErrorKind {
        match self {
            LedgerError::AlreadyExists(_) => LedgerErrorKind::AlreadyExists,
            LedgerError::NotFound(_) => LedgerErrorKind::NotFound,
            LedgerError::Constraint(_) => LedgerErrorKind::Constraint,
            LedgerError::Unavailable(_) | LedgerError::NotLive(_) | LedgerError::Closed => {
                LedgerErrorKind::Transient
            }
            LedgerError::Corrupt(_)
            | LedgerError::Database(_)
            | LedgerError::InUse(_)
            | LedgerError::ReadOnly => LedgerErrorKind::Internal,
        }
    }

    /// A copy, for answering every caller of a batch that failed as a whole. Not `Clone`: the
    /// type is public and non-exhaustive, and copies are the writers' business.
    pub(crate) fn copied(&self) -> LedgerError {
        match self {
            LedgerError::AlreadyExists(what) => LedgerError::AlreadyExists(what.clone()),
            LedgerError::NotFound(what) => LedgerError::NotFound(what.clone()),
            LedgerError::Corrupt(what) => LedgerError::Corrupt(what.clone()),
            LedgerError::Constraint(what) => LedgerError::Constraint(what.clone()),
            LedgerError::Unavailable(what) => LedgerError::Unavailable(what.clone()),
            LedgerError::Database(what) => LedgerError::Database(what.clone()),
            LedgerError::Closed => LedgerError::Closed,
            LedgerError::InUse(what) => LedgerError::InUse(what.clone()),
            LedgerError::NotLive(what) => LedgerError::NotLive(what.clone()),
            LedgerError::ReadOnly => LedgerError::ReadOnly,
        }
    }
}
