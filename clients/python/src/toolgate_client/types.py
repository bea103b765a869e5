"""The wrapper's values: plain dataclasses and string enums converted from the wire messages.

JSON text fields of the contract (`arguments_json`, `result_json`, `payload_json`, ...) arrive
here parsed, as Python values; each value keeps the message it came from as `raw`.
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field
from typing import Any, Optional, cast

from .v1 import toolgate_pb2 as pb


class _OpenStrEnum(str, enum.Enum):
    """A string enum that keeps values this client does not know (from a newer gateway)
    readable instead of failing: they become members named after their value."""

    @classmethod
    def _missing_(cls, value: object) -> Optional[_OpenStrEnum]:
        if not isinstance(value, str) or not value:
            return None
        member = str.__new__(cls, value)
        member._name_ = value
        member._value_ = value
        return member

    def __str__(self) -> str:
        return str(self.value)


class ErrorCode(_OpenStrEnum):
    """The gateway's stable error codes; each value is the code's string on the wire."""

    FEATURE_DISABLED = "FEATURE_DISABLED"
    NOT_IN_MANIFEST = "NOT_IN_MANIFEST"
    UNKNOWN_TOOL = "UNKNOWN_TOOL"
    INVALID_ARGUMENTS = "INVALID_ARGUMENTS"
    POLICY_BLOCKED = "POLICY_BLOCKED"
    EXPERT_REJECTED = "EXPERT_REJECTED"
    CLIENT_REJECTED = "CLIENT_REJECTED"
    CREDENTIALS_NOT_FOUND = "CREDENTIALS_NOT_FOUND"
    CREDENTIALS_UNAVAILABLE = "CREDENTIALS_UNAVAILABLE"
    VENDOR_ERROR = "VENDOR_ERROR"
    VENDOR_RATE_LIMITED = "VENDOR_RATE_LIMITED"
    TIMEOUT = "TIMEOUT"
    OUTCOME_UNKNOWN = "OUTCOME_UNKNOWN"
    BUDGET_EXCEEDED = "BUDGET_EXCEEDED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    INTERNAL = "INTERNAL"
    SKIPPED = "SKIPPED"


class CallStatus(_OpenStrEnum):
    """Where a tool call stands (`ToolCallStatus` in lower case, without its prefix)."""

    UNSPECIFIED = "unspecified"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    BLOCKED = "blocked"
    WAITING_APPROVAL = "waiting_approval"
    APPROVED = "approved"
    TIMED_OUT = "timed_out"
    OUTCOME_UNKNOWN = "outcome_unknown"

    @classmethod
    def from_proto(cls, value: int) -> CallStatus:
        try:
            name = pb.ToolCallStatus.Name(value)
        except ValueError:
            return cls(f"status_{value}")
        return cls(name.removeprefix("TOOL_CALL_STATUS_").lower())


class Decision(_OpenStrEnum):
    """An approver's decision on a pending invocation."""

    APPROVE = "approve"
    REJECT = "reject"
    # Resolve without executing: the call ends blocked with SKIPPED and the run moves on.
    CONTINUE = "continue"

    def to_proto(self) -> pb.ResumeDecision:
        return cast(pb.ResumeDecision, pb.ResumeDecision.Value(f"RESUME_DECISION_{self.value.upper()}"))


class ResumeOutcome(_OpenStrEnum):
    """What a decision led to (`ResumeOutcome` in lower case, without its prefix)."""

    EXECUTED = "executed"
    REJECTED = "rejected"
    CLAIM_LOST = "claim_lost"
    POLICY_DENIAL_TERMINAL = "policy_denial_terminal"
    CONTINUED = "continued"
    FEATURE_DISABLED = "feature_disabled"

    @classmethod
    def from_proto(cls, value: int) -> ResumeOutcome:
        try:
            name = pb.ResumeOutcome.Name(value)
        except ValueError:
            return cls(f"outcome_{value}")
        return cls(name.removeprefix("RESUME_OUTCOME_").lower())


_UNSETTLED = (CallStatus.RUNNING, CallStatus.WAITING_APPROVAL, CallStatus.APPROVED)


def _json_or_none(text: str) -> Any:
    return json.loads(text) if text else None


