//! Errors that neither leak nor mislead: a ledger broken under a running gateway answers by
//! kind with no SQL text (to unauthenticated and authenticated callers alike), a credential
//! that no longer decrypts or cannot be read is CREDENTIALS_UNAVAILABLE (not "not found"), and
//! a token of the wrong role is PERMISSION_DENIED saying so.

use sqlx::Connection as _;
use toolgate_e2e::{Gateway, PgSchema, authed, execute};
use toolgate_proto::v1 as pb;

/// Words of the database that must never reach a caller.
const DATABASE_WORDS: &[&str] = &[
    "relation",
    "does not exist",
    "SELECT",
    "api_tokens",
    "runs",
    "tenant_tool_secrets",
    "schema",
    "SQL",
    "tg_e2e_",
];

fn assert_no_sql(status: &tonic::Status, who: &str) {
    for word in DATABASE_WORDS {
        assert!(
            !status.message().contains(word),
            "{who}: the message names `{word}`: {}",
            status.message()
        );
    }
}

/// Runs `sql` in the test's schema through a connection of its own (an operator's mistake, a
/// failed migration), under the running gateway.
async fn break_schema(schema: &PgSchema, sql: &str) {
    let mut connection = sqlx::PgConnection::connect(schema.url()).await.unwrap();
    let statement = format!(
        "SET lock_timeout = '30s'; SET search_path TO \"{}\"; {sql}",
        schema.name()
    );
    sqlx::raw_sql(sqlx::AssertSqlSafe(statement))
        .execute(&mut connection)
        .await
        .unwrap();
    connection.close().await.unwrap();
}

