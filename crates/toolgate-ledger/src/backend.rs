//! The [`Store`] interface written once for both backends: every read query (one SQL text,
//! run on the backend's read pool through [`Db`]) and every write (an [`OpKind`] queued for
//! the backend's writer task). A backend supplies only what truly differs, as a [`Backend`]:
//! its pool, its writer queue, how it finds interrupted calls, and its liveness rule.

use std::fmt::Debug;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use toolgate_core::{
    AgentId, AuditKeys, RunId, SecretName, TenantId, Timestamp, ToolCallId, ToolCallStatus,
    ToolName, ToolUseId,
};

use crate::checkpoint::Checkpoint;
use crate::console::{
    ClientLink, ConsoleOp, ConsoleSession, PendingDetails, details_from_row, link_from_row,
    session_from_row,
};
use crate::error::LedgerError;
use crate::model::{
    Actor, Agent, AuditEvent, CredentialRecord, FinishCall, KeyChange, NewAuditEvent, NewCall,
    PendingFilter, PendingInvocation, PendingSummary, Permission, PolicySetRecord, RecordOutcome,
    ResolvePending, RunRecord, SYSTEM_CHAIN, SealedAnswer, Tenant, TokenRecord, ToolCallRecord,
    VerifyReport,
};
use crate::ops::{
    AdminEvent, OpKind, PreparedCall, PreparedEvent, PreparedFinish, PreparedPending, Reply,
};
use crate::rows::{
    SqlRow, agent_from_row, answer_from_row, call_columns, call_from_row, credential_columns,
    credential_from_row, event_columns, event_from_row, manifest_json, pending_columns,
    pending_from_row, permission_from_row, policy_set_from_row, read_error, run_from_row,
    tenant_from_row, token_from_row,
};
use crate::sql::{Db, Dialect, query};
use crate::store::Store;
use crate::verify::VerifyWith;

/// Which of a run's calls a page of [`Store::list_tool_calls`] may hold: those of the run
/// recorded after the cursor's call (`$3`), if one is given.
macro_rules! run_page_calls {
    () => {
        "tenant = $1 AND run = $2 AND (CAST($3 AS TEXT) IS NULL OR \
         seq > (SELECT seq FROM tool_calls WHERE id = $3 AND tenant = $1 AND run = $2))"
    };
}

/// A page of a run's calls on SQLite, which has one index of a run's calls, its idempotency
/// key's (migration 0013): the page's `seq`s are picked from that index alone (each entry holds
/// its row's `seq`, the rowid), and only the page's rows are read.
pub(crate) const LIST_CALLS_SQLITE: &str = concat!(
    "SELECT ",
    call_columns!(),
    " FROM tool_calls WHERE seq IN (SELECT seq FROM tool_calls WHERE ",
    run_page_calls!(),
    " ORDER BY seq LIMIT $4) ORDER BY seq"
);

/// A page of a run's calls on PostgreSQL, read along its index in `seq` order.
const LIST_CALLS_POSTGRES: &str = concat!(
    "SELECT ",
    call_columns!(),
    " FROM tool_calls WHERE ",
    run_page_calls!(),
    " ORDER BY seq LIMIT $4"
);

/// What a store of one backend provides to the shared [`Store`] implementation.
pub(crate) trait Backend: Send + Sync + Debug + 'static {
    /// The read pool, as an executor.
    type Reader<'a>: Db
    where
        Self: 'a;

    /// The SQL dialect of its connections.
    const DIALECT: Dialect;

    fn reader(&self) -> Self::Reader<'_>;

    /// Queues a write and waits until its batch has committed.
    fn submit(&self, kind: OpKind) -> impl Future<Output = Result<Reply, LedgerError>> + Send;

    /// Refuses, before anything is queued, a write that would make a call `running` while
    /// other processes cannot see this one alive (PostgreSQL: its instance lock is lost).
    fn check_live(&self) -> Result<(), LedgerError>;

    /// See [`Store::list_running_calls`]: how a backend tells an interrupted call from one a
    /// live process runs differs (SQLite: the calls running at open; PostgreSQL: calls whose
    /// owner's advisory lock is free).
    fn interrupted_calls(
        &self,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<ToolCallRecord>, LedgerError>> + Send;

    /// Verifies the chains on one read connection.
    fn verify(
        &self,
        with: VerifyWith<'_>,
    ) -> impl Future<Output = Result<VerifyReport, LedgerError>> + Send;

    fn keys(&self) -> Option<Arc<dyn AuditKeys>>;

    /// See [`Store::subscribe_commits`].
    fn commits(&self) -> Option<watch::Receiver<u64>>;

    /// See [`Store::subscribe_config_changes`].
    fn config_changes(&self) -> Option<watch::Receiver<u64>>;

    /// See [`Store::close`].
    fn shut_down(&self) -> impl Future<Output = ()> + Send;
}

