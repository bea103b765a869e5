"""The wrapper itself: its enums against the contract and the gateway's source, bad input,
tokens, tenants, the resuming watch, TLS and mTLS, and the asyncio twin."""

import asyncio
import json
import math
import pathlib
import re
import threading

import grpc
import pytest
from cryptography.x509.oid import ExtendedKeyUsageOID

import toolgate_client
from conftest import Gateway
from pki import CertificateAuthority
from toolgate_client import (
    ApprovalClient,
    CallStatus,
    Decision,
    ErrorCode,
    ResumeOutcome,
    TlsConfig,
    ToolgateClient,
    ToolgateError,
)
from toolgate_client.aio import AsyncApprovalClient, AsyncToolgateClient
from toolgate_client.v1 import toolgate_pb2 as pb

REPOSITORY = pathlib.Path(__file__).resolve().parents[3]
BIG_TRANSFER = {"amount": 5000, "region": "us-east-1", "account": "a"}


def test_the_package_under_test_is_the_installed_wheel():
    package = pathlib.Path(toolgate_client.__file__).parent
    assert "site-packages" in package.parts, package
    assert (package / "py.typed").is_file()
    assert (package / "v1" / "toolgate_pb2.pyi").is_file()
    assert (package / "v1" / "toolgate_pb2_grpc.py").is_file()


def test_error_codes_are_the_gateways():
    """The enum's values are exactly the strings `ErrorCode::as_str` answers in the gateway."""
    source = (REPOSITORY / "crates/toolgate-core/src/error.rs").read_text()
    rust = set(re.findall(r'ErrorCode::\w+ => "([A-Z_]+)"', source))
    assert len(rust) >= 17, "the as_str arms of crates/toolgate-core/src/error.rs were not found"
    assert {code.value for code in ErrorCode} == rust
    assert all(code.name == code.value for code in ErrorCode)


def test_enums_cover_the_contract():
    declared = set(CallStatus)
    for value in pb.ToolCallStatus.values():
        assert CallStatus.from_proto(value) in declared, pb.ToolCallStatus.Name(value)
    outcomes = set(ResumeOutcome)
    for value in pb.ResumeOutcome.values():
        if value != pb.RESUME_OUTCOME_UNSPECIFIED:
            assert ResumeOutcome.from_proto(value) in outcomes, pb.ResumeOutcome.Name(value)
    assert len(outcomes) == len(pb.ResumeOutcome.values()) - 1
    assert sorted(pb.ResumeDecision.Name(d.to_proto()) for d in Decision) == [
        "RESUME_DECISION_APPROVE",
        "RESUME_DECISION_CONTINUE",
        "RESUME_DECISION_REJECT",
    ]


def test_codes_a_newer_gateway_adds_stay_readable():
    code = ErrorCode("SOMETHING_NEW")
    assert code == "SOMETHING_NEW" and str(code) == "SOMETHING_NEW"
    assert code not in set(ErrorCode)
    assert CallStatus.from_proto(99) == "status_99"
    assert ErrorCode("TIMEOUT") is ErrorCode.TIMEOUT


