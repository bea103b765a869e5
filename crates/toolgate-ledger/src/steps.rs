//! Write operations executed one statement at a time, looking at each result before the next,
//! written once for both backends (one SQL text where the dialects agree).
//!
//! Every administrative operation runs here: its change, then its audit event, inside the
//! savepoint `op` the writer opens for it, so the two commit together or not at all, and a
//! refused change writes no event. The hot operations (`record_call`, `finish_call`,
//! `append_events`) run here only when the writer's fast forms were refused: then this code
//! finds out exactly what happened (a repeated `tool_use_id`, a used-up budget, a missing run)
//! and answers precisely. The budget and idempotency rules live here, once.
//!
//! What differs between the backends is a [`Conn`]: where an event's chain starts (SQLite's
//! writer caches heads it loads lazily, a PostgreSQL batch locked its heads first), how a call
//! row goes in (PostgreSQL records its owner, and must not abort the transaction on a repeated
//! key), and what a failed statement leaves behind (PostgreSQL aborts the transaction up to the
//! savepoint; SQLite undoes the statement only).

use std::collections::HashMap;
use std::future::Future;

use serde_json::json;
use toolgate_core::{AuditKeys, ErrorCode, ToolCallStatus};

use crate::chain::GENESIS_HASH;
use crate::error::LedgerError;
use crate::model::{
    Agent, CredentialRecord, Permission, RecordOutcome, ResolvePending, RunRecord, Tenant,
    TokenRecord, ToolCallRecord,
};
use crate::ops::{OpKind, PreparedCall, PreparedEvent, PreparedFinish, PreparedPending, Reply};
use crate::rows::{
    Fail, SqlFailure, SqlRow, call_columns, call_from_row, read_failure, write_failure,
};
use crate::sql::{Db, Dialect, Query, query};

/// The audit event kind kept when a call is blocked for its budget.
const REQUESTED_EVENT: &str = "tool_call.requested";

/// The newest event of a tenant's chain; `chain_seq` 0 with the genesis hash for an empty chain.
#[derive(Clone, Debug)]
pub(crate) struct Head {
    pub(crate) chain_seq: i64,
    pub(crate) hash: String,
}

/// The chain heads a writer caches, by tenant. Tenant ids are made by administrators, never
/// chosen by a call, so the maps keyed by them hash with foldhash rather than SipHash (which
/// resists flooding by chosen keys, and cost a few hundred instructions a call here).
pub(crate) type Heads = HashMap<String, Head, FastHash>;

/// The hasher of the writers' own maps, whose keys no caller chooses (see [`Heads`]).
pub(crate) type FastHash = foldhash::fast::RandomState;

/// One connection of either backend, statement by statement (what verification reads through).
pub(crate) trait SqlConn: Send {
    /// Rows outlive the statement's borrow of the connection.
    type Row: SqlRow + Send;
    type Db<'c>: Db<Row = Self::Row>
    where
        Self: 'c;
    const DIALECT: Dialect;

    fn db(&mut self) -> Self::Db<'_>;
}

/// A backend's write connection, as the step-by-step operations need it.
pub(crate) trait Conn: SqlConn {
    /// The head `tenant`'s next event chains from: from `heads` if there, else as the backend
    /// knows it (an error when appending is not possible: no such tenant, a damaged chain).
    fn head(
        &mut self,
        heads: &mut Heads,
        tenant: &str,
    ) -> impl Future<Output = Result<Head, Fail>> + Send;

    /// Inserts the call row; `Ok(false)` when the backend skipped it because its id or its
    /// `tool_use_id` is taken (a refusal that would otherwise abort the transaction).
    fn insert_call(
        &mut self,
        prepared: &PreparedCall,
        owner: Option<i64>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// Makes the connection usable again after a refused statement, before the operation
    /// reads more (PostgreSQL: back to the savepoint `op`; SQLite undid the statement only).
    fn recover(&mut self) -> impl Future<Output = Result<(), Fail>> + Send;
}

/// The columns of a new call row that both backends insert, in [`bind_call_row`]'s order
/// (`$1` to `$20`); each backend's statement adds its own column as `$21` (SQLite the call's
/// `evaluation`, PostgreSQL the `owner` instance).
macro_rules! call_row_columns {
    () => {
        "id, tenant, run, agent, tool, action, tool_use_id, correlation_id, status, args_hash, \
         input_redacted, output_redacted, error_code, error_text, policy_decision_id, \
         risk_level, duration_ms, attempts, created_at, updated_at"
    };
}
pub(crate) use call_row_columns;

/// Binds a new call row's [`call_row_columns`], `$1` to `$20`.
pub(crate) fn bind_call_row<'a>(query: Query<'a>, prepared: &'a PreparedCall) -> Query<'a> {
    let call = &prepared.call;
    query
        .bind(call.id.as_str())
        .bind(call.tenant.as_str())
        .bind(call.run.as_str())
        .bind(call.agent.as_str())
        .bind(&call.tool)
        .bind(call.action.as_deref())
        .bind(call.tool_use_id.as_ref().map(|id| id.as_str()))
        .bind(call.correlation_id.as_str())
        .bind(call.status.as_str())
        .bind(&call.args_hash)
        .bind(&prepared.input)
        .bind(prepared.output.as_deref())
        .bind(call.error_code.map(|code| code.as_str()))
        .bind(call.error_text.as_deref())
        .bind(call.policy_decision_id.as_deref())
        .bind(call.risk_level.map(|risk| risk.as_str()))
        .bind(call.duration_ms)
        .bind(call.attempts)
        .bind(call.created_at.0)
        .bind(call.updated_at.0)
}

/// One operation's view of the writer.
pub(crate) struct Steps<'w, C: Conn> {
    pub(crate) conn: &'w mut C,
    pub(crate) heads: &'w mut Heads,
    pub(crate) keys: Option<&'w dyn AuditKeys>,
    /// Chain heads this operation moved, each with the head it replaced, oldest first; the
    /// writer restores them if the operation is rolled back and records them as moved if not.
    pub(crate) undo: Vec<(String, Head)>,
    /// PostgreSQL: this process's instance key, the owner of the calls it records or resumes
    /// (replicas tell interrupted calls by it). SQLite keeps none: one process owns the file.
    pub(crate) owner: Option<i64>,
}

