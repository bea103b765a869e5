//! The SQLite ledger: one file in WAL mode, one write connection that calls SQLite directly,
//! used by a writer thread doing group commit or, when a write is the only one about, by its
//! caller at once (see `writer`), and a small pool of read-only sqlx connections for queries
//! (and the migrations, run before the writer starts).
//!
//! Durability: `synchronous = FULL`, so every COMMIT fsyncs the WAL before any caller of that
//! batch is answered. (`NORMAL` in WAL mode survives a process crash but may lose the last
//! commits on power loss, which would break the promise that an acknowledged write is durable.)
//! Group commit is what keeps FULL cheap: one fsync covers every write queued while the previous
//! batch was committing.
//!
//! One `SqliteStore` per database file: the writer caches chain heads on the assumption that it
//! is the file's only writer, and recovery treats every call found `running` at open as
//! interrupted. `open` enforces it with an exclusive lock beside the file (see `owner`), taken
//! before anything is read or written and held until the writer has stopped; a second process
//! is refused, naming the holder. [`SqliteStore::open_read_only`] takes no lock and never
//! writes, for readers beside the owner (`ledger verify`). Several gateway replicas need the
//! PostgreSQL backend.

mod backfill;
mod direct;
mod files;
mod owner;

mod writer;

pub(crate) use direct::LiteError;

#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use sqlx::{ConnectOptions, Connection as _};
use tokio::sync::{mpsc, oneshot};
use toolgate_core::AuditKeys;

use crate::LedgerObserver;
use crate::backend::{Backend, record_legacy_heads};
use crate::error::LedgerError;
use crate::model::{ToolCallRecord, VerifyReport};
use crate::ops::{Command, Counters, OpKind, Reply, WriteOp, WriterStats};
use crate::rows::{call_columns, call_from_row, read_error};
use crate::sql::{Dialect, query};
use crate::sqlite::direct::LiteConn;
use crate::sqlite::writer::{Inline, Shared, Writer};
use crate::steps::SqlConn;
use crate::verify::VerifyWith;

/// The schema, embedded at compile time.
static MIGRATOR: Migrator = sqlx::migrate!("../../migrations/sqlite");

/// Writes waiting for the writer before callers wait to enqueue (backpressure).
const QUEUE_CAPACITY: usize = 4096;
/// Read-only connections for queries.
const READ_CONNECTIONS: u32 = 4;
/// How long a statement waits for a lock held by another connection.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The SQLite implementation of [`Store`].
#[derive(Debug)]
pub struct SqliteStore {
    /// `None` for a store opened read-only.
    writer: Option<WriteHandle>,
    read: SqlitePool,
    counters: Arc<Counters>,
    /// The calls (their `seq`, as a JSON array) that were `running` when the store was opened:
    /// only those can have been interrupted by a crash. Every other `running` call is this
    /// process's own, including one that was waiting for approval at open and approved since.
    interrupted: String,
    /// The audit chain's keys: new events are MAC'd with them and verification checks them.
    keys: Option<Arc<dyn AuditKeys>>,
    /// Whether this store's open applied the keyed chain's migration.
    keyed_upgrade: bool,
}

/// The way to the writer: its queue, and the connection itself for inline commits.
#[derive(Debug)]
struct WriteHandle {
    queue: mpsc::Sender<Command>,
    shared: Arc<Shared>,
    /// Writes between their `submit` and the decision whether to commit inline.
    deciding: AtomicUsize,
}

