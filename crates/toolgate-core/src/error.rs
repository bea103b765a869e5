//! Stable error codes returned to agents, and the errors of building core values.

use std::fmt;
use std::str::FromStr;

/// A stable, machine-readable reason a tool call did not succeed. The string forms are part of
/// the public contract: agent runtimes and LLM prompts match on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The tenant's `tool_calling_enabled` flag is off.
    FeatureDisabled,
    /// The tool is not in the run's manifest.
    NotInManifest,
    /// No connector serves the tool.
    UnknownTool,
    /// The arguments are malformed, too large, or violate the tool's schema.
    InvalidArguments,
    /// Policy refused the call.
    PolicyBlocked,
    /// An expert rejected the call.
    ExpertRejected,
    /// The client rejected the call.
    ClientRejected,
    /// A secret the tool needs is not configured for the tenant.
    CredentialsNotFound,
    /// A secret the tool needs is configured but could not be read: it does not decrypt, its
    /// key is not loaded, its reference does not resolve, or the credential store failed.
    CredentialsUnavailable,
    /// The vendor answered with an error.
    VendorError,
    /// The vendor throttled the call.
    VendorRateLimited,
    /// The gateway's deadline passed.
    Timeout,
    /// The vendor may or may not have acted.
    OutcomeUnknown,
    /// The run used up its call budget.
    BudgetExceeded,
    /// The caller's token is missing, wrong or not allowed to do this.
    Unauthenticated,
    /// A fault inside the gateway or a connector.
    Internal,
    /// A decision let the run continue without executing the call.
    Skipped,
}

impl ErrorCode {
    /// Every code.
    pub const ALL: [ErrorCode; 17] = [
        ErrorCode::FeatureDisabled,
        ErrorCode::NotInManifest,
        ErrorCode::UnknownTool,
        ErrorCode::InvalidArguments,
        ErrorCode::PolicyBlocked,
        ErrorCode::ExpertRejected,
        ErrorCode::ClientRejected,
        ErrorCode::CredentialsNotFound,
        ErrorCode::CredentialsUnavailable,
        ErrorCode::VendorError,
        ErrorCode::VendorRateLimited,
        ErrorCode::Timeout,
        ErrorCode::OutcomeUnknown,
        ErrorCode::BudgetExceeded,
        ErrorCode::Unauthenticated,
        ErrorCode::Internal,
        ErrorCode::Skipped,
    ];

    /// The stable string form, e.g. `NOT_IN_MANIFEST`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::FeatureDisabled => "FEATURE_DISABLED",
            ErrorCode::NotInManifest => "NOT_IN_MANIFEST",
            ErrorCode::UnknownTool => "UNKNOWN_TOOL",
            ErrorCode::InvalidArguments => "INVALID_ARGUMENTS",
            ErrorCode::PolicyBlocked => "POLICY_BLOCKED",
            ErrorCode::ExpertRejected => "EXPERT_REJECTED",
            ErrorCode::ClientRejected => "CLIENT_REJECTED",
            ErrorCode::CredentialsNotFound => "CREDENTIALS_NOT_FOUND",
            ErrorCode::CredentialsUnavailable => "CREDENTIALS_UNAVAILABLE",
            ErrorCode::VendorError => "VENDOR_ERROR",
            ErrorCode::VendorRateLimited => "VENDOR_RATE_LIMITED",
            ErrorCode::Timeout => "TIMEOUT",
            ErrorCode::OutcomeUnknown => "OUTCOME_UNKNOWN",
            ErrorCode::BudgetExceeded => "BUDGET_EXCEEDED",
            ErrorCode::Unauthenticated => "UNAUTHENTICATED",
            ErrorCode::Internal => "INTERNAL",
            ErrorCode::Skipped => "SKIPPED",
        }
    }

    /// Whether a later attempt of the same call may succeed (throttling, timeouts, transient
    /// vendor faults). Validation and policy failures are never retryable.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::VendorRateLimited | ErrorCode::Timeout | ErrorCode::VendorError
        )
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for ErrorCode {
    type Err = String;

    fn from_str(s: &str) -> Result<ErrorCode, String> {
        ErrorCode::ALL
            .into_iter()
            .find(|code| code.as_str() == s)
            .ok_or_else(|| format!("unknown error code `{s}`"))
    }
}

/// A failed tool call as the agent sees it: a stable code and a message safe to show an LLM
/// (no secrets, no raw vendor payloads, no stack traces).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolError {
    /// The stable code.
    pub code: ErrorCode,
    /// A sanitized, human- and LLM-readable explanation.
    pub message: String,
    /// How many vendor attempts the connector made before failing (retries included; 0 when
    /// nothing was sent), as its HTTP client counted them. `None` when the connector did not
    /// say: the ledger then records the one invocation.
    pub attempts: Option<u32>,
}

impl ToolError {
    /// A new error that does not say how many attempts were made.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> ToolError {
        ToolError {
            code,
            message: message.into(),
            attempts: None,
        }
    }

    /// The same error, saying how many vendor attempts were made.
    #[must_use]
    pub fn with_attempts(mut self, attempts: u32) -> ToolError {
        self.attempts = Some(attempts);
        self
    }
}

impl fmt::Display for ToolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.code, self.message)
    }
}

impl std::error::Error for ToolError {}

/// An identifier failed validation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid {kind}: {reason}")]
pub struct IdError {
    /// Which identifier, e.g. `tenant id`.
    pub kind: &'static str,
    /// What is wrong with it.
    pub reason: String,
}

/// A tool spec failed validation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid tool spec `{tool}`: {reason}")]
pub struct SpecError {
    /// The tool's name as given.
    pub tool: String,
    /// What is wrong with it.
    pub reason: String,
}