const INSERT_DECISION: &str = "INSERT INTO policy_decisions (id, tenant, tool_call_id, tool, \
     decision, risk, policy_ids, policy_version, created_at) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)";

const INSERT_PENDING: &str = "INSERT INTO pending_invocations (id, tenant, run, tool_call_id, \
     tool, arguments, arguments_sealed, arguments_key_id, args_hash, manifest, policy_version, \
     origin, decision, state, version, expires_at, created_at, timeout_ms, trace_parent) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)";

const INSERT_EVENT: &str = "INSERT INTO audit_events (tenant, chain_seq, kind, run, \
     tool_call_id, payload, at, prev_hash, hash, key_id, binding) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";

/// Counts a call against its run's budget; nothing when the budget is used up (no row
/// changed). Binds: tenant, run.
pub(crate) const COUNT_CALL: &str = "UPDATE runs SET calls_used = calls_used + 1 \
     WHERE tenant = $1 AND id = $2 AND calls_used + 1 <= max_calls";

/// Counts a suspended call (`$1`: 1 when it counts against the budget, else 0) and its pending
/// approval, and marks the run waiting; nothing when the budget is used up. Binds then tenant,
/// run.
pub(crate) const COUNT_PENDING_CALL: &str = "UPDATE runs SET calls_used = calls_used + $1, \
     pending_approvals = pending_approvals + 1, status = 'waiting_approval' \
     WHERE tenant = $2 AND id = $3 AND calls_used + $1 <= max_calls";

/// The run's count of pending invocations after `$1` of them were decided, and its status.
const RELEASE_PENDING: &str = "UPDATE runs SET \
     pending_approvals = CASE WHEN pending_approvals > $1 THEN pending_approvals - $1 ELSE 0 END, \
     status = CASE WHEN pending_approvals - $1 <= 0 AND status = 'waiting_approval' \
     THEN 'active' ELSE status END WHERE tenant = $2 AND id = $3";

/// How a refused write fails its operation: `exists` and `missing` say what a unique or a
/// foreign key violation means for the statement.
fn refused(
    exists: impl FnOnce() -> String,
    missing: impl FnOnce() -> LedgerError,
) -> impl FnOnce(sqlx::Error) -> Fail {
    move |error| write_failure(&error, exists, missing)
}

/// A statement that should not be refused was: its reason is the answer.
fn unexpected(what: impl FnOnce() -> String) -> impl FnOnce(sqlx::Error) -> Fail {
    refused(what, || {
        LedgerError::Database("unexpected foreign key failure".into())
    })
}

