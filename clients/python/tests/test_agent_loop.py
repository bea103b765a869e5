"""The example agent loop (examples/agent_loop.py) against the real gateway: the scripted
model's tool_use blocks go through ExecuteTool and its later turns read the tool_results."""

import importlib.util
import os
import pathlib
import subprocess
import sys
import threading

import pytest

from toolgate_client import CallStatus, ToolgateClient

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "agent_loop.py"


def load_example():
    spec = importlib.util.spec_from_file_location("agent_loop", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tool_use_goes_through_execute_tool_and_back_as_tool_result(gateway, client):
    example = load_example()
    answered = {}
    conversation = example.run_agent(
        client,
        example.ScriptedModel(message="hello from the model"),
        "Echo a greeting, then move 250.",
        on_result=lambda tool_use_id, result: answered.setdefault(tool_use_id, result),
    )
    assert conversation[-1]["content"][0]["text"] == (
        "The gateway echoed 'hello from the model'; the transfer is done."
    )
    assert [m["role"] for m in conversation] == ["user", "assistant", "user", "assistant", "user", "assistant"]
    [echo_result] = conversation[2]["content"]
    assert echo_result["type"] == "tool_result" and echo_result["tool_use_id"] == "toolu_echo_1"
    assert echo_result["is_error"] is False
    assert sorted(answered) == ["toolu_echo_1", "toolu_transfer_1"]
    for tool_use_id, result in answered.items():
        recorded = client.get_tool_call(result.tool_call_id)
        assert recorded.tool_use_id == tool_use_id and recorded.status is CallStatus.SUCCEEDED
    transfer = client.get_tool_call(answered["toolu_transfer_1"].tool_call_id)
    assert transfer.tool_name == "testkit.transfer" and transfer.input_redacted["amount"] == 250
    assert gateway.executions("testkit.echo") == 1 and gateway.executions("testkit.transfer") == 1


def test_a_call_held_for_approval_is_awaited_then_handed_to_the_model(gateway, client, approvals):
    example = load_example()
    decided = []

    def approver():
        for _ in range(400):
            pending = approvals.list_pending(tool_name="testkit.transfer")
            if pending:
                decided.append(approvals.approve(pending[0], reason="checked"))
                return
            threading.Event().wait(0.05)

    thread = threading.Thread(target=approver, daemon=True)
    thread.start()
    answered = {}
    conversation = example.run_agent(
        client,
        example.ScriptedModel(amount=5000),
        "Move 5000.",
        approval_wait=30,
        on_result=lambda tool_use_id, result: answered.setdefault(tool_use_id, result),
    )
    thread.join(10)
    assert len(decided) == 1 and decided[0].outcome == "executed"
    transfer = answered["toolu_transfer_1"]
    assert transfer.ok and transfer.result == {"transferred": 5000, "status": "done"}
    assert transfer.tool_call_id == decided[0].tool_call_id
    assert conversation[-1]["content"][0]["text"].endswith("the transfer is done.")
    assert gateway.executions("testkit.transfer") == 1


def test_the_model_is_offered_the_runs_manifest_only(gateway):
    token = gateway.set_up_tenant("globex", tools=["testkit.echo"])
    example = load_example()
    with ToolgateClient(gateway.target, token, timeout=30) as client:
        with pytest.raises(RuntimeError, match="not offered testkit__transfer"):
            example.run_agent(client, example.ScriptedModel(), "Echo, then move 250.")
    assert gateway.executions("testkit.echo") == 1 and gateway.executions("testkit.transfer") == 0


def test_the_example_runs_as_a_script(gateway, agent_token):
    environment = {k: v for k, v in os.environ.items() if k != "TOOLGATE_AGENT_TOKEN"}
    ran = subprocess.run(
        [sys.executable, str(EXAMPLE), gateway.target],
        env={**environment, "TOOLGATE_AGENT_TOKEN": agent_token},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    lines = ran.stdout.splitlines()
    assert lines[0] == 'toolu_echo_1: succeeded {"message":"hello from the model"}'
    assert lines[1].startswith("toolu_transfer_1: succeeded ")
    assert lines[-1] == "The gateway echoed 'hello from the model'; the transfer is done."
    without_token = subprocess.run(
        [sys.executable, str(EXAMPLE), gateway.target], env=environment, capture_output=True, text=True, timeout=60
    )
    assert without_token.returncode == 2 and "TOOLGATE_AGENT_TOKEN is not set" in without_token.stderr
