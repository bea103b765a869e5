"""The MCP endpoint from the official MCP Python SDK (`mcp`), over real HTTP to the real binary.

Each test speaks both protocol generations the SDK knows: the initialize handshake
(`mode="legacy"`, 2025-11-25) and the stateless 2026-07-28 revision (`mode="auto"`, which
probes `server/discover`). What MCP calls write to the ledger is read back over gRPC and
compared with what `ExecuteTool` writes for the same call.
"""

import asyncio
import json
import uuid

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from conftest import Gateway, bearer
from toolgate.v1 import toolgate_pb2 as pb
from toolgate.v1 import toolgate_pb2_grpc as rpc

MODES = ["legacy", "auto"]

APPROVAL_POLICY = """
@id("base") permit(principal, action, resource);
@id("big") @decision("require_expert_approval")
permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
    when { context.args.amount > 1000 };
"""


def mcp_url(gateway):
    return f"http://{gateway.address}/mcp"


async def session(gateway, token, mode, run_id=None, body=None):
    """Runs `body(client)` in an MCP session authenticated with `token`."""
    headers = {"Authorization": f"Bearer {token}"}
    if run_id is not None:
        headers["Toolgate-Run-Id"] = run_id
    async with create_mcp_http_client(headers=headers) as http:
        async with Client(streamable_http_client(mcp_url(gateway), http_client=http), mode=mode) as client:
            return await body(client)


def run_session(gateway, token, mode, body, run_id=None):
    return asyncio.run(session(gateway, token, mode, run_id=run_id, body=body))


def open_run(gateway, token):
    return gateway.agent.CreateRun(pb.CreateRunRequest(agent_id="support"), metadata=bearer(token))


def agent_token_for(gateway, tenant, agent):
    """An agent token of `tenant`, bound to `agent`, with the testkit tools granted."""
    admin, auth = gateway.admin, bearer(gateway.admin_token)
    admin.CreateTenant(pb.CreateTenantRequest(tenant_id=tenant, name=tenant), metadata=auth)
    admin.CreateAgent(pb.CreateAgentRequest(tenant_id=tenant, agent_id=agent), metadata=auth)
    for tool in ["testkit.echo", "testkit.noop", "testkit.transfer"]:
        admin.SetPermission(pb.SetPermissionRequest(tenant_id=tenant, tool_name=tool, enabled=True), metadata=auth)
    admin.SetFeatureFlag(
        pb.SetFeatureFlagRequest(tenant_id=tenant, flag="tool_calling_enabled", enabled=True), metadata=auth
    )
    return admin.CreateToken(
        pb.CreateTokenRequest(role="agent", tenant_id=tenant, agent_id=agent, label=f"{tenant}-mcp"),
        metadata=auth,
    ).token


@pytest.fixture
def bound_token(gateway):
    return agent_token_for(gateway, "acme", "support")


@pytest.mark.parametrize("mode", MODES)
def test_tools_list_is_the_manifest_with_schemas_and_hints(gateway, bound_token, mode):
    async def body(client):
        return (await client.list_tools()).tools

    tools = {tool.name: tool for tool in run_session(gateway, bound_token, mode, body)}
    assert sorted(tools) == ["testkit__echo", "testkit__noop", "testkit__transfer", "toolgate__call_status"]
    echo = tools["testkit__echo"]
    assert echo.input_schema["required"] == ["message"]
    assert echo.annotations.read_only_hint is True
    assert echo.annotations.idempotent_hint is True
    assert echo.meta["toolgate/tool"] == "testkit.echo"
    transfer = tools["testkit__transfer"]
    assert transfer.annotations.read_only_hint is False
    assert tools["toolgate__call_status"].input_schema["required"] == ["tool_call_id"]


