//! The single writer task: it owns the write connection, takes whatever writes have queued up
//! and commits them in one transaction (group commit), then answers each caller.
//!
//! Every statement sent to SQLite through sqlx is a round trip to the connection's worker
//! thread, and those thread hand-offs, not SQLite itself, dominate the cost of a write. So the
//! hot operations (`record_call`, `finish_call`, `append_events`) are written in as few round
//! trips as possible, in three tiers:
//!
//! 1. *Bulk* (see `bulk`): when a batch holds several hot operations, all of them are written
//!    together with a few multi-row statements inside one savepoint: one UPDATE finishes every
//!    running call, one INSERT adds every call, one UPDATE counts them on their runs, one
//!    INSERT appends every audit event (chained in batch order from the cached heads).
//! 2. *One round trip per operation*: `SAVEPOINT op; <its inserts and updates>; RELEASE op` as
//!    one multi-statement query. Used for a lone hot operation, and for each hot operation of a
//!    batch whose bulk write was refused.
//! 3. *Step by step* (see `crate::steps`, shared with PostgreSQL): one statement at a time,
//!    looking at each result. Used when the one-round-trip form was refused too.
//!
//! Tiers 1 and 2 assume the common case: a new call within budget, a call that is still
//! running. If any statement refuses (a repeated `tool_use_id`, a used-up budget caught by the
//! `runs_budget` constraint, a missing run), everything since the savepoint is rolled back and
//! the next tier runs, down to step by step, which finds out what happened and answers
//! precisely. Each operation thus stays atomic on its own, and one refused operation never
//! disturbs the others in its batch. A batch's operations are concurrent (every caller
//! waits for the commit), so the writer may order them as it likes: administrative operations
//! first, then the hot ones.
//!
//! Tier 2, and the pairing of control statements (`BEGIN IMMEDIATE; SAVEPOINT bulk`, the head
//! upserts with `COMMIT`), rely on sqlx-sqlite executing every statement of a multi-statement
//! query string, binding positional parameters in order across them. sqlx has marked that
//! deprecated (launchbadge/sqlx#3108); the tests exercise every such shape, so a sqlx upgrade
//! that drops it fails loudly. Tier 3 and the multi-row statements of tier 1 do not need it.
//!
//! The writer caches each tenant's chain head (`chain_seq`, hash). It is the only writer of the
//! database file (one `SqliteStore` per file), so the cache stays true; it is dropped whenever a
//! transaction is rolled back and reloaded lazily from `audit_heads`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use sqlx::sqlite::SqliteConnection;
use sqlx::{Connection, Row, SqlStr};
use tokio::sync::{mpsc, oneshot};
use toolgate_core::AuditKeys;
use tracing::warn;

use crate::chain::GENESIS_HASH;
use crate::error::LedgerError;
use crate::model::RecordOutcome;
use crate::ops::{
    Command, Counters, OpKind, PreparedCall, PreparedEvent, PreparedFinish, Reply, WriteOp,
};
use crate::rows::database_error;
use crate::rows::{Fail, SqlFailure, read_failure};
use crate::sql::Dialect;
use crate::sqlite::bulk::Hot;
use crate::sqlite::owner::OwnerLock;
use crate::sqlite::statements::{
    ChainLink, INSERT_CALL, Shape, SqlQuery, UPSERT_HEAD, bind_call, bind_count_on_run,
    bind_decision, bind_event, bind_finish, bind_pending,
};
use crate::steps::{Conn, Head, Steps};

/// The most operations committed in one transaction. Bounds the latency one batch adds to the
/// callers queued behind it.
const MAX_BATCH: usize = 256;

/// Operations with more audit events than this take the step-by-step path, which keeps the
/// number of distinct multi-statement shapes (each a cached prepared statement) small.
const MAX_FAST_EVENTS: usize = 8;

/// Chain heads written in the COMMIT round trip; more are written one statement each first.
const MAX_HEADS_WITH_COMMIT: usize = 8;

/// Below this many hot operations in a batch, one round trip each is cheaper than the bulk
/// path's fixed cost (a savepoint and one statement per table).
const MIN_BULK: usize = 4;

