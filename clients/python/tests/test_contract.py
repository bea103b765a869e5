"""The gRPC contract from a non-Rust agent runtime, through the installed toolgate-client wheel
(its wrapper, and its generated stubs where the wrapper has no call: AdminService)."""

import json

import grpc
import pytest

from conftest import bearer
from toolgate_client import CallStatus, ErrorCode, ResumeOutcome, ToolgateClient, ToolgateError
from toolgate_client.v1 import toolgate_pb2 as pb
from toolgate_client.v1 import toolgate_pb2_grpc as rpc


def test_run_lists_tools_in_llm_shapes(client):
    run = client.create_run("support")
    assert sorted(run.manifest) == ["testkit.echo", "testkit.noop", "testkit.transfer"]
    tools = client.list_tools(run)
    echo = next(t for t in tools if t.name == "testkit.echo")
    assert echo.llm_name == "testkit__echo"
    assert echo.anthropic["name"] == "testkit__echo"
    assert echo.anthropic["input_schema"]["required"] == ["message"]
    assert echo.openai["type"] == "function"
    assert echo.openai["function"]["name"] == "testkit__echo"
    assert echo.openai["function"]["parameters"]["type"] == "object"
    assert client.anthropic_tools(run) == [t.anthropic for t in tools]
    assert client.openai_tools(run.run_id) == [t.openai for t in tools]
    assert all("." not in t["name"] for t in client.anthropic_tools(run))


def test_execute_tool_round_trip_with_llm_name(client):
    run = client.create_run("support")
    result = client.execute_tool(
        run,
        "testkit__echo",
        {"message": "from python", "api_token": "secret-value-1"},
        tool_use_id="toolu_01",
    )
    assert result.status is CallStatus.SUCCEEDED and result.ok
    assert result.result == {"message": "from python", "api_token": "secret-value-1"}
    assert result.error_code is None
    recorded = client.get_tool_call(result.tool_call_id)
    assert "secret-value-1" not in recorded.raw.input_redacted_json
    assert "secret-value-1" not in json.dumps(recorded.input_redacted)
    assert recorded.input_redacted["message"] == "from python"
    assert recorded.tool_use_id == "toolu_01"
    assert [c.tool_call_id for c in client.list_tool_calls(run)] == [result.tool_call_id]


def test_repeated_tool_use_id_is_replayed(client):
    run = client.create_run("support")
    first = client.execute_tool(run, "testkit.noop", {}, tool_use_id="toolu_same")
    again = client.execute_tool(run, "testkit.noop", {}, tool_use_id="toolu_same")
    assert first.tool_call_id == again.tool_call_id
    assert again.replayed and not first.replayed


def test_tool_failures_are_answers_not_errors(client):
    run = client.create_run("support")
    result = client.execute_tool(run, "testkit.echo", {"message": 3})
    assert result.status is CallStatus.FAILED
    assert result.error_code == "INVALID_ARGUMENTS"
    assert result.error_code is ErrorCode.INVALID_ARGUMENTS
    assert "/message" in result.error_message
    block = result.anthropic_tool_result("toolu_bad")
    assert block["is_error"] is True
    assert json.loads(block["content"])["error_code"] == "INVALID_ARGUMENTS"


def test_missing_token_is_unauthenticated(gateway):
    with pytest.raises(grpc.RpcError) as error:
        rpc.AgentServiceStub(gateway.channel).CreateRun(pb.CreateRunRequest(agent_id="support"))
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED
    with ToolgateClient(gateway.target, "tg_not-a-token") as wrong:
        with pytest.raises(ToolgateError) as refused:
            wrong.create_run("support")
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED


def test_policy_upload_is_validated(gateway, agent_token):
    auth = bearer(gateway.admin_token)
    bad = gateway.admin.ValidatePolicy(
        pb.ValidatePolicyRequest(text="permit(principal, action, resource) when { context.args.amout > 1 };"),
        metadata=auth,
    )
    assert not bad.valid and any("amout" in e for e in bad.errors)
    with pytest.raises(grpc.RpcError) as error:
        gateway.admin.PutPolicy(pb.PutPolicyRequest(tenant_id="acme", text="permit(principal"), metadata=auth)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    current = gateway.admin.GetPolicy(pb.GetPolicyRequest(tenant_id="acme"), metadata=auth)
    assert current.version == 0 and "permit" in current.text


