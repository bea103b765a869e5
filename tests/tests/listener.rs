//! The listener of the real binary: TLS start-up errors named before anything is opened, the
//! CLI over TLS and mTLS, load shedding (RESOURCE_EXHAUSTED beyond the call limits, nothing
//! of a refused call in the ledger), the client's deadline, and `toolgate config check/show`.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use toolgate_e2e::pki::TestCa;
use toolgate_e2e::{ExecutionLog, Gateway, authed, execute, gateway_binary, serve_until_exit};
use toolgate_proto::v1 as pb;

/// `toolgate <args>` in `dir` with only the `TOOLGATE_*` variables of `env`.
fn toolgate(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(gateway_binary());
    command.args(args).current_dir(dir);
    for (key, _) in std::env::vars_os() {
        if key.to_str().is_some_and(|k| k.starts_with("TOOLGATE_")) {
            command.env_remove(&key);
        }
    }
    command.env("TOOLGATE_LOG", "warn");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("run toolgate")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn tls_config(cert: &Path, key: &Path, client_ca: Option<&Path>) -> String {
    let mut text = format!(
        "[server.tls]\ncert_file = {:?}\nkey_file = {:?}\n",
        cert.display().to_string(),
        key.display().to_string()
    );
    if let Some(ca) = client_ca {
        text.push_str(&format!(
            "client_ca_file = {:?}\n",
            ca.display().to_string()
        ));
    }
    text
}

#[test]
fn tls_start_up_errors_name_the_problem_before_anything_is_opened() {
    let certs = tempfile::tempdir().unwrap();
    let ca = TestCa::new("listener test ca");
    let server = ca.issue(certs.path(), "server");
    let other = ca.issue(certs.path(), "other");
    let missing = certs.path().join("missing.key");
    let not_pem = certs.path().join("not-pem.pem");
    std::fs::write(&not_pem, "hello\n").unwrap();
    // (config, what the error says)
    let cases: Vec<(String, Vec<String>)> = vec![
        (
            tls_config(&server.cert_file, &missing, None),
            vec![
                "server.tls.key_file".into(),
                missing.display().to_string(),
                "cannot read".into(),
            ],
        ),
        (
            tls_config(&server.cert_file, &other.key_file, None),
            vec![
                "server.tls.key_file".into(),
                "does not match the certificate".into(),
                other.key_file.display().to_string(),
            ],
        ),
        (
            tls_config(&not_pem, &server.key_file, None),
            vec!["server.tls.cert_file".into(), "no PEM certificate".into()],
        ),
        (
            tls_config(&server.cert_file, &server.key_file, Some(&not_pem)),
            vec![
                "server.tls.client_ca_file".into(),
                "no PEM certificate".into(),
            ],
        ),
    ];
    for (config, expected) in cases {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("toolgate.toml"), &config).unwrap();
        let output = serve_until_exit(dir.path());
        let stderr = text(&output.stderr);
        assert!(!output.status.success(), "{config}: must be refused");
        for part in &expected {
            assert!(stderr.contains(part.as_str()), "{config}: {stderr}");
        }
        assert!(!text(&output.stdout).contains("listening"), "no port bound");
        // Checked before the ledger, the keys or the admin token are created.
        for created in ["toolgate.db", "toolgate-keys", "toolgate-admin.token"] {
            assert!(!dir.path().join(created).exists(), "{config}: {created}");
        }
        // `config check` refuses the same configuration the same way.
        let check = toolgate(dir.path(), &["config", "check"], &[]);
        assert!(!check.status.success(), "{config}");
        for part in &expected {
            assert!(
                text(&check.stderr).contains(part.as_str()),
                "{config}: {}",
                text(&check.stderr)
            );
        }
    }
}

