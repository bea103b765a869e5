//! The SQLite ledger: one file in WAL mode, one writer task doing group commit, a small pool of
//! read-only connections for queries.
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

mod bulk;
mod files;
mod owner;

mod statements;
mod steps;
mod writer;

#[cfg(test)]
mod tests;

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::checkpoint::Checkpoint;
use sqlx::ConnectOptions;
use sqlx::migrate::Migrator;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
use tokio::sync::{mpsc, oneshot};
use toolgate_core::AuditKeys;
use toolgate_core::{
    AgentId, RunId, SecretName, TenantId, Timestamp, ToolCallId, ToolName, ToolUseId,
};

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
use crate::sqlite::writer::{Counters, Writer};
use crate::store::Store;

/// The schema, embedded at compile time.
static MIGRATOR: Migrator = sqlx::migrate!("../../migrations/sqlite");

/// Writes waiting for the writer before callers wait to enqueue (backpressure).
const QUEUE_CAPACITY: usize = 4096;
/// Prepared statements the write connection keeps: every multi-statement shape is one.
const WRITE_STATEMENT_CACHE: usize = 256;
/// Read-only connections for queries.
const READ_CONNECTIONS: u32 = 4;
/// How long a statement waits for a lock held by another connection.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// The SQLite implementation of [`Store`].
#[derive(Debug)]
pub struct SqliteStore {
    /// `None` for a store opened read-only.
    writer: Option<mpsc::Sender<Command>>,
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

/// What the writer has done since the store was opened.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WriterStats {
    /// Transactions committed (each one fsync).
    pub commits: u64,
    /// Write operations answered, successful or not.
    pub ops: u64,
    /// Batches whose hot operations (calls, finishes, event appends) could not all be written
    /// together (a repeated `tool_use_id`, a used-up budget, a missing run, ...) and were
    /// written one by one instead.
    pub bulk_fallbacks: u64,
    /// Hot operations that could not be written in one round trip either and were redone
    /// statement by statement.
    pub step_by_step: u64,
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
        // On a ledger written without keys (before the keyed chain), the first keyed event
        // records where every chain's legacy events end. Only the open that migrates the
        // ledger to the keyed chain writes it: later, a ledger holding legacy events only was
        // rewritten, and must not be vouched for. Replicas starting together may both write
        // one; verification uses the first.
        if !store.keyed_upgrade {
            return Ok(store);
        }
        let keyed: i64 = sqlx::query_scalar(crate::chain::ANY_KEYED)
            .fetch_one(&store.read)
            .await
            .map_err(read_error)?;
        if keyed == 0 {
            let heads: Vec<(String, i64, String)> = sqlx::query_as(crate::chain::ALL_HEADS)
                .fetch_all(&store.read)
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
        self.writer
            .as_ref()
            .map_or(0, |writer| writer.max_capacity() - writer.capacity())
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
        let write_options = shared
            .clone()
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            .synchronous(SqliteSynchronous::Full)
            // A 16 MiB page cache keeps the hot index pages of a busy ledger in memory, and
            // checkpointing every 8000 WAL pages instead of 1000 moves that copy off most
            // commits; measured +20-30% calls/s in `cargo xtask bench`.
            .pragma("cache_size", "-16384")
            // Every operation runs in a savepoint, whose sub-journal (the original content of
            // each page it touches) goes to a temporary file by default: a create, writes and
            // a close per batch. In memory it costs no system calls.
            .pragma("temp_store", "memory")
            .pragma("wal_autocheckpoint", "8000")
            // Deleted and overwritten content is zeroed in the file instead of left in free
            // space, e.g. a pending call's sealed arguments after its decision.
            .pragma("secure_delete", "on")
            .statement_cache_capacity(WRITE_STATEMENT_CACHE);
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

        let counters = Arc::new(Counters::default());
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        // The lock lives as long as the writer: a store dropped without `close` keeps the file
        // until its queued writes are committed.
        tokio::spawn(Writer::new(conn, rx, Arc::clone(&counters), lock, keys.clone()).run(gate));
        Ok(SqliteStore {
            writer: Some(tx),
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
            if writer.send(Command::Close(done)).await.is_ok() {
                // An error means the writer is gone already, which is what we wanted.
                let _ = closed.await;
            }
        }
        self.read.close().await;
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

    /// Queues a write and waits until its batch has committed.
    async fn submit(&self, kind: OpKind) -> Result<Reply, LedgerError> {
        let Some(writer) = &self.writer else {
            return Err(LedgerError::ReadOnly);
        };
        let (reply, answer) = oneshot::channel();
        writer
            .send(Command::Write(WriteOp { kind, reply }))
            .await
            .map_err(|_| LedgerError::Closed)?;
        answer.await.map_err(|_| LedgerError::Closed)?
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn create_tenant(&self, tenant: Tenant, actor: &Actor) -> Result<(), LedgerError> {
        let event = AdminEvent::tenant_created(&tenant, actor);
        self.submit(OpKind::CreateTenant(tenant, event))
            .await?
            .done()
    }

    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>, LedgerError> {
        let row = sqlx::query("SELECT id, name, created_at FROM tenants WHERE id = ?")
            .bind(id.as_str())
            .fetch_optional(&self.read)
            .await
            .map_err(read_error)?;
        row.as_ref().map(tenant_from_row).transpose()
    }

    async fn list_tenants(&self) -> Result<Vec<Tenant>, LedgerError> {
        // The system chain's reserved row is not a tenant.
        let rows =
            sqlx::query("SELECT id, name, created_at FROM tenants WHERE id <> ? ORDER BY id")
                .bind(SYSTEM_CHAIN)
                .fetch_all(&self.read)
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
            "SELECT tenant, id, name, created_at FROM agents WHERE tenant = ? AND id = ?",
        )
        .bind(tenant.as_str())
        .bind(id.as_str())
        .fetch_optional(&self.read)
        .await
        .map_err(read_error)?;
        row.as_ref().map(agent_from_row).transpose()
    }

    async fn list_agents(&self, tenant: &TenantId) -> Result<Vec<Agent>, LedgerError> {
        let rows = sqlx::query(
            "SELECT tenant, id, name, created_at FROM agents WHERE tenant = ? ORDER BY id",
        )
        .bind(tenant.as_str())
        .fetch_all(&self.read)
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
             FROM api_tokens WHERE hash = ?",
        )
        .bind(hash.to_owned())
        .fetch_optional(&self.read)
        .await
        .map_err(read_error)?;
        row.as_ref().map(token_from_row).transpose()
    }

    async fn list_tokens(
        &self,
        tenant: Option<&TenantId>,
    ) -> Result<Vec<TokenRecord>, LedgerError> {
        // `IS` matches NULL to NULL, so `None` lists the admin (tenant-less) tokens.
        let rows = sqlx::query(
            "SELECT id, hash, role, tenant, agent, label, created_at, revoked \
             FROM api_tokens WHERE tenant IS ? ORDER BY id",
        )
        .bind(tenant.map(|tenant| tenant.as_str().to_owned()))
        .fetch_all(&self.read)
        .await
        .map_err(read_error)?;
        rows.iter().map(token_from_row).collect()
    }

    async fn revoke_token(&self, id: &str, actor: &Actor) -> Result<(), LedgerError> {
        // The token's tenant decides the event's chain; it never changes once stored.
        let tenant: Option<Option<String>> =
            sqlx::query_scalar("SELECT tenant FROM api_tokens WHERE id = ?")
                .bind(id.to_owned())
                .fetch_optional(&self.read)
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
        // With no agent, `agent = NULL` matches nothing and only tenant-wide grants remain.
        let rows = sqlx::query(
            "SELECT tenant, agent, tool, enabled, updated_at FROM tool_permissions \
             WHERE tenant = ?1 AND (agent IS NULL OR agent = ?2) \
             ORDER BY tool, agent IS NOT NULL, agent",
        )
        .bind(tenant.as_str())
        .bind(agent.map(|agent| agent.as_str().to_owned()))
        .fetch_all(&self.read)
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
        let enabled: Option<bool> =
            sqlx::query_scalar("SELECT enabled FROM feature_flags WHERE tenant = ? AND flag = ?")
                .bind(tenant.as_str())
                .bind(flag.to_owned())
                .fetch_optional(&self.read)
                .await
                .map_err(read_error)?;
        Ok(enabled)
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
             WHERE tenant = ? ORDER BY version DESC LIMIT 1",
        )
        .bind(tenant.as_str())
        .fetch_optional(&self.read)
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
             pending_approvals, created_at FROM runs WHERE tenant = ? AND id = ?",
        )
        .bind(tenant.as_str())
        .bind(id.as_str())
        .fetch_optional(&self.read)
        .await
        .map_err(read_error)?;
        row.as_ref().map(run_from_row).transpose()
    }

    async fn record_call(&self, call: NewCall) -> Result<RecordOutcome, LedgerError> {
        let prepared = Box::new(PreparedCall::new(call));
        self.submit(OpKind::RecordCall(prepared)).await?.recorded()
    }

    async fn retry_call(
        &self,
        call: NewCall,
        observed_evaluation: i64,
    ) -> Result<RecordOutcome, LedgerError> {
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
             WHERE tenant = ? AND id = ? AND answer_sealed IS NOT NULL",
        )
        .bind(tenant.as_str())
        .bind(id.as_str())
        .fetch_optional(&self.read)
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
            " FROM pending_invocations WHERE tenant = ? AND tool_call_id = ? \
             ORDER BY created_at DESC, id DESC LIMIT 1"
        ))
        .bind(tenant.as_str())
        .bind(call.as_str())
        .fetch_optional(&self.read)
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
            " FROM tool_calls WHERE tenant = ? AND id = ?"
        ))
        .bind(tenant.as_str())
        .bind(id.as_str())
        .fetch_optional(&self.read)
        .await
        .map_err(read_error)?;
        row.as_ref().map(call_from_row).transpose()
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
            " FROM pending_invocations WHERE tenant = ? AND state = 'pending' \
              AND (?2 IS NULL OR run = ?2) AND (?3 IS NULL OR tool = ?3) \
              AND (?4 IS NULL OR origin = ?4) ORDER BY created_at, id LIMIT ?5"
        ))
        .bind(tenant.as_str())
        .bind(filter.run.as_ref().map(|run| run.as_str().to_owned()))
        .bind(filter.tool.as_ref().map(|tool| tool.as_str().to_owned()))
        .bind(filter.origin.map(|origin| origin.as_str()))
        .bind(i64::from(limit))
        .fetch_all(&self.read)
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
            " FROM pending_invocations WHERE tenant = ? AND id = ?"
        ))
        .bind(tenant.as_str())
        .bind(id.to_owned())
        .fetch_optional(&self.read)
        .await
        .map_err(read_error)?;
        row.as_ref().map(pending_from_row).transpose()
    }

    async fn list_expired_pending(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> Result<Vec<PendingInvocation>, LedgerError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            pending_columns!(),
            " FROM pending_invocations WHERE state = 'pending' AND expires_at <= ? \
              ORDER BY expires_at, id LIMIT ?"
        ))
        .bind(now.0)
        .bind(i64::from(limit))
        .fetch_all(&self.read)
        .await
        .map_err(read_error)?;
        rows.iter().map(pending_from_row).collect()
    }

    async fn resolve_pending(&self, resolution: ResolvePending) -> Result<bool, LedgerError> {
        let events = PreparedEvent::of_resolution(&resolution);
        self.submit(OpKind::ResolvePending(Box::new((resolution, events))))
            .await?
            .finished()
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
            " FROM tenant_tool_secrets WHERE tenant = ? AND name = ?"
        ))
        .bind(tenant.as_str())
        .bind(name.as_str())
        .fetch_optional(&self.read)
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
            " FROM tenant_tool_secrets WHERE tenant = ? ORDER BY name"
        ))
        .bind(tenant.as_str())
        .fetch_all(&self.read)
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
            " FROM tenant_tool_secrets WHERE key_id IS NOT NULL AND key_id <> ? \
              ORDER BY tenant, name LIMIT ?"
        ))
        .bind(key_id.to_owned())
        .bind(i64::from(limit))
        .fetch_all(&self.read)
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
        .fetch_all(&self.read)
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
              AND ((arguments_key_id IS NOT NULL AND arguments_key_id <> ?) \
              OR (arguments_sealed IS NULL AND arguments IS NOT NULL)) \
              ORDER BY tenant, id LIMIT ?"
        ))
        .bind(key_id.to_owned())
        .bind(i64::from(limit))
        .fetch_all(&self.read)
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

    async fn list_running_calls(&self, limit: u32) -> Result<Vec<ToolCallRecord>, LedgerError> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM tool_calls WHERE status = 'running' \
              AND seq IN (SELECT value FROM json_each(?)) ORDER BY seq LIMIT ?"
        ))
        .bind(self.interrupted.clone())
        .bind(i64::from(limit))
        .fetch_all(&self.read)
        .await
        .map_err(read_error)?;
        rows.iter().map(call_from_row).collect()
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
            " FROM tool_calls WHERE tenant = ? AND run = ? AND tool_use_id = ?"
        ))
        .bind(tenant.as_str())
        .bind(run.as_str())
        .bind(tool_use_id.as_str())
        .fetch_optional(&self.read)
        .await
        .map_err(read_error)?;
        row.as_ref().map(call_from_row).transpose()
    }

    /// Pages follow insertion order. An `after` that names no call of this run yields an empty
    /// page (never the first page again, which could make a client loop forever).
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
            " FROM tool_calls WHERE tenant = ?1 AND run = ?2 AND (?3 IS NULL OR seq > \
             (SELECT seq FROM tool_calls WHERE id = ?3 AND tenant = ?1 AND run = ?2)) \
             ORDER BY seq LIMIT ?4"
        ))
        .bind(tenant.as_str())
        .bind(run.as_str())
        .bind(after.map(|id| id.as_str().to_owned()))
        .bind(i64::from(limit))
        .fetch_all(&self.read)
        .await
        .map_err(read_error)?;
        rows.iter().map(call_from_row).collect()
    }

    async fn append_events(&self, events: Vec<NewAuditEvent>) -> Result<(), LedgerError> {
        if events.is_empty() {
            return Ok(());
        }
        let prepared = events.into_iter().map(PreparedEvent::new).collect();
        self.submit(OpKind::AppendEvents(prepared)).await?.done()
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
            " FROM audit_events WHERE tenant = ? AND chain_seq > ? AND run = ? \
              ORDER BY chain_seq LIMIT ?"
        ))
        .bind(tenant.as_str())
        .bind(after)
        .bind(run.as_str())
        .bind(i64::from(limit))
        .fetch_all(&self.read)
        .await
        .map_err(read_error)?;
        rows.iter().map(event_from_row).collect()
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
            " FROM audit_events WHERE tenant = ? AND chain_seq > ? ORDER BY chain_seq LIMIT ?"
        ))
        .bind(tenant.as_str())
        .bind(after)
        .bind(i64::from(limit))
        .fetch_all(&self.read)
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
        let mut conn = self.read.acquire().await.map_err(read_error)?;
        let with = crate::verify::VerifyWith {
            keys: self.keys.as_deref(),
            checkpoint,
        };
        crate::verify::verify_chains(&mut *conn, with).await
    }

    async fn granted_tools(&self, tenant: &TenantId) -> Result<Vec<ToolName>, LedgerError> {
        let names: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT tool FROM tool_permissions WHERE tenant = ? ORDER BY tool",
        )
        .bind(tenant.as_str())
        .fetch_all(&self.read)
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

    async fn close(&self) {
        SqliteStore::close(self).await;
    }
}