/// The writer task's state.
pub(super) struct Writer {
    pub(super) conn: SqliteConnection,
    rx: mpsc::Receiver<Command>,
    pub(super) heads: HashMap<String, Head>,
    /// Tenants whose head moved in the current batch; written to `audit_heads` with the COMMIT.
    pub(super) moved_heads: HashSet<String>,
    /// The SQL text of each shape, built once.
    shapes: HashMap<Shape, SqlStr>,
    counters: Arc<Counters>,
    /// The file's one-owner lock, released once the connection is closed.
    owner: Option<OwnerLock>,
    /// The keys events are MAC'd with; `None` writes legacy (unkeyed) hashes.
    pub(super) keys: Option<Arc<dyn AuditKeys>>,
}

impl Writer {
    pub(super) fn new(
        conn: SqliteConnection,
        rx: mpsc::Receiver<Command>,
        counters: Arc<Counters>,
        owner: OwnerLock,
        keys: Option<Arc<dyn AuditKeys>>,
    ) -> Writer {
        Writer {
            conn,
            rx,
            heads: HashMap::new(),
            moved_heads: HashSet::new(),
            shapes: HashMap::new(),
            counters,
            owner: Some(owner),
            keys,
        }
    }

    /// Runs until every sender is gone or a `Close` arrives, committing every write queued
    /// before that, then closes the connection. With a `gate`, waits for it first.
    pub(super) async fn run(mut self, gate: Option<oneshot::Receiver<()>>) {
        if let Some(gate) = gate {
            // A dropped sender opens the gate too.
            let _ = gate.await;
        }
        let mut closers = Vec::new();
        while let Some(first) = self.rx.recv().await {
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
            if !ops.is_empty() {
                self.commit_batch(ops).await;
            }
        }
        // What the log holds is copied into the database and the log emptied, so no page an
        // update or delete overwrote stays readable in it after the gateway stops.
        match sqlx::query_as::<_, (i64, i64, i64)>("PRAGMA wal_checkpoint(TRUNCATE)")
            .fetch_one(&mut self.conn)
            .await
        {
            Ok((0, _, _)) => {}
            Ok((_, log, done)) => {
                warn!(
                    log,
                    done, "the write-ahead log could not be truncated: a reader was busy"
                );
            }
            Err(error) => warn!(%error, "checkpointing the write-ahead log failed"),
        }
        if let Err(error) = self.conn.close().await {
            warn!(%error, "closing the ledger write connection failed");
        }
        // Released before `close` returns, so the file can be opened again at once.
        drop(self.owner.take());
        for done in closers {
            // The closer may have given up waiting; nothing to do then.
            let _ = done.send(());
        }
    }

    async fn commit_batch(&mut self, ops: Vec<WriteOp>) {
        let started = std::time::Instant::now();
        let (kinds, replies): (Vec<OpKind>, Vec<_>) =
            ops.into_iter().map(|op| (op.kind, op.reply)).unzip();
        let (results, committed) = match self.run_batch(&kinds).await {
            Ok(results) => (results, true),
            Err(error) => {
                warn!(%error, ops = kinds.len(), "ledger batch failed");
                (kinds.iter().map(|_| Err(error.copied())).collect(), false)
            }
        };
        self.counters.batch_done(kinds.len(), started, committed);
        for (reply, result) in replies.into_iter().zip(results) {
            // A caller that stopped waiting (a cancelled request) still had its write done.
            let _ = reply.send(result);
        }
    }

    /// Runs every operation and commits. An `Err` fails the whole batch (it was rolled back).
    async fn run_batch(
        &mut self,
        ops: &[OpKind],
    ) -> Result<Vec<Result<Reply, LedgerError>>, LedgerError> {
        self.moved_heads.clear();
        if let [op] = ops
            && let Some(reply) = self.run_solo(op).await
        {
            self.counters.commits.fetch_add(1, Ordering::Relaxed);
            return Ok(vec![Ok(reply)]);
        }
        let plan = Plan::new(ops);
        // With nothing to run before the bulk write, its savepoint opens in the same round trip.
        let bulk_savepoint = plan.bulk() && plan.admin.is_empty();
        let begin = if bulk_savepoint {
            "BEGIN IMMEDIATE; SAVEPOINT bulk"
        } else {
            "BEGIN IMMEDIATE"
        };
        if let Err(error) = execute(&mut self.conn, begin).await {
            self.abandon().await;
            return Err(LedgerError::Database(format!(
                "could not begin a transaction: {error}"
            )));
        }
        let results = match self.run_plan(ops, plan, bulk_savepoint).await {
            Ok(results) => results,
            Err(error) => {
                self.abandon().await;
                return Err(error);
            }
        };
        if let Err(error) = self.commit().await {
            self.abandon().await;
            return Err(error);
        }
        self.counters.commits.fetch_add(1, Ordering::Relaxed);
        Ok(results)
    }

