//! Administrative changes and their audit events, on both backends: each change commits with
//! exactly one `admin.*` event naming the acting token, on its tenant's chain or the system
//! chain; a refused change writes none; a change whose event cannot be written is not made.

use serde_json::{Value, json};
use sha2::Digest as _;
use sqlx::sqlite::SqliteConnectOptions;
use sqlx::{ConnectOptions, Connection, Executor};
use toolgate_core::SecretName;

use super::*;
use crate::error::LedgerError;
use crate::model::*;

/// The kind and payload of every event of a chain, the system chain included, read straight
/// from the database (the store lists tenants' chains only).
async fn chain(db: &Db, backend: Backend, chain: &str) -> Vec<(String, Value)> {
    let sql = "SELECT kind, payload FROM audit_events WHERE tenant = $1 ORDER BY chain_seq";
    let rows: Vec<(String, String)> = match backend {
        Backend::Sqlite => {
            let mut conn = SqliteConnectOptions::new()
                .filename(db.sqlite_path())
                .read_only(true)
                .connect()
                .await
                .unwrap();
            let rows = sqlx::query_as(sql)
                .bind(chain)
                .fetch_all(&mut conn)
                .await
                .unwrap();
            conn.close().await.unwrap();
            rows
        }
        Backend::Pg => {
            let mut conn = db.pg_schema().raw().await;
            let rows = sqlx::query_as(sql)
                .bind(chain)
                .fetch_all(&mut conn)
                .await
                .unwrap();
            conn.close().await.unwrap();
            rows
        }
    };
    rows.into_iter()
        .map(|(kind, payload)| (kind, serde_json::from_str(&payload).unwrap()))
        .collect()
}

/// Every payload of every chain, as stored.
async fn all_payloads(db: &Db, backend: Backend) -> String {
    let sql = "SELECT payload FROM audit_events ORDER BY seq";
    let payloads: Vec<String> = match backend {
        Backend::Sqlite => {
            let mut conn = SqliteConnectOptions::new()
                .filename(db.sqlite_path())
                .read_only(true)
                .connect()
                .await
                .unwrap();
            sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
        }
        Backend::Pg => {
            let mut conn = db.pg_schema().raw().await;
            sqlx::query_scalar(sql).fetch_all(&mut conn).await.unwrap()
        }
    };
    payloads.join("\n")
}

/// How many events each of the given chains holds.
async fn lengths(db: &Db, backend: Backend, chains: &[&str]) -> Vec<usize> {
    let mut lengths = Vec::new();
    for id in chains {
        lengths.push(chain(db, backend, id).await.len());
    }
    lengths
}