impl WriteHandle {
    /// Commits `op` on this thread if it is the only write about: nothing queued, nobody
    /// committing, and no other write on its way. A write committed inline blocks its thread
    /// for the commit's fsync, and so every task waiting for that thread: the gateway serves
    /// calls from one worker thread on two cores. Should the tasks a batch's answer woke each
    /// commit inline in turn, they would commit one at a time, a fsync each, and nothing would
    /// be batched again (measured: 2,200 calls/s where batching gave 14,000). So a write first
    /// lets every task that is ready run (one `yield_now`), and those that reach `submit`
    /// meanwhile count themselves in `deciding`: a write that finds another deciding queues,
    /// and they are committed together.
    async fn inline(&self, op: OpKind) -> Inline {
        if !self.idle() {
            return Inline::Busy(op);
        }
        let deciding = Deciding::enter(&self.deciding);
        tokio::task::yield_now().await;
        if deciding.alone() && self.idle() {
            drop(deciding);
            self.shared.try_inline(op)
        } else {
            Inline::Busy(op)
        }
    }

    /// Whether nothing is queued.
    fn idle(&self) -> bool {
        self.queue.capacity() == self.queue.max_capacity()
    }
}

/// A write counted among those deciding, for as long as it is.
struct Deciding<'a>(&'a AtomicUsize);

impl<'a> Deciding<'a> {
    fn enter(count: &'a AtomicUsize) -> Deciding<'a> {
        count.fetch_add(1, Ordering::AcqRel);
        Deciding(count)
    }

    /// Whether no other write is deciding.
    fn alone(&self) -> bool {
        self.0.load(Ordering::Acquire) == 1
    }
}

impl Drop for Deciding<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl SqliteStore {
    /// Opens (creating if missing) the ledger at `path`, applies pending migrations and starts
    /// the writer task. Must be called inside a Tokio runtime.
    ///
    /// Without keys the audit events it writes carry legacy (unkeyed) hashes, which anyone who
    /// can write the file can recompute; the gateway opens its ledger with
    /// [`SqliteStore::open_keyed`].
    pub async fn open(path: &Path) -> Result<SqliteStore, LedgerError> {
        SqliteStore::open_gated(path, None, None).await
    }

    /// Like [`SqliteStore::open`], with the keys new audit events are MAC'd with (and
    /// verification checks them against).
    pub async fn open_keyed(
        path: &Path,
        keys: Arc<dyn AuditKeys>,
    ) -> Result<SqliteStore, LedgerError> {
        let store = SqliteStore::open_gated(path, None, Some(keys)).await?;
        if store.keyed_upgrade {
            record_legacy_heads(&store).await?;
        }
        Ok(store)
    }

    /// A store whose writer waits for `start` before its first batch, so tests can queue
    /// writes and see them committed as one batch.
    #[cfg(test)]
    async fn open_paused(path: &Path) -> Result<(SqliteStore, oneshot::Sender<()>), LedgerError> {
        let (start, gate) = oneshot::channel();
        let store = SqliteStore::open_gated(path, Some(gate), None).await?;
        Ok((store, start))
    }

    /// Writes waiting in the writer's queue.
    #[cfg(test)]
    fn queued(&self) -> usize {
        self.writer.as_ref().map_or(0, |writer| {
            writer.queue.max_capacity() - writer.queue.capacity()
        })
    }

    /// Opens an existing ledger for reading only: no lock, no migration, no writer, so it works
    /// beside the process that owns the file (WAL readers never block its writer, nor it them).
    /// Writes fail with [`LedgerError::ReadOnly`]. Refused when the file lacks a migration
    /// this version needs (the owner migrates it when it starts).
    pub async fn open_read_only(path: &Path) -> Result<SqliteStore, LedgerError> {
        SqliteStore::open_read_only_with(path, None).await
    }

