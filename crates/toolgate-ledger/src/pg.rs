//! The PostgreSQL ledger, for several gateway replicas sharing one database.
//!
//! Same interface and behaviour as the SQLite store, with what sharing needs:
//!
//! - **Writes**: one writer task per process does group commit, like SQLite: whatever has
//!   queued is committed in one transaction. A batch of calls, finishes and appends is one
//!   statement (data-modifying CTEs over arrays) committing by itself: one round trip however
//!   many operations it holds. Anything else, or a batch that statement refuses, runs operation
//!   by operation, each in its own savepoint (see `crate::steps`).
//! - **Audit chains across replicas**: one hash chain per tenant, as on SQLite. The one-statement
//!   batch chains from the heads its writer last saw and moves each head only if it has not
//!   moved since (checked in the statement, which otherwise aborts); the slow path locks the
//!   heads (`SELECT ... FOR UPDATE`, in tenant order, so two batches never wait on each other in
//!   a cycle). Either way `chain_seq` order is commit order, which keeps WatchRun's cursor
//!   exact. The cost is that replicas appending to one busy tenant conflict and fall back to
//!   taking turns.
//! - **Claims** are the conditional `UPDATE ... WHERE version = $observed AND state =
//!   'pending'`: PostgreSQL's row lock makes a concurrent claim wait and then re-check the row,
//!   so of any number of deciders on any number of replicas exactly one changes it.
//! - **Liveness**: each store has a random instance key and holds a session-level advisory lock
//!   on it for as long as it is open. Calls it records or resumes carry that key; a `running`
//!   call whose owner's lock can be taken belongs to a process that is gone, and only those are
//!   reported by `list_running_calls`. The connection holding the lock is checked every
//!   second (`liveness`); while it is lost, the store records no new `running` call and no
//!   approval claim (`LedgerError::NotLive`), and takes the lock again on a new connection
//!   under the same key.
//! - **Fan-out**: every batch that appends events also notifies the schema's channel (see
//!   `events_channel`; delivered at commit); each store listens and ticks
//!   [`Store::subscribe_commits`], so watchers on every replica re-read the ledger at once.

mod liveness;
mod writer;

#[cfg(all(test, feature = "postgres-tests"))]
mod tests;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection as _};
use tokio::sync::{mpsc, oneshot, watch};
use toolgate_core::AuditKeys;
use tracing::warn;

use crate::LedgerObserver;
use crate::backend::{Backend, record_legacy_heads};
use crate::error::LedgerError;
use crate::model::{ToolCallRecord, VerifyReport};
use crate::ops::{Command, Counters, OpKind, Reply, WriteOp, WriterStats};
use crate::rows::{call_columns, call_from_row, read_error};
use crate::sql::Dialect;
use crate::verify::VerifyWith;
use liveness::Liveness;
use writer::{Writer, WriterSetup};

/// The schema, embedded at compile time.
static MIGRATOR: Migrator = sqlx::migrate!("../../migrations/postgres");

/// The channel every commit with audit events notifies: `toolgate_events`, or for a store in
/// its own schema `toolgate_events_` and a hash of the schema name (channels are database-wide,
/// so deployments in other schemas must not wake this one's watchers; the hash keeps the name
/// within PostgreSQL's 63 bytes).
fn events_channel(schema: Option<&str>) -> String {
    channel("toolgate_events", schema)
}

/// The channel commits that change configuration (flags, grants, policies, tokens, credentials)
/// notify, named like [`events_channel`]: other replicas drop their caches of it at once.
fn config_channel(schema: Option<&str>) -> String {
    channel("toolgate_config", schema)
}

fn channel(prefix: &str, schema: Option<&str>) -> String {
    use sha2::Digest as _;
    match schema {
        None => prefix.to_owned(),
        Some(schema) => {
            let digest = sha2::Sha256::digest(schema.as_bytes());
            format!("{prefix}_{}", toolgate_core::hex::encode(&digest[..8]))
        }
    }
}
/// Writes waiting for the writer before callers wait to enqueue (backpressure).
const QUEUE_CAPACITY: usize = 4096;
/// Connections for reads.
const READ_CONNECTIONS: u32 = 8;
/// How long to wait for a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where a [`PgStore`] keeps its tables.
#[derive(Clone, Debug)]
pub struct PgOptions {
    /// `postgres://user@host:port/database` (any libpq-style URL sqlx accepts).
    pub url: String,
    /// The schema for every table, created if missing; `None` uses the connection's default
    /// (`public`). Lets several deployments, or test runs, share one database.
    pub schema: Option<String>,
}

