"""The gRPC contract from a non-Rust agent runtime: stubs generated from proto/ by grpcio-tools."""

import json

import grpc
import pytest

from conftest import bearer
from toolgate.v1 import toolgate_pb2 as pb
from toolgate.v1 import toolgate_pb2_grpc as rpc


def open_run(gateway, token):
    return gateway.agent.CreateRun(pb.CreateRunRequest(agent_id="support"), metadata=bearer(token))


def test_run_lists_tools_in_llm_shapes(gateway, agent_token):
    run = open_run(gateway, agent_token)
    assert sorted(run.manifest) == ["testkit.echo", "testkit.noop", "testkit.transfer"]
    tools = gateway.agent.ListTools(pb.ListToolsRequest(run_id=run.run_id), metadata=bearer(agent_token)).tools
    echo = next(t for t in tools if t.name == "testkit.echo")
    anthropic = json.loads(echo.anthropic_json)
    assert anthropic["name"] == "testkit__echo"
    assert anthropic["input_schema"]["required"] == ["message"]
    openai = json.loads(echo.openai_json)
    assert openai["type"] == "function"
    assert openai["function"]["parameters"]["type"] == "object"


def test_execute_tool_round_trip_with_llm_name(gateway, agent_token):
    run = open_run(gateway, agent_token)
    result = gateway.agent.ExecuteTool(
        pb.ExecuteToolRequest(
            run_id=run.run_id,
            tool_use_id="toolu_01",
            tool_name="testkit__echo",
            arguments_json=json.dumps({"message": "from python", "api_token": "secret-value-1"}),
        ),
        metadata=bearer(agent_token),
    )
    assert result.status == pb.TOOL_CALL_STATUS_SUCCEEDED
    assert json.loads(result.result_json) == {"message": "from python", "api_token": "secret-value-1"}
    recorded = gateway.agent.GetToolCall(
        pb.GetToolCallRequest(tool_call_id=result.tool_call_id), metadata=bearer(agent_token)
    )
    assert "secret-value-1" not in recorded.input_redacted_json
    assert recorded.tool_use_id == "toolu_01"


def test_repeated_tool_use_id_is_replayed(gateway, agent_token):
    run = open_run(gateway, agent_token)
    request = pb.ExecuteToolRequest(
        run_id=run.run_id, tool_use_id="toolu_same", tool_name="testkit.noop", arguments_json="{}"
    )
    first = gateway.agent.ExecuteTool(request, metadata=bearer(agent_token))
    again = gateway.agent.ExecuteTool(request, metadata=bearer(agent_token))
    assert first.tool_call_id == again.tool_call_id
    assert again.replayed and not first.replayed


def test_tool_failures_are_answers_not_errors(gateway, agent_token):
    run = open_run(gateway, agent_token)
    result = gateway.agent.ExecuteTool(
        pb.ExecuteToolRequest(run_id=run.run_id, tool_name="testkit.echo", arguments_json='{"message": 3}'),
        metadata=bearer(agent_token),
    )
    assert result.status == pb.TOOL_CALL_STATUS_FAILED
    assert result.error_code == "INVALID_ARGUMENTS"
    assert "/message" in result.error_message


def test_missing_token_is_unauthenticated(gateway):
    with pytest.raises(grpc.RpcError) as error:
        gateway.agent.CreateRun(pb.CreateRunRequest(agent_id="support"))
    assert error.value.code() == grpc.StatusCode.UNAUTHENTICATED


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


APPROVAL_POLICY = """
@id("base") permit(principal, action, resource);
@id("big") @decision("require_expert_approval")
permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
    when { context.args.amount > 1000 };
"""


def test_approval_outcome_reaches_a_watching_runtime(gateway, agent_token):
    """A runtime suspends on an approval, watches its run, and sees the decision land:
    one approver continues without executing, a second decision loses the claim."""
    admin_auth = bearer(gateway.admin_token)
    gateway.admin.PutPolicy(pb.PutPolicyRequest(tenant_id="acme", text=APPROVAL_POLICY), metadata=admin_auth)
    approver_token = gateway.admin.CreateToken(
        pb.CreateTokenRequest(role="approver", tenant_id="acme", label="alice"), metadata=admin_auth
    ).token
    approvals = rpc.ApprovalServiceStub(gateway.channel)
    run = open_run(gateway, agent_token)
    waiting = gateway.agent.ExecuteTool(
        pb.ExecuteToolRequest(
            run_id=run.run_id,
            tool_name="testkit__transfer",
            arguments_json=json.dumps({"amount": 5000, "region": "us-east-1", "account": "a"}),
            tool_use_id="toolu_py_1",
        ),
        metadata=bearer(agent_token),
    )
    assert waiting.status == pb.TOOL_CALL_STATUS_WAITING_APPROVAL
    pending = approvals.ListPending(pb.ListPendingRequest(run_id=run.run_id), metadata=bearer(approver_token))
    [invocation] = pending.invocations

    events = gateway.agent.WatchRun(pb.WatchRunRequest(run_id=run.run_id), metadata=bearer(agent_token))
    continued = approvals.Resume(
        pb.ResumeRequest(
            run_id=run.run_id,
            invocation_id=invocation.invocation_id,
            decision=pb.RESUME_DECISION_CONTINUE,
            reason="not needed after all",
        ),
        metadata=bearer(approver_token),
    )
    assert continued.outcome == pb.RESUME_OUTCOME_CONTINUED
    late = approvals.Resume(
        pb.ResumeRequest(
            run_id=run.run_id, invocation_id=invocation.invocation_id, decision=pb.RESUME_DECISION_APPROVE
        ),
        metadata=bearer(approver_token),
    )
    assert late.outcome == pb.RESUME_OUTCOME_CLAIM_LOST

    kinds = []
    for event in events:
        kinds.append(event.kind)
        if event.kind == "tool_call.continued":
            break
    events.cancel()
    assert "tool_call.approval_requested" in kinds and kinds[-1] == "tool_call.continued", kinds
    call = gateway.agent.GetToolCall(
        pb.GetToolCallRequest(tool_call_id=continued.tool_call_id), metadata=bearer(agent_token)
    )
    assert call.status == pb.TOOL_CALL_STATUS_BLOCKED and call.error_code == "SKIPPED"


