//! What the ledger's writer reports as it commits, for whoever keeps metrics: a narrow hook
//! with a no-op default, so the ledger holds no metric state and a library user needs nothing.

use std::fmt;
use std::time::Duration;

/// Receives the writer's observations. Called by the writer (SQLite's writer thread, or
/// PostgreSQL's writer task) after every batch:
/// implementations must be quick and must not block.
pub trait LedgerObserver: fmt::Debug + Send + Sync {
    /// The writer finished a batch of `operations` writes in `elapsed`: from taking the batch
    /// off its queue to answering its callers, the commit's fsync and any re-run after a
    /// conflict included. `committed` is false when the batch failed as a whole.
    fn batch_committed(&self, operations: usize, elapsed: Duration, committed: bool) {
        let _ = (operations, elapsed, committed);
    }
}
