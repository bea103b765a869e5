//! Administration is audited, through a real gateway on SQLite and on PostgreSQL: every change
//! an operator makes over the admin API (tenants, agents, tokens, grants, flags, policies,
//! credentials, master keys) leaves exactly one `admin.*` event naming the acting admin token
//! by id, on its tenant's chain or, without a tenant, on the system chain (`@system`), with
//! nothing secret in it; `toolgate ledger verify` checks the system chain with the others.
//!
//! No API lists audit events outside a run (`WatchRun`), so the test reads them from the
//! database directly, read-only, as an auditor would.

use std::process::Command;

use serde_json::Value;
use sqlx::Connection as _;
use toolgate_e2e::{Gateway, PgSchema, authed, gateway_binary};
use toolgate_proto::v1 as pb;

const SECRET_VALUE: &str = "sk-audit-0123456789abcdefSECRET";
const POLICY: &str = r#"@id("base") permit(principal, action, resource);"#;

/// One stored audit event: chain id, kind, payload.
type Stored = (String, String, Value);

/// What the test reads from the stopped gateway's database.
struct Ledger {
    /// Every audit event, in insertion order.
    events: Vec<Stored>,
    /// Everything stored, as text: the SQLite file and its write-ahead log, or every row of
    /// every table of the PostgreSQL schema.
    dump: String,
    /// The stored token hashes and credential values (ciphertexts, references).
    stored_secrets: Vec<String>,
}

#[derive(Clone, Copy, Debug)]
enum Backend {
    Sqlite,
    Postgres,
}

#[tokio::test]
async fn sqlite_every_admin_change_is_audited_with_its_actor() {
    every_admin_change_is_audited(Backend::Sqlite).await;
}

#[tokio::test]
async fn pg_every_admin_change_is_audited_with_its_actor() {
    every_admin_change_is_audited(Backend::Postgres).await;
}

