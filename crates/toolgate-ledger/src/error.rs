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
}