def test_bad_input_is_refused_before_anything_is_sent(gateway, agent_token, client):
    run = client.create_run("support")
    cases = [
        (lambda: client.execute_tool(run, "testkit.echo", ["message"]), TypeError, "arguments: expected a JSON object"),
        (lambda: client.execute_tool(run, "testkit.echo", {"message": {1, 2}}), TypeError, "not representable as JSON"),
        (lambda: client.execute_tool(run, "testkit.echo", {"message": math.nan}), TypeError, "not representable as JSON"),
        (lambda: client.execute_tool(run, "", {}), ValueError, "tool: expected a tool name"),
        (lambda: client.execute_tool("", "testkit.echo", {}), ValueError, "run: expected"),
        (lambda: client.execute_tool(run, "testkit.echo", {}, timeout_ms=-1), ValueError, "timeout_ms"),
        (lambda: client.await_tool_call("", timeout_ms=0), ValueError, "tool_call_id"),
        (lambda: ToolgateClient(gateway.target, "tg_x\n"), ValueError, "whitespace"),
        (lambda: ToolgateClient(gateway.target, ""), ValueError, "non-empty bearer token"),
        (lambda: ToolgateClient("", agent_token), ValueError, "target"),
        (lambda: ToolgateClient("http://127.0.0.1:1/v1", agent_token), ValueError, "without a path"),
        (lambda: ToolgateClient(f"http://{gateway.target}", agent_token, tls=True), ValueError, "plaintext"),
        (lambda: ToolgateClient(gateway.target, agent_token, tls=TlsConfig(cert_file="c.pem")), ValueError, "go together"),
        (
            lambda: ToolgateClient(gateway.target, agent_token, tls=TlsConfig(ca_file="/nonexistent/ca.pem")),
            ValueError,
            "/nonexistent/ca.pem",
        ),
        (lambda: client.watch_run(run, reconnect_delay=2, max_reconnect_delay=1), ValueError, "reconnect"),
    ]
    for call, error, message in cases:
        with pytest.raises(error) as raised:
            call()
        assert message in str(raised.value), (message, str(raised.value))
    assert list(client.list_tool_calls(run)) == []
    assert client.get_run(run).calls_used == 0


def test_another_tenants_run_and_calls_are_not_found(gateway, client):
    run = client.create_run("support")
    call = client.execute_tool(run, "testkit.echo", {"message": "mine"})
    with ToolgateClient(gateway.target, gateway.set_up_tenant("globex"), timeout=10) as stranger:
        attempts = [
            lambda: stranger.get_run(run),
            lambda: stranger.execute_tool(run, "testkit.echo", {"message": "theirs"}),
            lambda: stranger.get_tool_call(call.tool_call_id),
            lambda: stranger.await_tool_call(call.tool_call_id, timeout_ms=0),
            lambda: next(stranger.watch_run(run)),
        ]
        for attempt in attempts:
            with pytest.raises(ToolgateError) as refused:
                attempt()
            assert refused.value.code == grpc.StatusCode.NOT_FOUND
    assert [c.tool_call_id for c in client.list_tool_calls(run)] == [call.tool_call_id]
    assert gateway.executions("testkit.echo") == 1


def test_a_token_function_is_asked_at_every_call(gateway, agent_token):
    tokens = [agent_token, agent_token, "tg_revoked-or-wrong"]
    asked = []

    def token():
        asked.append(True)
        return tokens[len(asked) - 1]

    with ToolgateClient(gateway.target, token, timeout=10) as client:
        run = client.create_run("support")
        assert client.get_run(run).run_id == run.run_id
        with pytest.raises(ToolgateError) as refused:
            client.get_run(run)
    assert refused.value.code == grpc.StatusCode.UNAUTHENTICATED
    assert len(asked) == 3


def test_wrong_role_is_permission_denied(gateway, agent_token):
    with ApprovalClient(gateway.target, agent_token, timeout=10) as not_an_approver:
        with pytest.raises(ToolgateError) as refused:
            not_an_approver.list_pending()
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_reject_never_runs_the_call(gateway, client, approvals):
    run = client.create_run("support")
    waiting = client.execute_tool(run, "testkit.transfer", BIG_TRANSFER, tool_use_id="toolu_reject")
    [pending] = approvals.list_pending(run=run, tool_name="testkit.transfer")
    rejected = approvals.reject(pending, reason="no")
    assert rejected.outcome is ResumeOutcome.REJECTED and rejected.result is None
    settled = client.await_tool_call(waiting.tool_call_id, timeout_ms=5_000)
    assert settled.settled and settled.error_code is ErrorCode.EXPERT_REJECTED
    assert gateway.executions("testkit.transfer") == 0
    assert approvals.list_pending(run=run) == []
    with pytest.raises(ValueError, match="belongs to run"):
        approvals.approve(pending, run="run_other")


def retry_unavailable(call, attempts=50):
    """Calls `call` until it is not refused UNAVAILABLE (a channel reconnecting after the
    gateway's restart); the calls retried here are idempotent."""
    for _ in range(attempts - 1):
        try:
            return call()
        except ToolgateError as error:
            if error.code != grpc.StatusCode.UNAVAILABLE:
                raise
        threading.Event().wait(0.2)
    return call()


