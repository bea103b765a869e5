//! The single writer of the file: the write connection, and the thread that owns it when there
//! is a queue to drain.
//!
//! A write goes one of two ways. When it is the only write about (nothing queued, nobody
//! committing, no other write on its way: the store decides, see `WriteHandle::inline`), the
//! caller commits it itself, on its own thread, at once ([`Shared::try_inline`]): a write at
//! light load makes no thread hop, and its caller waits for the fsync and nothing else. (The
//! hand-off to a sleeping writer thread and back cost two wake-ups a write, 56-73 µs each as
//! `perf sched` measured them; at 1,000 calls/s the gateway's CPU per call went down 13% and its
//! context switches per call from 12 to 6.6.) Otherwise it joins the queue, and the writer thread takes
//! whatever writes have queued up and commits them in one transaction (group commit), then
//! answers each caller. Both ways take the same lock on the connection, so one transaction is
//! open at a time, and the caller that commits inline blocks only itself: a caller that finds
//! the lock taken queues instead of waiting for it.
//!
//! The connection calls SQLite directly (see `direct`), so a statement costs what SQLite
//! spends on it and nothing more: every operation is written statement by statement by the
//! code shared with PostgreSQL (`crate::steps`), whose futures complete when first polled
//! ([`now`]). Operations of a batch run in the order they were queued, first all together in
//! the batch's transaction. Should one be refused (a missing run, a clashing id: an error, not
//! an answer such as a repeated `tool_use_id` or a used-up budget), the transaction is rolled
//! back and the batch runs again the slow way, each operation in a savepoint of its own, so the
//! refused one is undone alone and answered precisely while the rest of its batch commits. The
//! fast way spares every operation its savepoint, whose sub-journal copies each page the
//! operation changes (nine pages for a call).
//!
//! The writer thread blocks on the queue: nothing polls, and no timer runs; an fsync blocks
//! only the thread that commits.
//!
//! The writer caches each tenant's chain head (`chain_seq`, hash). It is the only writer of the
//! database file (one `SqliteStore` per file), so the cache stays true; it is dropped whenever a
//! transaction is rolled back and reloaded lazily from `audit_heads`.

use std::collections::HashSet;
use std::pin::pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard, TryLockError};
use std::task::{Context, Poll, Waker};

use tokio::sync::{mpsc, oneshot};
use toolgate_core::AuditKeys;
use tracing::warn;

use crate::error::LedgerError;
use crate::ops::{Command, Counters, OpKind, Reply, WriteOp};
use crate::rows::{Fail, database_error};
use crate::sql::query;
use crate::sqlite::backfill::{self, Backfill, Next};
use crate::sqlite::direct::LiteConn;
use crate::sqlite::owner::OwnerLock;
use crate::steps::{FastHash, Head, Heads, Steps};

/// The most operations committed in one transaction. Bounds the latency one batch adds to the
/// callers queued behind it.
const MAX_BATCH: usize = 256;

/// Stores a chain head at the end of a batch that moved it.
const UPSERT_HEAD: &str = "INSERT INTO audit_heads (tenant, chain_seq, hash) \
     VALUES ($1, $2, $3) ON CONFLICT (tenant) DO UPDATE SET chain_seq = excluded.chain_seq, \
     hash = excluded.hash";

/// Runs a future of the statement code to its end. Over the direct connection every statement
/// runs when its future is first polled and nothing ever waits, so one poll completes it.
fn now<T>(future: impl Future<Output = T>) -> T {
    match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(value) => value,
        // Only code that awaits something other than the direct connection could get here.
        Poll::Pending => unreachable!("a ledger statement over the direct connection waited"),
    }
}

/// The write connection and its state, shared by the writer thread and the store's callers.
pub(super) struct Shared {
    /// `None` once the writer has closed the connection.
    core: Mutex<Option<Core>>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared").finish_non_exhaustive()
    }
}

/// What became of a write offered for an inline commit.
pub(super) enum Inline {
    /// Committed (or refused) on the caller's thread: its answer.
    Done(Result<Reply, LedgerError>),
    /// The connection is busy, closed or not open to inline commits yet (a gated writer):
    /// the write, to be queued.
    Busy(OpKind),
}