/// On a ledger written without keys (before the keyed chain), the first keyed event records
/// where every chain's legacy events end. Only the open that migrates the ledger to the keyed
/// chain calls this: later, a ledger holding legacy events only was rewritten, and must not be
/// vouched for. Replicas starting together may both write one; verification uses the first.
pub(crate) async fn record_legacy_heads<B: Backend>(store: &B) -> Result<(), LedgerError> {
    let keyed = query(crate::chain::ANY_KEYED)
        .fetch_one(store.reader())
        .await
        .map_err(read_error)?;
    if keyed.int("count")? > 0 {
        return Ok(());
    }
    let rows = query(crate::chain::ALL_HEADS)
        .fetch_all(store.reader())
        .await
        .map_err(read_error)?;
    let mut heads = Vec::with_capacity(rows.len());
    for row in &rows {
        heads.push((
            row.text("tenant")?,
            row.int("chain_seq")?,
            row.text("hash")?,
        ));
    }
    if heads.is_empty() {
        return Ok(());
    }
    let record = crate::chain::legacy_record(heads);
    store
        .submit(OpKind::AppendEvents(vec![record]))
        .await?
        .done()
}

/// A tenant id read back from a column.
fn tenant_column(tenant: String) -> Result<TenantId, LedgerError> {
    TenantId::new(tenant).map_err(|error| LedgerError::Corrupt(format!("column tenant: {error}")))
}

#[async_trait::async_trait]
impl<B: Backend> Store for B {
    async fn create_console_session(&self, session: ConsoleSession) -> Result<(), LedgerError> {
        self.submit(OpKind::Console(ConsoleOp::CreateSession(session)))
            .await?
            .done()
    }

    async fn get_console_session(
        &self,
        id_hash: &str,
    ) -> Result<Option<ConsoleSession>, LedgerError> {
        query(
            "SELECT id_hash, token_hash, csrf, created_at, last_seen_at, expires_at \
             FROM console_sessions WHERE id_hash = $1",
        )
        .bind(id_hash)
        .optional(self.reader(), session_from_row)
        .await
    }

    async fn touch_console_session(
        &self,
        id_hash: &str,
        at: Timestamp,
        idle_ms: i64,
    ) -> Result<bool, LedgerError> {
        self.submit(OpKind::Console(ConsoleOp::TouchSession {
            id_hash: id_hash.to_owned(),
            at,
            idle_ms,
        }))
        .await?
        .finished()
    }

    async fn delete_console_session(&self, id_hash: &str) -> Result<bool, LedgerError> {
        self.submit(OpKind::Console(ConsoleOp::DeleteSession(
            id_hash.to_owned(),
        )))
        .await?
        .finished()
    }

    async fn purge_console_sessions(
        &self,
        now: Timestamp,
        idle_before: Timestamp,
    ) -> Result<u64, LedgerError> {
        self.submit(OpKind::Console(ConsoleOp::PurgeSessions {
            now,
            idle_before,
        }))
        .await?
        .count()
    }

    async fn create_client_link(
        &self,
        link: ClientLink,
        events: Vec<NewAuditEvent>,
    ) -> Result<(), LedgerError> {
        let events = events.into_iter().map(PreparedEvent::new).collect();
        self.submit(OpKind::Console(ConsoleOp::CreateLink(link, events)))
            .await?
            .done()
    }

