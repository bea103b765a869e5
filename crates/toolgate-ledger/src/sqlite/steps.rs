//! Write operations executed one statement at a time, looking at each result before the next.
//!
//! Every administrative operation runs here: its change, then its audit event, inside the
//! savepoint the writer opens for it, so the two commit together or not at all. The hot
//! operations (`record_call`, `finish_call`, `append_events`) run here only when their
//! one-round-trip form in the writer failed: then this code finds out exactly what happened (a
//! repeated `tool_use_id`, a used-up budget, a missing run) and answers precisely. The writer
//! wraps those runs in a savepoint, so a failure after some rows were written undoes exactly
//! this operation.

use std::collections::HashMap;

use serde_json::json;
use sqlx::Row;
use sqlx::sqlite::SqliteConnection;
use toolgate_core::{ErrorCode, ToolCallStatus};

use crate::error::LedgerError;
use crate::model::ResolvePending;
use crate::model::{
    Agent, CredentialRecord, Permission, RecordOutcome, RunRecord, Tenant, TokenRecord,
    ToolCallRecord,
};
use crate::ops::{OpKind, PreparedCall, PreparedEvent, PreparedFinish, PreparedPending, Reply};
use crate::rows::{Fail, SqlFailure, call_columns, call_from_row, read_failure, write_failure};
use crate::sqlite::statements::{
    COUNT_ON_RUN_WITHIN_BUDGET, ChainLink, FINISH_RUNNING, INSERT_CALL, INSERT_DECISION,
    INSERT_EVENT, INSERT_PENDING, SqlQuery, bind_call, bind_count_on_run, bind_decision,
    bind_event, bind_finish, bind_pending,
};
use crate::sqlite::writer::{Head, load_head};

/// The audit event kind kept when a call is blocked for its budget.
const REQUESTED_EVENT: &str = "tool_call.requested";

/// One operation's view of the writer.
pub(super) struct Steps<'w> {
    pub(super) conn: &'w mut SqliteConnection,
    pub(super) heads: &'w mut HashMap<String, Head>,
    pub(super) keys: Option<&'w dyn toolgate_core::AuditKeys>,
    /// Chain heads this operation moved, each with the head it replaced, oldest first; the
    /// writer restores them if the operation is rolled back and records them as moved if not.
    pub(super) undo: Vec<(String, Head)>,
}

