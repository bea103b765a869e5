//! The PostgreSQL writer task: group commit, as on SQLite, with chain heads that other
//! replicas may move too: cached optimistically, checked in the database on every commit.
//!
//! The fast path, when every operation of a batch is a call, a finish or an append: all of
//! them are one statement (`BULK`: data-modifying CTEs over arrays, so its text, and its
//! prepared statement, is the same for any batch size) in its own implicit transaction, one
//! round trip. It chains events from the heads this writer last saw committed (cached) and
//! moves each head only if it is still there (`WHERE chain_seq = <previous>`); if another
//! replica moved it meanwhile, or anything else is refused (a repeated `tool_use_id`, a used-up
//! budget, a call no longer running), `toolgate_check` or a constraint aborts the statement,
//! nothing is written, and the batch runs the slow way:
//!
//! 1. `BEGIN`, then lock and read the heads of every tenant the batch appends to, in tenant
//!    order (`SELECT ... ORDER BY tenant FOR UPDATE`), so batches of different replicas never
//!    wait on each other in a cycle;
//! 2. each operation in its own savepoint, statement by statement (see `crate::steps`), so a refused
//!    operation rolls back alone and gets a precise answer;
//! 3. the heads that moved are written, with a notification, and the batch commits.
//!
//! Either way a tenant's events commit in chain order: a batch only appends after the head it
//! read, and only commits if that head is still current.
//!
//! A batch that hits a deadlock or serialization failure before its COMMIT was sent is run
//! again (nothing of it was committed). A failure during COMMIT is not retried: the outcome is
//! unknown, so the callers get the error.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{AssertSqlSafe, ConnectOptions, Connection, Row, SqlSafeStr, SqlStr};
use tokio::sync::mpsc;
use toolgate_core::AuditKeys;
use tracing::warn;

use crate::error::LedgerError;
use crate::model::RecordOutcome;
use crate::ops::{Command, Counters, OpKind, PreparedEvent, Reply, WriteOp};
use crate::rows::{Fail, SqlFailure, database_error};
use crate::sql::{Dialect, query};
use crate::steps::{Conn, Head, Heads, SqlConn, Steps, bind_call_row, call_row_columns};

/// The most operations committed in one transaction.
const MAX_BATCH: usize = 512;
/// How often a batch is run again after a deadlock or serialization failure.
const MAX_RETRIES: u32 = 5;

pub(super) struct Writer {
    conn: Option<PgConnection>,
    options: PgConnectOptions,
    rx: mpsc::Receiver<Command>,
    counters: Arc<Counters>,
    instance: i64,
    /// Where commits with events are announced.
    channel: String,
    /// Where commits that change configuration are announced.
    config_channel: String,
    /// The chain heads as this writer last saw them committed. Only a hint: another replica
    /// may have moved a head since, which the fast path detects (and then this is reloaded).
    heads: Heads,
    /// The text of each variant of the one-statement batch, built once.
    statements: HashMap<Parts, SqlStr>,
    /// The keys events are MAC'd with; `None` writes legacy (unkeyed) hashes.
    keys: Option<Arc<dyn AuditKeys>>,
}

/// Why a batch failed as a whole.
enum BatchError {
    /// Nothing was committed and running it again may succeed.
    Retry(LedgerError),
    /// The batch failed (or its outcome is unknown); every caller gets this error.
    Failed(LedgerError),
}

/// What `PgStore::connect` hands its writer: the writer's whole state but its caches.
pub(super) struct WriterSetup {
    /// The writer's own connection.
    pub(super) conn: PgConnection,
    /// How to connect again after losing it.
    pub(super) options: PgConnectOptions,
    /// The store's queue of writes.
    pub(super) rx: mpsc::Receiver<Command>,
    /// The store's counters.
    pub(super) counters: Arc<Counters>,
    /// This store's instance key (its advisory lock).
    pub(super) instance: i64,
    /// The channel notified at each commit of events.
    pub(super) channel: String,
    /// The channel notified at each configuration change.
    pub(super) config_channel: String,
    /// The keys events are MAC'd with; `None` writes legacy (unkeyed) hashes.
    pub(super) keys: Option<Arc<dyn AuditKeys>>,
}

impl Writer {
    pub(super) fn new(setup: WriterSetup) -> Writer {
        let WriterSetup {
            conn,
            options,
            rx,
            counters,
            instance,
            channel,
            config_channel,
            keys,
        } = setup;
        Writer {
            conn: Some(conn),
            options,
            rx,
            counters,
            instance,
            channel,
            config_channel,
            heads: Heads::default(),
            statements: HashMap::new(),
            keys,
        }
    }

