"""Hatchling build hook: generates the toolgate.v1 stubs from the repository's proto/.

Every wheel build regenerates `src/toolgate_client/v1/toolgate_pb2.py`, `toolgate_pb2.pyi` and
`toolgate_pb2_grpc.py` with grpcio-tools (`--python_out --grpc_python_out --pyi_out`), so a
wheel always matches the contract it was built from. The files are git-ignored.

protoc names Python modules after the .proto's path, so the generated gRPC module imports
`toolgate.v1.toolgate_pb2`; the hook rewrites that one import into a relative one, which keeps
the stubs inside `toolgate_client` instead of claiming a top-level `toolgate` package.
"""

from __future__ import annotations

import pathlib
import subprocess
import sys
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

PROTO = pathlib.Path("toolgate/v1/toolgate.proto")
ABSOLUTE_IMPORT = "from toolgate.v1 import toolgate_pb2 as"
RELATIVE_IMPORT = "from . import toolgate_pb2 as"


class GenerateStubs(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        root = pathlib.Path(self.root)
        proto_root = (root / ".." / ".." / "proto").resolve()
        if not (proto_root / PROTO).is_file():
            raise RuntimeError(
                f"the contract {PROTO} is not under {proto_root}: build the wheel from the "
                "repository's clients/python directory"
            )
        out = root / "src" / "toolgate_client" / "v1"
        with_tools = subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{proto_root}",
                f"--python_out={out.parent.parent}",
                f"--grpc_python_out={out.parent.parent}",
                f"--pyi_out={out.parent.parent}",
                str(proto_root / PROTO),
            ],
            capture_output=True,
            text=True,
            cwd=root,
        )
        if with_tools.returncode != 0:
            raise RuntimeError(
                "generating the stubs failed (is grpcio-tools installed in the build "
                f"environment?): {with_tools.stderr.strip()}"
            )
        # protoc wrote src/toolgate/v1/*; move them into the package.
        generated = out.parent.parent / "toolgate" / "v1"
        for name in ["toolgate_pb2.py", "toolgate_pb2.pyi", "toolgate_pb2_grpc.py"]:
            text = (generated / name).read_text()
            if name == "toolgate_pb2_grpc.py":
                if ABSOLUTE_IMPORT not in text:
                    raise RuntimeError(f"the generated {name} no longer imports `{ABSOLUTE_IMPORT}`")
                text = text.replace(ABSOLUTE_IMPORT, RELATIVE_IMPORT)
            if "from toolgate.v1" in text or "import toolgate." in text:
                raise RuntimeError(f"the generated {name} imports the top-level `toolgate` package")
            (out / name).write_text(text)
            (generated / name).unlink()
        generated.rmdir()
        generated.parent.rmdir()
