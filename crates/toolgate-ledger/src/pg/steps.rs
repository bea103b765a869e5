//! Write operations on PostgreSQL, one statement at a time, inside the savepoint `op` the
//! writer opens for each. A failed statement aborts the transaction up to that savepoint, so
//! an operation that must look around after a refusal (which parent is missing) first rolls
//! back to it; the writer rolls back again on any failure, which is harmless. An administrative
//! operation writes its change, then its audit event, in that same savepoint: they commit
//! together, and a refused change writes no event.

use std::collections::HashMap;

use serde_json::json;
use sqlx::Row;
use sqlx::postgres::PgConnection;
use toolgate_core::{AuditKeys, ErrorCode, ToolCallStatus};

use crate::chain::GENESIS_HASH;
use crate::error::LedgerError;
use crate::model::{
    Agent, CredentialRecord, Permission, RecordOutcome, ResolvePending, RunRecord, Tenant,
    TokenRecord, ToolCallRecord,
};
use crate::ops::{OpKind, PreparedCall, PreparedEvent, PreparedFinish, PreparedPending, Reply};
use crate::rows::{Fail, SqlFailure, call_columns, call_from_row, read_failure, write_failure};

/// The audit event kind kept when a call is blocked for its budget.
const REQUESTED_EVENT: &str = "tool_call.requested";

/// The newest event of a tenant's chain, as locked at the start of the batch.
#[derive(Clone, Debug)]
pub(super) struct Head {
    pub(super) chain_seq: i64,
    pub(super) hash: String,
}

/// Where an event goes in its chain.
#[derive(Clone, Debug)]
pub(super) struct Link {
    pub(super) chain_seq: i64,
    pub(super) prev_hash: String,
    pub(super) hash: String,
    /// The master key id whose chain key MAC'd the event; `None` for a legacy hash.
    pub(super) key_id: Option<String>,
    /// The event's binding; never with a legacy hash, which would not cover it.
    pub(super) binding: Option<String>,
}

/// The next link of `event`'s chain after `heads`, moving the head, MAC'd with `keys` (the
/// legacy hash without). `Ok(None)` when the batch did not lock that tenant's head (it has
/// none: the tenant does not exist).
pub(super) fn link(
    heads: &mut HashMap<String, Head>,
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

pub(super) const INSERT_CALL: &str = "INSERT INTO tool_calls (id, tenant, run, agent, tool, \
     action, tool_use_id, correlation_id, status, args_hash, input_redacted, output_redacted, \
     error_code, error_text, policy_decision_id, risk_level, duration_ms, attempts, created_at, \
     updated_at, owner) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, \
     $15, $16, $17, $18, $19, $20, $21) ON CONFLICT DO NOTHING RETURNING seq";

const INSERT_PENDING: &str = "INSERT INTO pending_invocations (id, tenant, run, tool_call_id, \
     tool, arguments, args_hash, manifest, policy_version, origin, decision, state, version, \
     expires_at, created_at, timeout_ms, arguments_sealed, arguments_key_id) VALUES ($1, $2, $3, \
     $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18)";

/// One operation's view of the writer.
pub(super) struct Steps<'w> {
    pub(super) conn: &'w mut PgConnection,
    pub(super) heads: &'w mut HashMap<String, Head>,
    /// Heads this operation moved, with the head each replaced, oldest first.
    pub(super) undo: Vec<(String, Head)>,
    pub(super) instance: i64,
    pub(super) keys: Option<&'w dyn AuditKeys>,
}

