//! Records the ledger stores and returns. Plain domain values: SQL rows are converted to and
//! from them by hand inside each backend.

use serde_json::Value;
use toolgate_core::{
    AgentId, CorrelationId, Decision, ErrorCode, RiskLevel, RunId, SecretName, TenantId, Timestamp,
    ToolCallId, ToolCallStatus, ToolName, ToolUseId,
};

/// A tenant (organisation).
#[derive(Clone, Debug, PartialEq)]
pub struct Tenant {
    /// Its id.
    pub id: TenantId,
    /// A display name.
    pub name: String,
    /// When it was created.
    pub created_at: Timestamp,
}

/// An agent inside a tenant.
#[derive(Clone, Debug, PartialEq)]
pub struct Agent {
    /// Its tenant.
    pub tenant: TenantId,
    /// Its id, unique within the tenant.
    pub id: AgentId,
    /// A display name.
    pub name: String,
    /// When it was created.
    pub created_at: Timestamp,
}

/// What a bearer token may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Operators: every admin call, for every tenant.
    Admin,
    /// Agent runtimes: runs and tool calls of one tenant (optionally one agent).
    Agent,
    /// Humans who approve or reject suspended calls of one tenant.
    Approver,
}

impl Role {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Admin => "admin",
            Role::Agent => "agent",
            Role::Approver => "approver",
        }
    }

    /// Parses a stable name.
    pub fn parse(s: &str) -> Option<Role> {
        match s {
            "admin" => Some(Role::Admin),
            "agent" => Some(Role::Agent),
            "approver" => Some(Role::Approver),
            _ => None,
        }
    }
}

/// A stored API token. The secret itself is never stored, only its SHA-256 hash.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenRecord {
    /// Public id of the token (safe to show and log).
    pub id: String,
    /// Hex SHA-256 of the full token string.
    pub hash: String,
    /// What it may do.
    pub role: Role,
    /// The tenant it is bound to; `None` only for admin tokens.
    pub tenant: Option<TenantId>,
    /// For agent tokens bound to one agent.
    pub agent: Option<AgentId>,
    /// A human label (who or what holds it).
    pub label: String,
    /// When it was created.
    pub created_at: Timestamp,
    /// Whether it has been revoked.
    pub revoked: bool,
}

/// A grant of one tool to a whole tenant (`agent: None`) or to one agent.
#[derive(Clone, Debug, PartialEq)]
pub struct Permission {
    /// The tenant.
    pub tenant: TenantId,
    /// `None` for tenant-wide.
    pub agent: Option<AgentId>,
    /// The tool granted (may name a tool not registered on this gateway).
    pub tool: ToolName,
    /// Disabled grants are kept but ignored.
    pub enabled: bool,
    /// When it was last changed.
    pub updated_at: Timestamp,
}

/// The kill switch flag for tool calls.
pub const TOOL_CALLING_ENABLED: &str = "tool_calling_enabled";

/// Where a run stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunStatus {
    /// Accepting calls.
    Active,
    /// At least one call awaits a human decision.
    WaitingApproval,
    /// Closed by its runtime.
    Completed,
}

impl RunStatus {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Active => "active",
            RunStatus::WaitingApproval => "waiting_approval",
            RunStatus::Completed => "completed",
        }
    }

    /// Parses a stable name.
    pub fn parse(s: &str) -> Option<RunStatus> {
        match s {
            "active" => Some(RunStatus::Active),
            "waiting_approval" => Some(RunStatus::WaitingApproval),
            "completed" => Some(RunStatus::Completed),
            _ => None,
        }
    }
}

/// One agent run with its manifest snapshot.
#[derive(Clone, Debug, PartialEq)]
pub struct RunRecord {
    /// The tenant.
    pub tenant: TenantId,
    /// The run's id.
    pub id: RunId,
    /// The agent driving it.
    pub agent: AgentId,
    /// Tools this run may call, fixed at creation.
    pub manifest: Vec<ToolName>,
    /// Status.
    pub status: RunStatus,
    /// Calls counted against the budget so far.
    pub calls_used: i64,
    /// The budget: at most this many counted calls.
    pub max_calls: i64,
    /// Open pending invocations.
    pub pending_approvals: i64,
    /// When it was created.
    pub created_at: Timestamp,
}