    /// Like [`SqliteStore::open_read_only`], with the keys verification checks event MACs
    /// against (`None`: verification says what it could not check).
    pub async fn open_read_only_with(
        path: &Path,
        keys: Option<Arc<dyn AuditKeys>>,
    ) -> Result<SqliteStore, LedgerError> {
        let display = path.display();
        let options = SqliteConnectOptions::new()
            .filename(path)
            .read_only(true)
            .busy_timeout(BUSY_TIMEOUT);
        let read = SqlitePoolOptions::new()
            .max_connections(READ_CONNECTIONS)
            .connect_with(options)
            .await
            .map_err(|error| {
                LedgerError::Database(format!("could not open ledger {display}: {error}"))
            })?;
        let applied: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&read)
                .await
                .map_err(|error| {
                    LedgerError::Database(format!(
                        "{display} is not a toolgate ledger, or was never migrated: {error}"
                    ))
                })?;
        if let Some(missing) = MIGRATOR
            .iter()
            .find(|migration| !applied.contains(&migration.version))
        {
            read.close().await;
            return Err(LedgerError::Database(format!(
                "ledger {display} lacks migration {} ({}): start `toolgate serve` on it once to \
                 migrate it",
                missing.version, missing.description
            )));
        }
        Ok(SqliteStore {
            writer: None,
            read,
            counters: Arc::default(),
            interrupted: "[]".to_owned(),
            keys,
            keyed_upgrade: false,
        })
    }

    async fn open_gated(
        path: &Path,
        gate: Option<oneshot::Receiver<()>>,
        keys: Option<Arc<dyn AuditKeys>>,
    ) -> Result<SqliteStore, LedgerError> {
        // First of all: nothing may read `running` calls as interrupted, or write, while
        // another process owns the file.
        let lock = owner::OwnerLock::acquire(path)?;
        files::prepare(path)?;
        let shared = SqliteConnectOptions::new()
            .filename(path)
            .foreign_keys(true)
            .busy_timeout(BUSY_TIMEOUT);
        // The migrations run on a sqlx connection, which creates the file in WAL mode; the
        // writer's own connection (`direct`) is opened once they are done, with the settings
        // it writes under: `synchronous = FULL`; a 4 MiB page cache for the hot index pages;
        // checkpoints done beside the writer, not in its commits (see `backfill`); savepoint
        // journals in memory (no temporary file per batch); `secure_delete`, so deleted and
        // overwritten content (a pending call's sealed arguments after its decision) is zeroed
        // in the file, not left in free space.
        // The cache's size has a cost too: a commit after a B-tree split that swapped pages
        // scans the whole page cache (SQLite parks a page at the pending-byte page number while
        // swapping and truncates the cache back at commit). That scan was 5% of the writer's
        // CPU with 16 MiB and 2% with 4 MiB. Side by side (`cargo xtask bench --compare`,
        // two runs), 4 MiB against 16 MiB gave median throughput ratios of 1.10 and 0.97 and
        // CPU per call -7% and +2%, with 0.3% fewer instructions per call: no loss, and
        // about 12 MiB less peak RSS.
        let write_options = shared
            .clone()
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            .pragma("secure_delete", "on");
        let display = path.display();
        let mut conn = write_options.connect().await.map_err(|error| {
            LedgerError::Database(format!("could not open ledger {display}: {error}"))
        })?;
        // Whether this open brings the keyed chain to the ledger (see `open_keyed`).
        let keyed_before: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM _sqlx_migrations WHERE version = 10 AND success",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap_or(0);
        MIGRATOR.run(&mut conn).await.map_err(|error| {
            LedgerError::Database(format!("could not migrate ledger {display}: {error}"))
        })?;
        let running: Vec<i64> =
            sqlx::query_scalar("SELECT seq FROM tool_calls WHERE status = 'running' ORDER BY seq")
                .fetch_all(&mut conn)
                .await
                .map_err(read_error)?;
        let interrupted = serde_json::Value::from(running).to_string();
        let read = SqlitePoolOptions::new()
            .max_connections(READ_CONNECTIONS)
            .connect_with(shared.read_only(true))
            .await
            .map_err(|error| {
                LedgerError::Database(format!("could not open ledger {display}: {error}"))
            })?;

        conn.close().await.map_err(|error| {
            LedgerError::Database(format!("could not open ledger {display}: {error}"))
        })?;
        let direct = LiteConn::open(path, BUSY_TIMEOUT)?;

        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        // The lock lives as long as the writer: a store dropped without `close` keeps the file
        // until its queued writes are committed.
        let backfill = backfill::Backfill::start(path);
        let (writer, shared) = Writer::new(
            direct,
            rx,
            Arc::clone(&counters),
            lock,
            keys.clone(),
            backfill,
            gate.is_some(),
        );
        writer.spawn(gate)?;
        Ok(SqliteStore {
            writer: Some(WriteHandle {
                queue: tx,
                shared,
                deciding: AtomicUsize::new(0),
            }),
            read,
            counters,
            interrupted,
            keys,
            keyed_upgrade: keyed_before == 0,
        })
    }