def test_replay_and_await_give_the_full_answer_of_an_approved_call(gateway, agent_token):
    """A runtime suspended on an approval collects the executed call's full result with
    AwaitToolCall, and a replay of the same tool_use_id answers with it too."""
    admin_auth = bearer(gateway.admin_token)
    gateway.admin.PutPolicy(pb.PutPolicyRequest(tenant_id="acme", text=APPROVAL_POLICY), metadata=admin_auth)
    approver_token = gateway.admin.CreateToken(
        pb.CreateTokenRequest(role="approver", tenant_id="acme", label="bob"), metadata=admin_auth
    ).token
    approvals = rpc.ApprovalServiceStub(gateway.channel)
    run = open_run(gateway, agent_token)
    request = pb.ExecuteToolRequest(
        run_id=run.run_id,
        tool_name="testkit.transfer",
        arguments_json=json.dumps({"amount": 7000, "region": "us-east-1", "account": "b"}),
        tool_use_id="toolu_py_await",
    )
    waiting = gateway.agent.ExecuteTool(request, metadata=bearer(agent_token))
    assert waiting.status == pb.TOOL_CALL_STATUS_WAITING_APPROVAL
    replay = gateway.agent.ExecuteTool(request, metadata=bearer(agent_token))
    assert replay.replayed and replay.pending_invocation_id == waiting.pending_invocation_id
    assert replay.decision == "require_expert_approval"

    early = gateway.agent.AwaitToolCall(
        pb.AwaitToolCallRequest(tool_call_id=waiting.tool_call_id, timeout_ms=50), metadata=bearer(agent_token)
    )
    assert early.status == pb.TOOL_CALL_STATUS_WAITING_APPROVAL

    approved = approvals.Resume(
        pb.ResumeRequest(
            run_id=run.run_id,
            invocation_id=waiting.pending_invocation_id,
            decision=pb.RESUME_DECISION_APPROVE,
            reason="confirmed",
        ),
        metadata=bearer(approver_token),
    )
    assert approved.outcome == pb.RESUME_OUTCOME_EXECUTED
    done = gateway.agent.AwaitToolCall(
        pb.AwaitToolCallRequest(tool_call_id=waiting.tool_call_id, timeout_ms=30_000), metadata=bearer(agent_token)
    )
    assert done.status == pb.TOOL_CALL_STATUS_SUCCEEDED
    assert json.loads(done.result_json) == {"transferred": 7000, "status": "done"}
    assert not done.redacted
    again = gateway.agent.ExecuteTool(request, metadata=bearer(agent_token))
    assert again.replayed and again.result_json == done.result_json


def test_a_refused_call_runs_when_repeated_after_the_fix(gateway, agent_token):
    admin_auth = bearer(gateway.admin_token)
    run = open_run(gateway, agent_token)
    flag = lambda on: gateway.admin.SetFeatureFlag(  # noqa: E731
        pb.SetFeatureFlagRequest(tenant_id="acme", flag="tool_calling_enabled", enabled=on), metadata=admin_auth
    )
    request = pb.ExecuteToolRequest(
        run_id=run.run_id, tool_use_id="toolu_py_refused", tool_name="testkit.noop", arguments_json="{}"
    )
    flag(False)
    try:
        refused = gateway.agent.ExecuteTool(request, metadata=bearer(agent_token))
        assert refused.error_code == "FEATURE_DISABLED"
    finally:
        flag(True)
    ran = gateway.agent.ExecuteTool(request, metadata=bearer(agent_token))
    assert ran.status == pb.TOOL_CALL_STATUS_SUCCEEDED and not ran.replayed
    assert ran.tool_call_id == refused.tool_call_id
