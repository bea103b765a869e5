"""TLS and mTLS on the gateway's listener, from the grpcio client, with a CA made by the test."""

import datetime
import ipaddress
import json

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from conftest import Gateway, bearer
from toolgate.v1 import toolgate_pb2 as pb
from grpc_health.v1 import health_pb2, health_pb2_grpc


class CertificateAuthority:
    """A CA that exists for one test; it issues server and client certificates."""

    def __init__(self, name):
        self.key = ec.generate_private_key(ec.SECP256R1())
        self.name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(self.name)
            .issuer_name(self.name)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(self.key.public_key()), critical=False)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = self.cert.public_bytes(serialization.Encoding.PEM)

    def issue(self, name, usage):
        """A certificate for localhost and 127.0.0.1 and its key, both PEM."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(self.name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key()), critical=False
            )
            .sign(self.key, hashes.SHA256())
        )
        key_pem = key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
        return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.fixture
def pki(tmp_path):
    """The test CA, the gateway's certificate files, a client certificate, and a stranger CA."""
    ca = CertificateAuthority("toolgate test ca")
    cert, key = ca.issue("toolgate", ExtendedKeyUsageOID.SERVER_AUTH)
    (tmp_path / "server.pem").write_bytes(cert)
    (tmp_path / "server.key").write_bytes(key)
    (tmp_path / "ca.pem").write_bytes(ca.pem)
    stranger = CertificateAuthority("another ca")
    return {
        "ca": ca,
        "client": ca.issue("agent", ExtendedKeyUsageOID.CLIENT_AUTH),
        "stranger": stranger,
        "stranger_client": stranger.issue("intruder", ExtendedKeyUsageOID.CLIENT_AUTH),
        "env": {
            "TOOLGATE_TLS_CERT_FILE": str(tmp_path / "server.pem"),
            "TOOLGATE_TLS_KEY_FILE": str(tmp_path / "server.key"),
        },
        "client_ca_file": str(tmp_path / "ca.pem"),
    }


def start(env, credentials):
    return Gateway(env=env, credentials=credentials)


def health(channel):
    return health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=10)


def one_call(gateway):
    """Sets a tenant up and makes one call over the gateway's channel: its result."""
    admin, auth = gateway.admin, bearer(gateway.admin_token)
    admin.CreateTenant(pb.CreateTenantRequest(tenant_id="acme", name="Acme"), metadata=auth)
    admin.CreateAgent(pb.CreateAgentRequest(tenant_id="acme", agent_id="support"), metadata=auth)
    admin.SetPermission(pb.SetPermissionRequest(tenant_id="acme", tool_name="testkit.echo", enabled=True), metadata=auth)
    admin.SetFeatureFlag(
        pb.SetFeatureFlagRequest(tenant_id="acme", flag="tool_calling_enabled", enabled=True), metadata=auth
    )
    token = admin.CreateToken(pb.CreateTokenRequest(role="agent", tenant_id="acme", label="tls"), metadata=auth).token
    run = gateway.agent.CreateRun(pb.CreateRunRequest(agent_id="support"), metadata=bearer(token))
    return gateway.agent.ExecuteTool(
        pb.ExecuteToolRequest(
            run_id=run.run_id, tool_name="testkit.echo", arguments_json=json.dumps({"message": "over tls"})
        ),
        metadata=bearer(token),
    )


def refused(address, credentials):
    """Whether a health check over `credentials` fails at the transport (the handshake)."""
    channel = grpc.secure_channel(address, credentials)
    try:
        with pytest.raises(grpc.RpcError) as error:
            health(channel)
        return error.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        channel.close()


def test_tls_serves_a_client_trusting_the_ca_and_refuses_one_trusting_another(pki):
    gateway = start(pki["env"], grpc.ssl_channel_credentials(root_certificates=pki["ca"].pem))
    try:
        assert health(gateway.channel).status == health_pb2.HealthCheckResponse.SERVING
        result = one_call(gateway)
        assert result.status == pb.TOOL_CALL_STATUS_SUCCEEDED
        assert json.loads(result.result_json) == {"message": "over tls"}
        assert refused(gateway.address, grpc.ssl_channel_credentials(root_certificates=pki["stranger"].pem))
        plaintext = grpc.insecure_channel(gateway.address)
        with pytest.raises(grpc.RpcError):
            health(plaintext)
        plaintext.close()
    finally:
        gateway.stop()


def test_mtls_requires_a_client_certificate_from_the_ca(pki):
    env = {**pki["env"], "TOOLGATE_TLS_CLIENT_CA_FILE": pki["client_ca_file"]}
    cert, key = pki["client"]
    gateway = start(
        env,
        grpc.ssl_channel_credentials(root_certificates=pki["ca"].pem, private_key=key, certificate_chain=cert),
    )
    try:
        assert health(gateway.channel).status == health_pb2.HealthCheckResponse.SERVING
        assert one_call(gateway).status == pb.TOOL_CALL_STATUS_SUCCEEDED
        without_certificate = grpc.ssl_channel_credentials(root_certificates=pki["ca"].pem)
        assert refused(gateway.address, without_certificate)
        stranger_cert, stranger_key = pki["stranger_client"]
        foreign = grpc.ssl_channel_credentials(
            root_certificates=pki["ca"].pem, private_key=stranger_key, certificate_chain=stranger_cert
        )
        assert refused(gateway.address, foreign)
    finally:
        gateway.stop()