impl Shared {
    /// Commits `op` at once on the calling thread if nobody else is committing and the writer
    /// is open to inline commits; otherwise hands it back. Never waits for the lock.
    pub(super) fn try_inline(&self, op: OpKind) -> Inline {
        let mut guard = match self.core.try_lock() {
            Ok(guard) => guard,
            Err(TryLockError::Poisoned(poisoned)) => recovered(&self.core, poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => return Inline::Busy(op),
        };
        match guard.as_mut() {
            Some(core) if core.open => Inline::Done(core.commit_inline(&op)),
            _ => Inline::Busy(op),
        }
    }

    /// The connection, waiting for whoever holds it.
    fn lock(&self) -> MutexGuard<'_, Option<Core>> {
        match self.core.lock() {
            Ok(guard) => guard,
            Err(poisoned) => recovered(&self.core, poisoned.into_inner()),
        }
    }
}

/// The connection after a thread panicked while holding it (a bug): whatever transaction it
/// left open is rolled back and the cached chain heads dropped, as after a failed batch.
fn recovered<'a>(
    core: &Mutex<Option<Core>>,
    mut guard: MutexGuard<'a, Option<Core>>,
) -> MutexGuard<'a, Option<Core>> {
    if let Some(core) = guard.as_mut() {
        core.abandon();
    }
    core.clear_poison();
    guard
}

/// A queued write's caller and its answer.
type Answer = (
    oneshot::Sender<Result<Reply, LedgerError>>,
    Result<Reply, LedgerError>,
);

/// The writer thread: the queue it drains.
pub(super) struct Writer {
    rx: mpsc::Receiver<Command>,
    shared: Arc<Shared>,
}

/// The write connection's state.
pub(super) struct Core {
    conn: LiteConn,
    heads: Heads,
    /// Tenants whose head moved in the current batch; written to `audit_heads` with the COMMIT.
    moved_heads: HashSet<String, FastHash>,
    counters: Arc<Counters>,
    /// The file's one-owner lock, released once the connection is closed.
    owner: Option<OwnerLock>,
    /// The keys events are MAC'd with; `None` writes legacy (unkeyed) hashes.
    keys: Option<Arc<dyn AuditKeys>>,
    /// The thread copying the log into the database; `None` if it could not start.
    backfill: Option<Backfill>,
    /// Whether callers may commit inline: not before a gated writer's gate opens.
    open: bool,
}

impl Writer {
    /// The writer of `conn`, draining `rx`, and the connection's handle for inline commits.
    /// With `gated`, nothing commits inline until the writer's gate opens (see `spawn`).
    pub(super) fn new(
        conn: LiteConn,
        rx: mpsc::Receiver<Command>,
        counters: Arc<Counters>,
        owner: OwnerLock,
        keys: Option<Arc<dyn AuditKeys>>,
        backfill: Option<Backfill>,
        gated: bool,
    ) -> (Writer, Arc<Shared>) {
        let core = Core {
            conn,
            heads: Heads::default(),
            moved_heads: HashSet::default(),
            counters,
            owner: Some(owner),
            keys,
            backfill,
            open: !gated,
        };
        let shared = Arc::new(Shared {
            core: Mutex::new(Some(core)),
        });
        (
            Writer {
                rx,
                shared: Arc::clone(&shared),
            },
            shared,
        )
    }

    /// Starts the writer on a thread of its own. With a `gate`, it waits for it before its
    /// first batch.
    pub(super) fn spawn(self, gate: Option<oneshot::Receiver<()>>) -> Result<(), LedgerError> {
        std::thread::Builder::new()
            .name("ledger-writer".to_owned())
            .spawn(move || self.run(gate))
            .map_err(|error| {
                LedgerError::Database(format!("could not start the ledger writer: {error}"))
            })?;
        Ok(())
    }

