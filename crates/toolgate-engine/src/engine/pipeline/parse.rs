//! Step 1: the request parsed into a call. Malformed ids and unknown runs are refused and
//! audited (`request.rejected`) before any call row exists; everything the ledger will keep of
//! the request is redacted here.

use serde_json::{Value, json};
use toolgate_core::{CorrelationId, RunId, Timestamp, ToolCallId, ToolCallStatus, ToolUseId};
use toolgate_ledger::{NewAuditEvent, ToolCallRecord};

use super::Call;
use crate::catalog::parse_llm_tool_name;
use crate::engine::Engine;
use crate::engine::record::hash_json;
use crate::error::EngineError;
use crate::outcome::ExecuteRequest;

/// Longest tool name kept verbatim in the ledger for a call naming an unknown tool.
const MAX_RECORDED_NAME: usize = 128;

/// How many characters of arguments that are not JSON the ledger keeps (redacted).
const UNPARSED_EXCERPT_CHARS: usize = 1024;

/// Decodes a call's `arguments_json` as the pipeline does (step 5, before the schema): at most
/// `max_bytes`, JSON, an object (blank text is `{}`). The message says what is wrong without
/// echoing the text.
pub fn decode_arguments(text: &str, max_bytes: usize) -> Result<Value, String> {
    if text.len() > max_bytes {
        return Err(format!(
            "the arguments are {} bytes, more than the limit of {max_bytes} bytes",
            text.len()
        ));
    }
    let text = if text.trim().is_empty() { "{}" } else { text };
    let value: Value =
        serde_json::from_str(text).map_err(|e| format!("the arguments are not valid JSON: {e}"))?;
    if !value.is_object() {
        return Err("the arguments must be a JSON object".to_owned());
    }
    Ok(value)
}

/// The ids of a request, validated.
struct ParsedIds {
    run: RunId,
    tool_use_id: Option<ToolUseId>,
    correlation_id: CorrelationId,
}

impl Engine {
    /// Step 1: the ids and the run, then the call's row and its `tool_call.requested` event.
    /// The arguments are decoded here (their hash and redacted copy go in the row) and judged
    /// at step 5.
    pub(super) async fn parse(
        &self,
        request: &ExecuteRequest,
    ) -> Result<(Call, Result<Value, String>), EngineError> {
        let requested_at = self.clock.now();
        let ids = match self.parse_ids(request) {
            Ok(ids) => ids,
            Err(message) => {
                self.audit_rejected(request, &message, requested_at).await?;
                return Err(EngineError::InvalidRequest(message));
            }
        };
        let run = match self.cached_run(&request.tenant, &ids.run).await {
            Ok(run) if request.agent.as_ref().is_none_or(|a| *a == run.agent) => run,
            Ok(_) | Err(EngineError::NotFound(_)) => {
                let message = format!("run `{}` not found", ids.run);
                self.audit_rejected(request, &message, requested_at).await?;
                return Err(EngineError::NotFound(format!("run `{}`", ids.run)));
            }
            Err(other) => return Err(other),
        };
        // A name the redactor would change is no tool's name (it may be a credential pasted
        // in the wrong place): it is recorded redacted, and the call refused as not allowed.
        let name = parse_llm_tool_name(&request.tool)
            .filter(|name| self.redactor.redact_text(name.as_str()) == name.as_str());
        let arguments = decode_arguments(&request.arguments_json, self.config.max_argument_bytes);
        let record =
            self.new_record(request, &run, name.as_ref(), &arguments, ids, requested_at)?;
        let requested = self.requested_event(&record);
        let timeout = request
            .timeout
            .filter(|t| !t.is_zero())
            .map(|t| t.min(self.config.max_timeout));
        let call = Call {
            run,
            name,
            timeout,
            record,
            requested,
        };
        Ok((call, arguments))
    }

