"""An agent loop on toolgate: the model's `tool_use` blocks go through ExecuteTool and come
back to it as `tool_result` blocks (Anthropic Messages API shapes).

The model here is `ScriptedModel`, a stand-in that answers like the Messages API would
(`content` blocks and a `stop_reason`) from a fixed script, so the loop runs without any
network but the gateway's. To drive a real model, pass anything with the same `create`
method, e.g. a wrapper around `anthropic.Anthropic().messages.create`.

    TOOLGATE_AGENT_TOKEN=... python agent_loop.py 127.0.0.1:50051

A call held for a human approval is waited for (AwaitToolCall) up to `approval_wait`
seconds; meanwhile an approver decides with `toolgate approvals` or the ApprovalClient.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Callable, Optional, Protocol

from toolgate_client import ToolgateClient, ToolResult

Message = dict[str, Any]


class Model(Protocol):
    """What the loop needs from a model: the Messages API's `create`, answering a dict with
    `content` (a list of blocks) and `stop_reason`."""

    def create(self, *, messages: list[Message], tools: list[dict[str, Any]]) -> Message: ...


class ScriptedModel:
    """A stand-in for the LLM: asks the gateway to echo a message, then to make a transfer,
    then reports both results in its final answer. Like a real model it only calls tools it
    was offered, and its later turns read the tool results it was given."""

    def __init__(self, message: str = "hello from the model", amount: int = 250) -> None:
        self.message = message
        self.amount = amount
        self.turns = 0

    def create(self, *, messages: list[Message], tools: list[dict[str, Any]]) -> Message:
        offered = {tool["name"] for tool in tools}
        self.turns += 1
        if self.turns == 1:
            return self._use(offered, "toolu_echo_1", "testkit__echo", {"message": self.message})
        if self.turns == 2:
            echoed = _result_of(messages, "toolu_echo_1")
            arguments = {"amount": self.amount, "region": "us-east-1", "account": echoed["message"][:16]}
            return self._use(offered, "toolu_transfer_1", "testkit__transfer", arguments)
        echoed = _result_of(messages, "toolu_echo_1")
        transfer = _result_of(messages, "toolu_transfer_1")
        text = f"The gateway echoed {echoed['message']!r}; the transfer is {transfer.get('status', transfer)}."
        return {"role": "assistant", "content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}

    @staticmethod
    def _use(offered: set[str], block_id: str, name: str, arguments: dict[str, Any]) -> Message:
        if name not in offered:
            raise RuntimeError(f"the model was not offered {name}; it was offered {sorted(offered)}")
        block = {"type": "tool_use", "id": block_id, "name": name, "input": arguments}
        return {"role": "assistant", "content": [block], "stop_reason": "tool_use"}


def _result_of(messages: list[Message], tool_use_id: str) -> Any:
    """The parsed content of the `tool_result` block answering `tool_use_id`."""
    for message in messages:
        if message["role"] != "user" or isinstance(message["content"], str):
            continue
        for block in message["content"]:
            if block.get("type") == "tool_result" and block["tool_use_id"] == tool_use_id:
                return json.loads(block["content"])
    raise RuntimeError(f"no tool_result for {tool_use_id}")


def run_agent(
    client: ToolgateClient,
    model: Model,
    prompt: str,
    *,
    agent_id: str = "support",
    approval_wait: float = 60.0,
    on_result: Optional[Callable[[str, ToolResult], None]] = None,
    max_turns: int = 10,
) -> list[Message]:
    """Runs the loop until the model stops asking for tools; answers the conversation.

    Each `tool_use` block is executed with its id as the idempotency key (a retry of the
    loop never runs a call twice). A call waiting for approval is awaited; one still waiting
    after `approval_wait` seconds goes back to the model as such, so it can tell the user.
    """
    run = client.create_run(agent_id)
    tools = client.anthropic_tools(run)
    messages: list[Message] = [{"role": "user", "content": prompt}]
    for _ in range(max_turns):
        reply = model.create(messages=messages, tools=tools)
        messages.append({"role": "assistant", "content": reply["content"]})
        if reply["stop_reason"] != "tool_use":
            return messages
        results = []
        for block in reply["content"]:
            if block["type"] != "tool_use":
                continue
            result = client.execute_tool(run, block["name"], block["input"], tool_use_id=block["id"])
            deadline = time.monotonic() + approval_wait
            while result.waiting_approval and time.monotonic() < deadline:
                wait_ms = max(1, int((deadline - time.monotonic()) * 1000))
                result = client.await_tool_call(result.tool_call_id, timeout_ms=min(wait_ms, 30_000))
            if on_result is not None:
                on_result(block["id"], result)
            results.append(result.anthropic_tool_result(block["id"]))
        messages.append({"role": "user", "content": results})
    raise RuntimeError(f"the model still asked for tools after {max_turns} turns")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: agent_loop.py HOST:PORT (the agent token in TOOLGATE_AGENT_TOKEN)", file=sys.stderr)
        return 2
    token = os.environ.get("TOOLGATE_AGENT_TOKEN", "")
    if not token:
        print("agent_loop.py: TOOLGATE_AGENT_TOKEN is not set", file=sys.stderr)
        return 2
    with ToolgateClient(argv[1], token, timeout=30) as client:

        def show(tool_use_id: str, result: ToolResult) -> None:
            print(f"{tool_use_id}: {result.status.value} {result.content()}")

        conversation = run_agent(client, ScriptedModel(), "Echo a greeting, then move 250.", on_result=show)
    print(conversation[-1]["content"][0]["text"])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