    /// A batch of one hot operation (the common case under light load) as a whole
    /// transaction in a single round trip to SQLite, instead of three (BEGIN, the operation,
    /// COMMIT). `None` when the operation is not eligible or anything was refused: the
    /// transaction has then been rolled back and the batch runs the general way, which
    /// sorts out what happened.
    async fn run_solo(&mut self, op: &OpKind) -> Option<Reply> {
        let events = match op {
            OpKind::RecordCall(prepared) => &prepared.events,
            OpKind::FinishCall(prepared) => &prepared.events,
            OpKind::AppendEvents(events) if !events.is_empty() => events,
            _ => return None,
        };
        if events.len() > MAX_FAST_EVENTS {
            return None;
        }
        let (links, heads) = self.link(events).await.ok()?;
        let head_count = heads.len();
        let result = match op {
            OpKind::RecordCall(prepared) => {
                let count_on_run = prepared.count_against_budget || prepared.pending.is_some();
                let shape = Shape::SoloRecord {
                    count_on_run,
                    decision: prepared.decision.is_some(),
                    pending: prepared.pending.is_some(),
                    events: prepared.events.len(),
                    heads: head_count,
                };
                let mut query = bind_call(sqlx::query(self.shape(shape)), prepared);
                if count_on_run {
                    query = bind_count_on_run(query, prepared);
                }
                if let Some(decision) = &prepared.decision {
                    query = bind_decision(query, decision);
                }
                if let Some(pending) = &prepared.pending {
                    query = bind_pending(query, pending);
                }
                for (event, link) in prepared.events.iter().zip(&links) {
                    query = bind_event(query, event, link);
                }
                query = bind_heads(query, &heads);
                query
                    .execute(&mut self.conn)
                    .await
                    .map(|_| (Reply::Recorded(Box::new(RecordOutcome::Recorded)), true))
            }
            OpKind::FinishCall(prepared) => {
                let shape = Shape::SoloFinish {
                    events: prepared.events.len(),
                    heads: head_count,
                };
                let mut query = bind_finish(sqlx::query(self.shape(shape)), prepared);
                for (event, link) in prepared.events.iter().zip(&links) {
                    query = bind_event(query, event, link);
                }
                query = bind_heads(query, &heads);
                // The UPDATE returns the finished call's row; nothing else returns rows.
                match query.fetch_all(&mut self.conn).await {
                    Ok(rows) if rows.len() == 1 => Ok((Reply::Finished(true), true)),
                    Ok(rows) if rows.is_empty() => Ok((Reply::Finished(false), false)),
                    Ok(_) => Err(sqlx::Error::Protocol(
                        "finishing one call changed several rows".into(),
                    )),
                    Err(error) => Err(error),
                }
            }
            OpKind::AppendEvents(events) => {
                let shape = Shape::SoloAppend {
                    events: events.len(),
                    heads: head_count,
                };
                let mut query = sqlx::query(self.shape(shape));
                for (event, link) in events.iter().zip(&links) {
                    query = bind_event(query, event, link);
                }
                query = bind_heads(query, &heads);
                query
                    .execute(&mut self.conn)
                    .await
                    .map(|_| (Reply::Done, true))
            }
            _ => return None,
        };
        match result {
            Ok((reply, moved)) => {
                if moved {
                    // The heads were written in the same transaction.
                    for (tenant, head) in heads {
                        self.heads.insert(tenant, head);
                    }
                }
                Some(reply)
            }
            Err(_) => {
                // Where it failed is unknown (a constraint, or BEGIN/COMMIT themselves), so the
                // whole transaction goes and the general path runs the operation again.
                self.abandon().await;
                None
            }
        }
    }

