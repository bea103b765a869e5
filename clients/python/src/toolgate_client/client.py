"""The blocking clients: `ToolgateClient` for agent runtimes, `ApprovalClient` for approvers."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Optional, Tuple, TypeVar, Union

import grpc

from . import _requests as req
from ._requests import RunRef
from .connection import Endpoint, TlsConfig, Token, ToolgateError, check_token, metadata
from .types import (
    Decision,
    PendingApproval,
    ResumeResult,
    Run,
    RunEvent,
    Tool,
    ToolCall,
    ToolResult,
)
from .v1 import toolgate_pb2 as pb
from .v1 import toolgate_pb2_grpc as rpc

T = TypeVar("T")


def open_channel(
    target: str,
    tls: Union[TlsConfig, bool, None],
    credentials: Optional[grpc.ChannelCredentials],
    options: Sequence[Tuple[str, Any]],
) -> grpc.Channel:
    """A channel to `target`: plaintext, TLS from `tls`, or the given `credentials`."""
    if credentials is not None and tls not in (None, False):
        raise ValueError("give either tls or credentials, not both")
    endpoint = Endpoint.parse(target, None if credentials is not None else tls)
    if credentials is not None:
        return grpc.secure_channel(endpoint.address, credentials, options=list(options))
    if endpoint.tls is None:
        return grpc.insecure_channel(endpoint.address, options=list(options))
    return grpc.secure_channel(
        endpoint.address, endpoint.tls.credentials(), options=[*endpoint.tls.options(), *options]
    )


class _Client:
    def __init__(
        self,
        target: str,
        token: Token,
        *,
        tls: Union[TlsConfig, bool, None] = None,
        credentials: Optional[grpc.ChannelCredentials] = None,
        options: Sequence[Tuple[str, Any]] = (),
        timeout: Optional[float] = None,
    ) -> None:
        if not callable(token):
            check_token(token)
        self._token = token
        self._timeout = timeout
        self.channel = open_channel(target, tls, credentials, options)

    def _call(self, method: Any, request: Any, timeout: Optional[float] = None) -> Any:
        try:
            return method(request, metadata=metadata(self._token), timeout=timeout or self._timeout)
        except grpc.RpcError as error:
            raise ToolgateError.from_rpc(error) from error

    def close(self) -> None:
        """Closes the channel (calls in flight are cancelled)."""
        self.channel.close()

    def __enter__(self: T) -> T:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class ToolgateClient(_Client):
    """A blocking client of the gateway's AgentService, for an agent token.

    `target` is `host:port`, `http://host:port` or `https://host:port`. `token` is the
    agent's bearer token (or a function answering it at each call). `tls` turns TLS on:
    `True` for the system's roots, or a `TlsConfig` with a CA file and, for mTLS, a client
    certificate and key; `credentials` takes ready `grpc.ChannelCredentials` instead.
    `timeout` is the default deadline of each unary call, in seconds.

    Refusals and tool failures come back as `ToolResult`s; only requests the gateway could
    not serve raise `ToolgateError`.
    """

    def __init__(
        self,
        target: str,
        token: Token,
        *,
        tls: Union[TlsConfig, bool, None] = None,
        credentials: Optional[grpc.ChannelCredentials] = None,
        options: Sequence[Tuple[str, Any]] = (),
        timeout: Optional[float] = None,
    ) -> None:
        super().__init__(target, token, tls=tls, credentials=credentials, options=options, timeout=timeout)
        self._stub = rpc.AgentServiceStub(self.channel)

    def create_run(self, agent_id: str = "", *, run_id: str = "", max_calls: int = 0) -> Run:
        """Opens a run for `agent_id` (empty: the agent a bound token names). `run_id` is
        generated when empty; `max_calls` 0 takes the gateway's default budget."""
        request = pb.CreateRunRequest(agent_id=agent_id, run_id=run_id, max_calls=max_calls)
        return Run.from_proto(self._call(self._stub.CreateRun, request))

    def get_run(self, run: RunRef) -> Run:
        """The run as it stands (calls used, pending approvals, ...)."""
        return Run.from_proto(self._call(self._stub.GetRun, pb.GetRunRequest(run_id=req.run_id(run))))

    def list_tools(self, run: RunRef) -> list[Tool]:
        """The tools the run may call."""
        answer = self._call(self._stub.ListTools, pb.ListToolsRequest(run_id=req.run_id(run)))
        return [Tool.from_proto(tool) for tool in answer.tools]

    def anthropic_tools(self, run: RunRef) -> list[dict[str, Any]]:
        """The run's tools as Anthropic Messages API `tools` entries (names `family__action`)."""
        return [tool.anthropic for tool in self.list_tools(run)]

    def openai_tools(self, run: RunRef) -> list[dict[str, Any]]:
        """The run's tools as OpenAI Chat Completions `tools` entries (names `family__action`)."""
        return [tool.openai for tool in self.list_tools(run)]

    def execute_tool(
        self,
        run: RunRef,
        tool: str,
        arguments: Optional[Mapping[str, Any]] = None,
        *,
        tool_use_id: str = "",
        correlation_id: str = "",
        timeout_ms: int = 0,
        timeout: Optional[float] = None,
    ) -> ToolResult:
        """Executes one call through the gateway's pipeline and answers how it ended.

        `tool` is `family.action` or the LLM form `family__action`; `arguments` a JSON
        object. Pass the LLM's tool-use id as `tool_use_id`: a repeat with the same id never
        executes twice (it answers the original result, `replayed` set). `timeout_ms` is the
        tool's timeout (0: its default); `timeout` this request's deadline in seconds.
        """
        request = req.execute(run, tool, arguments, tool_use_id, correlation_id, timeout_ms)
        return ToolResult.from_proto(self._call(self._stub.ExecuteTool, request, timeout))

    def await_tool_call(self, tool_call_id: str, *, timeout_ms: int = 30_000) -> ToolResult:
        """Waits up to `timeout_ms` for the call to settle and answers its outcome (the full
        result of a call an approver let run). When the wait ends first the answer is the
        call as it stands (`waiting_approval` or `running`): ask again."""
        request = req.await_call(tool_call_id, timeout_ms)
        deadline = None if self._timeout is None else self._timeout + timeout_ms / 1000
        return ToolResult.from_proto(self._call(self._stub.AwaitToolCall, request, deadline))

    def get_tool_call(self, tool_call_id: str) -> ToolCall:
        """One recorded call, redacted as the ledger keeps it."""
        request = pb.GetToolCallRequest(tool_call_id=tool_call_id)
        return ToolCall.from_proto(self._call(self._stub.GetToolCall, request))

    def list_tool_calls(self, run: RunRef, *, page_size: int = 100) -> Iterator[ToolCall]:
        """The run's recorded calls, oldest first, fetched page by page."""
        page_token = ""
        while True:
            request = pb.ListToolCallsRequest(run_id=req.run_id(run), page_token=page_token, page_size=page_size)
            answer = self._call(self._stub.ListToolCalls, request)
            for call in answer.tool_calls:
                yield ToolCall.from_proto(call)
            if not answer.next_page_token:
                return
            page_token = answer.next_page_token

    def watch_run(
        self,
        run: RunRef,
        *,
        after_cursor: int = 0,
        reconnect_delay: float = 0.2,
        max_reconnect_delay: float = 5.0,
        max_reconnects: Optional[int] = None,
    ) -> RunWatch:
        """The run's audit events as they happen, after `after_cursor`.

        When the stream breaks (the gateway restarts or shuts down, the connection drops) the
        watch reconnects with the last cursor it delivered, so no event is missed or repeated;
        it waits `reconnect_delay` seconds, doubling up to `max_reconnect_delay`, and gives up
        after `max_reconnects` failed attempts in a row (None: never), raising the last error.
        Other errors (a wrong token, an unknown run) end it at once. Stop with `close()` or
        by leaving the loop.
        """
        return RunWatch(
            self._stub,
            self._token,
            req.run_id(run),
            after_cursor,
            req.Backoff(reconnect_delay, max_reconnect_delay, max_reconnects),
        )