@pytest.mark.parametrize("mode", MODES)
def test_a_call_runs_through_the_pipeline_and_is_recorded_like_execute_tool(gateway, bound_token, mode):
    run = open_run(gateway, bound_token)
    arguments = {"message": "from mcp", "api_token": "secret-value-mcp"}

    async def body(client):
        return await client.call_tool("testkit__echo", arguments, meta={"toolgate/tool_use_id": "toolu_mcp_1"})

    result = run_session(gateway, bound_token, mode, body, run_id=run.run_id)
    assert result.is_error is False
    assert result.structured_content == arguments
    assert json.loads(result.content[0].text) == arguments
    call_id = result.meta["toolgate/tool_call_id"]
    assert result.meta["toolgate/status"] == "succeeded"

    by_grpc = gateway.agent.ExecuteTool(
        pb.ExecuteToolRequest(
            run_id=run.run_id, tool_use_id="toolu_grpc_1", tool_name="testkit__echo", arguments_json=json.dumps(arguments)
        ),
        metadata=bearer(bound_token),
    )
    mcp_row = gateway.agent.GetToolCall(pb.GetToolCallRequest(tool_call_id=call_id), metadata=bearer(bound_token))
    grpc_row = gateway.agent.GetToolCall(
        pb.GetToolCallRequest(tool_call_id=by_grpc.tool_call_id), metadata=bearer(bound_token)
    )
    assert "secret-value-mcp" not in mcp_row.input_redacted_json
    assert mcp_row.tool_use_id == "toolu_mcp_1"
    assert mcp_row.run_id == run.run_id
    for field in ["tool_name", "status", "input_redacted_json", "output_redacted_json", "error_code", "risk_level",
                  "agent_id"]:
        assert getattr(mcp_row, field) == getattr(grpc_row, field), field


@pytest.mark.parametrize("mode", MODES)
def test_a_call_outside_the_manifest_is_an_error_result_with_the_code(gateway, bound_token, mode):
    async def body(client):
        return await client.call_tool("testkit__sleep", {"ms": 1})

    result = run_session(gateway, bound_token, mode, body)
    assert result.is_error is True
    assert result.structured_content["status"] == "blocked"
    assert result.structured_content["error"]["code"] == "NOT_IN_MANIFEST"
    assert "NOT_IN_MANIFEST" in result.content[0].text


@pytest.mark.parametrize("mode", MODES)
def test_bad_arguments_are_an_error_result(gateway, bound_token, mode):
    async def body(client):
        return await client.call_tool("testkit__echo", {"wrong": 1})

    result = run_session(gateway, bound_token, mode, body)
    assert result.is_error is True
    assert result.structured_content["error"]["code"] == "INVALID_ARGUMENTS"


@pytest.mark.parametrize("mode", MODES)
def test_a_call_waiting_for_approval_is_fetched_once_approved(gateway, bound_token, mode):
    admin_auth = bearer(gateway.admin_token)
    gateway.admin.PutPolicy(pb.PutPolicyRequest(tenant_id="acme", text=APPROVAL_POLICY), metadata=admin_auth)
    approver = gateway.admin.CreateToken(
        pb.CreateTokenRequest(role="approver", tenant_id="acme", label="alice"), metadata=admin_auth
    ).token
    arguments = {"amount": 5000, "region": "us-east-1", "account": "a"}

    async def call(client):
        return await client.call_tool("testkit__transfer", arguments)

    waiting = run_session(gateway, bound_token, mode, call)
    assert waiting.is_error is True
    details = waiting.structured_content
    assert details["status"] == "waiting_approval"
    assert details["pending_invocation_id"]
    call_id = details["tool_call_id"]
    assert "toolgate__call_status" in waiting.content[0].text

    async def status(client):
        return await client.call_tool("toolgate__call_status", {"tool_call_id": call_id})

    still = run_session(gateway, bound_token, mode, status)
    assert still.structured_content["status"] == "waiting_approval"

    approvals = rpc.ApprovalServiceStub(gateway.channel)
    run_id = gateway.agent.GetToolCall(pb.GetToolCallRequest(tool_call_id=call_id), metadata=bearer(bound_token)).run_id
    [pending] = approvals.ListPending(pb.ListPendingRequest(run_id=run_id), metadata=bearer(approver)).invocations
    assert pending.invocation_id == details["pending_invocation_id"]
    approved = approvals.Resume(
        pb.ResumeRequest(run_id=run_id, invocation_id=pending.invocation_id, decision=pb.RESUME_DECISION_APPROVE),
        metadata=bearer(approver),
    )
    assert approved.outcome == pb.RESUME_OUTCOME_EXECUTED

    done = run_session(gateway, bound_token, mode, status)
    assert done.is_error is False, done
    assert done.meta["toolgate/status"] == "succeeded"
    assert done.meta["toolgate/tool_call_id"] == call_id
    assert done.structured_content is not None


@pytest.mark.parametrize("mode", MODES)
def test_the_same_tool_use_id_executes_once(mode, tmp_path):
    log = tmp_path / "executions.log"
    # A gateway of its own, whose testkit tools log each execution.
    gw = Gateway(env={"TESTKIT_EXECUTION_LOG": str(log)})
    try:
        token = agent_token_for(gw, "acme", "support")
        key = f"toolu_{uuid.uuid4().hex}"

        async def twice(client):
            first = await client.call_tool("testkit__noop", {}, meta={"toolgate/tool_use_id": key})
            again = await client.call_tool("testkit__noop", {}, meta={"toolgate/tool_use_id": key})
            return first, again

        first, again = run_session(gw, token, mode, twice)
        assert first.is_error is False and again.is_error is False
        assert first.meta["toolgate/tool_call_id"] == again.meta["toolgate/tool_call_id"]
        assert first.meta["toolgate/replayed"] is False and again.meta["toolgate/replayed"] is True
        lines = log.read_text().splitlines()
        assert lines == [f"testkit.noop {first.meta['toolgate/tool_call_id']}"], lines
    finally:
        gw.stop()