/// The PostgreSQL implementation of [`Store`].
#[derive(Debug)]
pub struct PgStore {
    writer: mpsc::Sender<Command>,
    pool: PgPool,
    counters: Arc<Counters>,
    instance: i64,
    /// Holds this instance's advisory lock while the store is open, and says whether it does.
    liveness: Liveness,
    commits: watch::Receiver<u64>,
    config_changes: watch::Receiver<u64>,
    listener: tokio::task::JoinHandle<()>,
    /// The audit chain's keys: new events are MAC'd with them and verification checks them.
    keys: Option<Arc<dyn AuditKeys>>,
    /// Whether this store's open applied the keyed chain's migration.
    keyed_upgrade: bool,
}

impl PgStore {
    /// Connects, creates the schema if needed, applies pending migrations (replicas starting
    /// together take turns on sqlx's migration lock) and starts the writer and the listener.
    ///
    /// Without keys the audit events it writes carry legacy (unkeyed) hashes; the gateway
    /// connects with [`PgStore::connect_keyed`].
    pub async fn connect(options: &PgOptions) -> Result<PgStore, LedgerError> {
        PgStore::connect_with(options, None).await
    }

    /// Like [`PgStore::connect`], with the keys new audit events are MAC'd with (and
    /// verification checks them against).
    pub async fn connect_keyed(
        options: &PgOptions,
        keys: Arc<dyn AuditKeys>,
    ) -> Result<PgStore, LedgerError> {
        let store = PgStore::connect_with(options, Some(keys)).await?;
        if store.keyed_upgrade {
            record_legacy_heads(&store).await?;
        }
        Ok(store)
    }

    async fn connect_with(
        options: &PgOptions,
        keys: Option<Arc<dyn AuditKeys>>,
    ) -> Result<PgStore, LedgerError> {
        let base: PgConnectOptions = options
            .url
            .parse()
            .map_err(|error| LedgerError::Database(format!("invalid PostgreSQL URL: {error}")))?;
        // Notices ("already exists, skipping" from idempotent DDL) are not worth a log line.
        let base = base
            .application_name("toolgate")
            .options([("client_min_messages", "warning")]);
        let connect_options = match &options.schema {
            Some(schema) => {
                check_schema_name(schema)?;
                create_schema(&base, schema).await?;
                base.options([("search_path", schema.as_str())])
            }
            None => base,
        };
        let display = display_target(&connect_options, options.schema.as_deref());

        // The writer's statements all touch a handful of rows by key. Their plans are generic
        // (prepared once, kept), made when the tables may still be small; a plan that scans a
        // whole table then stays in use as it grows, and every batch gets slower the longer
        // the gateway runs. Steering the writer's session away from scans and hash joins keeps
        // every row reached through its index; and with those settings PostgreSQL would keep
        // planning each statement afresh (about 0.6 ms of server CPU each), so the generic plan
        // is forced: at 1,000 calls/s that took the server from 92% to 60% of a core.
        let writer_options = connect_options.clone().options([
            ("enable_seqscan", "off"),
            ("enable_hashjoin", "off"),
            ("enable_mergejoin", "off"),
            ("plan_cache_mode", "force_generic_plan"),
        ]);
        let mut conn = writer_options.connect().await.map_err(|error| {
            LedgerError::Database(format!(
                "could not connect to PostgreSQL {display}: {error}"
            ))
        })?;
        // Whether this open brings the keyed chain to the ledger (see `open_keyed`).
        let keyed_before: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM _sqlx_migrations WHERE version = 7 AND success",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap_or(0);
        MIGRATOR.run(&mut conn).await.map_err(|error| {
            LedgerError::Database(format!("could not migrate ledger {display}: {error}"))
        })?;

        let instance = instance_key();
        let liveness = Liveness::acquire(connect_options.clone(), instance).await?;

        let pool = PgPoolOptions::new()
            .max_connections(READ_CONNECTIONS)
            .acquire_timeout(CONNECT_TIMEOUT)
            .connect_with(connect_options.clone())
            .await
            .map_err(|error| {
                LedgerError::Database(format!(
                    "could not connect to PostgreSQL {display}: {error}"
                ))
            })?;

        let (tick, commits) = watch::channel(0_u64);
        let (config_tick, config_changes) = watch::channel(0_u64);
        let mut listener = PgListener::connect_with(&pool).await.map_err(|error| {
            LedgerError::Database(format!("could not listen for ledger changes: {error}"))
        })?;
        let channel = events_channel(options.schema.as_deref());
        let config = config_channel(options.schema.as_deref());
        listener
            .listen_all([channel.as_str(), config.as_str()])
            .await
            .map_err(|error| {
                LedgerError::Database(format!("could not listen for ledger changes: {error}"))
            })?;
        let listener = tokio::spawn(listen(listener, config.clone(), tick, config_tick));

        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        tokio::spawn(
            Writer::new(WriterSetup {
                conn,
                options: writer_options,
                rx,
                counters: Arc::clone(&counters),
                instance,
                channel,
                config_channel: config,
                keys: keys.clone(),
            })
            .run(),
        );
        Ok(PgStore {
            writer: tx,
            pool,
            counters,
            instance,
            liveness,
            commits,
            config_changes,
            listener,
            keys,
            keyed_upgrade: keyed_before == 0,
        })
    }

