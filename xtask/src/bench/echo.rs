//! The benchmark's floor: a bare tonic server speaking toolgate's proto whose `ExecuteTool`
//! answers a fixed successful result at once. It runs in its own process (`xtask bench
//! --echo-server`), with the same runtime defaults as the gateway, so it competes for the CPU
//! exactly as the gateway does.

use std::io::Write as _;
use std::net::SocketAddr;

use anyhow::Context as _;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::agent_service_server::{AgentService, AgentServiceServer};

/// The line the server prints once it accepts connections, followed by its address.
pub(crate) const ANNOUNCEMENT: &str = "echo listening on ";

/// Serves on a free loopback port until its standard input closes (the benchmark holds the
/// other end, so the server never outlives it).
pub(crate) fn serve() -> anyhow::Result<()> {
    std::thread::spawn(|| {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        std::process::exit(0);
    });
    // The gateway's runtime: multi-threaded, one worker per core.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the echo server's runtime")?;
    runtime.block_on(async {
        let address: SocketAddr = "127.0.0.1:0".parse()?;
        let incoming = TcpIncoming::bind(address)
            .context("cannot listen on a loopback port")?
            .with_nodelay(Some(true));
        let local = incoming.local_addr()?;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{ANNOUNCEMENT}{local}")?;
        stdout.flush()?;
        drop(stdout);
        tonic::transport::Server::builder()
            .add_service(AgentServiceServer::new(Echo::new()))
            .serve_with_incoming(incoming)
            .await
            .context("the echo server failed")
    })
}

/// Answers every `ExecuteTool` with the same result, shaped like the gateway's answer for
/// `testkit.noop` so both targets put the same bytes on the wire.
#[derive(Debug)]
struct Echo {
    result: pb::ToolCallResult,
}

impl Echo {
    fn new() -> Echo {
        Echo {
            result: pb::ToolCallResult {
                tool_call_id: "tc_0192f0c4e5a77c3a9b1d2e3f40516273".to_owned(),
                status: pb::ToolCallStatus::Succeeded.into(),
                result_json: r#"{"ok":true}"#.to_owned(),
                error_code: String::new(),
                error_message: String::new(),
                duration_ms: 0,
                attempts: 1,
                decision: "allow".to_owned(),
                risk_level: "low".to_owned(),
                pending_invocation_id: String::new(),
                replayed: false,
                redacted: false,
                client_approval_url: String::new(),
            },
        }
    }
}

#[tonic::async_trait]
impl AgentService for Echo {
    type WatchRunStream =
        std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::RunEvent, Status>> + Send>>;

    async fn watch_run(
        &self,
        _request: Request<pb::WatchRunRequest>,
    ) -> Result<Response<Self::WatchRunStream>, Status> {
        Err(Status::unimplemented(
            "the echo server only answers ExecuteTool",
        ))
    }

    async fn execute_tool(
        &self,
        _request: Request<pb::ExecuteToolRequest>,
    ) -> Result<Response<pb::ToolCallResult>, Status> {
        Ok(Response::new(self.result.clone()))
    }

    async fn create_run(
        &self,
        _request: Request<pb::CreateRunRequest>,
    ) -> Result<Response<pb::Run>, Status> {
        Err(Status::unimplemented(
            "the echo server only answers ExecuteTool",
        ))
    }

    async fn get_run(
        &self,
        _request: Request<pb::GetRunRequest>,
    ) -> Result<Response<pb::Run>, Status> {
        Err(Status::unimplemented(
            "the echo server only answers ExecuteTool",
        ))
    }

    async fn list_tools(
        &self,
        _request: Request<pb::ListToolsRequest>,
    ) -> Result<Response<pb::ListToolsResponse>, Status> {
        Err(Status::unimplemented(
            "the echo server only answers ExecuteTool",
        ))
    }

    async fn await_tool_call(
        &self,
        _request: Request<pb::AwaitToolCallRequest>,
    ) -> Result<Response<pb::ToolCallResult>, Status> {
        Err(Status::unimplemented(
            "the echo server only answers ExecuteTool",
        ))
    }

    async fn get_tool_call(
        &self,
        _request: Request<pb::GetToolCallRequest>,
    ) -> Result<Response<pb::ToolCall>, Status> {
        Err(Status::unimplemented(
            "the echo server only answers ExecuteTool",
        ))
    }

    async fn list_tool_calls(
        &self,
        _request: Request<pb::ListToolCallsRequest>,
    ) -> Result<Response<pb::ListToolCallsResponse>, Status> {
        Err(Status::unimplemented(
            "the echo server only answers ExecuteTool",
        ))
    }
}
