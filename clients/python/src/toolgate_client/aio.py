"""The asyncio twins on `grpc.aio`: `AsyncToolgateClient` and `AsyncApprovalClient`.

Same methods, arguments and answers as the blocking clients, awaited. Create them inside the
event loop that uses them (a `grpc.aio` channel belongs to one loop).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Optional, Tuple, TypeVar, Union

import grpc
import grpc.aio

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
) -> grpc.aio.Channel:
    """An asyncio channel to `target`: plaintext, TLS from `tls`, or the given `credentials`."""
    if credentials is not None and tls not in (None, False):
        raise ValueError("give either tls or credentials, not both")
    endpoint = Endpoint.parse(target, None if credentials is not None else tls)
    if credentials is not None:
        return grpc.aio.secure_channel(endpoint.address, credentials, options=list(options))
    if endpoint.tls is None:
        return grpc.aio.insecure_channel(endpoint.address, options=list(options))
    return grpc.aio.secure_channel(
        endpoint.address, endpoint.tls.credentials(), options=[*endpoint.tls.options(), *options]
    )


class _AsyncClient:
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

    async def _call(self, method: Any, request: Any, timeout: Optional[float] = None) -> Any:
        try:
            return await method(request, metadata=metadata(self._token), timeout=timeout or self._timeout)
        except grpc.RpcError as error:
            raise ToolgateError.from_rpc(error) from error

    async def close(self) -> None:
        """Closes the channel (calls in flight are cancelled)."""
        await self.channel.close()

    async def __aenter__(self: T) -> T:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()


class AsyncToolgateClient(_AsyncClient):
    """The asyncio twin of `ToolgateClient` (same options, same answers, awaited)."""

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

    async def create_run(self, agent_id: str = "", *, run_id: str = "", max_calls: int = 0) -> Run:
        """Opens a run (see `ToolgateClient.create_run`)."""
        request = pb.CreateRunRequest(agent_id=agent_id, run_id=run_id, max_calls=max_calls)
        return Run.from_proto(await self._call(self._stub.CreateRun, request))

    async def get_run(self, run: RunRef) -> Run:
        """The run as it stands."""
        return Run.from_proto(await self._call(self._stub.GetRun, pb.GetRunRequest(run_id=req.run_id(run))))

    async def list_tools(self, run: RunRef) -> list[Tool]:
        """The tools the run may call."""
        answer = await self._call(self._stub.ListTools, pb.ListToolsRequest(run_id=req.run_id(run)))
        return [Tool.from_proto(tool) for tool in answer.tools]

    async def anthropic_tools(self, run: RunRef) -> list[dict[str, Any]]:
        """The run's tools as Anthropic Messages API `tools` entries."""
        return [tool.anthropic for tool in await self.list_tools(run)]

    async def openai_tools(self, run: RunRef) -> list[dict[str, Any]]:
        """The run's tools as OpenAI Chat Completions `tools` entries."""
        return [tool.openai for tool in await self.list_tools(run)]

    async def execute_tool(
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
        """Executes one call (see `ToolgateClient.execute_tool`)."""
        request = req.execute(run, tool, arguments, tool_use_id, correlation_id, timeout_ms)
        return ToolResult.from_proto(await self._call(self._stub.ExecuteTool, request, timeout))

    async def await_tool_call(self, tool_call_id: str, *, timeout_ms: int = 30_000) -> ToolResult:
        """Waits up to `timeout_ms` for the call to settle (see `ToolgateClient.await_tool_call`)."""
        request = req.await_call(tool_call_id, timeout_ms)
        deadline = None if self._timeout is None else self._timeout + timeout_ms / 1000
        return ToolResult.from_proto(await self._call(self._stub.AwaitToolCall, request, deadline))

    async def get_tool_call(self, tool_call_id: str) -> ToolCall:
        """One recorded call, redacted as the ledger keeps it."""
        request = pb.GetToolCallRequest(tool_call_id=tool_call_id)
        return ToolCall.from_proto(await self._call(self._stub.GetToolCall, request))

    async def list_tool_calls(self, run: RunRef, *, page_size: int = 100) -> AsyncIterator[ToolCall]:
        """The run's recorded calls, oldest first, fetched page by page."""
        page_token = ""
        while True:
            request = pb.ListToolCallsRequest(run_id=req.run_id(run), page_token=page_token, page_size=page_size)
            answer = await self._call(self._stub.ListToolCalls, request)
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
    ) -> AsyncRunWatch:
        """The run's events as they happen, resuming from the last cursor when the stream
        breaks (see `ToolgateClient.watch_run`); iterate with `async for`."""
        return AsyncRunWatch(
            self._stub,
            self._token,
            req.run_id(run),
            after_cursor,
            req.Backoff(reconnect_delay, max_reconnect_delay, max_reconnects),
        )


