"""A typed client for the toolgate gateway's gRPC contract (toolgate.v1).

`ToolgateClient` (agent tokens) and `ApprovalClient` (approver tokens) block;
`toolgate_client.aio` has their asyncio twins. The generated stubs are in
`toolgate_client.v1` (`toolgate_pb2`, `toolgate_pb2_grpc`) for anything the wrapper does not
cover (AdminService).

    from toolgate_client import ToolgateClient

    with ToolgateClient("127.0.0.1:50051", token) as client:
        run = client.create_run("support")
        tools = client.anthropic_tools(run)          # hand these to the model
        result = client.execute_tool(run, "testkit__echo", {"message": "hi"}, tool_use_id="toolu_1")
        block = result.anthropic_tool_result("toolu_1")  # and this back
"""

from .aio import AsyncApprovalClient, AsyncRunWatch, AsyncToolgateClient
from .client import ApprovalClient, RunWatch, ToolgateClient
from .connection import TlsConfig, ToolgateError
from .types import (
    CallStatus,
    Decision,
    ErrorCode,
    PendingApproval,
    ResumeOutcome,
    ResumeResult,
    Run,
    RunEvent,
    Tool,
    ToolCall,
    ToolResult,
)

__all__ = [
    "ApprovalClient",
    "AsyncApprovalClient",
    "AsyncRunWatch",
    "AsyncToolgateClient",
    "CallStatus",
    "Decision",
    "ErrorCode",
    "PendingApproval",
    "ResumeOutcome",
    "ResumeResult",
    "Run",
    "RunEvent",
    "RunWatch",
    "TlsConfig",
    "Tool",
    "ToolCall",
    "ToolResult",
    "ToolgateClient",
    "ToolgateError",
]