    async fn get_client_link(&self, hash: &str) -> Result<Option<ClientLink>, LedgerError> {
        query(
            "SELECT hash, id, tenant, invocation_id, created_at, expires_at, used_at, \
             used_decision FROM client_links WHERE hash = $1",
        )
        .bind(hash)
        .optional(self.reader(), link_from_row)
        .await
    }

    async fn use_client_link(
        &self,
        hash: &str,
        at: Timestamp,
        decision: &str,
        events: Vec<NewAuditEvent>,
    ) -> Result<bool, LedgerError> {
        let events = events.into_iter().map(PreparedEvent::new).collect();
        self.submit(OpKind::Console(ConsoleOp::UseLink {
            hash: hash.to_owned(),
            at,
            decision: decision.to_owned(),
            events,
        }))
        .await?
        .finished()
    }

    async fn release_client_link(
        &self,
        hash: &str,
        used_at: Timestamp,
        events: Vec<NewAuditEvent>,
    ) -> Result<bool, LedgerError> {
        let events = events.into_iter().map(PreparedEvent::new).collect();
        self.submit(OpKind::Console(ConsoleOp::ReleaseLink {
            hash: hash.to_owned(),
            used_at,
            events,
        }))
        .await?
        .finished()
    }

    async fn pending_details(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Option<PendingDetails>, LedgerError> {
        query(
            "SELECT p.decided_by, p.reason, p.decided_at, d.policy_ids \
             FROM pending_invocations p LEFT JOIN policy_decisions d \
             ON d.tenant = p.tenant AND d.tool_call_id = p.tool_call_id \
             WHERE p.tenant = $1 AND p.id = $2 ORDER BY d.created_at DESC LIMIT 1",
        )
        .bind(tenant.as_str())
        .bind(id)
        .optional(self.reader(), details_from_row)
        .await
    }

    async fn create_tenant(&self, tenant: Tenant, actor: &Actor) -> Result<(), LedgerError> {
        let event = AdminEvent::tenant_created(&tenant, actor);
        self.submit(OpKind::CreateTenant(tenant, event))
            .await?
            .done()
    }

    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>, LedgerError> {
        query("SELECT id, name, created_at FROM tenants WHERE id = $1")
            .bind(id.as_str())
            .optional(self.reader(), tenant_from_row)
            .await
    }

    async fn list_tenants(&self) -> Result<Vec<Tenant>, LedgerError> {
        // The system chain's reserved row is not a tenant.
        query("SELECT id, name, created_at FROM tenants WHERE id <> $1 ORDER BY id")
            .bind(SYSTEM_CHAIN)
            .all(self.reader(), tenant_from_row)
            .await
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
        query("SELECT tenant, id, name, created_at FROM agents WHERE tenant = $1 AND id = $2")
            .bind(tenant.as_str())
            .bind(id.as_str())
            .optional(self.reader(), agent_from_row)
            .await
    }

    async fn list_agents(&self, tenant: &TenantId) -> Result<Vec<Agent>, LedgerError> {
        query("SELECT tenant, id, name, created_at FROM agents WHERE tenant = $1 ORDER BY id")
            .bind(tenant.as_str())
            .all(self.reader(), agent_from_row)
            .await
    }

    async fn create_token(&self, token: TokenRecord, actor: &Actor) -> Result<(), LedgerError> {
        let event = AdminEvent::token_issued(&token, actor);
        self.submit(OpKind::CreateToken(token, event)).await?.done()
    }

    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>, LedgerError> {
        query(
            "SELECT id, hash, role, tenant, agent, label, created_at, revoked \
             FROM api_tokens WHERE hash = $1",
        )
        .bind(hash)
        .optional(self.reader(), token_from_row)
        .await
    }

    async fn list_tokens(
        &self,
        tenant: Option<&TenantId>,
    ) -> Result<Vec<TokenRecord>, LedgerError> {
        // `IS NOT DISTINCT FROM` matches NULL to NULL, so `None` lists the admin tokens.
        query(
            "SELECT id, hash, role, tenant, agent, label, created_at, revoked \
             FROM api_tokens WHERE tenant IS NOT DISTINCT FROM $1 ORDER BY id",
        )
        .bind(tenant.map(TenantId::as_str))
        .all(self.reader(), token_from_row)
        .await
    }

    async fn revoke_token(&self, id: &str, actor: &Actor) -> Result<(), LedgerError> {
        // The token's tenant decides the event's chain (whose head a PostgreSQL batch locks
        // before it runs); it never changes once stored.
        let tenant = query("SELECT tenant FROM api_tokens WHERE id = $1")
            .bind(id)
            .optional(self.reader(), |row| row.text_opt("tenant"))
            .await?;
        let Some(tenant) = tenant else {
            return Err(LedgerError::NotFound(format!("token {id}")));
        };
        let tenant = tenant.map(tenant_column).transpose()?;
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
        query(
            "SELECT tenant, agent, tool, enabled, updated_at FROM tool_permissions \
             WHERE tenant = $1 AND (agent IS NULL OR agent = $2) \
             ORDER BY tool, agent IS NOT NULL, agent",
        )
        .bind(tenant.as_str())
        .bind(agent.map(AgentId::as_str))
        .all(self.reader(), permission_from_row)
        .await
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
        query("SELECT enabled FROM feature_flags WHERE tenant = $1 AND flag = $2")
            .bind(tenant.as_str())
            .bind(flag)
            .optional(self.reader(), |row| row.flag("enabled"))
            .await
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
        query(
            "SELECT tenant, version, text, created_by, created_at FROM policy_sets \
             WHERE tenant = $1 ORDER BY version DESC LIMIT 1",
        )
        .bind(tenant.as_str())
        .optional(self.reader(), policy_set_from_row)
        .await
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
        query(
            "SELECT id, tenant, agent, manifest, status, calls_used, max_calls, \
             pending_approvals, created_at FROM runs WHERE tenant = $1 AND id = $2",
        )
        .bind(tenant.as_str())
        .bind(id.as_str())
        .optional(self.reader(), run_from_row)
        .await
    }

    async fn record_call(&self, call: NewCall) -> Result<RecordOutcome, LedgerError> {
        // A call that will run must belong to a process other replicas see alive.
        if call.call.status == ToolCallStatus::Running {
            self.check_live()?;
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
            self.check_live()?;
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
        // PostgreSQL keeps sealed answers in a table of their own, so that a call's finish
        // changes no indexed column of `tool_calls` (see its migration 0010).
        let read = match B::DIALECT {
            Dialect::Sqlite => query(
                "SELECT answer_sealed, answer_expires_at FROM tool_calls \
                 WHERE tenant = $1 AND id = $2 AND answer_sealed IS NOT NULL",
            ),
            Dialect::Postgres => query(
                "SELECT sealed AS answer_sealed, expires_at AS answer_expires_at \
                 FROM call_answers WHERE tenant = $1 AND call_id = $2",
            ),
        };
        read.bind(tenant.as_str())
            .bind(id.as_str())
            .optional(self.reader(), answer_from_row)
            .await
    }

    async fn purge_answers(&self, now: Timestamp, limit: u32) -> Result<u64, LedgerError> {
        self.submit(OpKind::PurgeAnswers { now, limit })
            .await?
            .count()
    }

    async fn get_tool_call(
        &self,
        tenant: &TenantId,
        id: &ToolCallId,
    ) -> Result<Option<ToolCallRecord>, LedgerError> {
        query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM tool_calls WHERE tenant = $1 AND id = $2"
        ))
        .bind(tenant.as_str())
        .bind(id.as_str())
        .optional(self.reader(), call_from_row)
        .await
    }