    /// Commits every write queued so far, stops the writer, releases this instance's lock and
    /// closes every connection. Writes after this fail with [`LedgerError::Closed`].
    pub async fn close(&self) {
        let (done, closed) = oneshot::channel();
        if self.writer.send(Command::Close(done)).await.is_ok() {
            let _ = closed.await;
        }
        self.listener.abort();
        self.liveness.release().await;
        self.pool.close().await;
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

    /// This process's instance key (the `owner` of the calls it runs).
    pub fn instance(&self) -> i64 {
        self.instance
    }

    /// Whether this store holds its instance lock now. While it does not (the connection
    /// holding it was lost and the lock is not taken again yet), other replicas may take its
    /// running calls for interrupted, and it starts no call.
    pub fn holds_instance_lock(&self) -> bool {
        self.liveness.held()
    }

    async fn submit(&self, kind: OpKind) -> Result<Reply, LedgerError> {
        let (reply, answer) = oneshot::channel();
        self.writer
            .send(Command::Write(WriteOp { kind, reply }))
            .await
            .map_err(|_| LedgerError::Closed)?;
        answer.await.map_err(|_| LedgerError::Closed)?
    }

    /// Owners of `running` calls whose process is gone: their advisory lock is free.
    async fn dead_owners(&self) -> Result<Vec<i64>, LedgerError> {
        let mut conn = self.pool.acquire().await.map_err(read_error)?;
        let owners: Vec<i64> =
            sqlx::query_scalar("SELECT DISTINCT owner FROM calls_in_flight WHERE owner <> $1")
                .bind(self.instance)
                .fetch_all(&mut *conn)
                .await
                .map_err(read_error)?;
        let mut dead = Vec::new();
        for owner in owners {
            let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
                .bind(owner)
                .fetch_one(&mut *conn)
                .await
                .map_err(read_error)?;
            if free {
                sqlx::query("SELECT pg_advisory_unlock($1)")
                    .bind(owner)
                    .execute(&mut *conn)
                    .await
                    .map_err(read_error)?;
                dead.push(owner);
            }
        }
        Ok(dead)
    }
}

/// Forwards notifications to the watch channel until the store goes away. `PgListener`
/// reconnects by itself; a tick after a reconnect makes watchers re-read whatever they missed.
async fn listen(
    mut listener: PgListener,
    config: String,
    commits: watch::Sender<u64>,
    config_changes: watch::Sender<u64>,
) {
    let bump = |tick: &watch::Sender<u64>| tick.send_modify(|count| *count = count.wrapping_add(1));
    loop {
        match listener.try_recv().await {
            Ok(Some(notification)) if notification.channel() == config => bump(&config_changes),
            Ok(Some(_)) => bump(&commits),
            // The connection was lost and is re-established on the next call: whatever was
            // notified meanwhile is gone, so both sides re-read.
            Ok(None) => {
                bump(&commits);
                bump(&config_changes);
            }
            Err(error) => {
                warn!(%error, "listening for ledger changes failed; retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
                bump(&commits);
                bump(&config_changes);
            }
        }
        if commits.is_closed() && config_changes.is_closed() {
            return;
        }
    }
}

/// A schema name is spliced into SQL once (CREATE SCHEMA) and into the search path, so only
/// plain identifiers are accepted.
fn check_schema_name(schema: &str) -> Result<(), LedgerError> {
    let mut chars = schema.chars();
    let valid_start = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    let valid_rest = chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if valid_start && valid_rest && schema.len() <= 63 {
        Ok(())
    } else {
        Err(LedgerError::Database(format!(
            "invalid PostgreSQL schema name `{schema}`: use 1 to 63 lowercase letters, digits and \
             underscores, not starting with a digit"
        )))
    }
}

async fn create_schema(base: &PgConnectOptions, schema: &str) -> Result<(), LedgerError> {
    let mut conn = base.connect().await.map_err(|error| {
        LedgerError::Database(format!("could not connect to PostgreSQL: {error}"))
    })?;
    let sql = format!("CREATE SCHEMA IF NOT EXISTS {schema}");
    let created = sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await;
    if let Err(error) = created {
        // Two replicas creating it at once: one of them gets a unique violation.
        let exists: bool =
            sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_namespace WHERE nspname = $1)")
                .bind(schema)
                .fetch_one(&mut conn)
                .await
                .unwrap_or(false);
        if !exists {
            return Err(LedgerError::Database(format!(
                "could not create schema {schema}: {error}"
            )));
        }
    }
    let _ = conn.close().await;
    Ok(())
}

fn display_target(options: &PgConnectOptions, schema: Option<&str>) -> String {
    format!(
        "{}:{}/{}{}",
        options.get_host(),
        options.get_port(),
        options.get_database().unwrap_or("(default database)"),
        schema
            .map(|schema| format!(" schema {schema}"))
            .unwrap_or_default()
    )
}

/// A random 64-bit key for this process: the owner of its calls and its advisory lock.
fn instance_key() -> i64 {
    use sha2::Digest as _;
    use std::sync::atomic::AtomicU64;
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or(0);
    let local = 0_u8;
    let mut hasher = sha2::Sha256::new();
    hasher.update(std::process::id().to_le_bytes());
    hasher.update(now.to_le_bytes());
    hasher.update(COUNTER.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    hasher.update((std::ptr::from_ref(&local) as usize).to_le_bytes());
    let digest = hasher.finalize();
    let mut bytes = [0_u8; 8];
    bytes.copy_from_slice(&digest[..8]);
    i64::from_le_bytes(bytes)
}

impl Backend for PgStore {
    type Reader<'a> = &'a PgPool;
    const DIALECT: Dialect = Dialect::Postgres;

    fn reader(&self) -> &PgPool {
        &self.pool
    }

    async fn submit(&self, kind: OpKind) -> Result<Reply, LedgerError> {
        PgStore::submit(self, kind).await
    }

    fn check_live(&self) -> Result<(), LedgerError> {
        self.liveness.check()
    }

    async fn interrupted_calls(&self, limit: u32) -> Result<Vec<ToolCallRecord>, LedgerError> {
        let dead = self.dead_owners().await?;
        if dead.is_empty() {
            return Ok(Vec::new());
        }
        // An array parameter: PostgreSQL only (SQLite has one process per file).
        let rows = sqlx::query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM tool_calls WHERE id IN (SELECT call_id FROM calls_in_flight \
              WHERE owner = ANY($1)) AND status = 'running' ORDER BY seq LIMIT $2"
        ))
        .bind(dead)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(call_from_row).collect()
    }

    async fn verify(&self, with: VerifyWith<'_>) -> Result<VerifyReport, LedgerError> {
        let mut conn = self.pool.acquire().await.map_err(read_error)?;
        crate::verify::verify_chains(&mut *conn, with).await
    }

    fn keys(&self) -> Option<Arc<dyn AuditKeys>> {
        self.keys.clone()
    }

    fn commits(&self) -> Option<watch::Receiver<u64>> {
        Some(self.commits.clone())
    }

    fn config_changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.config_changes.clone())
    }

    async fn shut_down(&self) {
        PgStore::close(self).await;
    }
}