class RunWatch(Iterator[RunEvent]):
    """An iterator over a run's events that resumes from its `cursor` when the stream breaks."""

    def __init__(
        self,
        stub: rpc.AgentServiceStub,
        token: Token,
        run_id: str,
        after_cursor: int,
        backoff: req.Backoff,
    ) -> None:
        self.run_id = run_id
        self.cursor = after_cursor
        """The cursor of the last event delivered: where the watch resumes."""
        self.reconnects = 0
        """How many times the stream was opened again after breaking."""
        self._stub = stub
        self._token = token
        self._backoff = backoff
        self._call: Any = None
        self._closed = threading.Event()
        self._lock = threading.Lock()

    def __iter__(self) -> RunWatch:
        return self

    def __next__(self) -> RunEvent:
        while not self._closed.is_set():
            if self._call is None and not self._open():
                break
            try:
                message = next(self._call)
            except StopIteration:
                # The gateway ended the stream (a shutdown): resume elsewhere or later.
                self._broken(None)
                continue
            except grpc.RpcError as error:
                if self._closed.is_set():
                    break
                if error.code() not in req.RETRYABLE_WATCH_CODES:
                    self.close()
                    raise ToolgateError.from_rpc(error) from error
                self._broken(error)
                continue
            self._backoff.reset()
            event = RunEvent.from_proto(message)
            self.cursor = event.cursor
            return event
        raise StopIteration

    def _open(self) -> bool:
        with self._lock:
            if self._closed.is_set():
                return False
            request = pb.WatchRunRequest(run_id=self.run_id, after_cursor=self.cursor)
            self._call = self._stub.WatchRun(request, metadata=metadata(self._token))
            return True

    def _broken(self, error: Optional[grpc.RpcError]) -> None:
        self._call = None
        delay = self._backoff.next_delay()
        if delay is None:
            self.close()
            if error is None:
                raise ToolgateError(grpc.StatusCode.UNAVAILABLE, "the run's event stream kept ending")
            raise ToolgateError.from_rpc(error) from error
        self.reconnects += 1
        self._closed.wait(delay)

    def close(self) -> None:
        """Stops the watch (from any thread); the iteration ends."""
        self._closed.set()
        with self._lock:
            if self._call is not None:
                self._call.cancel()

    def __enter__(self) -> RunWatch:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