class AsyncRunWatch(AsyncIterator[RunEvent]):
    """An async iterator over a run's events that resumes from its `cursor` when the stream
    breaks."""

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
        self._closed = False

    def __aiter__(self) -> AsyncRunWatch:
        return self

    async def __anext__(self) -> RunEvent:
        while not self._closed:
            if self._call is None:
                request = pb.WatchRunRequest(run_id=self.run_id, after_cursor=self.cursor)
                self._call = self._stub.WatchRun(request, metadata=metadata(self._token))
            try:
                message = await self._call.read()
            except asyncio.CancelledError:
                # grpc.aio raises this for a call cancelled by `close()`; any other
                # cancellation is the caller's and goes on.
                if self._closed:
                    break
                raise
            except grpc.RpcError as error:
                if self._closed:
                    break
                if error.code() not in req.RETRYABLE_WATCH_CODES:
                    self.close()
                    raise ToolgateError.from_rpc(error) from error
                await self._broken(error)
                continue
            if message is grpc.aio.EOF:
                # The gateway ended the stream (a shutdown): resume elsewhere or later.
                await self._broken(None)
                continue
            self._backoff.reset()
            event = RunEvent.from_proto(message)
            self.cursor = event.cursor
            return event
        raise StopAsyncIteration

    async def _broken(self, error: Optional[grpc.RpcError]) -> None:
        self._call = None
        delay = self._backoff.next_delay()
        if delay is None:
            self.close()
            if error is None:
                raise ToolgateError(grpc.StatusCode.UNAVAILABLE, "the run's event stream kept ending")
            raise ToolgateError.from_rpc(error) from error
        self.reconnects += 1
        await asyncio.sleep(delay)

    def close(self) -> None:
        """Stops the watch; the iteration ends."""
        self._closed = True
        if self._call is not None:
            self._call.cancel()

    async def __aenter__(self) -> AsyncRunWatch:
        return self

    async def __aexit__(self, *_: object) -> None:
        self.close()


class AsyncApprovalClient(_AsyncClient):
    """The asyncio twin of `ApprovalClient`."""

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

    async def list_pending(
        self,
        *,
        run: Optional[RunRef] = None,
        tool_name: str = "",
        origin: str = "",
        page_size: int = 0,
    ) -> list[PendingApproval]:
        """The tenant's invocations awaiting a decision, oldest first."""
        request = pb.ListPendingRequest(
            run_id="" if run is None else req.run_id(run),
            tool_name=tool_name,
            origin=origin,
            page_size=page_size,
        )
        answer = await self._call(self._stub.ListPending, request)
        return [PendingApproval.from_proto(p) for p in answer.invocations]

    async def get_pending(self, invocation_id: str) -> PendingApproval:
        """One invocation, in whatever state."""
        request = pb.GetPendingRequest(invocation_id=invocation_id)
        return PendingApproval.from_proto(await self._call(self._stub.GetPending, request))

    async def resume(
        self,
        invocation: Union[PendingApproval, str],
        decision: Decision,
        *,
        run: Optional[RunRef] = None,
        reason: str = "",
    ) -> ResumeResult:
        """Decides on an invocation (a `PendingApproval`, or its id with `run`)."""
        request = req.resume(invocation, decision, run, reason)
        return ResumeResult.from_proto(await self._call(self._stub.Resume, request))

    async def approve(
        self, invocation: Union[PendingApproval, str], *, run: Optional[RunRef] = None, reason: str = ""
    ) -> ResumeResult:
        """Approves: the call executes once."""
        return await self.resume(invocation, Decision.APPROVE, run=run, reason=reason)

    async def reject(
        self, invocation: Union[PendingApproval, str], *, run: Optional[RunRef] = None, reason: str = ""
    ) -> ResumeResult:
        """Rejects: the call never runs."""
        return await self.resume(invocation, Decision.REJECT, run=run, reason=reason)

    async def continue_(
        self, invocation: Union[PendingApproval, str], *, run: Optional[RunRef] = None, reason: str = ""
    ) -> ResumeResult:
        """Resolves without executing; the run moves on."""
        return await self.resume(invocation, Decision.CONTINUE, run=run, reason=reason)