@dataclass(frozen=True)
class Run:
    """A run: one agent's session, with the manifest of tools it may call."""

    run_id: str
    tenant_id: str
    agent_id: str
    manifest: list[str]
    status: str
    calls_used: int
    max_calls: int
    pending_approvals: int
    created_at_ms: int
    raw: pb.Run = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, message: pb.Run) -> Run:
        return cls(
            run_id=message.run_id,
            tenant_id=message.tenant_id,
            agent_id=message.agent_id,
            manifest=list(message.manifest),
            status=message.status,
            calls_used=message.calls_used,
            max_calls=message.max_calls,
            pending_approvals=message.pending_approvals,
            created_at_ms=message.created_at_ms,
            raw=message,
        )


@dataclass(frozen=True)
class Tool:
    """A tool a run may call, with its definitions in the shapes LLM APIs accept.

    `name` is `family.action`; `llm_name` is `family__action` (LLM tool-use APIs forbid
    dots). ExecuteTool accepts either.
    """

    name: str
    llm_name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: Optional[dict[str, Any]]
    tags: list[str]
    risk_level: str
    idempotent: bool
    default_timeout_ms: int
    anthropic: dict[str, Any]
    openai: dict[str, Any]
    raw: pb.ToolDefinition = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, message: pb.ToolDefinition) -> Tool:
        return cls(
            name=message.name,
            llm_name=message.llm_name,
            description=message.description,
            input_schema=json.loads(message.input_schema_json),
            output_schema=_json_or_none(message.output_schema_json),
            tags=list(message.tags),
            risk_level=message.risk_level,
            idempotent=message.idempotent,
            default_timeout_ms=message.default_timeout_ms,
            anthropic=json.loads(message.anthropic_json),
            openai=json.loads(message.openai_json),
            raw=message,
        )


@dataclass(frozen=True)
class ToolResult:
    """The answer to one tool call (ExecuteTool, AwaitToolCall, an executed approval).

    A tool failure or a refusal is a result, not an exception: `status` says how the call
    ended and `error_code` why. A call held for a human is `waiting_approval` with its
    `pending_invocation_id`; collect its outcome later with `await_tool_call`.
    """

    tool_call_id: str
    status: CallStatus
    result: Any
    """The tool's full (unredacted) result, parsed; None unless the call succeeded."""
    error_code: Optional[ErrorCode]
    error_message: str
    duration_ms: int
    attempts: int
    decision: str
    risk_level: str
    pending_invocation_id: str
    replayed: bool
    redacted: bool
    raw: pb.ToolCallResult = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, message: pb.ToolCallResult) -> ToolResult:
        return cls(
            tool_call_id=message.tool_call_id,
            status=CallStatus.from_proto(message.status),
            result=_json_or_none(message.result_json),
            error_code=ErrorCode(message.error_code) if message.error_code else None,
            error_message=message.error_message,
            duration_ms=message.duration_ms,
            attempts=message.attempts,
            decision=message.decision,
            risk_level=message.risk_level,
            pending_invocation_id=message.pending_invocation_id,
            replayed=message.replayed,
            redacted=message.redacted,
            raw=message,
        )

    @property
    def ok(self) -> bool:
        """Whether the call succeeded."""
        return self.status is CallStatus.SUCCEEDED

    @property
    def waiting_approval(self) -> bool:
        """Whether the call awaits a human decision."""
        return self.status is CallStatus.WAITING_APPROVAL

    @property
    def settled(self) -> bool:
        """Whether the call's outcome is final (neither running nor awaiting a decision)."""
        return self.status not in _UNSETTLED

    def content(self) -> str:
        """The text to hand back to the LLM: the result's JSON on success; otherwise a JSON
        object with the status, the error code and message (sanitized by the gateway) and,
        for a call awaiting approval, the pending invocation's id."""
        if self.ok:
            return self.raw.result_json
        answer: dict[str, Any] = {"status": self.status.value}
        if self.error_code is not None:
            answer["error_code"] = self.error_code.value
        if self.error_message:
            answer["error_message"] = self.error_message
        if self.waiting_approval:
            answer["pending_invocation_id"] = self.pending_invocation_id
            answer["message"] = "the call is waiting for a human approval; it has not run yet"
        return json.dumps(answer)

    def anthropic_tool_result(self, tool_use_id: str) -> dict[str, Any]:
        """A `tool_result` content block for Anthropic's Messages API."""
        return {
            "type": "tool_result",
            "tool_use_id": tool_use_id,
            "content": self.content(),
            "is_error": not self.ok and not self.waiting_approval,
        }

    def openai_tool_message(self, tool_call_id: str) -> dict[str, Any]:
        """A `tool` role message for OpenAI's Chat Completions API."""
        return {"role": "tool", "tool_call_id": tool_call_id, "content": self.content()}