    pub(super) async fn run(mut self) {
        let mut closers = Vec::new();
        while let Some(first) = self.rx.recv().await {
            let mut ops = Vec::new();
            let mut next = Some(first);
            while let Some(command) = next.take() {
                match command {
                    Command::Write(op) => ops.push(op),
                    Command::Close(done) => {
                        closers.push(done);
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
        if let Some(conn) = self.conn.take()
            && let Err(error) = conn.close().await
        {
            warn!(%error, "closing the ledger write connection failed");
        }
        for done in closers {
            let _ = done.send(());
        }
    }

    async fn commit_batch(&mut self, ops: Vec<WriteOp>) {
        let started = std::time::Instant::now();
        let (kinds, replies): (Vec<OpKind>, Vec<_>) =
            ops.into_iter().map(|op| (op.kind, op.reply)).unzip();
        let mut attempt = 0;
        let (results, committed) = loop {
            match self.run_batch(&kinds).await {
                Ok(results) => break (results, true),
                Err(BatchError::Retry(error)) if attempt < MAX_RETRIES => {
                    attempt += 1;
                    warn!(%error, attempt, "ledger batch conflicted; running it again");
                }
                Err(BatchError::Retry(error) | BatchError::Failed(error)) => {
                    warn!(%error, ops = kinds.len(), "ledger batch failed");
                    break (kinds.iter().map(|_| Err(error.copied())).collect(), false);
                }
            }
        };
        self.counters.batch_done(kinds.len(), started, committed);
        for (reply, result) in replies.into_iter().zip(results) {
            let _ = reply.send(result);
        }
    }

    async fn connection(&mut self) -> Result<&mut PgConnection, BatchError> {
        if self.conn.is_none() {
            let conn = self.options.connect().await.map_err(|error| {
                BatchError::Failed(database_error(
                    &error,
                    format!("could not reconnect to PostgreSQL: {error}"),
                ))
            })?;
            self.conn = Some(conn);
        }
        self.conn.as_mut().ok_or_else(|| {
            BatchError::Failed(LedgerError::Database("internal: no connection".into()))
        })
    }

    async fn run_batch(
        &mut self,
        ops: &[OpKind],
    ) -> Result<Vec<Result<Reply, LedgerError>>, BatchError> {
        let tenants = chain_tenants(ops);
        if fast_eligible(ops) {
            let heads = self.cached_heads(&tenants).await?;
            match self.bulk(ops, heads).await {
                Ok(Some((replies, moved))) => {
                    self.counters.commits.fetch_add(1, Ordering::Relaxed);
                    self.heads.extend(moved);
                    return Ok(replies.into_iter().map(Ok).collect());
                }
                Ok(None) => {
                    // Refused as a whole (a conflict, a constraint): nothing was written.
                    self.counters.bulk_fallbacks.fetch_add(1, Ordering::Relaxed);
                    self.forget_heads(&tenants);
                }
                Err(error) => {
                    self.forget_heads(&tenants);
                    return Err(error);
                }
            }
        }
        let heads = self.begin(&tenants).await?;
        match self.slow(ops, heads).await {
            Ok((results, heads)) => {
                self.commit().await?;
                // Locked and moved by this transaction: current as of its commit.
                self.heads.extend(heads);
                Ok(results)
            }
            Err(error) => {
                self.rollback().await?;
                self.forget_heads(&tenants);
                Err(error)
            }
        }
    }

    /// The cached heads of `tenants`, loading the ones not cached (without locking them).
    async fn cached_heads(&mut self, tenants: &[String]) -> Result<Heads, BatchError> {
        let missing: Vec<String> = tenants
            .iter()
            .filter(|tenant| !self.heads.contains_key(*tenant))
            .cloned()
            .collect();
        if !missing.is_empty() {
            let conn = self.connection().await?;
            let rows = sqlx::query(
                "SELECT tenant, chain_seq, hash FROM audit_heads WHERE tenant = ANY($1)",
            )
            .bind(&missing)
            .fetch_all(&mut *conn)
            .await;
            let rows = match rows {
                Ok(rows) => rows,
                Err(error) => return Err(self.classify(&error, "reading the audit chain heads")),
            };
            for row in rows {
                let tenant: String = row.try_get("tenant").map_err(decode)?;
                let chain_seq: i64 = row.try_get("chain_seq").map_err(decode)?;
                let hash: String = row.try_get("hash").map_err(decode)?;
                self.heads.insert(tenant, Head { chain_seq, hash });
            }
        }
        Ok(tenants
            .iter()
            .filter_map(|tenant| {
                self.heads
                    .get(tenant)
                    .map(|head| (tenant.clone(), head.clone()))
            })
            .collect())
    }

    fn forget_heads(&mut self, tenants: &[String]) {
        for tenant in tenants {
            self.heads.remove(tenant);
        }
    }

    /// Opens the transaction and locks the heads of `tenants` (sorted).
    async fn begin(&mut self, tenants: &[String]) -> Result<Heads, BatchError> {
        let conn = self.connection().await?;
        if let Err(error) = sqlx::raw_sql("BEGIN").execute(&mut *conn).await {
            return Err(self.lost(&error, "BEGIN"));
        }
        let conn = self.connection().await?;
        let rows = sqlx::query(
            "SELECT tenant, chain_seq, hash FROM audit_heads WHERE tenant = ANY($1) \
             ORDER BY tenant FOR UPDATE",
        )
        .bind(tenants)
        .fetch_all(&mut *conn)
        .await;
        let rows = match rows {
            Ok(rows) => rows,
            Err(error) => {
                let failure = self.classify(&error, "locking the audit chain heads");
                self.rollback().await?;
                return Err(failure);
            }
        };
        let mut heads = Heads::with_capacity_and_hasher(rows.len(), Default::default());
        for row in rows {
            let tenant: String = row.try_get("tenant").map_err(decode)?;
            let chain_seq: i64 = row.try_get("chain_seq").map_err(decode)?;
            let hash: String = row.try_get("hash").map_err(decode)?;
            heads.insert(tenant, Head { chain_seq, hash });
        }
        Ok(heads)
    }

    async fn commit(&mut self) -> Result<(), BatchError> {
        let conn = self.connection().await?;
        match sqlx::raw_sql("COMMIT").execute(&mut *conn).await {
            Ok(_) => {
                self.counters.commits.fetch_add(1, Ordering::Relaxed);
                Ok(())
            }
            Err(error) => {
                // Whether it committed is unknown: never run the batch again.
                let message = format!("COMMIT failed, outcome unknown: {error}");
                self.conn = None;
                Err(BatchError::Failed(database_error(&error, message)))
            }
        }
    }

    async fn rollback(&mut self) -> Result<(), BatchError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(());
        };
        if sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.is_err() {
            // The connection is unusable; the server drops the transaction with it.
            self.conn = None;
        }
        Ok(())
    }

    /// A control statement failed: the connection is suspect, drop it. Nothing committed.
    fn lost(&mut self, error: &sqlx::Error, what: &str) -> BatchError {
        self.conn = None;
        BatchError::Retry(database_error(error, format!("{what} failed: {error}")))
    }

    fn classify(&mut self, error: &sqlx::Error, what: &str) -> BatchError {
        let failed = database_error(error, format!("{what}: {error}"));
        if retryable(error) {
            return BatchError::Retry(failed);
        }
        if !matches!(error, sqlx::Error::Database(_)) {
            self.conn = None;
            return BatchError::Retry(failed);
        }
        BatchError::Failed(failed)
    }

    /// The fast path; `None` when the statement was refused or did not apply everywhere (the
    /// transaction must then be rolled back).
    async fn bulk(
        &mut self,
        ops: &[OpKind],
        mut heads: Heads,
    ) -> Result<Option<(Vec<Reply>, Heads)>, BatchError> {
        let before = heads.clone();
        let mut arrays = Bulk::default();
        let mut replies = Vec::with_capacity(ops.len());
        for op in ops {
            let events = match op {
                OpKind::RecordCall(prepared) => {
                    arrays.call(prepared, self.instance);
                    replies.push(Reply::Recorded(Box::new(RecordOutcome::Recorded)));
                    &prepared.events
                }
                OpKind::FinishCall(prepared) => {
                    arrays.finish(prepared);
                    replies.push(Reply::Finished(true));
                    &prepared.events
                }
                OpKind::AppendEvents(events) => {
                    replies.push(Reply::Done);
                    events
                }
                _ => return Ok(None),
            };
            for event in events {
                let linked =
                    link(&mut heads, event, self.keys.as_deref()).map_err(BatchError::Failed)?;
                let Some(link) = linked else {
                    // No head: no such tenant. The slow path says so precisely.
                    return Ok(None);
                };
                arrays.event(event, link);
            }
        }
        let moved: Vec<(&String, &Head)> = heads
            .iter()
            .filter(|(tenant, _)| arrays.event_tenants.contains(*tenant))
            .collect();
        // Each moved head is updated only if it is still where this batch's chain starts.
        let previous: Vec<i64> = moved
            .iter()
            .map(|(tenant, _)| before.get(*tenant).map_or(-1, |head| head.chain_seq))
            .collect();
        let finishes = i64::try_from(arrays.finish_id.len()).unwrap_or(i64::MAX);
        // Bound after the statement's other parameters ($74 to $81).
        let finish_answer = std::mem::take(&mut arrays.finish_answer);
        let finish_answer_expires = std::mem::take(&mut arrays.finish_answer_expires);
        let pending_timeout = std::mem::take(&mut arrays.pending_timeout);
        let event_key_id = std::mem::take(&mut arrays.event_key_id);
        let event_binding = std::mem::take(&mut arrays.event_binding);
        let pending_sealed = std::mem::take(&mut arrays.pending_arguments_sealed);
        let pending_key_ids = std::mem::take(&mut arrays.pending_arguments_key_id);
        let pending_trace_parents = std::mem::take(&mut arrays.pending_trace_parent);
        let head_count = i64::try_from(moved.len()).unwrap_or(i64::MAX);
        let sql = self
            .statements
            .entry(arrays.parts())
            .or_insert_with_key(|parts| parts.sql())
            .clone();
        let query = arrays.bind(sqlx::query(sql)).bind(finishes);
        let query = query
            .bind(
                moved
                    .iter()
                    .map(|(tenant, _)| (*tenant).clone())
                    .collect::<Vec<_>>(),
            )
            .bind(
                moved
                    .iter()
                    .map(|(_, head)| head.chain_seq)
                    .collect::<Vec<_>>(),
            )
            .bind(
                moved
                    .iter()
                    .map(|(_, head)| head.hash.clone())
                    .collect::<Vec<_>>(),
            )
            .bind(self.channel.clone())
            .bind(previous)
            .bind(finish_answer)
            .bind(finish_answer_expires)
            .bind(pending_timeout)
            .bind(event_key_id)
            .bind(event_binding)
            .bind(pending_sealed)
            .bind(pending_key_ids)
            .bind(pending_trace_parents);
        let moved: Heads = moved
            .into_iter()
            .map(|(tenant, head)| (tenant.clone(), head.clone()))
            .collect();
        let conn = self.connection().await?;
        // One statement in its own implicit transaction: it commits (durably) as a whole, or,
        // refused, writes nothing.
        match query.fetch_one(&mut *conn).await {
            Ok(row) => {
                let finished: i64 = row.try_get("finished").map_err(decode)?;
                let heads_moved: i64 = row.try_get("heads").map_err(decode)?;
                if finished == finishes && heads_moved == head_count {
                    Ok(Some((replies, moved)))
                } else {
                    // toolgate_check() refuses such a statement; reaching this is a bug.
                    Err(BatchError::Failed(LedgerError::Database(format!(
                        "internal: a batch committed with {finished} of {finishes} finishes and \
                         {heads_moved} of {head_count} chain heads"
                    ))))
                }
            }
            // Refused by the database (a conflict with another replica, a constraint, the
            // check): rolled back, so the slow path may run the batch.
            Err(error) if refused(&error) => Ok(None),
            // Anything else (a lost connection): whether it committed is unknown, so it is not
            // run again.
            Err(error) => {
                self.conn = None;
                Err(BatchError::Failed(LedgerError::Database(format!(
                    "writing a batch failed, outcome unknown: {error}"
                ))))
            }
        }
    }

    /// The slow path: every operation in its own savepoint, then the heads that moved.
    async fn slow(
        &mut self,
        ops: &[OpKind],
        mut heads: Heads,
    ) -> Result<(Vec<Result<Reply, LedgerError>>, Heads), BatchError> {
        let mut results = Vec::with_capacity(ops.len());
        let mut moved: HashSet<String> = HashSet::new();
        let mut config_changed = false;
        let instance = self.instance;
        let keys = self.keys.clone();
        for op in ops {
            if matches!(
                op,
                OpKind::RecordCall(_) | OpKind::FinishCall(_) | OpKind::AppendEvents(_)
            ) {
                self.counters.step_by_step.fetch_add(1, Ordering::Relaxed);
            }
            self.control("SAVEPOINT op").await?;
            let conn = self.connection().await?;
            let mut steps = Steps {
                conn,
                heads: &mut heads,
                keys: keys.as_deref(),
                undo: Vec::new(),
                owner: Some(instance),
            };
            let result = steps.apply(op).await;
            let undo = steps.undo;
            match result {
                Ok(reply) => {
                    self.control("RELEASE SAVEPOINT op").await?;
                    config_changed |= changes_configuration(op);
                    moved.extend(undo.into_iter().map(|(tenant, _)| tenant));
                    results.push(Ok(reply));
                }
                Err(Fail::Op(error)) => {
                    self.control("ROLLBACK TO SAVEPOINT op").await?;
                    for (tenant, head) in undo.into_iter().rev() {
                        heads.insert(tenant, head);
                    }
                    results.push(Err(error));
                }
                Err(Fail::Fatal(error)) => {
                    return Err(match error {
                        LedgerError::Database(message) | LedgerError::Unavailable(message)
                            if is_conflict_message(&message) =>
                        {
                            BatchError::Retry(LedgerError::Unavailable(message))
                        }
                        other => BatchError::Failed(other),
                    });
                }
            }
        }
        if !moved.is_empty() {
            let moved: Vec<(String, Head)> = moved
                .into_iter()
                .filter_map(|tenant| heads.get(&tenant).cloned().map(|head| (tenant, head)))
                .collect();
            let channel = self.channel.clone();
            let conn = self.connection().await?;
            let written = sqlx::query(MOVE_HEADS)
                .bind(
                    moved
                        .iter()
                        .map(|(tenant, _)| tenant.clone())
                        .collect::<Vec<_>>(),
                )
                .bind(
                    moved
                        .iter()
                        .map(|(_, head)| head.chain_seq)
                        .collect::<Vec<_>>(),
                )
                .bind(
                    moved
                        .iter()
                        .map(|(_, head)| head.hash.clone())
                        .collect::<Vec<_>>(),
                )
                .bind(channel)
                .fetch_one(&mut *conn)
                .await;
            match written {
                Ok(row) => {
                    let count: i64 = row.try_get("heads").map_err(decode)?;
                    if count != i64::try_from(moved.len()).unwrap_or(i64::MAX) {
                        return Err(BatchError::Failed(LedgerError::Corrupt(
                            "an audit chain head vanished during a batch".into(),
                        )));
                    }
                }
                Err(error) => return Err(self.classify(&error, "moving the audit chain heads")),
            }
        }
        if config_changed {
            let config = self.config_channel.clone();
            let conn = self.connection().await?;
            let notified = sqlx::query("SELECT pg_notify($1, '')")
                .bind(config)
                .execute(&mut *conn)
                .await;
            if let Err(error) = notified {
                return Err(self.classify(&error, "announcing a configuration change"));
            }
        }
        Ok((results, heads))
    }

    async fn control(&mut self, sql: &'static str) -> Result<(), BatchError> {
        let conn = self.connection().await?;
        match sqlx::raw_sql(sql).execute(&mut *conn).await {
            Ok(_) => Ok(()),
            Err(error) => Err(self.classify(&error, sql)),
        }
    }
}

/// Where an event goes in its chain.
#[derive(Clone, Debug)]
struct Link {
    chain_seq: i64,
    prev_hash: String,
    hash: String,
    /// The master key id whose chain key MAC'd the event; `None` for a legacy hash.
    key_id: Option<String>,
    /// The event's binding; never with a legacy hash, which would not cover it.
    binding: Option<String>,
}

/// The next link of `event`'s chain after `heads`, moving the head, MAC'd with `keys` (the
/// legacy hash without). `Ok(None)` when the batch has no head for that tenant (it has none:
/// the tenant does not exist).
fn link(
    heads: &mut Heads,
    event: &PreparedEvent,
    keys: Option<&dyn AuditKeys>,
) -> Result<Option<Link>, LedgerError> {
    let Some(head) = heads.get_mut(&event.tenant) else {
        return Ok(None);
    };
    let chain_seq = head.chain_seq + 1;
    let (key_id, hash) = crate::chain::new_link(keys, &head.hash, &event.fields(chain_seq))?;
    let prev_hash = std::mem::replace(&mut head.hash, hash.clone());
    head.chain_seq = chain_seq;
    Ok(Some(Link {
        chain_seq,
        prev_hash,
        binding: key_id.as_ref().and(event.binding.clone()),
        key_id,
        hash,
    }))
}

/// The call row with its owner. `ON CONFLICT DO NOTHING`: a repeated `tool_use_id` is found
/// without aborting the transaction.
const INSERT_CALL: &str = concat!(
    "INSERT INTO tool_calls (",
    call_row_columns!(),
    ", owner) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, \
     $17, $18, $19, $20, $21) ON CONFLICT DO NOTHING RETURNING seq"
);

impl SqlConn for PgConnection {
    type Row = sqlx::postgres::PgRow;
    type Db<'c> = &'c mut PgConnection;
    const DIALECT: Dialect = Dialect::Postgres;

    fn db(&mut self) -> &mut PgConnection {
        self
    }
}

impl Conn for PgConnection {
    /// The batch locked the heads of every chain it appends to; heads exist from a tenant's
    /// creation on, so a missing one means no tenant.
    async fn head(&mut self, heads: &mut Heads, tenant: &str) -> Result<Head, Fail> {
        heads
            .get(tenant)
            .cloned()
            .ok_or_else(|| Fail::Op(LedgerError::NotFound(format!("tenant {tenant}"))))
    }

    async fn insert_call(
        &mut self,
        prepared: &crate::ops::PreparedCall,
        owner: Option<i64>,
    ) -> Result<bool, sqlx::Error> {
        let row = bind_call_row(query(INSERT_CALL), prepared)
            .bind(owner)
            .fetch_optional(&mut *self)
            .await?;
        Ok(row.is_some())
    }

    /// A failed statement aborts the transaction up to the savepoint `op`; the writer rolls
    /// back to it again on any failure, which is harmless.
    async fn recover(&mut self) -> Result<(), Fail> {
        sqlx::raw_sql("ROLLBACK TO SAVEPOINT op")
            .execute(&mut *self)
            .await
            .map(|_| ())
            .map_err(|error| Fail::Fatal(LedgerError::Database(error.to_string())))
    }
}

/// Whether other replicas must drop what they cache after this operation commits.
fn changes_configuration(op: &OpKind) -> bool {
    matches!(
        op,
        OpKind::SetFlag { .. }
            | OpKind::PutPolicySet { .. }
            | OpKind::PutPermission(..)
            | OpKind::RevokeToken { .. }
            | OpKind::PutCredential(_)
            | OpKind::DeleteCredential { .. }
            | OpKind::ReplaceSealed { .. }
    )
}

/// Tenants whose chains a batch appends to, sorted (the order their heads are locked in).
fn chain_tenants(ops: &[OpKind]) -> Vec<String> {
    let mut tenants = BTreeSet::new();
    for op in ops {
        let events: &[PreparedEvent] = match op {
            OpKind::RecordCall(prepared) | OpKind::RetryCall { prepared, .. } => {
                // A call blocked for its budget gets a `tool_call.blocked` event.
                tenants.insert(prepared.call.tenant.as_str().to_owned());
                &prepared.events
            }
            OpKind::FinishCall(prepared) => &prepared.events,
            OpKind::AppendEvents(events) => events,
            OpKind::ResolvePending(resolution) => &resolution.1,
            OpKind::AddPending(pending) => &pending.1,
            OpKind::Console(op) => op.events(),
            // An administrative change's event (a new tenant's head is created, and so held,
            // by the batch itself).
            _ => {
                if let Some(event) = op.admin_event() {
                    tenants.insert(event.chain().to_owned());
                }
                &[]
            }
        };
        tenants.extend(events.iter().map(|event| event.tenant.clone()));
    }
    tenants.into_iter().collect()
}

/// Whether a batch can take the fast path: only calls, finishes and appends, and no call
/// finished twice (the second must see the first). A call is never recorded and finished in
/// one batch: its recorder is answered only after the commit, and nothing finishes a call
/// before that.
fn fast_eligible(ops: &[OpKind]) -> bool {
    let mut finishing = HashSet::new();
    ops.iter().all(|op| match op {
        OpKind::RecordCall(_) | OpKind::AppendEvents(_) => true,
        OpKind::FinishCall(prepared) => finishing.insert(prepared.finish.id.as_str()),
        _ => false,
    })
}

/// Deadlocks and serialization failures: the transaction was rolled back, try again.
fn retryable(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => is_conflict_code(db.code().as_deref()),
        _ => false,
    }
}

fn is_conflict_code(code: Option<&str>) -> bool {
    matches!(code, Some("40P01" | "40001"))
}

/// The database refused a statement (its transaction is rolled back), as opposed to the
/// connection failing, after which nobody knows whether it committed.
fn refused(error: &sqlx::Error) -> bool {
    match error {
        sqlx::Error::Database(db) => {
            retryable(error)
                || db.code().as_deref() == Some(CONFLICT_CODE)
                || !matches!(SqlFailure::classify(error), SqlFailure::Fatal(_))
        }
        _ => false,
    }
}

/// What `toolgate_check` raises when a fast batch's chain heads moved under it.
const CONFLICT_CODE: &str = "40001";

fn is_conflict_message(message: &str) -> bool {
    message.contains("deadlock detected") || message.contains("could not serialize")
}

fn decode(error: sqlx::Error) -> BatchError {
    BatchError::Failed(LedgerError::Corrupt(error.to_string()))
}

/// Moves the heads that a slow batch moved and notifies listeners (delivered at commit).
const MOVE_HEADS: &str = "WITH h AS (UPDATE audit_heads SET chain_seq = y.chain_seq, \
     hash = y.hash FROM UNNEST($1::text[], $2::bigint[], $3::text[]) AS y(tenant, chain_seq, hash) \
     WHERE audit_heads.tenant = y.tenant RETURNING 1) \
     SELECT (SELECT count(*) FROM h) AS heads, pg_notify($4, '') IS NULL AS notified";

/// Every call, finish and append of a fast batch in one statement. Sub-statements of one
/// statement see the same snapshot and their foreign keys are checked at its end, so a call
/// and its run count, pending invocation and events can all go in together. Parameters are
/// numbered the same in every variant (`Bulk::bind` binds $1 to $67, `bulk` the rest); a
/// variant leaves out the parts its batch does not have, because planning and running empty
/// parts is most of the cost of a small batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
struct Parts {
    calls: bool,
    counts: bool,
    decisions: bool,
    pending: bool,
    finishes: bool,
    events: bool,
}

impl Parts {
    fn sql(self) -> SqlStr {
        let mut ctes: Vec<&str> = Vec::new();
        if self.calls {
            ctes.push(
                "c AS (INSERT INTO tool_calls (id, tenant, run, agent, tool, action, tool_use_id, \
                 correlation_id, status, args_hash, input_redacted, output_redacted, error_code, \
                 error_text, policy_decision_id, risk_level, duration_ms, attempts, created_at, \
                 updated_at, owner) \
                 SELECT u.*, $21::bigint FROM UNNEST($1::text[], $2::text[], $3::text[], \
                 $4::text[], $5::text[], $6::text[], $7::text[], $8::text[], $9::text[], \
                 $10::text[], $11::text[], $12::text[], $13::text[], $14::text[], $15::text[], \
                 $16::text[], $17::bigint[], $18::bigint[], $19::bigint[], $20::bigint[]) AS u \
                 RETURNING 1)",
            );
            // A call that runs is in flight from the same statement on.
            ctes.push(
                "i AS (INSERT INTO calls_in_flight (owner, call_id) \
                 SELECT $21::bigint, u.id FROM UNNEST($1::text[], $9::text[]) AS u(id, status) \
                 WHERE u.status = 'running' RETURNING 1)",
            );
        }
        if self.counts {
            ctes.push(
                "r AS (UPDATE runs SET calls_used = runs.calls_used + a.used, \
                 pending_approvals = runs.pending_approvals + a.pending, \
                 status = CASE WHEN a.pending > 0 THEN 'waiting_approval' ELSE runs.status END \
                 FROM (SELECT x.t, x.r, SUM(x.u)::bigint AS used, SUM(x.p)::bigint AS pending \
                 FROM UNNEST($22::text[], $23::text[], $24::bigint[], $25::bigint[]) \
                 AS x(t, r, u, p) GROUP BY x.t, x.r) AS a \
                 WHERE runs.tenant = a.t AND runs.id = a.r RETURNING 1)",
            );
        }
        if self.decisions {
            ctes.push(
                "d AS (INSERT INTO policy_decisions (id, tenant, tool_call_id, tool, decision, \
                 risk, policy_ids, policy_version, created_at) \
                 SELECT * FROM UNNEST($26::text[], $27::text[], $28::text[], $29::text[], \
                 $30::text[], $31::text[], $32::text[], $33::bigint[], $34::bigint[]) RETURNING 1)",
            );
        }
        if self.pending {
            ctes.push(
                "p AS (INSERT INTO pending_invocations (id, tenant, run, tool_call_id, tool, \
                 arguments, args_hash, manifest, policy_version, origin, decision, state, \
                 version, expires_at, created_at, timeout_ms, arguments_sealed, arguments_key_id, \
                 trace_parent) \
                 SELECT * FROM UNNEST($35::text[], $36::text[], $37::text[], $38::text[], \
                 $39::text[], $40::text[], $41::text[], $42::text[], $43::bigint[], $44::text[], \
                 $45::text[], $46::text[], $47::bigint[], $48::bigint[], $49::bigint[], \
                 $76::bigint[], $79::text[], $80::text[], $81::text[]) \
                 RETURNING 1)",
            );
        }
        // The primary key finds each call.
        let finished = if self.finishes {
            ctes.push(
                "f AS (UPDATE tool_calls SET status = v.status, output_redacted = v.output, \
                 error_code = v.code, error_text = v.text, duration_ms = v.duration, \
                 attempts = v.attempts, updated_at = v.at \
                 FROM UNNEST($50::text[], $51::text[], $52::text[], $53::text[], $54::text[], \
                 $55::text[], $56::bigint[], $57::bigint[], $58::bigint[], $74::text[], \
                 $75::bigint[]) \
                 AS v(id, tenant, status, output, code, text, duration, attempts, at, answer, \
                 answer_expires) \
                 WHERE tool_calls.id = v.id AND tool_calls.tenant = v.tenant \
                 AND tool_calls.status = 'running' \
                 RETURNING tool_calls.id, tool_calls.tenant, tool_calls.owner, v.answer, \
                 v.answer_expires)",
            );
            // No indexed column of `tool_calls` changes above (so the update can be HOT): the
            // call leaves the calls in flight and its sealed answer goes into its own table.
            ctes.push(
                "fi AS (DELETE FROM calls_in_flight USING f \
                 WHERE calls_in_flight.owner = f.owner AND calls_in_flight.call_id = f.id \
                 RETURNING 1)",
            );
            ctes.push(
                "fa AS (INSERT INTO call_answers (call_id, tenant, sealed, expires_at) \
                 SELECT f.id, f.tenant, f.answer, f.answer_expires FROM f \
                 WHERE f.answer IS NOT NULL RETURNING 1)",
            );
            "(SELECT count(*) FROM f)"
        } else {
            "0::bigint"
        };
        let heads = if self.events {
            ctes.push(
                "e AS (INSERT INTO audit_events (tenant, chain_seq, kind, run, tool_call_id, \
                 payload, at, prev_hash, hash, key_id, binding) \
                 SELECT w.tenant, w.chain_seq, w.kind, w.run, w.tool_call_id, w.payload, w.at, \
                 w.prev_hash, w.hash, w.key_id, w.binding \
                 FROM UNNEST($59::text[], $60::bigint[], $61::text[], $62::text[], $63::text[], \
                 $64::text[], $65::bigint[], $66::text[], $67::text[], $77::text[], \
                 $78::text[]) WITH ORDINALITY \
                 AS w(tenant, chain_seq, kind, run, tool_call_id, payload, at, prev_hash, hash, \
                 key_id, binding, ord) ORDER BY w.ord RETURNING 1)",
            );
            ctes.push(
                "h AS (UPDATE audit_heads SET chain_seq = y.chain_seq, hash = y.hash \
                 FROM UNNEST($69::text[], $70::bigint[], $71::text[], $73::bigint[]) \
                 AS y(tenant, chain_seq, hash, previous) \
                 WHERE audit_heads.tenant = y.tenant AND audit_heads.chain_seq = y.previous \
                 RETURNING 1)",
            );
            "(SELECT count(*) FROM h)"
        } else {
            "0::bigint"
        };
        let mut text = String::from("WITH ");
        for cte in &ctes {
            text.push_str(cte);
            text.push_str(", ");
        }
        text.push_str(&format!(
            "n AS (SELECT {finished} AS finished, {heads} AS heads) \
             SELECT n.finished, n.heads, \
             toolgate_check(n.finished = $68 AND n.heads = cardinality($69::text[]), \
             'the batch conflicted with another writer') AS checked, \
             pg_notify($72, '') IS NULL AS notified FROM n"
        ));
        AssertSqlSafe(Arc::<str>::from(text)).into_sql_str()
    }
}

/// The columns of a fast batch, one array per column.
#[derive(Default)]
struct Bulk {
    call_id: Vec<String>,
    call_tenant: Vec<String>,
    call_run: Vec<String>,
    call_agent: Vec<String>,
    call_tool: Vec<String>,
    call_action: Vec<Option<String>>,
    call_tool_use_id: Vec<Option<String>>,
    call_correlation: Vec<String>,
    call_status: Vec<String>,
    call_args_hash: Vec<String>,
    call_input: Vec<String>,
    call_output: Vec<Option<String>>,
    call_error_code: Vec<Option<String>>,
    call_error_text: Vec<Option<String>>,
    call_decision: Vec<Option<String>>,
    call_risk: Vec<Option<String>>,
    call_duration: Vec<Option<i64>>,
    call_attempts: Vec<i64>,
    call_created: Vec<i64>,
    call_updated: Vec<i64>,
    owner: i64,
    count_tenant: Vec<String>,
    count_run: Vec<String>,
    count_used: Vec<i64>,
    count_pending: Vec<i64>,
    decision_id: Vec<String>,
    decision_tenant: Vec<String>,
    decision_call: Vec<String>,
    decision_tool: Vec<String>,
    decision_decision: Vec<String>,
    decision_risk: Vec<String>,
    decision_policy_ids: Vec<String>,
    decision_version: Vec<i64>,
    decision_created: Vec<i64>,
    pending_id: Vec<String>,
    pending_tenant: Vec<String>,
    pending_run: Vec<String>,
    pending_call: Vec<String>,
    pending_tool: Vec<String>,
    pending_arguments: Vec<Option<String>>,
    pending_args_hash: Vec<String>,
    pending_manifest: Vec<String>,
    pending_policy_version: Vec<i64>,
    pending_origin: Vec<String>,
    pending_decision: Vec<String>,
    pending_state: Vec<String>,
    pending_version: Vec<i64>,
    pending_expires: Vec<i64>,
    pending_created: Vec<i64>,
    /// Bound last ($76): it came after the other parameters were numbered.
    pending_timeout: Vec<Option<i64>>,
    /// Bound last ($79, $80, $81).
    pending_arguments_sealed: Vec<Option<String>>,
    pending_arguments_key_id: Vec<Option<String>>,
    pending_trace_parent: Vec<Option<String>>,
    finish_id: Vec<String>,
    finish_tenant: Vec<String>,
    finish_status: Vec<String>,
    finish_output: Vec<Option<String>>,
    finish_code: Vec<Option<String>>,
    finish_text: Vec<Option<String>>,
    finish_duration: Vec<i64>,
    finish_attempts: Vec<i64>,
    finish_at: Vec<i64>,
    finish_answer: Vec<Option<String>>,
    finish_answer_expires: Vec<Option<i64>>,
    event_tenant: Vec<String>,
    event_chain_seq: Vec<i64>,
    event_kind: Vec<String>,
    event_run: Vec<Option<String>>,
    event_call: Vec<Option<String>>,
    event_payload: Vec<String>,
    event_at: Vec<i64>,
    event_prev: Vec<String>,
    event_hash: Vec<String>,
    /// Bound last ($77, $78).
    event_key_id: Vec<Option<String>>,
    event_binding: Vec<Option<String>>,
    event_tenants: HashSet<String>,
}

impl Bulk {
    /// Which parts of the statement this batch needs.
    fn parts(&self) -> Parts {
        Parts {
            calls: !self.call_id.is_empty(),
            counts: !self.count_run.is_empty(),
            decisions: !self.decision_id.is_empty(),
            pending: !self.pending_id.is_empty(),
            finishes: !self.finish_id.is_empty(),
            events: !self.event_tenant.is_empty(),
        }
    }