def test_approval_outcome_reaches_a_watching_runtime(client, approvals):
    """A runtime suspends on an approval, watches its run, and sees the decision land:
    one approver continues without executing, a second decision loses the claim."""
    run = client.create_run("support")
    waiting = client.execute_tool(
        run,
        "testkit__transfer",
        {"amount": 5000, "region": "us-east-1", "account": "a"},
        tool_use_id="toolu_py_1",
    )
    assert waiting.status is CallStatus.WAITING_APPROVAL and waiting.waiting_approval
    assert not waiting.settled
    [invocation] = approvals.list_pending(run=run)
    assert invocation.invocation_id == waiting.pending_invocation_id
    assert invocation.state == "pending" and invocation.arguments["amount"] == 5000

    with client.watch_run(run) as events:
        continued = approvals.continue_(invocation, reason="not needed after all")
        assert continued.outcome is ResumeOutcome.CONTINUED
        late = approvals.approve(invocation)
        assert late.outcome is ResumeOutcome.CLAIM_LOST

        kinds = []
        for event in events:
            kinds.append(event.kind)
            if event.kind == "tool_call.continued":
                break
    assert "tool_call.approval_requested" in kinds and kinds[-1] == "tool_call.continued", kinds
    call = client.get_tool_call(continued.tool_call_id)
    assert call.status is CallStatus.BLOCKED and call.error_code is ErrorCode.SKIPPED
    assert approvals.get_pending(invocation.invocation_id).state == "continued"


def test_replay_and_await_give_the_full_answer_of_an_approved_call(client, approvals):
    """A runtime suspended on an approval collects the executed call's full result with
    AwaitToolCall, and a replay of the same tool_use_id answers with it too."""
    run = client.create_run("support")
    arguments = {"amount": 7000, "region": "us-east-1", "account": "b"}
    waiting = client.execute_tool(run, "testkit.transfer", arguments, tool_use_id="toolu_py_await")
    assert waiting.status is CallStatus.WAITING_APPROVAL
    replay = client.execute_tool(run, "testkit.transfer", arguments, tool_use_id="toolu_py_await")
    assert replay.replayed and replay.pending_invocation_id == waiting.pending_invocation_id
    assert replay.decision == "require_expert_approval"

    early = client.await_tool_call(waiting.tool_call_id, timeout_ms=50)
    assert early.status is CallStatus.WAITING_APPROVAL

    approved = approvals.approve(waiting.pending_invocation_id, run=run, reason="confirmed")
    assert approved.outcome is ResumeOutcome.EXECUTED
    assert approved.result is not None and approved.result.result == {"transferred": 7000, "status": "done"}
    done = client.await_tool_call(waiting.tool_call_id, timeout_ms=30_000)
    assert done.status is CallStatus.SUCCEEDED and done.settled
    assert done.result == {"transferred": 7000, "status": "done"}
    assert not done.redacted
    again = client.execute_tool(run, "testkit.transfer", arguments, tool_use_id="toolu_py_await")
    assert again.replayed and again.raw.result_json == done.raw.result_json


def test_a_refused_call_runs_when_repeated_after_the_fix(gateway, client):
    run = client.create_run("support")
    gateway.set_flag(False)
    try:
        refused = client.execute_tool(run, "testkit.noop", {}, tool_use_id="toolu_py_refused")
        assert refused.error_code is ErrorCode.FEATURE_DISABLED
    finally:
        gateway.set_flag(True)
    ran = client.execute_tool(run, "testkit.noop", {}, tool_use_id="toolu_py_refused")
    assert ran.status is CallStatus.SUCCEEDED and not ran.replayed
    assert ran.tool_call_id == refused.tool_call_id