    /// Commits every write queued so far, stops the writer and closes every connection. Writes
    /// after this fail with [`LedgerError::Closed`]. Dropping the store also stops the writer
    /// once the queued writes are committed, without waiting for it.
    pub async fn close(&self) {
        if let Some(writer) = &self.writer {
            let (done, closed) = oneshot::channel();
            if writer.queue.send(Command::Close(done)).await.is_ok() {
                // An error means the writer is gone already, which is what we wanted.
                let _ = closed.await;
            }
        }
        self.read.close().await;
    }

    /// Counters of the writer, e.g. to see how well writes are batched.
    pub fn stats(&self) -> WriterStats {
        self.counters.stats()
    }

    /// Tells `observer` of every batch the writer commits from now on (the gateway's
    /// metrics). Only the first observer given is kept.
    pub fn observe(&self, observer: Arc<dyn LedgerObserver>) {
        let _ = self.counters.observer.set(observer);
    }

    /// Commits a write and answers once it is durable: on this thread when it is the only
    /// write about (see `inline`), otherwise through the writer's queue, in the next batch.
    async fn submit(&self, kind: OpKind) -> Result<Reply, LedgerError> {
        let Some(writer) = &self.writer else {
            return Err(LedgerError::ReadOnly);
        };
        let kind = match writer.inline(kind).await {
            Inline::Done(answer) => return answer,
            Inline::Busy(kind) => kind,
        };
        let (reply, answer) = oneshot::channel();
        writer
            .queue
            .send(Command::Write(WriteOp { kind, reply }))
            .await
            .map_err(|_| LedgerError::Closed)?;
        answer.await.map_err(|_| LedgerError::Closed)?
    }
}

/// The read connections, for verification.
impl SqlConn for sqlx::SqliteConnection {
    type Row = sqlx::sqlite::SqliteRow;
    type Db<'c> = &'c mut sqlx::SqliteConnection;
    const DIALECT: Dialect = Dialect::Sqlite;

    fn db(&mut self) -> &mut sqlx::SqliteConnection {
        self
    }
}

impl Backend for SqliteStore {
    type Reader<'a> = &'a SqlitePool;
    const DIALECT: Dialect = Dialect::Sqlite;

    fn reader(&self) -> &SqlitePool {
        &self.read
    }

    async fn submit(&self, kind: OpKind) -> Result<Reply, LedgerError> {
        SqliteStore::submit(self, kind).await
    }

    /// One process owns the file: it is always alive to itself.
    fn check_live(&self) -> Result<(), LedgerError> {
        Ok(())
    }

    async fn interrupted_calls(&self, limit: u32) -> Result<Vec<ToolCallRecord>, LedgerError> {
        query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM tool_calls WHERE status = 'running' \
              AND seq IN (SELECT value FROM json_each($1)) ORDER BY seq LIMIT $2"
        ))
        .bind(&self.interrupted)
        .bind(i64::from(limit))
        .all(&self.read, call_from_row)
        .await
    }

    async fn verify(&self, with: VerifyWith<'_>) -> Result<VerifyReport, LedgerError> {
        let mut conn = self.read.acquire().await.map_err(read_error)?;
        crate::verify::verify_chains(&mut *conn, with).await
    }

    fn keys(&self) -> Option<Arc<dyn AuditKeys>> {
        self.keys.clone()
    }

    /// Only this process writes the file; its engine announces its own writes.
    fn commits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    fn config_changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    async fn shut_down(&self) {
        SqliteStore::close(self).await;
    }
}