    fn call(&mut self, prepared: &crate::ops::PreparedCall, owner: i64) {
        let call = &prepared.call;
        self.owner = owner;
        self.call_id.push(call.id.as_str().to_owned());
        self.call_tenant.push(call.tenant.as_str().to_owned());
        self.call_run.push(call.run.as_str().to_owned());
        self.call_agent.push(call.agent.as_str().to_owned());
        self.call_tool.push(call.tool.clone());
        self.call_action.push(call.action.clone());
        self.call_tool_use_id
            .push(call.tool_use_id.as_ref().map(|id| id.as_str().to_owned()));
        self.call_correlation
            .push(call.correlation_id.as_str().to_owned());
        self.call_status.push(call.status.as_str().to_owned());
        self.call_args_hash.push(call.args_hash.clone());
        self.call_input.push(prepared.input.clone());
        self.call_output.push(prepared.output.clone());
        self.call_error_code
            .push(call.error_code.map(|code| code.as_str().to_owned()));
        self.call_error_text.push(call.error_text.clone());
        self.call_decision.push(call.policy_decision_id.clone());
        self.call_risk
            .push(call.risk_level.map(|risk| risk.as_str().to_owned()));
        self.call_duration.push(call.duration_ms);
        self.call_attempts.push(call.attempts);
        self.call_created.push(call.created_at.0);
        self.call_updated.push(call.updated_at.0);
        if prepared.count_against_budget || prepared.pending.is_some() {
            self.count_tenant.push(call.tenant.as_str().to_owned());
            self.count_run.push(call.run.as_str().to_owned());
            self.count_used
                .push(i64::from(prepared.count_against_budget));
            self.count_pending
                .push(i64::from(prepared.pending.is_some()));
        }
        if let Some((decision, policy_ids)) = &prepared.decision {
            self.decision_id.push(decision.id.clone());
            self.decision_tenant
                .push(decision.tenant.as_str().to_owned());
            self.decision_call
                .push(decision.tool_call_id.as_str().to_owned());
            self.decision_tool.push(decision.tool.as_str().to_owned());
            self.decision_decision
                .push(decision.decision.as_str().to_owned());
            self.decision_risk.push(decision.risk.as_str().to_owned());
            self.decision_policy_ids.push(policy_ids.clone());
            self.decision_version.push(decision.policy_version);
            self.decision_created.push(decision.created_at.0);
        }
        if let Some(pending) = &prepared.pending {
            let record = &pending.record;
            self.pending_id.push(record.id.clone());
            self.pending_tenant.push(record.tenant.as_str().to_owned());
            self.pending_run.push(record.run.as_str().to_owned());
            self.pending_call
                .push(record.tool_call_id.as_str().to_owned());
            self.pending_tool.push(record.tool.as_str().to_owned());
            self.pending_arguments.push(pending.arguments.clone());
            self.pending_args_hash.push(record.args_hash.clone());
            self.pending_manifest.push(pending.manifest.clone());
            self.pending_policy_version.push(record.policy_version);
            self.pending_origin.push(record.origin.as_str().to_owned());
            self.pending_decision
                .push(record.decision.as_str().to_owned());
            self.pending_state.push(record.state.as_str().to_owned());
            self.pending_version.push(record.version);
            self.pending_expires.push(record.expires_at.0);
            self.pending_created.push(record.created_at.0);
            self.pending_timeout.push(pending.timeout_ms);
            self.pending_arguments_sealed
                .push(pending.arguments_sealed.clone());
            self.pending_arguments_key_id
                .push(pending.arguments_key_id.clone());
            self.pending_trace_parent.push(record.trace_parent.clone());
        }
    }

