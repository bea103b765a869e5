//! The keyed audit chain end to end, through the real binary: a gateway records calls (one
//! succeeds, one fails), stops, and `toolgate ledger checkpoint` / `toolgate ledger verify`
//! act on its ledger as an operator would. Copies of the SQLite ledger are tampered with as
//! by someone who can write the file but lacks the master keys: a failed call rewritten as
//! succeeded, an event edited, an event rewritten with a recomputed unkeyed hash, the newest
//! events removed with the head rewound. Each is reported with the key file, or against the
//! checkpoint; verification without the key file says what it did not check; a changed
//! checkpoint is refused. On PostgreSQL: the rewritten call and the rewound head.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use sqlx::{Connection as _, Executor as _};
use toolgate_e2e::{Gateway, PgSchema, authed, gateway_binary};
use toolgate_proto::v1 as pb;

const TOOLS: &[&str] = &["testkit.noop", "testkit.panic"];

/// One succeeded and one failed call of `tenant`, and another admin token (so the system
/// chain has an event to remove).
async fn record_calls(gateway: &Gateway, tenant: &str) {
    gateway
        .admin()
        .await
        .create_token(authed(
            pb::CreateTokenRequest {
                role: "admin".into(),
                label: "second operator".into(),
                ..Default::default()
            },
            &gateway.admin_token,
        ))
        .await
        .expect("a second admin token");
    let token = gateway.tenant(tenant, "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    for tool in ["testkit.noop", "testkit.panic"] {
        gateway.call(&token, &run, tool, "{}").await;
    }
}

/// What one `toolgate ledger ...` run gave.
struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("no JSON ({error}): {}\n{}", self.stdout, self.stderr))
    }
}

