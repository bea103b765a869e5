//! Steps 9 to 13, for a call whose `running` row is committed (by step 8, or by an approval
//! claiming its pending invocation): credentials, the connector under the deadline, the
//! normalized outcome, the terminal record, the answer.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_core::{
    ErrorCode, InvocationContext, SecretError, Secrets, ToolCallStatus, ToolError, ToolSpec,
};
use toolgate_ledger::{FinishCall, ToolCallRecord};
use tracing::warn;

use super::{Tool, Verdict};
use crate::engine::Engine;
use crate::engine::record::outcome_from_record;
use crate::error::EngineError;
use crate::invoke::{Invocation, invoke};
use crate::outcome::ExecuteOutcome;
use crate::trace;

/// A call ready for its connector.
pub(in crate::engine) struct Execution<'a> {
    pub(in crate::engine) call: &'a ToolCallRecord,
    pub(in crate::engine) tool: Tool,
    pub(in crate::engine) arguments: Value,
    /// The deadline the connector runs under, already bounded by the maximum.
    pub(in crate::engine) timeout: Duration,
    /// What policy (or the human who approved) decided, for the outcome.
    pub(in crate::engine) verdict: Verdict,
}

/// How a call ended (step 11), as the terminal record keeps it.
struct Ending {
    status: ToolCallStatus,
    result: Option<Value>,
    error: Option<ToolError>,
    elapsed: Duration,
    attempts: u32,
    /// The audit event's `reason`, when the call did not succeed.
    reason: &'static str,
}

impl Ending {
    fn failed(
        status: ToolCallStatus,
        error: ToolError,
        elapsed: Duration,
        attempts: u32,
        reason: &'static str,
    ) -> Ending {
        Ending {
            status,
            result: None,
            error: Some(error),
            elapsed,
            attempts,
            reason,
        }
    }
}

impl Engine {
    /// Steps 9 to 13: credentials, the connector under the deadline, normalization, the
    /// terminal record.
    pub(in crate::engine) async fn run_connector(
        &self,
        execution: Execution<'_>,
    ) -> Result<ExecuteOutcome, EngineError> {
        let Execution {
            call,
            tool,
            arguments,
            timeout,
            verdict,
        } = execution;
        let secrets = match self.credentials(call, &tool.spec).await {
            Ok(secrets) => secrets,
            Err(missing) => return self.finish(call, verdict, missing).await,
        };
        let context = InvocationContext {
            tenant: call.tenant.clone(),
            agent: call.agent.clone(),
            run: call.run.clone(),
            tool_call_id: call.id.clone(),
            correlation_id: call.correlation_id.clone(),
            tool: tool.spec.name.clone(),
            deadline: Instant::now() + timeout,
            secrets,
        };
        let started = Instant::now();
        let invocation = invoke(
            tool.connector,
            context,
            tool.spec.name.clone(),
            arguments,
            timeout,
            trace::connector_span(&tool.spec.name, timeout.as_millis()),
        )
        .await;
        let elapsed = started.elapsed();
        self.observer
            .connector_finished(tool.spec.name.as_str(), elapsed);
        let ending = self.normalize(call, &tool.spec, timeout, invocation, elapsed);
        self.finish(call, verdict, ending).await
    }

    /// Step 9: credentials, only those the tool declares, for the call's tenant. Absent is
    /// not the same as unreadable (undecryptable, unresolved, store down).
    async fn credentials(&self, call: &ToolCallRecord, spec: &ToolSpec) -> Result<Secrets, Ending> {
        if spec.required_secrets.is_empty() {
            return Ok(Secrets::empty());
        }
        let resolved = match &self.secrets {
            Some(source) => {
                trace::timed(
                    trace::credentials_span(spec.required_secrets.len()),
                    source.resolve(&call.tenant, &spec.required_secrets),
                )
                .await
            }
            None => Err(SecretError::Unavailable {
                name: spec.required_secrets[0].clone(),
                reason: "this gateway has no credential store configured".to_owned(),
            }),
        };
        resolved.map_err(|err| {
            let code = match err {
                SecretError::Missing(_) => ErrorCode::CredentialsNotFound,
                _ => ErrorCode::CredentialsUnavailable,
            };
            let error = ToolError::new(code, err.to_string());
            Ending::failed(
                ToolCallStatus::Failed,
                error,
                Duration::ZERO,
                0,
                "credentials_missing",
            )
        })
    }

