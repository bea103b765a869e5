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
    /// The database could not be opened, migrated or written.
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
    Unavailable(String),
    /// The store was opened read-only (for `ledger verify` beside a running gateway).
    #[error("ledger opened read-only: it cannot be written")]
    ReadOnly,
}
