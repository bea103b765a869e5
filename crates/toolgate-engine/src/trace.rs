//! The spans of a call, named and attributed after OpenTelemetry's GenAI semantic conventions
//! (`execute_tool {gen_ai.tool.name}`, kind internal) plus `toolgate.*` attributes, and their
//! children: policy evaluation, ledger commits, credential resolution, the connector, and an
//! approval's decision.
//!
//! These are plain `tracing` spans at debug level, and [`Leaf`] spans for the work that makes
//! no spans of its own (policy evaluation, ledger commits, credential resolution): the engine
//! depends on no exporter. An application that installs a recording subscriber (the gateway
//! does when `OTEL_EXPORTER_OTLP_ENDPOINT` is set) exports them; without one, and with logs at
//! info, nothing subscribes to them and they cost what a disabled span costs (a leaf, one
//! atomic load). A span carries names, ids and codes only, never an argument or a result
//! value.

use tracing::Span;
use tracing::field::Empty;

use toolgate_core::trace::{Attribute, Leaf, LeafValue, SpanContext};

use toolgate_core::{ToolCallStatus, ToolName};
use toolgate_ledger::{PendingInvocation, ToolCallRecord};
use toolgate_policy::PolicyDecision;

use crate::error::EngineError;
use crate::outcome::{ExecuteOutcome, ResumeOutcome};

/// The span of one `ExecuteTool`, named `execute_tool`; its full name
/// (`execute_tool {gen_ai.tool.name}`) and the call's ids are recorded once they are known to
/// be safe to keep (see [`record_call`]).
pub(crate) fn call_span(tenant: &str) -> Span {
    // Its kind is internal, every subscriber's default for a span that names none (an
    // `otel.kind` field would be one more field to visit on every call).
    // The fields recorded later (`annotate`) are declared, `Empty`, for a subscriber other
    // than the gateway's recorder, which records them field by field, finding each by name.
    tracing::debug_span!(
        target: "toolgate::call",
        "execute_tool",
        toolgate.outcome = Empty,
        toolgate.attempts = Empty,
        toolgate.replayed = Empty,
        toolgate.decision = Empty,
        toolgate.risk = Empty,
        toolgate.pending_invocation_id = Empty,
        "error.type" = Empty,
        otel.status_code = Empty,
        otel.name = Empty,
        gen_ai.tool.name = Empty,
        gen_ai.conversation.id = Empty,
        toolgate.tool_call_id = Empty,
        gen_ai.tool.call.id = Empty,
        toolgate.policy_ids = Empty,
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.type = "extension",
        toolgate.tenant = tenant,
    )
}

/// Records the ids of a parsed call on `span`. The tool name, and with it the span's name
/// (`execute_tool {name}`), is recorded only when it is a valid name the redactor leaves alone
/// (`name`, as parsing checked it; a name that fails may be a credential pasted in the wrong
/// place, and the span keeps the plain name `execute_tool`); run and tool_use ids have passed
/// the same check by then. A subscriber names the span from `otel.name` recorded after it was
/// created (as the gateway's recorder and `tracing-opentelemetry` do).
pub(crate) fn record_call(span: &Span, record: &ToolCallRecord, name: Option<&ToolName>) {
    const PREFIX: &str = "execute_tool ";
    // Nothing is formatted for a span nobody subscribes to (traces off).
    if span.is_disabled() {
        return;
    }
    // Built by hand: `format!` costs more than the two copies.
    let full_name = name.map(|name| {
        let mut full = String::with_capacity(PREFIX.len() + name.as_str().len());
        full.push_str(PREFIX);
        full.push_str(name.as_str());
        full
    });
    annotate(
        span,
        [
            ("otel.name", full_name.as_deref().map(Attribute::Text)),
            (
                "gen_ai.tool.name",
                name.map(|name| Attribute::Text(name.as_str())),
            ),
            (
                "gen_ai.conversation.id",
                Some(Attribute::Text(record.run.as_str())),
            ),
            (
                "toolgate.tool_call_id",
                Some(Attribute::Text(record.id.as_str())),
            ),
            (
                "gen_ai.tool.call.id",
                record
                    .tool_use_id
                    .as_ref()
                    .map(|id| Attribute::Text(id.as_str())),
            ),
        ],
    );
}

