//! The durable ledger: tenants, tokens, configuration, runs, tool calls, policy decisions,
//! pending invocations and the hash-chained audit trail, behind the [`Store`] interface.
//!
//! SQLite ([`SqliteStore`]) is the embedded default; PostgreSQL ([`PgStore`]) serves several
//! gateway replicas sharing one database. On both, all writes of a process go through one
//! writer task that commits whatever has queued up in a single transaction (group commit), so
//! concurrent callers share an fsync without any write being acknowledged before it is durable.

mod binding;
mod chain;
mod checkpoint;
mod error;
mod model;
mod ops;
mod pg;
mod rows;
mod sqlite;
mod store;
#[cfg(test)]
mod tests;
mod verify;

pub use chain::{GENESIS_HASH, event_hash};
pub use checkpoint::{CHECKPOINT_FORMAT, Checkpoint, CheckpointAuth};
pub use error::{LedgerError, LedgerErrorKind};
pub use model::*;
pub use pg::{PgOptions, PgStore};
pub use sqlite::{SqliteStore, WriterStats};
pub use store::Store;
