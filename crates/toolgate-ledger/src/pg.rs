//! The PostgreSQL ledger, for several gateway replicas sharing one database.
//!
//! Same interface and behaviour as the SQLite store, with what sharing needs:
//!
//! - **Writes**: one writer task per process does group commit, like SQLite: whatever has
//!   queued is committed in one transaction. A batch of calls, finishes and appends is one
//!   statement (data-modifying CTEs over arrays) committing by itself: one round trip however
//!   many operations it holds. Anything else, or a batch that statement refuses, runs operation
//!   by operation, each in its own savepoint (see `steps`).
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
mod steps;
mod writer;

#[cfg(test)]
mod tests;

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::checkpoint::Checkpoint;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPool, PgPoolOptions};
use sqlx::{ConnectOptions, Connection as _};
use tokio::sync::{mpsc, oneshot, watch};
use toolgate_core::AuditKeys;
use toolgate_core::{
    AgentId, RunId, SecretName, TenantId, Timestamp, ToolCallId, ToolCallStatus, ToolName,
    ToolUseId,
};
use tracing::warn;

use crate::error::LedgerError;
use crate::model::{
    Actor, Agent, AuditEvent, CredentialRecord, FinishCall, KeyChange, NewAuditEvent, NewCall,
    PendingFilter, PendingInvocation, Permission, PolicySetRecord, RecordOutcome, ResolvePending,
    RunRecord, SYSTEM_CHAIN, SealedAnswer, Tenant, TokenRecord, ToolCallRecord, VerifyReport,
};
use crate::ops::{
    AdminEvent, Command, OpKind, PreparedCall, PreparedEvent, PreparedFinish, PreparedPending,
    Reply, WriteOp,
};
use crate::rows::{
    agent_from_row, answer_from_row, call_columns, call_from_row, credential_columns,
    credential_from_row, event_columns, event_from_row, manifest_json, pending_columns,
    pending_from_row, permission_from_row, policy_set_from_row, read_error, run_from_row,
    tenant_from_row, token_from_row,
};
use crate::sqlite::WriterStats;
use crate::store::Store;
use liveness::Liveness;
use writer::{Counters, Writer};

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
            format!("{prefix}_{}", hex::encode(&digest[..8]))
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
        // On a ledger written without keys (before the keyed chain), the first keyed event
        // records where every chain's legacy events end. Only the open that migrates the
        // ledger to the keyed chain writes it: later, a ledger holding legacy events only was
        // rewritten, and must not be vouched for. Replicas starting together may both write
        // one; verification uses the first.
        if !store.keyed_upgrade {
            return Ok(store);
        }
        let keyed: i64 = sqlx::query_scalar(crate::chain::ANY_KEYED)
            .fetch_one(&store.pool)
            .await
            .map_err(read_error)?;
        if keyed == 0 {
            let heads: Vec<(String, i64, String)> = sqlx::query_as(crate::chain::ALL_HEADS)
                .fetch_all(&store.pool)
                .await
                .map_err(read_error)?;
            if !heads.is_empty() {
                let record = crate::chain::legacy_record(heads);
                store
                    .submit(OpKind::AppendEvents(vec![record]))
                    .await?
                    .done()?;
            }
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
            Writer::new(
                conn,
                writer_options,
                rx,
                Arc::clone(&counters),
                instance,
                channel,
                config,
                keys.clone(),
            )
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
        WriterStats {
            commits: self.counters.commits.load(Ordering::Relaxed),
            ops: self.counters.ops.load(Ordering::Relaxed),
            bulk_fallbacks: self.counters.bulk_fallbacks.load(Ordering::Relaxed),
            step_by_step: self.counters.step_by_step.load(Ordering::Relaxed),
        }
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
        let owners: Vec<i64> = sqlx::query_scalar(
            "SELECT DISTINCT owner FROM tool_calls WHERE status = 'running' AND owner <> $1",
        )
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

#[async_trait::async_trait]
impl Store for PgStore {
    async fn create_tenant(&self, tenant: Tenant, actor: &Actor) -> Result<(), LedgerError> {
        let event = AdminEvent::tenant_created(&tenant, actor);
        self.submit(OpKind::CreateTenant(tenant, event))
            .await?
            .done()
    }

    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>, LedgerError> {
        let row = sqlx::query("SELECT id, name, created_at FROM tenants WHERE id = $1")
            .bind(id.as_str())
            .fetch_optional(&self.pool)
            .await
            .map_err(read_error)?;
        row.as_ref().map(tenant_from_row).transpose()
    }

    async fn list_tenants(&self) -> Result<Vec<Tenant>, LedgerError> {
        // The system chain's reserved row is not a tenant.
        let rows =
            sqlx::query("SELECT id, name, created_at FROM tenants WHERE id <> $1 ORDER BY id")
                .bind(SYSTEM_CHAIN)
                .fetch_all(&self.pool)
                .await
                .map_err(read_error)?;
        rows.iter().map(tenant_from_row).collect()
    }

    async fn create_agent(&self, agent: Agent, actor: &Actor) -> Result<(), LedgerError> {
        let event = AdminEvent::agent_created(&agent, actor);
        self.submit(OpKind::CreateAgent(agent, event)).await?.done()
    }

    async fn get_agent(
        &self,
        tenant: &TenantId,
        id: &AgentId,
    ) -> Result<Option<Agent>, LedgerError> {
        let row = sqlx::query(
            "SELECT tenant, id, name, created_at FROM agents WHERE tenant = $1 AND id = $2",
        )
        .bind(tenant.as_str())
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(read_error)?;
        row.as_ref().map(agent_from_row).transpose()
    }

    async fn list_agents(&self, tenant: &TenantId) -> Result<Vec<Agent>, LedgerError> {
        let rows = sqlx::query(
            "SELECT tenant, id, name, created_at FROM agents WHERE tenant = $1 ORDER BY id",
        )
        .bind(tenant.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(agent_from_row).collect()
    }

    async fn create_token(&self, token: TokenRecord, actor: &Actor) -> Result<(), LedgerError> {
        let event = AdminEvent::token_issued(&token, actor);
        self.submit(OpKind::CreateToken(token, event)).await?.done()
    }

    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>, LedgerError> {
        let row = sqlx::query(
            "SELECT id, hash, role, tenant, agent, label, created_at, revoked \
             FROM api_tokens WHERE hash = $1",
        )
        .bind(hash)
        .fetch_optional(&self.pool)
        .await
        .map_err(read_error)?;
        row.as_ref().map(token_from_row).transpose()
    }

    async fn list_tokens(
        &self,
        tenant: Option<&TenantId>,
    ) -> Result<Vec<TokenRecord>, LedgerError> {
        let rows = sqlx::query(
            "SELECT id, hash, role, tenant, agent, label, created_at, revoked \
             FROM api_tokens WHERE tenant IS NOT DISTINCT FROM $1 ORDER BY id",
        )
        .bind(tenant.map(TenantId::as_str))
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(token_from_row).collect()
    }

    async fn revoke_token(&self, id: &str, actor: &Actor) -> Result<(), LedgerError> {
        // The token's tenant decides the event's chain, whose head the batch locks before it
        // runs; it never changes once stored.
        let tenant: Option<Option<String>> =
            sqlx::query_scalar("SELECT tenant FROM api_tokens WHERE id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await
                .map_err(read_error)?;
        let Some(tenant) = tenant else {
            return Err(LedgerError::NotFound(format!("token {id}")));
        };
        let tenant = tenant
            .map(|tenant| {
                TenantId::new(tenant)
                    .map_err(|error| LedgerError::Corrupt(format!("column tenant: {error}")))
            })
            .transpose()?;
        let event = AdminEvent::token_revoked(id, tenant.as_ref(), actor);
        self.submit(OpKind::RevokeToken {
            id: id.to_owned(),
            tenant,
            event,
        })
        .await?
        .done()
    }

    async fn put_permission(
        &self,
        permission: Permission,
        actor: &Actor,
    ) -> Result<(), LedgerError> {
        let event = AdminEvent::grant_set(&permission, actor);
        self.submit(OpKind::PutPermission(permission, event))
            .await?
            .done()
    }

    async fn list_permissions(
        &self,
        tenant: &TenantId,
        agent: Option<&AgentId>,
    ) -> Result<Vec<Permission>, LedgerError> {
        let rows = sqlx::query(
            "SELECT tenant, agent, tool, enabled, updated_at FROM tool_permissions \
             WHERE tenant = $1 AND (agent IS NULL OR agent = $2) \
             ORDER BY tool, agent IS NOT NULL, agent",
        )
        .bind(tenant.as_str())
        .bind(agent.map(AgentId::as_str))
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(permission_from_row).collect()
    }

    async fn set_flag(
        &self,
        tenant: &TenantId,
        flag: &str,
        enabled: bool,
        actor: &Actor,
    ) -> Result<(), LedgerError> {
        self.submit(OpKind::SetFlag {
            tenant: tenant.clone(),
            flag: flag.to_owned(),
            enabled,
            at: actor.at,
            event: AdminEvent::flag_set(tenant, flag, enabled, actor),
        })
        .await?
        .done()
    }

    async fn get_flag(&self, tenant: &TenantId, flag: &str) -> Result<Option<bool>, LedgerError> {
        sqlx::query_scalar("SELECT enabled FROM feature_flags WHERE tenant = $1 AND flag = $2")
            .bind(tenant.as_str())
            .bind(flag)
            .fetch_optional(&self.pool)
            .await
            .map_err(read_error)
    }

    async fn put_policy_set(
        &self,
        tenant: &TenantId,
        text: &str,
        actor: &Actor,
    ) -> Result<i64, LedgerError> {
        self.submit(OpKind::PutPolicySet {
            tenant: tenant.clone(),
            text: text.to_owned(),
            created_by: actor.token_id.clone(),
            at: actor.at,
            event: AdminEvent::policy_set(tenant, text, actor),
        })
        .await?
        .version()
    }

    async fn current_policy_set(
        &self,
        tenant: &TenantId,
    ) -> Result<Option<PolicySetRecord>, LedgerError> {
        let row = sqlx::query(
            "SELECT tenant, version, text, created_by, created_at FROM policy_sets \
             WHERE tenant = $1 ORDER BY version DESC LIMIT 1",
        )
        .bind(tenant.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(read_error)?;
        row.as_ref().map(policy_set_from_row).transpose()
    }

    async fn create_run(&self, run: RunRecord) -> Result<(), LedgerError> {
        let manifest = manifest_json(&run.manifest);
        self.submit(OpKind::CreateRun { run, manifest })
            .await?
            .done()
    }

    async fn get_run(
        &self,
        tenant: &TenantId,
        id: &RunId,
    ) -> Result<Option<RunRecord>, LedgerError> {
        let row = sqlx::query(
            "SELECT id, tenant, agent, manifest, status, calls_used, max_calls, \
             pending_approvals, created_at FROM runs WHERE tenant = $1 AND id = $2",
        )
        .bind(tenant.as_str())
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(read_error)?;
        row.as_ref().map(run_from_row).transpose()
    }

    async fn record_call(&self, call: NewCall) -> Result<RecordOutcome, LedgerError> {
        // A call that will run must belong to a process other replicas see alive.
        if call.call.status == ToolCallStatus::Running {
            self.liveness.check()?;
        }
        let prepared = Box::new(PreparedCall::new(call));
        self.submit(OpKind::RecordCall(prepared)).await?.recorded()
    }

    async fn retry_call(
        &self,
        call: NewCall,
        observed_evaluation: i64,
    ) -> Result<RecordOutcome, LedgerError> {
        // As in `record_call`: a call that will run needs a process other replicas see alive.
        if call.call.status == ToolCallStatus::Running {
            self.liveness.check()?;
        }
        let prepared = Box::new(PreparedCall::new(call));
        self.submit(OpKind::RetryCall {
            prepared,
            observed_evaluation,
        })
        .await?
        .recorded()
    }

    async fn finish_call(&self, finish: FinishCall) -> Result<bool, LedgerError> {
        let prepared = Box::new(PreparedFinish::new(finish));
        self.submit(OpKind::FinishCall(prepared)).await?.finished()
    }

    async fn get_call_answer(
        &self,
        tenant: &TenantId,
        id: &ToolCallId,
    ) -> Result<Option<SealedAnswer>, LedgerError> {
        let row = sqlx::query(
            "SELECT answer_sealed, answer_expires_at FROM tool_calls \
             WHERE tenant = $1 AND id = $2 AND answer_sealed IS NOT NULL",
        )
        .bind(tenant.as_str())
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(read_error)?;
        row.as_ref().map(answer_from_row).transpose()
    }

    async fn purge_answers(&self, now: Timestamp, limit: u32) -> Result<u64, LedgerError> {
        self.submit(OpKind::PurgeAnswers { now, limit })
            .await?
            .count()
    }

    async fn pending_for_call(
        &self,
        tenant: &TenantId,
        call: &ToolCallId,
    ) -> Result<Option<PendingInvocation>, LedgerError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            pending_columns!(),
            " FROM pending_invocations WHERE tenant = $1 AND tool_call_id = $2 \
             ORDER BY created_at DESC, id DESC LIMIT 1"
        ))
        .bind(tenant.as_str())
        .bind(call.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(read_error)?;
        row.as_ref().map(pending_from_row).transpose()
    }

    async fn get_tool_call(
        &self,
        tenant: &TenantId,
        id: &ToolCallId,
    ) -> Result<Option<ToolCallRecord>, LedgerError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM tool_calls WHERE tenant = $1 AND id = $2"
        ))
        .bind(tenant.as_str())
        .bind(id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(read_error)?;
        row.as_ref().map(call_from_row).transpose()
    }

    async fn find_tool_call_by_use_id(
        &self,
        tenant: &TenantId,
        run: &RunId,
        tool_use_id: &ToolUseId,
    ) -> Result<Option<ToolCallRecord>, LedgerError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM tool_calls WHERE tenant = $1 AND run = $2 AND tool_use_id = $3"
        ))
        .bind(tenant.as_str())
        .bind(run.as_str())
        .bind(tool_use_id.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(read_error)?;
        row.as_ref().map(call_from_row).transpose()
    }

    async fn list_tool_calls(
        &self,
        tenant: &TenantId,
        run: &RunId,
        after: Option<&ToolCallId>,
        limit: u32,
    ) -> Result<Vec<ToolCallRecord>, LedgerError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM tool_calls WHERE tenant = $1 AND run = $2 AND ($3::text IS NULL OR seq > \
             (SELECT seq FROM tool_calls WHERE id = $3 AND tenant = $1 AND run = $2)) \
             ORDER BY seq LIMIT $4"
        ))
        .bind(tenant.as_str())
        .bind(run.as_str())
        .bind(after.map(ToolCallId::as_str))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(call_from_row).collect()
    }

    async fn list_running_calls(&self, limit: u32) -> Result<Vec<ToolCallRecord>, LedgerError> {
        let dead = self.dead_owners().await?;
        if dead.is_empty() {
            return Ok(Vec::new());
        }
        let rows = sqlx::query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM tool_calls WHERE status = 'running' AND owner = ANY($1) ORDER BY seq LIMIT $2"
        ))
        .bind(dead)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(call_from_row).collect()
    }

    async fn list_pending(
        &self,
        tenant: &TenantId,
        filter: &PendingFilter,
        limit: u32,
    ) -> Result<Vec<PendingInvocation>, LedgerError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            pending_columns!(),
            " FROM pending_invocations WHERE tenant = $1 AND state = 'pending' \
              AND ($2::text IS NULL OR run = $2) AND ($3::text IS NULL OR tool = $3) \
              AND ($4::text IS NULL OR origin = $4) ORDER BY created_at, id LIMIT $5"
        ))
        .bind(tenant.as_str())
        .bind(filter.run.as_ref().map(RunId::as_str))
        .bind(filter.tool.as_ref().map(ToolName::as_str))
        .bind(filter.origin.map(|origin| origin.as_str()))
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(pending_from_row).collect()
    }

    async fn get_pending(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Option<PendingInvocation>, LedgerError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            pending_columns!(),
            " FROM pending_invocations WHERE tenant = $1 AND id = $2"
        ))
        .bind(tenant.as_str())
        .bind(id)
        .fetch_optional(&self.pool)
        .await
        .map_err(read_error)?;
        row.as_ref().map(pending_from_row).transpose()
    }

    async fn resolve_pending(&self, resolution: ResolvePending) -> Result<bool, LedgerError> {
        // An approval moves the call to `running` here: the same rule as a new call.
        if resolution.call_status == ToolCallStatus::Running {
            self.liveness.check()?;
        }
        let events = PreparedEvent::of_resolution(&resolution);
        self.submit(OpKind::ResolvePending(Box::new((resolution, events))))
            .await?
            .finished()
    }

    async fn list_expired_pending(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> Result<Vec<PendingInvocation>, LedgerError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            pending_columns!(),
            " FROM pending_invocations WHERE state = 'pending' AND expires_at <= $1 \
              ORDER BY expires_at, id LIMIT $2"
        ))
        .bind(now.0)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(pending_from_row).collect()
    }

    async fn add_pending(
        &self,
        pending: PendingInvocation,
        events: Vec<NewAuditEvent>,
    ) -> Result<(), LedgerError> {
        let events = PreparedEvent::of_pending(&pending, events);
        self.submit(OpKind::AddPending(Box::new((
            PreparedPending::new(pending),
            events,
        ))))
        .await?
        .done()
    }

    async fn put_credential(
        &self,
        credential: CredentialRecord,
        actor: &Actor,
    ) -> Result<(), LedgerError> {
        let event = AdminEvent::credential_put(&credential, actor);
        self.submit(OpKind::PutCredential(Box::new((credential, event))))
            .await?
            .done()
    }

    async fn get_credential(
        &self,
        tenant: &TenantId,
        name: &SecretName,
    ) -> Result<Option<CredentialRecord>, LedgerError> {
        let row = sqlx::query(concat!(
            "SELECT ",
            credential_columns!(),
            " FROM tenant_tool_secrets WHERE tenant = $1 AND name = $2"
        ))
        .bind(tenant.as_str())
        .bind(name.as_str())
        .fetch_optional(&self.pool)
        .await
        .map_err(read_error)?;
        row.as_ref().map(credential_from_row).transpose()
    }

    async fn list_credentials(
        &self,
        tenant: &TenantId,
    ) -> Result<Vec<CredentialRecord>, LedgerError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            credential_columns!(),
            " FROM tenant_tool_secrets WHERE tenant = $1 ORDER BY name"
        ))
        .bind(tenant.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(credential_from_row).collect()
    }

    async fn delete_credential(
        &self,
        tenant: &TenantId,
        name: &SecretName,
        actor: &Actor,
    ) -> Result<(), LedgerError> {
        self.submit(OpKind::DeleteCredential {
            tenant: tenant.clone(),
            name: name.clone(),
            event: AdminEvent::credential_deleted(tenant, name, actor),
        })
        .await?
        .done()
    }

    async fn list_sealed_not_under(
        &self,
        key_id: &str,
        limit: u32,
    ) -> Result<Vec<CredentialRecord>, LedgerError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            credential_columns!(),
            " FROM tenant_tool_secrets WHERE key_id IS NOT NULL AND key_id <> $1 \
              ORDER BY tenant, name LIMIT $2"
        ))
        .bind(key_id)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(credential_from_row).collect()
    }

    async fn sealed_key_usage(&self) -> Result<Vec<(String, u64)>, LedgerError> {
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT key_id, COUNT(*) FROM (SELECT key_id FROM tenant_tool_secrets \
             WHERE key_id IS NOT NULL UNION ALL SELECT arguments_key_id FROM pending_invocations \
             WHERE state = 'pending' AND arguments_key_id IS NOT NULL) AS used \
             GROUP BY key_id ORDER BY key_id",
        )
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        Ok(rows
            .into_iter()
            .map(|(key, count)| (key, u64::try_from(count).unwrap_or(0)))
            .collect())
    }

    async fn list_pending_sealed_not_under(
        &self,
        key_id: &str,
        limit: u32,
    ) -> Result<Vec<PendingInvocation>, LedgerError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            pending_columns!(),
            " FROM pending_invocations WHERE state = 'pending' \
              AND ((arguments_key_id IS NOT NULL AND arguments_key_id <> $1) \
              OR (arguments_sealed IS NULL AND arguments IS NOT NULL)) \
              ORDER BY tenant, id LIMIT $2"
        ))
        .bind(key_id.to_owned())
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(pending_from_row).collect()
    }

    async fn replace_pending_arguments(
        &self,
        tenant: &TenantId,
        id: &str,
        expected: Option<&str>,
        sealed: &str,
        key_id: &str,
    ) -> Result<bool, LedgerError> {
        self.submit(OpKind::ReplacePendingArguments {
            tenant: tenant.clone(),
            id: id.to_owned(),
            expected: expected.map(str::to_owned),
            sealed: sealed.to_owned(),
            key_id: key_id.to_owned(),
        })
        .await?
        .finished()
    }

    async fn replace_sealed(
        &self,
        tenant: &TenantId,
        name: &SecretName,
        expected: &str,
        value: &str,
        key_id: &str,
        actor: &Actor,
    ) -> Result<bool, LedgerError> {
        self.submit(OpKind::ReplaceSealed {
            tenant: tenant.clone(),
            name: name.clone(),
            expected: expected.to_owned(),
            value: value.to_owned(),
            key_id: key_id.to_owned(),
            at: actor.at,
            event: AdminEvent::credential_rewrapped(tenant, name, key_id, actor),
        })
        .await?
        .finished()
    }

    async fn record_key_change(&self, change: KeyChange, actor: &Actor) -> Result<(), LedgerError> {
        let event = AdminEvent::key_change(&change, actor);
        self.submit(OpKind::RecordKeyChange(event)).await?.done()
    }

    async fn append_events(&self, events: Vec<NewAuditEvent>) -> Result<(), LedgerError> {
        if events.is_empty() {
            return Ok(());
        }
        let prepared = events.into_iter().map(PreparedEvent::new).collect();
        self.submit(OpKind::AppendEvents(prepared)).await?.done()
    }

    async fn list_events(
        &self,
        tenant: &TenantId,
        after: i64,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, LedgerError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            event_columns!(),
            " FROM audit_events WHERE tenant = $1 AND chain_seq > $2 ORDER BY chain_seq LIMIT $3"
        ))
        .bind(tenant.as_str())
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(event_from_row).collect()
    }

    async fn list_run_events(
        &self,
        tenant: &TenantId,
        run: &RunId,
        after: i64,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, LedgerError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            event_columns!(),
            " FROM audit_events WHERE tenant = $1 AND run = $2 AND chain_seq > $3 \
              ORDER BY chain_seq LIMIT $4"
        ))
        .bind(tenant.as_str())
        .bind(run.as_str())
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        rows.iter().map(event_from_row).collect()
    }

    fn audit_keys(&self) -> Option<Arc<dyn AuditKeys>> {
        self.keys.clone()
    }

    async fn verify_against(
        &self,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<VerifyReport, LedgerError> {
        let mut conn = self.pool.acquire().await.map_err(read_error)?;
        let with = crate::verify::VerifyWith {
            keys: self.keys.as_deref(),
            checkpoint,
        };
        crate::verify::verify_chains(&mut *conn, with).await
    }

    async fn granted_tools(&self, tenant: &TenantId) -> Result<Vec<ToolName>, LedgerError> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT tool FROM tool_permissions WHERE tenant = $1 ORDER BY tool",
        )
        .bind(tenant.as_str())
        .fetch_all(&self.pool)
        .await
        .map_err(read_error)?;
        names
            .into_iter()
            .map(|name| {
                ToolName::new(name)
                    .map_err(|error| LedgerError::Corrupt(format!("column tool: {error}")))
            })
            .collect()
    }

    fn subscribe_commits(&self) -> Option<watch::Receiver<u64>> {
        Some(self.commits.clone())
    }

    fn subscribe_config_changes(&self) -> Option<watch::Receiver<u64>> {
        Some(self.config_changes.clone())
    }

    async fn close(&self) {
        PgStore::close(self).await;
    }
}