fn toolgate(args: &[&str]) -> Outcome {
    let output = Command::new(gateway_binary())
        .args(args)
        .env("TOOLGATE_LOG", "warn")
        .env_remove("TOOLGATE_DATABASE")
        .env_remove("TOOLGATE_DATABASE_SCHEMA")
        .env_remove("TOOLGATE_KEY_FILE")
        .env_remove("TOOLGATE_MASTER_KEYS")
        .output()
        .expect("run toolgate");
    Outcome {
        code: output.status.code().unwrap_or(-1),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

fn text(path: &Path) -> &str {
    path.to_str().expect("UTF-8 temp path")
}

/// A copy of the SQLite ledger (with its write-ahead log) in a directory of its own.
fn copy_ledger(source: &Path, into: &Path) -> PathBuf {
    std::fs::create_dir_all(into).unwrap();
    let target = into.join("toolgate.db");
    for suffix in ["", "-wal", "-shm"] {
        let from = PathBuf::from(format!("{}{suffix}", source.display()));
        if from.exists() {
            std::fs::copy(&from, format!("{}{suffix}", target.display())).unwrap();
        }
    }
    target
}

/// Runs `statements` on a SQLite ledger file, the append-only triggers dropped first.
async fn tamper_sqlite(database: &Path, statements: &[String]) {
    let url = format!("sqlite://{}", database.display());
    let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
    let triggers: Vec<String> =
        sqlx::query_scalar("SELECT name FROM sqlite_master WHERE type = 'trigger'")
            .fetch_all(&mut conn)
            .await
            .unwrap();
    for trigger in triggers {
        conn.execute(sqlx::AssertSqlSafe(format!("DROP TRIGGER {trigger}")))
            .await
            .unwrap();
    }
    for sql in statements {
        conn.execute(sqlx::AssertSqlSafe(sql.clone()))
            .await
            .unwrap_or_else(|error| panic!("`{sql}`: {error}"));
    }
    conn.close().await.unwrap();
}

/// Statements that remove the newest event of `chain` and move its head back to the event
/// before, as read from `database` through `fetch`.
fn rewind(chain: &str, last: i64, previous_hash: &str) -> Vec<String> {
    vec![
        format!("DELETE FROM audit_events WHERE tenant = '{chain}' AND chain_seq = {last}"),
        format!(
            "UPDATE audit_heads SET chain_seq = {}, hash = '{previous_hash}' WHERE tenant = '{chain}'",
            last - 1
        ),
    ]
}

fn assert_broken(outcome: &Outcome, kind: &str, detail: &str) {
    let report = outcome.json();
    assert_eq!(outcome.code, 6, "exit code 6: {report}");
    assert_eq!(report["ok"], false, "{report}");
    assert_eq!(report["problem"]["kind"], kind, "{report}");
    let found = report["problem"]["detail"].as_str().unwrap_or_default();
    assert!(found.contains(detail), "`{found}` should say `{detail}`");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_with_a_copy_of_the_sqlite_ledger_is_detected() {
    let gateway = Gateway::start();
    record_calls(&gateway, "acme").await;
    // After a key rotation new events are MAC'd with the new key; the old ones still verify.
    let ring = gateway
        .admin()
        .await
        .rotate_key(authed(pb::RotateKeyRequest {}, &gateway.admin_token))
        .await
        .expect("rotate the master key")
        .into_inner();
    assert_eq!(ring.key_ids.len(), 2, "{ring:?}");
    record_calls(&gateway, "beta").await;
    let dir = gateway.dir.clone();
    let _temp = gateway.stop();
    let database = dir.join("toolgate.db");
    let key_file = dir.join("toolgate-keys");
    let work = tempfile::tempdir().unwrap();

    // A checkpoint, kept away from the database.
    let checkpoint = work.path().join("checkpoint.json");
    let written = toolgate(&[
        "ledger",
        "checkpoint",
        "--database",
        text(&database),
        "--key-file",
        text(&key_file),
        "--output",
        text(&checkpoint),
    ]);
    assert_eq!(written.code, 0, "{}{}", written.stdout, written.stderr);
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(&checkpoint).unwrap()).unwrap();
    assert_eq!(saved["format"], "toolgate.ledger_checkpoint.v1");
    let chains: Vec<&str> = saved["heads"]
        .as_array()
        .unwrap()
        .iter()
        .map(|head| head["chain"].as_str().unwrap())
        .collect();
    assert_eq!(chains, ["@system", "acme", "beta"], "{saved}");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&checkpoint).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // To standard output, the same heads.
    let printed = toolgate(&[
        "ledger",
        "checkpoint",
        "--database",
        text(&database),
        "--key-file",
        text(&key_file),
    ]);
    assert_eq!(printed.code, 0, "{}", printed.stderr);
    assert_eq!(printed.json()["heads"], saved["heads"]);

    let verify = |database: &Path, with_key: bool, with_checkpoint: bool| {
        let mut args = vec!["ledger", "verify", "--database", text(database)];
        args.extend(["--key-file"]);
        if with_key {
            args.push(text(&key_file));
        } else {
            args.push("/nonexistent/toolgate-keys");
        }
        if with_checkpoint {
            args.extend(["--checkpoint", text(&checkpoint)]);
        }
        toolgate(&args)
    };

    // The untouched ledger verifies, every event authenticated (under both keys).
    let clean = verify(&database, true, true);
    let report = clean.json();
    assert_eq!(clean.code, 0, "{report}");
    assert_eq!(report["ok"], true);
    assert_eq!(report["keys_loaded"], true);
    assert_eq!(report["keyed_events"], report["events_checked"], "{report}");
    assert_eq!(
        report["authenticated_events"], report["events_checked"],
        "{report}"
    );
    assert_eq!(report["checkpoint"]["authenticated"], true, "{report}");
    assert!(report["rows_checked"].as_u64().unwrap() >= 4, "{report}");

    // Without the key file it verifies too, and says plainly what it did not check.
    let blind = verify(&database, false, false);
    let report = blind.json();
    assert_eq!(blind.code, 0, "{report}");
    assert_eq!(report["keys_loaded"], false);
    assert_eq!(report["authenticated_events"], 0);
    let notes = report["not_checked"].to_string();
    assert!(notes.contains("no master keys were given"), "{notes}");
    assert!(notes.contains("no checkpoint was given"), "{notes}");

    // A failed call rewritten as succeeded.
    let copy = copy_ledger(&database, &work.path().join("rewritten-call"));
    tamper_sqlite(
        &copy,
        &[
            "UPDATE tool_calls SET status = 'succeeded', error_code = NULL, error_text = NULL \
           WHERE status = 'failed'"
                .to_owned(),
        ],
    )
    .await;
    assert_broken(
        &verify(&copy, true, false),
        "edited",
        "the row was rewritten",
    );
    // The binding is in the event, so this shows even without the key.
    assert_broken(
        &verify(&copy, false, false),
        "edited",
        "the row was rewritten",
    );

    // An event edited in place.
    let copy = copy_ledger(&database, &work.path().join("edited-event"));
    tamper_sqlite(
        &copy,
        &[
            "UPDATE audit_events SET payload = '{}' WHERE tenant = 'acme' AND chain_seq = 2"
                .to_owned(),
        ],
    )
    .await;
    assert_broken(
        &verify(&copy, true, false),
        "edited",
        "does not match its MAC",
    );

    // The newest event rewritten with a recomputed unkeyed hash (all one can compute without
    // the key), the head moved to it.
    let copy = copy_ledger(&database, &work.path().join("recomputed"));
    let (last, prev_hash, kind, run, call, at): (
        i64,
        String,
        String,
        Option<String>,
        Option<String>,
        i64,
    ) = {
        let url = format!("sqlite://{}", copy.display());
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let row = sqlx::query_as(
            "SELECT chain_seq, prev_hash, kind, run, tool_call_id, at FROM audit_events \
             WHERE tenant = 'acme' ORDER BY chain_seq DESC LIMIT 1",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
        row
    };
    // The unkeyed SHA-256 of the format before the keyed chain, as anyone can compute it.
    let hash = toolgate_ledger::event_hash(
        &prev_hash,
        &toolgate_ledger::EventFields {
            tenant: "acme",
            chain_seq: last,
            kind: &kind,
            run: run.as_deref(),
            tool_call_id: call.as_deref(),
            payload: "{}",
            at,
            binding: None,
        },
    );
    tamper_sqlite(
        &copy,
        &[
            format!(
                "UPDATE audit_events SET payload = '{{}}', hash = '{hash}', key_id = NULL, \
                 binding = NULL WHERE tenant = 'acme' AND chain_seq = {last}"
            ),
            format!("UPDATE audit_heads SET hash = '{hash}' WHERE tenant = 'acme'"),
        ],
    )
    .await;
    assert_broken(
        &verify(&copy, true, false),
        "edited",
        "has an unkeyed hash but follows keyed events",
    );

    // The newest event of the system chain removed and its head rewound: the database holds a
    // shorter genuine chain, which only the checkpoint shows.
    let copy = copy_ledger(&database, &work.path().join("rewound"));
    let (system_last, system_prev): (i64, String) = {
        let url = format!("sqlite://{}", copy.display());
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        let row = sqlx::query_as(
            "SELECT chain_seq, prev_hash FROM audit_events WHERE tenant = '@system' \
             ORDER BY chain_seq DESC LIMIT 1",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
        row
    };
    assert!(system_last >= 2, "the system chain has events to remove");
    tamper_sqlite(&copy, &rewind("@system", system_last, &system_prev)).await;
    let unseen = verify(&copy, true, false);
    assert_eq!(unseen.code, 0, "{}", unseen.stdout);
    assert!(
        unseen.json()["not_checked"]
            .to_string()
            .contains("removal of the newest events with the head rewound cannot be ruled out")
    );
    assert_broken(
        &verify(&copy, true, true),
        "deleted",
        "the newest events were removed and the head rewound",
    );

    // A checkpoint changed to match the rewound chain is refused.
    let forged_path = work.path().join("forged.json");
    let forged = std::fs::read_to_string(&checkpoint).unwrap().replace(
        &format!("\"chain\":\"@system\",\"chain_seq\":{system_last}"),
        &format!("\"chain\":\"@system\",\"chain_seq\":{}", system_last - 1),
    );
    assert_ne!(forged, std::fs::read_to_string(&checkpoint).unwrap());
    std::fs::write(&forged_path, forged).unwrap();
    let refused = toolgate(&[
        "ledger",
        "verify",
        "--database",
        text(&copy),
        "--key-file",
        text(&key_file),
        "--checkpoint",
        text(&forged_path),
    ]);
    assert_eq!(refused.code, 1, "{}{}", refused.stdout, refused.stderr);
    assert!(
        refused.stderr.contains("does not match its MAC"),
        "{}",
        refused.stderr
    );

    // A checkpoint needs the keys, and is refused for a ledger that does not verify.
    let keyless = toolgate(&[
        "ledger",
        "checkpoint",
        "--database",
        text(&database),
        "--key-file",
        "/nonexistent/toolgate-keys",
    ]);
    assert_eq!(keyless.code, 1);
    assert!(
        keyless.stderr.contains("no master keys"),
        "{}",
        keyless.stderr
    );
    let tampered = copy_ledger(&database, &work.path().join("no-checkpoint"));
    tamper_sqlite(
        &tampered,
        &["UPDATE tool_calls SET status = 'succeeded' WHERE status = 'failed'".to_owned()],
    )
    .await;
    let refused = toolgate(&[
        "ledger",
        "checkpoint",
        "--database",
        text(&tampered),
        "--key-file",
        text(&key_file),
    ]);
    assert_eq!(refused.code, 6, "{}", refused.stderr);
    assert!(
        refused.stderr.contains("does not verify"),
        "{}",
        refused.stderr
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_with_the_postgres_ledger_is_detected() {
    let schema = PgSchema::new().await;
    let gateway = Gateway::start_pg(&schema);
    record_calls(&gateway, "acme").await;
    let _temp = gateway.stop();
    let key_file = schema.key_file();
    let work = tempfile::tempdir().unwrap();
    let checkpoint = work.path().join("checkpoint.json");
    let ledger = |extra: &[&str]| {
        let mut args = vec![
            "ledger",
            extra[0],
            "--database",
            schema.url(),
            "--schema",
            schema.name(),
            "--key-file",
            text(&key_file),
        ];
        args.extend(&extra[1..]);
        toolgate(&args)
    };
    let written = ledger(&["checkpoint", "--output", text(&checkpoint)]);
    assert_eq!(written.code, 0, "{}{}", written.stdout, written.stderr);
    let clean = ledger(&["verify", "--checkpoint", text(&checkpoint)]);
    assert_eq!(clean.code, 0, "{}", clean.stdout);
    assert_eq!(clean.json()["checkpoint"]["authenticated"], true);

    let mut conn = sqlx::PgConnection::connect(schema.url()).await.unwrap();
    conn.execute(sqlx::AssertSqlSafe(format!(
        "SET search_path TO \"{}\"",
        schema.name()
    )))
    .await
    .unwrap();
    let (id, code, error): (String, Option<String>, Option<String>) =
        sqlx::query_as("SELECT id, error_code, error_text FROM tool_calls WHERE status = 'failed'")
            .fetch_one(&mut conn)
            .await
            .unwrap();
    sqlx::query("UPDATE tool_calls SET status = 'succeeded', error_code = NULL, error_text = NULL WHERE id = $1")
        .bind(&id)
        .execute(&mut conn)
        .await
        .unwrap();
    assert_broken(&ledger(&["verify"]), "edited", "the row was rewritten");
    sqlx::query(
        "UPDATE tool_calls SET status = 'failed', error_code = $2, error_text = $3 WHERE id = $1",
    )
    .bind(&id)
    .bind(code)
    .bind(error)
    .execute(&mut conn)
    .await
    .unwrap();
    assert_eq!(ledger(&["verify"]).code, 0, "put back, it verifies again");

    let (last, prev): (i64, String) = sqlx::query_as(
        "SELECT chain_seq, prev_hash FROM audit_events WHERE tenant = '@system' \
         ORDER BY chain_seq DESC LIMIT 1",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    for sql in [
        "ALTER TABLE audit_events DISABLE TRIGGER USER".to_owned(),
        "ALTER TABLE audit_heads DISABLE TRIGGER USER".to_owned(),
    ]
    .into_iter()
    .chain(rewind("@system", last, &prev))
    {
        conn.execute(sqlx::AssertSqlSafe(sql)).await.unwrap();
    }
    conn.close().await.unwrap();
    assert_eq!(
        ledger(&["verify"]).code,
        0,
        "a shorter genuine chain verifies alone"
    );
    assert_broken(
        &ledger(&["verify", "--checkpoint", text(&checkpoint)]),
        "deleted",
        "the head rewound",
    );
}