def test_a_wrong_token_is_refused_before_mcp(gateway, bound_token):
    for token, status in [("tg_agent_not-a-token", 401), (None, 401)]:
        headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        response = httpx2.post(
            mcp_url(gateway),
            headers=headers,
            content=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
        )
        assert response.status_code == status, response.text
        assert response.headers["www-authenticate"].startswith("Bearer")

    # A token of another role is known but not an agent's.
    approver = gateway.admin.CreateToken(
        pb.CreateTokenRequest(role="approver", tenant_id="acme", label="alice"), metadata=bearer(gateway.admin_token)
    ).token
    response = httpx2.post(
        mcp_url(gateway),
        headers={"Authorization": f"Bearer {approver}", "Content-Type": "application/json",
                 "Accept": "application/json, text/event-stream"},
        content=json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}),
    )
    assert response.status_code == 403, response.text

    # The SDK surfaces the refusal as its error for an HTTP error answer (wrapped in its task
    # groups), never as a session, nor as any other failure.
    with pytest.raises(BaseException) as refused:
        run_session(gateway, "tg_agent_not-a-token", "legacy", lambda client: client.list_tools())
    leaves, pending = [], [refused.value]
    while pending:
        error = pending.pop()
        nested = getattr(error, "exceptions", None)
        pending.extend(nested) if nested else leaves.append(error)
    assert leaves and all(isinstance(e, MCPError) and "error response" in str(e) for e in leaves), leaves


