//! The connector interface: what a vendor crate implements to serve a family of tools.

use std::collections::BTreeMap;
use std::fmt;
use std::time::{Duration, Instant};

use serde_json::Value;
use zeroize::Zeroizing;

use crate::error::ToolError;
use crate::ids::{AgentId, CorrelationId, RunId, SecretName, TenantId, ToolCallId, ToolName};
use crate::spec::ToolSpec;

/// A secret's plaintext. `Debug` and `Display` print `[REDACTED]`; the bytes are wiped on drop.
#[derive(Clone)]
pub struct SecretValue(Zeroizing<String>);

impl SecretValue {
    /// Wraps a plaintext.
    pub fn new(value: impl Into<String>) -> SecretValue {
        SecretValue(Zeroizing::new(value.into()))
    }

    /// The plaintext, for handing to a vendor. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

impl fmt::Display for SecretValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[REDACTED]")
    }
}

/// The secrets one invocation may use: exactly those its tool declared, for its own tenant.
#[derive(Clone, Default)]
pub struct Secrets {
    values: BTreeMap<SecretName, SecretValue>,
}

impl Secrets {
    /// No secrets.
    pub fn empty() -> Secrets {
        Secrets::default()
    }

    /// Adds one secret.
    pub fn insert(&mut self, name: SecretName, value: SecretValue) {
        self.values.insert(name, value);
    }

    /// The secret called `name`, if the tool declared it and the tenant has it.
    pub fn get(&self, name: &str) -> Option<&SecretValue> {
        self.values
            .iter()
            .find(|(key, _)| key.as_str() == name)
            .map(|(_, value)| value)
    }

    /// The names present (never the values).
    pub fn names(&self) -> impl Iterator<Item = &SecretName> {
        self.values.keys()
    }
}

impl fmt::Debug for Secrets {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.values.keys()).finish()
    }
}

/// What a connector learns about the call it serves.
#[derive(Debug, Clone)]
pub struct InvocationContext {
    /// The calling tenant.
    pub tenant: TenantId,
    /// The agent the run belongs to.
    pub agent: AgentId,
    /// The run.
    pub run: RunId,
    /// This call's ledger id.
    pub tool_call_id: ToolCallId,
    /// The caller's correlation id, for the vendor's request logs.
    pub correlation_id: CorrelationId,
    /// The tool being invoked.
    pub tool: ToolName,
    /// When the gateway gives up on the call. Connectors should pass it on to their HTTP
    /// client; the gateway enforces it regardless.
    pub deadline: Instant,
    /// The secrets the tool declared.
    pub secrets: Secrets,
}

impl InvocationContext {
    /// Time left until the deadline (zero once it has passed).
    pub fn remaining(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }
}

/// A connector's answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    /// The normalized result, returned in full to the agent.
    pub result: Value,
    /// How many vendor attempts it took (1 without retries).
    pub attempts: u32,
}

impl ToolOutput {
    /// A result obtained on the first attempt.
    pub fn new(result: Value) -> ToolOutput {
        ToolOutput {
            result,
            attempts: 1,
        }
    }
}

/// Serves one family of tools. Implementations are registered explicitly by the gateway.
///
/// `invoke` may take as long as it likes and may even panic: the engine races it against the
/// deadline and catches panics, so a misbehaving connector fails only its own call.
#[async_trait::async_trait]
pub trait Connector: Send + Sync + fmt::Debug + 'static {
    /// The family served, e.g. `slack`; every tool's name starts with it.
    fn family(&self) -> &str;

    /// The tools served.
    fn tools(&self) -> Vec<ToolSpec>;

    /// Executes one tool. `arguments` have already been validated against the tool's schema.
    async fn invoke(
        &self,
        ctx: InvocationContext,
        tool: &ToolName,
        arguments: Value,
    ) -> Result<ToolOutput, ToolError>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let value = SecretValue::new("xoxb-123-abc");
        assert_eq!(format!("{value:?} {value}"), "[REDACTED] [REDACTED]");
        let mut secrets = Secrets::empty();
        secrets.insert(SecretName::new("slack_default").unwrap(), value);
        let shown = format!("{secrets:?}");
        assert!(!shown.contains("xoxb"), "{shown}");
        assert_eq!(
            secrets.get("slack_default").map(SecretValue::expose),
            Some("xoxb-123-abc")
        );
    }
}

/// Why the secrets of a call could not be resolved.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecretError {
    /// The tenant has no secret of that name.
    #[error("secret `{0}` is not configured for this tenant")]
    Missing(SecretName),
    /// The secret exists but could not be read (a reference that does not resolve, a key
    /// that is not loaded). The message names no secret value.
    #[error("secret `{name}` could not be read: {reason}")]
    Unavailable {
        /// The secret.
        name: SecretName,
        /// Why, without any secret material.
        reason: String,
    },
}

/// Resolves a tenant's secrets by name. The engine asks only for the secrets a tool declares,
/// for the call's own tenant; implementations live outside core (they do I/O).
#[async_trait::async_trait]
pub trait SecretSource: Send + Sync + fmt::Debug + 'static {
    /// The named secrets of `tenant`, all or an error naming the first one that failed.
    async fn resolve(
        &self,
        tenant: &TenantId,
        names: &[SecretName],
    ) -> Result<Secrets, SecretError>;
}