/// The admin CLI over TLS (trusting the test CA) and mTLS (with a client certificate).
#[test]
fn the_cli_talks_to_a_tls_and_an_mtls_gateway() {
    let certs = tempfile::tempdir().unwrap();
    let ca = TestCa::new("listener test ca");
    let ca_file = ca.write_cert(certs.path(), "ca.pem");
    let server = ca.issue(certs.path(), "server");
    let client = ca.issue(certs.path(), "client");
    let stranger_ca = TestCa::new("another ca");
    let stranger_ca_file = stranger_ca.write_cert(certs.path(), "stranger-ca.pem");
    let stranger = stranger_ca.issue(certs.path(), "stranger");
    let ca_path = ca_file.display().to_string();

    for client_ca in [None, Some(ca_file.as_path())] {
        let gateway = Gateway::options()
            .config(&tls_config(&server.cert_file, &server.key_file, client_ca))
            .start();
        let port = gateway.url.rsplit(':').next().unwrap().to_owned();
        let https = format!("https://127.0.0.1:{port}");
        let list = |env: &[(&str, &str)]| {
            let mut all = vec![("TOOLGATE_ADDR", https.as_str())];
            all.extend_from_slice(env);
            toolgate(&gateway.dir, &["admin", "tenants", "list"], &all)
        };
        let cert = client.cert_file.display().to_string();
        let key = client.key_file.display().to_string();
        let with_certificate = [
            ("TOOLGATE_CA_FILE", ca_path.as_str()),
            ("TOOLGATE_CLIENT_CERT_FILE", cert.as_str()),
            ("TOOLGATE_CLIENT_KEY_FILE", key.as_str()),
        ];
        let served = list(&with_certificate);
        assert!(
            served.status.success(),
            "mtls {}: {}",
            client_ca.is_some(),
            text(&served.stderr)
        );

        let stranger_path = stranger_ca_file.display().to_string();
        let wrong_ca = list(&[("TOOLGATE_CA_FILE", stranger_path.as_str())]);
        assert!(
            !wrong_ca.status.success(),
            "a client trusting another CA is refused"
        );
        assert!(
            text(&wrong_ca.stderr).contains("cannot reach the gateway"),
            "{}",
            text(&wrong_ca.stderr)
        );

        let plaintext = toolgate(
            &gateway.dir,
            &["admin", "tenants", "list"],
            &[("TOOLGATE_ADDR", gateway.url.as_str())],
        );
        assert!(
            !plaintext.status.success(),
            "plaintext to a TLS listener fails"
        );

        let no_certificate = list(&[("TOOLGATE_CA_FILE", ca_path.as_str())]);
        let stranger_cert = stranger.cert_file.display().to_string();
        let stranger_key = stranger.key_file.display().to_string();
        let foreign_certificate = list(&[
            ("TOOLGATE_CA_FILE", ca_path.as_str()),
            ("TOOLGATE_CLIENT_CERT_FILE", stranger_cert.as_str()),
            ("TOOLGATE_CLIENT_KEY_FILE", stranger_key.as_str()),
        ]);
        match client_ca {
            None => {
                assert!(
                    no_certificate.status.success(),
                    "{}",
                    text(&no_certificate.stderr)
                );
            }
            Some(_) => {
                assert!(
                    !no_certificate.status.success(),
                    "mTLS refuses a client without a certificate"
                );
                assert!(
                    !foreign_certificate.status.success(),
                    "mTLS refuses a certificate of another CA"
                );
            }
        }
    }
}