    /// Runs the batch's operations inside its open transaction: administrative ones first, then
    /// the hot ones in bulk (or one by one).
    async fn run_plan(
        &mut self,
        ops: &[OpKind],
        plan: Plan<'_>,
        bulk_savepoint: bool,
    ) -> Result<Vec<Result<Reply, LedgerError>>, LedgerError> {
        let mut results: Vec<Option<Result<Reply, LedgerError>>> = Vec::new();
        results.resize_with(ops.len(), || None);
        for &index in &plan.admin {
            results[index] = Some(answer(self.run_op(&ops[index]).await)?);
        }

        let mut one_by_one = plan.later.clone();
        let written = if plan.bulk() {
            let hot: Vec<Hot<'_>> = plan.hot.iter().map(|(_, op)| *op).collect();
            let written = self.bulk(&hot, bulk_savepoint).await.map_err(fatal)?;
            if written.is_none() {
                self.counters.bulk_fallbacks.fetch_add(1, Ordering::Relaxed);
            }
            written
        } else {
            None
        };
        match written {
            Some(replies) => {
                for ((index, _), reply) in plan.hot.iter().zip(replies) {
                    results[*index] = Some(Ok(reply));
                }
            }
            None => one_by_one.extend(plan.hot.iter().map(|(index, _)| *index)),
        }
        one_by_one.sort_unstable();
        for index in one_by_one {
            results[index] = Some(answer(self.run_op(&ops[index]).await)?);
        }
        Ok(results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| {
                    Err(LedgerError::Database(
                        "internal: an operation was left unanswered".into(),
                    ))
                })
            })
            .collect())
    }

    /// One operation: in one round trip if it is a hot one, else (or if that is refused) step
    /// by step.
    async fn run_op(&mut self, op: &OpKind) -> Result<Reply, Fail> {
        let done = match op {
            OpKind::RecordCall(prepared) => self.record_call_in_one_trip(prepared).await?,
            OpKind::FinishCall(prepared) => self.finish_call_in_one_trip(prepared).await?,
            OpKind::AppendEvents(events) => self.append_events_in_one_trip(events).await?,
            // Several statements and audit events: atomic in their own savepoint, with the
            // chain heads they move recorded for the commit.
            OpKind::ResolvePending(_) | OpKind::AddPending(_) | OpKind::RetryCall { .. } => {
                return self.step_by_step(op).await;
            }
            // One write statement, atomic by itself.
            OpKind::CreateRun { .. } | OpKind::PurgeAnswers { .. } => {
                let mut steps = self.steps();
                return steps.apply(op).await;
            }
            // Administrative operations: the change and its audit event, atomic together in
            // their own savepoint.
            _ => return self.step_by_step(op).await,
        };
        if let Some(reply) = done {
            return Ok(reply);
        }
        self.counters.step_by_step.fetch_add(1, Ordering::Relaxed);
        self.step_by_step(op).await
    }

    fn steps(&mut self) -> Steps<'_, SqliteConnection> {
        Steps {
            conn: &mut self.conn,
            heads: &mut self.heads,
            keys: self.keys.as_deref(),
            undo: Vec::new(),
            owner: None,
        }
    }

    /// Runs an operation statement by statement inside its own savepoint.
    async fn step_by_step(&mut self, op: &OpKind) -> Result<Reply, Fail> {
        self.control("SAVEPOINT op").await?;
        let mut steps = self.steps();
        let result = steps.apply(op).await;
        let undo = steps.undo;
        match result {
            Ok(reply) => {
                self.control("RELEASE op").await?;
                for (tenant, _) in undo {
                    self.moved_heads.insert(tenant);
                }
                Ok(reply)
            }
            Err(Fail::Op(error)) => {
                self.control("ROLLBACK TO op; RELEASE op").await?;
                for (tenant, head) in undo.into_iter().rev() {
                    self.heads.insert(tenant, head);
                }
                Err(Fail::Op(error))
            }
            Err(fatal) => Err(fatal),
        }
    }

    /// `record_call` in one round trip; `None` when it was refused and rolled back.
    async fn record_call_in_one_trip(
        &mut self,
        prepared: &PreparedCall,
    ) -> Result<Option<Reply>, Fail> {
        if prepared.events.len() > MAX_FAST_EVENTS {
            return Ok(None);
        }
        let (links, heads) = self.link(&prepared.events).await?;
        let count_on_run = prepared.count_against_budget || prepared.pending.is_some();
        let shape = Shape::Record {
            count_on_run,
            decision: prepared.decision.is_some(),
            pending: prepared.pending.is_some(),
            events: prepared.events.len(),
        };
        let mut query = bind_call(sqlx::query(self.shape(shape)), prepared);
        if count_on_run {
            query = bind_count_on_run(query, prepared);
        }
        if let Some(decision) = &prepared.decision {
            query = bind_decision(query, decision);
        }
        if let Some(pending) = &prepared.pending {
            query = bind_pending(query, pending);
        }
        for (event, link) in prepared.events.iter().zip(&links) {
            query = bind_event(query, event, link);
        }
        match query.execute(&mut self.conn).await {
            Ok(_) => {
                self.advance(heads);
                Ok(Some(Reply::Recorded(Box::new(RecordOutcome::Recorded))))
            }
            Err(error) => self.roll_back_op(&error).await.map(|()| None),
        }
    }

    /// `finish_call` in one round trip. The events are inserted only if the UPDATE changed the
    /// call (`WHERE changes() = 1`), so a call that is not running gets no events.
    async fn finish_call_in_one_trip(
        &mut self,
        prepared: &PreparedFinish,
    ) -> Result<Option<Reply>, Fail> {
        if prepared.events.len() > MAX_FAST_EVENTS {
            return Ok(None);
        }
        let (links, heads) = self.link(&prepared.events).await?;
        let shape = Shape::Finish {
            events: prepared.events.len(),
        };
        let mut query = bind_finish(sqlx::query(self.shape(shape)), prepared);
        for (event, link) in prepared.events.iter().zip(&links) {
            query = bind_event(query, event, link);
        }
        match query.fetch_all(&mut self.conn).await {
            // The UPDATE returns the finished call's row; the inserts return nothing.
            Ok(rows) => match rows.len() {
                0 => Ok(Some(Reply::Finished(false))),
                1 => {
                    self.advance(heads);
                    Ok(Some(Reply::Finished(true)))
                }
                n => Err(Fail::Fatal(LedgerError::Database(format!(
                    "internal: finishing one call changed {n} rows"
                )))),
            },
            Err(error) => self.roll_back_op(&error).await.map(|()| None),
        }
    }

    /// `append_events` in one round trip; `None` when it was refused and rolled back.
    async fn append_events_in_one_trip(
        &mut self,
        events: &[PreparedEvent],
    ) -> Result<Option<Reply>, Fail> {
        if events.is_empty() {
            return Ok(Some(Reply::Done));
        }
        if events.len() > MAX_FAST_EVENTS {
            return Ok(None);
        }
        let (links, heads) = self.link(events).await?;
        let shape = Shape::Append {
            events: events.len(),
        };
        let mut query = sqlx::query(self.shape(shape));
        for (event, link) in events.iter().zip(&links) {
            query = bind_event(query, event, link);
        }
        match query.execute(&mut self.conn).await {
            Ok(_) => {
                self.advance(heads);
                Ok(Some(Reply::Done))
            }
            Err(error) => self.roll_back_op(&error).await.map(|()| None),
        }
    }

    /// The chain position and hash of each event, as if all of them are appended in order,
    /// and the chain heads after them. Nothing changes until [`Writer::advance`] is called with
    /// those heads, once the events are written.
    async fn link(
        &mut self,
        events: &[PreparedEvent],
    ) -> Result<(Vec<ChainLink>, HashMap<String, Head>), Fail> {
        let mut heads = HashMap::new();
        let mut links = Vec::with_capacity(events.len());
        for event in events {
            links.push(self.next_link(&mut heads, event).await?);
        }
        Ok((links, heads))
    }

    /// The next position in `event`'s chain: after the events already linked but not yet
    /// written (`heads`), else after the cached head.
    pub(super) async fn next_link(
        &mut self,
        heads: &mut HashMap<String, Head>,
        event: &PreparedEvent,
    ) -> Result<ChainLink, Fail> {
        let previous = match heads.get(&event.tenant) {
            Some(head) => head.clone(),
            None => load_head(&mut self.conn, &mut self.heads, &event.tenant).await?,
        };
        let chain_seq = previous.chain_seq + 1;
        let (key_id, hash) = crate::chain::new_link(
            self.keys.as_deref(),
            &previous.hash,
            &event.fields(chain_seq),
        )
        .map_err(Fail::Fatal)?;
        heads.insert(
            event.tenant.clone(),
            Head {
                chain_seq,
                hash: hash.clone(),
            },
        );
        Ok(ChainLink {
            chain_seq,
            prev_hash: previous.hash,
            key_id,
            hash,
        })
    }

    /// Moves the cached heads past events that are now written.
    pub(super) fn advance(&mut self, heads: HashMap<String, Head>) {
        for (tenant, head) in heads {
            self.moved_heads.insert(tenant.clone());
            self.heads.insert(tenant, head);
        }
    }

    /// Undoes a refused one-round-trip operation. Constraint failures undo only their own
    /// statement, so rolling back to the savepoint removes the operation's earlier statements.
    async fn roll_back_op(&mut self, error: &sqlx::Error) -> Result<(), Fail> {
        if let SqlFailure::Fatal(message) = SqlFailure::classify(error) {
            return Err(Fail::Fatal(LedgerError::Database(message)));
        }
        self.control("ROLLBACK TO op; RELEASE op").await
    }

    /// The cached SQL text of a shape.
    pub(super) fn shape(&mut self, shape: Shape) -> SqlStr {
        self.shapes
            .entry(shape)
            .or_insert_with(|| shape.sql())
            .clone()
    }

    /// Runs a transaction-control statement; if that fails the batch's state is unknown.
    pub(super) async fn control(&mut self, sql: &'static str) -> Result<(), Fail> {
        execute(&mut self.conn, sql)
            .await
            .map_err(|error| Fail::Fatal(database_error(&error, format!("{sql} failed: {error}"))))
    }

    /// Stores the heads that moved in this batch and commits, in one round trip when few
    /// chains moved.
    async fn commit(&mut self) -> Result<(), LedgerError> {
        let moved: Vec<(String, Head)> = std::mem::take(&mut self.moved_heads)
            .into_iter()
            .filter_map(|tenant| {
                let head = self.heads.get(&tenant)?.clone();
                Some((tenant, head))
            })
            .collect();
        let (separately, with_commit) =
            moved.split_at(moved.len().saturating_sub(MAX_HEADS_WITH_COMMIT));
        for (tenant, head) in separately {
            let upsert = sqlx::query(UPSERT_HEAD)
                .bind(tenant.clone())
                .bind(head.chain_seq)
                .bind(head.hash.clone());
            upsert.execute(&mut self.conn).await.map_err(|error| {
                database_error(
                    &error,
                    format!("could not store the audit chain head of tenant {tenant}: {error}"),
                )
            })?;
        }
        let shape = Shape::Commit {
            heads: with_commit.len(),
        };
        let mut query = sqlx::query(self.shape(shape));
        for (tenant, head) in with_commit {
            query = query
                .bind(tenant.clone())
                .bind(head.chain_seq)
                .bind(head.hash.clone());
        }
        query
            .execute(&mut self.conn)
            .await
            .map_err(|error| database_error(&error, format!("commit failed: {error}")))?;
        Ok(())
    }

    /// Rolls the open transaction back and forgets cached heads (they may be ahead of the file).
    async fn abandon(&mut self) {
        // Fails harmlessly when SQLite has already rolled the transaction back.
        let _ = execute(&mut self.conn, "ROLLBACK").await;
        self.heads.clear();
        self.moved_heads.clear();
    }
}

