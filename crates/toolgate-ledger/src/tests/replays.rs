//! Runs keyed per tenant, refused calls evaluated again, sealed answers and their purge, on
//! both backends; and the migrations that introduced them keeping existing data.

use std::path::Path;

use sqlx::migrate::Migrator;
use sqlx::sqlite::SqliteConnectOptions;
use toolgate_core::ErrorCode;

use super::*;

/// A call of `acme`'s `run-1` refused before anything ran (kill switch), not counted.
fn refused(id: &str, tool_use_id: &str) -> NewCall {
    let mut call = new_call("acme", "run-1", id, Some(tool_use_id));
    call.call.status = ToolCallStatus::Blocked;
    call.call.error_code = Some(ErrorCode::FeatureDisabled);
    call.call.error_text = Some("tool execution is not enabled".into());
    call.call.policy_decision_id = None;
    call.call.risk_level = None;
    call.count_against_budget = false;
    call.decision = None;
    call.events
        .push(event("acme", "tool_call.blocked", "run-1", id));
    call
}

/// The same call evaluated again: this time it runs (counted, with a decision).
fn reevaluated(id: &str, tool_use_id: &str) -> NewCall {
    let mut call = new_call("acme", "run-1", id, Some(tool_use_id));
    call.decision.as_mut().unwrap().id = format!("dec-{id}-2");
    call.call.policy_decision_id = Some(format!("dec-{id}-2"));
    call
}

on_both_backends! {
    async fn run_ids_are_per_tenant(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        store.create_tenant(tenant("beta"), &admin()).await.unwrap();
        store.create_agent(agent("beta", "bot"), &admin()).await.unwrap();
        // `run-1` is acme's; for beta it is a free id like any other.
        store.create_run(run("beta", "run-1", 5)).await.unwrap();
        assert_exists(store.create_run(run("acme", "run-1", 5)).await, "run run-1");
        let acme = store.get_run(&tenant_id("acme"), &run_id("run-1")).await.unwrap().unwrap();
        let beta = store.get_run(&tenant_id("beta"), &run_id("run-1")).await.unwrap().unwrap();
        assert_eq!((acme.max_calls, beta.max_calls), (10, 5));

        // The same tool_use_id in each tenant's run is two calls, not a replay.
        let first = store
            .record_call(new_call("acme", "run-1", "c-acme", Some("tu-1")))
            .await
            .unwrap();
        let second = store
            .record_call(new_call("beta", "run-1", "c-beta", Some("tu-1")))
            .await
            .unwrap();
        assert_eq!((first, second), (RecordOutcome::Recorded, RecordOutcome::Recorded));
        let again = store
            .record_call(new_call("beta", "run-1", "c-beta-2", Some("tu-1")))
            .await
            .unwrap();
        match again {
            RecordOutcome::Duplicate(existing) => assert_eq!(existing.id.as_str(), "c-beta"),
            other => panic!("expected beta's own call, got {other:?}"),
        }
        let beta_calls = store
            .list_tool_calls(&tenant_id("beta"), &run_id("run-1"), None, 10)
            .await
            .unwrap();
        assert_eq!(beta_calls.len(), 1);
        assert_eq!(beta_calls[0].tenant.as_str(), "beta");
    }
}

on_both_backends! {
    async fn a_refusal_is_evaluated_again_once(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        let acme = tenant_id("acme");
        store.record_call(refused("c1", "tu-1")).await.unwrap();
        let before = events_of(store, "acme").await.len();

        let outcome = store.retry_call(reevaluated("c1", "tu-1"), 1).await.unwrap();
        assert_eq!(outcome, RecordOutcome::Recorded);
        let call = store.get_tool_call(&acme, &call_id("c1")).await.unwrap().unwrap();
        assert_eq!(call.status, ToolCallStatus::Running);
        assert_eq!(call.evaluation, 2);
        assert_eq!(call.error_code, None);
        assert_eq!(call.policy_decision_id.as_deref(), Some("dec-c1-2"));
        let run = store.get_run(&acme, &run_id("run-1")).await.unwrap().unwrap();
        assert_eq!(run.calls_used, 1, "the evaluation that runs is counted");
        let after = events_of(store, "acme").await.len();
        assert_eq!(after, before + 1, "the new evaluation's requested event");

        // A second repeat that observed the first evaluation changes nothing.
        let late = store.retry_call(reevaluated("c1", "tu-1"), 1).await.unwrap();
        match late {
            RecordOutcome::Duplicate(current) => {
                assert_eq!((current.status, current.evaluation), (ToolCallStatus::Running, 2));
            }
            other => panic!("expected the call as it stands, got {other:?}"),
        }
        // Nor does one that observed the current evaluation of a call that is running.
        let running = store.retry_call(reevaluated("c1", "tu-1"), 2).await.unwrap();
        assert!(matches!(running, RecordOutcome::Duplicate(_)), "{running:?}");
        assert_eq!(events_of(store, "acme").await.len(), after);
        let run = store.get_run(&acme, &run_id("run-1")).await.unwrap().unwrap();
        assert_eq!(run.calls_used, 1);
        assert!(store.verify_chains().await.unwrap().first_problem.is_none());
    }
}