/// Records how a call ended: its status and attempts, and for anything but a success the
/// stable error code as `error.type` (or the request's failure kind).
pub(crate) fn record_outcome(span: &Span, outcome: &Result<ExecuteOutcome, EngineError>) {
    if span.is_disabled() {
        return;
    }
    match outcome {
        Ok(outcome) => {
            let (error_type, status_code) = match (&outcome.error, outcome.status) {
                (Some(error), _) => (Some(error.code.as_str()), Some("error")),
                (None, ToolCallStatus::Succeeded) => (None, Some("ok")),
                (None, _) => (None, None),
            };
            annotate(
                span,
                [
                    (
                        "toolgate.outcome",
                        Some(Attribute::Text(outcome.status.as_str())),
                    ),
                    (
                        "toolgate.attempts",
                        Some(Attribute::Int(outcome.attempts.into())),
                    ),
                    ("toolgate.replayed", Some(Attribute::Bool(outcome.replayed))),
                    (
                        "toolgate.decision",
                        outcome
                            .decision
                            .map(|decision| Attribute::Text(decision.as_str())),
                    ),
                    (
                        "toolgate.risk",
                        outcome.risk.map(|risk| Attribute::Text(risk.as_str())),
                    ),
                    (
                        "toolgate.pending_invocation_id",
                        outcome
                            .pending_invocation_id
                            .as_deref()
                            .map(Attribute::Text),
                    ),
                    ("error.type", error_type.map(Attribute::Text)),
                    ("otel.status_code", status_code.map(Attribute::Text)),
                ],
            );
        }
        Err(error) => {
            annotate(
                span,
                [
                    (
                        "error.type",
                        Some(Attribute::Text(request_error_type(error))),
                    ),
                    ("otel.status_code", Some(Attribute::Text("error"))),
                ],
            );
        }
    }
}

/// `error.type` for a request the engine could not serve: the same words its gRPC status
/// carries, low-cardinality.
fn request_error_type(error: &EngineError) -> &'static str {
    match error {
        EngineError::InvalidRequest(_) => "INVALID_ARGUMENT",
        EngineError::NotFound(_) => "NOT_FOUND",
        EngineError::Conflict(_) => "ALREADY_EXISTS",
        EngineError::FailedPrecondition(_) => "FAILED_PRECONDITION",
        EngineError::InvalidPolicy(_) => "INVALID_POLICY",
        EngineError::Unavailable(_) | EngineError::Ledger(_) => "UNAVAILABLE",
    }
}

/// Policy evaluation: a [`Leaf`] under the call's span, started before the evaluation and
/// dropped after it, whose attributes [`record_decision`] sets (the evaluation makes no spans
/// of its own).
pub(crate) fn policy_span() -> Option<Leaf> {
    Leaf::begin("policy.evaluate")
}

/// Records a decision on the policy span, and the deciding policies on the call's span around
/// it (the call's decision and risk come with its outcome, [`record_outcome`]).
pub(crate) fn record_decision(policy: Option<&mut Leaf>, call: &Span, decision: &PolicyDecision) {
    if policy.is_none() && call.is_disabled() {
        return;
    }
    let ids = decision.policy_ids.join(",");
    annotate(call, [("toolgate.policy_ids", Some(Attribute::Text(&ids)))]);
    if let Some(policy) = policy {
        policy.set(
            "toolgate.decision",
            LeafValue::Text(decision.decision.as_str()),
        );
        policy.set("toolgate.risk", LeafValue::Text(decision.risk.as_str()));
        policy.set("toolgate.policy_ids", LeafValue::Owned(ids));
        policy.set(
            "toolgate.policy_version",
            LeafValue::Int(decision.policy_version),
        );
    }
}

/// Records on `span` the attributes that are present, in one trip to the recorder
/// ([`toolgate_core::trace::annotate`]: no field looked up by name); an absent one records
/// nothing, as an absent `Option` does with `tracing`.
fn annotate<const N: usize>(span: &Span, attributes: [(&'static str, Option<Attribute<'_>>); N]) {
    let mut present = [("", Attribute::Bool(false)); N];
    let mut count = 0;
    for (key, value) in attributes {
        if let Some(value) = value {
            present[count] = (key, value);
            count += 1;
        }
    }
    toolgate_core::trace::annotate(span, &present[..count]);
}

/// Awaits `work` while `leaf` (a child of the current span, started by the caller) measures
/// it: what runs under a ledger commit or a credential lookup makes no spans of its own, so
/// its span is a [`Leaf`], recorded whole when it ends (when the work does, or is dropped)
/// rather than a `tracing` span made, kept and closed through the subscriber.
pub(crate) async fn timed<F: std::future::Future>(leaf: Option<Leaf>, work: F) -> F::Output {
    let output = work.await;
    drop(leaf);
    output
}

/// Runs `work` inside `span`, borrowed: entered on every poll, as `Instrument` does, without
/// the clone of the span an owned instrument would need while the caller also records on it
/// (a clone and its drop are each a trip through the subscriber's span table).
pub(crate) fn in_span<F: std::future::Future + Unpin>(span: &Span, work: F) -> InSpan<'_, F> {
    InSpan { span, work }
}