impl Steps<'_> {
    pub(super) async fn apply(&mut self, op: &OpKind) -> Result<Reply, Fail> {
        match op {
            OpKind::CreateTenant(tenant, event) => {
                self.create_tenant(tenant).await?;
                // This transaction created the chain's head row, so it holds it: the new
                // chain starts here, and later operations of the batch may append to it.
                let chain = tenant.id.as_str();
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
                let update = sqlx::query(
                    "UPDATE api_tokens SET revoked = TRUE \
                     WHERE id = $1 AND tenant IS NOT DISTINCT FROM $2",
                )
                .bind(id)
                .bind(tenant.as_ref().map(|tenant| tenant.as_str()));
                let changed = self
                    .write(update)
                    .await
                    .map_err(|error| unexpected(&error))?;
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
                let upsert = sqlx::query(
                    "INSERT INTO feature_flags (tenant, flag, enabled, updated_at) \
                     VALUES ($1, $2, $3, $4) ON CONFLICT (tenant, flag) DO UPDATE \
                     SET enabled = excluded.enabled, updated_at = excluded.updated_at",
                )
                .bind(tenant.as_str())
                .bind(flag)
                .bind(*enabled)
                .bind(at.0);
                self.write(upsert).await.map_err(|error| {
                    write_failure(
                        &error,
                        || format!("flag {flag} of tenant {tenant}"),
                        || LedgerError::NotFound(format!("tenant {tenant}")),
                    )
                })?;
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
                // Versions are numbered per tenant; replicas take turns through the tenant row
                // (a lock that does not block rows referencing the tenant).
                let tenant_row =
                    sqlx::query("SELECT 1 FROM tenants WHERE id = $1 FOR NO KEY UPDATE")
                        .bind(tenant.as_str())
                        .fetch_optional(&mut *self.conn)
                        .await
                        .map_err(read_failure)?;
                if tenant_row.is_none() {
                    return Err(Fail::Op(LedgerError::NotFound(format!("tenant {tenant}"))));
                }
                let insert = sqlx::query(
                    "INSERT INTO policy_sets (tenant, version, text, created_by, created_at) \
                     SELECT $1, COALESCE(MAX(version), 0) + 1, $2, $3, $4 \
                     FROM policy_sets WHERE tenant = $1 RETURNING version",
                )
                .bind(tenant.as_str())
                .bind(text)
                .bind(created_by)
                .bind(at.0);
                let row = insert.fetch_one(&mut *self.conn).await.map_err(|error| {
                    write_failure(
                        &error,
                        || format!("a policy set version of tenant {tenant}"),
                        || LedgerError::NotFound(format!("tenant {tenant}")),
                    )
                })?;
                let version: i64 = row.try_get("version").map_err(read_failure)?;
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
                let purge = sqlx::query(
                    "UPDATE tool_calls SET answer_sealed = NULL, answer_expires_at = NULL \
                     WHERE id IN (SELECT id FROM tool_calls WHERE answer_sealed IS NOT NULL \
                     AND answer_expires_at <= $1 ORDER BY answer_expires_at LIMIT $2)",
                )
                .bind(now.0)
                .bind(i64::from(*limit));
                let purged = self
                    .write(purge)
                    .await
                    .map_err(|error| unexpected(&error))?;
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
            OpKind::DeleteCredential {
                tenant,
                name,
                event,
            } => {
                let delete =
                    sqlx::query("DELETE FROM tenant_tool_secrets WHERE tenant = $1 AND name = $2")
                        .bind(tenant.as_str())
                        .bind(name.as_str());
                let changed = self
                    .write(delete)
                    .await
                    .map_err(|error| unexpected(&error))?;
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
                let update = sqlx::query(
                    "UPDATE tenant_tool_secrets SET value = $1, key_id = $2, updated_at = $3 \
                     WHERE tenant = $4 AND name = $5 AND kind = 'sealed' AND value = $6",
                )
                .bind(value)
                .bind(key_id)
                .bind(at.0)
                .bind(tenant.as_str())
                .bind(name.as_str())
                .bind(expected);
                let changed = self
                    .write(update)
                    .await
                    .map_err(|error| unexpected(&error))?;
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
                let update = sqlx::query(
                    "UPDATE pending_invocations SET arguments = NULL, arguments_sealed = $1, \
                     arguments_key_id = $2 WHERE tenant = $3 AND id = $4 AND state = 'pending' \
                     AND (arguments_sealed = $5 OR ($5 IS NULL AND arguments_sealed IS NULL \
                     AND arguments IS NOT NULL))",
                )
                .bind(sealed)
                .bind(key_id)
                .bind(tenant.as_str())
                .bind(id)
                .bind(expected);
                let changed = self
                    .write(update)
                    .await
                    .map_err(|error| unexpected(&error))?;
                Ok(Reply::Finished(changed == 1))
            }
        }
    }

    async fn write<'q>(
        &mut self,
        query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    ) -> Result<u64, sqlx::Error> {
        Ok(query.execute(&mut *self.conn).await?.rows_affected())
    }

    /// Undoes the failed statement so the operation can look around before answering.
    async fn recover(&mut self) -> Result<(), Fail> {
        sqlx::raw_sql("ROLLBACK TO SAVEPOINT op")
            .execute(&mut *self.conn)
            .await
            .map(|_| ())
            .map_err(|error| Fail::Fatal(LedgerError::Database(error.to_string())))
    }

    async fn exists(&mut self, sql: &'static str, key: &str) -> Result<bool, Fail> {
        let row = sqlx::query(sql)
            .bind(key)
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(read_failure)?;
        Ok(row.is_some())
    }

    /// After a foreign key violation: which of tenant and agent is missing.
    async fn missing_parent(
        &mut self,
        tenant: &str,
        agent: Option<&str>,
    ) -> Result<LedgerError, Fail> {
        self.recover().await?;
        if !self
            .exists("SELECT 1 FROM tenants WHERE id = $1", tenant)
            .await?
        {
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

    async fn create_tenant(&mut self, tenant: &Tenant) -> Result<Reply, Fail> {
        let insert = sqlx::query("INSERT INTO tenants (id, name, created_at) VALUES ($1, $2, $3)")
            .bind(tenant.id.as_str())
            .bind(&tenant.name)
            .bind(tenant.created_at.0);
        self.write(insert).await.map_err(|error| {
            write_failure(
                &error,
                || format!("tenant {}", tenant.id),
                || LedgerError::Database("unexpected foreign key failure".into()),
            )
        })?;
        // The chain's head exists from the start, so appending always has a row to lock.
        let head =
            sqlx::query("INSERT INTO audit_heads (tenant, chain_seq, hash) VALUES ($1, 0, $2)")
                .bind(tenant.id.as_str())
                .bind(GENESIS_HASH);
        self.write(head).await.map_err(|error| unexpected(&error))?;
        Ok(Reply::Done)
    }

    async fn create_agent(&mut self, agent: &Agent) -> Result<Reply, Fail> {
        let insert = sqlx::query(
            "INSERT INTO agents (tenant, id, name, created_at) VALUES ($1, $2, $3, $4)",
        )
        .bind(agent.tenant.as_str())
        .bind(agent.id.as_str())
        .bind(&agent.name)
        .bind(agent.created_at.0);
        self.write(insert).await.map_err(|error| {
            write_failure(
                &error,
                || format!("agent {}/{}", agent.tenant, agent.id),
                || LedgerError::NotFound(format!("tenant {}", agent.tenant)),
            )
        })?;
        Ok(Reply::Done)
    }

    async fn create_token(&mut self, token: &TokenRecord) -> Result<Reply, Fail> {
        let insert = sqlx::query(
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
        .bind(token.revoked);
        let Err(error) = self.write(insert).await else {
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
        let sql = match permission.agent {
            None => {
                "INSERT INTO tool_permissions (tenant, agent, tool, enabled, updated_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, tool) WHERE agent IS NULL \
                 DO UPDATE SET enabled = excluded.enabled, updated_at = excluded.updated_at"
            }
            Some(_) => {
                "INSERT INTO tool_permissions (tenant, agent, tool, enabled, updated_at) \
                 VALUES ($1, $2, $3, $4, $5) ON CONFLICT (tenant, agent, tool) \
                 WHERE agent IS NOT NULL \
                 DO UPDATE SET enabled = excluded.enabled, updated_at = excluded.updated_at"
            }
        };
        let upsert = sqlx::query(sql)
            .bind(permission.tenant.as_str())
            .bind(permission.agent.as_ref().map(|agent| agent.as_str()))
            .bind(permission.tool.as_str())
            .bind(permission.enabled)
            .bind(permission.updated_at.0);
        let Err(error) = self.write(upsert).await else {
            return Ok(Reply::Done);
        };
        let agent = permission.agent.as_ref().map(|agent| agent.as_str());
        Err(self
            .parent_failure(&error, permission.tenant.as_str(), agent, || {
                format!("grant of {}", permission.tool)
            })
            .await)
    }

    async fn create_run(&mut self, run: &RunRecord, manifest: &str) -> Result<Reply, Fail> {
        let insert = sqlx::query(
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
        .bind(run.created_at.0);
        let Err(error) = self.write(insert).await else {
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

    /// See `Store::record_call`. The call row goes in first (`ON CONFLICT DO NOTHING`), so a
    /// repeated `tool_use_id` is found without aborting anything.
    async fn record_call(&mut self, prepared: &PreparedCall) -> Result<RecordOutcome, Fail> {
        let call = &prepared.call;
        let insert = bind_call(sqlx::query(INSERT_CALL), prepared).bind(self.instance);
        let inserted = match insert.fetch_optional(&mut *self.conn).await {
            Ok(row) => row.is_some(),
            Err(error) => {
                return Err(match SqlFailure::classify(&error) {
                    SqlFailure::ForeignKey => Fail::Op(LedgerError::NotFound(format!(
                        "run {} of tenant {}",
                        call.run, call.tenant
                    ))),
                    SqlFailure::Fatal(message) => Fail::Fatal(LedgerError::Database(message)),
                    SqlFailure::Constraint(message) => Fail::Op(LedgerError::Constraint(message)),
                    SqlFailure::Unique => {
                        Fail::Op(LedgerError::AlreadyExists(format!("tool call {}", call.id)))
                    }
                });
            }
        };
        if !inserted {
            return self.duplicate(call).await;
        }
        self.record_call_rest(prepared).await
    }

    /// See `Store::retry_call`: the existing call row is rewritten only while it is still the
    /// refusal observed (and becomes this instance's call), then everything else goes in as
    /// for a new call.
    async fn retry_call(
        &mut self,
        prepared: &PreparedCall,
        observed_evaluation: i64,
    ) -> Result<RecordOutcome, Fail> {
        let call = &prepared.call;
        let update = sqlx::query(
            "UPDATE tool_calls SET tool = $1, action = $2, correlation_id = $3, status = $4, \
             args_hash = $5, input_redacted = $6, output_redacted = $7, error_code = $8, \
             error_text = $9, policy_decision_id = $10, risk_level = $11, duration_ms = $12, \
             attempts = $13, updated_at = $14, answer_sealed = NULL, answer_expires_at = NULL, \
             evaluation = evaluation + 1, owner = $15 \
             WHERE id = $16 AND tenant = $17 AND run = $18 AND evaluation = $19 \
             AND status IN ('blocked', 'failed')",
        )
        .bind(call.tool.clone())
        .bind(call.action.clone())
        .bind(call.correlation_id.as_str().to_owned())
        .bind(call.status.as_str())
        .bind(call.args_hash.clone())
        .bind(prepared.input.clone())
        .bind(prepared.output.clone())
        .bind(call.error_code.map(|code| code.as_str()))
        .bind(call.error_text.clone())
        .bind(call.policy_decision_id.clone())
        .bind(call.risk_level.map(|risk| risk.as_str()))
        .bind(call.duration_ms)
        .bind(call.attempts)
        .bind(call.updated_at.0)
        .bind(self.instance)
        .bind(call.id.as_str().to_owned())
        .bind(call.tenant.as_str().to_owned())
        .bind(call.run.as_str().to_owned())
        .bind(observed_evaluation);
        let changed = self
            .write(update)
            .await
            .map_err(|error| unexpected(&error))?;
        if changed == 0 {
            // Another evaluation (or an execution) got there first: answer with the call as
            // it now stands.
            let current = sqlx::query(concat!(
                "SELECT ",
                call_columns!(),
                " FROM tool_calls WHERE id = $1 AND tenant = $2"
            ))
            .bind(call.id.as_str().to_owned())
            .bind(call.tenant.as_str().to_owned())
            .fetch_optional(&mut *self.conn)
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

        // A policy denial the earlier evaluation left open is superseded by this one.
        let superseded = sqlx::query(
            "UPDATE pending_invocations SET state = 'rejected', version = version + 1, \
             decided_by = 'system: re-evaluated', \
             reason = 'superseded by a repeat of the call', decided_at = $1 \
             WHERE tenant = $2 AND tool_call_id = $3 AND state = 'pending'",
        )
        .bind(call.updated_at.0)
        .bind(call.tenant.as_str().to_owned())
        .bind(call.id.as_str().to_owned());
        let closed = self
            .write(superseded)
            .await
            .map_err(|error| unexpected(&error))?;
        if closed > 0 {
            let closed = i64::try_from(closed).unwrap_or(i64::MAX);
            let release = sqlx::query(
                "UPDATE runs SET pending_approvals = GREATEST(pending_approvals - $1, 0), \
                 status = CASE WHEN pending_approvals - $1 <= 0 AND status = 'waiting_approval' \
                 THEN 'active' ELSE status END WHERE tenant = $2 AND id = $3",
            )
            .bind(closed)
            .bind(call.tenant.as_str().to_owned())
            .bind(call.run.as_str().to_owned());
            self.write(release)
                .await
                .map_err(|error| unexpected(&error))?;
        }
        self.record_call_rest(prepared).await
    }

    /// Everything `record_call` writes after the call row: the budget, the decision, the
    /// pending invocation and the events.
    async fn record_call_rest(&mut self, prepared: &PreparedCall) -> Result<RecordOutcome, Fail> {
        let call = &prepared.call;
        let count_on_run = prepared.count_against_budget || prepared.pending.is_some();
        if count_on_run {
            let pending = i64::from(prepared.pending.is_some());
            let used = i64::from(prepared.count_against_budget);
            let update = sqlx::query(
                "UPDATE runs SET calls_used = calls_used + $1, \
                 pending_approvals = pending_approvals + $2, \
                 status = CASE WHEN $2 > 0 THEN 'waiting_approval' ELSE status END \
                 WHERE tenant = $3 AND id = $4 AND calls_used + $1 <= max_calls",
            )
            .bind(used)
            .bind(pending)
            .bind(call.tenant.as_str())
            .bind(call.run.as_str());
            let changed = self
                .write(update)
                .await
                .map_err(|error| unexpected(&error))?;
            if changed == 0 {
                // The call row's foreign key proved the run exists: its budget is used up.
                return self.block_for_budget(prepared).await;
            }
        }

        if let Some((decision, policy_ids)) = &prepared.decision {
            let insert = sqlx::query(
                "INSERT INTO policy_decisions (id, tenant, tool_call_id, tool, decision, risk, \
                 policy_ids, policy_version, created_at) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
            )
            .bind(&decision.id)
            .bind(decision.tenant.as_str())
            .bind(decision.tool_call_id.as_str())
            .bind(decision.tool.as_str())
            .bind(decision.decision.as_str())
            .bind(decision.risk.as_str())
            .bind(policy_ids)
            .bind(decision.policy_version)
            .bind(decision.created_at.0);
            self.write(insert).await.map_err(|error| {
                write_failure(
                    &error,
                    || format!("policy decision {}", decision.id),
                    || LedgerError::NotFound(format!("tool call {}", decision.tool_call_id)),
                )
            })?;
        }

        if let Some(pending) = &prepared.pending {
            self.insert_pending(pending).await?;
        }
        for event in &prepared.events {
            self.append(event).await?;
        }
        Ok(RecordOutcome::Recorded)
    }

    /// The call row was not inserted: a repeated `tool_use_id` (answer with the recorded
    /// call) or a taken call id.
    async fn duplicate(&mut self, call: &ToolCallRecord) -> Result<RecordOutcome, Fail> {
        if let Some(tool_use_id) = &call.tool_use_id {
            let existing = sqlx::query(concat!(
                "SELECT ",
                call_columns!(),
                " FROM tool_calls WHERE tenant = $1 AND run = $2 AND tool_use_id = $3"
            ))
            .bind(call.tenant.as_str())
            .bind(call.run.as_str())
            .bind(tool_use_id.as_str())
            .fetch_optional(&mut *self.conn)
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

    /// Turns the just-inserted call into a `blocked` / `BUDGET_EXCEEDED` record with a
    /// `tool_call.blocked` event; the decision and the pending invocation are not written, and
    /// of the given events only `tool_call.requested` is kept.
    async fn block_for_budget(&mut self, prepared: &PreparedCall) -> Result<RecordOutcome, Fail> {
        let call = &prepared.call;
        let max_calls: i64 =
            sqlx::query_scalar("SELECT max_calls FROM runs WHERE tenant = $1 AND id = $2")
                .bind(call.tenant.as_str())
                .bind(call.run.as_str())
                .fetch_one(&mut *self.conn)
                .await
                .map_err(read_failure)?;
        let mut blocked = call.clone();
        blocked.status = ToolCallStatus::Blocked;
        blocked.output_redacted = None;
        blocked.error_code = Some(ErrorCode::BudgetExceeded);
        blocked.error_text = Some(format!(
            "the run has used its budget of {max_calls} tool calls"
        ));
        blocked.policy_decision_id = None;
        blocked.risk_level = None;
        blocked.duration_ms = None;

        let update = sqlx::query(
            "UPDATE tool_calls SET status = $1, output_redacted = NULL, error_code = $2, \
             error_text = $3, policy_decision_id = NULL, risk_level = NULL, duration_ms = NULL \
             WHERE id = $4",
        )
        .bind(blocked.status.as_str())
        .bind(ErrorCode::BudgetExceeded.as_str())
        .bind(blocked.error_text.clone())
        .bind(blocked.id.as_str());
        self.write(update)
            .await
            .map_err(|error| unexpected(&error))?;

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

    async fn finish_call(&mut self, prepared: &PreparedFinish) -> Result<bool, Fail> {
        let finish = &prepared.finish;
        let update = sqlx::query(
            "UPDATE tool_calls SET status = $1, output_redacted = $2, error_code = $3, \
             error_text = $4, duration_ms = $5, attempts = $6, updated_at = $7, \
             answer_sealed = $10, answer_expires_at = $11 \
             WHERE id = $8 AND tenant = $9 AND status = 'running'",
        )
        .bind(finish.status.as_str())
        .bind(prepared.output.clone())
        .bind(finish.error_code.map(|code| code.as_str()))
        .bind(finish.error_text.clone())
        .bind(finish.duration_ms)
        .bind(finish.attempts)
        .bind(finish.at.0)
        .bind(finish.id.as_str())
        .bind(finish.tenant.as_str())
        .bind(prepared.answer.clone())
        .bind(prepared.answer_expires_at);
        let changed = self
            .write(update)
            .await
            .map_err(|error| unexpected(&error))?;
        if changed == 0 {
            return Ok(false);
        }
        for event in &prepared.events {
            self.append(event).await?;
        }
        Ok(true)
    }

    /// The claim: the conditional UPDATE is the check. On another replica's concurrent claim
    /// PostgreSQL makes this one wait for it and re-check the row, which is then no longer
    /// pending at this version: exactly one claim changes it.
    async fn resolve_pending(
        &mut self,
        resolution: &ResolvePending,
        events: &[PreparedEvent],
    ) -> Result<bool, Fail> {
        let claim = sqlx::query(
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
        .bind(resolution.observed_version);
        let Some(row) = claim
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(|error| unexpected(&error))?
        else {
            return Ok(false);
        };
        let tool_call_id: String = row.try_get("tool_call_id").map_err(read_failure)?;
        let run: String = row.try_get("run").map_err(read_failure)?;
        // An approved call runs next, in this process: it becomes this instance's call.
        let update_call = sqlx::query(
            "UPDATE tool_calls SET status = $1, error_code = $2, error_text = $3, updated_at = $4, \
             owner = $5 WHERE id = $6 AND tenant = $7",
        )
        .bind(resolution.call_status.as_str())
        .bind(resolution.error_code.map(|code| code.as_str()))
        .bind(resolution.error_text.clone())
        .bind(resolution.at.0)
        .bind(self.instance)
        .bind(tool_call_id)
        .bind(resolution.tenant.as_str());
        self.write(update_call)
            .await
            .map_err(|error| unexpected(&error))?;
        let update_run = sqlx::query(
            "UPDATE runs SET pending_approvals = GREATEST(pending_approvals - 1, 0), \
             status = CASE WHEN pending_approvals <= 1 AND status = 'waiting_approval' \
             THEN 'active' ELSE status END WHERE tenant = $1 AND id = $2",
        )
        .bind(resolution.tenant.as_str())
        .bind(run);
        self.write(update_run)
            .await
            .map_err(|error| unexpected(&error))?;
        for event in events {
            self.append(event).await?;
        }
        Ok(true)
    }

    async fn insert_pending(&mut self, pending: &PreparedPending) -> Result<(), Fail> {
        let record = &pending.record;
        let insert = sqlx::query(INSERT_PENDING)
            .bind(&record.id)
            .bind(record.tenant.as_str())
            .bind(record.run.as_str())
            .bind(record.tool_call_id.as_str())
            .bind(record.tool.as_str())
            .bind(&pending.arguments)
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
            .bind(&pending.arguments_sealed)
            .bind(&pending.arguments_key_id);
        self.write(insert).await.map_err(|error| {
            write_failure(
                &error,
                || format!("pending invocation {}", record.id),
                || {
                    LedgerError::NotFound(format!(
                        "run {} or tool call {}",
                        record.run, record.tool_call_id
                    ))
                },
            )
        })?;
        Ok(())
    }

    async fn add_pending(
        &mut self,
        pending: &PreparedPending,
        events: &[PreparedEvent],
    ) -> Result<Reply, Fail> {
        self.insert_pending(pending).await?;
        let update_run = sqlx::query(
            "UPDATE runs SET pending_approvals = pending_approvals + 1, \
             status = 'waiting_approval' WHERE tenant = $1 AND id = $2",
        )
        .bind(pending.record.tenant.as_str())
        .bind(pending.record.run.as_str());
        self.write(update_run)
            .await
            .map_err(|error| unexpected(&error))?;
        for event in events {
            self.append(event).await?;
        }
        Ok(Reply::Done)
    }

    async fn put_credential(&mut self, credential: &CredentialRecord) -> Result<Reply, Fail> {
        let upsert = sqlx::query(
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
        .bind(credential.key_id.clone())
        .bind(credential.metadata.to_string())
        .bind(&credential.notes)
        .bind(&credential.created_by)
        .bind(credential.created_at.0)
        .bind(credential.updated_at.0);
        self.write(upsert).await.map_err(|error| {
            write_failure(
                &error,
                || format!("secret {} of tenant {}", credential.name, credential.tenant),
                || LedgerError::NotFound(format!("tenant {}", credential.tenant)),
            )
        })?;
        Ok(Reply::Done)
    }

    /// Appends one event to its tenant's chain, whose head the batch has locked.
    async fn append(&mut self, event: &PreparedEvent) -> Result<(), Fail> {
        let Some(previous) = self.heads.get(&event.tenant).cloned() else {
            // Heads exist from a tenant's creation on, so a missing one means no tenant.
            return Err(Fail::Op(LedgerError::NotFound(format!(
                "tenant {}",
                event.tenant
            ))));
        };
        let link = link(self.heads, event, self.keys)
            .map_err(Fail::Fatal)?
            .ok_or_else(|| {
                Fail::Fatal(LedgerError::Database(
                    "internal: chain head vanished".into(),
                ))
            })?;
        let insert = sqlx::query(
            "INSERT INTO audit_events (tenant, chain_seq, kind, run, tool_call_id, payload, at, \
             prev_hash, hash, key_id, binding) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        )
        .bind(&event.tenant)
        .bind(link.chain_seq)
        .bind(&event.kind)
        .bind(event.run.clone())
        .bind(event.tool_call_id.clone())
        .bind(&event.payload)
        .bind(event.at)
        .bind(&link.prev_hash)
        .bind(&link.hash)
        .bind(link.key_id.clone())
        .bind(link.binding.clone());
        self.undo.push((event.tenant.clone(), previous));
        if let Err(error) = self.write(insert).await {
            return Err(match SqlFailure::classify(&error) {
                SqlFailure::ForeignKey => {
                    Fail::Op(LedgerError::NotFound(format!("tenant {}", event.tenant)))
                }
                SqlFailure::Unique => Fail::Fatal(LedgerError::Database(format!(
                    "the audit chain of tenant {} moved while its head was locked",
                    event.tenant
                ))),
                SqlFailure::Constraint(message) => Fail::Op(LedgerError::Constraint(message)),
                SqlFailure::Fatal(message) => Fail::Fatal(LedgerError::Database(message)),
            });
        }
        Ok(())
    }
}

/// A statement that should not be refused was: its reason is the answer.
fn unexpected(error: &sqlx::Error) -> Fail {
    write_failure(
        error,
        || "a row".into(),
        || LedgerError::Database("unexpected foreign key failure".into()),
    )
}

fn bind_call<'q>(
    query: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    prepared: &'q PreparedCall,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
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