impl<C: Conn> Steps<'_, C> {
    pub(crate) async fn apply(&mut self, op: &OpKind) -> Result<Reply, Fail> {
        match op {
            OpKind::CreateTenant(tenant, event) => self.create_tenant(tenant, event).await,
            OpKind::CreateAgent(agent, event) => {
                self.create_agent(agent).await?;
                self.append(&event.prepared()).await?;
                Ok(Reply::Done)
            }
            OpKind::CreateToken(token, event) => {
                self.create_token(token).await?;
                self.append(&event.prepared()).await?;
                Ok(Reply::Done)
            }
            OpKind::RevokeToken { id, tenant, event } => {
                // `tenant` is the one the token was read with (NULL for admin tokens).
                let changed = query(
                    "UPDATE api_tokens SET revoked = TRUE \
                     WHERE id = $1 AND tenant IS NOT DISTINCT FROM $2",
                )
                .bind(id)
                .bind(tenant.as_ref().map(|tenant| tenant.as_str()))
                .execute(self.conn.db())
                .await
                .map_err(unexpected(|| format!("token {id}")))?;
                if changed == 0 {
                    return Err(Fail::Op(LedgerError::NotFound(format!("token {id}"))));
                }
                self.append(&event.prepared()).await?;
                Ok(Reply::Done)
            }
            OpKind::PutPermission(permission, event) => {
                self.put_permission(permission).await?;
                self.append(&event.prepared()).await?;
                Ok(Reply::Done)
            }
            OpKind::RecordKeyChange(event) => {
                self.append(&event.prepared()).await?;
                Ok(Reply::Done)
            }
            OpKind::SetFlag {
                tenant,
                flag,
                enabled,
                at,
                event,
            } => {
                query(
                    "INSERT INTO feature_flags (tenant, flag, enabled, updated_at) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, flag) DO UPDATE \
                     SET enabled = excluded.enabled, updated_at = excluded.updated_at",
                )
                .bind(tenant.as_str())
                .bind(flag)
                .bind(*enabled)
                .bind(at.0)
                .execute(self.conn.db())
                .await
                .map_err(refused(
                    || format!("flag {flag} of tenant {tenant}"),
                    || LedgerError::NotFound(format!("tenant {tenant}")),
                ))?;
                self.append(&event.prepared()).await?;
                Ok(Reply::Done)
            }
            OpKind::PutPolicySet {
                tenant,
                text,
                created_by,
                at,
                event,
            } => {
                // Versions are numbered per tenant. PostgreSQL replicas take turns through the
                // tenant row (a lock that does not block rows referencing the tenant); on
                // SQLite this writer is the only one.
                if C::DIALECT == Dialect::Postgres {
                    let tenant_row = query("SELECT 1 FROM tenants WHERE id = $1 FOR NO KEY UPDATE")
                        .bind(tenant.as_str())
                        .fetch_optional(self.conn.db())
                        .await
                        .map_err(read_failure)?;
                    if tenant_row.is_none() {
                        return Err(Fail::Op(LedgerError::NotFound(format!("tenant {tenant}"))));
                    }
                }
                let row = query(
                    "INSERT INTO policy_sets (tenant, version, text, created_by, created_at) \
                     SELECT $1, COALESCE(MAX(version), 0) + 1, $2, $3, $4 \
                     FROM policy_sets WHERE tenant = $1 RETURNING version",
                )
                .bind(tenant.as_str())
                .bind(text)
                .bind(created_by)
                .bind(at.0)
                .fetch_one(self.conn.db())
                .await
                .map_err(refused(
                    || format!("a policy set version of tenant {tenant}"),
                    || LedgerError::NotFound(format!("tenant {tenant}")),
                ))?;
                let version = row.int("version").map_err(Fail::Op)?;
                self.append(&event.prepared_with("version", version.into()))
                    .await?;
                Ok(Reply::Version(version))
            }
            OpKind::CreateRun { run, manifest } => self.create_run(run, manifest).await,
            OpKind::RecordCall(call) => self
                .record_call(call)
                .await
                .map(|outcome| Reply::Recorded(Box::new(outcome))),
            OpKind::RetryCall {
                prepared,
                observed_evaluation,
            } => self
                .retry_call(prepared, *observed_evaluation)
                .await
                .map(|outcome| Reply::Recorded(Box::new(outcome))),
            OpKind::FinishCall(finish) => self.finish_call(finish).await.map(Reply::Finished),
            OpKind::PurgeAnswers { now, limit } => {
                // PostgreSQL keeps answers in a table of their own (see `finish_call`).
                let purge = match C::DIALECT {
                    Dialect::Sqlite => query(
                        "UPDATE tool_calls SET answer_sealed = NULL, answer_expires_at = NULL \
                         WHERE id IN (SELECT id FROM tool_calls WHERE answer_sealed IS NOT NULL \
                         AND answer_expires_at <= $1 ORDER BY answer_expires_at LIMIT $2)",
                    ),
                    Dialect::Postgres => query(
                        "DELETE FROM call_answers WHERE call_id IN (SELECT call_id \
                         FROM call_answers WHERE expires_at <= $1 ORDER BY expires_at LIMIT $2)",
                    ),
                };
                let purged = purge
                    .bind(now.0)
                    .bind(i64::from(*limit))
                    .execute(self.conn.db())
                    .await
                    .map_err(unexpected(|| "sealed answers".to_owned()))?;
                Ok(Reply::Count(purged))
            }
            OpKind::AppendEvents(events) => {
                for event in events {
                    self.append(event).await?;
                }
                Ok(Reply::Done)
            }
            OpKind::PutCredential(credential) => {
                let (credential, event) = credential.as_ref();
                self.put_credential(credential).await?;
                self.append(&event.prepared()).await?;
                Ok(Reply::Done)
            }
            OpKind::ResolvePending(resolution) => {
                let (resolution, events) = resolution.as_ref();
                self.resolve_pending(resolution, events)
                    .await
                    .map(Reply::Finished)
            }
            OpKind::AddPending(pending) => {
                let (pending, events) = pending.as_ref();
                self.add_pending(pending, events).await
            }
            OpKind::Console(op) => self.console(op).await,
            OpKind::DeleteCredential {
                tenant,
                name,
                event,
            } => {
                let changed =
                    query("DELETE FROM tenant_tool_secrets WHERE tenant = $1 AND name = $2")
                        .bind(tenant.as_str())
                        .bind(name.as_str())
                        .execute(self.conn.db())
                        .await
                        .map_err(unexpected(|| format!("secret {name} of tenant {tenant}")))?;
                if changed == 0 {
                    return Err(Fail::Op(LedgerError::NotFound(format!(
                        "secret {name} of tenant {tenant}"
                    ))));
                }
                self.append(&event.prepared()).await?;
                Ok(Reply::Done)
            }
            OpKind::ReplaceSealed {
                tenant,
                name,
                expected,
                value,
                key_id,
                at,
                event,
            } => {
                let changed = query(
                    "UPDATE tenant_tool_secrets SET value = $1, key_id = $2, updated_at = $3 \
                     WHERE tenant = $4 AND name = $5 AND kind = 'sealed' AND value = $6",
                )
                .bind(value)
                .bind(key_id)
                .bind(at.0)
                .bind(tenant.as_str())
                .bind(name.as_str())
                .bind(expected)
                .execute(self.conn.db())
                .await
                .map_err(unexpected(|| format!("secret {name} of tenant {tenant}")))?;
                if changed == 1 {
                    self.append(&event.prepared()).await?;
                }
                Ok(Reply::Finished(changed == 1))
            }
            OpKind::ReplacePendingArguments {
                tenant,
                id,
                expected,
                sealed,
                key_id,
            } => {
                let changed = query(
                    "UPDATE pending_invocations SET arguments = NULL, arguments_sealed = $1, \
                     arguments_key_id = $2 WHERE tenant = $3 AND id = $4 AND state = 'pending' \
                     AND (arguments_sealed = $5 OR (CAST($5 AS TEXT) IS NULL \
                     AND arguments_sealed IS NULL AND arguments IS NOT NULL))",
                )
                .bind(sealed)
                .bind(key_id)
                .bind(tenant.as_str())
                .bind(id)
                .bind(expected)
                .execute(self.conn.db())
                .await
                .map_err(unexpected(|| format!("pending invocation {id}")))?;
                Ok(Reply::Finished(changed == 1))
            }
        }
    }

    async fn create_tenant(
        &mut self,
        tenant: &Tenant,
        event: &crate::ops::AdminEvent,
    ) -> Result<Reply, Fail> {
        query("INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3)")
            .bind(tenant.id.as_str())
            .bind(&tenant.name)
            .bind(tenant.created_at.0)
            .execute(self.conn.db())
            .await
            .map_err(unexpected(|| format!("tenant {}", tenant.id)))?;
        let chain = tenant.id.as_str();
        // A PostgreSQL batch locks the head rows of the chains it appends to, so a chain's
        // head row exists from its tenant's creation on (this transaction holds it). SQLite's
        // writer stores heads as they move.
        if C::DIALECT == Dialect::Postgres {
            query("INSERT INTO audit_heads (tenant, chain_seq, hash) VALUES ($1, 0, $2)")
                .bind(chain)
                .bind(GENESIS_HASH)
                .execute(self.conn.db())
                .await
                .map_err(unexpected(|| format!("audit chain {chain}")))?;
        }
        // The new chain starts here, and later operations of the batch may append to it.
        self.heads.insert(
            chain.to_owned(),
            Head {
                chain_seq: 0,
                hash: GENESIS_HASH.to_owned(),
            },
        );
        if let Err(fail) = self.append(&event.prepared()).await {
            // Rolled back with the tenant: its head no longer exists.
            self.undo.retain(|(moved, _)| moved != chain);
            self.heads.remove(chain);
            return Err(fail);
        }
        Ok(Reply::Done)
    }

    /// The claim: the conditional UPDATE is the check, so of concurrent decisions on one row
    /// exactly one changes it; the others write nothing. (On another PostgreSQL replica's
    /// concurrent claim, the row lock makes this one wait for it and re-check the row.)
    async fn resolve_pending(
        &mut self,
        resolution: &ResolvePending,
        events: &[PreparedEvent],
    ) -> Result<bool, Fail> {
        let claimed = query(
            "UPDATE pending_invocations SET state = $1, version = version + 1, decided_by = $2, \
             reason = $3, decided_at = $4, arguments = NULL, arguments_sealed = NULL, \
             arguments_key_id = NULL \
             WHERE id = $5 AND tenant = $6 AND version = $7 AND state = 'pending' \
             RETURNING tool_call_id, run",
        )
        .bind(resolution.state.as_str())
        .bind(&resolution.decided_by)
        .bind(&resolution.reason)
        .bind(resolution.at.0)
        .bind(&resolution.id)
        .bind(resolution.tenant.as_str())
        .bind(resolution.observed_version)
        .fetch_optional(self.conn.db())
        .await
        .map_err(unexpected(|| {
            format!("pending invocation {}", resolution.id)
        }))?;
        let Some(row) = claimed else {
            return Ok(false);
        };
        let tool_call_id = row.text("tool_call_id").map_err(Fail::Op)?;
        let run = row.text("run").map_err(Fail::Op)?;
        // An approved call runs next, in this process: on PostgreSQL it becomes this
        // instance's call.
        let update_call = match self.owner {
            None => query(
                "UPDATE tool_calls SET status = $1, error_code = $2, error_text = $3, \
                 updated_at = $4 WHERE id = $5 AND tenant = $6",
            ),
            Some(_) => query(
                "UPDATE tool_calls SET status = $1, error_code = $2, error_text = $3, \
                 updated_at = $4, owner = $7 WHERE id = $5 AND tenant = $6",
            ),
        };
        bind_owner(
            update_call
                .bind(resolution.call_status.as_str())
                .bind(resolution.error_code.map(|code| code.as_str()))
                .bind(&resolution.error_text)
                .bind(resolution.at.0)
                .bind(tool_call_id.as_str())
                .bind(resolution.tenant.as_str()),
            self.owner,
        )
        .execute(self.conn.db())
        .await
        .map_err(unexpected(|| "tool call".into()))?;
        if resolution.call_status == ToolCallStatus::Running {
            self.mark_in_flight(&tool_call_id).await?;
        }
        query(RELEASE_PENDING)
            .bind(1_i64)
            .bind(resolution.tenant.as_str())
            .bind(run.as_str())
            .execute(self.conn.db())
            .await
            .map_err(unexpected(|| "run".into()))?;
        for event in events {
            self.append(event).await?;
        }
        Ok(true)
    }

    async fn insert_pending(&mut self, pending: &PreparedPending) -> Result<(), Fail> {
        let record = &pending.record;
        query(INSERT_PENDING)
            .bind(&record.id)
            .bind(record.tenant.as_str())
            .bind(record.run.as_str())
            .bind(record.tool_call_id.as_str())
            .bind(record.tool.as_str())
            .bind(&pending.arguments)
            .bind(&pending.arguments_sealed)
            .bind(&pending.arguments_key_id)
            .bind(&record.args_hash)
            .bind(&pending.manifest)
            .bind(record.policy_version)
            .bind(record.origin.as_str())
            .bind(record.decision.as_str())
            .bind(record.state.as_str())
            .bind(record.version)
            .bind(record.expires_at.0)
            .bind(record.created_at.0)
            .bind(pending.timeout_ms)
            .bind(&record.trace_parent)
            .execute(self.conn.db())
            .await
            .map_err(refused(
                || format!("pending invocation {}", record.id),
                || {
                    LedgerError::NotFound(format!(
                        "run {} or tool call {}",
                        record.run, record.tool_call_id
                    ))
                },
            ))?;
        Ok(())
    }

    async fn add_pending(
        &mut self,
        pending: &PreparedPending,
        events: &[PreparedEvent],
    ) -> Result<Reply, Fail> {
        self.insert_pending(pending).await?;
        query(
            "UPDATE runs SET pending_approvals = pending_approvals + 1, \
             status = 'waiting_approval' WHERE tenant = $1 AND id = $2",
        )
        .bind(pending.record.tenant.as_str())
        .bind(pending.record.run.as_str())
        .execute(self.conn.db())
        .await
        .map_err(unexpected(|| "run".into()))?;
        for event in events {
            self.append(event).await?;
        }
        Ok(Reply::Done)
    }

    async fn put_credential(&mut self, credential: &CredentialRecord) -> Result<Reply, Fail> {
        query(
            "INSERT INTO tenant_tool_secrets (tenant, name, kind, value, key_id, metadata, notes, \
             created_by, created_at, updated_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) \
             ON CONFLICT (tenant, name) DO UPDATE SET kind = excluded.kind, value = excluded.value, \
             key_id = excluded.key_id, metadata = excluded.metadata, notes = excluded.notes, \
             created_by = excluded.created_by, updated_at = excluded.updated_at",
        )
        .bind(credential.tenant.as_str())
        .bind(credential.name.as_str())
        .bind(credential.kind.as_str())
        .bind(&credential.value)
        .bind(&credential.key_id)
        .bind(credential.metadata.to_string().as_str())
        .bind(&credential.notes)
        .bind(&credential.created_by)
        .bind(credential.created_at.0)
        .bind(credential.updated_at.0)
        .execute(self.conn.db())
        .await
        .map_err(refused(|| format!("secret {} of tenant {}", credential.name, credential.tenant), || LedgerError::NotFound(format!("tenant {}", credential.tenant))))?;
        Ok(Reply::Done)
    }

    /// After a foreign key violation: which of tenant and agent is missing.
    async fn missing_parent(
        &mut self,
        tenant: &str,
        agent: Option<&str>,
    ) -> Result<LedgerError, Fail> {
        self.conn.recover().await?;
        let found = query("SELECT 1 FROM tenants WHERE id = $1")
            .bind(tenant)
            .fetch_optional(self.conn.db())
            .await
            .map_err(read_failure)?;
        if found.is_none() {
            return Ok(LedgerError::NotFound(format!("tenant {tenant}")));
        }
        Ok(match agent {
            Some(agent) => LedgerError::NotFound(format!("agent {tenant}/{agent}")),
            None => LedgerError::NotFound(format!("a parent row of tenant {tenant}")),
        })
    }

    /// A refused write whose foreign key names a tenant and maybe an agent.
    async fn parent_failure(
        &mut self,
        error: &sqlx::Error,
        tenant: &str,
        agent: Option<&str>,
        exists: impl FnOnce() -> String,
    ) -> Fail {
        match SqlFailure::classify(error) {
            SqlFailure::ForeignKey => match self.missing_parent(tenant, agent).await {
                Ok(missing) => Fail::Op(missing),
                Err(fail) => fail,
            },
            _ => write_failure(error, exists, || {
                LedgerError::Database("unexpected foreign key failure".into())
            }),
        }
    }

    async fn create_agent(&mut self, agent: &Agent) -> Result<Reply, Fail> {
        query("INSERT INTO agents (tenant, id, name, created_at) VALUES ($1, $2, $3, $4)")
            .bind(agent.tenant.as_str())
            .bind(agent.id.as_str())
            .bind(&agent.name)
            .bind(agent.created_at.0)
            .execute(self.conn.db())
            .await
            .map_err(refused(
                || format!("agent {}/{}", agent.tenant, agent.id),
                || LedgerError::NotFound(format!("tenant {}", agent.tenant)),
            ))?;
        Ok(Reply::Done)
    }

    async fn create_token(&mut self, token: &TokenRecord) -> Result<Reply, Fail> {
        let inserted = query(
            "INSERT INTO api_tokens (id, hash, role, tenant, agent, label, created_at, revoked) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
        )
        .bind(&token.id)
        .bind(&token.hash)
        .bind(token.role.as_str())
        .bind(token.tenant.as_ref().map(|tenant| tenant.as_str()))
        .bind(token.agent.as_ref().map(|agent| agent.as_str()))
        .bind(&token.label)
        .bind(token.created_at.0)
        .bind(token.revoked)
        .execute(self.conn.db())
        .await;
        let Err(error) = inserted else {
            return Ok(Reply::Done);
        };
        let tenant = token.tenant.as_ref().map_or("", |tenant| tenant.as_str());
        let agent = token.agent.as_ref().map(|agent| agent.as_str());
        // Never name the hash: it identifies the secret.
        Err(self
            .parent_failure(&error, tenant, agent, || {
                format!("token {} (or a token with the same secret)", token.id)
            })
            .await)
    }

    async fn put_permission(&mut self, permission: &Permission) -> Result<Reply, Fail> {
        // Each case names its own partial unique index as the conflict target.
        let upsert = match permission.agent {
            None => query(
                "INSERT INTO tool_permissions (tenant, agent, tool, enabled, updated_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, tool) WHERE agent IS NULL \
                 DO UPDATE SET enabled = excluded.enabled, updated_at = excluded.updated_at",
            ),
            Some(_) => query(
                "INSERT INTO tool_permissions (tenant, agent, tool, enabled, updated_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, agent, tool) \
                 WHERE agent IS NOT NULL \
                 DO UPDATE SET enabled = excluded.enabled, updated_at = excluded.updated_at",
            ),
        };
        let agent = permission.agent.as_ref().map(|agent| agent.as_str());
        let written = upsert
            .bind(permission.tenant.as_str())
            .bind(agent)
            .bind(permission.tool.as_str())
            .bind(permission.enabled)
            .bind(permission.updated_at.0)
            .execute(self.conn.db())
            .await;
        let Err(error) = written else {
            return Ok(Reply::Done);
        };
        Err(self
            .parent_failure(&error, permission.tenant.as_str(), agent, || {
                format!("grant of {}", permission.tool)
            })
            .await)
    }

    async fn create_run(&mut self, run: &RunRecord, manifest: &str) -> Result<Reply, Fail> {
        let inserted = query(
            "INSERT INTO runs (id, tenant, agent, manifest, status, calls_used, max_calls, \
             pending_approvals, created_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        )
        .bind(run.id.as_str())
        .bind(run.tenant.as_str())
        .bind(run.agent.as_str())
        .bind(manifest)
        .bind(run.status.as_str())
        .bind(run.calls_used)
        .bind(run.max_calls)
        .bind(run.pending_approvals)
        .bind(run.created_at.0)
        .execute(self.conn.db())
        .await;
        let Err(error) = inserted else {
            return Ok(Reply::Done);
        };
        Err(self
            .parent_failure(
                &error,
                run.tenant.as_str(),
                Some(run.agent.as_str()),
                || format!("run {}", run.id),
            )
            .await)
    }

    /// See `Store::record_call`. The call row goes in first, so a repeated `tool_use_id` is
    /// found before anything else is written.
    async fn record_call(&mut self, prepared: &PreparedCall) -> Result<RecordOutcome, Fail> {
        let call = &prepared.call;
        let inserted = match self.conn.insert_call(prepared, self.owner).await {
            Ok(inserted) => inserted,
            Err(error) => match SqlFailure::classify(&error) {
                SqlFailure::Unique => {
                    self.conn.recover().await?;
                    false
                }
                SqlFailure::ForeignKey => {
                    return Err(Fail::Op(LedgerError::NotFound(format!(
                        "run {} of tenant {}",
                        call.run, call.tenant
                    ))));
                }
                SqlFailure::Constraint(message) => {
                    return Err(Fail::Op(LedgerError::Constraint(message)));
                }
                SqlFailure::Fatal(message) => {
                    return Err(Fail::Fatal(LedgerError::Database(message)));
                }
            },
        };
        if !inserted {
            return self.duplicate(call).await;
        }
        self.record_call_rest(prepared).await
    }

    /// The call row was not inserted: a repeated `tool_use_id` (answer with the recorded
    /// call) or a taken call id.
    async fn duplicate(&mut self, call: &ToolCallRecord) -> Result<RecordOutcome, Fail> {
        if let Some(tool_use_id) = &call.tool_use_id {
            let existing = query(concat!(
                "SELECT ",
                call_columns!(),
                " FROM tool_calls WHERE tenant = $1 AND run = $2 AND tool_use_id = $3"
            ))
            .bind(call.tenant.as_str())
            .bind(call.run.as_str())
            .bind(tool_use_id.as_str())
            .fetch_optional(self.conn.db())
            .await
            .map_err(read_failure)?;
            if let Some(row) = existing {
                let record = call_from_row(&row).map_err(Fail::Op)?;
                return Ok(RecordOutcome::Duplicate(record));
            }
        }
        Err(Fail::Op(LedgerError::AlreadyExists(format!(
            "tool call {}",
            call.id
        ))))
    }

    /// See `Store::retry_call`: the existing call row is rewritten only while it is still the
    /// refusal observed (on PostgreSQL it becomes this instance's call), then everything else
    /// goes in as for a new call.
    async fn retry_call(
        &mut self,
        prepared: &PreparedCall,
        observed_evaluation: i64,
    ) -> Result<RecordOutcome, Fail> {
        let call = &prepared.call;
        let update = match self.owner {
            None => query(
                "UPDATE tool_calls SET tool = $1, action = $2, correlation_id = $3, status = $4, \
                 args_hash = $5, input_redacted = $6, output_redacted = $7, error_code = $8, \
                 error_text = $9, policy_decision_id = $10, risk_level = $11, duration_ms = $12, \
                 attempts = $13, updated_at = $14, answer_sealed = NULL, \
                 answer_expires_at = NULL, evaluation = evaluation + 1 \
                 WHERE id = $15 AND tenant = $16 AND run = $17 AND evaluation = $18 \
                 AND status IN ('blocked', 'failed')",
            ),
            // The answer of the refusal is deleted below, from its own table.
            Some(_) => query(
                "UPDATE tool_calls SET tool = $1, action = $2, correlation_id = $3, status = $4, \
                 args_hash = $5, input_redacted = $6, output_redacted = $7, error_code = $8, \
                 error_text = $9, policy_decision_id = $10, risk_level = $11, duration_ms = $12, \
                 attempts = $13, updated_at = $14, evaluation = evaluation + 1, owner = $19 \
                 WHERE id = $15 AND tenant = $16 AND run = $17 AND evaluation = $18 \
                 AND status IN ('blocked', 'failed')",
            ),
        };
        let update = update
            .bind(&call.tool)
            .bind(call.action.as_deref())
            .bind(call.correlation_id.as_str())
            .bind(call.status.as_str())
            .bind(&call.args_hash)
            .bind(&prepared.input)
            .bind(&prepared.output)
            .bind(call.error_code.map(|code| code.as_str()))
            .bind(&call.error_text)
            .bind(&call.policy_decision_id)
            .bind(call.risk_level.map(|risk| risk.as_str()))
            .bind(call.duration_ms)
            .bind(call.attempts)
            .bind(call.updated_at.0)
            .bind(call.id.as_str())
            .bind(call.tenant.as_str())
            .bind(call.run.as_str())
            .bind(observed_evaluation);
        let changed = bind_owner(update, self.owner)
            .execute(self.conn.db())
            .await
            .map_err(refused(
                || format!("tool call {}", call.id),
                || LedgerError::NotFound(format!("tool call {}", call.id)),
            ))?;
        if changed == 0 {
            // Another evaluation (or an execution) got there first: answer with the call as
            // it now stands.
            let current = query(concat!(
                "SELECT ",
                call_columns!(),
                " FROM tool_calls WHERE id = $1 AND tenant = $2"
            ))
            .bind(call.id.as_str())
            .bind(call.tenant.as_str())
            .fetch_optional(self.conn.db())
            .await
            .map_err(read_failure)?;
            return match current {
                Some(row) => Ok(RecordOutcome::Duplicate(
                    call_from_row(&row).map_err(Fail::Op)?,
                )),
                None => Err(Fail::Op(LedgerError::NotFound(format!(
                    "tool call {}",
                    call.id
                )))),
            };
        }

        if C::DIALECT == Dialect::Postgres {
            query("DELETE FROM call_answers WHERE call_id = $1 AND tenant = $2")
                .bind(call.id.as_str())
                .bind(call.tenant.as_str())
                .execute(self.conn.db())
                .await
                .map_err(unexpected(|| {
                    format!("the answer of tool call {}", call.id)
                }))?;
        }

        // A policy denial the earlier evaluation left open is superseded by this one: it no
        // longer waits for a decision, and a later decision cannot overwrite this evaluation.
        let closed = query(
            "UPDATE pending_invocations SET state = 'rejected', version = version + 1, \
             decided_by = 'system: re-evaluated', \
             reason = 'superseded by a repeat of the call', decided_at = $1 \
             WHERE tenant = $2 AND tool_call_id = $3 AND state = 'pending'",
        )
        .bind(call.updated_at.0)
        .bind(call.tenant.as_str())
        .bind(call.id.as_str())
        .execute(self.conn.db())
        .await
        .map_err(refused(
            || format!("pending invocations of tool call {}", call.id),
            || LedgerError::NotFound(format!("tool call {}", call.id)),
        ))?;
        if closed > 0 {
            let release = query(RELEASE_PENDING).bind(i64::try_from(closed).unwrap_or(i64::MAX));
            self.update_run(release, call).await?;
        }
        self.record_call_rest(prepared).await
    }

    /// Runs `update` (whose last two binds are the tenant and the run) on `call`'s run; the
    /// rows it changed.
    async fn update_run(&mut self, update: Query<'_>, call: &ToolCallRecord) -> Result<u64, Fail> {
        update
            .bind(call.tenant.as_str())
            .bind(call.run.as_str())
            .execute(self.conn.db())
            .await
            .map_err(refused(
                || format!("run {}", call.run),
                || LedgerError::NotFound(format!("run {}", call.run)),
            ))
    }

    /// Everything `record_call` writes after the call row: the budget, the decision, the
    /// pending invocation and the events.
    async fn record_call_rest(&mut self, prepared: &PreparedCall) -> Result<RecordOutcome, Fail> {
        let call = &prepared.call;
        if prepared.count_against_budget || prepared.pending.is_some() {
            let update = if prepared.pending.is_none() {
                // The usual call: counted, nothing suspended. The run's status is left alone,
                // so SQLite does not check its CHECK (which builds a table of the allowed
                // values each time).
                query(COUNT_CALL)
            } else {
                query(COUNT_PENDING_CALL).bind(i64::from(prepared.count_against_budget))
            };
            if self.update_run(update, call).await? == 0 {
                // The call row's foreign key proved the run exists: its budget is used up.
                return self.block_for_budget(prepared).await;
            }
        }

        if call.status == ToolCallStatus::Running {
            self.mark_in_flight(call.id.as_str()).await?;
        }

        if let Some((decision, policy_ids)) = &prepared.decision {
            query(INSERT_DECISION)
                .bind(&decision.id)
                .bind(decision.tenant.as_str())
                .bind(decision.tool_call_id.as_str())
                .bind(decision.tool.as_str())
                .bind(decision.decision.as_str())
                .bind(decision.risk.as_str())
                .bind(policy_ids)
                .bind(decision.policy_version)
                .bind(decision.created_at.0)
                .execute(self.conn.db())
                .await
                .map_err(refused(
                    || format!("policy decision {}", decision.id),
                    || LedgerError::NotFound(format!("tool call {}", decision.tool_call_id)),
                ))?;
        }

        if let Some(pending) = &prepared.pending {
            self.insert_pending(pending).await?;
        }
        for event in &prepared.events {
            self.append(event).await?;
        }
        Ok(RecordOutcome::Recorded)
    }

    /// Turns the just-inserted call into a `blocked` / `BUDGET_EXCEEDED` record with a
    /// `tool_call.blocked` event; the decision and the pending invocation are not written, and
    /// of the given events only `tool_call.requested` is kept.
    async fn block_for_budget(&mut self, prepared: &PreparedCall) -> Result<RecordOutcome, Fail> {
        let call = &prepared.call;
        let run = query("SELECT max_calls FROM runs WHERE tenant = $1 AND id = $2")
            .bind(call.tenant.as_str())
            .bind(call.run.as_str())
            .fetch_one(self.conn.db())
            .await
            .map_err(read_failure)?;
        let max_calls = run.int("max_calls").map_err(Fail::Op)?;
        let mut blocked = call.clone();
        blocked.status = ToolCallStatus::Blocked;
        blocked.output_redacted = None;
        blocked.error_code = Some(ErrorCode::BudgetExceeded);
        blocked.error_text = Some(format!(
            "the run has used its budget of {max_calls} tool calls"
        ));
        // The decision is not recorded, and the risk level was part of it.
        blocked.policy_decision_id = None;
        blocked.risk_level = None;
        blocked.duration_ms = None;

        query(
            "UPDATE tool_calls SET status = $1, output_redacted = NULL, error_code = $2, \
             error_text = $3, policy_decision_id = NULL, risk_level = NULL, duration_ms = NULL \
             WHERE id = $4",
        )
        .bind(blocked.status.as_str())
        .bind(ErrorCode::BudgetExceeded.as_str())
        .bind(&blocked.error_text)
        .bind(blocked.id.as_str())
        .execute(self.conn.db())
        .await
        .map_err(refused(
            || format!("tool call {}", call.id),
            || LedgerError::NotFound(format!("tool call {}", call.id)),
        ))?;

        // The prepared binding names a decision and a pending invocation that are not
        // written: the requested events go in without it, and the blocked event binds the
        // call as it now stands.
        for event in prepared
            .events
            .iter()
            .filter(|event| event.kind == REQUESTED_EVENT)
        {
            let unbound = PreparedEvent {
                binding: None,
                ..event.clone()
            };
            self.append(&unbound).await?;
        }
        let mut blocked_events = vec![PreparedEvent {
            tenant: call.tenant.as_str().to_owned(),
            kind: "tool_call.blocked".to_owned(),
            run: Some(call.run.as_str().to_owned()),
            tool_call_id: Some(call.id.as_str().to_owned()),
            payload: json!({ "reason": "budget_exceeded" }).to_string(),
            at: call.updated_at.0,
            binding: None,
        }];
        crate::binding::Binding::default()
            .call(&blocked, &prepared.input, None)
            .attach(&mut blocked_events, call.id.as_str());
        for event in &blocked_events {
            self.append(event).await?;
        }
        Ok(RecordOutcome::BudgetExceeded(blocked))
    }

    /// PostgreSQL: the call becomes one of this process's calls in flight (`calls_in_flight`,
    /// where recovery looks for a dead process's calls). SQLite keeps none: its partial index
    /// of `running` calls is that list.
    async fn mark_in_flight(&mut self, call_id: &str) -> Result<(), Fail> {
        let Some(owner) = self.owner else {
            return Ok(());
        };
        query("INSERT INTO calls_in_flight (owner, call_id) VALUES ($1, $2)")
            .bind(owner)
            .bind(call_id)
            .execute(self.conn.db())
            .await
            .map_err(unexpected(|| format!("tool call {call_id} in flight")))?;
        Ok(())
    }

    async fn finish_call(&mut self, prepared: &PreparedFinish) -> Result<bool, Fail> {
        let finished = match C::DIALECT {
            Dialect::Sqlite => self.finish_sqlite(prepared).await?,
            Dialect::Postgres => self.finish_postgres(prepared).await?,
        };
        if !finished {
            return Ok(false);
        }
        for event in &prepared.events {
            self.append(event).await?;
        }
        Ok(true)
    }

    /// SQLite: the sealed answer is kept in the call's row.
    async fn finish_sqlite(&mut self, prepared: &PreparedFinish) -> Result<bool, Fail> {
        let finish = &prepared.finish;
        let update = query(
            "UPDATE tool_calls SET status = $1, output_redacted = $2, error_code = $3, \
             error_text = $4, duration_ms = $5, attempts = $6, updated_at = $7, \
             answer_sealed = $10, answer_expires_at = $11 \
             WHERE id = $8 AND tenant = $9 AND status = 'running'",
        );
        let changed = bind_finish(update, prepared)
            .bind(&prepared.answer)
            .bind(prepared.answer_expires_at)
            .execute(self.conn.db())
            .await
            .map_err(refused(
                || format!("tool call {}", finish.id),
                || LedgerError::NotFound(format!("tool call {}", finish.id)),
            ))?;
        Ok(changed > 0)
    }

    /// PostgreSQL: the update changes no indexed column (so it can be HOT); the call leaves
    /// `calls_in_flight` and its sealed answer goes into `call_answers`.
    async fn finish_postgres(&mut self, prepared: &PreparedFinish) -> Result<bool, Fail> {
        let finish = &prepared.finish;
        let update = query(
            "UPDATE tool_calls SET status = $1, output_redacted = $2, error_code = $3, \
             error_text = $4, duration_ms = $5, attempts = $6, updated_at = $7 \
             WHERE id = $8 AND tenant = $9 AND status = 'running' RETURNING owner",
        );
        let finished = bind_finish(update, prepared)
            .fetch_optional(self.conn.db())
            .await
            .map_err(refused(
                || format!("tool call {}", finish.id),
                || LedgerError::NotFound(format!("tool call {}", finish.id)),
            ))?;
        let Some(row) = finished else {
            return Ok(false);
        };
        let owner = row.int("owner").map_err(Fail::Op)?;
        query("DELETE FROM calls_in_flight WHERE owner = $1 AND call_id = $2")
            .bind(owner)
            .bind(finish.id.as_str())
            .execute(self.conn.db())
            .await
            .map_err(unexpected(|| format!("tool call {} in flight", finish.id)))?;
        if let (Some(answer), Some(expires_at)) = (&prepared.answer, prepared.answer_expires_at) {
            query(
                "INSERT INTO call_answers (call_id, tenant, sealed, expires_at) \
                 VALUES ($1, $2, $3, $4)",
            )
            .bind(finish.id.as_str())
            .bind(finish.tenant.as_str())
            .bind(answer)
            .bind(expires_at)
            .execute(self.conn.db())
            .await
            .map_err(refused(
                || format!("the answer of tool call {}", finish.id),
                || LedgerError::NotFound(format!("tool call {}", finish.id)),
            ))?;
        }
        Ok(true)
    }

    /// Appends one event to its tenant's chain.
    pub(crate) async fn append(&mut self, event: &PreparedEvent) -> Result<(), Fail> {
        let previous = self.conn.head(self.heads, &event.tenant).await?;
        let chain_seq = previous.chain_seq + 1;
        let (key_id, hash) =
            crate::chain::new_link(self.keys, &previous.hash, &event.fields(chain_seq))
                .map_err(Fail::Fatal)?;
        let inserted = query(INSERT_EVENT)
            .bind(&event.tenant)
            .bind(chain_seq)
            .bind(&event.kind)
            .bind(&event.run)
            .bind(&event.tool_call_id)
            .bind(&event.payload)
            .bind(event.at)
            .bind(&previous.hash)
            .bind(&hash)
            .bind(&key_id)
            // A legacy hash does not cover the binding, so none is stored with it.
            .bind(key_id.as_ref().and(event.binding.as_deref()))
            .execute(self.conn.db())
            .await;
        if let Err(error) = inserted {
            return Err(match SqlFailure::classify(&error) {
                SqlFailure::ForeignKey => {
                    Fail::Op(LedgerError::NotFound(format!("tenant {}", event.tenant)))
                }
                // The head this writer chained from is behind the database: another writer
                // appended to this chain.
                SqlFailure::Unique => Fail::Fatal(LedgerError::Database(format!(
                    "the audit chain of tenant {} moved outside this writer",
                    event.tenant
                ))),
                SqlFailure::Constraint(message) => Fail::Op(LedgerError::Constraint(message)),
                SqlFailure::Fatal(message) => Fail::Fatal(LedgerError::Database(message)),
            });
        }
        self.undo.push((event.tenant.clone(), previous));
        self.heads
            .insert(event.tenant.clone(), Head { chain_seq, hash });
        Ok(())
    }
}

/// Binds a finish's new values (`$1` to `$7`: status, output, error code and text, duration,
/// attempts, time) and the call it finishes (`$8` id, `$9` tenant).
fn bind_finish<'a>(query: Query<'a>, prepared: &'a PreparedFinish) -> Query<'a> {
    let finish = &prepared.finish;
    query
        .bind(finish.status.as_str())
        .bind(&prepared.output)
        .bind(finish.error_code.map(|code| code.as_str()))
        .bind(&finish.error_text)
        .bind(finish.duration_ms)
        .bind(finish.attempts)
        .bind(finish.at.0)
        .bind(finish.id.as_str())
        .bind(finish.tenant.as_str())
}

/// Binds the owner last, where the PostgreSQL statements take it.
fn bind_owner(query: Query<'_>, owner: Option<i64>) -> Query<'_> {
    match owner {
        Some(owner) => query.bind(owner),
        None => query,
    }
}