async fn execute(conn: &mut SqliteConnection, sql: &'static str) -> Result<(), sqlx::Error> {
    sqlx::query(sql).execute(conn).await.map(|_| ())
}

impl Conn for SqliteConnection {
    type Row = sqlx::sqlite::SqliteRow;
    type Db<'c> = &'c mut SqliteConnection;
    const DIALECT: Dialect = Dialect::Sqlite;

    fn db(&mut self) -> &mut SqliteConnection {
        self
    }

    /// The writer is the file's only writer: its cached head is the chain's, loaded lazily.
    async fn head(
        &mut self,
        heads: &mut HashMap<String, Head>,
        tenant: &str,
    ) -> Result<Head, Fail> {
        load_head(self, heads, tenant).await
    }

    /// The statement the writer's fast paths use too; a repeated key fails it (the failed
    /// statement alone is undone).
    async fn insert_call(
        &mut self,
        prepared: &PreparedCall,
        _owner: Option<i64>,
    ) -> Result<bool, sqlx::Error> {
        bind_call(sqlx::query(INSERT_CALL), prepared)
            .execute(&mut *self)
            .await
            .map(|_| true)
    }

    async fn recover(&mut self) -> Result<(), Fail> {
        Ok(())
    }
}

/// The cached head of a tenant's chain, loaded from `audit_heads` on first use.
async fn load_head(
    conn: &mut SqliteConnection,
    heads: &mut HashMap<String, Head>,
    tenant: &str,
) -> Result<Head, Fail> {
    if let Some(head) = heads.get(tenant) {
        return Ok(head.clone());
    }
    let row = sqlx::query("SELECT chain_seq, hash FROM audit_heads WHERE tenant = ?")
        .bind(tenant.to_owned())
        .fetch_optional(&mut *conn)
        .await
        .map_err(read_failure)?;
    let head = match row {
        Some(row) => Head {
            chain_seq: row.try_get("chain_seq").map_err(read_failure)?,
            hash: row.try_get("hash").map_err(read_failure)?,
        },
        None => {
            let orphan = sqlx::query("SELECT 1 FROM audit_events WHERE tenant = ? LIMIT 1")
                .bind(tenant.to_owned())
                .fetch_optional(&mut *conn)
                .await
                .map_err(read_failure)?;
            if orphan.is_some() {
                // Appending would fork the chain; refuse until someone looks at it.
                return Err(Fail::Op(LedgerError::Corrupt(format!(
                    "the audit chain of tenant {tenant} has events but no head record; run verify"
                ))));
            }
            Head {
                chain_seq: 0,
                hash: GENESIS_HASH.to_owned(),
            }
        }
    };
    heads.insert(tenant.to_owned(), head.clone());
    Ok(head)
}

