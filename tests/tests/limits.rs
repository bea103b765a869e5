//! The argument limit is reachable over gRPC: with `engine.max_argument_bytes` above gRPC's
//! 4 MiB default, an argument just under the limit executes, and one just over it is refused
//! by the engine with INVALID_ARGUMENTS naming the limit, not by the transport.

use toolgate_e2e::{Gateway, authed, execute};
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::agent_service_client::AgentServiceClient;

const LIMIT: usize = 6 * 1024 * 1024;

/// `{"message": "xxx..."}` of exactly `bytes` bytes.
fn echo_arguments(bytes: usize) -> String {
    let frame = r#"{"message": ""}"#.len();
    format!(r#"{{"message": "{}"}}"#, "x".repeat(bytes - frame))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn arguments_up_to_the_configured_limit_reach_the_engine() {
    let gateway = Gateway::options()
        .env("TOOLGATE_MAX_ARGUMENT_BYTES", &LIMIT.to_string())
        .start();
    let token = gateway.tenant("acme", "support", &["testkit.echo"]).await;
    let run = gateway.open_run(&token, "support", 0).await;
    // The client must take the large answer (the echo) too.
    let mut agent = AgentServiceClient::new(gateway.channel().await)
        .max_decoding_message_size(4 * LIMIT)
        .max_encoding_message_size(4 * LIMIT);

    let under = echo_arguments(LIMIT - 1);
    assert!(under.len() > 4 * 1024 * 1024, "above gRPC's default limit");
    let mut request = execute(&run, "testkit.echo", &under);
    request.timeout_ms = 60_000;
    let answered = agent
        .execute_tool(authed(request, &token))
        .await
        .expect("an argument under the limit is not refused by the transport")
        .into_inner();
    assert_eq!(
        answered.status,
        pb::ToolCallStatus::Succeeded as i32,
        "{} {}",
        answered.error_code,
        answered.error_message
    );
    assert_eq!(
        answered.result_json.len(),
        under.len() - 1,
        "the echo, without spaces"
    );

    let over = echo_arguments(LIMIT + 1);
    let refused = agent
        .execute_tool(authed(execute(&run, "testkit.echo", &over), &token))
        .await
        .expect("an argument over the limit is the engine's to refuse, not the transport's")
        .into_inner();
    assert_eq!(
        refused.status,
        pb::ToolCallStatus::Failed as i32,
        "{refused:?}"
    );
    assert_eq!(refused.error_code, "INVALID_ARGUMENTS");
    assert!(
        refused
            .error_message
            .contains(&format!("more than the limit of {LIMIT} bytes")),
        "{}",
        refused.error_message
    );
}