/// One tool call, as the ledger keeps it. Inputs and outputs are stored redacted.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCallRecord {
    /// The call's id.
    pub id: ToolCallId,
    /// The tenant.
    pub tenant: TenantId,
    /// The run.
    pub run: RunId,
    /// The agent.
    pub agent: AgentId,
    /// The tool name as requested (not necessarily a registered or even valid name), at most
    /// 128 characters.
    pub tool: String,
    /// The action part of the tool name, when it parsed.
    pub action: Option<String>,
    /// The runtime's idempotency key.
    pub tool_use_id: Option<ToolUseId>,
    /// The caller's correlation id.
    pub correlation_id: CorrelationId,
    /// Where the call stands.
    pub status: ToolCallStatus,
    /// Hex SHA-256 of the arguments' canonical JSON text (empty when they did not parse).
    pub args_hash: String,
    /// The arguments, redacted.
    pub input_redacted: Value,
    /// The result, redacted.
    pub output_redacted: Option<Value>,
    /// Why it did not succeed.
    pub error_code: Option<ErrorCode>,
    /// A sanitized, redacted explanation.
    pub error_text: Option<String>,
    /// The policy decision that let it through or stopped it.
    pub policy_decision_id: Option<String>,
    /// The risk level policy assigned.
    pub risk_level: Option<RiskLevel>,
    /// Time spent in the connector.
    pub duration_ms: Option<i64>,
    /// Vendor attempts (retries included).
    pub attempts: i64,
    /// How many times the pipeline evaluated this call: 1, plus one for each repeat of its
    /// `tool_use_id` that evaluated a refusal again.
    pub evaluation: i64,
    /// When the call was requested.
    pub created_at: Timestamp,
    /// When the record last changed.
    pub updated_at: Timestamp,
}

/// One policy evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicyDecisionRecord {
    /// The decision's id.
    pub id: String,
    /// The tenant.
    pub tenant: TenantId,
    /// The call it was made for.
    pub tool_call_id: ToolCallId,
    /// The tool.
    pub tool: ToolName,
    /// The outcome.
    pub decision: Decision,
    /// The risk level.
    pub risk: RiskLevel,
    /// Ids of the policies that decided it.
    pub policy_ids: Vec<String>,
    /// Version of the tenant's policy set that was in force.
    pub policy_version: i64,
    /// When it was made.
    pub created_at: Timestamp,
}

/// Why a call is suspended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingOrigin {
    /// Policy asked for a human decision.
    ApprovalRequired,
    /// Policy blocked the call; only Reject resolves the row.
    PolicyDenied,
    /// An approved execution failed; an operator may decide again.
    ExecutionFailed,
}

impl PendingOrigin {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            PendingOrigin::ApprovalRequired => "APPROVAL_REQUIRED",
            PendingOrigin::PolicyDenied => "POLICY_DENIED",
            PendingOrigin::ExecutionFailed => "EXECUTION_FAILED",
        }
    }

    /// Parses a stable name.
    pub fn parse(s: &str) -> Option<PendingOrigin> {
        match s {
            "APPROVAL_REQUIRED" => Some(PendingOrigin::ApprovalRequired),
            "POLICY_DENIED" => Some(PendingOrigin::PolicyDenied),
            "EXECUTION_FAILED" => Some(PendingOrigin::ExecutionFailed),
            _ => None,
        }
    }
}

/// Where a pending invocation stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PendingState {
    /// Awaiting a decision.
    Pending,
    /// Claimed by an approval.
    Approved,
    /// Rejected (or expired, which resolves as rejected).
    Rejected,
    /// Resolved without executing: the run moved on.
    Continued,
}

