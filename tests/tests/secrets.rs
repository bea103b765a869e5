//! Tenant credentials through the real gateway: sealed values and references reach only the
//! declaring tool of their own tenant, keys rotate and rewrap online without failed calls,
//! and start-up refuses a ledger whose keys are missing.

use toolgate_e2e::{Gateway, authed, execute, serve_until_exit};
use toolgate_proto::v1 as pb;

const TOOLS: &[&str] = &["testkit.whoami", "testkit.noop"];

async fn whoami(gateway: &Gateway, token: &str) -> pb::ToolCallResult {
    let run = gateway.open_run(token, "support", 0).await;
    gateway.call(token, &run, "testkit.whoami", "{}").await
}

fn key_len(result: &pb::ToolCallResult) -> u64 {
    let value: serde_json::Value =
        serde_json::from_str(&result.result_json).unwrap_or_else(|_| panic!("{result:?}"));
    value["key_len"].as_u64().unwrap()
}

#[tokio::test]
async fn a_sealed_secret_reaches_only_its_tenant_and_never_shows() {
    let gateway = Gateway::start();
    let acme = gateway.tenant("acme", "support", TOOLS).await;
    let globex = gateway.tenant("globex", "support", TOOLS).await;
    let secret = "sk-acme-0123456789abcdef";

    // The CLI reads the value from standard input, never from its arguments.
    let printed = gateway.secrets_put(
        "acme",
        "testkit_key",
        &["--notes", "test key"],
        &format!("{secret}\n"),
    );
    assert!(!printed.contains(secret), "{printed}");

    assert_eq!(
        key_len(&whoami(&gateway, &acme).await),
        u64::try_from(secret.len()).unwrap()
    );
    let other = whoami(&gateway, &globex).await;
    assert_eq!(other.error_code, "CREDENTIALS_NOT_FOUND", "{other:?}");

    let listed = gateway
        .admin()
        .await
        .list_secrets(authed(
            pb::ListSecretsRequest {
                tenant_id: "acme".into(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap()
        .into_inner()
        .secrets;
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].kind.as_str(), listed[0].key_id.as_str()),
        ("sealed", "k1")
    );
    assert!(!format!("{listed:?}").contains(secret));

    let dir = gateway.dir.clone();
    let _temp = gateway.stop();
    for file in ["toolgate.db", "toolgate.db-wal"] {
        let bytes = std::fs::read(dir.join(file)).unwrap_or_default();
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret.as_bytes()),
            "plaintext in {file}"
        );
    }
}

#[tokio::test]
async fn references_are_read_at_use() {
    let temp = tempfile::tempdir().unwrap();
    let gateway = Gateway::start_in(temp.path(), &[("ACME_TESTKIT_KEY", "from-the-environment")]);
    let acme = gateway.tenant("acme", "support", TOOLS).await;
    let mut admin = gateway.admin().await;
    let reference = |reference: &str| pb::PutSecretReferenceRequest {
        tenant_id: "acme".into(),
        name: "testkit_key".into(),
        reference: reference.into(),
        metadata_json: String::new(),
        notes: String::new(),
    };
    let refused = admin
        .put_secret_reference(authed(reference("aws-sm:arn:x"), &gateway.admin_token))
        .await
        .unwrap_err();
    assert!(refused.message().contains("not supported"), "{refused}");
    admin
        .put_secret_reference(authed(
            reference("env:ACME_TESTKIT_KEY"),
            &gateway.admin_token,
        ))
        .await
        .unwrap();
    assert_eq!(key_len(&whoami(&gateway, &acme).await), 20);
    admin
        .put_secret_reference(authed(
            reference("env:NOT_SET_ANYWHERE"),
            &gateway.admin_token,
        ))
        .await
        .unwrap();
    let missing = whoami(&gateway, &acme).await;
    // Configured, but unreadable: not the same as a secret nobody configured.
    assert_eq!(missing.error_code, "CREDENTIALS_UNAVAILABLE");
    assert!(
        missing.error_message.contains("NOT_SET_ANYWHERE"),
        "{}",
        missing.error_message
    );
}