class ApprovalClient(_Client):
    """A blocking client of the ApprovalService, for an approver token (options as for
    `ToolgateClient`). A decision claims the invocation atomically: of concurrent decisions
    exactly one takes effect, the others answer `claim_lost`."""

    def __init__(
        self,
        target: str,
        token: Token,
        *,
        tls: Union[TlsConfig, bool, None] = None,
        credentials: Optional[grpc.ChannelCredentials] = None,
        options: Sequence[Tuple[str, Any]] = (),
        timeout: Optional[float] = None,
    ) -> None:
        super().__init__(target, token, tls=tls, credentials=credentials, options=options, timeout=timeout)
        self._stub = rpc.ApprovalServiceStub(self.channel)

    def list_pending(
        self,
        *,
        run: Optional[RunRef] = None,
        tool_name: str = "",
        origin: str = "",
        page_size: int = 0,
    ) -> list[PendingApproval]:
        """The tenant's invocations awaiting a decision, oldest first, optionally of one run,
        one tool or one origin (APPROVAL_REQUIRED, POLICY_DENIED, EXECUTION_FAILED)."""
        request = pb.ListPendingRequest(
            run_id="" if run is None else req.run_id(run),
            tool_name=tool_name,
            origin=origin,
            page_size=page_size,
        )
        answer = self._call(self._stub.ListPending, request)
        return [PendingApproval.from_proto(p) for p in answer.invocations]

    def get_pending(self, invocation_id: str) -> PendingApproval:
        """One invocation, in whatever state (its `version` and `state` as they are now)."""
        request = pb.GetPendingRequest(invocation_id=invocation_id)
        return PendingApproval.from_proto(self._call(self._stub.GetPending, request))

    def resume(
        self,
        invocation: Union[PendingApproval, str],
        decision: Decision,
        *,
        run: Optional[RunRef] = None,
        reason: str = "",
    ) -> ResumeResult:
        """Decides on an invocation (a `PendingApproval`, or its id with `run`)."""
        request = req.resume(invocation, decision, run, reason)
        return ResumeResult.from_proto(self._call(self._stub.Resume, request))

    def approve(
        self, invocation: Union[PendingApproval, str], *, run: Optional[RunRef] = None, reason: str = ""
    ) -> ResumeResult:
        """Approves: the call executes once; `result` says how it ended."""
        return self.resume(invocation, Decision.APPROVE, run=run, reason=reason)

    def reject(
        self, invocation: Union[PendingApproval, str], *, run: Optional[RunRef] = None, reason: str = ""
    ) -> ResumeResult:
        """Rejects: the call never runs."""
        return self.resume(invocation, Decision.REJECT, run=run, reason=reason)

    def continue_(
        self, invocation: Union[PendingApproval, str], *, run: Optional[RunRef] = None, reason: str = ""
    ) -> ResumeResult:
        """Resolves without executing (the call ends blocked with SKIPPED); the run moves on."""
        return self.resume(invocation, Decision.CONTINUE, run=run, reason=reason)

