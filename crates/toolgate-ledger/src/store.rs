//! The store interface the engine and gateway use. Each backend (SQLite today) implements it;
//! nothing above this crate sees SQL.

use toolgate_core::{
    AgentId, RunId, SecretName, TenantId, Timestamp, ToolCallId, ToolName, ToolUseId,
};

use std::sync::Arc;

use crate::checkpoint::Checkpoint;
use crate::console::{ClientLink, ConsoleSession, PendingDetails};
use crate::error::LedgerError;
use crate::model::{
    Actor, Agent, AuditEvent, CredentialRecord, FinishCall, KeyChange, NewAuditEvent, NewCall,
    Permission, PolicySetRecord, RecordOutcome, RunRecord, SealedAnswer, Tenant, TokenRecord,
    ToolCallRecord, VerifyReport,
};
use crate::model::{PendingFilter, PendingInvocation, PendingSummary, ResolvePending};

/// Durable state of the gateway. Every write is committed (fsync'd) before the call returns;
/// implementations may batch concurrent writes into one transaction (group commit) but never
/// acknowledge a write before it is durable.
///
/// Every administrative change takes an [`Actor`] and commits together with its `admin.*`
/// audit event (the acting token's id and what changed, never secret material), in the same
/// transaction: on the tenant's chain when the change concerns a tenant, else on the system
/// chain ([`crate::SYSTEM_CHAIN`]). A refused change writes no event.
#[async_trait::async_trait]
pub trait Store: Send + Sync + std::fmt::Debug + 'static {
    // --- tenants, agents, tokens -------------------------------------------------------

    /// Creates a tenant (event `admin.tenant_created`, the first of its chain).
    /// `LedgerError::AlreadyExists` when the id is taken.
    async fn create_tenant(&self, tenant: Tenant, actor: &Actor) -> Result<(), LedgerError>;
    /// One tenant.
    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>, LedgerError>;
    /// Every tenant, by id.
    async fn list_tenants(&self) -> Result<Vec<Tenant>, LedgerError>;

    /// Creates an agent (`admin.agent_created`). `NotFound` when the tenant does not exist,
    /// `AlreadyExists` when taken.
    async fn create_agent(&self, agent: Agent, actor: &Actor) -> Result<(), LedgerError>;
    /// One agent.
    async fn get_agent(
        &self,
        tenant: &TenantId,
        id: &AgentId,
    ) -> Result<Option<Agent>, LedgerError>;
    /// A tenant's agents, by id.
    async fn list_agents(&self, tenant: &TenantId) -> Result<Vec<Agent>, LedgerError>;

    /// Stores a token (hashed; `admin.token_issued`, on the system chain for admin tokens).
    /// `NotFound` when its tenant or agent does not exist.
    async fn create_token(&self, token: TokenRecord, actor: &Actor) -> Result<(), LedgerError>;
    /// The token whose hash is `hash`, revoked or not.
    async fn find_token(&self, hash: &str) -> Result<Option<TokenRecord>, LedgerError>;
    /// Tokens of a tenant (`None`: admin tokens), never their secrets.
    async fn list_tokens(&self, tenant: Option<&TenantId>)
    -> Result<Vec<TokenRecord>, LedgerError>;
    /// Revokes a token by id (`admin.token_revoked`, on the token's tenant's chain or the
    /// system chain). `NotFound` when there is none.
    async fn revoke_token(&self, id: &str, actor: &Actor) -> Result<(), LedgerError>;

    // --- configuration -----------------------------------------------------------------

    /// Creates or updates a grant (`admin.grant_set`). `NotFound` when the tenant or agent
    /// does not exist.
    async fn put_permission(
        &self,
        permission: Permission,
        actor: &Actor,
    ) -> Result<(), LedgerError>;
    /// A tenant's grants: tenant-wide ones and, with `agent`, that agent's too.
    async fn list_permissions(
        &self,
        tenant: &TenantId,
        agent: Option<&AgentId>,
    ) -> Result<Vec<Permission>, LedgerError>;

    /// Sets a feature flag at `actor.at` (`admin.flag_set`). `NotFound` when the tenant does
    /// not exist.
    async fn set_flag(
        &self,
        tenant: &TenantId,
        flag: &str,
        enabled: bool,
        actor: &Actor,
    ) -> Result<(), LedgerError>;
    /// A feature flag; `None` when never set (callers apply the default).
    async fn get_flag(&self, tenant: &TenantId, flag: &str) -> Result<Option<bool>, LedgerError>;

    /// Stores a new version of a tenant's policy set, created by the actor at `actor.at`, and
    /// returns its version number (1, 2, ...; `admin.policy_set` with the version and the
    /// text's SHA-256). The caller has already validated the text.
    async fn put_policy_set(
        &self,
        tenant: &TenantId,
        text: &str,
        actor: &Actor,
    ) -> Result<i64, LedgerError>;
    /// The newest policy set of a tenant.
    async fn current_policy_set(
        &self,
        tenant: &TenantId,
    ) -> Result<Option<PolicySetRecord>, LedgerError>;

    // --- runs and calls ----------------------------------------------------------------

    /// Creates a run. `AlreadyExists` when the id is taken.
    async fn create_run(&self, run: RunRecord) -> Result<(), LedgerError>;
    /// One run of a tenant (`None` for another tenant's run).
    async fn get_run(
        &self,
        tenant: &TenantId,
        id: &RunId,
    ) -> Result<Option<RunRecord>, LedgerError>;

    /// Records a new call with its decision, pending invocation and audit events atomically,
    /// enforcing the run's budget and the `(run, tool_use_id)` idempotency key. A call recorded
    /// `running` is refused with `Unavailable`, writing nothing, while the store cannot show
    /// other processes it is alive (PostgreSQL: its instance lock is lost).
    async fn record_call(&self, call: NewCall) -> Result<RecordOutcome, LedgerError>;
    /// Evaluates a refused call again, for a repeat of its `tool_use_id`: `call.call.id` names
    /// the existing call, whose row is rewritten with the new evaluation (its `evaluation`
    /// goes up by one) only if it is still the refusal observed at `observed_evaluation`
    /// (status `blocked` or `failed`); a POLICY_DENIED pending invocation the earlier
    /// evaluation left open is resolved as superseded. Everything else is as in
    /// [`Store::record_call`], atomically. `Duplicate` carries the call as it now stands when
    /// another evaluation got there first (nothing is written).
    async fn retry_call(
        &self,
        call: NewCall,
        observed_evaluation: i64,
    ) -> Result<RecordOutcome, LedgerError>;
    /// Moves a `running` call to its terminal status and appends its audit events. Returns
    /// false (and writes nothing) when the call was not `running`.
    async fn finish_call(&self, finish: FinishCall) -> Result<bool, LedgerError>;
    /// The sealed full answer of a call of `tenant`, while it is kept.
    async fn get_call_answer(
        &self,
        tenant: &TenantId,
        id: &ToolCallId,
    ) -> Result<Option<SealedAnswer>, LedgerError>;
    /// Removes sealed answers whose retention ended at or before `now`, at most `limit`;
    /// returns how many it removed.
    async fn purge_answers(&self, now: Timestamp, limit: u32) -> Result<u64, LedgerError>;
    /// One call of a tenant.
    async fn get_tool_call(
        &self,
        tenant: &TenantId,
        id: &ToolCallId,
    ) -> Result<Option<ToolCallRecord>, LedgerError>;
    /// The call of a run with this idempotency key.
    async fn find_tool_call_by_use_id(
        &self,
        tenant: &TenantId,
        run: &RunId,
        tool_use_id: &ToolUseId,
    ) -> Result<Option<ToolCallRecord>, LedgerError>;
    /// A run's calls, oldest first, after `after` (a call id from a previous page).
    async fn list_tool_calls(
        &self,
        tenant: &TenantId,
        run: &RunId,
        after: Option<&ToolCallId>,
        limit: u32,
    ) -> Result<Vec<ToolCallRecord>, LedgerError>;

    /// Calls of every tenant still `running` whose executing process is gone, oldest first:
    /// the calls a crash interrupted. Never a call some live process is still running, so it
    /// is safe to call at any time (SQLite: calls that were running when the store was opened,
    /// its only process; PostgreSQL: calls whose owning replica no longer holds its lock).
    async fn list_running_calls(&self, limit: u32) -> Result<Vec<ToolCallRecord>, LedgerError>;

    // --- approvals ---------------------------------------------------------------------

    /// A tenant's pending invocations still awaiting a decision, oldest first.
    async fn list_pending(
        &self,
        tenant: &TenantId,
        filter: &PendingFilter,
        limit: u32,
    ) -> Result<Vec<PendingInvocation>, LedgerError>;
    /// The newest pending invocation of a call, in whatever state.
    async fn pending_for_call(
        &self,
        tenant: &TenantId,
        call: &ToolCallId,
    ) -> Result<Option<PendingInvocation>, LedgerError>;
    /// One pending invocation of a tenant, in whatever state.
    async fn get_pending(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Option<PendingInvocation>, LedgerError>;
    /// Claims a pending invocation for a decision: one conditional update on the observed
    /// version, then (only if it changed the row) the call's status, the run's pending count
    /// and the audit events, atomically. Returns false, writing nothing, when the row is no
    /// longer pending at that version (another decision won). A resolution that moves the call
    /// to `running` (an approval) is refused like a new running call in `record_call`.
    async fn resolve_pending(&self, resolution: ResolvePending) -> Result<bool, LedgerError>;
    /// How many pending invocations of every tenant await a decision, and the oldest one's
    /// creation time (one indexed aggregate, for the gateway's metrics).
    async fn pending_summary(&self) -> Result<PendingSummary, LedgerError>;
    /// Pending invocations of every tenant whose expiry is at or before `now`, soonest first.
    async fn list_expired_pending(
        &self,
        now: Timestamp,
        limit: u32,
    ) -> Result<Vec<PendingInvocation>, LedgerError>;
    /// Adds a pending invocation for an existing call (e.g. after an approved execution
    /// failed), raising the run's pending count, with its audit events.
    async fn add_pending(
        &self,
        pending: PendingInvocation,
        events: Vec<NewAuditEvent>,
    ) -> Result<(), LedgerError>;

    // --- credentials -------------------------------------------------------------------

    /// Creates or replaces a tenant's credential, keeping its `created_at`
    /// (`admin.credential_put`, naming the key or the reference, never the value). `NotFound`
    /// when the tenant does not exist.
    async fn put_credential(
        &self,
        credential: CredentialRecord,
        actor: &Actor,
    ) -> Result<(), LedgerError>;
    /// One credential of a tenant.
    async fn get_credential(
        &self,
        tenant: &TenantId,
        name: &SecretName,
    ) -> Result<Option<CredentialRecord>, LedgerError>;
    /// A tenant's credentials, by name (callers must not show their values).
    async fn list_credentials(
        &self,
        tenant: &TenantId,
    ) -> Result<Vec<CredentialRecord>, LedgerError>;
    /// Deletes a credential (`admin.credential_deleted`). `NotFound` when there is none.
    async fn delete_credential(
        &self,
        tenant: &TenantId,
        name: &SecretName,
        actor: &Actor,
    ) -> Result<(), LedgerError>;
    /// Sealed credentials of every tenant whose key is not `key_id`, at most `limit`.
    async fn list_sealed_not_under(
        &self,
        key_id: &str,
        limit: u32,
    ) -> Result<Vec<CredentialRecord>, LedgerError>;
    /// How many sealed values each master key protects that must not be lost: sealed
    /// credentials and the sealed arguments of pending invocations (sealed answers are not
    /// counted: without their key a replay gets the redacted copy).
    async fn sealed_key_usage(&self) -> Result<Vec<(String, u64)>, LedgerError>;
    /// Pending invocations of every tenant whose arguments are sealed under a key other than
    /// `key_id`, or kept in clear (rows written before arguments were sealed), at most
    /// `limit`.
    async fn list_pending_sealed_not_under(
        &self,
        key_id: &str,
        limit: u32,
    ) -> Result<Vec<PendingInvocation>, LedgerError>;
    /// Replaces a pending invocation's sealed arguments (re-sealed under `key_id`) only if
    /// it is still pending with `expected` (a sealed text, or `None` for clear arguments,
    /// which are then cleared). Returns whether it was replaced.
    async fn replace_pending_arguments(
        &self,
        tenant: &TenantId,
        id: &str,
        expected: Option<&str>,
        sealed: &str,
        key_id: &str,
    ) -> Result<bool, LedgerError>;
    /// Replaces a sealed value only if it is still `expected` (a concurrent update wins).
    /// Returns whether it was replaced; only then is `admin.credential_rewrapped` written.
    async fn replace_sealed(
        &self,
        tenant: &TenantId,
        name: &SecretName,
        expected: &str,
        value: &str,
        key_id: &str,
        actor: &Actor,
    ) -> Result<bool, LedgerError>;
    /// Records a change of the master key ring, which lives outside the ledger, on the system
    /// chain (`admin.key_rotated`, `admin.keys_rewrapped`, `admin.key_retired`).
    async fn record_key_change(&self, change: KeyChange, actor: &Actor) -> Result<(), LedgerError>;

    // --- audit -------------------------------------------------------------------------

    /// Appends audit events outside a call (e.g. rejected requests). Administrative changes
    /// write their own events, with the change.
    async fn append_events(&self, events: Vec<NewAuditEvent>) -> Result<(), LedgerError>;
    /// A tenant's audit events with `chain_seq > after`, in chain order.
    async fn list_events(
        &self,
        tenant: &TenantId,
        after: i64,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, LedgerError>;
    /// A run's audit events with `chain_seq > after`, in chain order.
    async fn list_run_events(
        &self,
        tenant: &TenantId,
        run: &RunId,
        after: i64,
        limit: u32,
    ) -> Result<Vec<AuditEvent>, LedgerError>;
    /// Checks every chain (each tenant's and the system chain) and the rows its events bind,
    /// and reports the first event or row edited, deleted or reordered. MACs are checked with
    /// the keys the store was opened with; the report says what could not be checked.
    async fn verify_chains(&self) -> Result<VerifyReport, LedgerError> {
        self.verify_against(None).await
    }

    /// [`Store::verify_chains`], also comparing every chain with a checkpoint taken earlier
    /// (truncation and rewinding show there). The checkpoint's own MAC is the caller's to
    /// check ([`Checkpoint::authenticate`]).
    async fn verify_against(
        &self,
        checkpoint: Option<&Checkpoint>,
    ) -> Result<VerifyReport, LedgerError>;

    /// The keys the store MACs and verifies events with, if it was opened with any.
    fn audit_keys(&self) -> Option<Arc<dyn toolgate_core::AuditKeys>>;

    /// Tools some grant names, for checking grants against the registry.
    async fn granted_tools(&self, tenant: &TenantId) -> Result<Vec<ToolName>, LedgerError>;

    /// Ticks whenever any process sharing this store has committed audit events (PostgreSQL:
    /// LISTEN/NOTIFY), so watchers on every replica re-read at once. `None` when only this
    /// process writes the store (SQLite), whose engine announces its own writes.
    fn subscribe_commits(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    /// Ticks whenever any process sharing this store has committed a configuration change
    /// (flags, grants, policies, tokens, credentials), so every replica can drop what it caches
    /// of them at once instead of when the cache expires. `None` when only this process writes
    /// the store.
    fn subscribe_config_changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        None
    }

    // --- the approval console ----------------------------------------------------------

    /// Opens a console session.
    async fn create_console_session(&self, session: ConsoleSession) -> Result<(), LedgerError>;

    /// The session whose id hashes to `id_hash`, expired or not.
    async fn get_console_session(
        &self,
        id_hash: &str,
    ) -> Result<Option<ConsoleSession>, LedgerError>;

    /// Records a request of the session at `at` if it is still valid then (not idle for
    /// `idle_ms`, not past its absolute expiry); `false` when it is not.
    async fn touch_console_session(
        &self,
        id_hash: &str,
        at: Timestamp,
        idle_ms: i64,
    ) -> Result<bool, LedgerError>;

    /// Ends a session (sign-out); `false` when there was none.
    async fn delete_console_session(&self, id_hash: &str) -> Result<bool, LedgerError>;

    /// Removes sessions past their absolute expiry at `now` or last seen at or before
    /// `idle_before`; answers how many.
    async fn purge_console_sessions(
        &self,
        now: Timestamp,
        idle_before: Timestamp,
    ) -> Result<u64, LedgerError>;

    /// Stores a client approval link with its audit events (on the link's tenant's chain).
    async fn create_client_link(
        &self,
        link: ClientLink,
        events: Vec<NewAuditEvent>,
    ) -> Result<(), LedgerError>;

    /// The link whose secret hashes to `hash`.
    async fn get_client_link(&self, hash: &str) -> Result<Option<ClientLink>, LedgerError>;

    /// Marks the link used for `decision` if it is unused and unexpired at `at`, appending
    /// `events` with it; `false` (and nothing written) when it was not.
    async fn use_client_link(
        &self,
        hash: &str,
        at: Timestamp,
        decision: &str,
        events: Vec<NewAuditEvent>,
    ) -> Result<bool, LedgerError>;

    /// Makes a link used at `used_at` usable again, appending `events` with it: its use
    /// decided nothing (the decision was refused or failed before the invocation was
    /// resolved). `false` (and nothing written) when the link is not in that state or its
    /// invocation is no longer pending.
    async fn release_client_link(
        &self,
        hash: &str,
        used_at: Timestamp,
        events: Vec<NewAuditEvent>,
    ) -> Result<bool, LedgerError>;

    /// Who decided the pending invocation `id` of `tenant` (once decided) and the policies
    /// that suspended it; `None` when there is no such invocation.
    async fn pending_details(
        &self,
        tenant: &TenantId,
        id: &str,
    ) -> Result<Option<PendingDetails>, LedgerError>;

    /// Commits every write queued so far, then closes the store: SQLite checkpoints its
    /// write-ahead log into the database and truncates it (so nothing overwritten lingers
    /// there), PostgreSQL gives up this process's liveness key. Writes after this fail with
    /// [`LedgerError::Closed`].
    async fn close(&self);
}