fn sha256_hex(text: &str) -> String {
    toolgate_core::hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

fn token(id: &str, role: Role, tenant: Option<&str>, agent: Option<&str>) -> TokenRecord {
    TokenRecord {
        id: id.to_owned(),
        hash: sha256_hex(id),
        role,
        tenant: tenant.map(tenant_id),
        agent: agent.map(agent_id),
        label: format!("label of {id}"),
        created_at: T0,
        revoked: false,
    }
}

fn credential(tenant: &str, name: &str, value: &str) -> CredentialRecord {
    CredentialRecord {
        tenant: tenant_id(tenant),
        name: SecretName::new(name).unwrap(),
        kind: CredentialKind::Sealed,
        value: value.to_owned(),
        key_id: Some("k1".to_owned()),
        metadata: json!({}),
        notes: String::new(),
        created_by: ADMIN_TOKEN.to_owned(),
        created_at: T0,
        updated_at: T0,
    }
}

/// One administrative change and the event it must leave.
struct Case {
    what: &'static str,
    chain: &'static str,
    kind: &'static str,
    /// Fields the payload must hold (besides the actor).
    details: Value,
}

on_both_backends! {
    /// Every administrative operation of the store, one after the other: each adds exactly one
    /// event, to the right chain, naming the actor and what changed, and nothing secret.
    async fn each_change_commits_with_exactly_one_event(backend: Backend) {
        let db = Db::new(backend).await;
        let store = db.store();
        let chains = ["acme", "beta", SYSTEM_CHAIN];
        let acme = tenant_id("acme");
        let slack = SecretName::new("slack_default").unwrap();
        let agent_token = token("tok_agent", Role::Agent, Some("acme"), Some("bot"));
        let admin_token = token("tok_admin2", Role::Admin, None, None);
        let sealed = credential("acme", "slack_default", "tgs1.k1.SEALEDVALUE");
        let cases: Vec<Case> = vec![
            Case {
                what: "create tenant acme",
                chain: "acme",
                kind: "admin.tenant_created",
                details: json!({ "name": "acme inc" }),
            },
            Case {
                what: "create tenant beta",
                chain: "beta",
                kind: "admin.tenant_created",
                details: json!({ "name": "beta inc" }),
            },
            Case {
                what: "create agent acme/bot",
                chain: "acme",
                kind: "admin.agent_created",
                details: json!({ "agent": "bot", "name": "agent bot" }),
            },
            Case {
                what: "issue an agent token",
                chain: "acme",
                kind: "admin.token_issued",
                details: json!({ "token_id": "tok_agent", "role": "agent", "agent": "bot" }),
            },
            Case {
                what: "issue an admin token",
                chain: SYSTEM_CHAIN,
                kind: "admin.token_issued",
                details: json!({ "token_id": "tok_admin2", "role": "admin", "agent": null }),
            },
            Case {
                what: "revoke the agent token",
                chain: "acme",
                kind: "admin.token_revoked",
                details: json!({ "token_id": "tok_agent" }),
            },
            Case {
                what: "revoke the admin token",
                chain: SYSTEM_CHAIN,
                kind: "admin.token_revoked",
                details: json!({ "token_id": "tok_admin2" }),
            },
            Case {
                what: "grant a tool",
                chain: "acme",
                kind: "admin.grant_set",
                details: json!({ "tool": "slack.post_message", "agent": null, "enabled": true }),
            },
            Case {
                what: "set a flag",
                chain: "beta",
                kind: "admin.flag_set",
                details: json!({ "flag": TOOL_CALLING_ENABLED, "enabled": true }),
            },
            Case {
                what: "put a policy set",
                chain: "acme",
                kind: "admin.policy_set",
                details: json!({ "version": 1, "bytes": 36 }),
            },
            Case {
                what: "put a sealed credential",
                chain: "acme",
                kind: "admin.credential_put",
                details: json!({ "name": "slack_default", "kind": "sealed", "key_id": "k1" }),
            },
            Case {
                what: "put a reference credential",
                chain: "acme",
                kind: "admin.credential_put",
                details: json!({
                    "name": "aws_default",
                    "kind": "reference",
                    "reference": "env:AWS_KEY",
                }),
            },
            Case {
                what: "rewrap a credential",
                chain: "acme",
                kind: "admin.credential_rewrapped",
                details: json!({ "name": "slack_default", "key_id": "k2" }),
            },
            Case {
                what: "delete a credential",
                chain: "acme",
                kind: "admin.credential_deleted",
                details: json!({ "name": "slack_default" }),
            },
            Case {
                what: "rotate the keys",
                chain: SYSTEM_CHAIN,
                kind: "admin.key_rotated",
                details: json!({ "key_id": "k2", "previous_key_id": "k1" }),
            },
            Case {
                what: "rewrap the credentials",
                chain: SYSTEM_CHAIN,
                kind: "admin.keys_rewrapped",
                details: json!({ "key_id": "k2", "rewrapped": 1, "skipped": 0 }),
            },
            Case {
                what: "retire a key",
                chain: SYSTEM_CHAIN,
                kind: "admin.key_retired",
                details: json!({ "key_id": "k1" }),
            },
        ];
        for (step, case) in cases.iter().enumerate() {
            let actor = Actor::token(
                format!("tok_admin_{step}"),
                T0.plus_ms(i64::try_from(step).unwrap()),
            );
            let before = lengths(&db, backend, &chains).await;
            let done: Result<(), LedgerError> = match case.what {
                "create tenant acme" => store.create_tenant(tenant("acme"), &actor).await,
                "create tenant beta" => store.create_tenant(tenant("beta"), &actor).await,
                "create agent acme/bot" => store.create_agent(agent("acme", "bot"), &actor).await,
                "issue an agent token" => store.create_token(agent_token.clone(), &actor).await,
                "issue an admin token" => store.create_token(admin_token.clone(), &actor).await,
                "revoke the agent token" => store.revoke_token("tok_agent", &actor).await,
                "revoke the admin token" => store.revoke_token("tok_admin2", &actor).await,
                "grant a tool" => {
                    let grant = Permission {
                        tenant: acme.clone(),
                        agent: None,
                        tool: tool("slack.post_message"),
                        enabled: true,
                        updated_at: actor.at,
                    };
                    store.put_permission(grant, &actor).await
                }
                "set a flag" => {
                    store
                        .set_flag(&tenant_id("beta"), TOOL_CALLING_ENABLED, true, &actor)
                        .await
                }
                "put a policy set" => {
                    let text = "permit(principal, action, resource);";
                    store
                        .put_policy_set(&acme, text, &actor)
                        .await
                        .map(|version| {
                            assert_eq!(version, 1);
                        })
                }
                "put a sealed credential" => store.put_credential(sealed.clone(), &actor).await,
                "put a reference credential" => {
                    let reference = CredentialRecord {
                        name: SecretName::new("aws_default").unwrap(),
                        kind: CredentialKind::Reference,
                        value: "env:AWS_KEY".to_owned(),
                        key_id: None,
                        ..credential("acme", "aws_default", "")
                    };
                    store.put_credential(reference, &actor).await
                }
                "rewrap a credential" => {
                    // A rewrap that lost to a concurrent change writes nothing at all.
                    let lost = store
                        .replace_sealed(&acme, &slack, "tgs1.k1.OTHER", "tgs1.k2.NEW", "k2", &actor)
                        .await
                        .unwrap();
                    assert!(!lost);
                    assert_eq!(
                        lengths(&db, backend, &chains).await,
                        before,
                        "a lost rewrap"
                    );
                    let replaced = store
                        .replace_sealed(
                            &acme,
                            &slack,
                            "tgs1.k1.SEALEDVALUE",
                            "tgs1.k2.NEWSEALEDVALUE",
                            "k2",
                            &actor,
                        )
                        .await
                        .unwrap();
                    assert!(replaced);
                    Ok(())
                }
                "delete a credential" => store.delete_credential(&acme, &slack, &actor).await,
                "rotate the keys" => {
                    let change = KeyChange::Rotated {
                        key_id: "k2".into(),
                        previous: "k1".into(),
                    };
                    store.record_key_change(change, &actor).await
                }
                "rewrap the credentials" => {
                    let change = KeyChange::Rewrapped {
                        active_key_id: "k2".into(),
                        rewrapped: 1,
                        skipped: 0,
                    };
                    store.record_key_change(change, &actor).await
                }
                "retire a key" => {
                    let change = KeyChange::Retired {
                        key_id: "k1".into(),
                    };
                    store.record_key_change(change, &actor).await
                }
                other => panic!("no such case {other}"),
            };
            done.unwrap_or_else(|error| panic!("{}: {error}", case.what));

            let after = lengths(&db, backend, &chains).await;
            let mut expected = before.clone();
            let index = chains.iter().position(|c| *c == case.chain).unwrap();
            expected[index] += 1;
            assert_eq!(
                after, expected,
                "{}: exactly one event, on {}",
                case.what, case.chain
            );
            let (kind, payload) = chain(&db, backend, case.chain).await.pop().unwrap();
            assert_eq!(kind, case.kind, "{}", case.what);
            assert_eq!(payload["actor"], json!(actor.token_id), "{}", case.what);
            for (key, value) in case.details.as_object().unwrap() {
                assert_eq!(&payload[key], value, "{}: {key} in {payload}", case.what);
            }
        }

        // The policy event names the exact text by its hash.
        let policy = chain(&db, backend, "acme")
            .await
            .into_iter()
            .find(|(kind, _)| kind == "admin.policy_set")
            .unwrap()
            .1;
        assert_eq!(
            policy["sha256"],
            json!(sha256_hex("permit(principal, action, resource);"))
        );

        // Nothing secret in any event: no ciphertext, no token hash.
        let payloads = all_payloads(&db, backend).await;
        for secret in ["SEALEDVALUE", &agent_token.hash, &admin_token.hash] {
            assert!(!payloads.contains(secret), "{secret} in {payloads}");
        }

        // The tenants' chains are listed as before, the system chain is not a tenant, and
        // every chain verifies.
        let listed: Vec<String> = store
            .list_tenants()
            .await
            .unwrap()
            .into_iter()
            .map(|tenant| tenant.id.to_string())
            .collect();
        assert_eq!(listed, ["acme", "beta"]);
        assert_eq!(
            events_of(store, "acme").await.len(),
            chain(&db, backend, "acme").await.len()
        );
        let report = store.verify_chains().await.unwrap();
        let total: usize = lengths(&db, backend, &chains).await.iter().sum();
        assert_eq!(
            (report.events_checked, report.chains_checked, report.first_problem.clone()),
            (u64::try_from(total).unwrap(), 3, None)
        );
    }
}

on_both_backends! {
    /// A change the store refuses (an unknown tenant, agent, token or credential, a taken id)
    /// leaves no event on any chain.
    async fn a_refused_change_writes_no_event(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        let chains = ["acme", SYSTEM_CHAIN];
        let before = lengths(&db, backend, &chains).await;
        let nope = tenant_id("nope");
        let name = SecretName::new("slack_default").unwrap();
        let grant = Permission {
            tenant: tenant_id("acme"),
            agent: Some(agent_id("ghost")),
            tool: tool("slack.post_message"),
            enabled: true,
            updated_at: T0,
        };
        let refusals: Vec<(&str, Result<(), LedgerError>)> = vec![
            (
                "a taken tenant id",
                store.create_tenant(tenant("acme"), &admin()).await,
            ),
            (
                "an agent of no tenant",
                store.create_agent(agent("nope", "bot"), &admin()).await,
            ),
            (
                "a taken agent id",
                store.create_agent(agent("acme", "bot"), &admin()).await,
            ),
            (
                "a token of an unknown agent",
                store
                    .create_token(
                        token("t1", Role::Agent, Some("acme"), Some("ghost")),
                        &admin(),
                    )
                    .await,
            ),
            (
                "an unknown token",
                store.revoke_token("tok_ghost", &admin()).await,
            ),
            (
                "a grant to an unknown agent",
                store.put_permission(grant, &admin()).await,
            ),
            (
                "a flag of no tenant",
                store
                    .set_flag(&nope, TOOL_CALLING_ENABLED, true, &admin())
                    .await,
            ),
            (
                "a policy of no tenant",
                store.put_policy_set(&nope, "x", &admin()).await.map(|_| ()),
            ),
            (
                "a credential of no tenant",
                store
                    .put_credential(credential("nope", "slack_default", "tgs1.k1.A"), &admin())
                    .await,
            ),
            (
                "an unknown credential",
                store
                    .delete_credential(&tenant_id("acme"), &name, &admin())
                    .await,
            ),
        ];
        for (what, result) in refusals {
            assert!(
                matches!(
                    result,
                    Err(LedgerError::NotFound(_) | LedgerError::AlreadyExists(_))
                ),
                "{what}: {result:?}"
            );
            assert_eq!(
                lengths(&db, backend, &chains).await,
                before,
                "{what} wrote an event"
            );
        }
        assert_eq!(store.verify_chains().await.unwrap().first_problem, None);
    }
}

/// Makes the database refuse every audit event of `kind` (as a full disk or a broken chain
/// would refuse any), through a connection of its own.
async fn refuse_events(db: &Db, backend: Backend, kind: &str) {
    match backend {
        Backend::Sqlite => {
            let mut conn = SqliteConnectOptions::new()
                .filename(db.sqlite_path())
                .connect()
                .await
                .unwrap();
            conn.execute(sqlx::AssertSqlSafe(format!(
                "CREATE TRIGGER test_refuse BEFORE INSERT ON audit_events \
                 WHEN NEW.kind = '{kind}' BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )))
            .await
            .unwrap();
            conn.close().await.unwrap();
        }
        Backend::Pg => {
            let mut conn = db.pg_schema().raw().await;
            conn.execute(
                "CREATE OR REPLACE FUNCTION test_refuse() RETURNS trigger LANGUAGE plpgsql AS $$ \
                 BEGIN RAISE EXCEPTION 'refused by the test' USING ERRCODE = 'check_violation'; \
                 END $$",
            )
            .await
            .unwrap();
            conn.execute(sqlx::AssertSqlSafe(format!(
                "CREATE TRIGGER test_refuse BEFORE INSERT ON audit_events FOR EACH ROW \
                 WHEN (NEW.kind = '{kind}') EXECUTE FUNCTION test_refuse()"
            )))
            .await
            .unwrap();
            conn.close().await.unwrap();
        }
    }
}

async fn allow_events(db: &Db, backend: Backend) {
    let sql = match backend {
        Backend::Sqlite => "DROP TRIGGER test_refuse",
        Backend::Pg => "DROP TRIGGER test_refuse ON audit_events",
    };
    match backend {
        Backend::Sqlite => {
            let mut conn = SqliteConnectOptions::new()
                .filename(db.sqlite_path())
                .connect()
                .await
                .unwrap();
            conn.execute(sql).await.unwrap();
            conn.close().await.unwrap();
        }
        Backend::Pg => {
            let mut conn = db.pg_schema().raw().await;
            conn.execute(sql).await.unwrap();
            conn.close().await.unwrap();
        }
    }
}

on_both_backends! {
    /// The change and its event are one transaction: when the event cannot be written, the
    /// change is not made either, and the store goes on working once events are accepted again.
    async fn a_change_whose_event_is_refused_is_not_made(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        let acme = tenant_id("acme");

        refuse_events(&db, backend, "admin.flag_set").await;
        let refused = store
            .set_flag(&acme, TOOL_CALLING_ENABLED, true, &admin())
            .await;
        assert!(refused.is_err(), "{refused:?}");
        assert_eq!(
            store.get_flag(&acme, TOOL_CALLING_ENABLED).await.unwrap(),
            None
        );
        allow_events(&db, backend).await;

        refuse_events(&db, backend, "admin.tenant_created").await;
        let refused = store.create_tenant(tenant("beta"), &admin()).await;
        assert!(refused.is_err(), "{refused:?}");
        assert_eq!(store.get_tenant(&tenant_id("beta")).await.unwrap(), None);
        allow_events(&db, backend).await;

        refuse_events(&db, backend, "admin.token_revoked").await;
        let admin_token = token("tok_admin2", Role::Admin, None, None);
        store
            .create_token(admin_token.clone(), &admin())
            .await
            .unwrap();
        let refused = store.revoke_token("tok_admin2", &admin()).await;
        assert!(refused.is_err(), "{refused:?}");
        let stored = store.find_token(&admin_token.hash).await.unwrap().unwrap();
        assert!(!stored.revoked, "the revocation was kept without its event");
        allow_events(&db, backend).await;

        // Everything works again, from where the chains were.
        store
            .set_flag(&acme, TOOL_CALLING_ENABLED, true, &admin())
            .await
            .unwrap();
        store.create_tenant(tenant("beta"), &admin()).await.unwrap();
        store
            .create_agent(agent("beta", "bot"), &admin())
            .await
            .unwrap();
        store.revoke_token("tok_admin2", &admin()).await.unwrap();
        assert_eq!(
            chain(&db, backend, "beta")
                .await
                .into_iter()
                .map(|(kind, _)| kind)
                .collect::<Vec<_>>(),
            ["admin.tenant_created", "admin.agent_created"]
        );
        assert_eq!(
            chain(&db, backend, SYSTEM_CHAIN)
                .await
                .into_iter()
                .map(|(kind, _)| kind)
                .collect::<Vec<_>>(),
            ["admin.token_issued", "admin.token_revoked"]
        );
        let report = store.verify_chains().await.unwrap();
        assert_eq!((report.chains_checked, report.first_problem), (3, None));
    }
}

on_both_backends! {
    /// The system chain is verified like a tenant's: an edited event is reported, by its
    /// chain id.
    async fn the_system_chain_is_verified(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        for key in ["k2", "k3"] {
            let change = KeyChange::Retired { key_id: key.into() };
            store.record_key_change(change, &admin()).await.unwrap();
        }
        assert_eq!(store.verify_chains().await.unwrap().first_problem, None);
        let tamper = [
            "UPDATE audit_events SET payload = '{\"actor\":\"nobody\"}' \
             WHERE tenant = '@system' AND chain_seq = 1",
        ];
        match backend {
            Backend::Sqlite => {
                db.close().await;
                let mut conn = SqliteConnectOptions::new()
                    .filename(db.sqlite_path())
                    .connect()
                    .await
                    .unwrap();
                conn.execute("DROP TRIGGER audit_events_no_update")
                    .await
                    .unwrap();
                for sql in tamper {
                    conn.execute(sql).await.unwrap();
                }
                conn.close().await.unwrap();
                let db = db.reopen().await;
                check_system_problem(db.store().verify_chains().await.unwrap());
                db.close().await;
            }
            Backend::Pg => {
                let mut conn = db.pg_schema().raw().await;
                conn.execute("ALTER TABLE audit_events DISABLE TRIGGER USER")
                    .await
                    .unwrap();
                for sql in tamper {
                    conn.execute(sql).await.unwrap();
                }
                conn.close().await.unwrap();
                check_system_problem(store.verify_chains().await.unwrap());
            }
        }
    }
}

fn check_system_problem(report: VerifyReport) {
    let problem = report.first_problem.expect("the edit went unnoticed");
    assert_eq!(
        (problem.chain, problem.kind, problem.chain_seq),
        (AuditChain::System, ChainProblemKind::Edited, 1),
        "{}",
        problem.detail
    );
    assert_eq!(report.chains_checked, 2);
}

on_both_backends! {
    /// Operator-typed text (a token's label here) is kept in the event redacted, as every audit
    /// payload is; the token row keeps what was typed.
    async fn free_text_in_an_event_is_redacted(backend: Backend) {
        let db = seeded(backend, 10).await;
        let pasted = "xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx";
        let mut record = token("tok_labelled", Role::Approver, Some("acme"), None);
        record.label = format!("alice {pasted}");
        db.store().create_token(record, &admin()).await.unwrap();
        let (kind, payload) = chain(&db, backend, "acme").await.pop().unwrap();
        assert_eq!(kind, "admin.token_issued");
        let label = payload["label"].as_str().unwrap();
        assert!(label.starts_with("alice ") && !label.contains(pasted), "{label}");
    }
}

#[test]
fn the_system_chain_id_is_no_tenant_id() {
    assert!(toolgate_core::TenantId::new(SYSTEM_CHAIN).is_err());
    assert_eq!(AuditChain::parse(SYSTEM_CHAIN).unwrap(), AuditChain::System);
    assert_eq!(
        AuditChain::parse("acme").unwrap(),
        AuditChain::Tenant(tenant_id("acme"))
    );
    assert_eq!(AuditChain::System.to_string(), SYSTEM_CHAIN);
}
