//! Graceful shutdown of the real binary: on SIGTERM (or SIGINT) health turns NOT_SERVING, new
//! calls are refused, open WatchRun streams end, calls in flight finish and are answered, and
//! the process exits 0; when the drain timeout passes first, the process still exits 0 and the
//! abandoned call is settled as outcome_unknown by the next start.

use std::time::{Duration, Instant};

use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use toolgate_e2e::{Gateway, authed, execute};
use toolgate_proto::v1 as pb;

const TOOLS: &[&str] = &["testkit.sleep", "testkit.noop"];

/// A slow call of `ms` milliseconds (its timeout well above), started on its own task.
fn slow_call(
    gateway: &Gateway,
    token: &str,
    run: &str,
    ms: u64,
) -> tokio::task::JoinHandle<Result<pb::ToolCallResult, tonic::Status>> {
    let url = gateway.url.clone();
    let mut request = execute(run, "testkit.sleep", &format!("{{\"ms\": {ms}}}"));
    request.tool_use_id = "toolu_slow".into();
    request.timeout_ms = ms * 4;
    let token = token.to_owned();
    tokio::spawn(async move {
        let channel = tonic::transport::Channel::from_shared(url)
            .unwrap()
            .connect()
            .await
            .unwrap();
        pb::agent_service_client::AgentServiceClient::new(channel)
            .execute_tool(authed(request, &token))
            .await
            .map(tonic::Response::into_inner)
    })
}

/// The overall health as a fresh client (a probe) sees it.
async fn health(gateway: &Gateway, service: &str) -> ServingStatus {
    let mut client = HealthClient::new(gateway.channel().await);
    let answer = client
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .expect("health answers during the drain")
        .into_inner();
    ServingStatus::try_from(answer.status).expect("known status")
}

/// Waits until the slow call is running (its `tool.started`-like event is in the ledger).
async fn until_running(gateway: &Gateway, token: &str, run: &str) {
    let started = Instant::now();
    loop {
        let calls = gateway.tool_calls(token, run).await;
        if calls.iter().any(|c| {
            c.tool_name == "testkit.sleep" && c.status == pb::ToolCallStatus::Running as i32
        }) {
            return;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the slow call never started: {calls:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_drains_calls_ends_streams_and_exits_zero() {
    let mut gateway = Gateway::options()
        .env("TOOLGATE_DRAIN_TIMEOUT_MS", "20000")
        .start();
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    assert_eq!(health(&gateway, "").await, ServingStatus::Serving);

    let mut watch = gateway.watch_run(&token, &run, 0).await;
    let in_flight = slow_call(&gateway, &token, &run, 3000);
    until_running(&gateway, &token, &run).await;

    let signalled = Instant::now();
    gateway.signal("TERM");

    // The stream ends cleanly (no error), long before the slow call is done.
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match watch.message().await {
                Ok(Some(_event)) => {}
                Ok(None) => return Ok(()),
                Err(status) => return Err(status),
            }
        }
    })
    .await
    .expect("WatchRun ends within 10 s of SIGTERM");
    assert!(ended.is_ok(), "the stream ends without an error: {ended:?}");

    // Health turns NOT_SERVING at once, overall and for the agent service.
    assert_eq!(health(&gateway, "").await, ServingStatus::NotServing);
    assert_eq!(
        health(&gateway, "toolgate.v1.AgentService").await,
        ServingStatus::NotServing
    );

    // A new call is refused with UNAVAILABLE, saying why, and never reaches the ledger.
    let refused = gateway
        .try_execute(&token, execute(&run, "testkit.noop", "{}"))
        .await
        .expect_err("new calls are refused while draining");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("shutting down"),
        "{}",
        refused.message()
    );

    // The call in flight is answered with its real outcome.
    let answered = in_flight
        .await
        .unwrap()
        .expect("the in-flight call is answered");
    assert_eq!(
        answered.status,
        pb::ToolCallStatus::Succeeded as i32,
        "{answered:?}"
    );
    assert_eq!(answered.result_json, r#"{"slept_ms":3000}"#);

    let status = gateway
        .wait_exit(Duration::from_secs(20))
        .await
        .expect("the gateway exits within the drain timeout");
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        signalled.elapsed() < Duration::from_secs(20),
        "exited after {:?}",
        signalled.elapsed()
    );

    // Nothing of the refused call reached the ledger; the drained one is recorded succeeded.
    let dir = gateway.dir.clone();
    let temp = gateway.stop();
    let restarted = Gateway::options().dir(&dir).start();
    let calls = restarted.tool_calls(&token, &run).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].status, pb::ToolCallStatus::Succeeded as i32);
    drop(restarted);
    drop(temp);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_exits_zero_when_the_drain_timeout_passes_and_the_next_start_settles_the_call() {
    let mut gateway = Gateway::options()
        .env("TOOLGATE_DRAIN_TIMEOUT_MS", "1000")
        .start();
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    let in_flight = slow_call(&gateway, &token, &run, 60_000);
    until_running(&gateway, &token, &run).await;

    let signalled = Instant::now();
    gateway.signal("INT");
    let status = gateway
        .wait_exit(Duration::from_secs(15))
        .await
        .expect("the gateway exits once the drain timeout has passed");
    let took = signalled.elapsed();
    assert_eq!(status.code(), Some(0), "{status:?}");
    assert!(
        took >= Duration::from_millis(900),
        "it waited for the call first (exited after {took:?})"
    );
    assert!(
        took < Duration::from_secs(15),
        "exited after {took:?}, not within the drain timeout"
    );
    // The abandoned call gets no answer, certainly not a made-up one.
    match in_flight.await.unwrap() {
        Err(_) => {}
        Ok(answer) => panic!("an abandoned call was answered: {answer:?}"),
    }

    let dir = gateway.dir.clone();
    let temp = gateway.stop();
    let restarted = Gateway::options().dir(&dir).start();
    let calls = restarted.tool_calls(&token, &run).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(
        calls[0].status,
        pb::ToolCallStatus::OutcomeUnknown as i32,
        "{calls:?}"
    );
    drop(restarted);
    drop(temp);
}
