"""Request building shared by the blocking and the asyncio clients: arguments checked here,
before anything is sent."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Optional, Union

import grpc

from .types import Decision, PendingApproval, Run
from .v1 import toolgate_pb2 as pb

RunRef = Union[Run, str]
"""A run, or its id."""

# WatchRun reconnects after these; any other error ends the watch.
RETRYABLE_WATCH_CODES = (grpc.StatusCode.UNAVAILABLE,)


def run_id(run: RunRef) -> str:
    value = run.run_id if isinstance(run, Run) else run
    if not isinstance(value, str) or not value:
        raise ValueError("run: expected a Run or a non-empty run id")
    return value


def execute(
    run: RunRef,
    tool: str,
    arguments: Optional[Mapping[str, Any]],
    tool_use_id: str,
    correlation_id: str,
    timeout_ms: int,
) -> pb.ExecuteToolRequest:
    if not isinstance(tool, str) or not tool:
        raise ValueError("tool: expected a tool name (`family.action` or `family__action`)")
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, Mapping):
        raise TypeError(f"arguments: expected a JSON object (a mapping), got {type(arguments).__name__}")
    try:
        arguments_json = json.dumps(dict(arguments), allow_nan=False)
    except (TypeError, ValueError) as error:
        raise TypeError(f"arguments: not representable as JSON: {error}") from None
    return pb.ExecuteToolRequest(
        run_id=run_id(run),
        tool_use_id=tool_use_id,
        tool_name=tool,
        arguments_json=arguments_json,
        correlation_id=correlation_id,
        timeout_ms=_non_negative("timeout_ms", timeout_ms),
    )


def resume(
    invocation: Union[PendingApproval, str],
    decision: Decision,
    run: Optional[RunRef],
    reason: str,
) -> pb.ResumeRequest:
    if isinstance(invocation, PendingApproval):
        invocation_id = invocation.invocation_id
        owner = invocation.run_id
        if run is not None and run_id(run) != owner:
            raise ValueError(f"run: the invocation {invocation_id} belongs to run {owner}, not {run_id(run)}")
    else:
        invocation_id = invocation
        if run is None:
            raise ValueError("run: required with an invocation id (or pass the PendingApproval)")
        owner = run_id(run)
    if not invocation_id:
        raise ValueError("invocation: expected a PendingApproval or a non-empty invocation id")
    return pb.ResumeRequest(
        run_id=owner,
        invocation_id=invocation_id,
        decision=Decision(decision).to_proto(),
        reason=reason,
    )


def _non_negative(name: str, value: int) -> int:
    if not isinstance(value, int) or value < 0:
        raise ValueError(f"{name}: expected a non-negative integer, got {value!r}")
    return value


def await_call(tool_call_id: str, timeout_ms: int) -> pb.AwaitToolCallRequest:
    if not tool_call_id:
        raise ValueError("tool_call_id: expected a non-empty id")
    return pb.AwaitToolCallRequest(tool_call_id=tool_call_id, timeout_ms=_non_negative("timeout_ms", timeout_ms))


class Backoff:
    """Delays between reconnects: doubling from `initial` up to `maximum`, reset by progress."""

    def __init__(self, initial: float, maximum: float, attempts: Optional[int]) -> None:
        if initial < 0 or maximum < initial:
            raise ValueError("reconnect delays: expected 0 <= reconnect_delay <= max_reconnect_delay")
        if attempts is not None and attempts < 0:
            raise ValueError("max_reconnects: expected None or a non-negative count")
        self.initial = initial
        self.maximum = maximum
        self.attempts = attempts
        self.failures = 0

    def reset(self) -> None:
        self.failures = 0

    def next_delay(self) -> Optional[float]:
        """The delay before the next attempt; None once the attempts are used up."""
        if self.attempts is not None and self.failures >= self.attempts:
            return None
        delay: float = min(self.maximum, self.initial * 2.0 ** min(self.failures, 32))
        self.failures += 1
        return delay