impl PendingState {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            PendingState::Pending => "pending",
            PendingState::Approved => "approved",
            PendingState::Rejected => "rejected",
            PendingState::Continued => "continued",
        }
    }

    /// Parses a stable name.
    pub fn parse(s: &str) -> Option<PendingState> {
        match s {
            "pending" => Some(PendingState::Pending),
            "approved" => Some(PendingState::Approved),
            "rejected" => Some(PendingState::Rejected),
            "continued" => Some(PendingState::Continued),
            _ => None,
        }
    }
}

/// A suspended call, bound to the exact call that was suspended.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingInvocation {
    /// The invocation's id.
    pub id: String,
    /// The tenant.
    pub tenant: TenantId,
    /// The run.
    pub run: RunId,
    /// The suspended call.
    pub tool_call_id: ToolCallId,
    /// The tool.
    pub tool: ToolName,
    /// The original arguments, needed to execute on approval: sealed, and kept only while
    /// the row is pending and approval can run it.
    pub arguments: PendingArguments,
    /// Hex SHA-256 of the arguments.
    pub args_hash: String,
    /// The run's manifest when suspended.
    pub manifest: Vec<ToolName>,
    /// The policy set version that decided.
    pub policy_version: i64,
    /// Why it is suspended.
    pub origin: PendingOrigin,
    /// The decision that suspended it.
    pub decision: Decision,
    /// Where it stands.
    pub state: PendingState,
    /// Row version, bumped on every change; claims name the version they observed.
    pub version: i64,
    /// When it resolves as rejected if nobody decides.
    pub expires_at: Timestamp,
    /// When it was created.
    pub created_at: Timestamp,
    /// The per-call timeout the agent asked for (whole milliseconds, at least 1), which the
    /// approved execution runs under; `None` for the tool's default.
    pub timeout: Option<std::time::Duration>,
    /// The W3C `traceparent` of the span the call was suspended in, so that the span of the
    /// decision on it links to the call; `None` when traces are off. Not audited.
    pub trace_parent: Option<String>,
}

/// What a pending invocation keeps of its call's original arguments.
#[derive(Clone, Debug, PartialEq)]
pub enum PendingArguments {
    /// Sealed with the master key ring for the context the engine names; only the engine
    /// opens it. `key_id` names the key (the text carries it too), so key retirement can see
    /// what still needs a key and a rewrap can find what to re-seal.
    Sealed {
        /// The master key that sealed it.
        key_id: String,
        /// The sealed text.
        sealed: String,
    },
    /// In clear: rows written before arguments were sealed, or by an engine used without a
    /// sealer (library use; the gateway always seals).
    Clear(Value),
    /// Not kept: the row is resolved, or approval can never run it (`POLICY_DENIED`).
    Dropped,
}

/// An append-only, hash-chained audit record.
#[derive(Clone, Debug, PartialEq)]
pub struct AuditEvent {
    /// Global insertion order.
    pub seq: i64,
    /// The tenant whose chain it belongs to.
    pub tenant: TenantId,
    /// Position in the tenant's chain, from 1 without gaps.
    pub chain_seq: i64,
    /// e.g. `tool_call.requested`.
    pub kind: String,
    /// The run, when the event concerns one.
    pub run: Option<RunId>,
    /// The call, when the event concerns one.
    pub tool_call_id: Option<ToolCallId>,
    /// Redacted details.
    pub payload: Value,
    /// When it happened.
    pub at: Timestamp,
    /// Hash of the previous event in the tenant's chain (64 zeros for the first).
    pub prev_hash: String,
    /// This event's hash over `prev_hash` and its own fields.
    pub hash: String,
}

/// An audit event to append; the store assigns sequence numbers and hashes.
#[derive(Clone, Debug, PartialEq)]
pub struct NewAuditEvent {
    /// The tenant whose chain it joins.
    pub tenant: TenantId,
    /// e.g. `tool_call.blocked`.
    pub kind: String,
    /// The run.
    pub run: Option<RunId>,
    /// The call.
    pub tool_call_id: Option<ToolCallId>,
    /// Details; must already be redacted.
    pub payload: Value,
    /// When it happened.
    pub at: Timestamp,
}