    async fn find_tool_call_by_use_id(
        &self,
        tenant: &TenantId,
        run: &RunId,
        tool_use_id: &ToolUseId,
    ) -> Result<Option<ToolCallRecord>, LedgerError> {
        query(concat!(
            "SELECT ",
            call_columns!(),
            " FROM tool_calls WHERE tenant = $1 AND run = $2 AND tool_use_id = $3"
        ))
        .bind(tenant.as_str())
        .bind(run.as_str())
        .bind(tool_use_id.as_str())
        .optional(self.reader(), call_from_row)
        .await
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
        let list = match B::DIALECT {
            Dialect::Sqlite => query(LIST_CALLS_SQLITE),
            Dialect::Postgres => query(LIST_CALLS_POSTGRES),
        };
        list.bind(tenant.as_str())
            .bind(run.as_str())
            .bind(after.map(ToolCallId::as_str))
            .bind(i64::from(limit))
            .all(self.reader(), call_from_row)
            .await
    }

    async fn list_running_calls(&self, limit: u32) -> Result<Vec<ToolCallRecord>, LedgerError> {
        self.interrupted_calls(limit).await
    }

    async fn list_pending(
        &self,
        tenant: &TenantId,
        filter: &PendingFilter,
        limit: u32,
    ) -> Result<Vec<PendingInvocation>, LedgerError> {
        query(concat!(
            "SELECT ",
            pending_columns!(),
            " FROM pending_invocations WHERE tenant = $1 AND state = 'pending' \
              AND (CAST($2 AS TEXT) IS NULL OR run = $2) \
              AND (CAST($3 AS TEXT) IS NULL OR tool = $3) \
              AND (CAST($4 AS TEXT) IS NULL OR origin = $4) ORDER BY created_at, id LIMIT $5"
        ))
        .bind(tenant.as_str())
        .bind(filter.run.as_ref().map(RunId::as_str))
        .bind(filter.tool.as_ref().map(ToolName::as_str))
        .bind(filter.origin.map(|origin| origin.as_str()))
        .bind(i64::from(limit))
        .all(self.reader(), pending_from_row)
        .await
    }