impl Steps<'_> {
    pub(super) async fn apply(&mut self, op: &OpKind) -> Result<Reply, Fail> {
        match op {
            OpKind::CreateTenant(tenant, event) => {
                self.create_tenant(tenant).await?;
                self.append(&event.prepared()).await?;
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
                self.revoke_token(id, tenant.as_ref().map(|tenant| tenant.as_str()))
                    .await?;
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
                     VALUES (?, ?, ?, ?) ON CONFLICT (tenant, flag) DO UPDATE \
                     SET enabled = excluded.enabled, updated_at = excluded.updated_at",
                )
                .bind(tenant.as_str().to_owned())
                .bind(flag.clone())
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
                let insert = sqlx::query(
                    "INSERT INTO policy_sets (tenant, version, text, created_by, created_at) \
                     SELECT ?1, COALESCE(MAX(version), 0) + 1, ?2, ?3, ?4 \
                     FROM policy_sets WHERE tenant = ?1 RETURNING version",
                )
                .bind(tenant.as_str().to_owned())
                .bind(text.clone())
                .bind(created_by.clone())
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
                     WHERE seq IN (SELECT seq FROM tool_calls WHERE answer_sealed IS NOT NULL \
                     AND answer_expires_at <= ? ORDER BY answer_expires_at LIMIT ?)",
                )
                .bind(now.0)
                .bind(i64::from(*limit));
                let purged = self.write(purge).await.map_err(|error| {
                    write_failure(
                        &error,
                        || "sealed answers".to_owned(),
                        || LedgerError::Database("unexpected foreign key failure".into()),
                    )
                })?;
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
                    sqlx::query("DELETE FROM tenant_tool_secrets WHERE tenant = ? AND name = ?")
                        .bind(tenant.as_str().to_owned())
                        .bind(name.as_str().to_owned());
                let changed = self.write(delete).await.map_err(|error| {
                    write_failure(
                        &error,
                        || format!("secret {name} of tenant {tenant}"),
                        || LedgerError::Database("unexpected foreign key failure".into()),
                    )
                })?;
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
                    "UPDATE tenant_tool_secrets SET value = ?, key_id = ?, updated_at = ? \
                     WHERE tenant = ? AND name = ? AND kind = 'sealed' AND value = ?",
                )
                .bind(value.clone())
                .bind(key_id.clone())
                .bind(at.0)
                .bind(tenant.as_str().to_owned())
                .bind(name.as_str().to_owned())
                .bind(expected.clone());
                let changed = self.write(update).await.map_err(|error| {
                    write_failure(
                        &error,
                        || format!("secret {name} of tenant {tenant}"),
                        || LedgerError::Database("unexpected foreign key failure".into()),
                    )
                })?;
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
                    "UPDATE pending_invocations SET arguments = NULL, arguments_sealed = ?, \
                     arguments_key_id = ? WHERE tenant = ? AND id = ? AND state = 'pending' \
                     AND (arguments_sealed = ? OR (? IS NULL AND arguments_sealed IS NULL \
                     AND arguments IS NOT NULL))",
                )
                .bind(sealed.clone())
                .bind(key_id.clone())
                .bind(tenant.as_str().to_owned())
                .bind(id.clone())
                .bind(expected.clone())
                .bind(expected.clone());
                let changed = self.write(update).await.map_err(|error| {
                    write_failure(
                        &error,
                        || format!("pending invocation {id}"),
                        || LedgerError::Database("unexpected foreign key failure".into()),
                    )
                })?;
                Ok(Reply::Finished(changed == 1))
            }
        }
    }

    /// The claim: the conditional UPDATE is the check, so of concurrent decisions on one row
    /// exactly one changes it; the others write nothing.
    async fn resolve_pending(
        &mut self,
        resolution: &ResolvePending,
        events: &[PreparedEvent],
    ) -> Result<bool, Fail> {
        let claim = sqlx::query(
            "UPDATE pending_invocations SET state = ?, version = version + 1, decided_by = ?, \
             reason = ?, decided_at = ?, arguments = NULL, arguments_sealed = NULL, \
             arguments_key_id = NULL \
             WHERE id = ? AND tenant = ? AND version = ? AND state = 'pending' \
             RETURNING tool_call_id, run",
        )
        .bind(resolution.state.as_str())
        .bind(resolution.decided_by.clone())
        .bind(resolution.reason.clone())
        .bind(resolution.at.0)
        .bind(resolution.id.clone())
        .bind(resolution.tenant.as_str().to_owned())
        .bind(resolution.observed_version);
        let Some(row) = claim
            .fetch_optional(&mut *self.conn)
            .await
            .map_err(|error| {
                write_failure(
                    &error,
                    || format!("pending invocation {}", resolution.id),
                    || LedgerError::Database("unexpected foreign key failure".into()),
                )
            })?
        else {
            return Ok(false);
        };
        let tool_call_id: String = row.try_get("tool_call_id").map_err(read_failure)?;
        let run: String = row.try_get("run").map_err(read_failure)?;
        let update_call = sqlx::query(
            "UPDATE tool_calls SET status = ?, error_code = ?, error_text = ?, updated_at = ? \
             WHERE id = ? AND tenant = ?",
        )
        .bind(resolution.call_status.as_str())
        .bind(resolution.error_code.map(|code| code.as_str()))
        .bind(resolution.error_text.clone())
        .bind(resolution.at.0)
        .bind(tool_call_id)
        .bind(resolution.tenant.as_str().to_owned());
        self.write(update_call).await.map_err(|error| {
            write_failure(
                &error,
                || "tool call".into(),
                || LedgerError::Database("unexpected foreign key failure".into()),
            )
        })?;
        let update_run = sqlx::query(
            "UPDATE runs SET pending_approvals = MAX(pending_approvals - 1, 0), \
             status = CASE WHEN pending_approvals <= 1 AND status = 'waiting_approval' THEN 'active' ELSE status END \
             WHERE tenant = ? AND id = ?",
        )
        .bind(resolution.tenant.as_str().to_owned())
        .bind(run);
        self.write(update_run).await.map_err(|error| {
            write_failure(
                &error,
                || "run".into(),
                || LedgerError::Database("unexpected foreign key failure".into()),
            )
        })?;
        for event in events {
            self.append(event).await?;
        }
        Ok(true)
    }

    async fn add_pending(
        &mut self,
        pending: &PreparedPending,
        events: &[PreparedEvent],
    ) -> Result<Reply, Fail> {
        let insert = bind_pending(sqlx::query(INSERT_PENDING), pending);
        self.write(insert).await.map_err(|error| {
            write_failure(
                &error,
                || format!("pending invocation {}", pending.record.id),
                || {
                    LedgerError::NotFound(format!(
                        "run {} or tool call {}",
                        pending.record.run, pending.record.tool_call_id
                    ))
                },
            )
        })?;
        let update_run = sqlx::query(
            "UPDATE runs SET pending_approvals = pending_approvals + 1, status = 'waiting_approval' \
             WHERE tenant = ? AND id = ?",
        )
        .bind(pending.record.tenant.as_str().to_owned())
        .bind(pending.record.run.as_str().to_owned());
        self.write(update_run).await.map_err(|error| {
            write_failure(
                &error,
                || "run".into(),
                || LedgerError::Database("unexpected foreign key failure".into()),
            )
        })?;
        for event in events {
            self.append(event).await?;
        }
        Ok(Reply::Done)
    }

    async fn put_credential(&mut self, credential: &CredentialRecord) -> Result<Reply, Fail> {
        let upsert = sqlx::query(
            "INSERT INTO tenant_tool_secrets (tenant, name, kind, value, key_id, metadata, notes, \
             created_by, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (tenant, name) DO UPDATE SET kind = excluded.kind, value = excluded.value, \
             key_id = excluded.key_id, metadata = excluded.metadata, notes = excluded.notes, \
             created_by = excluded.created_by, updated_at = excluded.updated_at",
        )
        .bind(credential.tenant.as_str().to_owned())
        .bind(credential.name.as_str().to_owned())
        .bind(credential.kind.as_str())
        .bind(credential.value.clone())
        .bind(credential.key_id.clone())
        .bind(credential.metadata.to_string())
        .bind(credential.notes.clone())
        .bind(credential.created_by.clone())
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

    /// Runs a write statement; returns the rows it changed.
    async fn write(&mut self, query: SqlQuery) -> Result<u64, sqlx::Error> {
        Ok(query.execute(&mut *self.conn).await?.rows_affected())
    }

    async fn exists(&mut self, query: SqlQuery) -> Result<bool, Fail> {
        let row = query
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
        let tenant_exists = self
            .exists(sqlx::query("SELECT 1 FROM tenants WHERE id = ?").bind(tenant.to_owned()))
            .await?;
        if !tenant_exists {
            return Ok(LedgerError::NotFound(format!("tenant {tenant}")));
        }
        match agent {
            Some(agent) => Ok(LedgerError::NotFound(format!("agent {tenant}/{agent}"))),
            None => Ok(LedgerError::NotFound(format!(
                "a parent row of tenant {tenant}"
            ))),
        }
    }

    async fn create_tenant(&mut self, tenant: &Tenant) -> Result<Reply, Fail> {
        let insert = sqlx::query("INSERT INTO tenants (id, name, created_at) VALUES (?, ?, ?)")
            .bind(tenant.id.as_str().to_owned())
            .bind(tenant.name.clone())
            .bind(tenant.created_at.0);
        self.write(insert).await.map_err(|error| {
            write_failure(
                &error,
                || format!("tenant {}", tenant.id),
                || LedgerError::Database("unexpected foreign key failure".into()),
            )
        })?;
        Ok(Reply::Done)
    }

    async fn create_agent(&mut self, agent: &Agent) -> Result<Reply, Fail> {
        let insert =
            sqlx::query("INSERT INTO agents (tenant, id, name, created_at) VALUES (?, ?, ?, ?)")
                .bind(agent.tenant.as_str().to_owned())
                .bind(agent.id.as_str().to_owned())
                .bind(agent.name.clone())
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
             VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(token.id.clone())
        .bind(token.hash.clone())
        .bind(token.role.as_str())
        .bind(
            token
                .tenant
                .as_ref()
                .map(|tenant| tenant.as_str().to_owned()),
        )
        .bind(token.agent.as_ref().map(|agent| agent.as_str().to_owned()))
        .bind(token.label.clone())
        .bind(token.created_at.0)
        .bind(token.revoked);
        let Err(error) = self.write(insert).await else {
            return Ok(Reply::Done);
        };
        match SqlFailure::classify(&error) {
            SqlFailure::ForeignKey => {
                let tenant = token.tenant.as_ref().map_or("", |tenant| tenant.as_str());
                let agent = token.agent.as_ref().map(|agent| agent.as_str());
                Err(Fail::Op(self.missing_parent(tenant, agent).await?))
            }
            // Never name the hash: it identifies the secret.
            _ => Err(write_failure(
                &error,
                || format!("token {} (or a token with the same secret)", token.id),
                || LedgerError::Database("unexpected foreign key failure".into()),
            )),
        }
    }

    /// `tenant` is the one the token was read with; `IS` matches NULL to NULL (admin tokens).
    async fn revoke_token(&mut self, id: &str, tenant: Option<&str>) -> Result<Reply, Fail> {
        let update = sqlx::query("UPDATE api_tokens SET revoked = 1 WHERE id = ? AND tenant IS ?")
            .bind(id.to_owned())
            .bind(tenant.map(str::to_owned));
        let changed = self.write(update).await.map_err(|error| {
            write_failure(
                &error,
                || format!("token {id}"),
                || LedgerError::Database("unexpected foreign key failure".into()),
            )
        })?;
        if changed == 0 {
            return Err(Fail::Op(LedgerError::NotFound(format!("token {id}"))));
        }
        Ok(Reply::Done)
    }

    async fn put_permission(&mut self, permission: &Permission) -> Result<Reply, Fail> {
        // Each case names its own partial unique index as the conflict target.
        let sql = match permission.agent {
            None => {
                "INSERT INTO tool_permissions (tenant, agent, tool, enabled, updated_at) \
                 VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, tool) WHERE agent IS NULL \
                 DO UPDATE SET enabled = excluded.enabled, updated_at = excluded.updated_at"
            }
            Some(_) => {
                "INSERT INTO tool_permissions (tenant, agent, tool, enabled, updated_at) \
                 VALUES (?, ?, ?, ?, ?) ON CONFLICT (tenant, agent, tool) \
                 WHERE agent IS NOT NULL \
                 DO UPDATE SET enabled = excluded.enabled, updated_at = excluded.updated_at"
            }
        };
        let upsert = sqlx::query(sql)
            .bind(permission.tenant.as_str().to_owned())
            .bind(
                permission
                    .agent
                    .as_ref()
                    .map(|agent| agent.as_str().to_owned()),
            )
            .bind(permission.tool.as_str().to_owned())
            .bind(permission.enabled)
            .bind(permission.updated_at.0);
        let Err(error) = self.write(upsert).await else {
            return Ok(Reply::Done);
        };
        match SqlFailure::classify(&error) {
            SqlFailure::ForeignKey => {
                let agent = permission.agent.as_ref().map(|agent| agent.as_str());
                let missing = self
                    .missing_parent(permission.tenant.as_str(), agent)
                    .await?;
                Err(Fail::Op(missing))
            }
            _ => Err(write_failure(
                &error,
                || format!("grant of {}", permission.tool),
                || LedgerError::Database("unexpected foreign key failure".into()),
            )),
        }
    }

    async fn create_run(&mut self, run: &RunRecord, manifest: &str) -> Result<Reply, Fail> {
        let insert = sqlx::query(
            "INSERT INTO runs (id, tenant, agent, manifest, status, calls_used, max_calls, \
             pending_approvals, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(run.id.as_str().to_owned())
        .bind(run.tenant.as_str().to_owned())
        .bind(run.agent.as_str().to_owned())
        .bind(manifest.to_owned())
        .bind(run.status.as_str())
        .bind(run.calls_used)
        .bind(run.max_calls)
        .bind(run.pending_approvals)
        .bind(run.created_at.0);
        let Err(error) = self.write(insert).await else {
            return Ok(Reply::Done);
        };
        match SqlFailure::classify(&error) {
            SqlFailure::ForeignKey => {
                let missing = self
                    .missing_parent(run.tenant.as_str(), Some(run.agent.as_str()))
                    .await?;
                Err(Fail::Op(missing))
            }
            _ => Err(write_failure(
                &error,
                || format!("run {}", run.id),
                || LedgerError::Database("unexpected foreign key failure".into()),
            )),
        }
    }

    /// See `Store::record_call`. The call row goes in first, so a repeated `tool_use_id` is
    /// found before anything else is written.
    async fn record_call(&mut self, prepared: &PreparedCall) -> Result<RecordOutcome, Fail> {
        let call = &prepared.call;
        let insert = bind_call(sqlx::query(INSERT_CALL), prepared);
        if let Err(error) = self.write(insert).await {
            return self.call_insert_failure(call, &error).await;
        }
        self.record_call_rest(prepared).await
    }

    /// See `Store::retry_call`: the existing call row is rewritten only while it is still the
    /// refusal observed, then everything else goes in as for a new call.
    async fn retry_call(
        &mut self,
        prepared: &PreparedCall,
        observed_evaluation: i64,
    ) -> Result<RecordOutcome, Fail> {
        let call = &prepared.call;
        let update = sqlx::query(
            "UPDATE tool_calls SET tool = ?, action = ?, correlation_id = ?, status = ?, \
             args_hash = ?, input_redacted = ?, output_redacted = ?, error_code = ?, \
             error_text = ?, policy_decision_id = ?, risk_level = ?, duration_ms = ?, \
             attempts = ?, updated_at = ?, answer_sealed = NULL, answer_expires_at = NULL, \
             evaluation = evaluation + 1 \
             WHERE id = ? AND tenant = ? AND run = ? AND evaluation = ? \
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
        .bind(call.id.as_str().to_owned())
        .bind(call.tenant.as_str().to_owned())
        .bind(call.run.as_str().to_owned())
        .bind(observed_evaluation);
        let changed = self.write(update).await.map_err(|error| {
            write_failure(
                &error,
                || format!("tool call {}", call.id),
                || LedgerError::NotFound(format!("tool call {}", call.id)),
            )
        })?;
        if changed == 0 {
            // Another evaluation (or an execution) got there first: answer with the call as
            // it now stands.
            let current = sqlx::query(concat!(
                "SELECT ",
                call_columns!(),
                " FROM tool_calls WHERE id = ? AND tenant = ?"
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

        // A policy denial the earlier evaluation left open is superseded by this one: it no
        // longer waits for a decision, and a later decision cannot overwrite this evaluation.
        let superseded = sqlx::query(
            "UPDATE pending_invocations SET state = 'rejected', version = version + 1, \
             decided_by = 'system: re-evaluated', \
             reason = 'superseded by a repeat of the call', decided_at = ? \
             WHERE tenant = ? AND tool_call_id = ? AND state = 'pending'",
        )
        .bind(call.updated_at.0)
        .bind(call.tenant.as_str().to_owned())
        .bind(call.id.as_str().to_owned());
        let closed = self.write(superseded).await.map_err(|error| {
            write_failure(
                &error,
                || format!("pending invocations of tool call {}", call.id),
                || LedgerError::NotFound(format!("tool call {}", call.id)),
            )
        })?;
        if closed > 0 {
            let release = sqlx::query(
                "UPDATE runs SET pending_approvals = MAX(pending_approvals - ?, 0), \
                 status = CASE WHEN pending_approvals - ? <= 0 AND status = 'waiting_approval' \
                 THEN 'active' ELSE status END WHERE tenant = ? AND id = ?",
            )
            .bind(i64::try_from(closed).unwrap_or(i64::MAX))
            .bind(i64::try_from(closed).unwrap_or(i64::MAX))
            .bind(call.tenant.as_str().to_owned())
            .bind(call.run.as_str().to_owned());
            self.write(release).await.map_err(|error| {
                write_failure(
                    &error,
                    || format!("run {}", call.run),
                    || LedgerError::NotFound(format!("run {}", call.run)),
                )
            })?;
        }
        self.record_call_rest(prepared).await
    }

    /// Everything `record_call` writes after the call row: the budget, the decision, the
    /// pending invocation and the events.
    async fn record_call_rest(&mut self, prepared: &PreparedCall) -> Result<RecordOutcome, Fail> {
        let call = &prepared.call;
        if prepared.count_against_budget || prepared.pending.is_some() {
            let update = bind_count_on_run(sqlx::query(COUNT_ON_RUN_WITHIN_BUDGET), prepared)
                .bind(i64::from(prepared.count_against_budget));
            let changed = self.write(update).await.map_err(|error| {
                write_failure(
                    &error,
                    || format!("run {}", call.run),
                    || LedgerError::NotFound(format!("run {}", call.run)),
                )
            })?;
            if changed == 0 {
                // The call row's foreign key proved the run exists: its budget is used up.
                return self.block_for_budget(prepared).await;
            }
        }

        if let Some(decision) = &prepared.decision {
            let insert = bind_decision(sqlx::query(INSERT_DECISION), decision);
            self.write(insert).await.map_err(|error| {
                write_failure(
                    &error,
                    || format!("policy decision {}", decision.0.id),
                    || LedgerError::NotFound(format!("tool call {}", decision.0.tool_call_id)),
                )
            })?;
        }

        if let Some(pending) = &prepared.pending {
            let insert = bind_pending(sqlx::query(INSERT_PENDING), pending);
            self.write(insert).await.map_err(|error| {
                write_failure(
                    &error,
                    || format!("pending invocation {}", pending.record.id),
                    || {
                        LedgerError::NotFound(format!(
                            "run {} or tool call {}",
                            pending.record.run, pending.record.tool_call_id
                        ))
                    },
                )
            })?;
        }

        for event in &prepared.events {
            self.append(event).await?;
        }
        Ok(RecordOutcome::Recorded)
    }

    /// The call row was refused: a repeated `tool_use_id` (answer with the recorded call), a
    /// taken call id, or a run that does not exist.
    async fn call_insert_failure(
        &mut self,
        call: &ToolCallRecord,
        error: &sqlx::Error,
    ) -> Result<RecordOutcome, Fail> {
        match SqlFailure::classify(error) {
            SqlFailure::Unique => {
                if let Some(tool_use_id) = &call.tool_use_id {
                    let existing = sqlx::query(concat!(
                        "SELECT ",
                        call_columns!(),
                        " FROM tool_calls WHERE tenant = ? AND run = ? AND tool_use_id = ?"
                    ))
                    .bind(call.tenant.as_str().to_owned())
                    .bind(call.run.as_str().to_owned())
                    .bind(tool_use_id.as_str().to_owned())
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
            SqlFailure::ForeignKey => Err(Fail::Op(LedgerError::NotFound(format!(
                "run {} of tenant {}",
                call.run, call.tenant
            )))),
            SqlFailure::Constraint(message) => Err(Fail::Op(LedgerError::Constraint(message))),
            SqlFailure::Fatal(message) => Err(Fail::Fatal(LedgerError::Database(message))),
        }
    }

    /// Turns the just-inserted call into a `blocked` / `BUDGET_EXCEEDED` record with a
    /// `tool_call.blocked` event; the decision and the pending invocation are not written, and
    /// of the given events only `tool_call.requested` is kept.
    async fn block_for_budget(&mut self, prepared: &PreparedCall) -> Result<RecordOutcome, Fail> {
        let call = &prepared.call;
        let max_calls: i64 = sqlx::query("SELECT max_calls FROM runs WHERE tenant = ? AND id = ?")
            .bind(call.tenant.as_str().to_owned())
            .bind(call.run.as_str().to_owned())
            .fetch_one(&mut *self.conn)
            .await
            .and_then(|row| row.try_get("max_calls"))
            .map_err(read_failure)?;
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

        let update = sqlx::query(
            "UPDATE tool_calls SET status = ?, output_redacted = NULL, error_code = ?, \
             error_text = ?, policy_decision_id = NULL, risk_level = NULL, duration_ms = NULL \
             WHERE id = ?",
        )
        .bind(blocked.status.as_str())
        .bind(ErrorCode::BudgetExceeded.as_str())
        .bind(blocked.error_text.clone())
        .bind(blocked.id.as_str().to_owned());
        self.write(update).await.map_err(|error| {
            write_failure(
                &error,
                || format!("tool call {}", call.id),
                || LedgerError::NotFound(format!("tool call {}", call.id)),
            )
        })?;

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
        let update = bind_finish(sqlx::query(FINISH_RUNNING), prepared);
        let changed = self.write(update).await.map_err(|error| {
            write_failure(
                &error,
                || format!("tool call {}", finish.id),
                || LedgerError::NotFound(format!("tool call {}", finish.id)),
            )
        })?;
        if changed == 0 {
            return Ok(false);
        }
        for event in &prepared.events {
            self.append(event).await?;
        }
        Ok(true)
    }

    /// Appends one event to its tenant's chain.
    async fn append(&mut self, event: &PreparedEvent) -> Result<(), Fail> {
        let previous = load_head(self.conn, self.heads, &event.tenant).await?;
        let chain_seq = previous.chain_seq + 1;
        let (key_id, hash) =
            crate::chain::new_link(self.keys, &previous.hash, &event.fields(chain_seq))
                .map_err(Fail::Fatal)?;
        let link = ChainLink {
            chain_seq,
            hash,
            key_id,
            prev_hash: previous.hash.clone(),
        };
        let insert = bind_event(sqlx::query(INSERT_EVENT), event, &link);
        if let Err(error) = self.write(insert).await {
            return Err(match SqlFailure::classify(&error) {
                SqlFailure::ForeignKey => {
                    Fail::Op(LedgerError::NotFound(format!("tenant {}", event.tenant)))
                }
                // The cached head is behind the file: someone else wrote this chain.
                SqlFailure::Unique => Fail::Fatal(LedgerError::Database(format!(
                    "the audit chain of tenant {} moved outside this store",
                    event.tenant
                ))),
                SqlFailure::Constraint(message) => Fail::Op(LedgerError::Constraint(message)),
                SqlFailure::Fatal(message) => Fail::Fatal(LedgerError::Database(message)),
            });
        }
        self.undo.push((event.tenant.clone(), previous));
        self.heads.insert(
            event.tenant.clone(),
            Head {
                chain_seq: link.chain_seq,
                hash: link.hash,
            },
        );
        Ok(())
    }
}