async fn every_admin_change_is_audited(backend: Backend) {
    // Declared before the gateway, so the gateway stops before its schema is dropped.
    let schema = match backend {
        Backend::Sqlite => None,
        Backend::Postgres => Some(PgSchema::new().await),
    };
    let gateway = match &schema {
        None => Gateway::start(),
        Some(schema) => Gateway::start_pg(schema),
    };
    let mut admin = gateway.admin().await;
    let bootstrap = gateway.admin_token.clone();
    let bootstrap_id = admin
        .list_tokens(authed(pb::ListTokensRequest::default(), &bootstrap))
        .await
        .unwrap()
        .into_inner()
        .tokens
        .into_iter()
        .find(|token| token.label == "bootstrap")
        .expect("the bootstrap admin token")
        .token_id;

    // The operator's own admin token, issued with the bootstrap one; every change below is
    // made with it.
    let ops = admin
        .create_token(authed(
            pb::CreateTokenRequest {
                role: "admin".into(),
                tenant_id: String::new(),
                agent_id: String::new(),
                label: "ops".into(),
            },
            &bootstrap,
        ))
        .await
        .unwrap()
        .into_inner();
    let token = ops.token.as_str();

    admin
        .create_tenant(authed(
            pb::CreateTenantRequest {
                tenant_id: "acme".into(),
                name: "Acme".into(),
            },
            token,
        ))
        .await
        .unwrap();
    admin
        .create_agent(authed(
            pb::CreateAgentRequest {
                tenant_id: "acme".into(),
                agent_id: "support".into(),
                name: "Support".into(),
            },
            token,
        ))
        .await
        .unwrap();
    admin
        .set_permission(authed(
            pb::SetPermissionRequest {
                tenant_id: "acme".into(),
                agent_id: String::new(),
                tool_name: "testkit.whoami".into(),
                enabled: true,
            },
            token,
        ))
        .await
        .unwrap();
    admin
        .set_feature_flag(authed(
            pb::SetFeatureFlagRequest {
                tenant_id: "acme".into(),
                flag: "tool_calling_enabled".into(),
                enabled: true,
            },
            token,
        ))
        .await
        .unwrap();
    let policy = admin
        .put_policy(authed(
            pb::PutPolicyRequest {
                tenant_id: "acme".into(),
                text: POLICY.into(),
            },
            token,
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(policy.version, 1);
    let agent_token = admin
        .create_token(authed(
            pb::CreateTokenRequest {
                role: "agent".into(),
                tenant_id: "acme".into(),
                agent_id: "support".into(),
                label: "runtime".into(),
            },
            token,
        ))
        .await
        .unwrap()
        .into_inner();
    admin
        .revoke_token(authed(
            pb::RevokeTokenRequest {
                token_id: agent_token.token_id.clone(),
            },
            token,
        ))
        .await
        .unwrap();
    admin
        .put_secret(authed(
            pb::PutSecretRequest {
                tenant_id: "acme".into(),
                name: "testkit_key".into(),
                value: SECRET_VALUE.into(),
                metadata_json: String::new(),
                notes: String::new(),
            },
            token,
        ))
        .await
        .unwrap();
    admin
        .put_secret_reference(authed(
            pb::PutSecretReferenceRequest {
                tenant_id: "acme".into(),
                name: "other_key".into(),
                reference: "env:AUDIT_TEST_KEY".into(),
                metadata_json: String::new(),
                notes: String::new(),
            },
            token,
        ))
        .await
        .unwrap();
    admin
        .delete_secret(authed(
            pb::DeleteSecretRequest {
                tenant_id: "acme".into(),
                name: "other_key".into(),
            },
            token,
        ))
        .await
        .unwrap();
    let rotated = admin
        .rotate_key(authed(pb::RotateKeyRequest {}, token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(rotated.active_key_id, "k2");
    let rewrapped = admin
        .rewrap_secrets(authed(pb::RewrapSecretsRequest {}, token))
        .await
        .unwrap()
        .into_inner();
    assert_eq!((rewrapped.rewrapped, rewrapped.skipped), (1, 0));
    admin
        .retire_key(authed(
            pb::RetireKeyRequest {
                key_id: "k1".into(),
            },
            token,
        ))
        .await
        .unwrap();
    let spare = admin
        .create_token(authed(
            pb::CreateTokenRequest {
                role: "admin".into(),
                tenant_id: String::new(),
                agent_id: String::new(),
                label: "spare".into(),
            },
            token,
        ))
        .await
        .unwrap()
        .into_inner();
    admin
        .revoke_token(authed(
            pb::RevokeTokenRequest {
                token_id: spare.token_id.clone(),
            },
            token,
        ))
        .await
        .unwrap();

    // Refused changes leave nothing: an agent of a tenant that does not exist, a key that
    // cannot be retired (the active one).
    let refused = admin
        .create_agent(authed(
            pb::CreateAgentRequest {
                tenant_id: "nope".into(),
                agent_id: "support".into(),
                name: String::new(),
            },
            token,
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::NotFound, "{refused}");
    let refused = admin
        .retire_key(authed(
            pb::RetireKeyRequest {
                key_id: "k2".into(),
            },
            token,
        ))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused}");

    let remote = gateway.verify_ledger().await;
    let dir = gateway.dir.clone();
    drop(admin);
    // SIGKILL: whatever was acknowledged is in the database (and, on SQLite, its WAL).
    let _temp = gateway.stop();

    let Ledger {
        events,
        dump,
        stored_secrets,
    } = match &schema {
        None => read_sqlite(&dir.join("toolgate.db")).await,
        Some(schema) => read_pg(schema).await,
    };
    let admin_events: Vec<&Stored> = events
        .iter()
        .filter(|(_, kind, _)| kind.starts_with("admin."))
        .collect();
    let ops_id = ops.token_id.as_str();
    let expected: Vec<(&str, &str, &str, Value)> = vec![
        (
            "@system",
            "admin.token_issued",
            "gateway",
            serde_json::json!({ "role": "admin", "label": "bootstrap" }),
        ),
        (
            "@system",
            "admin.token_issued",
            &bootstrap_id,
            serde_json::json!({ "token_id": ops_id, "role": "admin", "label": "ops" }),
        ),
        (
            "acme",
            "admin.tenant_created",
            ops_id,
            serde_json::json!({ "name": "Acme" }),
        ),
        (
            "acme",
            "admin.agent_created",
            ops_id,
            serde_json::json!({ "agent": "support" }),
        ),
        (
            "acme",
            "admin.grant_set",
            ops_id,
            serde_json::json!({ "tool": "testkit.whoami", "enabled": true }),
        ),
        (
            "acme",
            "admin.flag_set",
            ops_id,
            serde_json::json!({ "flag": "tool_calling_enabled", "enabled": true }),
        ),
        (
            "acme",
            "admin.policy_set",
            ops_id,
            serde_json::json!({ "version": 1 }),
        ),
        (
            "acme",
            "admin.token_issued",
            ops_id,
            serde_json::json!({
                "token_id": agent_token.token_id,
                "role": "agent",
                "agent": "support",
            }),
        ),
        (
            "acme",
            "admin.token_revoked",
            ops_id,
            serde_json::json!({ "token_id": agent_token.token_id }),
        ),
        (
            "acme",
            "admin.credential_put",
            ops_id,
            serde_json::json!({ "name": "testkit_key", "kind": "sealed", "key_id": "k1" }),
        ),
        (
            "acme",
            "admin.credential_put",
            ops_id,
            serde_json::json!({
                "name": "other_key",
                "kind": "reference",
                "reference": "env:AUDIT_TEST_KEY",
            }),
        ),
        (
            "acme",
            "admin.credential_deleted",
            ops_id,
            serde_json::json!({ "name": "other_key" }),
        ),
        (
            "@system",
            "admin.key_rotated",
            ops_id,
            serde_json::json!({ "key_id": "k2", "previous_key_id": "k1" }),
        ),
        (
            "acme",
            "admin.credential_rewrapped",
            ops_id,
            serde_json::json!({ "name": "testkit_key", "key_id": "k2" }),
        ),
        (
            "@system",
            "admin.keys_rewrapped",
            ops_id,
            serde_json::json!({ "key_id": "k2", "rewrapped": 1, "skipped": 0 }),
        ),
        (
            "@system",
            "admin.key_retired",
            ops_id,
            serde_json::json!({ "key_id": "k1" }),
        ),
        (
            "@system",
            "admin.token_issued",
            ops_id,
            serde_json::json!({ "token_id": spare.token_id, "role": "admin" }),
        ),
        (
            "@system",
            "admin.token_revoked",
            ops_id,
            serde_json::json!({ "token_id": spare.token_id }),
        ),
    ];
    let seen: Vec<(&str, &str)> = admin_events
        .iter()
        .map(|(chain, kind, _)| (chain.as_str(), kind.as_str()))
        .collect();
    let wanted: Vec<(&str, &str)> = expected
        .iter()
        .map(|(chain, kind, _, _)| (*chain, *kind))
        .collect();
    assert_eq!(seen, wanted, "one event per change, in order, on its chain");
    for ((_, kind, payload), (_, _, actor, details)) in admin_events.iter().zip(&expected) {
        assert_eq!(payload["actor"], *actor, "{kind}: {payload}");
        for (key, value) in details.as_object().unwrap() {
            assert_eq!(&payload[key], value, "{kind}: {key} in {payload}");
        }
    }

    // Nothing secret anywhere in the database: no token, no credential value; and no event
    // repeats a token's hash or a sealed value.
    for (what, secret) in [
        ("the credential value", SECRET_VALUE),
        ("the bootstrap token", bootstrap.as_str()),
        ("the ops token", ops.token.as_str()),
        ("the agent token", agent_token.token.as_str()),
        ("the spare token", spare.token.as_str()),
    ] {
        assert!(!dump.contains(secret), "{what} is stored");
    }
    // Four tokens (the revoked ones are kept) and one sealed credential.
    assert_eq!(stored_secrets.len(), 5, "{stored_secrets:?}");
    for (_, kind, payload) in &events {
        let text = payload.to_string();
        for secret in &stored_secrets {
            assert!(
                !text.contains(secret.as_str()),
                "{kind} repeats {secret}: {text}"
            );
        }
    }

    // The system chain is verified with the tenants', by the gateway and offline.
    let system = events
        .iter()
        .filter(|(chain, ..)| chain == "@system")
        .count();
    assert_eq!(system, 7);
    let total = u64::try_from(events.len()).unwrap();
    assert!(remote.ok, "{remote:?}");
    assert_eq!((remote.chains_checked, remote.events_checked), (2, total));
    let offline = ledger_verify(&dir, schema.as_ref());
    assert_eq!(offline["ok"], true, "{offline}");
    assert_eq!(offline["chains_checked"], 2, "{offline}");
    assert_eq!(offline["events_checked"], total, "{offline}");
}

/// The ledger of a SQLite file.
async fn read_sqlite(path: &std::path::Path) -> Ledger {
    let options = sqlx::sqlite::SqliteConnectOptions::new()
        .filename(path)
        .read_only(true);
    let mut conn = sqlx::SqliteConnection::connect_with(&options)
        .await
        .unwrap();
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT tenant, kind, payload FROM audit_events ORDER BY seq")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    let stored_secrets: Vec<String> = sqlx::query_scalar(
        "SELECT hash FROM api_tokens UNION ALL SELECT value FROM tenant_tool_secrets",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    conn.close().await.unwrap();
    let mut dump = String::new();
    for file in [path.to_path_buf(), path.with_extension("db-wal")] {
        if let Ok(bytes) = std::fs::read(&file) {
            dump.push_str(&String::from_utf8_lossy(&bytes));
            dump.push('\n');
        }
    }
    Ledger {
        events: decode(rows),
        dump,
        stored_secrets,
    }
}

/// The ledger of a PostgreSQL schema.
async fn read_pg(schema: &PgSchema) -> Ledger {
    let mut conn = sqlx::PgConnection::connect(schema.url()).await.unwrap();
    sqlx::query(sqlx::AssertSqlSafe(format!(
        "SET search_path TO {}",
        schema.name()
    )))
    .execute(&mut conn)
    .await
    .unwrap();
    let rows: Vec<(String, String, String)> =
        sqlx::query_as("SELECT tenant, kind, payload FROM audit_events ORDER BY seq")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    let stored_secrets: Vec<String> = sqlx::query_scalar(
        "SELECT hash FROM api_tokens UNION ALL SELECT value FROM tenant_tool_secrets",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let tables: Vec<String> = sqlx::query_scalar(
        "SELECT table_name::text FROM information_schema.tables \
         WHERE table_schema = $1 AND table_type = 'BASE TABLE'",
    )
    .bind(schema.name())
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(tables.iter().any(|t| t == "audit_events"), "{tables:?}");
    let mut dump = String::new();
    for table in tables {
        let rows_text: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(format!(
            "SELECT t::text FROM {table} t"
        )))
        .fetch_all(&mut conn)
        .await
        .unwrap();
        dump.push_str(&rows_text.join("\n"));
        dump.push('\n');
    }
    conn.close().await.unwrap();
    Ledger {
        events: decode(rows),
        dump,
        stored_secrets,
    }
}

fn decode(rows: Vec<(String, String, String)>) -> Vec<Stored> {
    rows.into_iter()
        .map(|(chain, kind, payload)| {
            let payload = serde_json::from_str(&payload)
                .unwrap_or_else(|error| panic!("{kind}: {error}: {payload}"));
            (chain, kind, payload)
        })
        .collect()
}

/// `toolgate ledger verify` on the stopped gateway's ledger, its JSON report.
fn ledger_verify(dir: &std::path::Path, schema: Option<&PgSchema>) -> Value {
    let mut command = Command::new(gateway_binary());
    command.args(["ledger", "verify", "--database"]);
    match schema {
        None => {
            command.arg(dir.join("toolgate.db"));
        }
        Some(schema) => {
            command.args([schema.url(), "--schema", schema.name()]);
        }
    }
    let output = command
        .env("TOOLGATE_LOG", "warn")
        .env_remove("TOOLGATE_BIN")
        .env_remove("TOOLGATE_TEST_PG_URL")
        .env_remove("TOOLGATE_DATABASE")
        .env_remove("TOOLGATE_DATABASE_SCHEMA")
        .output()
        .expect("run toolgate ledger verify");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|error| {
        panic!(
            "toolgate ledger verify printed no JSON ({error}): {stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    assert!(output.status.success(), "{report}");
    report
}