def succeeded_of(events, tool_call_id):
    return any(e.kind == "tool_call.succeeded" and e.tool_call_id == tool_call_id for e in events)


def test_watch_resumes_from_its_cursor_when_the_gateway_restarts(gateway, client):
    run = client.create_run("support")
    first = client.execute_tool(run, "testkit.echo", {"message": "before"}, tool_use_id="toolu_w1")
    seen = []
    watch = client.watch_run(run, reconnect_delay=0.05, max_reconnect_delay=0.5)
    reader_failed = []

    def read():
        try:
            for event in watch:
                seen.append(event)
        except Exception as error:  # reported by the assertion below
            reader_failed.append(error)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    wait_for(lambda: succeeded_of(seen, first.tool_call_id))
    before = list(seen)

    gateway.restart()
    after = retry_unavailable(
        lambda: client.execute_tool(run, "testkit.echo", {"message": "after"}, tool_use_id="toolu_w2")
    )
    assert after.ok and not after.replayed
    wait_for(lambda: succeeded_of(seen, after.tool_call_id) or reader_failed)
    watch.close()
    reader.join(10)
    assert not reader.is_alive() and not reader_failed, reader_failed
    assert watch.reconnects >= 1
    cursors = [e.cursor for e in seen]
    assert cursors == sorted(set(cursors)), "an event came twice or out of order"
    assert seen[: len(before)] == before

    # A watch from the beginning sees the same events: none was missed across the restart.
    replay = []
    with client.watch_run(run) as fresh:
        for event in fresh:
            replay.append(event)
            if event.cursor == watch.cursor:
                break
    assert [(e.cursor, e.kind, e.tool_call_id) for e in replay] == [(e.cursor, e.kind, e.tool_call_id) for e in seen]
    assert watch.cursor == seen[-1].cursor


def test_watch_gives_up_after_its_reconnects(gateway, client):
    run = client.create_run("support")
    watch = client.watch_run(run, reconnect_delay=0.01, max_reconnect_delay=0.02, max_reconnects=2)
    gateway.process.kill()
    gateway.process.wait()
    with pytest.raises(ToolgateError) as gave_up:
        next(watch)
    assert gave_up.value.code == grpc.StatusCode.UNAVAILABLE
    assert watch.reconnects == 2


def wait_for(condition, seconds=20):
    stop = threading.Event()
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        stop.wait(0.05)
    raise AssertionError("the condition did not hold within %s s" % seconds)


@pytest.fixture
def pki(tmp_path):
    ca = CertificateAuthority("toolgate test ca")
    cert, key = ca.issue("toolgate", ExtendedKeyUsageOID.SERVER_AUTH)
    (tmp_path / "server.pem").write_bytes(cert)
    (tmp_path / "server.key").write_bytes(key)
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    client_cert, client_key = ca.issue("agent", ExtendedKeyUsageOID.CLIENT_AUTH)
    (tmp_path / "client.pem").write_bytes(client_cert)
    (tmp_path / "client.key").write_bytes(client_key)
    stranger = CertificateAuthority("another ca")
    (tmp_path / "stranger.pem").write_bytes(stranger.pem)
    return {
        "ca": ca,
        "dir": tmp_path,
        "env": {
            "TOOLGATE_TLS_CERT_FILE": str(tmp_path / "server.pem"),
            "TOOLGATE_TLS_KEY_FILE": str(tmp_path / "server.key"),
        },
    }


def echo_over(target, token, **options):
    with ToolgateClient(target, token, timeout=10, **options) as client:
        run = client.create_run("support")
        return client.execute_tool(run, "testkit.echo", {"message": "over tls"})


def test_tls_with_the_ca_file_and_refused_otherwise(pki):
    files = pki["dir"]
    gateway = Gateway(env=pki["env"], credentials=grpc.ssl_channel_credentials(root_certificates=pki["ca"].pem))
    try:
        token = gateway.set_up_tenant()
        trusted = TlsConfig(ca_file=files / "ca.pem")
        assert echo_over(gateway.target, token, tls=trusted).result == {"message": "over tls"}
        assert echo_over(f"https://{gateway.target}", token, tls=trusted).ok
        refusals = [
            {"tls": TlsConfig(ca_file=str(files / "stranger.pem"))},
            {"tls": None},
            {"tls": True},
        ]
        for options in refusals:
            with pytest.raises(ToolgateError) as refused:
                echo_over(gateway.target, token, **options)
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE, options
    finally:
        gateway.stop()


