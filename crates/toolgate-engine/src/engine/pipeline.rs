//! `Engine::execute`: the pipeline, one named step after another (ARCHITECTURE.md numbers
//! them). `parse.rs` is step 1, `checks.rs` steps 2 to 6, `stops.rs` what ends a call before
//! its connector runs (a refusal, step 7's approval, step 8's replays and budget), and
//! `execution.rs` steps 9 to 13, which an approved call also goes through.

use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use toolgate_core::{
    Connector, Decision, RiskLevel, ToolCallStatus, ToolError, ToolName, ToolSpec,
};
use toolgate_ledger::{
    NewAuditEvent, PendingInvocation, PolicyDecisionRecord, RunRecord, ToolCallRecord,
};
use toolgate_policy::PolicyDecision;

mod checks;
mod execution;
mod parse;
mod stops;

pub(super) use execution::Execution;
pub use parse::decode_arguments;

use super::Engine;
use crate::error::EngineError;
use crate::observe::CallReport;
use crate::outcome::{ExecuteOutcome, ExecuteRequest};
use crate::trace;

/// A decision and risk level, as reported in outcomes.
pub(super) type Verdict = (Decision, RiskLevel);

/// One call as the steps hand it on.
struct Call {
    run: Arc<RunRecord>,
    /// The requested tool, when the name parses and holds nothing the redactor would change.
    name: Option<ToolName>,
    /// The timeout the agent asked for, bounded by the maximum (`None`: the tool's default).
    /// A suspended call keeps it, so that its approved execution honours it.
    timeout: Option<Duration>,
    /// The ledger row, which the steps fill in.
    record: ToolCallRecord,
    /// The request's audit event, written in the same transaction as whatever happens to it.
    requested: NewAuditEvent,
}

/// The connector a call resolved to (step 4).
pub(super) struct Tool {
    pub(super) spec: Arc<ToolSpec>,
    pub(super) connector: Arc<dyn Connector>,
}

/// What policy decided (step 6), and its `policy_decisions` row.
struct Decided {
    decision: PolicyDecision,
    record: PolicyDecisionRecord,
}

impl Decided {
    fn verdict(&self) -> Verdict {
        (self.decision.decision, self.decision.risk)
    }
}

/// A call the checks let through (steps 2 to 6).
struct Admitted {
    name: ToolName,
    tool: Tool,
    /// Valid against the tool's schema.
    arguments: Value,
    decided: Decided,
}

/// Why the pipeline stops a call before anything runs: recorded, then answered.
struct Refusal {
    status: ToolCallStatus,
    error: ToolError,
    /// The audit event's `reason`.
    reason: &'static str,
    /// A policy block: the decision, and the POLICY_DENIED pending invocation it leaves.
    denial: Option<Box<Denial>>,
}

struct Denial {
    decided: Decided,
    pending: PendingInvocation,
}

/// How steps 2 to 6 end early: a refusal to record, or a request that cannot be served.
enum Stop {
    Refused(Refusal),
    Failed(EngineError),
}

impl From<Refusal> for Stop {
    fn from(refusal: Refusal) -> Stop {
        Stop::Refused(refusal)
    }
}

impl From<EngineError> for Stop {
    fn from(error: EngineError) -> Stop {
        Stop::Failed(error)
    }
}

impl Engine {
    /// Executes one tool call through the whole pipeline.
    ///
    /// Tool failures (refusals, invalid arguments, vendor errors, timeouts) are `Ok` outcomes:
    /// they are normal results the LLM can explain. `Err` means the request itself could not
    /// be served (malformed ids, an unknown run, a reused tool_use_id, the ledger failing).
    pub async fn execute(&self, request: ExecuteRequest) -> Result<ExecuteOutcome, EngineError> {
        let started = std::time::Instant::now();
        let span = trace::call_span(request.tenant.as_str());
        // The pipeline's future is large (every step's state); boxed, it is copied once, into
        // its box (about 700 instructions a call under callgrind), and never again as the
        // futures around it (the span, the gRPC handler, the server's task) are created and
        // moved.
        let answer = trace::in_span(&span, Box::pin(self.steps(&request, &span))).await;
        trace::record_outcome(&span, &answer);
        let report = match &answer {
            Ok(outcome) => CallReport {
                requested_tool: &request.tool,
                status: Some(outcome.status),
                decision: outcome.decision,
                total: started.elapsed(),
                connector: if outcome.replayed {
                    Duration::ZERO
                } else {
                    outcome.duration
                },
            },
            Err(_) => CallReport {
                requested_tool: &request.tool,
                status: None,
                decision: None,
                total: started.elapsed(),
                connector: Duration::ZERO,
            },
        };
        self.observer.call_finished(&report);
        answer
    }

    /// [`Engine::execute`]'s steps, inside the call's span.
    async fn steps(
        &self,
        request: &ExecuteRequest,
        span: &trace::Span,
    ) -> Result<ExecuteOutcome, EngineError> {
        let (mut call, arguments) = self.parse(request).await?;
        trace::record_call(span, &call.record, call.name.as_ref());
        // The refusal and approval paths are boxed: the state of a future is that of its
        // largest path, and every call would otherwise carry theirs.
        let admitted = match self.admit(&mut call, arguments, span).await {
            Ok(admitted) => admitted,
            Err(Stop::Refused(refusal)) => return Box::pin(self.refuse(call, refusal)).await,
            Err(Stop::Failed(error)) => return Err(error),
        };
        if admitted.decided.decision.decision.needs_approval() {
            return Box::pin(self.approval(call, admitted)).await;
        }
        let configured = call
            .timeout
            .unwrap_or(admitted.tool.spec.default_timeout)
            .min(self.config.max_timeout);
        // The caller's deadline caps it: running on after the caller stopped waiting would
        // only hold a slot for an answer nobody reads.
        let timeout = match request.deadline {
            Some(deadline) => {
                configured.min(deadline.saturating_duration_since(tokio::time::Instant::now()))
            }
            None => configured,
        };
        let verdict = admitted.decided.verdict();
        let Admitted {
            tool,
            arguments,
            decided,
            ..
        } = admitted;
        let (record, answer) = self.record_running(call, decided.record).await?;
        if let Some(answer) = answer {
            return answer;
        }
        let execution = Execution {
            call: &record,
            tool,
            arguments,
            timeout,
            verdict,
        };
        self.run_connector(execution).await
    }

    /// Steps 2 to 6: the checks a call passes before anything is written for it (`span` is
    /// the call's).
    async fn admit(
        &self,
        call: &mut Call,
        arguments: Result<Value, String>,
        span: &trace::Span,
    ) -> Result<Admitted, Stop> {
        self.kill_switch(call).await?;
        let name = self.manifest(call)?;
        let tool = self.resolve(&name)?;
        let arguments = self.validate(&name, arguments)?;
        let decided = self.policy(call, &name, &tool, &arguments, span).await?;
        Ok(Admitted {
            name,
            tool,
            arguments,
            decided,
        })
    }
}