on_both_backends! {
    async fn concurrent_repeats_of_a_refusal_evaluate_it_once(backend: Backend) {
        let db = seeded(backend, 100).await;
        let store = db.shared();
        store.record_call(refused("c1", "tu-1")).await.unwrap();
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let store = Arc::clone(&store);
                tokio::spawn(async move {
                    store.retry_call(reevaluated("c1", "tu-1"), 1).await.unwrap()
                })
            })
            .collect();
        let mut recorded = 0;
        for task in tasks {
            if task.await.unwrap() == RecordOutcome::Recorded {
                recorded += 1;
            }
        }
        assert_eq!(recorded, 1);
        let run = store.get_run(&tenant_id("acme"), &run_id("run-1")).await.unwrap().unwrap();
        assert_eq!(run.calls_used, 1);
    }
}

on_both_backends! {
    async fn a_repeat_supersedes_an_open_policy_denial(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        let acme = tenant_id("acme");
        let mut denied = refused("c1", "tu-1");
        denied.call.error_code = Some(ErrorCode::PolicyBlocked);
        let mut denial = pending("acme", "c1");
        denial.origin = PendingOrigin::PolicyDenied;
        denial.decision = Decision::Block;
        denied.pending = Some(denial);
        store.record_call(denied).await.unwrap();
        let run = store.get_run(&acme, &run_id("run-1")).await.unwrap().unwrap();
        assert_eq!(run.pending_approvals, 1);

        store.retry_call(reevaluated("c1", "tu-1"), 1).await.unwrap();
        let row = store.get_pending(&acme, "pend-c1").await.unwrap().unwrap();
        assert_eq!(row.state, PendingState::Rejected);
        assert_eq!(row.version, 2, "a decision observed before cannot claim it any more");
        let run = store.get_run(&acme, &run_id("run-1")).await.unwrap().unwrap();
        assert_eq!((run.pending_approvals, run.status), (0, RunStatus::Active));
        // A late decision on the superseded denial loses its claim and leaves the call alone.
        let claimed = store.resolve_pending(decide("c1", 1, false, "alice")).await.unwrap();
        assert!(!claimed);
        let call = store.get_tool_call(&acme, &call_id("c1")).await.unwrap().unwrap();
        assert_eq!(call.status, ToolCallStatus::Running);
        let newest = store.pending_for_call(&acme, &call_id("c1")).await.unwrap().unwrap();
        assert_eq!(newest.id, "pend-c1");
        assert_eq!(store.pending_for_call(&acme, &call_id("nope")).await.unwrap(), None);
    }
}

on_both_backends! {
    async fn sealed_answers_are_kept_until_their_retention_ends(backend: Backend) {
        let db = seeded(backend, 10).await;
        let store = db.store();
        let acme = tenant_id("acme");
        for id in ["c1", "c2"] {
            store.record_call(new_call("acme", "run-1", id, None)).await.unwrap();
        }
        let answer = |n: i64| SealedAnswer {
            sealed: format!("tgs1.k1.answer-{n}"),
            expires_at: T0.plus_ms(1_000 * n),
        };
        let mut first = finish("acme", "c1");
        first.answer = Some(answer(1));
        let mut second = finish("acme", "c2");
        second.answer = Some(answer(2));
        assert!(store.finish_call(first).await.unwrap());
        assert!(store.finish_call(second).await.unwrap());
        assert_eq!(store.get_call_answer(&acme, &call_id("c1")).await.unwrap(), Some(answer(1)));
        // Another tenant never reads it.
        assert_eq!(
            store.get_call_answer(&tenant_id("beta"), &call_id("c1")).await.unwrap(),
            None
        );

        assert_eq!(store.purge_answers(T0.plus_ms(999), 100).await.unwrap(), 0);
        assert_eq!(store.purge_answers(T0.plus_ms(1_000), 100).await.unwrap(), 1);
        assert_eq!(store.get_call_answer(&acme, &call_id("c1")).await.unwrap(), None);
        assert_eq!(store.get_call_answer(&acme, &call_id("c2")).await.unwrap(), Some(answer(2)));
        // The redacted copy stays.
        let call = store.get_tool_call(&acme, &call_id("c1")).await.unwrap().unwrap();
        assert_eq!(call.status, ToolCallStatus::Succeeded);
        assert!(call.output_redacted.is_some());
        assert_eq!(store.purge_answers(T0.plus_ms(5_000), 1).await.unwrap(), 1);
        assert_eq!(store.purge_answers(T0.plus_ms(5_000), 1).await.unwrap(), 0);
    }
}

