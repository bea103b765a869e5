//! Requests into and outcomes out of the engine.

use std::time::Duration;

use serde_json::Value;
use toolgate_core::{
    AgentId, Decision, ErrorCode, RiskLevel, TenantId, ToolCallId, ToolCallStatus, ToolError,
};

/// One tool call as the agent runtime asked for it. Fields are raw: the engine validates them
/// (so a malformed field is audited, not silently dropped by the transport).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecuteRequest {
    /// The caller's tenant (from its token).
    pub tenant: TenantId,
    /// When the caller's token is bound to one agent, that agent: the run must be its own.
    pub agent: Option<AgentId>,
    /// The run id.
    pub run: String,
    /// The runtime's `tool_use` id (idempotency key); empty for none.
    pub tool_use_id: String,
    /// `family.action` or `family__action`.
    pub tool: String,
    /// The arguments as JSON text.
    pub arguments_json: String,
    /// The caller's correlation id; empty to generate one.
    pub correlation_id: String,
    /// A per-call timeout, clamped to the tool default and the gateway maximum.
    pub timeout: Option<Duration>,
    /// When the caller stops waiting (its gRPC deadline), if it said: the connector's hard
    /// timeout ends no later than then. Only for this execution: a call suspended for
    /// approval keeps `timeout`, not this, for its approved execution.
    pub deadline: Option<tokio::time::Instant>,
}

/// Opening a run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CreateRun {
    /// The caller's tenant.
    pub tenant: TenantId,
    /// The agent driving the run.
    pub agent: AgentId,
    /// A caller-chosen id, or `None` to generate one.
    pub run: Option<String>,
    /// The call budget, or `None` for the default.
    pub max_calls: Option<u32>,
}

/// How one call ended (or where it stands, when it awaits approval).
#[derive(Clone, Debug, PartialEq)]
pub struct ExecuteOutcome {
    /// The ledger id; `None` only when no row could be written.
    pub tool_call_id: Option<ToolCallId>,
    /// Where the call stands.
    pub status: ToolCallStatus,
    /// The full, unredacted result on success (also on a replay, while the sealed answer is
    /// kept; after that the ledger's redacted copy, and `redacted` says so).
    pub result: Option<Value>,
    /// Why it did not succeed.
    pub error: Option<ToolError>,
    /// Time spent in the connector.
    pub duration: Duration,
    /// Vendor attempts.
    pub attempts: u32,
    /// The policy decision, when evaluated.
    pub decision: Option<Decision>,
    /// The risk level, when evaluated.
    pub risk: Option<RiskLevel>,
    /// The pending invocation, when the call awaits a human decision.
    pub pending_invocation_id: Option<String>,
    /// Whether this repeats an earlier call with the same tool_use_id.
    pub replayed: bool,
    /// Whether `result` and the error message are the ledger's redacted copy rather than the
    /// answer itself (its sealed copy's retention has ended).
    pub redacted: bool,
}

impl ExecuteOutcome {
    /// The error code, if any.
    pub fn error_code(&self) -> Option<ErrorCode> {
        self.error.as_ref().map(|e| e.code)
    }
}

/// A human decision on a suspended call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResumeDecision {
    /// Execute the call.
    Approve,
    /// Do not execute it; the call ends rejected.
    Reject,
    /// Do not execute it, and let the run move on: the call ends `blocked` with `SKIPPED`.
    /// Resolves any origin, a policy denial included.
    Continue,
}

/// Resuming a pending invocation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResumeRequest {
    /// The approver's tenant (from the token).
    pub tenant: TenantId,
    /// Who decides (recorded in the ledger and the audit trail).
    pub approver: String,
    /// The run the invocation belongs to.
    pub run: String,
    /// The pending invocation.
    pub invocation: String,
    /// Approve or reject.
    pub decision: ResumeDecision,
    /// Why (stored redacted).
    pub reason: String,
}

/// What a resume did.
#[derive(Clone, Debug, PartialEq)]
pub enum ResumeOutcome {
    /// The call was claimed and executed; this is how it ended.
    Executed(ExecuteOutcome),
    /// The call was rejected (by this decision, or because the invocation had expired).
    Rejected {
        /// The call.
        tool_call_id: ToolCallId,
        /// True when it was rejected because it expired.
        expired: bool,
    },
    /// The invocation was resolved without executing the call; the run moves on.
    Continued {
        /// The call.
        tool_call_id: ToolCallId,
    },
    /// Another decision got there first; nothing changed.
    ClaimLost,
    /// Policy blocked this call: approval cannot override it (only Reject resolves the row).
    PolicyDenialTerminal,
    /// Approve while the tenant's kill switch (`tool_calling_enabled`) is off: nothing was
    /// executed and the invocation is still pending, unchanged; approve again once the switch
    /// is on. Reject and Continue are not affected.
    FeatureDisabled {
        /// The call.
        tool_call_id: ToolCallId,
        /// `FEATURE_DISABLED`, with a message saying the call is still pending.
        error: ToolError,
    },
}