    /// A new `running` call row: what was asked (name, ids), the arguments' hash and redacted
    /// copy; the later steps fill in the rest.
    fn new_record(
        &self,
        request: &ExecuteRequest,
        run: &toolgate_ledger::RunRecord,
        name: Option<&toolgate_core::ToolName>,
        arguments: &Result<Value, String>,
        ids: ParsedIds,
        at: Timestamp,
    ) -> Result<ToolCallRecord, EngineError> {
        let tool = match name {
            Some(name) => name.to_string(),
            None => self.recorded_text(&request.tool, MAX_RECORDED_NAME),
        };
        let (args_hash, input_redacted) = match arguments {
            Ok(value) => (hash_json(value), self.redactor.redact_json(value)),
            Err(_) => (
                String::new(),
                self.redacted_raw_arguments(&request.arguments_json),
            ),
        };
        let id = ToolCallId::new(format!("tc_{}", uuid::Uuid::now_v7().simple()))
            .map_err(|e| EngineError::InvalidRequest(e.to_string()))?;
        Ok(ToolCallRecord {
            id,
            tenant: request.tenant.clone(),
            run: run.id.clone(),
            agent: run.agent.clone(),
            tool,
            action: name.map(|n| n.action().to_owned()),
            tool_use_id: ids.tool_use_id,
            correlation_id: ids.correlation_id,
            status: ToolCallStatus::Running,
            args_hash,
            input_redacted,
            output_redacted: None,
            error_code: None,
            error_text: None,
            policy_decision_id: None,
            risk_level: None,
            duration_ms: None,
            attempts: 0,
            evaluation: 1,
            created_at: at,
            updated_at: at,
        })
    }

    fn requested_event(&self, call: &ToolCallRecord) -> NewAuditEvent {
        self.event(
            call,
            "tool_call.requested",
            json!({
                "tool": call.tool,
                "tool_use_id": call.tool_use_id.as_ref().map(ToString::to_string),
                "correlation_id": call.correlation_id.to_string(),
            }),
        )
    }

    fn parse_ids(&self, request: &ExecuteRequest) -> Result<ParsedIds, String> {
        self.refuse_secret_id("run_id", &request.run)?;
        self.refuse_secret_id("tool_use_id", &request.tool_use_id)?;
        self.refuse_secret_id("correlation_id", &request.correlation_id)?;
        let run = RunId::new(request.run.clone()).map_err(|e| e.to_string())?;
        let tool_use_id = if request.tool_use_id.is_empty() {
            None
        } else {
            Some(ToolUseId::new(request.tool_use_id.clone()).map_err(|e| e.to_string())?)
        };
        let correlation_id = if request.correlation_id.is_empty() {
            CorrelationId::new(format!("corr_{}", uuid::Uuid::now_v7().simple()))
        } else {
            CorrelationId::new(request.correlation_id.clone())
        }
        .map_err(|e| e.to_string())?;
        Ok(ParsedIds {
            run,
            tool_use_id,
            correlation_id,
        })
    }

    /// Refuses an identifier the redactor would change: ids are stored and logged verbatim
    /// (they are what calls are found by), so one that holds a credential is refused rather
    /// than kept, and the message does not repeat it.
    pub(in crate::engine) fn refuse_secret_id(
        &self,
        field: &str,
        value: &str,
    ) -> Result<(), String> {
        if self.redactor.redact_text(value) == value {
            return Ok(());
        }
        Err(format!(
            "`{field}` looks like it holds a credential or personal data; send an opaque identifier"
        ))
    }

    /// What the ledger keeps of free text the caller sent where a name was expected: redacted
    /// first, then cut to `max` characters (so a cut never leaves part of a secret), with
    /// control characters replaced.
    fn recorded_text(&self, text: &str, max: usize) -> String {
        self.redactor
            .redact_text(text)
            .chars()
            .map(|c| if c.is_control() { '\u{fffd}' } else { c })
            .take(max)
            .collect()
    }

    /// What the ledger keeps of arguments that did not parse: an excerpt of the redacted text
    /// (redacted whole, then cut between words, so no part of a secret survives the cut),
    /// nothing at all when they were oversize.
    fn redacted_raw_arguments(&self, raw: &str) -> Value {
        if raw.len() > self.config.max_argument_bytes {
            return json!({"_unparsed": format!("[{} bytes omitted]", raw.len())});
        }
        json!({"_unparsed": self.redactor.redact_excerpt(raw, UNPARSED_EXCERPT_CHARS)})
    }

    /// Audits a request refused before a call row could exist (malformed ids, unknown run).
    async fn audit_rejected(
        &self,
        request: &ExecuteRequest,
        message: &str,
        at: Timestamp,
    ) -> Result<(), EngineError> {
        let tool = self.recorded_text(&request.tool, MAX_RECORDED_NAME);
        // The run is named only when it is a valid id that holds nothing secret.
        let run = RunId::new(request.run.clone())
            .ok()
            .filter(|_| self.refuse_secret_id("run_id", &request.run).is_ok());
        let event = NewAuditEvent {
            tenant: request.tenant.clone(),
            kind: "request.rejected".into(),
            run,
            tool_call_id: None,
            payload: json!({
                "operation": "execute_tool",
                "tool": tool,
                "reason": self.redactor.redact_text(message),
            }),
            at,
        };
        self.store.append_events(vec![event]).await?;
        Ok(())
    }
}