// --- the migrations keep existing data ---------------------------------------------------

/// A migrator with the first `count` migrations of `backend`'s set, as an older gateway had.
async fn older_migrator(backend: &str, count: usize) -> (tempfile::TempDir, Migrator) {
    let source = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../migrations")
        .join(backend);
    let mut files: Vec<_> = std::fs::read_dir(&source)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    files.sort();
    let dir = tempfile::tempdir().unwrap();
    for file in files.iter().take(count) {
        std::fs::copy(file, dir.path().join(file.file_name().unwrap())).unwrap();
    }
    let migrator = Migrator::new(dir.path()).await.unwrap();
    (dir, migrator)
}

/// Rows an older gateway wrote: a tenant, an agent, a run with a call and a pending invocation.
const OLD_ROWS: [&str; 5] = [
    "INSERT INTO tenants (id, name, created_at) VALUES ('acme', 'Acme', 1)",
    "INSERT INTO agents (tenant, id, name, created_at) VALUES ('acme', 'bot', 'Bot', 1)",
    "INSERT INTO runs (id, tenant, agent, manifest, status, calls_used, max_calls, \
     pending_approvals, created_at) VALUES ('run-1', 'acme', 'bot', '[\"slack.post_message\"]', \
     'waiting_approval', 1, 10, 1, 1)",
    "INSERT INTO tool_calls (id, tenant, run, agent, tool, action, tool_use_id, correlation_id, \
     status, args_hash, input_redacted, attempts, created_at, updated_at OWNER) VALUES ('c1', \
     'acme', 'run-1', 'bot', 'slack.post_message', 'post_message', 'tu-1', 'corr', \
     'waiting_approval', 'ab', '{}', 0, 1, 1 OWNERVALUE)",
    "INSERT INTO pending_invocations (id, tenant, run, tool_call_id, tool, arguments, args_hash, \
     manifest, policy_version, origin, decision, state, version, expires_at, created_at) VALUES \
     ('pend-c1', 'acme', 'run-1', 'c1', 'slack.post_message', '{}', 'ab', \
     '[\"slack.post_message\"]', 0, 'APPROVAL_REQUIRED', 'require_expert_approval', 'pending', 1, \
     99999999999999, 1)",
];

/// What the migrated store must still show, and what it must now allow.
async fn check_migrated(store: &dyn Store) {
    let acme = tenant_id("acme");
    let run = store
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((run.calls_used, run.pending_approvals), (1, 1));
    let call = store
        .get_tool_call(&acme, &call_id("c1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (call.status, call.evaluation),
        (ToolCallStatus::WaitingApproval, 1)
    );
    let pending = store.get_pending(&acme, "pend-c1").await.unwrap().unwrap();
    assert_eq!(pending.state, PendingState::Pending);
    // The old uniqueness is gone: another tenant may now use `run-1`.
    store.create_tenant(tenant("beta"), &admin()).await.unwrap();
    store
        .create_agent(agent("beta", "bot"), &admin())
        .await
        .unwrap();
    store.create_run(run_id_run("beta")).await.unwrap();
    assert_exists(store.create_run(run_id_run("acme")).await, "run run-1");
}

fn run_id_run(tenant: &str) -> RunRecord {
    run(tenant, "run-1", 3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sqlite_migration_keeps_existing_runs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let (_migrations, migrator) = older_migrator("sqlite", 4).await;
    {
        let mut conn = SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true)
            .foreign_keys(true)
            .connect()
            .await
            .unwrap();
        migrator.run(&mut conn).await.unwrap();
        for statement in OLD_ROWS {
            let statement = statement.replace(" OWNERVALUE", "").replace(" OWNER", "");
            conn.execute(sqlx::AssertSqlSafe(statement)).await.unwrap();
        }
        conn.close().await.unwrap();
    }
    // A file the old version created keeps the mode SQLite gave it; its owner makes it
    // private, as the refusal to open it otherwise says.
    {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let store = SqliteStore::open(&path).await.unwrap();
    check_migrated(&store).await;
    // The rebuilt table kept its foreign keys: a call of a run that does not exist is refused.
    let orphan = new_call("acme", "run-404", "c-orphan", None);
    assert!(store.record_call(orphan).await.is_err());
    store.close().await;
}

/// A fresh schema as an older gateway left it: its first `count` migrations, then `rows`.
#[cfg(feature = "postgres-tests")]
async fn older_pg_schema(count: usize, rows: impl IntoIterator<Item = String>) -> PgSchema {
    let schema = PgSchema::fresh();
    let (_migrations, migrator) = older_migrator("postgres", count).await;
    let mut conn = schema.raw().await;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "CREATE SCHEMA {}",
        schema.name()
    )))
    .await
    .unwrap();
    migrator.run(&mut conn).await.unwrap();
    for statement in rows {
        conn.execute(sqlx::AssertSqlSafe(statement)).await.unwrap();
    }
    conn.close().await.unwrap();
    schema
}