/// The id of the system audit chain: administrative changes that belong to no tenant (admin
/// tokens issued or revoked, master keys rotated, rewrapped or retired). `@` is not allowed in
/// a tenant id, so no tenant's chain can ever take this id; a reserved row in `tenants` (added
/// by a migration, never returned by `list_tenants`) keeps the chain tables' foreign keys whole.
pub const SYSTEM_CHAIN: &str = "@system";

/// Which hash chain an audit event belongs to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum AuditChain {
    /// A tenant's chain: its runs, calls and the administrative changes made to it.
    Tenant(TenantId),
    /// The system chain ([`SYSTEM_CHAIN`]).
    System,
}

impl AuditChain {
    /// The chain id as stored in `audit_events.tenant`.
    pub fn as_str(&self) -> &str {
        match self {
            AuditChain::Tenant(tenant) => tenant.as_str(),
            AuditChain::System => SYSTEM_CHAIN,
        }
    }

    /// The chain of a stored chain id.
    pub fn parse(id: &str) -> Result<AuditChain, toolgate_core::IdError> {
        if id == SYSTEM_CHAIN {
            return Ok(AuditChain::System);
        }
        TenantId::new(id).map(AuditChain::Tenant)
    }

    /// The chain of a tenant, or the system chain for `None`.
    pub fn of(tenant: Option<&TenantId>) -> AuditChain {
        match tenant {
            Some(tenant) => AuditChain::Tenant(tenant.clone()),
            None => AuditChain::System,
        }
    }
}

impl std::fmt::Display for AuditChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who makes an administrative change, and when. Every store call that changes
/// administration (tenants, agents, tokens, grants, flags, policies, credentials, master keys)
/// takes one, and the store writes the change's `admin.*` audit event, naming this actor, in
/// the same transaction as the change: no such change is stored without its event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Actor {
    /// The public id of the admin token that made the change (never the token itself), or
    /// [`Actor::GATEWAY`] for what the gateway does by itself (the first admin token).
    pub token_id: String,
    /// When the change was made.
    pub at: Timestamp,
}

impl Actor {
    /// The actor of changes the gateway makes by itself, with no caller.
    pub const GATEWAY: &'static str = "gateway";

    /// A change made with the admin token `token_id`.
    pub fn token(token_id: impl Into<String>, at: Timestamp) -> Actor {
        Actor {
            token_id: token_id.into(),
            at,
        }
    }

    /// A change the gateway makes by itself.
    pub fn gateway(at: Timestamp) -> Actor {
        Actor::token(Actor::GATEWAY, at)
    }
}

/// A change of the master key ring, recorded on the system chain (the keys themselves live
/// outside the ledger; see [`crate::Store::record_key_change`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyChange {
    /// A fresh key was added and seals new credentials from now on.
    Rotated {
        /// The new active key.
        key_id: String,
        /// The key that was active before.
        previous: String,
    },
    /// Credentials were re-sealed under the active key (each one also has its own
    /// `admin.credential_rewrapped` event on its tenant's chain).
    Rewrapped {
        /// The key they are sealed with now.
        active_key_id: String,
        /// How many were re-sealed.
        rewrapped: u64,
        /// How many changed meanwhile and were left alone.
        skipped: u64,
    },
    /// A key no credential uses any more was removed.
    Retired {
        /// The removed key.
        key_id: String,
    },
}

/// One version of a tenant's Cedar policy set.
#[derive(Clone, Debug, PartialEq)]
pub struct PolicySetRecord {
    /// The tenant.
    pub tenant: TenantId,
    /// 1, 2, ... per tenant.
    pub version: i64,
    /// The Cedar source.
    pub text: String,
    /// Who uploaded it (token id).
    pub created_by: String,
    /// When.
    pub created_at: Timestamp,
}