/// One slow call (`ms` milliseconds, its own timeout well above) with its own `tool_use_id`.
fn slow(run: &str, id: &str, ms: u64) -> pb::ExecuteToolRequest {
    let mut request = execute(run, "testkit.sleep", &format!("{{\"ms\": {ms}}}"));
    request.tool_use_id = id.to_owned();
    request.timeout_ms = ms * 10;
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_beyond_the_limits_are_refused_and_only_executed_ones_are_recorded() {
    let log = ExecutionLog::new();
    let gateway = Gateway::options()
        .env("TOOLGATE_MAX_CONCURRENT_CALLS", "2")
        .env("TOOLGATE_MAX_QUEUED_CALLS", "1")
        .execution_log(&log)
        .start();
    let token = gateway.tenant("acme", "support", &["testkit.sleep"]).await;
    let run = gateway.open_run(&token, "support", 0).await;
    let agent = gateway.agent().await;
    let calls: Vec<_> = (0..6)
        .map(|i| {
            let mut agent = agent.clone();
            let id = format!("toolu_{i}");
            let request = authed(slow(&run, &id, 1500), &token);
            let call = tokio::spawn(async move {
                agent
                    .execute_tool(request)
                    .await
                    .map(tonic::Response::into_inner)
            });
            (id, call)
        })
        .collect();
    // While both slots are busy and the queue is full, the other services still answer.
    log.wait_for(2, Duration::from_secs(10)).await;
    let asked = Instant::now();
    let listed = gateway.tool_calls(&token, &run).await;
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "listing waits for no slot"
    );
    assert_eq!(listed.len(), 2, "{listed:?}");
    let mut succeeded = Vec::new();
    let mut refused = Vec::new();
    for (id, call) in calls {
        match call.await.unwrap() {
            Ok(result) => {
                assert_eq!(
                    result.status,
                    pb::ToolCallStatus::Succeeded as i32,
                    "{result:?}"
                );
                succeeded.push(result.tool_call_id);
            }
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
                assert!(
                    status.message().contains("server.max_concurrent_calls"),
                    "{status:?}"
                );
                assert!(
                    status.message().contains("server.max_queued_calls"),
                    "{status:?}"
                );
                refused.push(id);
            }
        }
    }
    // Two executing and one waiting; the other three were refused at once.
    assert_eq!((succeeded.len(), refused.len()), (3, 3), "{refused:?}");
    let mut recorded: Vec<String> = gateway
        .tool_calls(&token, &run)
        .await
        .into_iter()
        .inspect(|call| {
            assert_eq!(
                call.status,
                pb::ToolCallStatus::Succeeded as i32,
                "{call:?}"
            )
        })
        .map(|call| call.tool_call_id)
        .collect();
    recorded.sort();
    succeeded.sort();
    assert_eq!(
        recorded, succeeded,
        "the ledger holds exactly the executed calls"
    );
    assert_eq!(log.entries().len(), 3, "refused calls were never executed");
    assert!(gateway.verify_ledger().await.ok);
    // A refused call may be retried with its tool_use_id: nothing was recorded for it.
    for id in &refused {
        let result = gateway.execute(&token, slow(&run, id, 1)).await;
        assert_eq!(
            result.status,
            pb::ToolCallStatus::Succeeded as i32,
            "{id}: {result:?}"
        );
        assert!(!result.replayed, "{id}: {result:?}");
    }
    assert_eq!(gateway.tool_calls(&token, &run).await.len(), 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_whose_deadline_passes_while_queued_is_not_executed() {
    let log = ExecutionLog::new();
    let gateway = Gateway::options()
        .env("TOOLGATE_MAX_CONCURRENT_CALLS", "1")
        .execution_log(&log)
        .start();
    let token = gateway.tenant("acme", "support", &["testkit.sleep"]).await;
    let run = gateway.open_run(&token, "support", 0).await;
    let mut agent = gateway.agent().await;
    let busy = {
        let mut agent = agent.clone();
        let request = authed(slow(&run, "toolu_busy", 2000), &token);
        tokio::spawn(async move { agent.execute_tool(request).await })
    };
    log.wait_for(1, Duration::from_secs(10)).await;
    let mut request = authed(slow(&run, "toolu_late", 10), &token);
    request.set_timeout(Duration::from_millis(300));
    let sent = Instant::now();
    let status = agent.execute_tool(request).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().contains("not executed"), "{status:?}");
    assert!(
        sent.elapsed() < Duration::from_millis(1500),
        "answered at its deadline, not after the busy call"
    );
    busy.await.unwrap().expect("the busy call succeeds");
    let calls = gateway.tool_calls(&token, &run).await;
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].tool_use_id, "toolu_busy");
    assert_eq!(log.entries().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_executing_call_ends_at_the_callers_deadline_and_is_recorded() {
    let log = ExecutionLog::new();
    let gateway = Gateway::options().execution_log(&log).start();
    let token = gateway.tenant("acme", "support", &["testkit.sleep"]).await;
    let run = gateway.open_run(&token, "support", 0).await;
    let mut agent = gateway.agent().await;
    // The tool would sleep 5 s under a 50 s timeout; the caller waits 400 ms.
    let mut request = authed(slow(&run, "toolu_impatient", 5000), &token);
    request.set_timeout(Duration::from_millis(400));
    let sent = Instant::now();
    match agent.execute_tool(request).await {
        // The engine's timeout, capped by the deadline, answered first.
        Ok(result) => assert_eq!(
            result.into_inner().status,
            pb::ToolCallStatus::TimedOut as i32
        ),
        // Or the server gave up at the deadline while the engine recorded the timeout.
        Err(status) => assert!(
            matches!(
                status.code(),
                tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
            ),
            "{status:?}"
        ),
    }
    assert!(
        sent.elapsed() < Duration::from_secs(3),
        "{:?}",
        sent.elapsed()
    );
    // The call is settled in the ledger as timed out, well before the tool would have answered.
    let settled = Instant::now();
    loop {
        let calls = gateway.tool_calls(&token, &run).await;
        assert_eq!(calls.len(), 1, "{calls:?}");
        if calls[0].status == pb::ToolCallStatus::TimedOut as i32 {
            break;
        }
        assert_eq!(
            calls[0].status,
            pb::ToolCallStatus::Running as i32,
            "{calls:?}"
        );
        assert!(
            settled.elapsed() < Duration::from_secs(3),
            "still running: {calls:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(log.entries().len(), 1);
}

#[test]
fn config_check_and_show_go_through_the_same_validation_as_serve() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("gateway.toml");
    let file_arg = file.display().to_string();

    // Bad files: exit 1 naming the key.
    let cases: &[(&str, &str)] = &[
        (
            "[server]\nmax_concurrent_calls = 0\n",
            "server.max_concurrent_calls",
        ),
        ("[server]\nlisten = \"127.0.0.1:0\"\nport = 5\n", "port"),
        (
            "[server.tls]\ncert_file = \"server.pem\"\n",
            "server.tls.key_file",
        ),
        ("[engine]\nmax_timeout_ms = 0\n", "engine.max_timeout_ms"),
    ];
    for (config, key) in cases {
        std::fs::write(&file, config).unwrap();
        for command in ["check", "show"] {
            let output = toolgate(dir.path(), &["config", command, "--config", &file_arg], &[]);
            assert_eq!(output.status.code(), Some(1), "{command} {config:?}");
            assert!(
                text(&output.stderr).contains(key),
                "{command} {config:?}: {}",
                text(&output.stderr)
            );
        }
    }
    let unknown = toolgate(
        dir.path(),
        &["config", "check"],
        &[("TOOLGATE_MAX_QUEUED_CALS", "1")],
    );
    assert_eq!(unknown.status.code(), Some(1));
    assert!(
        text(&unknown.stderr).contains("did you mean TOOLGATE_MAX_QUEUED_CALLS?"),
        "{}",
        text(&unknown.stderr)
    );

    // A good file: one OK line; a warning for plaintext on a non-loopback address.
    std::fs::write(
        &file,
        "[server]\nlisten = \"0.0.0.0:50051\"\nmax_queued_calls = 3\n",
    )
    .unwrap();
    let output = toolgate(dir.path(), &["config", "check", "--config", &file_arg], &[]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    assert!(stdout.starts_with("configuration OK"), "{stdout}");
    assert_eq!(stdout.lines().count(), 1, "{stdout}");
    assert!(
        text(&output.stderr).contains("clear text"),
        "{}",
        text(&output.stderr)
    );
    assert!(
        !dir.path().join("toolgate.db").exists(),
        "check opens nothing"
    );

    // `show`: defaults filled in, the environment applied, secrets elided.
    let secret_env = [
        (
            "TOOLGATE_DATABASE",
            "postgres://toolgate:hunter2@127.0.0.1:5432/gw?sslpassword=hunter2",
        ),
        (
            "TOOLGATE_MASTER_KEYS",
            "k1=BwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSY=",
        ),
        ("TOOLGATE_MAX_CONCURRENT_CALLS", "7"),
    ];
    let toml_output = toolgate(
        dir.path(),
        &["config", "show", "--config", &file_arg],
        &secret_env,
    );
    assert!(
        toml_output.status.success(),
        "{}",
        text(&toml_output.stderr)
    );
    let json_output = toolgate(
        dir.path(),
        &["config", "show", "--config", &file_arg, "--format", "json"],
        &secret_env,
    );
    assert!(
        json_output.status.success(),
        "{}",
        text(&json_output.stderr)
    );
    for output in [&toml_output, &json_output] {
        let shown = text(&output.stdout);
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("BwgJCgsM"), "{shown}");
        assert!(shown.contains("[REDACTED]"), "{shown}");
    }
    let json: serde_json::Value = serde_json::from_slice(&json_output.stdout).expect("JSON");
    assert_eq!(json["server"]["listen"], "0.0.0.0:50051");
    assert_eq!(json["server"]["max_concurrent_calls"], 7);
    assert_eq!(json["server"]["max_queued_calls"], 3);
    // On PostgreSQL the runtime has a worker on every core (no writer thread of its own).
    let cores = cores();
    assert_eq!(json["server"]["worker_threads"], cores);
    assert_eq!(json["server"]["drain_timeout_ms"], 30000);
    assert_eq!(
        json["storage"]["database"],
        "postgres://toolgate@127.0.0.1:5432/gw"
    );
    assert_eq!(json["engine"]["max_timeout_ms"], 300000);
    assert_eq!(json["secrets"]["master_keys"], "[REDACTED]");
    let shown_toml = text(&toml_output.stdout);
    assert!(
        shown_toml.contains("[server]") && shown_toml.contains("max_concurrent_calls = 7"),
        "{shown_toml}"
    );
}

/// The cores this machine gives a process (what the gateway sizes its runtime from).
fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// The runtime's size, as an operator meets it: on the embedded ledger every core but one by
/// default (the ledger's writer is a thread of its own), `TOOLGATE_WORKER_THREADS` when set.
/// The start-up line says which, and the gateway serves calls either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_runtime_leaves_the_sqlite_writer_a_core_unless_configured() {
    let cores = cores();
    for (configured, expected) in [(None, cores.saturating_sub(1).max(1)), (Some("3"), 3)] {
        let mut options = Gateway::options()
            .envs(&[("TOOLGATE_LOG_FORMAT", "json"), ("TOOLGATE_LOG", "info")])
            .stderr_to_file();
        if let Some(threads) = configured {
            options = options.env("TOOLGATE_WORKER_THREADS", threads);
        }
        let gateway = options.start();
        let token = gateway.tenant("acme", "support", &["testkit.echo"]).await;
        let run = gateway.open_run(&token, "support", 0).await;
        let answered = gateway
            .agent()
            .await
            .execute_tool(authed(
                execute(&run, "testkit.echo", r#"{"message": "hi"}"#),
                &token,
            ))
            .await
            .expect("the call is served")
            .into_inner();
        assert_eq!(
            answered.status,
            pb::ToolCallStatus::Succeeded as i32,
            "{configured:?}: {} {}",
            answered.error_code,
            answered.error_message
        );
        let stderr = gateway.stderr();
        let listening = stderr
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .find(|line| line["message"] == "toolgate listening")
            .unwrap_or_else(|| panic!("no start-up line: {stderr}"));
        assert_eq!(
            listening["fields"]["worker_threads"],
            serde_json::json!(expected),
            "{configured:?} on {cores} cores: {listening}"
        );
    }
}