async fn get_run(gateway: &Gateway, token: &str, run: &str) -> Result<pb::Run, tonic::Status> {
    gateway
        .agent()
        .await
        .get_run(authed(pb::GetRunRequest { run_id: run.into() }, token))
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test]
async fn a_broken_ledger_answers_internal_without_sql_text() {
    let schema = PgSchema::new().await;
    let gateway = Gateway::start_pg(&schema);
    let token = gateway.tenant("acme", "support", &["testkit.echo"]).await;
    let run = gateway.open_run(&token, "support", 0).await;
    get_run(&gateway, &token, &run)
        .await
        .expect("healthy first");

    // The runs table is gone: an authenticated caller's read fails.
    break_schema(&schema, "DROP TABLE runs CASCADE").await;
    let failed = get_run(&gateway, &token, &run).await.unwrap_err();
    assert_eq!(failed.code(), tonic::Code::Internal, "{failed:?}");
    assert!(failed.message().contains("ledger failed"), "{failed:?}");
    assert_no_sql(&failed, "authenticated GetRun");
    let failed = gateway
        .try_execute(
            &token,
            execute(&run, "testkit.echo", r#"{"message": "hi"}"#),
        )
        .await
        .unwrap_err();
    assert_eq!(failed.code(), tonic::Code::Internal, "{failed:?}");
    assert_no_sql(&failed, "authenticated ExecuteTool");

    // The whole schema is gone: even the token lookup of a caller without a valid token fails,
    // and says nothing about the database.
    break_schema(
        &schema,
        &format!("DROP SCHEMA \"{}\" CASCADE", schema.name()),
    )
    .await;
    let failed = get_run(&gateway, "tg_agent_not-a-real-token", &run)
        .await
        .unwrap_err();
    assert_eq!(failed.code(), tonic::Code::Internal, "{failed:?}");
    assert_no_sql(&failed, "unauthenticated GetRun");
    let failed = gateway
        .admin()
        .await
        .list_tenants(authed(pb::ListTenantsRequest {}, &gateway.admin_token))
        .await
        .unwrap_err();
    assert_eq!(failed.code(), tonic::Code::Internal, "{failed:?}");
    assert_no_sql(&failed, "admin ListTenants");
}

async fn whoami(gateway: &Gateway, token: &str) -> pb::ToolCallResult {
    let run = gateway.open_run(token, "support", 0).await;
    // A credential failure is an answer, not a gRPC error.
    gateway.call(token, &run, "testkit.whoami", "{}").await
}

#[tokio::test]
async fn an_unreadable_credential_is_unavailable_not_missing() {
    let schema = PgSchema::new().await;
    let gateway = Gateway::start_pg(&schema);
    let token = gateway.tenant("acme", "support", &["testkit.whoami"]).await;
    let missing = whoami(&gateway, &token).await;
    assert_eq!(missing.error_code, "CREDENTIALS_NOT_FOUND", "{missing:?}");

    let secret = "sk-acme-0123456789abcdef";
    gateway.put_secret("acme", "testkit_key", secret).await;
    // One character of the sealed value changed in the database: it no longer decrypts (the
    // AES-GCM tag fails), though the row and its key are there.
    break_schema(
        &schema,
        "UPDATE tenant_tool_secrets SET value = left(value, length(value) - 4) || \
         CASE WHEN substr(value, length(value) - 3, 1) = 'A' THEN 'B' ELSE 'A' END || \
         right(value, 3) WHERE name = 'testkit_key'",
    )
    .await;
    let damaged = whoami(&gateway, &token).await;
    assert_eq!(
        damaged.status,
        pb::ToolCallStatus::Failed as i32,
        "{damaged:?}"
    );
    assert_eq!(damaged.error_code, "CREDENTIALS_UNAVAILABLE", "{damaged:?}");
    assert!(
        damaged.error_message.contains("could not be decrypted"),
        "{}",
        damaged.error_message
    );
    assert!(!damaged.error_message.contains(secret));

    // The credential table is gone: reading it fails, which is not "not found" either, and
    // the agent is told nothing about the database.
    break_schema(&schema, "DROP TABLE tenant_tool_secrets CASCADE").await;
    let outage = whoami(&gateway, &token).await;
    assert_eq!(outage.error_code, "CREDENTIALS_UNAVAILABLE", "{outage:?}");
    for word in DATABASE_WORDS {
        assert!(
            !outage.error_message.contains(word),
            "names `{word}`: {}",
            outage.error_message
        );
    }
}

#[tokio::test]
async fn a_wrong_role_is_permission_denied_and_a_bad_token_unauthenticated() {
    let gateway = Gateway::start();
    let agent_token = gateway.tenant("acme", "support", &["testkit.echo"]).await;
    let approver_token = gateway.approver_token("acme").await;

    let denied = gateway
        .admin()
        .await
        .list_tenants(authed(pb::ListTenantsRequest {}, &agent_token))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    assert!(
        denied
            .message()
            .contains("this call needs an admin token, not an agent token"),
        "{}",
        denied.message()
    );
    assert!(
        !denied.message().contains("UNAUTHENTICATED"),
        "{}",
        denied.message()
    );

    let denied = gateway
        .agent()
        .await
        .create_run(authed(
            pb::CreateRunRequest {
                agent_id: "support".into(),
                run_id: String::new(),
                max_calls: 0,
            },
            &approver_token,
        ))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    assert!(
        denied
            .message()
            .contains("this call needs an agent token, not an approver token"),
        "{}",
        denied.message()
    );

    // Missing, unknown and revoked tokens stay UNAUTHENTICATED.
    let mut admin = gateway.admin().await;
    let missing = admin
        .list_tenants(pb::ListTenantsRequest {})
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::Unauthenticated, "{missing:?}");
    let unknown = admin
        .list_tenants(authed(pb::ListTenantsRequest {}, "tg_admin_guessed"))
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::Unauthenticated, "{unknown:?}");
    let issued = admin
        .create_token(authed(
            pb::CreateTokenRequest {
                role: "admin".into(),
                tenant_id: String::new(),
                agent_id: String::new(),
                label: "temporary".into(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap()
        .into_inner();
    admin
        .revoke_token(authed(
            pb::RevokeTokenRequest {
                token_id: issued.token_id,
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap();
    let revoked = admin
        .list_tenants(authed(pb::ListTenantsRequest {}, &issued.token))
        .await
        .unwrap_err();
    assert_eq!(revoked.code(), tonic::Code::Unauthenticated, "{revoked:?}");
}