/// Everything written when a call is first recorded, in one atomic step.
#[derive(Clone, Debug, PartialEq)]
pub struct NewCall {
    /// The call row. Its status says what happened: `running` (about to execute),
    /// `waiting_approval`, `blocked` or `failed`.
    pub call: ToolCallRecord,
    /// Whether this call counts against the run's budget. When it does and the budget is
    /// used up, the store records the call as `blocked` with `BUDGET_EXCEEDED` instead.
    pub count_against_budget: bool,
    /// The policy decision, when policy was evaluated.
    pub decision: Option<PolicyDecisionRecord>,
    /// The pending invocation, when the call is suspended.
    pub pending: Option<PendingInvocation>,
    /// Audit events to append (in order) in the same transaction.
    pub events: Vec<NewAuditEvent>,
}

/// What [`crate::Store::record_call`] did.
#[derive(Clone, Debug, PartialEq)]
pub enum RecordOutcome {
    /// The call was recorded as given.
    Recorded,
    /// The budget was used up: the call was recorded as `blocked` / `BUDGET_EXCEEDED` (with a
    /// `tool_call.blocked` audit event) instead of as given; here is that record.
    BudgetExceeded(ToolCallRecord),
    /// The run already has a call with this `tool_use_id`; nothing was written.
    Duplicate(ToolCallRecord),
}

/// The terminal update of a running call.
#[derive(Clone, Debug, PartialEq)]
pub struct FinishCall {
    /// The tenant.
    pub tenant: TenantId,
    /// The call.
    pub id: ToolCallId,
    /// `succeeded`, `failed`, `timed_out` or `outcome_unknown`.
    pub status: ToolCallStatus,
    /// The redacted result.
    pub output_redacted: Option<Value>,
    /// Why it did not succeed.
    pub error_code: Option<ErrorCode>,
    /// Sanitized, redacted explanation.
    pub error_text: Option<String>,
    /// Time spent in the connector.
    pub duration_ms: i64,
    /// Vendor attempts.
    pub attempts: i64,
    /// When it finished.
    pub at: Timestamp,
    /// The full answer, sealed, kept for replays until it expires.
    pub answer: Option<SealedAnswer>,
    /// Audit events to append in the same transaction.
    pub events: Vec<NewAuditEvent>,
}

/// A call's full answer as the ledger keeps it: a ciphertext only the key ring opens (the
/// ledger never sees the plaintext), and when it is purged.
#[derive(Clone, Debug, PartialEq)]
pub struct SealedAnswer {
    /// The sealed answer.
    pub sealed: String,
    /// When the retention ends; the purge removes it then.
    pub expires_at: Timestamp,
}

/// The result of checking every tenant's audit chain.
#[derive(Clone, Debug, PartialEq)]
pub struct VerifyReport {
    /// Events checked.
    pub events_checked: u64,
    /// Chains checked (tenants, and the system chain once it has events).
    pub chains_checked: u64,
    /// The first problem found, if any.
    pub first_problem: Option<ChainProblem>,
    /// Events MAC'd under a chain key (written with the master keys loaded).
    pub keyed_events: u64,
    /// Keyed events whose MAC was checked against the loaded keys. The others (no keys given,
    /// or their key is no longer loaded) were checked for their links and order only.
    pub authenticated_events: u64,
    /// Events with the legacy unkeyed hash (written before the keyed chain, or by a store
    /// opened without keys): anyone who could write the database could have recomputed them,
    /// unless a keyed event follows them in their chain (its MAC covers their last hash).
    pub legacy_events: u64,
    /// Legacy events that no keyed event follows: nothing authenticates them.
    pub unprotected_legacy_events: u64,
    /// Whether keys were given to check MACs with.
    pub keys_loaded: bool,
    /// Key ids that MAC'd events but are not loaded (retired, or another key file).
    pub missing_keys: Vec<String>,
    /// Call, decision and pending-invocation rows compared with what the chain bound.
    pub rows_checked: u64,
    /// Rows no binding covers because their call was recorded before the keyed chain.
    pub legacy_rows: u64,
    /// The last event of every chain checked, for a checkpoint.
    pub heads: Vec<ChainHead>,
    /// Chains compared with a checkpoint (0 when none was given).
    pub checkpoint_chains: u64,
}

