//! `toolgate call`: opens a run (or reuses one) and executes one tool with an agent token.

use std::process::ExitCode;

use clap::Args;
use serde_json::json;
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::agent_service_client::AgentServiceClient;

use super::output::{message_json, print_json};
use super::{Connection, EXIT_CALL_NOT_SUCCEEDED, EXIT_WAITING_APPROVAL, TokenRole};

/// `toolgate call` arguments.
#[derive(Debug, Args)]
pub(crate) struct CallArgs {
    #[command(flatten)]
    conn: Connection,
    /// The agent to open the run for (may be omitted with a token bound to one agent).
    #[arg(long)]
    agent: Option<String>,
    /// Reuse an existing run instead of opening one.
    #[arg(long)]
    run: Option<String>,
    /// An idempotency key; repeat it to get the recorded outcome instead of a second call.
    #[arg(long)]
    tool_use_id: Option<String>,
    /// Per-call timeout in milliseconds (default: the tool's own).
    #[arg(long)]
    timeout_ms: Option<u64>,
    /// The tool, e.g. slack.post_message.
    tool: String,
    /// The arguments as a JSON object.
    #[arg(default_value = "{}")]
    arguments: String,
}

/// Runs `toolgate call`: prints the call's `ToolCallResult` and the run it belongs to.
pub(crate) async fn call(args: CallArgs) -> anyhow::Result<ExitCode> {
    let mut client = AgentServiceClient::new(args.conn.connect(TokenRole::Agent).await?);
    let run_id = match args.run {
        Some(run_id) => run_id,
        None => {
            let request = pb::CreateRunRequest {
                agent_id: args.agent.unwrap_or_default(),
                run_id: String::new(),
                max_calls: 0,
            };
            client.create_run(request).await?.into_inner().run_id
        }
    };
    let request = pb::ExecuteToolRequest {
        run_id: run_id.clone(),
        tool_use_id: args.tool_use_id.unwrap_or_default(),
        tool_name: args.tool,
        arguments_json: args.arguments,
        correlation_id: String::new(),
        timeout_ms: args.timeout_ms.unwrap_or(0),
    };
    let result = client.execute_tool(request).await?.into_inner();
    let mut printed = message_json(&result)?;
    // The answer does not name its run; the reader needs it for `--run` and for approvals.
    printed["run_id"] = json!(run_id);
    print_json(&printed);
    Ok(ExitCode::from(call_exit_code(result.status())))
}

/// The exit code of a call that ended with `status`.
pub(super) fn call_exit_code(status: pb::ToolCallStatus) -> u8 {
    match status {
        pb::ToolCallStatus::Succeeded => 0,
        pb::ToolCallStatus::WaitingApproval => EXIT_WAITING_APPROVAL,
        _ => EXIT_CALL_NOT_SUCCEEDED,
    }
}