@dataclass(frozen=True)
class ToolCall:
    """A recorded call as the ledger keeps it: inputs and outputs redacted."""

    tool_call_id: str
    run_id: str
    agent_id: str
    tool_name: str
    tool_use_id: str
    correlation_id: str
    status: CallStatus
    input_redacted: Any
    output_redacted: Any
    error_code: Optional[ErrorCode]
    error_message: str
    risk_level: str
    policy_decision_id: str
    duration_ms: int
    attempts: int
    created_at_ms: int
    updated_at_ms: int
    raw: pb.ToolCall = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, message: pb.ToolCall) -> ToolCall:
        return cls(
            tool_call_id=message.tool_call_id,
            run_id=message.run_id,
            agent_id=message.agent_id,
            tool_name=message.tool_name,
            tool_use_id=message.tool_use_id,
            correlation_id=message.correlation_id,
            status=CallStatus.from_proto(message.status),
            input_redacted=_json_or_none(message.input_redacted_json),
            output_redacted=_json_or_none(message.output_redacted_json),
            error_code=ErrorCode(message.error_code) if message.error_code else None,
            error_message=message.error_message,
            risk_level=message.risk_level,
            policy_decision_id=message.policy_decision_id,
            duration_ms=message.duration_ms,
            attempts=message.attempts,
            created_at_ms=message.created_at_ms,
            updated_at_ms=message.updated_at_ms,
            raw=message,
        )


@dataclass(frozen=True)
class RunEvent:
    """One audit event of a run; `cursor` is its position to resume after."""

    cursor: int
    kind: str
    tool_call_id: str
    payload: Any
    at_ms: int
    raw: pb.RunEvent = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, message: pb.RunEvent) -> RunEvent:
        return cls(
            cursor=message.cursor,
            kind=message.kind,
            tool_call_id=message.tool_call_id,
            payload=_json_or_none(message.payload_json),
            at_ms=message.at_ms,
            raw=message,
        )


@dataclass(frozen=True)
class PendingApproval:
    """An invocation awaiting (or past) a human decision.

    `version` changes whenever the invocation does; `state` is pending, approved, rejected or
    continued, and `tool_call_status` where the suspended call stands now.
    """

    invocation_id: str
    run_id: str
    tool_call_id: str
    tool_name: str
    arguments: Any
    """The arguments to be executed, secrets redacted."""
    args_hash: str
    origin: str
    decision: str
    state: str
    version: int
    policy_version: int
    expires_at_ms: int
    created_at_ms: int
    tool_call_status: str
    timeout_ms: int
    raw: pb.PendingInvocation = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, message: pb.PendingInvocation) -> PendingApproval:
        return cls(
            invocation_id=message.invocation_id,
            run_id=message.run_id,
            tool_call_id=message.tool_call_id,
            tool_name=message.tool_name,
            arguments=_json_or_none(message.arguments_json),
            args_hash=message.args_hash,
            origin=message.origin,
            decision=message.decision,
            state=message.state,
            version=message.version,
            policy_version=message.policy_version,
            expires_at_ms=message.expires_at_ms,
            created_at_ms=message.created_at_ms,
            tool_call_status=message.tool_call_status,
            timeout_ms=message.timeout_ms,
            raw=message,
        )


@dataclass(frozen=True)
class ResumeResult:
    """What a decision led to; `result` is set when the call executed (or when an approval
    was refused with FEATURE_DISABLED)."""

    outcome: ResumeOutcome
    result: Optional[ToolResult]
    tool_call_id: str
    expired: bool
    raw: pb.ResumeResponse = field(repr=False, compare=False)

    @classmethod
    def from_proto(cls, message: pb.ResumeResponse) -> ResumeResult:
        return cls(
            outcome=ResumeOutcome.from_proto(message.outcome),
            result=ToolResult.from_proto(message.result) if message.HasField("result") else None,
            tool_call_id=message.tool_call_id,
            expired=message.expired,
            raw=message,
        )