/// Where a chain ends: its last event's position and hash (or MAC).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainHead {
    /// The chain.
    pub chain: AuditChain,
    /// The last event's position.
    pub chain_seq: i64,
    /// The last event's hash (a MAC for a keyed event).
    pub hash: String,
}

/// Where a chain stops being trustworthy.
#[derive(Clone, Debug, PartialEq)]
pub struct ChainProblem {
    /// The chain that is broken.
    pub chain: AuditChain,
    /// The chain position where it breaks.
    pub chain_seq: i64,
    /// What is wrong: edited, deleted, reordered or truncated.
    pub kind: ChainProblemKind,
    /// Human explanation.
    pub detail: String,
}

/// Kinds of chain damage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainProblemKind {
    /// An event's content no longer matches its hash.
    Edited,
    /// An event is missing (gap in chain positions, or the chain is shorter than its head).
    Deleted,
    /// Events are out of order (a predecessor hash does not match).
    Reordered,
}

impl ChainProblemKind {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            ChainProblemKind::Edited => "edited",
            ChainProblemKind::Deleted => "deleted",
            ChainProblemKind::Reordered => "reordered",
        }
    }
}

/// How a stored credential holds its value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CredentialKind {
    /// `value` is a ciphertext sealed under the master key `key_id`.
    Sealed,
    /// `value` is a reference (`env:NAME`, `file:/path`) read at use.
    Reference,
}

impl CredentialKind {
    /// The stable name.
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialKind::Sealed => "sealed",
            CredentialKind::Reference => "reference",
        }
    }

    /// Parses a stable name.
    pub fn parse(s: &str) -> Option<CredentialKind> {
        match s {
            "sealed" => Some(CredentialKind::Sealed),
            "reference" => Some(CredentialKind::Reference),
            _ => None,
        }
    }
}

/// A tenant's credential as stored. The ledger never sees plaintext: `value` is a ciphertext
/// or a reference.
#[derive(Clone, Debug, PartialEq)]
pub struct CredentialRecord {
    /// The owning tenant.
    pub tenant: TenantId,
    /// The secret's name, e.g. `slack_default`.
    pub name: SecretName,
    /// Sealed or reference.
    pub kind: CredentialKind,
    /// The ciphertext or the reference text.
    pub value: String,
    /// The master key of a sealed credential.
    pub key_id: Option<String>,
    /// Descriptive JSON (never secret material).
    pub metadata: Value,
    /// Free text.
    pub notes: String,
    /// Who stored it (token id).
    pub created_by: String,
    /// First stored.
    pub created_at: Timestamp,
    /// Last changed.
    pub updated_at: Timestamp,
}

/// The pending invocations of every tenant still awaiting a decision, in figures.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PendingSummary {
    /// How many there are.
    pub count: u64,
    /// When the oldest of them was created; `None` when there are none.
    pub oldest_created_at: Option<Timestamp>,
}

/// Which pending invocations to list.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PendingFilter {
    /// Only this run's.
    pub run: Option<RunId>,
    /// Only this tool's.
    pub tool: Option<ToolName>,
    /// Only this origin's.
    pub origin: Option<PendingOrigin>,
}

/// A human decision on a pending invocation, applied only if the row is still pending at the
/// version the decider observed (the claim).
#[derive(Clone, Debug, PartialEq)]
pub struct ResolvePending {
    /// The tenant.
    pub tenant: TenantId,
    /// The pending invocation.
    pub id: String,
    /// The row version the decider read; the claim fails if it moved.
    pub observed_version: i64,
    /// `Approved` or `Rejected`.
    pub state: PendingState,
    /// The approver's identity (token id and label).
    pub decided_by: String,
    /// The approver's reason, redacted.
    pub reason: String,
    /// When.
    pub at: Timestamp,
    /// The call's new status: `running` when approved (it executes next), `blocked` when
    /// rejected.
    pub call_status: ToolCallStatus,
    /// The call's error code when rejected.
    pub error_code: Option<ErrorCode>,
    /// The call's error text when rejected.
    pub error_text: Option<String>,
    /// Audit events appended with the claim.
    pub events: Vec<NewAuditEvent>,
}