/// See [`in_span`].
pub(crate) struct InSpan<'a, F> {
    span: &'a Span,
    work: F,
}

impl<F: std::future::Future + Unpin> std::future::Future for InSpan<'_, F> {
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let this = &mut *self;
        let _entered = this.span.enter();
        std::pin::Pin::new(&mut this.work).poll(cx)
    }
}

/// One ledger commit of a call; `operation` names it (`requested`, `running`, `finish`, ...).
pub(crate) fn ledger_span(operation: &'static str) -> Option<Leaf> {
    Leaf::start(
        "ledger.commit",
        ("toolgate.ledger.operation", LeafValue::Text(operation)),
    )
}

/// Resolving the credentials a tool declared (names only).
pub(crate) fn credentials_span(count: usize) -> Option<Leaf> {
    Leaf::start(
        "credentials.resolve",
        (
            "toolgate.credentials",
            LeafValue::Int(i64::try_from(count).unwrap_or(i64::MAX)),
        ),
    )
}

/// The connector's invocation under the gateway's deadline; vendor HTTP attempts are its
/// children.
pub(crate) fn connector_span(tool: &ToolName, timeout_ms: u128) -> Span {
    tracing::debug_span!(
        target: "toolgate::call",
        "connector.invoke",
        gen_ai.tool.name = tool.as_str(),
        toolgate.timeout_ms = u64::try_from(timeout_ms).unwrap_or(u64::MAX),
    )
}

/// A human's decision on a pending invocation (approve, reject, continue). The invocation's
/// ids are recorded once it is found ([`record_pending`]), never the text the caller sent.
pub(crate) fn decision_span(action: &'static str, tenant: &str) -> Span {
    tracing::debug_span!(
        target: "toolgate::approval",
        "approval.decide",
        otel.name = format!("approval.{action}"),
        otel.status_code = Empty,
        toolgate.tenant = tenant,
        toolgate.approval.action = action,
        toolgate.pending_invocation_id = Empty,
        toolgate.tool_call_id = Empty,
        gen_ai.tool.name = Empty,
        gen_ai.conversation.id = Empty,
        toolgate.outcome = Empty,
        "error.type" = Empty,
    )
}

/// Records the pending invocation a decision found.
pub(crate) fn record_pending(span: &Span, pending: &PendingInvocation) {
    span.record("toolgate.pending_invocation_id", pending.id.as_str());
    span.record("toolgate.tool_call_id", pending.tool_call_id.as_str());
    span.record("gen_ai.tool.name", pending.tool.as_str());
    span.record("gen_ai.conversation.id", pending.run.as_str());
}

/// Records what a decision did.
pub(crate) fn record_resume(span: &Span, outcome: &Result<ResumeOutcome, EngineError>) {
    let ended = match outcome {
        Ok(ResumeOutcome::Executed(executed)) => executed.status.as_str(),
        Ok(ResumeOutcome::Rejected { expired: true, .. }) => "expired",
        Ok(ResumeOutcome::Rejected { .. }) => "rejected",
        Ok(ResumeOutcome::Continued { .. }) => "continued",
        Ok(ResumeOutcome::ClaimLost) => "already_decided",
        Ok(ResumeOutcome::PolicyDenialTerminal) => "policy_denial_terminal",
        Ok(ResumeOutcome::FeatureDisabled { .. }) => "feature_disabled",
        Err(error) => {
            span.record("error.type", request_error_type(error));
            span.record("otel.status_code", "error");
            return;
        }
    };
    span.record("toolgate.outcome", ended);
}

/// The W3C `traceparent` of the current span, when a trace recorder records it (`None` with
/// traces off). Kept with a pending invocation so the decision can link to the call.
pub(crate) fn current_traceparent() -> Option<String> {
    toolgate_core::trace::current().map(|context| context.traceparent())
}

/// Links the decision's `span` to the call's span `traceparent` names (nothing for `None` or a
/// value that does not parse).
pub(crate) fn link_to_call(span: &Span, traceparent: Option<&str>) {
    if let Some(call) = traceparent.and_then(|text| SpanContext::from_w3c(text, None)) {
        toolgate_core::trace::add_link(span, call);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_trace_recorder_there_is_no_traceparent_to_keep() {
        assert_eq!(current_traceparent(), None);
        // Linking without a recorder, or to a malformed value, does nothing and does not fail.
        let span = tracing::info_span!("decision");
        link_to_call(
            &span,
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        link_to_call(&span, Some("not a traceparent"));
        link_to_call(&span, None);
    }
}