def test_tls_checks_the_name_given_as_server_name(tmp_path):
    ca = CertificateAuthority("toolgate test ca")
    cert, key = ca.issue("toolgate", ExtendedKeyUsageOID.SERVER_AUTH, names=["gateway.internal"])
    (tmp_path / "server.pem").write_bytes(cert)
    (tmp_path / "server.key").write_bytes(key)
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    env = {"TOOLGATE_TLS_CERT_FILE": str(tmp_path / "server.pem"), "TOOLGATE_TLS_KEY_FILE": str(tmp_path / "server.key")}
    admin_credentials = grpc.ssl_channel_credentials(root_certificates=ca.pem)
    gateway = Gateway(env=env, credentials=admin_credentials, options=[("grpc.ssl_target_name_override", "gateway.internal")])
    try:
        token = gateway.set_up_tenant()
        named = TlsConfig(ca_file=tmp_path / "ca.pem", server_name="gateway.internal")
        assert echo_over(gateway.target, token, tls=named).ok
        with pytest.raises(ToolgateError) as refused:
            echo_over(gateway.target, token, tls=TlsConfig(ca_file=tmp_path / "ca.pem"))
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    finally:
        gateway.stop()


def test_mtls_with_a_client_certificate(pki):
    files = pki["dir"]
    env = {**pki["env"], "TOOLGATE_TLS_CLIENT_CA_FILE": str(files / "ca.pem")}
    cert = (files / "client.pem").read_bytes()
    key = (files / "client.key").read_bytes()
    admin_credentials = grpc.ssl_channel_credentials(
        root_certificates=pki["ca"].pem, private_key=key, certificate_chain=cert
    )
    gateway = Gateway(env=env, credentials=admin_credentials)
    try:
        token = gateway.set_up_tenant()
        with_certificate = TlsConfig(ca_file=files / "ca.pem", cert_file=files / "client.pem", key_file=files / "client.key")
        assert echo_over(gateway.target, token, tls=with_certificate).ok
        with pytest.raises(ToolgateError) as refused:
            echo_over(gateway.target, token, tls=TlsConfig(ca_file=files / "ca.pem"))
        assert refused.value.code == grpc.StatusCode.UNAVAILABLE
        # Ready credentials work as well as a TlsConfig.
        assert echo_over(gateway.target, token, credentials=admin_credentials).ok
        with pytest.raises(ValueError, match="either tls or credentials"):
            ToolgateClient(gateway.target, token, tls=with_certificate, credentials=admin_credentials)
    finally:
        gateway.stop()


def test_the_asyncio_twin_round_trip_with_an_approval(gateway, agent_token, approver_token):
    async def scenario():
        async with AsyncToolgateClient(gateway.target, agent_token, timeout=30) as client, AsyncApprovalClient(
            gateway.target, approver_token, timeout=30
        ) as approvals:
            run = await client.create_run("support")
            names = sorted(t["name"] for t in await client.anthropic_tools(run))
            assert names == ["testkit__echo", "testkit__noop", "testkit__transfer"]
            assert sorted(t["function"]["name"] for t in await client.openai_tools(run)) == names
            echoed = await client.execute_tool(run, "testkit__echo", {"message": "async"}, tool_use_id="toolu_a1")
            assert echoed.ok and echoed.result == {"message": "async"}
            failed = await client.execute_tool(run, "testkit.echo", {"message": 1})
            assert failed.error_code is ErrorCode.INVALID_ARGUMENTS
            waiting = await client.execute_tool(run, "testkit.transfer", BIG_TRANSFER, tool_use_id="toolu_a2")
            assert waiting.waiting_approval
            [pending] = await approvals.list_pending(run=run)
            assert (await approvals.get_pending(pending.invocation_id)).version == pending.version
            approved = await approvals.approve(pending, reason="ok")
            assert approved.outcome is ResumeOutcome.EXECUTED
            done = await client.await_tool_call(waiting.tool_call_id, timeout_ms=30_000)
            assert done.ok and done.result == {"transferred": 5000, "status": "done"}
            late = await approvals.continue_(pending.invocation_id, run=run)
            assert late.outcome is ResumeOutcome.CLAIM_LOST
            recorded = await client.get_tool_call(echoed.tool_call_id)
            assert recorded.tool_use_id == "toolu_a1"
            calls = [c.tool_call_id async for c in client.list_tool_calls(run, page_size=1)]
            assert calls == [echoed.tool_call_id, failed.tool_call_id, waiting.tool_call_id]
            kinds = []
            async with client.watch_run(run) as events:
                async for event in events:
                    kinds.append(event.kind)
                    if event.kind == "tool_call.succeeded" and event.tool_call_id == waiting.tool_call_id:
                        break
            assert "tool_call.approval_requested" in kinds and "tool_call.approved" in kinds, kinds
            with pytest.raises(ToolgateError) as missing:
                await client.get_run("run_missing")
            assert missing.value.code == grpc.StatusCode.NOT_FOUND

    asyncio.run(scenario())
    assert gateway.executions("testkit.transfer") == 1


