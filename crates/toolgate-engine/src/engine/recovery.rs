//! Recovery: the calls a crash interrupted are settled `outcome_unknown`, never run again.

use serde_json::json;
use toolgate_core::{ErrorCode, ToolCallStatus, ToolError};
use toolgate_ledger::{FinishCall, ToolCallRecord};
use tracing::warn;

use super::Engine;
use crate::error::EngineError;

impl Engine {
    /// Settles the calls a crash interrupted: every call still `running` whose gateway process
    /// is gone (see `Store::list_running_calls`) becomes `outcome_unknown` (audited), because
    /// the vendor may or may not have acted. Nothing is executed again automatically. Call at
    /// start-up before serving, and periodically when replicas share the store.
    pub async fn recover_interrupted_calls(&self) -> Result<u64, EngineError> {
        const PAGE: u32 = 500;
        let mut settled = 0;
        loop {
            let running = self.store.list_running_calls(PAGE).await?;
            if running.is_empty() {
                return Ok(settled);
            }
            let mut progressed = false;
            for call in running {
                if self.store.finish_call(self.interrupted(&call)).await? {
                    settled += 1;
                    progressed = true;
                    warn!(tool_call_id = %call.id, tool = %call.tool, "interrupted call marked outcome_unknown");
                }
            }
            if !progressed {
                return Ok(settled);
            }
        }
    }

    /// The terminal record of a call the gateway stopped while it ran.
    fn interrupted(&self, call: &ToolCallRecord) -> FinishCall {
        let error = ToolError::new(
            ErrorCode::OutcomeUnknown,
            "the gateway stopped while this call was running: the vendor may or may not have acted, so check before retrying",
        );
        let event = self.event(
            call,
            "tool_call.outcome_unknown",
            json!({"tool": call.tool, "reason": "gateway_restarted"}),
        );
        FinishCall {
            tenant: call.tenant.clone(),
            id: call.id.clone(),
            status: ToolCallStatus::OutcomeUnknown,
            output_redacted: None,
            error_code: Some(error.code),
            error_text: Some(error.message),
            duration_ms: 0,
            attempts: call.attempts,
            at: self.clock.now(),
            answer: None,
            events: vec![event],
        }
    }
}
