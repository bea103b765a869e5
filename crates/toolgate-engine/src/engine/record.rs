//! What the engine writes and reads back of a call: its audit events, its policy decision row,
//! its outcome rebuilt from the ledger, and the hash that binds a repeat to the same arguments.

use std::time::Duration;

use serde_json::Value;
use sha2::{Digest, Sha256};
use toolgate_core::{ToolError, ToolName};
use toolgate_ledger::{NewAuditEvent, PolicyDecisionRecord, ToolCallRecord};
use toolgate_policy::PolicyDecision;

use super::Engine;
use crate::outcome::ExecuteOutcome;

impl Engine {
    /// An audit event of `call`, now.
    pub(super) fn event(&self, call: &ToolCallRecord, kind: &str, payload: Value) -> NewAuditEvent {
        NewAuditEvent {
            tenant: call.tenant.clone(),
            kind: kind.to_owned(),
            run: Some(call.run.clone()),
            tool_call_id: Some(call.id.clone()),
            payload,
            at: self.clock.now(),
        }
    }

    /// The `policy_decisions` row of what policy decided for `call`.
    pub(super) fn decision_record(
        &self,
        call: &ToolCallRecord,
        tool: &ToolName,
        decision: &PolicyDecision,
    ) -> PolicyDecisionRecord {
        PolicyDecisionRecord {
            id: format!("pd_{}", uuid::Uuid::now_v7().simple()),
            tenant: call.tenant.clone(),
            tool_call_id: call.id.clone(),
            tool: tool.clone(),
            decision: decision.decision,
            risk: decision.risk,
            policy_ids: decision.policy_ids.clone(),
            policy_version: decision.policy_version,
            created_at: self.clock.now(),
        }
    }
}

/// An outcome rebuilt from the ledger (for replays and budget refusals).
pub(super) fn outcome_from_record(record: &ToolCallRecord, replayed: bool) -> ExecuteOutcome {
    let error = record
        .error_code
        .map(|code| ToolError::new(code, record.error_text.clone().unwrap_or_default()));
    ExecuteOutcome {
        tool_call_id: Some(record.id.clone()),
        status: record.status,
        result: record.output_redacted.clone(),
        error,
        duration: Duration::from_millis(
            u64::try_from(record.duration_ms.unwrap_or(0)).unwrap_or(0),
        ),
        attempts: u32::try_from(record.attempts).unwrap_or(u32::MAX),
        decision: None,
        risk: record.risk_level,
        pending_invocation_id: None,
        replayed,
        redacted: false,
    }
}

/// Hex SHA-256 of a JSON value's canonical text: object keys sorted at every level, so two
/// spellings of the same arguments hash alike (serde_json may preserve insertion order).
pub(crate) fn hash_json(value: &Value) -> String {
    let mut hasher = Sha256::new();
    write_canonical(value, &mut hasher);
    toolgate_core::hex::encode(hasher.finalize())
}

fn write_canonical(value: &Value, hasher: &mut Sha256) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            hasher.update(b"{");
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                hasher.update(Value::String(key.clone()).to_string().as_bytes());
                hasher.update(b":");
                write_canonical(&map[key.as_str()], hasher);
            }
            hasher.update(b"}");
        }
        Value::Array(items) => {
            hasher.update(b"[");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    hasher.update(b",");
                }
                write_canonical(item, hasher);
            }
            hasher.update(b"]");
        }
        scalar => hasher.update(scalar.to_string().as_bytes()),
    }
}