    fn finish(&mut self, prepared: &crate::ops::PreparedFinish) {
        let finish = &prepared.finish;
        self.finish_id.push(finish.id.as_str().to_owned());
        self.finish_tenant.push(finish.tenant.as_str().to_owned());
        self.finish_status.push(finish.status.as_str().to_owned());
        self.finish_output.push(prepared.output.clone());
        self.finish_code
            .push(finish.error_code.map(|code| code.as_str().to_owned()));
        self.finish_text.push(finish.error_text.clone());
        self.finish_duration.push(finish.duration_ms);
        self.finish_attempts.push(finish.attempts);
        self.finish_at.push(finish.at.0);
        self.finish_answer.push(prepared.answer.clone());
        self.finish_answer_expires.push(prepared.answer_expires_at);
    }

    fn event(&mut self, event: &PreparedEvent, link: Link) {
        self.event_tenants.insert(event.tenant.clone());
        self.event_tenant.push(event.tenant.clone());
        self.event_chain_seq.push(link.chain_seq);
        self.event_kind.push(event.kind.clone());
        self.event_run.push(event.run.clone());
        self.event_call.push(event.tool_call_id.clone());
        self.event_payload.push(event.payload.clone());
        self.event_at.push(event.at);
        self.event_prev.push(link.prev_hash);
        self.event_hash.push(link.hash);
        self.event_key_id.push(link.key_id);
        self.event_binding.push(link.binding);
    }

