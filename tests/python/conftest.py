"""Fixtures for the Python contract tests: a real toolgate gateway on a loopback port."""

import os
import pathlib
import subprocess
import tempfile
import threading

import grpc
import pytest

from toolgate.v1 import toolgate_pb2 as pb
from toolgate.v1 import toolgate_pb2_grpc as rpc


class Gateway:
    """A running `toolgate serve` process with an admin token.

    `env` adds variables to the gateway's environment (e.g. its TLS files); `credentials`,
    when given, makes the channel a TLS one (`grpc.ssl_channel_credentials`).
    """

    def __init__(self, env=None, credentials=None):
        binary = os.environ.get("TOOLGATE_BIN")
        if not binary or not pathlib.Path(binary).exists():
            raise RuntimeError(
                "TOOLGATE_BIN must point to a toolgate binary built with --features testkit "
                "(run the suite with `cargo xtask ci`)"
            )
        binary = str(pathlib.Path(binary).resolve())
        self.dir = tempfile.TemporaryDirectory()
        self.process = subprocess.Popen(
            [binary, "serve", "--listen", "127.0.0.1:0"],
            cwd=self.dir.name,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            # The gateway refuses unknown TOOLGATE_* variables; TOOLGATE_BIN is ours, not its.
            env={
                **{k: v for k, v in os.environ.items() if k != "TOOLGATE_BIN"},
                "TOOLGATE_LOG": "warn",
                **(env or {}),
            },
            text=True,
        )
        ready = threading.Event()
        self.address = None

        def read():
            for line in self.process.stdout:
                if line.startswith("toolgate listening on "):
                    self.address = line.strip().removeprefix("toolgate listening on ")
                    ready.set()
            ready.set()  # stdout closed: the process exited

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(20) or self.address is None:
            self.process.kill()
            raise RuntimeError("the gateway did not start within 20 s (see its stderr above)")
        token_file = pathlib.Path(self.dir.name) / "toolgate-admin.token"
        # A replica joining a ledger that has an admin already writes no token file.
        self.admin_token = token_file.read_text().strip() if token_file.exists() else None
        if credentials is None:
            self.channel = grpc.insecure_channel(self.address)
        else:
            self.channel = grpc.secure_channel(self.address, credentials)
        self.admin = rpc.AdminServiceStub(self.channel)
        self.agent = rpc.AgentServiceStub(self.channel)

    def stop(self):
        self.channel.close()
        self.process.kill()
        self.process.wait()
        self.dir.cleanup()


def bearer(token):
    return (("authorization", f"Bearer {token}"),)


@pytest.fixture
def gateway():
    gw = Gateway()
    yield gw
    gw.stop()


@pytest.fixture
def agent_token(gateway):
    """A tenant `acme` with agent `support`, testkit tools granted, tool calling on."""
    admin, auth = gateway.admin, bearer(gateway.admin_token)
    admin.CreateTenant(pb.CreateTenantRequest(tenant_id="acme", name="Acme"), metadata=auth)
    admin.CreateAgent(pb.CreateAgentRequest(tenant_id="acme", agent_id="support"), metadata=auth)
    for tool in ["testkit.echo", "testkit.noop", "testkit.transfer"]:
        admin.SetPermission(
            pb.SetPermissionRequest(tenant_id="acme", tool_name=tool, enabled=True), metadata=auth
        )
    admin.SetFeatureFlag(
        pb.SetFeatureFlagRequest(tenant_id="acme", flag="tool_calling_enabled", enabled=True),
        metadata=auth,
    )
    token = admin.CreateToken(
        pb.CreateTokenRequest(role="agent", tenant_id="acme", label="python"), metadata=auth
    ).token
    return token