    /// Runs until every sender is gone or a `Close` arrives, committing every write queued
    /// before that, then closes the connection.
    fn run(mut self, gate: Option<oneshot::Receiver<()>>) {
        if let Some(gate) = gate {
            // A dropped sender opens the gate too.
            let _ = gate.blocking_recv();
            if let Some(core) = self.shared.lock().as_mut() {
                core.open = true;
            }
        }
        let mut closers = Vec::new();
        while let Some(first) = self.rx.blocking_recv() {
            let mut ops = Vec::new();
            let mut next = Some(first);
            while let Some(command) = next.take() {
                match command {
                    Command::Write(op) => ops.push(op),
                    Command::Close(done) => {
                        closers.push(done);
                        // Later sends fail with `Closed`; writes already queued still run.
                        self.rx.close();
                    }
                }
                if ops.len() < MAX_BATCH {
                    next = self.rx.try_recv().ok();
                }
            }
            let (answers, catch_up) = {
                let mut guard = self.shared.lock();
                let Some(core) = guard.as_mut() else {
                    break;
                };
                if !closers.is_empty() {
                    // Closing: later writes fail with `Closed` rather than commit inline.
                    core.open = false;
                }
                if ops.is_empty() {
                    continue;
                }
                core.commit_queued(ops)
            };
            // Answered once the connection is free again: a caller that writes again as soon
            // as it has its answer (the next step of its call) finds nobody committing and
            // commits inline, rather than queueing behind the lock this thread still held.
            for (reply, result) in answers {
                // A caller that stopped waiting (a cancelled request) still had its write done.
                let _ = reply.send(result);
            }
            if catch_up && let Some(core) = self.shared.lock().as_mut() {
                core.catch_up();
            }
        }
        // Every sender is gone, or the queue was closed and drained: the connection is taken
        // out of reach of inline commits, then closed.
        let taken = self.shared.lock().take();
        if let Some(core) = taken {
            core.close();
        }
        for done in closers {
            // The closer may have given up waiting; nothing to do then.
            let _ = done.send(());
        }
    }
}

impl Core {
    /// Commits a caller's write on the caller's own thread (see [`Shared::try_inline`]).
    fn commit_inline(&mut self, op: &OpKind) -> Result<Reply, LedgerError> {
        self.counters.inline.fetch_add(1, Ordering::Relaxed);
        let started = std::time::Instant::now();
        let (mut results, committed) = self.commit_ops(std::slice::from_ref(op));
        self.counters.batch_done(1, started, committed);
        if committed {
            self.after_commit(1);
        }
        results
            .pop()
            .unwrap_or_else(|| Err(LedgerError::Database("the write had no answer".to_owned())))
    }

    /// Commits a batch from the queue: each caller's answer, to be sent once the connection is
    /// free, and whether the log must be copied into the database before the next batch
    /// ([`Core::catch_up`], once the callers have their answers).
    fn commit_queued(&mut self, ops: Vec<WriteOp>) -> (Vec<Answer>, bool) {
        let started = std::time::Instant::now();
        let (kinds, replies): (Vec<OpKind>, Vec<_>) =
            ops.into_iter().map(|op| (op.kind, op.reply)).unzip();
        let (results, committed) = self.commit_ops(&kinds);
        self.counters.batch_done(kinds.len(), started, committed);
        let catch_up = committed && self.must_catch_up(kinds.len());
        (replies.into_iter().zip(results).collect(), catch_up)
    }

    /// Runs `ops` as one batch: every operation's answer, and whether the batch committed.
    fn commit_ops(&mut self, ops: &[OpKind]) -> (Vec<Result<Reply, LedgerError>>, bool) {
        match now(self.run_batch(ops)) {
            Ok(results) => (results, true),
            Err(error) => {
                warn!(%error, ops = ops.len(), "ledger batch failed");
                (ops.iter().map(|_| Err(error.copied())).collect(), false)
            }
        }
    }

    /// Copies what the log holds into the database, empties it and closes the connection,
    /// then releases the file.
    fn close(mut self) {
        // No pass may be running while the last checkpoint runs.
        if let Some(backfill) = &mut self.backfill {
            backfill.stop();
        }
        // What the log holds is copied into the database and the log emptied, so no page an
        // update or delete overwrote stays readable in it after the gateway stops.
        match self.conn.checkpoint() {
            Ok((0, _, _)) => {}
            Ok((_, log, done)) => {
                warn!(
                    log,
                    done, "the write-ahead log could not be truncated: a reader was busy"
                );
            }
            Err(error) => warn!(%error, "checkpointing the write-ahead log failed"),
        }
        if let Err(error) = self.conn.close() {
            warn!(%error, "closing the ledger write connection failed");
        }
        // Released once the connection is closed, so the file can be opened again at once.
        drop(self.owner.take());
    }

