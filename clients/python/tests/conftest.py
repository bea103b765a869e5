"""Fixtures for the client package's tests: a real toolgate gateway on a loopback port, set up
through the package's own generated AdminService stub.

The gateway binary is `TOOLGATE_BIN` (built with the `testkit` feature: its test tools).
"""

import os
import pathlib
import signal
import subprocess
import tempfile
import threading

import grpc
import pytest

from toolgate_client.v1 import toolgate_pb2 as pb
from toolgate_client.v1 import toolgate_pb2_grpc as rpc

TESTKIT_TOOLS = ["testkit.echo", "testkit.noop", "testkit.transfer"]

APPROVAL_POLICY = """
@id("base") permit(principal, action, resource);
@id("big") @decision("require_expert_approval")
permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
    when { context.args.amount > 1000 };
"""


def bearer(token):
    return (("authorization", f"Bearer {token}"),)


class Gateway:
    """A running `toolgate serve` in a directory of its own (its SQLite ledger and admin
    token live there), with an admin stub.

    `env` adds variables to the gateway's environment (its TLS files); `credentials` makes the
    admin channel a TLS one (with the channel `options`). `restart()` stops the process and starts another on the same
    directory and address, so clients see the same gateway come back.
    """

    def __init__(self, env=None, credentials=None, options=()):
        binary = os.environ.get("TOOLGATE_BIN")
        if not binary or not pathlib.Path(binary).exists():
            raise RuntimeError(
                "TOOLGATE_BIN must point to a toolgate binary built with --features testkit "
                "(run the suite with `cargo xtask ci`)"
            )
        self.binary = str(pathlib.Path(binary).resolve())
        self.env = env or {}
        self.dir = tempfile.TemporaryDirectory()
        self.execution_log = pathlib.Path(self.dir.name) / "executions.log"
        self.address = None
        self._start("127.0.0.1:0")
        self.target = self.address
        self.admin_token = (pathlib.Path(self.dir.name) / "toolgate-admin.token").read_text().strip()
        if credentials is None:
            self.channel = grpc.insecure_channel(self.address)
        else:
            self.channel = grpc.secure_channel(self.address, credentials, options=list(options))
        self.admin = rpc.AdminServiceStub(self.channel)

    def _start(self, listen):
        self.process = subprocess.Popen(
            [self.binary, "serve", "--listen", listen],
            cwd=self.dir.name,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            # The gateway refuses unknown TOOLGATE_* variables; TOOLGATE_BIN is ours, not its.
            env={
                **{k: v for k, v in os.environ.items() if k != "TOOLGATE_BIN"},
                "TOOLGATE_LOG": "warn",
                "TESTKIT_EXECUTION_LOG": str(self.execution_log),
                **self.env,
            },
            text=True,
        )
        ready = threading.Event()
        found = {}

        def read(process):
            for line in process.stdout:
                if line.startswith("toolgate listening on "):
                    found["address"] = line.strip().removeprefix("toolgate listening on ")
                    ready.set()
            ready.set()  # stdout closed: the process exited

        threading.Thread(target=read, args=(self.process,), daemon=True).start()
        if not ready.wait(20) or "address" not in found:
            self.process.kill()
            raise RuntimeError("the gateway did not start within 20 s (see its stderr above)")
        self.address = found["address"]

    def executions(self, tool):
        """How many times the connector of `tool` was entered (the testkit execution log)."""
        if not self.execution_log.exists():
            return 0
        return sum(1 for line in self.execution_log.read_text().splitlines() if line.split(" ")[0] == tool)

    def restart(self, between=None):
        """Stops the gateway cleanly (SIGTERM: its streams end), runs `between()` while it is
        down, and starts it again on the same address and ledger."""
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(20)
        if between is not None:
            between()
        self._start(self.address)

    def stop(self):
        self.channel.close()
        self.process.kill()
        self.process.wait()
        self.dir.cleanup()

    def token(self, role, label, tenant="acme"):
        return self.admin.CreateToken(
            pb.CreateTokenRequest(role=role, tenant_id=tenant, label=label), metadata=bearer(self.admin_token)
        ).token

    def set_up_tenant(self, tenant="acme", tools=TESTKIT_TOOLS):
        """A tenant with agent `support`, `tools` granted and tool calling on; its agent token."""
        auth = bearer(self.admin_token)
        self.admin.CreateTenant(pb.CreateTenantRequest(tenant_id=tenant, name=tenant.title()), metadata=auth)
        self.admin.CreateAgent(pb.CreateAgentRequest(tenant_id=tenant, agent_id="support"), metadata=auth)
        for tool in tools:
            self.admin.SetPermission(
                pb.SetPermissionRequest(tenant_id=tenant, tool_name=tool, enabled=True), metadata=auth
            )
        self.set_flag(True, tenant)
        return self.token("agent", "python", tenant)

    def set_flag(self, on, tenant="acme"):
        self.admin.SetFeatureFlag(
            pb.SetFeatureFlagRequest(tenant_id=tenant, flag="tool_calling_enabled", enabled=on),
            metadata=bearer(self.admin_token),
        )

    def put_policy(self, text, tenant="acme"):
        self.admin.PutPolicy(pb.PutPolicyRequest(tenant_id=tenant, text=text), metadata=bearer(self.admin_token))


@pytest.fixture
def gateway():
    gw = Gateway()
    yield gw
    gw.stop()


@pytest.fixture
def agent_token(gateway):
    """A tenant `acme` with agent `support`, testkit tools granted, tool calling on."""
    return gateway.set_up_tenant()


@pytest.fixture
def client(gateway, agent_token):
    from toolgate_client import ToolgateClient

    with ToolgateClient(gateway.target, agent_token, timeout=30) as c:
        yield c


@pytest.fixture
def approver_token(gateway, agent_token):
    """An approver of `acme`, with the approval policy in force for big transfers."""
    gateway.put_policy(APPROVAL_POLICY)
    return gateway.token("approver", "alice")


@pytest.fixture
def approvals(gateway, approver_token):
    from toolgate_client import ApprovalClient

    with ApprovalClient(gateway.target, approver_token, timeout=30) as c:
        yield c