    /// Binds parameters $1 to $67 in order.
    fn bind(
        self,
        query: sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> sqlx::query::Query<'static, sqlx::Postgres, sqlx::postgres::PgArguments> {
        query
            .bind(self.call_id)
            .bind(self.call_tenant)
            .bind(self.call_run)
            .bind(self.call_agent)
            .bind(self.call_tool)
            .bind(self.call_action)
            .bind(self.call_tool_use_id)
            .bind(self.call_correlation)
            .bind(self.call_status)
            .bind(self.call_args_hash)
            .bind(self.call_input)
            .bind(self.call_output)
            .bind(self.call_error_code)
            .bind(self.call_error_text)
            .bind(self.call_decision)
            .bind(self.call_risk)
            .bind(self.call_duration)
            .bind(self.call_attempts)
            .bind(self.call_created)
            .bind(self.call_updated)
            .bind(self.owner)
            .bind(self.count_tenant)
            .bind(self.count_run)
            .bind(self.count_used)
            .bind(self.count_pending)
            .bind(self.decision_id)
            .bind(self.decision_tenant)
            .bind(self.decision_call)
            .bind(self.decision_tool)
            .bind(self.decision_decision)
            .bind(self.decision_risk)
            .bind(self.decision_policy_ids)
            .bind(self.decision_version)
            .bind(self.decision_created)
            .bind(self.pending_id)
            .bind(self.pending_tenant)
            .bind(self.pending_run)
            .bind(self.pending_call)
            .bind(self.pending_tool)
            .bind(self.pending_arguments)
            .bind(self.pending_args_hash)
            .bind(self.pending_manifest)
            .bind(self.pending_policy_version)
            .bind(self.pending_origin)
            .bind(self.pending_decision)
            .bind(self.pending_state)
            .bind(self.pending_version)
            .bind(self.pending_expires)
            .bind(self.pending_created)
            .bind(self.finish_id)
            .bind(self.finish_tenant)
            .bind(self.finish_status)
            .bind(self.finish_output)
            .bind(self.finish_code)
            .bind(self.finish_text)
            .bind(self.finish_duration)
            .bind(self.finish_attempts)
            .bind(self.finish_at)
            .bind(self.event_tenant)
            .bind(self.event_chain_seq)
            .bind(self.event_kind)
            .bind(self.event_run)
            .bind(self.event_call)
            .bind(self.event_payload)
            .bind(self.event_at)
            .bind(self.event_prev)
            .bind(self.event_hash)
    }
}
