//! The real gateway binary over gRPC on a loopback port: the chokepoint's outcomes, auth and
//! tenant isolation, redaction, and tamper detection.

use std::process::Command;
use std::time::{Duration, Instant};

use toolgate_e2e::{Gateway, authed, execute, gateway_binary};
use toolgate_proto::v1 as pb;

const TOOLS: &[&str] = &[
    "testkit.noop",
    "testkit.echo",
    "testkit.sleep",
    "testkit.panic",
    "testkit.transfer",
];

#[tokio::test]
async fn happy_path_lists_tools_and_executes() {
    let gateway = Gateway::start();
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    let mut agent = gateway.agent().await;

    let tools = gateway.list_tools(&token, &run).await;
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(
        names,
        TOOLS
            .iter()
            .copied()
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect::<Vec<_>>()
    );
    let echo = tools.iter().find(|t| t.name == "testkit.echo").unwrap();
    let anthropic: serde_json::Value = serde_json::from_str(&echo.anthropic_json).unwrap();
    assert_eq!(anthropic["name"], "testkit__echo");
    assert_eq!(anthropic["input_schema"]["type"], "object");
    let openai: serde_json::Value = serde_json::from_str(&echo.openai_json).unwrap();
    assert_eq!(openai["function"]["name"], "testkit__echo");

    let result = gateway
        .call(&token, &run, "testkit.echo", r#"{"message": "hello"}"#)
        .await;
    assert_eq!(result.status(), pb::ToolCallStatus::Succeeded, "{result:?}");
    let value: serde_json::Value = serde_json::from_str(&result.result_json).unwrap();
    assert_eq!(value["message"], "hello");

    let listed = agent
        .list_tool_calls(authed(
            pb::ListToolCallsRequest {
                run_id: run.clone(),
                page_token: String::new(),
                page_size: 0,
            },
            &token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(listed.tool_calls.len(), 1);
    assert_eq!(listed.tool_calls[0].tool_call_id, result.tool_call_id);
}

#[tokio::test]
async fn outcomes_carry_their_stable_codes() {
    let gateway = Gateway::start();
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let policy = r#"
        @id("base") permit(principal, action, resource);
        @id("no-paris") forbid(principal, action == Toolgate::Action::"testkit.transfer", resource)
            when { context.args.region == "eu-west-3" };
        @id("big") @decision("require_expert_approval")
        permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
            when { context.args.amount > 1000 };
    "#;
    gateway.put_policy("acme", policy).await;
    let run = gateway.open_run(&token, "support", 0).await;
    let mut agent = gateway.agent().await;
    let oversize = format!(r#"{{"message": "{}"}}"#, "x".repeat(1024 * 1024 + 10));
    let cases: Vec<(&str, String, pb::ToolCallStatus, &str)> = vec![
        (
            "testkit.fail",
            "{}".into(),
            pb::ToolCallStatus::Blocked,
            "NOT_IN_MANIFEST",
        ),
        (
            "testkit.echo",
            r#"{"message": 1}"#.into(),
            pb::ToolCallStatus::Failed,
            "INVALID_ARGUMENTS",
        ),
        (
            "testkit.echo",
            "{not json".into(),
            pb::ToolCallStatus::Failed,
            "INVALID_ARGUMENTS",
        ),
        (
            "testkit.echo",
            oversize,
            pb::ToolCallStatus::Failed,
            "INVALID_ARGUMENTS",
        ),
        (
            "testkit.transfer",
            r#"{"amount": 1, "region": "eu-west-3", "account": "a"}"#.into(),
            pb::ToolCallStatus::Blocked,
            "POLICY_BLOCKED",
        ),
        (
            "testkit.transfer",
            r#"{"amount": 5000, "region": "us-east-1", "account": "a"}"#.into(),
            pb::ToolCallStatus::WaitingApproval,
            "",
        ),
        (
            "testkit.panic",
            "{}".into(),
            pb::ToolCallStatus::Failed,
            "INTERNAL",
        ),
        (
            "testkit.noop",
            "{}".into(),
            pb::ToolCallStatus::Succeeded,
            "",
        ),
    ];
    for (tool, arguments, status, code) in cases {
        let result = gateway.call(&token, &run, tool, &arguments).await;
        assert_eq!(
            (result.status(), result.error_code.as_str()),
            (status, code),
            "{tool}: {result:?}"
        );
        if status == pb::ToolCallStatus::WaitingApproval {
            assert!(!result.pending_invocation_id.is_empty());
            assert_eq!(result.decision, "require_expert_approval");
        }
        let recorded = gateway.get_tool_call(&token, &result.tool_call_id).await;
        assert_eq!(recorded.status(), status, "{tool}");
    }
    let run_state = agent
        .get_run(authed(pb::GetRunRequest { run_id: run }, &token))
        .await
        .unwrap()
        .into_inner();
    // The approval request and the POLICY_DENIED row of the blocked transfer.
    assert_eq!(run_state.pending_approvals, 2);
    assert_eq!(run_state.status, "waiting_approval");
}

#[tokio::test]
async fn feature_flag_off_blocks_calls() {
    let gateway = Gateway::start();
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    gateway.set_tool_calling("acme", false).await;
    let result = gateway.call(&token, &run, "testkit.noop", "{}").await;
    assert_eq!(result.error_code, "FEATURE_DISABLED");
    assert_eq!(result.status(), pb::ToolCallStatus::Blocked);
}

#[tokio::test]
async fn a_hanging_connector_times_out_and_the_server_keeps_serving() {
    let gateway = Gateway::start();
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    let mut agent = gateway.agent().await;
    let mut request = execute(&run, "testkit.sleep", r#"{"ms": 600000}"#);
    request.timeout_ms = 300;
    let started = Instant::now();
    let result = agent
        .execute_tool(authed(request, &token))
        .await
        .unwrap()
        .into_inner();
    let elapsed = started.elapsed();
    assert_eq!(
        (result.status(), result.error_code.as_str()),
        (pb::ToolCallStatus::TimedOut, "TIMEOUT")
    );
    assert!(
        elapsed >= Duration::from_millis(300) && elapsed < Duration::from_millis(1300),
        "{elapsed:?}"
    );
    let recorded = gateway.get_tool_call(&token, &result.tool_call_id).await;
    assert_eq!(recorded.status(), pb::ToolCallStatus::TimedOut);
    let panicked = gateway.call(&token, &run, "testkit.panic", "{}").await;
    assert_eq!(panicked.error_code, "INTERNAL");
    let after = gateway.call(&token, &run, "testkit.noop", "{}").await;
    assert_eq!(after.status(), pb::ToolCallStatus::Succeeded);
}

#[tokio::test]
async fn tokens_are_required_and_scoped() {
    let gateway = Gateway::start();
    let acme = gateway.tenant("acme", "support", TOOLS).await;
    let globex = gateway.tenant("globex", "support", TOOLS).await;
    let run = gateway.open_run(&acme, "support", 0).await;
    let mut agent = gateway.agent().await;

    let missing = agent
        .execute_tool(tonic::Request::new(execute(&run, "testkit.noop", "{}")))
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unauthenticated);
    let wrong = agent
        .execute_tool(authed(
            execute(&run, "testkit.noop", "{}"),
            "tg_agent_not-a-real-token",
        ))
        .await
        .unwrap_err();
    assert_eq!(wrong.code(), tonic::Code::Unauthenticated);

    let call = gateway.call(&acme, &run, "testkit.noop", "{}").await;
    let other_run = agent
        .get_run(authed(
            pb::GetRunRequest {
                run_id: run.clone(),
            },
            &globex,
        ))
        .await
        .unwrap_err();
    assert_eq!(other_run.code(), tonic::Code::NotFound);
    let other_call = agent
        .get_tool_call(authed(
            pb::GetToolCallRequest {
                tool_call_id: call.tool_call_id,
            },
            &globex,
        ))
        .await
        .unwrap_err();
    assert_eq!(other_call.code(), tonic::Code::NotFound);
    let other_list = agent
        .list_tool_calls(authed(
            pb::ListToolCallsRequest {
                run_id: run.clone(),
                page_token: String::new(),
                page_size: 0,
            },
            &globex,
        ))
        .await
        .unwrap_err();
    assert_eq!(other_list.code(), tonic::Code::NotFound);
    let other_exec = agent
        .execute_tool(authed(execute(&run, "testkit.noop", "{}"), &globex))
        .await
        .unwrap_err();
    assert_eq!(other_exec.code(), tonic::Code::NotFound);

    let admin_with_agent_token = gateway
        .admin()
        .await
        .list_tenants(authed(pb::ListTenantsRequest {}, &acme))
        .await
        .unwrap_err();
    assert_eq!(admin_with_agent_token.code(), tonic::Code::PermissionDenied);
    let agent_with_admin_token = agent
        .create_run(authed(
            pb::CreateRunRequest {
                agent_id: "support".into(),
                run_id: String::new(),
                max_calls: 0,
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap_err();
    assert_eq!(agent_with_admin_token.code(), tonic::Code::PermissionDenied);
}

#[tokio::test]
async fn token_like_arguments_are_redacted_in_the_ledger() {
    let gateway = Gateway::start();
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    let secret = "sk_live_51HxSECRETVALUE";
    let arguments = format!(r#"{{"message": "hi", "api_token": "{secret}"}}"#);
    let result = gateway.call(&token, &run, "testkit.echo", &arguments).await;
    assert!(
        result.result_json.contains(secret),
        "the agent gets the full result"
    );
    let recorded = gateway.get_tool_call(&token, &result.tool_call_id).await;
    assert!(
        !recorded.input_redacted_json.contains(secret),
        "{}",
        recorded.input_redacted_json
    );
    assert!(
        !recorded.output_redacted_json.contains(secret),
        "{}",
        recorded.output_redacted_json
    );
    assert!(recorded.input_redacted_json.contains("[REDACTED]"));
    let dir = gateway.dir.clone();
    let _temp = gateway.stop();
    let database = std::fs::read(dir.join("toolgate.db")).unwrap_or_default();
    let wal = std::fs::read(dir.join("toolgate.db-wal")).unwrap_or_default();
    let needle = secret.as_bytes();
    for bytes in [&database, &wal] {
        assert!(
            !bytes.windows(needle.len()).any(|w| w == needle),
            "the secret is in the database file"
        );
    }
}

#[tokio::test]
async fn unknown_tool_after_a_connector_is_removed() {
    let gateway = Gateway::start();
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    let dir = gateway.dir.clone();
    let temp = gateway.stop();
    let restarted = Gateway::start_in(&dir, &[("TOOLGATE_DISABLED_CONNECTORS", "testkit")]);
    let result = restarted.call(&token, &run, "testkit.noop", "{}").await;
    assert_eq!(result.error_code, "UNKNOWN_TOOL", "{result:?}");
    assert!(
        result.error_message.contains("registered tools"),
        "{}",
        result.error_message
    );
    drop(restarted);
    drop(temp);
}

#[tokio::test]
async fn ledger_verify_finds_a_tampered_audit_row() {
    let gateway = Gateway::start();
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    for i in 0..3 {
        let message = format!(r#"{{"message": "m{i}"}}"#);
        gateway.call(&token, &run, "testkit.echo", &message).await;
    }
    let remote = gateway.verify_ledger().await;
    assert!(remote.ok, "{remote:?}");
    let dir = gateway.dir.clone();
    let _temp = gateway.stop();
    let database = dir.join("toolgate.db");

    let verify = || {
        Command::new(gateway_binary())
            .args(["ledger", "verify", "--database"])
            .arg(&database)
            // With the gateway's master keys, so the events' MACs are checked.
            .arg("--key-file")
            .arg(dir.join("toolgate-keys"))
            .env("TOOLGATE_LOG", "warn")
            .output()
            .expect("run toolgate ledger verify")
    };
    let clean = verify();
    assert!(
        clean.status.success(),
        "{}{}",
        String::from_utf8_lossy(&clean.stdout),
        String::from_utf8_lossy(&clean.stderr)
    );

    // An attacker with write access to the file: drop the append-only guard, edit one event.
    let tamper = Command::new("python3")
        .arg("-c")
        .arg(
            "import sqlite3,sys\n\
             db=sqlite3.connect(sys.argv[1])\n\
             for (name,) in db.execute(\"select name from sqlite_master where type='trigger'\").fetchall():\n\
             \tdb.execute('drop trigger '+name)\n\
             db.execute(\"update audit_events set payload='{}' where seq=(select min(seq)+4 from audit_events)\")\n\
             n=db.total_changes\n\
             db.commit()\n\
             print(n)",
        )
        .arg(&database)
        .output()
        .expect("python3 for tampering");
    assert!(
        tamper.status.success(),
        "{}",
        String::from_utf8_lossy(&tamper.stderr)
    );
    let tampered = verify();
    let stdout = String::from_utf8_lossy(&tampered.stdout);
    assert!(!tampered.status.success(), "verify must fail: {stdout}");
    assert!(stdout.contains("\"kind\": \"edited\""), "{stdout}");
}

#[tokio::test]
async fn health_service_reports_serving() {
    let gateway = Gateway::start();
    let mut health = tonic_health::pb::health_client::HealthClient::new(gateway.channel().await);
    let response = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        response.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
}

#[tokio::test]
async fn a_call_interrupted_by_a_crash_is_outcome_unknown_after_restart() {
    let gateway = Gateway::start();
    let token = gateway.tenant("acme", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    let mut agent = gateway.agent().await;
    let mut request = execute(&run, "testkit.sleep", r#"{"ms": 600000}"#);
    request.timeout_ms = 600_000;
    request.tool_use_id = "toolu_crash".into();
    let token_for_call = token.clone();
    let in_flight =
        tokio::spawn(async move { agent.execute_tool(authed(request, &token_for_call)).await });
    // Wait until the call's `running` row is committed, then kill the process outright.
    let mut call_id = String::new();
    for _ in 0..200 {
        let calls = gateway.tool_calls(&token, &run).await;
        if let Some(call) = calls.first() {
            assert_eq!(call.status(), pb::ToolCallStatus::Running);
            call_id = call.tool_call_id.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!call_id.is_empty(), "the call was recorded as running");
    let dir = gateway.dir.clone();
    let temp = gateway.stop();
    assert!(
        in_flight.await.unwrap().is_err(),
        "the caller saw the connection drop"
    );

    let restarted = Gateway::start_in(&dir, &[]);
    let recorded = restarted.get_tool_call(&token, &call_id).await;
    assert_eq!(recorded.status(), pb::ToolCallStatus::OutcomeUnknown);
    assert_eq!(recorded.error_code, "OUTCOME_UNKNOWN");
    // The runtime's retry of the same tool_use_id gets the recorded outcome, not a second run.
    let replay = restarted
        .call_with_id(
            &token,
            &run,
            "toolu_crash",
            "testkit.sleep",
            r#"{"ms": 600000}"#,
        )
        .await;
    assert!(replay.replayed);
    assert_eq!(replay.tool_call_id, call_id);
    assert_eq!(replay.status(), pb::ToolCallStatus::OutcomeUnknown);
    drop(restarted);
    drop(temp);
}