    async fn pending_summary(&self) -> Result<PendingSummary, LedgerError> {
        query(
            "SELECT COUNT(*) AS pending, MIN(created_at) AS oldest FROM pending_invocations \
             WHERE state = 'pending'",
        )
        .optional(self.reader(), |row| {
            Ok(PendingSummary {
                count: u64::try_from(row.int("pending")?).unwrap_or(0),
                oldest_created_at: row.int_opt("oldest")?.map(Timestamp),
            })
        })
        .await
        .map(Option::unwrap_or_default)
    }

    async fn pending_for_call(
        &self,
        tenant: &TenantId,
        call: &ToolCallId,
    ) -> Result<Option<PendingInvocation>, LedgerError> {
        query(concat!(
            "SELECT ",
            pending_columns!(),
            " FROM pending_invocations WHERE tenant = $1 AND tool_call_id = $2 \
             ORDER BY created_at DESC, id DESC LIMIT 1"
        ))
        .bind(tenant.as_str())
        .bind(call.as_str())
        .optional(self.reader(), pending_from_row)
        .await
    }

    async fn get_pending(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Option<PendingInvocation>, LedgerError> {
        query(concat!(
            "SELECT ",
            pending_columns!(),
            " FROM pending_invocations WHERE tenant = $1 AND id = $2"
        ))
        .bind(tenant.as_str())
        .bind(id)
        .optional(self.reader(), pending_from_row)
        .await
    }

    async fn resolve_pending(&self, resolution: ResolvePending) -> Result<bool, LedgerError> {
        // An approval moves the call to `running` here: the same rule as a new call.
        if resolution.call_status == ToolCallStatus::Running {
            self.check_live()?;
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
        query(concat!(
            "SELECT ",
            pending_columns!(),
            " FROM pending_invocations WHERE state = 'pending' AND expires_at <= $1 \
              ORDER BY expires_at, id LIMIT $2"
        ))
        .bind(now.0)
        .bind(i64::from(limit))
        .all(self.reader(), pending_from_row)
        .await
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
        query(concat!(
            "SELECT ",
            credential_columns!(),
            " FROM tenant_tool_secrets WHERE tenant = $1 AND name = $2"
        ))
        .bind(tenant.as_str())
        .bind(name.as_str())
        .optional(self.reader(), credential_from_row)
        .await
    }

    async fn list_credentials(
        &self,
        tenant: &TenantId,
    ) -> Result<Vec<CredentialRecord>, LedgerError> {
        query(concat!(
            "SELECT ",
            credential_columns!(),
            " FROM tenant_tool_secrets WHERE tenant = $1 ORDER BY name"
        ))
        .bind(tenant.as_str())
        .all(self.reader(), credential_from_row)
        .await
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
        query(concat!(
            "SELECT ",
            credential_columns!(),
            " FROM tenant_tool_secrets WHERE key_id IS NOT NULL AND key_id <> $1 \
              ORDER BY tenant, name LIMIT $2"
        ))
        .bind(key_id)
        .bind(i64::from(limit))
        .all(self.reader(), credential_from_row)
        .await
    }

    async fn sealed_key_usage(&self) -> Result<Vec<(String, u64)>, LedgerError> {
        query(
            "SELECT key_id, COUNT(*) AS used FROM (SELECT key_id FROM tenant_tool_secrets \
             WHERE key_id IS NOT NULL UNION ALL SELECT arguments_key_id FROM pending_invocations \
             WHERE state = 'pending' AND arguments_key_id IS NOT NULL) AS used \
             GROUP BY key_id ORDER BY key_id",
        )
        .all(self.reader(), |row| {
            let count = u64::try_from(row.int("used")?).unwrap_or(0);
            Ok((row.text("key_id")?, count))
        })
        .await
    }

    async fn list_pending_sealed_not_under(
        &self,
        key_id: &str,
        limit: u32,
    ) -> Result<Vec<PendingInvocation>, LedgerError> {
        query(concat!(
            "SELECT ",
            pending_columns!(),
            " FROM pending_invocations WHERE state = 'pending' \
              AND ((arguments_key_id IS NOT NULL AND arguments_key_id <> $1) \
              OR (arguments_sealed IS NULL AND arguments IS NOT NULL)) \
              ORDER BY tenant, id LIMIT $2"
        ))
        .bind(key_id)
        .bind(i64::from(limit))
        .all(self.reader(), pending_from_row)
        .await
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
        query(concat!(
            "SELECT ",
            event_columns!(),
            " FROM audit_events WHERE tenant = $1 AND chain_seq > $2 ORDER BY chain_seq LIMIT $3"
        ))
        .bind(tenant.as_str())
        .bind(after)
        .bind(i64::from(limit))
        .all(self.reader(), event_from_row)
        .await
    }

    async fn list_run_events(
        &self,
        tenant: &TenantId,
        run: &RunId,
        after: i64,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, LedgerError> {
        query(concat!(
            "SELECT ",
            event_columns!(),
            " FROM audit_events WHERE tenant = $1 AND run = $2 AND chain_seq > $3 \
              ORDER BY chain_seq LIMIT $4"
        ))
        .bind(tenant.as_str())
        .bind(run.as_str())
        .bind(after)
        .bind(i64::from(limit))
        .all(self.reader(), event_from_row)
        .await
    }

    async fn verify_against(
        &self,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<VerifyReport, LedgerError> {
        let keys = self.keys();
        let with = VerifyWith {
            keys: keys.as_deref(),
            checkpoint,
        };
        self.verify(with).await
    }

    fn audit_keys(&self) -> Option<Arc<dyn AuditKeys>> {
        self.keys()
    }

    async fn granted_tools(&self, tenant: &TenantId) -> Result<Vec<ToolName>, LedgerError> {
        query("SELECT DISTINCT tool FROM tool_permissions WHERE tenant = $1 ORDER BY tool")
            .bind(tenant.as_str())
            .all(self.reader(), |row| {
                ToolName::new(row.text("tool")?)
                    .map_err(|error| LedgerError::Corrupt(format!("column tool: {error}")))
            })
            .await
    }

    fn subscribe_commits(&self) -> Option<watch::Receiver<u64>> {
        self.commits()
    }

    fn subscribe_config_changes(&self) -> Option<watch::Receiver<u64>> {
        self.config_changes()
    }

    async fn close(&self) {
        self.shut_down().await;
    }
}
