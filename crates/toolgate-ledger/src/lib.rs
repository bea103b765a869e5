//! The durable ledger: tenants, tokens, configuration, runs, tool calls, policy decisions,
//! pending invocations and the hash-chained audit trail, behind the [`Store`] interface.
//!
//! SQLite ([`SqliteStore`], feature `sqlite`) is the embedded default; PostgreSQL
//! ([`PgStore`], feature `postgres`) serves several gateway replicas sharing one database. Both
//! features are on by default. On both, all writes of a process go through one writer (a task
//! on PostgreSQL, a thread of its own calling SQLite directly on SQLite) that commits whatever has queued up in a single transaction (group commit), so concurrent callers
//! share an fsync without any write being acknowledged before it is durable.

#[cfg(not(any(feature = "sqlite", feature = "postgres")))]
compile_error!("toolgate-ledger needs a backend: enable the `sqlite` or `postgres` feature");

mod backend;
mod binding;
mod chain;
mod checkpoint;
mod console;
mod error;
mod model;
mod observe;
mod ops;
#[cfg(feature = "postgres")]
mod pg;
mod rows;
mod sql;
#[cfg(feature = "sqlite")]
mod sqlite;
mod steps;
mod store;
#[cfg(all(feature = "postgres", any(test, feature = "testkit")))]
pub mod testkit;
// The shared cases run on SQLite always and on PostgreSQL with `postgres-tests` (the
// conformance suite needs a server; `cargo xtask ci` turns the feature on).
#[cfg(all(test, feature = "sqlite", feature = "postgres"))]
#[cfg_attr(not(feature = "postgres-tests"), allow(dead_code, unused_imports))]
mod tests;
mod verify;

pub use chain::{EventFields, GENESIS_HASH, event_hash};
pub use checkpoint::{CHECKPOINT_FORMAT, Checkpoint, CheckpointAuth};
pub use console::{ClientLink, ConsoleSession, PendingDetails};
pub use error::{LedgerError, LedgerErrorKind};
pub use model::*;
pub use observe::LedgerObserver;
pub use ops::WriterStats;
#[cfg(feature = "postgres")]
pub use pg::{PgOptions, PgStore};
#[cfg(feature = "sqlite")]
pub use sqlite::SqliteStore;
pub use store::Store;