def test_a_browser_origin_and_a_foreign_host_are_refused(gateway, bound_token):
    base = {"Authorization": f"Bearer {bound_token}", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream"}
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list"})
    origin = httpx2.post(mcp_url(gateway), headers={**base, "Origin": "https://evil.example"}, content=body)
    assert origin.status_code == 403, origin.text
    host = httpx2.post(mcp_url(gateway), headers={**base, "Host": "evil.example"}, content=body)
    assert host.status_code == 403, host.text


@pytest.mark.parametrize("mode", MODES)
def test_another_tenants_run_is_not_found(gateway, bound_token, mode):
    other = agent_token_for(gateway, "globex", "support")
    theirs = open_run(gateway, other)

    async def body(client):
        return await client.call_tool("testkit__noop", {})

    result = run_session(gateway, bound_token, mode, body, run_id=theirs.run_id)
    assert result.is_error is True
    assert result.structured_content["error"]["code"] == "NOT_FOUND"

    async def listing(client):
        return await client.list_tools()

    with pytest.raises(Exception) as refused:
        run_session(gateway, bound_token, mode, listing, run_id=theirs.run_id)
    # The SDK raises the JSON-RPC error inside its task groups.
    assert "not found" in repr(refused.value) and "NOT_FOUND" in repr(refused.value)


@pytest.mark.parametrize("mode", MODES)
def test_calls_without_a_run_share_the_tokens_standing_run(gateway, bound_token, mode):
    async def body(client):
        first = await client.call_tool("testkit__noop", {})
        second = await client.call_tool("testkit__noop", {})
        return first, second

    first, second = run_session(gateway, bound_token, mode, body)
    rows = [
        gateway.agent.GetToolCall(
            pb.GetToolCallRequest(tool_call_id=r.meta["toolgate/tool_call_id"]), metadata=bearer(bound_token)
        )
        for r in (first, second)
    ]
    assert rows[0].run_id == rows[1].run_id
    assert rows[0].run_id.startswith("mcp_tok_")
    assert rows[0].tool_use_id != rows[1].tool_use_id
    run = gateway.agent.GetRun(pb.GetRunRequest(run_id=rows[0].run_id), metadata=bearer(bound_token))
    assert sorted(run.manifest) == ["testkit.echo", "testkit.noop", "testkit.transfer"]


def modern_request(gateway, token, method, params, extensions=None):
    """One stateless 2026-07-28 JSON-RPC request, its per-request metadata included, as a
    client of the tasks extension sends it; the JSON-RPC response."""
    capabilities = {"extensions": extensions} if extensions else {}
    params = {
        **params,
        "_meta": {
            **params.get("_meta", {}),
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientInfo": {"name": "raw-test-client", "version": "1"},
            "io.modelcontextprotocol/clientCapabilities": capabilities,
        },
    }
    response = httpx2.post(
        mcp_url(gateway),
        headers={
            "Authorization": f"Bearer {token}",
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": method,
            # The standard headers mirror the request's target: the tool, or the task.
            "Mcp-Name": params.get("name") or params.get("taskId", ""),
        },
        content=json.dumps({"jsonrpc": "2.0", "id": 1, "method": method, "params": params}),
    )
    assert response.status_code == 200, response.text
    return response.json()


def test_a_waiting_call_is_a_task_for_clients_of_the_tasks_extension(gateway, bound_token):
    admin_auth = bearer(gateway.admin_token)
    gateway.admin.PutPolicy(pb.PutPolicyRequest(tenant_id="acme", text=APPROVAL_POLICY), metadata=admin_auth)
    approver = gateway.admin.CreateToken(
        pb.CreateTokenRequest(role="approver", tenant_id="acme", label="alice"), metadata=admin_auth
    ).token
    tasks = {"io.modelcontextprotocol/tasks": {}}
    transfer = {"name": "testkit__transfer", "arguments": {"amount": 5000, "region": "us-east-1", "account": "a"}}

    # Without the extension: the plain waiting answer.
    plain = modern_request(gateway, bound_token, "tools/call", transfer)["result"]
    assert plain["isError"] is True and plain["structuredContent"]["status"] == "waiting_approval"

    created = modern_request(gateway, bound_token, "tools/call", transfer, extensions=tasks)["result"]
    assert created["resultType"] == "task", created
    assert created["status"] == "working"
    task_id = created["taskId"]
    assert task_id.startswith("tc_")

    working = modern_request(gateway, bound_token, "tasks/get", {"taskId": task_id}, extensions=tasks)["result"]
    assert working["status"] == "working" and "human" in working["statusMessage"], working

    # Another tenant's agent cannot see it.
    other = agent_token_for(gateway, "globex", "support")
    foreign = modern_request(gateway, other, "tasks/get", {"taskId": task_id}, extensions=tasks)
    assert "error" in foreign and "not found" in foreign["error"]["message"], foreign

    run_id = gateway.agent.GetToolCall(pb.GetToolCallRequest(tool_call_id=task_id), metadata=bearer(bound_token)).run_id
    approvals = rpc.ApprovalServiceStub(gateway.channel)
    pending = [
        p for p in approvals.ListPending(pb.ListPendingRequest(run_id=run_id), metadata=bearer(approver)).invocations
        if p.tool_call_id == task_id
    ]
    assert len(pending) == 1
    approvals.Resume(
        pb.ResumeRequest(run_id=run_id, invocation_id=pending[0].invocation_id, decision=pb.RESUME_DECISION_APPROVE),
        metadata=bearer(approver),
    )
    done = modern_request(gateway, bound_token, "tasks/get", {"taskId": task_id}, extensions=tasks)["result"]
    assert done["status"] == "completed", done
    assert done["result"]["isError"] is False
    assert done["result"]["_meta"]["toolgate/status"] == "succeeded"


CLIENT_APPROVAL_POLICY = """
@id("base") permit(principal, action, resource);
@id("customer") @decision("require_client_approval")
permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
    when { context.args.amount > 1000 };
"""


@pytest.fixture
def console_gateway():
    gw = Gateway(env={"TOOLGATE_CONSOLE_ENABLED": "true"})
    yield gw
    gw.stop()


def test_a_call_the_end_user_decides_carries_its_client_approval_link(console_gateway):
    gateway = console_gateway
    bound_token = agent_token_for(gateway, "acme", "support")
    gateway.admin.PutPolicy(
        pb.PutPolicyRequest(tenant_id="acme", text=CLIENT_APPROVAL_POLICY), metadata=bearer(gateway.admin_token)
    )

    async def call(client):
        return await client.call_tool("testkit__transfer", {"amount": 5000, "region": "us-east-1", "account": "a"})

    waiting = run_session(gateway, bound_token, "legacy", call)
    details = waiting.structured_content
    assert details["status"] == "waiting_approval"
    assert details["decision"] == "require_client_approval"
    url = details["client_approval_url"]
    assert "/console/link/" in url
    assert any(url in block.text for block in waiting.content)
    # The link opens that one call's page.
    page = httpx2.get(url if url.startswith("http") else f"http://{gateway.address}{url}")
    assert page.status_code == 200, page.text
    assert "testkit.transfer" in page.text
