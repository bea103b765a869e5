"""The MCP endpoint through two replicas sharing one PostgreSQL ledger, with no session
affinity: every HTTP request of one MCP client goes to the next replica in turn.

The PostgreSQL server is the test suite's (`TOOLGATE_TEST_PG_URL`, set by `cargo xtask ci`;
default `postgres://postgres@127.0.0.1:5432/test`); the test makes a schema of its own and
drops it.
"""

import asyncio
import base64
import itertools
import os
import uuid

import httpx2
import psycopg
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from conftest import Gateway, bearer
from test_mcp import APPROVAL_POLICY, agent_token_for
from toolgate.v1 import toolgate_pb2 as pb
from toolgate.v1 import toolgate_pb2_grpc as rpc

PG_URL = os.environ.get("TOOLGATE_TEST_PG_URL", "postgres://postgres@127.0.0.1:5432/test")


class RoundRobin(httpx2.AsyncBaseTransport):
    """Sends each request to the next replica: what a load balancer without affinity does."""

    def __init__(self, addresses):
        self.addresses = itertools.cycle(addresses)
        self.inner = httpx2.AsyncHTTPTransport()
        self.sent = []

    async def handle_async_request(self, request):
        address = next(self.addresses)
        host, port = address.rsplit(":", 1)
        request.url = request.url.copy_with(host=host, port=int(port))
        self.sent.append(address)
        return await self.inner.handle_async_request(request)

    async def aclose(self):
        await self.inner.aclose()


@pytest.fixture
def replicas():
    schema = f"tg_py_mcp_{uuid.uuid4().hex[:12]}"
    key = "k1=" + base64.b64encode(os.urandom(32)).decode()
    env = {
        "TOOLGATE_DATABASE": PG_URL,
        "TOOLGATE_DATABASE_SCHEMA": schema,
        "TOOLGATE_MASTER_KEYS": key,
    }
    first = Gateway(env=env)
    second = None
    try:
        second = Gateway(env=env)
        second.admin_token = first.admin_token
        yield first, second
    finally:
        for gateway in (second, first):
            if gateway is not None:
                gateway.stop()
        with psycopg.connect(PG_URL, autocommit=True) as connection:
            connection.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_mcp_calls_through_two_replicas_without_affinity(replicas, mode):
    first, second = replicas
    token = agent_token_for(first, "acme", "support")
    admin_auth = bearer(first.admin_token)
    first.admin.PutPolicy(pb.PutPolicyRequest(tenant_id="acme", text=APPROVAL_POLICY), metadata=admin_auth)
    approver = first.admin.CreateToken(
        pb.CreateTokenRequest(role="approver", tenant_id="acme", label="alice"), metadata=admin_auth
    ).token
    balancer = RoundRobin([first.address, second.address])
    key = f"toolu_{uuid.uuid4().hex}"

    async def body(client):
        tools = (await client.list_tools()).tools
        echo = await client.call_tool("testkit__echo", {"message": "hi"}, meta={"toolgate/tool_use_id": key})
        again = await client.call_tool("testkit__echo", {"message": "hi"}, meta={"toolgate/tool_use_id": key})
        refused = await client.call_tool("testkit__sleep", {"ms": 1})
        waiting = await client.call_tool("testkit__transfer", {"amount": 5000, "region": "us-east-1", "account": "a"})
        return tools, echo, again, refused, waiting

    async def status(client, call_id):
        return await client.call_tool("toolgate__call_status", {"tool_call_id": call_id})

    async def connect(work):
        http = httpx2.AsyncClient(
            transport=balancer,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx2.Timeout(30, read=120),
        )
        async with http:
            async with Client(streamable_http_client(f"http://{first.address}/mcp", http_client=http), mode=mode) as client:
                return await work(client)

    tools, echo, again, refused, waiting = asyncio.run(connect(body))
    assert {first.address, second.address} <= set(balancer.sent)
    assert "testkit__echo" in [tool.name for tool in tools]
    assert echo.is_error is False and echo.structured_content == {"message": "hi"}
    assert again.meta["toolgate/replayed"] is True
    assert again.meta["toolgate/tool_call_id"] == echo.meta["toolgate/tool_call_id"]
    assert refused.structured_content["error"]["code"] == "NOT_IN_MANIFEST"
    assert waiting.structured_content["status"] == "waiting_approval"
    call_id = waiting.structured_content["tool_call_id"]

    # Approved through the other replica's approval service; fetched through the balancer.
    run_id = second.agent.GetToolCall(pb.GetToolCallRequest(tool_call_id=call_id), metadata=bearer(token)).run_id
    approvals = rpc.ApprovalServiceStub(second.channel)
    [pending] = approvals.ListPending(pb.ListPendingRequest(run_id=run_id), metadata=bearer(approver)).invocations
    approved = approvals.Resume(
        pb.ResumeRequest(run_id=run_id, invocation_id=pending.invocation_id, decision=pb.RESUME_DECISION_APPROVE),
        metadata=bearer(approver),
    )
    assert approved.outcome == pb.RESUME_OUTCOME_EXECUTED
    for _ in range(2):  # once through each replica
        done = asyncio.run(connect(lambda client: status(client, call_id)))
        assert done.is_error is False, done
        assert done.meta["toolgate/status"] == "succeeded"

    # One ledger: both replicas read the same rows, and the repeat executed once.
    calls = first.agent.ListToolCalls(pb.ListToolCallsRequest(run_id=run_id), metadata=bearer(token)).tool_calls
    echoes = [call for call in calls if call.tool_name == "testkit.echo"]
    assert len(echoes) == 1 and echoes[0].tool_use_id == key
    seen_by_second = second.agent.ListToolCalls(
        pb.ListToolCallsRequest(run_id=run_id), metadata=bearer(token)
    ).tool_calls
    assert sorted(c.tool_call_id for c in seen_by_second) == sorted(c.tool_call_id for c in calls)
