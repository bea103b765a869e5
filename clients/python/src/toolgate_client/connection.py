"""Where and how to connect: the target, TLS (CA, client certificate for mTLS) and the token."""

from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass
from typing import Callable, Optional, Sequence, Tuple, Union

import grpc

Token = Union[str, Callable[[], str]]
"""A bearer token, or a function answering the current one (read at every call)."""

PathLike = Union[str, "os.PathLike[str]"]


class ToolgateError(Exception):
    """A request the gateway did not serve (a gRPC error): a missing or wrong token, a
    malformed field, an unknown run, an unreachable ledger, ...

    Tool failures and refusals are not errors: they are `ToolResult`s.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc(cls, error: grpc.RpcError) -> ToolgateError:
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")


@dataclass(frozen=True)
class TlsConfig:
    """TLS for the connection.

    `ca_file`: the PEM bundle trusted for the gateway's certificate (None: the system's
    roots). `cert_file` and `key_file`: a client certificate and its key, for a gateway that
    requires one (mTLS); give both or neither. `server_name`: the name checked against the
    gateway's certificate when it differs from the target's host.
    """

    ca_file: Optional[PathLike] = None
    cert_file: Optional[PathLike] = None
    key_file: Optional[PathLike] = None
    server_name: Optional[str] = None

    def credentials(self) -> grpc.ChannelCredentials:
        """The channel credentials, the files read now (a missing file is named)."""
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("tls: cert_file and key_file go together (mTLS needs both)")
        return grpc.ssl_channel_credentials(
            root_certificates=_read("ca_file", self.ca_file),
            private_key=_read("key_file", self.key_file),
            certificate_chain=_read("cert_file", self.cert_file),
        )

    def options(self) -> list[Tuple[str, str]]:
        if self.server_name is None:
            return []
        return [("grpc.ssl_target_name_override", self.server_name)]


def _read(what: str, path: Optional[PathLike]) -> Optional[bytes]:
    if path is None:
        return None
    try:
        return pathlib.Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"tls: cannot read {what} {os.fspath(path)}: {error.strerror}") from None


@dataclass(frozen=True)
class Endpoint:
    """A parsed target: `host:port`, `http://host:port` (plaintext) or `https://host:port`
    (TLS with the system's roots unless a `TlsConfig` says otherwise)."""

    address: str
    tls: Optional[TlsConfig]

    @classmethod
    def parse(cls, target: str, tls: Union[TlsConfig, bool, None]) -> Endpoint:
        if not isinstance(target, str) or not target.strip():
            raise ValueError("target: expected `host:port`, `http://host:port` or `https://host:port`")
        address = target.strip()
        scheme_tls: Optional[bool] = None
        for scheme, secure in (("https://", True), ("http://", False)):
            if address.startswith(scheme):
                address = address[len(scheme) :].rstrip("/")
                scheme_tls = secure
        if "/" in address or not address:
            raise ValueError(f"target {target!r}: expected `host:port` without a path")
        if tls is True:
            tls = TlsConfig()
        if tls is False:
            tls = None
        if scheme_tls is False and tls is not None:
            raise ValueError(f"target {target!r} is plaintext (http://) but TLS options were given")
        if scheme_tls is True and tls is None:
            tls = TlsConfig()
        return cls(address=address, tls=tls)


def metadata(token: Token) -> Sequence[Tuple[str, str]]:
    """The call metadata carrying `token`."""
    value = token() if callable(token) else token
    check_token(value)
    return (("authorization", f"Bearer {value}"),)


def check_token(value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError("token: expected a non-empty bearer token")
    if any(c.isspace() for c in value):
        raise ValueError("token: a bearer token has no whitespace (a stray newline from a file?)")