    /// Has the log copied into the database when it is due (see `backfill`).
    fn after_commit(&mut self, writes: usize) {
        if self.must_catch_up(writes) {
            self.catch_up();
        }
    }

    /// Tells the backfill how long the log is after a commit of `writes` writes, read on the
    /// committing thread under the lock the commit held (see `backfill`): whether the
    /// committer must copy the log into the database itself.
    fn must_catch_up(&mut self, writes: usize) -> bool {
        backfill::next(self.backfill.as_mut(), backfill::log_frames(), writes) == Next::CatchUp
    }

    /// Copies the log into the database on this thread.
    fn catch_up(&mut self) {
        if let Err(error) = self.conn.backfill() {
            warn!(%error, "copying the write-ahead log into the ledger failed");
        }
    }

    /// Runs every operation and commits. An `Err` fails the whole batch (it was rolled back).
    async fn run_batch(
        &mut self,
        ops: &[OpKind],
    ) -> Result<Vec<Result<Reply, LedgerError>>, LedgerError> {
        self.moved_heads.clear();
        self.begin()?;
        let results = if let [op] = ops {
            // A batch of one operation (most batches under light load) is its own
            // transaction: no savepoint needed (whose sub-journal copies every page the
            // operation changes).
            match self.run_alone(op).await {
                Ok(reply) => vec![Ok(reply)],
                // Refused and rolled back already: nothing to commit.
                Err(Fail::Op(error)) => return Ok(vec![Err(error)]),
                Err(Fail::Fatal(error)) => {
                    self.abandon();
                    return Err(error);
                }
            }
        } else if let Some(results) = self.run_together(ops).await? {
            results
        } else {
            // Rolled back: again, one operation after another, each in its own savepoint.
            self.counters.bulk_fallbacks.fetch_add(1, Ordering::Relaxed);
            self.begin()?;
            let mut results = Vec::with_capacity(ops.len());
            for op in ops {
                match self.run_op(op).await {
                    Ok(reply) => results.push(Ok(reply)),
                    Err(Fail::Op(error)) => results.push(Err(error)),
                    Err(Fail::Fatal(error)) => {
                        self.abandon();
                        return Err(error);
                    }
                }
            }
            results
        };
        if let Err(error) = self.commit().await {
            self.abandon();
            return Err(error);
        }
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        Ok(results)
    }

    /// Opens the batch's transaction.
    fn begin(&mut self) -> Result<(), LedgerError> {
        self.conn.control("BEGIN IMMEDIATE").map_err(|error| {
            self.abandon();
            database_error(&error, format!("could not begin a transaction: {error}"))
        })
    }

    /// The fast way for a batch of several operations: all of them in the batch's transaction,
    /// none in a savepoint. `None` if one was refused: then the transaction has been rolled
    /// back and the chain heads put back, and the batch is to run again the slow way (no
    /// operation has been answered yet). A fatal error has abandoned the transaction.
    async fn run_together(
        &mut self,
        ops: &[OpKind],
    ) -> Result<Option<Vec<Result<Reply, LedgerError>>>, LedgerError> {
        let mut moved = Vec::new();
        let mut replies = Vec::with_capacity(ops.len());
        for op in ops {
            let mut steps = self.steps();
            let result = steps.apply(op).await;
            moved.append(&mut steps.undo);
            match result {
                Ok(reply) => replies.push(Ok(reply)),
                Err(Fail::Op(_)) => {
                    if let Err(error) = self.roll_back_refused(moved) {
                        self.abandon();
                        return Err(error);
                    }
                    return Ok(None);
                }
                Err(Fail::Fatal(error)) => {
                    self.abandon();
                    return Err(error);
                }
            }
        }
        self.keep_heads(moved);
        Ok(Some(replies))
    }

    /// The only operation of its batch, without a savepoint: a refusal rolls the whole
    /// transaction back (and the chain heads it moved) instead.
    async fn run_alone(&mut self, op: &OpKind) -> Result<Reply, Fail> {
        let mut steps = self.steps();
        let result = steps.apply(op).await;
        let undo = steps.undo;
        match result {
            Ok(reply) => {
                self.keep_heads(undo);
                Ok(reply)
            }
            Err(Fail::Op(error)) => {
                self.roll_back_refused(undo).map_err(Fail::Fatal)?;
                Err(Fail::Op(error))
            }
            Err(fatal) => Err(fatal),
        }
    }

