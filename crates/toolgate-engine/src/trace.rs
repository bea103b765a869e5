//! The spans of a call, named and attributed after OpenTelemetry's GenAI semantic conventions
//! (`execute_tool {gen_ai.tool.name}`, kind internal) plus `toolgate.*` attributes, and their
//! children: policy evaluation, ledger commits, credential resolution, the connector, and an
//! approval's decision.
//!
//! The call's span, the connector's and a decision's live through many polls of the work they
//! cover: they are [`Span`]s, which the application's recording subscriber (the gateway has one
//! when `OTEL_EXPORTER_OTLP_ENDPOINT` is set) makes itself and which are entered per poll by
//! setting a thread-local cell; without one they are plain `tracing` spans at debug level, for
//! text logs at debug. The work that makes no spans of its own (policy evaluation, ledger
//! commits, credential resolution) is a [`Leaf`]. The engine depends on no exporter: with
//! traces off and logs at info nothing subscribes to these and they cost what a disabled span
//! costs. A span carries names, ids and codes only, never an argument or a result value.

use tracing::field::Empty;

use toolgate_core::trace::{Attribute, Leaf, LeafValue, SpanContext};

pub(crate) use toolgate_core::trace::{Span, in_span};

use toolgate_core::{ToolCallStatus, ToolName};
use toolgate_ledger::{PendingInvocation, ToolCallRecord};
use toolgate_policy::PolicyDecision;

use crate::error::EngineError;
use crate::outcome::{ExecuteOutcome, ResumeOutcome};

toolgate_core::span_site!(
    CALL,
    "execute_tool",
    "toolgate::call",
    [
        "gen_ai.operation.name",
        "gen_ai.tool.type",
        "toolgate.tenant",
        "otel.name",
        "gen_ai.tool.name",
        "gen_ai.conversation.id",
        "toolgate.tool_call_id",
        "gen_ai.tool.call.id",
        "toolgate.policy_ids",
        "toolgate.outcome",
        "toolgate.attempts",
        "toolgate.replayed",
        "toolgate.decision",
        "toolgate.risk",
        "toolgate.pending_invocation_id",
        "error.type",
        "otel.status_code",
    ]
);
toolgate_core::span_site!(
    CONNECTOR,
    "connector.invoke",
    "toolgate::call",
    ["gen_ai.tool.name", "toolgate.timeout_ms"]
);
toolgate_core::span_site!(
    DECISION,
    "approval.decide",
    "toolgate::approval",
    [
        "otel.name",
        "toolgate.tenant",
        "toolgate.approval.action",
        "toolgate.pending_invocation_id",
        "toolgate.tool_call_id",
        "gen_ai.tool.name",
        "gen_ai.conversation.id",
        "toolgate.outcome",
        "error.type",
        "otel.status_code",
    ]
);

/// The span of one `ExecuteTool`, named `execute_tool`; its full name
/// (`execute_tool {gen_ai.tool.name}`) and the call's ids are recorded once they are known to
/// be safe to keep (see [`record_call`]).
pub(crate) fn call_span(tenant: &str) -> Span {
    // Its kind is internal, every subscriber's default for a span that names none.
    Span::open(
        &CALL,
        &[
            ("gen_ai.operation.name", Attribute::Text("execute_tool")),
            ("gen_ai.tool.type", Attribute::Text("extension")),
            ("toolgate.tenant", Attribute::Text(tenant)),
        ],
        // The fields recorded later (`annotate`) are declared, `Empty`, for a subscriber other
        // than the gateway's recorder, which records them field by field, finding each by name.
        || {
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
        },
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
/// ([`Span::annotate`]: no field looked up by name); an absent one records nothing, as an
/// absent `Option` does with `tracing`.
fn annotate<const N: usize>(span: &Span, attributes: [(&'static str, Option<Attribute<'_>>); N]) {
    let mut present = [("", Attribute::Bool(false)); N];
    let mut count = 0;
    for (key, value) in attributes {
        if let Some(value) = value {
            present[count] = (key, value);
            count += 1;
        }
    }
    span.annotate(&present[..count]);
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
    let timeout_ms = i64::try_from(timeout_ms).unwrap_or(i64::MAX);
    Span::open(
        &CONNECTOR,
        &[
            ("gen_ai.tool.name", Attribute::Text(tool.as_str())),
            ("toolgate.timeout_ms", Attribute::Int(timeout_ms)),
        ],
        || {
            tracing::debug_span!(
                target: "toolgate::call",
                "connector.invoke",
                gen_ai.tool.name = tool.as_str(),
                toolgate.timeout_ms = timeout_ms,
            )
        },
    )
}

/// A human's decision on a pending invocation (approve, reject, continue). The invocation's
/// ids are recorded once it is found ([`record_pending`]), never the text the caller sent.
pub(crate) fn decision_span(action: &'static str, tenant: &str) -> Span {
    let name = format!("approval.{action}");
    Span::open(
        &DECISION,
        &[
            ("otel.name", Attribute::Text(&name)),
            ("toolgate.tenant", Attribute::Text(tenant)),
            ("toolgate.approval.action", Attribute::Text(action)),
        ],
        || {
            tracing::debug_span!(
                target: "toolgate::approval",
                "approval.decide",
                otel.name = name,
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
        },
    )
}

/// Records the pending invocation a decision found.
pub(crate) fn record_pending(span: &Span, pending: &PendingInvocation) {
    span.annotate(&[
        (
            "toolgate.pending_invocation_id",
            Attribute::Text(pending.id.as_str()),
        ),
        (
            "toolgate.tool_call_id",
            Attribute::Text(pending.tool_call_id.as_str()),
        ),
        ("gen_ai.tool.name", Attribute::Text(pending.tool.as_str())),
        (
            "gen_ai.conversation.id",
            Attribute::Text(pending.run.as_str()),
        ),
    ]);
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
            span.annotate(&[
                ("error.type", Attribute::Text(request_error_type(error))),
                ("otel.status_code", Attribute::Text("error")),
            ]);
            return;
        }
    };
    span.annotate(&[("toolgate.outcome", Attribute::Text(ended))]);
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
        span.add_link(call);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_trace_recorder_there_is_no_traceparent_to_keep() {
        assert_eq!(current_traceparent(), None);
        // Linking without a recorder, or to a malformed value, does nothing and does not fail.
        let span = Span::Tracing(tracing::info_span!("decision"));
        link_to_call(
            &span,
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
        );
        link_to_call(&span, Some("not a traceparent"));
        link_to_call(&span, None);
    }
}