def test_the_asyncio_watch_resumes_when_the_gateway_restarts(gateway, agent_token):
    async def scenario():
        async with AsyncToolgateClient(gateway.target, agent_token, timeout=30) as client:
            run = await client.create_run("support")
            first = await client.execute_tool(run, "testkit.noop", {}, tool_use_id="toolu_r1")
            watch = client.watch_run(run, reconnect_delay=0.05, max_reconnect_delay=0.5)
            seen = []

            async def read():
                async for event in watch:
                    seen.append(event)

            reader = asyncio.create_task(read())
            while not succeeded_of(seen, first.tool_call_id):
                await asyncio.sleep(0.05)
            await asyncio.to_thread(gateway.restart)
            for _ in range(50):
                try:
                    after = await client.execute_tool(run, "testkit.noop", {}, tool_use_id="toolu_r2")
                    break
                except ToolgateError as error:
                    assert error.code == grpc.StatusCode.UNAVAILABLE
                    await asyncio.sleep(0.2)
            for _ in range(400):
                if succeeded_of(seen, after.tool_call_id) or reader.done():
                    break
                await asyncio.sleep(0.05)
            watch.close()
            await asyncio.wait_for(reader, 10)
            assert succeeded_of(seen, after.tool_call_id)
            assert watch.reconnects >= 1
            cursors = [e.cursor for e in seen]
            assert cursors == sorted(set(cursors))
            full = []
            async for event in client.watch_run(run):
                full.append((event.cursor, event.kind))
                if event.cursor == watch.cursor:
                    break
            assert full == [(e.cursor, e.kind) for e in seen]

    asyncio.run(scenario())


def test_tool_results_in_llm_shapes(client, approvals):
    run = client.create_run("support")
    ok = client.execute_tool(run, "testkit__echo", {"message": "shape"}, tool_use_id="toolu_s1")
    block = ok.anthropic_tool_result("toolu_s1")
    assert block == {"type": "tool_result", "tool_use_id": "toolu_s1", "content": ok.raw.result_json, "is_error": False}
    assert json.loads(ok.content()) == {"message": "shape"}
    assert ok.openai_tool_message("call_1") == {"role": "tool", "tool_call_id": "call_1", "content": ok.content()}
    waiting = client.execute_tool(run, "testkit__transfer", BIG_TRANSFER, tool_use_id="toolu_s2")
    block = waiting.anthropic_tool_result("toolu_s2")
    assert block["tool_use_id"] == "toolu_s2"
    assert block["is_error"] is False
    relayed = json.loads(block["content"])
    assert relayed["status"] == "waiting_approval"
    assert relayed["pending_invocation_id"] == waiting.pending_invocation_id
    refused = client.execute_tool(run, "testkit.nothing", {})
    assert refused.error_code in (ErrorCode.NOT_IN_MANIFEST, ErrorCode.UNKNOWN_TOOL)
    assert json.loads(refused.openai_tool_message("call_2")["content"])["error_code"] == refused.error_code.value