    /// Step 11: how the invocation ended, as a call status. A timeout is `TIMED_OUT` for an
    /// idempotent tool and `OUTCOME_UNKNOWN` otherwise (the vendor may have acted).
    fn normalize(
        &self,
        call: &ToolCallRecord,
        spec: &ToolSpec,
        timeout: Duration,
        invocation: Invocation,
        elapsed: Duration,
    ) -> Ending {
        match invocation {
            Invocation::Answered(Ok(output)) => Ending {
                status: ToolCallStatus::Succeeded,
                result: Some(output.result),
                error: None,
                elapsed,
                attempts: output.attempts,
                reason: "succeeded",
            },
            Invocation::Answered(Err(error)) => self.connector_error(error, elapsed),
            Invocation::TimedOut if spec.idempotent => {
                let error = ToolError::new(
                    ErrorCode::Timeout,
                    format!("the tool did not answer within {} ms", timeout.as_millis()),
                );
                Ending::failed(ToolCallStatus::TimedOut, error, elapsed, 1, "timeout")
            }
            Invocation::TimedOut => {
                let error = ToolError::new(
                    ErrorCode::OutcomeUnknown,
                    format!(
                        "the tool did not answer within {} ms and is not idempotent: the vendor may or may not have acted, so do not retry without checking",
                        timeout.as_millis()
                    ),
                );
                Ending::failed(
                    ToolCallStatus::OutcomeUnknown,
                    error,
                    elapsed,
                    1,
                    "timeout_not_idempotent",
                )
            }
            Invocation::Panicked => {
                warn!(tool = %spec.name, tool_call_id = %call.id, "connector panicked");
                let error = ToolError::new(
                    ErrorCode::Internal,
                    "the tool failed unexpectedly and the call was not completed",
                );
                Ending::failed(
                    ToolCallStatus::Failed,
                    error,
                    elapsed,
                    1,
                    "connector_panicked",
                )
            }
        }
    }

    /// A connector's own error: its code says how the call ended. A transport failure after
    /// a post was sent is `OUTCOME_UNKNOWN` (the vendor may have acted), which must not read
    /// as a plain failure that is safe to repeat.
    fn connector_error(&self, error: ToolError, elapsed: Duration) -> Ending {
        let status = match error.code {
            ErrorCode::OutcomeUnknown => ToolCallStatus::OutcomeUnknown,
            ErrorCode::Timeout => ToolCallStatus::TimedOut,
            _ => ToolCallStatus::Failed,
        };
        // A connector that does not count its attempts was invoked once.
        let attempts = error.attempts.unwrap_or(1);
        let sanitized = ToolError::new(
            error.code,
            self.redactor.redact_text(&error.message).into_owned(),
        );
        Ending::failed(status, sanitized, elapsed, attempts, "connector_error")
    }

    /// Steps 12 and 13: the terminal row and its audit event are committed (redacted) before
    /// the agent gets the full result. A call no longer `running` (settled meanwhile by
    /// another process) is answered as the ledger recorded it.
    async fn finish(
        &self,
        call: &ToolCallRecord,
        verdict: Verdict,
        ending: Ending,
    ) -> Result<ExecuteOutcome, EngineError> {
        let status = ending.status;
        let finish = self.terminal_record(call, &ending);
        let outcome = ExecuteOutcome {
            tool_call_id: Some(call.id.clone()),
            status,
            result: ending.result,
            error: ending.error,
            duration: ending.elapsed,
            attempts: ending.attempts,
            decision: Some(verdict.0),
            risk: Some(verdict.1),
            pending_invocation_id: None,
            replayed: false,
            redacted: false,
        };
        let finish = FinishCall {
            answer: self.seal_answer(call, &outcome),
            ..finish
        };
        let finished =
            trace::timed(trace::ledger_span("finish"), self.store.finish_call(finish)).await?;
        self.announce_events();
        if finished {
            return Ok(outcome);
        }
        // Someone else settled the call first (another replica took this one for dead, or
        // recovery ran): the agent is told what the ledger says, never what it does not.
        warn!(tool_call_id = %call.id, %status, "call was no longer running when it finished; answering what the ledger recorded");
        let recorded = self
            .store
            .get_tool_call(&call.tenant, &call.id)
            .await?
            .ok_or_else(|| EngineError::NotFound(format!("tool call `{}`", call.id)))?;
        Ok(ExecuteOutcome {
            decision: Some(verdict.0),
            ..outcome_from_record(&recorded, false)
        })
    }

    /// The terminal row of `ending`, redacted (outputs lose personal data as well as
    /// secrets), with its audit event; the sealed answer is added by the caller.
    fn terminal_record(&self, call: &ToolCallRecord, ending: &Ending) -> FinishCall {
        let duration_ms = i64::try_from(ending.elapsed.as_millis()).unwrap_or(i64::MAX);
        let kind = match ending.status {
            ToolCallStatus::Succeeded => "tool_call.succeeded",
            ToolCallStatus::TimedOut => "tool_call.timed_out",
            ToolCallStatus::OutcomeUnknown => "tool_call.outcome_unknown",
            _ => "tool_call.failed",
        };
        let mut payload =
            json!({"tool": call.tool, "duration_ms": duration_ms, "attempts": ending.attempts});
        if let Some(error) = &ending.error {
            payload["reason"] = json!(ending.reason);
            payload["error_code"] = json!(error.code.as_str());
        }
        FinishCall {
            tenant: call.tenant.clone(),
            id: call.id.clone(),
            status: ending.status,
            output_redacted: ending
                .result
                .as_ref()
                .map(|r| self.redactor.redact_output_json(r)),
            error_code: ending.error.as_ref().map(|e| e.code),
            error_text: ending
                .error
                .as_ref()
                .map(|e| self.redactor.redact_output_text(&e.message).into_owned()),
            duration_ms,
            attempts: i64::from(ending.attempts),
            at: self.clock.now(),
            answer: None,
            events: vec![self.event(call, kind, payload)],
        }
    }
}