#[tokio::test]
async fn rotate_and_rewrap_during_load_fail_no_call() {
    let gateway = Gateway::start();
    let acme = gateway.tenant("acme", "support", TOOLS).await;
    let mut admin = gateway.admin().await;
    let admin_token = gateway.admin_token.clone();
    gateway
        .put_secret("acme", "testkit_key", "twelve-chars")
        .await;

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut workers = Vec::new();
    for _ in 0..4 {
        let channel = gateway.channel().await;
        let token = acme.clone();
        let stop = std::sync::Arc::clone(&stop);
        workers.push(tokio::spawn(async move {
            let mut agent =
                toolgate_proto::v1::agent_service_client::AgentServiceClient::new(channel);
            let run = agent
                .create_run(authed(
                    pb::CreateRunRequest {
                        agent_id: "support".into(),
                        run_id: String::new(),
                        max_calls: 100_000,
                    },
                    &token,
                ))
                .await
                .unwrap()
                .into_inner()
                .run_id;
            let (mut ok, mut failed) = (0u32, Vec::new());
            for _ in 0..2_000 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                let result = agent
                    .execute_tool(authed(execute(&run, "testkit.whoami", "{}"), &token))
                    .await
                    .unwrap()
                    .into_inner();
                if result.status() == pb::ToolCallStatus::Succeeded
                    && result.result_json.contains("\"key_len\":12")
                {
                    ok += 1;
                } else {
                    failed.push(format!("{} {}", result.error_code, result.error_message));
                }
            }
            (ok, failed)
        }));
    }
    let retirer = gateway.admin().await;
    let retire_k1 = || {
        let mut admin = retirer.clone();
        let request = authed(
            pb::RetireKeyRequest {
                key_id: "k1".into(),
            },
            &admin_token,
        );
        async move { admin.retire_key(request).await }
    };
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let in_use = retire_k1().await.unwrap_err();
    assert!(in_use.message().contains("active key"), "{in_use}");
    let rotated = admin
        .rotate_key(authed(pb::RotateKeyRequest {}, &admin_token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rotated.active_key_id, "k2");
    let still_needed = retire_k1().await.unwrap_err();
    assert!(still_needed.message().contains("rewrap"), "{still_needed}");
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let rewrapped = admin
        .rewrap_secrets(authed(pb::RewrapSecretsRequest {}, &admin_token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rewrapped.rewrapped, 1);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let retired = retire_k1().await.unwrap().into_inner();
    assert_eq!(retired.key_ids, vec!["k2"]);
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut total = 0;
    for worker in workers {
        let (ok, failed) = worker.await.unwrap();
        assert!(
            failed.is_empty(),
            "failed calls during rotation: {failed:?}"
        );
        total += ok;
    }
    assert!(total > 20, "load ran during the rotation: {total} calls");
    let key_file = std::fs::read_to_string(gateway.dir.join("toolgate-keys")).unwrap();
    assert!(
        key_file.contains("k2=") && !key_file.contains("k1="),
        "{key_file}"
    );
}

#[tokio::test]
async fn start_up_refuses_a_ledger_whose_key_is_missing() {
    let gateway = Gateway::start();
    gateway.tenant("acme", "support", TOOLS).await;
    gateway.put_secret("acme", "testkit_key", "v").await;
    let dir = gateway.dir.clone();
    let _temp = gateway.stop();
    // Replace the key file with one holding a different key.
    let other = "k9=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=\n";
    std::fs::write(dir.join("toolgate-keys"), other).unwrap();
    let output = serve_until_exit(&dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains("`k1`") && stderr.contains("not loaded"),
        "{stderr}"
    );
    std::fs::write(dir.join("toolgate-keys"), "k1=short\n").unwrap();
    let output = serve_until_exit(&dir);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("k1") && stderr.contains("base64"),
        "{stderr}"
    );
}