    /// Undoes the batch's transaction after a refusal, with the chain heads it moved. An error
    /// is a failed ROLLBACK: the batch's state is then unknown.
    fn roll_back_refused(&mut self, undo: Vec<(String, Head)>) -> Result<(), LedgerError> {
        // SQLite may have rolled the transaction back itself.
        if self.conn.in_transaction() {
            self.conn
                .control("ROLLBACK")
                .map_err(|error| database_error(&error, format!("ROLLBACK failed: {error}")))?;
        }
        self.restore_heads(undo);
        Ok(())
    }

    /// One operation of a larger batch that was refused all together, atomic on its own.
    async fn run_op(&mut self, op: &OpKind) -> Result<Reply, Fail> {
        match op {
            // One write statement, atomic by itself.
            OpKind::CreateRun { .. } | OpKind::PurgeAnswers { .. } => self.steps().apply(op).await,
            // Several statements (a change and its audit events): in a savepoint of their own,
            // with the chain heads they move recorded for the commit.
            _ => self.in_savepoint(op).await,
        }
    }

    fn steps(&mut self) -> Steps<'_, LiteConn> {
        Steps {
            conn: &mut self.conn,
            heads: &mut self.heads,
            keys: self.keys.as_deref(),
            undo: Vec::new(),
            owner: None,
        }
    }

    /// Runs an operation statement by statement inside its own savepoint: a refusal undoes
    /// everything it wrote and leaves the batch's other operations alone.
    async fn in_savepoint(&mut self, op: &OpKind) -> Result<Reply, Fail> {
        self.control("SAVEPOINT op")?;
        let mut steps = self.steps();
        let result = steps.apply(op).await;
        let undo = steps.undo;
        match result {
            Ok(reply) => {
                self.control("RELEASE op")?;
                self.keep_heads(undo);
                Ok(reply)
            }
            Err(Fail::Op(error)) => {
                self.control("ROLLBACK TO op")?;
                self.control("RELEASE op")?;
                self.restore_heads(undo);
                Err(Fail::Op(error))
            }
            Err(fatal) => Err(fatal),
        }
    }

    /// Records the chain heads an operation moved, to be stored at the commit.
    fn keep_heads(&mut self, undo: Vec<(String, Head)>) {
        for (tenant, _) in undo {
            self.moved_heads.insert(tenant);
        }
    }

    /// Puts back the chain heads an undone operation moved, latest first.
    fn restore_heads(&mut self, undo: Vec<(String, Head)>) {
        for (tenant, head) in undo.into_iter().rev() {
            self.heads.insert(tenant, head);
        }
    }

    /// Runs a transaction-control statement; if that fails the batch's state is unknown.
    fn control(&mut self, sql: &'static str) -> Result<(), Fail> {
        self.conn
            .control(sql)
            .map_err(|error| Fail::Fatal(database_error(&error, format!("{sql} failed: {error}"))))
    }

    /// Stores the heads that moved in this batch and commits.
    async fn commit(&mut self) -> Result<(), LedgerError> {
        for tenant in std::mem::take(&mut self.moved_heads) {
            let Some(head) = self.heads.get(&tenant) else {
                continue;
            };
            query(UPSERT_HEAD)
                .bind(tenant.as_str())
                .bind(head.chain_seq)
                .bind(head.hash.as_str())
                .execute(&mut self.conn)
                .await
                .map_err(|error| {
                    database_error(
                        &error,
                        format!("could not store the audit chain head of tenant {tenant}: {error}"),
                    )
                })?;
        }
        self.conn
            .control("COMMIT")
            .map_err(|error| database_error(&error, format!("commit failed: {error}")))
    }

    /// Rolls the open transaction back and forgets cached heads (they may be ahead of the file).
    fn abandon(&mut self) {
        // SQLite may have rolled the transaction back already (a full disk, an I/O error).
        if self.conn.in_transaction()
            && let Err(error) = self.conn.control("ROLLBACK")
        {
            warn!(%error, "rolling back a failed ledger batch failed");
        }
        self.heads.clear();
        self.moved_heads.clear();
    }
}