#[cfg(feature = "postgres-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_migration_keeps_existing_runs() {
    let rows = OLD_ROWS.map(|statement| {
        statement
            .replace(" OWNERVALUE", ", 7")
            .replace(" OWNER", ", owner")
    });
    let schema = older_pg_schema(1, rows).await;
    let store = schema.open().await;
    check_migrated(&store).await;
    let orphan = new_call("acme", "run-404", "c-orphan", None);
    assert!(store.record_call(orphan).await.is_err());
    store.close().await;
}

/// Before migration 0010 of PostgreSQL a call in flight was a `running` row of `tool_calls`
/// and a sealed answer was kept in the call's row: the migration moves both into their own
/// tables, and recovery, replays and the purge find them there.
#[cfg(feature = "postgres-tests")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_migration_moves_calls_in_flight_and_answers_out_of_the_call_rows() {
    let calls = "INSERT INTO tool_calls (id, tenant, run, agent, tool, action, tool_use_id, \
         correlation_id, status, args_hash, input_redacted, attempts, created_at, updated_at, \
         owner, answer_sealed, answer_expires_at) VALUES \
         ('c-running', 'acme', 'run-1', 'bot', 'slack.post_message', 'post_message', 'tu-1', \
         'corr', 'running', 'ab', '{}', 1, 1, 1, 424242, NULL, NULL), \
         ('c-done', 'acme', 'run-1', 'bot', 'slack.post_message', 'post_message', 'tu-2', \
         'corr', 'succeeded', 'ab', '{}', 1, 1, 2, 424242, 'sealed-answer', 5000)";
    let rows = OLD_ROWS
        .iter()
        .take(3)
        .chain([&calls])
        .map(|row| (*row).to_owned());
    let schema = older_pg_schema(9, rows).await;
    let store = schema.open().await;
    let acme = tenant_id("acme");
    // No process holds instance 424242's lock: its running call was interrupted.
    let running = store.list_running_calls(10).await.unwrap();
    assert_eq!(
        running
            .iter()
            .map(|call| call.id.as_str())
            .collect::<Vec<_>>(),
        ["c-running"]
    );
    let answer = store
        .get_call_answer(&acme, &call_id("c-done"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (answer.sealed.as_str(), answer.expires_at.0),
        ("sealed-answer", 5000)
    );
    // Another tenant does not see it.
    assert!(
        store
            .get_call_answer(&tenant_id("beta"), &call_id("c-done"))
            .await
            .unwrap()
            .is_none()
    );
    // Settling the interrupted call takes it out of flight.
    let settled = FinishCall {
        status: ToolCallStatus::OutcomeUnknown,
        events: Vec::new(),
        ..finish("acme", "c-running")
    };
    assert!(store.finish_call(settled).await.unwrap());
    assert!(store.list_running_calls(10).await.unwrap().is_empty());
    assert_eq!(store.purge_answers(Timestamp(4999), 10).await.unwrap(), 0);
    assert_eq!(store.purge_answers(Timestamp(5000), 10).await.unwrap(), 1);
    assert!(
        store
            .get_call_answer(&acme, &call_id("c-done"))
            .await
            .unwrap()
            .is_none()
    );
    store.close().await;
}