/// How a batch's operations are run, by index into the batch.
#[derive(Debug)]
struct Plan<'a> {
    /// Administrative operations, run first, one by one.
    admin: Vec<usize>,
    /// Hot operations, written in bulk when there are enough of them.
    hot: Vec<(usize, Hot<'a>)>,
    /// Hot operations that must run one by one after the bulk write.
    later: Vec<usize>,
}

impl Plan<'_> {
    fn new(ops: &[OpKind]) -> Plan<'_> {
        let mut plan = Plan {
            admin: Vec::new(),
            hot: Vec::new(),
            later: Vec::new(),
        };
        let mut finishing: HashSet<&str> = HashSet::new();
        for (index, op) in ops.iter().enumerate() {
            match op {
                OpKind::RecordCall(prepared) => plan.hot.push((index, Hot::Record(prepared))),
                OpKind::AppendEvents(events) => plan.hot.push((index, Hot::Append(events))),
                OpKind::FinishCall(prepared) => {
                    // Two finishes of one call id must not both see it finished: only the
                    // first goes in bulk, the other runs after it.
                    if finishing.insert(prepared.finish.id.as_str()) {
                        plan.hot.push((index, Hot::Finish(prepared)));
                    } else {
                        plan.later.push(index);
                    }
                }
                _ => plan.admin.push(index),
            }
        }
        plan
    }

    fn bulk(&self) -> bool {
        self.hot.len() >= MIN_BULK
    }
}

/// An operation's answer, or the failure of its whole batch.
fn answer(result: Result<Reply, Fail>) -> Result<Result<Reply, LedgerError>, LedgerError> {
    match result {
        Ok(reply) => Ok(Ok(reply)),
        Err(Fail::Op(error)) => Ok(Err(error)),
        Err(Fail::Fatal(error)) => Err(error),
    }
}

/// The failure of a whole batch.
fn fatal(fail: Fail) -> LedgerError {
    match fail {
        Fail::Op(error) | Fail::Fatal(error) => error,
    }
}

/// Binds the chain heads of a solo transaction, in the order its upserts expect.
fn bind_heads(mut query: SqlQuery, heads: &HashMap<String, Head>) -> SqlQuery {
    for (tenant, head) in heads {
        query = query
            .bind(tenant.clone())
            .bind(head.chain_seq)
            .bind(head.hash.clone());
    }
    query
}
