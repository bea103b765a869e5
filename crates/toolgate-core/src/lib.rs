//! Domain types shared by every toolgate crate: ids, tool specs, the connector interface,
//! stable error codes, the tool registry and the redactor. This crate does no I/O.

mod audit_key;
mod clock;
mod connector;
mod decision;
mod error;
pub mod hex;
mod ids;
pub mod redact;
mod registry;
mod seal;
mod spec;
pub mod trace;

pub use audit_key::AuditKeys;
#[cfg(feature = "testkit")]
pub use clock::ManualClock;
pub use clock::{Clock, SystemClock, Timestamp};
pub use connector::{
    Connector, InvocationContext, SecretError, SecretSource, SecretValue, Secrets, ToolOutput,
};
pub use decision::{Decision, RiskLevel, ToolCallStatus};
pub use error::{ErrorCode, IdError, SpecError, ToolError};
pub use ids::{
    AgentId, CorrelationId, RunId, SecretName, TenantId, ToolCallId, ToolName, ToolUseId,
};
pub use redact::Redactor;
pub use registry::{RegisterError, ToolRegistry, UnknownTool};
pub use seal::{SealError, Sealer};
pub use spec::{Tag, ToolSpec};
