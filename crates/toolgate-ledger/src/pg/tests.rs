//! Tests of what only the PostgreSQL store has: group commit as one statement (a batch made
//! exact by holding a chain head, as another replica would), the triggers, tampering by someone
//! with database access, and several stores (replicas) sharing one schema. The `Store` contract
//! itself is tested on both backends in `crate::tests::store`.

use std::sync::Arc;

use sqlx::Executor;
use sqlx::postgres::PgConnection;
use toolgate_core::{ToolCallStatus, ToolUseId};

use super::{PgOptions, PgStore};
use crate::error::LedgerError;
use crate::model::*;
use crate::ops::WriterStats;
use crate::store::Store;
use crate::tests::*;

/// Writes waiting in a store's queue.
fn queued(store: &PgStore) -> usize {
    store.writer.max_capacity() - store.writer.capacity()
}

/// Another store (another replica) on `db`'s schema.
async fn replica(db: &Db) -> Arc<PgStore> {
    Arc::new(db.pg_schema().open().await)
}

/// Waits until some session is blocked by the session `pid`.
async fn wait_until_blocked_by(probe: &mut PgConnection, pid: i32) {
    let started = std::time::Instant::now();
    loop {
        let waiting: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))",
        )
        .bind(pid)
        .fetch_one(&mut *probe)
        .await
        .unwrap();
        if waiting > 0 {
            return;
        }
        assert!(
            started.elapsed() < HANG,
            "never happened: the writer waits for the held chain head"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

// --- group commit ------------------------------------------------------------------------------

/// Commits `writes` as one batch of `db`'s writer, in the given order, and returns the answers
/// and what the writer did for that batch.
///
/// PostgreSQL's writer cannot be paused, so the batch is made the way another replica would:
/// a session holds `acme`'s chain head, the writer takes a first append to `acme` (the plug)
/// and waits for the head; meanwhile `writes` queue up one by one; when the head is released,
/// the plug commits alone and everything queued is the next batch.
async fn one_batch(db: &Db, writes: Vec<Write>) -> (Vec<Answer>, WriterStats) {
    let store = db.pg_store();
    let mut holder = db.pg_schema().raw().await;
    holder.execute("BEGIN").await.unwrap();
    holder
        .execute("SELECT 1 FROM audit_heads WHERE tenant = 'acme' FOR UPDATE")
        .await
        .unwrap();
    let holder_pid: i32 = sqlx::query_scalar("SELECT pg_backend_pid()")
        .fetch_one(&mut holder)
        .await
        .unwrap();
    let before = store.stats();
    let plug = {
        let store = Arc::clone(&store);
        tokio::spawn(async move { store.append_events(vec![note("acme", 0)]).await })
    };
    let mut probe = db.pg_schema().raw().await;
    wait_until_blocked_by(&mut probe, holder_pid).await;
    assert_eq!(queued(&store), 0, "the writer has taken the plug");

    let shared: Arc<dyn Store> = Arc::clone(&store) as Arc<dyn Store>;
    let mut tasks = Vec::new();
    for (queued_before, write) in writes.into_iter().enumerate() {
        tasks.push(write(Arc::clone(&shared)));
        wait_until("the write is queued", || queued(&store) > queued_before).await;
    }
    holder.execute("ROLLBACK").await.unwrap();
    plug.await.unwrap().unwrap();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let after = store.stats();
    // The plug was a batch of its own on the fast path: one commit, one operation.
    let stats = WriterStats {
        commits: after.commits - before.commits - 1,
        ops: after.ops - before.ops - 1,
        bulk_fallbacks: after.bulk_fallbacks - before.bulk_fallbacks,
        step_by_step: after.step_by_step - before.step_by_step,
        inline: after.inline - before.inline,
    };
    (answers, stats)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_hot_writes_is_one_statement() {
    let db = seeded(Backend::Pg, 100).await;
    let store = db.store();
    store.create_tenant(tenant("beta"), &admin()).await.unwrap();
    for id in ["old-1", "old-2"] {
        store
            .record_call(new_call("acme", "run-1", id, None))
            .await
            .unwrap();
    }
    assert!(store.finish_call(finish("acme", "old-2")).await.unwrap());

    let mut writes: Vec<Write> = (1..=4)
        .map(|i| {
            record(new_call(
                "acme",
                "run-1",
                &format!("call-{i}"),
                Some(&format!("use-{i}")),
            ))
        })
        .collect();
    let mut waiting = waiting_call("acme", "call-w", Some("use-w"));
    waiting.pending.as_mut().unwrap().timeout = Some(std::time::Duration::from_millis(1500));
    writes.push(record(waiting));
    writes.push(finishing(finish("acme", "old-1")));
    writes.push(appending(vec![note("beta", 1), note("beta", 2)]));
    let (answers, stats) = one_batch(&db, writes).await;

    let mut expected = vec![Answer::Recorded(Ok(RecordOutcome::Recorded)); 5];
    expected.extend([Answer::Finished(Ok(true)), Answer::Appended(Ok(()))]);
    assert_eq!(answers, expected);
    assert_eq!(
        (
            stats.commits,
            stats.ops,
            stats.bulk_fallbacks,
            stats.step_by_step
        ),
        (1, 7, 0, 0)
    );
    // The four new calls run; the waiting one does not, and `old-1` finished in the batch.
    assert_eq!(
        in_flight(&db).await,
        ["call-1", "call-2", "call-3", "call-4"]
    );

    let acme = tenant_id("acme");
    let run_now = store
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((run_now.calls_used, run_now.pending_approvals), (7, 1));
    assert_eq!(run_now.status, RunStatus::WaitingApproval);
    let old = store
        .get_tool_call(&acme, &call_id("old-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((old.status, old.attempts), (ToolCallStatus::Succeeded, 1));
    let decision = store
        .get_tool_call(&acme, &call_id("call-3"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(decision.policy_decision_id.as_deref(), Some("dec-call-3"));
    let waiting = store.get_pending(&acme, "pend-call-w").await.unwrap();
    assert_eq!(
        waiting.map(|p| (p.state, p.timeout)),
        Some((
            PendingState::Pending,
            Some(std::time::Duration::from_millis(1500))
        ))
    );
    // 2 from the setup (tenant and agent created), 3 before (2 requested, 1 succeeded) and
    // the plug; then 4 requested, 2 for the waiting call, 1 for the finish, in the order queued.
    let kinds: Vec<String> = events_of(store, "acme")
        .await
        .into_iter()
        .skip(6)
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            "tool_call.requested",
            "tool_call.requested",
            "tool_call.requested",
            "tool_call.requested",
            "tool_call.requested",
            "tool_call.approval_requested",
            "tool_call.succeeded",
        ]
    );
    // Beta's creation and the two notes.
    assert_eq!(events_of(store, "beta").await.len(), 3);
    let report = store.verify_chains().await.unwrap();
    assert_eq!((report.events_checked, report.first_problem), (16, None));

    // The chain heads moved with the batch: a later append continues both chains.
    store
        .append_events(vec![note("acme", 9), note("beta", 9)])
        .await
        .unwrap();
    assert_eq!(store.verify_chains().await.unwrap().first_problem, None);
}

/// The mixed batch of the SQLite test: budget 4 with 1 used, so calls 1 to 3 fit and call 4
/// does not; a retried `tool_use_id`; a finish; a call of a missing run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_bulk_write_falls_back_to_one_by_one() {
    let db = seeded(Backend::Pg, 4).await;
    let store = db.store();
    store
        .record_call(new_call("acme", "run-1", "old-1", Some("use-old")))
        .await
        .unwrap();
    let old = store
        .get_tool_call(&tenant_id("acme"), &call_id("old-1"))
        .await
        .unwrap()
        .unwrap();

    let mut writes: Vec<Write> = (1..=4)
        .map(|i| {
            record(new_call(
                "acme",
                "run-1",
                &format!("call-{i}"),
                Some(&format!("use-{i}")),
            ))
        })
        .collect();
    writes.push(record(new_call(
        "acme",
        "run-1",
        "old-1-retry",
        Some("use-old"),
    )));
    writes.push(finishing(finish("acme", "old-1")));
    writes.push(record(new_call("acme", "run-404", "call-x", None)));
    let (answers, stats) = one_batch(&db, writes).await;

    assert_eq!(
        answers[..3],
        vec![Answer::Recorded(Ok(RecordOutcome::Recorded)); 3]
    );
    let Answer::Recorded(Ok(RecordOutcome::BudgetExceeded(blocked))) = &answers[3] else {
        panic!("call 4 should be over budget: {:?}", answers[3]);
    };
    assert_eq!(blocked.id, call_id("call-4"));
    assert_eq!(
        answers[4],
        Answer::Recorded(Ok(RecordOutcome::Duplicate(old)))
    );
    assert_eq!(answers[5], Answer::Finished(Ok(true)));
    assert!(
        matches!(&answers[6], Answer::Recorded(Err(message)) if message.contains("run run-404")),
        "{:?}",
        answers[6]
    );
    assert_eq!((stats.commits, stats.ops, stats.bulk_fallbacks), (1, 7, 1));
    assert!(stats.step_by_step >= 3, "{stats:?}");
    // Written one by one: the calls that run are in flight, the one over budget never was,
    // and the finished one left.
    assert_eq!(in_flight(&db).await, ["call-1", "call-2", "call-3"]);

    let acme = tenant_id("acme");
    let run_now = store
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run_now.calls_used, 4);
    assert_eq!(
        store
            .get_tool_call(&acme, &call_id("call-x"))
            .await
            .unwrap(),
        None
    );
    let report = store.verify_chains().await.unwrap();
    assert_eq!(report.first_problem, None);
    // 2 from the setup, 1 before and the plug; 3 requested, requested + blocked for call 4,
    // succeeded for old-1.
    assert_eq!(report.events_checked, 10);
}

/// A batch of good calls, finishes and appends with one repeated `tool_use_id`: the repeat gets
/// the recorded call, every other operation its own answer, all in one commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_tool_use_id_in_a_batch_is_answered_alone() {
    let db = seeded(Backend::Pg, 100).await;
    let store = db.store();
    store
        .record_call(new_call("acme", "run-1", "old", Some("use-old")))
        .await
        .unwrap();
    let old = store
        .get_tool_call(&tenant_id("acme"), &call_id("old"))
        .await
        .unwrap()
        .unwrap();
    let call = |i: i64| {
        record(new_call(
            "acme",
            "run-1",
            &format!("call-{i}"),
            Some(&format!("use-{i}")),
        ))
    };
    let writes: Vec<Write> = vec![
        call(1),
        call(2),
        record(new_call("acme", "run-1", "old-retry", Some("use-old"))),
        call(3),
        call(4),
        finishing(finish("acme", "old")),
        appending(vec![note("acme", 1)]),
    ];
    let (answers, stats) = one_batch(&db, writes).await;
    let recorded = Answer::Recorded(Ok(RecordOutcome::Recorded));
    assert_eq!(
        answers,
        [
            recorded.clone(),
            recorded.clone(),
            Answer::Recorded(Ok(RecordOutcome::Duplicate(old))),
            recorded.clone(),
            recorded,
            Answer::Finished(Ok(true)),
            Answer::Appended(Ok(())),
        ]
    );
    assert_eq!((stats.commits, stats.ops, stats.bulk_fallbacks), (1, 7, 1));

    let acme = tenant_id("acme");
    assert_eq!(
        store
            .get_tool_call(&acme, &call_id("old-retry"))
            .await
            .unwrap(),
        None
    );
    let run_now = store
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run_now.calls_used, 5);
    let report = store.verify_chains().await.unwrap();
    // 2 from the setup, 1 before and the plug; 4 requested, 1 succeeded, 1 note.
    assert_eq!((report.events_checked, report.first_problem), (10, None));
}

/// A batch in which one call finds the budget used up: that call is blocked, the others are
/// recorded (including one that does not count), all in one commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_over_budget_in_a_batch_is_answered_alone() {
    let db = seeded(Backend::Pg, 3).await;
    let store = db.store();
    let mut free = new_call("acme", "run-1", "call-free", None);
    free.count_against_budget = false;
    let writes: Vec<Write> = vec![
        record(new_call("acme", "run-1", "call-1", None)),
        record(new_call("acme", "run-1", "call-2", None)),
        record(new_call("acme", "run-1", "call-3", None)),
        record(new_call("acme", "run-1", "call-4", None)),
        record(free),
        appending(vec![note("acme", 1)]),
    ];
    let (answers, stats) = one_batch(&db, writes).await;
    let recorded = Answer::Recorded(Ok(RecordOutcome::Recorded));
    assert_eq!(answers[..3], vec![recorded.clone(); 3]);
    let Answer::Recorded(Ok(RecordOutcome::BudgetExceeded(blocked))) = &answers[3] else {
        panic!("call 4 should be over budget: {:?}", answers[3]);
    };
    assert_eq!(
        (blocked.id.as_str(), blocked.status),
        ("call-4", ToolCallStatus::Blocked)
    );
    assert_eq!(answers[4..], [recorded, Answer::Appended(Ok(()))]);
    assert_eq!((stats.commits, stats.ops, stats.bulk_fallbacks), (1, 6, 1));

    let acme = tenant_id("acme");
    let run_now = store
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run_now.calls_used, 3);
    // After the setup's 2 events (tenant and agent created) and the plug.
    let kinds: Vec<String> = events_of(store, "acme")
        .await
        .into_iter()
        .skip(3)
        .map(|e| e.kind)
        .collect();
    assert_eq!(
        kinds,
        [
            "tool_call.requested",
            "tool_call.requested",
            "tool_call.requested",
            "tool_call.requested",
            "tool_call.blocked",
            "tool_call.requested",
            "admin.note",
        ]
    );
    assert_eq!(store.verify_chains().await.unwrap().first_problem, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_calls_and_finishes_share_commits() {
    let db = seeded(Backend::Pg, 1_000).await;
    let store = db.shared();
    let before = db.stats();
    let tasks: Vec<_> = (0..150)
        .map(|i| {
            let store = Arc::clone(&store);
            tokio::spawn(async move {
                let id = format!("call-{i}");
                let recorded = store
                    .record_call(new_call("acme", "run-1", &id, Some(&format!("use-{i}"))))
                    .await
                    .unwrap();
                let finished = store.finish_call(finish("acme", &id)).await.unwrap();
                (recorded, finished)
            })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), (RecordOutcome::Recorded, true));
    }
    let after = db.stats();
    let ops = after.ops - before.ops;
    let commits = after.commits - before.commits;
    assert_eq!(ops, 300);
    assert!(
        commits < ops,
        "300 writes took {commits} commits: nothing was batched"
    );
    assert_eq!(
        (after.bulk_fallbacks, after.step_by_step),
        (0, 0),
        "every batch was one statement"
    );

    let acme = tenant_id("acme");
    let calls = store
        .list_tool_calls(&acme, &run_id("run-1"), None, 1_000)
        .await
        .unwrap();
    assert_eq!(calls.len(), 150);
    assert!(
        calls
            .iter()
            .all(|call| call.status == ToolCallStatus::Succeeded)
    );
    let report = store.verify_chains().await.unwrap();
    // The setup's 2 events, then 2 for each call.
    assert_eq!((report.events_checked, report.first_problem), (302, None));
}

// --- triggers and tampering --------------------------------------------------------------------

#[tokio::test]
async fn audit_events_are_append_only() {
    let db = two_chains(Backend::Pg).await;
    let mut conn = db.pg_schema().raw().await;
    for sql in [
        "UPDATE audit_events SET payload = '{}' WHERE chain_seq = 1",
        "DELETE FROM audit_events WHERE chain_seq = 5",
        "TRUNCATE audit_events",
        "DELETE FROM audit_heads",
        "TRUNCATE audit_heads",
        "UPDATE audit_heads SET chain_seq = 1",
    ] {
        let error = conn.execute(sql).await.unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("append-only") || message.contains("audit chain heads"),
            "{sql}: {message}"
        );
    }
    let report = db.store().verify_chains().await.unwrap();
    assert_eq!((report.events_checked, report.first_problem), (11, None));
}

/// Tampering only PostgreSQL has words for.
const PG_TAMPERS: &[Tamper] = &[
    Tamper {
        name: "truncate the events",
        sql: &["TRUNCATE audit_events"],
        tenant: "acme",
        kind: ChainProblemKind::Deleted,
        chain_seq: 1,
        detail: "the head records 7 events but the chain ends at 0",
    },
    Tamper {
        name: "truncate the heads",
        sql: &["TRUNCATE audit_heads"],
        tenant: "acme",
        kind: ChainProblemKind::Deleted,
        chain_seq: 8,
        detail: "no head record",
    },
];

/// Builds fresh chains, applies `tamper` through a plain connection after switching off what
/// stands in an attacker's way (the triggers, `seq` being generated always) and checks what
/// `verify_chains` reports, through the store that stayed open.
async fn check(tamper: &Tamper) {
    let db = two_chains(Backend::Pg).await;
    let statements = tamper_sql(db.store(), tamper).await;
    let mut conn = db.pg_schema().raw().await;
    for sql in [
        "ALTER TABLE audit_events DISABLE TRIGGER USER",
        "ALTER TABLE audit_heads DISABLE TRIGGER USER",
        "ALTER TABLE audit_events ALTER COLUMN seq SET GENERATED BY DEFAULT",
    ] {
        conn.execute(sql).await.unwrap();
    }
    for sql in statements {
        conn.execute(sqlx::AssertSqlSafe(sql.clone()))
            .await
            .unwrap_or_else(|error| panic!("{}: `{sql}`: {error}", tamper.name));
    }
    sqlx::Connection::close(conn).await.unwrap();
    let report = db.store().verify_chains().await.unwrap();
    assert_detected(tamper, &report);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_is_detected() {
    // Each case needs fresh chains (a schema of its own): a few at a time, to keep the wall
    // time down without taking many of the server's connections.
    let cases: Vec<&'static Tamper> = TAMPERS.iter().chain(PG_TAMPERS).collect();
    for group in cases.chunks(4) {
        join_all(group.iter().map(|&tamper| check(tamper)).collect()).await;
    }
}

#[tokio::test]
async fn the_first_broken_chain_is_reported() {
    check(&BOTH_CHAINS).await;
}

// --- schemas -----------------------------------------------------------------------------------

#[tokio::test]
async fn a_store_keeps_its_tables_in_its_schema() {
    let db = seeded(Backend::Pg, 10).await;
    let mut conn = db.pg_schema().raw().await;
    let schemas: Vec<String> = sqlx::query_scalar(
        "SELECT table_schema::text FROM information_schema.tables \
         WHERE table_name = 'tool_calls' AND table_schema = $1",
    )
    .bind(db.pg_schema().name())
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(schemas, [db.pg_schema().name()]);
    let tenants: Vec<String> = sqlx::query_scalar("SELECT id FROM tenants ORDER BY id")
        .fetch_all(&mut conn)
        .await
        .unwrap();
    // With the system audit chain's reserved row.
    assert_eq!(tenants, ["@system", "acme"]);

    // Another schema of the same database is another ledger.
    let other = Db::pg().await;
    assert!(other.store().list_tenants().await.unwrap().is_empty());
    assert_eq!(
        other
            .store()
            .get_run(&tenant_id("acme"), &run_id("run-1"))
            .await
            .unwrap(),
        None
    );
}

#[tokio::test]
async fn schema_names_are_plain_identifiers() {
    for bad in [
        "",
        "Upper",
        "1st",
        "a-b",
        "x; DROP SCHEMA public",
        &"a".repeat(64),
    ] {
        let refused = PgStore::connect(&PgOptions {
            url: pg_url(),
            schema: Some(bad.to_owned()),
        })
        .await;
        match refused {
            Err(LedgerError::Database(message)) => assert!(
                message.contains("invalid PostgreSQL schema name"),
                "{bad:?}: {message}"
            ),
            other => panic!("{bad:?} was not refused: {other:?}"),
        }
    }
}

// --- replicas ----------------------------------------------------------------------------------

/// Two stores on one schema append to the same tenants at once: one chain per tenant, positions
/// 1..N without gaps, every event chained to its predecessor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_replicas_keep_one_chain_per_tenant() {
    let db = seeded(Backend::Pg, 10_000).await;
    db.store()
        .create_tenant(tenant("beta"), &admin())
        .await
        .unwrap();
    let a = db.shared();
    let b_store = replica(&db).await;
    let b: Arc<dyn Store> = Arc::clone(&b_store) as Arc<dyn Store>;
    let tasks: Vec<_> = (0..120)
        .map(|i| {
            let store = if i % 2 == 0 {
                Arc::clone(&a)
            } else {
                Arc::clone(&b)
            };
            tokio::spawn(async move {
                let id = format!("call-{i}");
                match i % 3 {
                    0 => {
                        let recorded = store
                            .record_call(new_call("acme", "run-1", &id, Some(&id)))
                            .await
                            .unwrap();
                        assert_eq!(recorded, RecordOutcome::Recorded);
                        assert!(store.finish_call(finish("acme", &id)).await.unwrap());
                    }
                    1 => store
                        .append_events(vec![note("beta", i), note("acme", i)])
                        .await
                        .unwrap(),
                    _ => {
                        let recorded = store
                            .record_call(new_call("acme", "run-1", &id, Some(&id)))
                            .await
                            .unwrap();
                        assert_eq!(recorded, RecordOutcome::Recorded);
                    }
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }

    // 40 calls with 2 events, 40 notes, 40 calls with 1 event on acme; 40 notes on beta; and
    // the 3 creation events (acme, its agent, beta).
    for (name, store) in [("a", &a), ("b", &b)] {
        let report = store.verify_chains().await.unwrap();
        assert_eq!(
            (
                report.events_checked,
                report.chains_checked,
                report.first_problem.clone()
            ),
            (203, 2, None),
            "as replica {name} sees it"
        );
    }
    for (tenant, length) in [("acme", 162), ("beta", 41)] {
        let events = events_of(a.as_ref(), tenant).await;
        assert_eq!(
            events.iter().map(|e| e.chain_seq).collect::<Vec<_>>(),
            (1..=length).collect::<Vec<_>>(),
            "{tenant}"
        );
        assert_eq!(events[0].prev_hash, crate::GENESIS_HASH);
        for pair in events.windows(2) {
            assert_eq!(pair[1].prev_hash, pair[0].hash, "{tenant}");
            assert!(
                pair[1].seq > pair[0].seq,
                "{tenant}: chain order is commit order"
            );
        }
    }
    let run_now = b
        .get_run(&tenant_id("acme"), &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run_now.calls_used, 80);
    b_store.close().await;
}

/// WatchRun's cursor across replicas: a reader on one replica following a tenant's chain while
/// both replicas append never sees a gap (chain order is commit order across replicas), and
/// verification meanwhile never reports damage.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_reader_never_skips_an_event_of_either_replica() {
    let db = seeded(Backend::Pg, 10).await;
    let a = db.shared();
    let b_store = replica(&db).await;
    let b: Arc<dyn Store> = Arc::clone(&b_store) as Arc<dyn Store>;
    let writers: Vec<_> = (0..6)
        .map(|w| {
            let store = if w % 2 == 0 {
                Arc::clone(&a)
            } else {
                Arc::clone(&b)
            };
            tokio::spawn(async move {
                for i in 0..25 {
                    store
                        .append_events(vec![note("acme", w * 100 + i)])
                        .await
                        .unwrap();
                }
            })
        })
        .collect();
    // The setup's 2 events (tenant and agent created), then the writers' 150 notes.
    let total = 152;
    let mut cursor = 0;
    while cursor < total {
        let page = a.list_events(&tenant_id("acme"), cursor, 7).await.unwrap();
        let seqs: Vec<i64> = page.iter().map(|e| e.chain_seq).collect();
        let len = i64::try_from(seqs.len()).unwrap();
        assert_eq!(
            seqs,
            ((cursor + 1)..=(cursor + len)).collect::<Vec<_>>(),
            "a page after {cursor} skipped an event"
        );
        cursor += len;
        assert_eq!(b.verify_chains().await.unwrap().first_problem, None);
    }
    for writer in writers {
        writer.await.unwrap();
    }
    let report = a.verify_chains().await.unwrap();
    assert_eq!((report.events_checked, report.first_problem), (152, None));
    b_store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_concurrent_claims_on_two_replicas_exactly_one_wins() {
    let db = seeded(Backend::Pg, 10).await;
    let a = db.shared();
    let b_store = replica(&db).await;
    let b: Arc<dyn Store> = Arc::clone(&b_store) as Arc<dyn Store>;
    a.record_call(waiting_call("acme", "call-p", Some("use-p")))
        .await
        .unwrap();
    let observed = b
        .get_pending(&tenant_id("acme"), "pend-call-p")
        .await
        .unwrap()
        .unwrap()
        .version;

    let tasks: Vec<_> = (0..24)
        .map(|i| {
            let store = if i % 2 == 0 {
                Arc::clone(&a)
            } else {
                Arc::clone(&b)
            };
            tokio::spawn(async move {
                let mut decision = decide("call-p", observed, i % 3 != 0, &format!("approver-{i}"));
                decision.events = vec![event("acme", "tool_call.decided", "run-1", "call-p")];
                store.resolve_pending(decision).await.unwrap()
            })
        })
        .collect();
    let mut claimed = 0;
    for task in tasks {
        if task.await.unwrap() {
            claimed += 1;
        }
    }
    assert_eq!(
        claimed, 1,
        "exactly one decision of either replica claims the row"
    );

    let acme = tenant_id("acme");
    let row = a.get_pending(&acme, "pend-call-p").await.unwrap().unwrap();
    assert_eq!(row.version, observed + 1);
    assert_ne!(row.state, PendingState::Pending);
    let run_now = a.get_run(&acme, &run_id("run-1")).await.unwrap().unwrap();
    assert_eq!(
        (run_now.pending_approvals, run_now.status),
        (0, RunStatus::Active)
    );
    let decided = events_of(b.as_ref(), "acme")
        .await
        .into_iter()
        .filter(|e| e.kind == "tool_call.decided")
        .count();
    assert_eq!(decided, 1, "losers wrote no events");
    assert_eq!(b.verify_chains().await.unwrap().first_problem, None);
    b_store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn policy_set_versions_of_two_replicas_never_collide() {
    let db = seeded(Backend::Pg, 10).await;
    let a = db.shared();
    let b_store = replica(&db).await;
    let b: Arc<dyn Store> = Arc::clone(&b_store) as Arc<dyn Store>;
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let store = if i % 2 == 0 {
                Arc::clone(&a)
            } else {
                Arc::clone(&b)
            };
            tokio::spawn(async move {
                store
                    .put_policy_set(
                        &tenant_id("acme"),
                        &format!("// set {i}\npermit(principal, action, resource);"),
                        &admin(),
                    )
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut versions = Vec::new();
    for task in tasks {
        versions.push(task.await.unwrap());
    }
    versions.sort_unstable();
    assert_eq!(versions, (1..=20).collect::<Vec<i64>>());
    let current = b
        .current_policy_set(&tenant_id("acme"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(current.version, 20);
    b_store.close().await;
}

/// `list_running_calls` on PostgreSQL: a replica never lists the calls of a live replica, nor
/// its own; once a replica has closed (releasing its lock), its running calls are listed by
/// the others. An approval makes the approving replica the call's owner.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_calls_of_a_live_replica_are_never_listed() {
    let db = seeded(Backend::Pg, 10).await;
    let a = db.pg_store();
    let b = replica(&db).await;
    for id in ["call-a1", "call-a2"] {
        a.record_call(new_call("acme", "run-1", id, None))
            .await
            .unwrap();
    }
    assert!(a.finish_call(finish("acme", "call-a2")).await.unwrap());
    a.record_call(waiting_call("acme", "call-p", None))
        .await
        .unwrap();
    b.record_call(new_call("acme", "run-1", "call-b1", None))
        .await
        .unwrap();
    // B approves A's suspended call: B runs it now.
    assert!(
        b.resolve_pending(decide("call-p", 1, true, "approver"))
            .await
            .unwrap()
    );

    assert_eq!(
        ids(&a.list_running_calls(10).await.unwrap()),
        Vec::<String>::new()
    );
    assert_eq!(
        ids(&b.list_running_calls(10).await.unwrap()),
        Vec::<String>::new()
    );

    a.close().await;
    assert_eq!(
        ids(&b.list_running_calls(10).await.unwrap()),
        ["call-a1"],
        "A has closed: its running call was interrupted; call-p is B's, and B is alive"
    );

    let c = replica(&db).await;
    assert_eq!(ids(&c.list_running_calls(10).await.unwrap()), ["call-a1"]);
    b.close().await;
    assert_eq!(
        ids(&c.list_running_calls(10).await.unwrap()),
        ["call-a1", "call-p", "call-b1"]
    );
    assert_eq!(
        ids(&c.list_running_calls(2).await.unwrap()),
        ["call-a1", "call-p"]
    );
    c.close().await;
}

/// `close()` releases the instance lock before it returns, so another replica asking right
/// after sees the store's calls as interrupted. (Closing the lock's connection alone is not
/// enough: sqlx sends Terminate without waiting, and the server releases the lock only once
/// that backend has exited; this failed within 30 attempts before `close` unlocked
/// explicitly.)
#[tokio::test]
async fn closing_a_store_releases_its_lock_before_returning() {
    let db = Db::pg().await;
    let mut probe = db.pg_schema().raw().await;
    for attempt in 0..30 {
        let store = db.pg_schema().open().await;
        let key = store.instance();
        store.close().await;
        let free: bool = sqlx::query_scalar("SELECT pg_try_advisory_lock($1)")
            .bind(key)
            .fetch_one(&mut probe)
            .await
            .unwrap();
        assert!(
            free,
            "attempt {attempt}: the instance lock was still held after close() returned"
        );
        sqlx::query("SELECT pg_advisory_unlock($1)")
            .bind(key)
            .execute(&mut probe)
            .await
            .unwrap();
    }
}

/// A commit with audit events on one replica wakes the watchers of the others. (Each schema
/// has its own channel, so other tests committing in other schemas do not tick this store.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_on_one_replica_ticks_the_others() {
    let db = seeded(Backend::Pg, 10).await;
    let a = db.store();
    let b = replica(&db).await;
    let mut ticks = b
        .subscribe_commits()
        .expect("a PostgreSQL store has a commit feed");
    ticks.borrow_and_update();
    a.append_events(vec![note("acme", 1)]).await.unwrap();
    tokio::time::timeout(HANG, ticks.changed())
        .await
        .expect("replica B never ticked after A committed an audit event")
        .expect("B's commit feed closed");
    let seen = events_of(b.as_ref(), "acme").await;
    assert_eq!(
        seen.iter().map(|e| e.kind.as_str()).collect::<Vec<_>>(),
        ["admin.tenant_created", "admin.agent_created", "admin.note"]
    );
    b.close().await;
}

/// A configuration change on one replica (a kill switch here) ticks the others' configuration
/// feed, so they drop their caches; a plain audit commit does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_change_on_one_replica_ticks_the_others() {
    let db = seeded(Backend::Pg, 10).await;
    let a = db.store();
    let b = replica(&db).await;
    let mut commits = b.subscribe_commits().expect("a commit feed");
    let mut config = b
        .subscribe_config_changes()
        .expect("a PostgreSQL store has a configuration feed");
    commits.borrow_and_update();
    config.borrow_and_update();

    // Notifications arrive in commit order: once the event's tick is in, a configuration tick
    // would have been too.
    a.append_events(vec![note("acme", 1)]).await.unwrap();
    tokio::time::timeout(HANG, commits.changed())
        .await
        .expect("replica B never ticked after A committed an audit event")
        .expect("B's commit feed closed");
    assert!(
        !config.has_changed().unwrap(),
        "an audit event is not a configuration change"
    );

    a.set_flag(&tenant_id("acme"), "tool_calling_enabled", false, &admin())
        .await
        .unwrap();
    tokio::time::timeout(HANG, config.changed())
        .await
        .expect("replica B never heard of A's kill switch")
        .expect("B's configuration feed closed");
    assert_eq!(
        b.get_flag(&tenant_id("acme"), "tool_calling_enabled")
            .await
            .unwrap(),
        Some(false)
    );
    b.close().await;
}

/// A repeated `tool_use_id` arriving at two replicas at once: one records the call, the other
/// answers with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tool_use_id_repeated_on_two_replicas_is_recorded_once() {
    let db = seeded(Backend::Pg, 100).await;
    let a = db.shared();
    let b_store = replica(&db).await;
    let b: Arc<dyn Store> = Arc::clone(&b_store) as Arc<dyn Store>;
    let tasks: Vec<_> = (0..16)
        .map(|i| {
            let store = if i % 2 == 0 {
                Arc::clone(&a)
            } else {
                Arc::clone(&b)
            };
            tokio::spawn(async move {
                store
                    .record_call(new_call(
                        "acme",
                        "run-1",
                        &format!("call-{i}"),
                        Some("use-same"),
                    ))
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut outcomes = Vec::new();
    for task in tasks {
        outcomes.push(task.await.unwrap());
    }
    let acme = tenant_id("acme");
    let stored = a
        .find_tool_call_by_use_id(
            &acme,
            &run_id("run-1"),
            &ToolUseId::new("use-same").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    let recorded = outcomes
        .iter()
        .filter(|outcome| **outcome == RecordOutcome::Recorded)
        .count();
    assert_eq!(recorded, 1, "{outcomes:?}");
    for outcome in &outcomes {
        match outcome {
            RecordOutcome::Recorded => {}
            RecordOutcome::Duplicate(call) => assert_eq!(call, &stored),
            other => panic!("unexpected outcome {other:?}"),
        }
    }
    let run_now = a.get_run(&acme, &run_id("run-1")).await.unwrap().unwrap();
    assert_eq!(run_now.calls_used, 1);
    let report = b.verify_chains().await.unwrap();
    // The setup's 2 events and the one call's.
    assert_eq!((report.events_checked, report.first_problem), (3, None));
    b_store.close().await;
}

// --- losing the instance lock ------------------------------------------------------------------

/// The backend holding the advisory lock on `key` (a bigint key shows in `pg_locks` as
/// `classid` = high 32 bits, `objid` = low 32 bits, `objsubid` = 1), if any.
pub(crate) async fn instance_lock_holder(probe: &mut PgConnection, key: i64) -> Option<i32> {
    let bits = key.cast_unsigned();
    let high = i64::from(u32::try_from(bits >> 32).unwrap());
    let low = i64::from(u32::try_from(bits & 0xFFFF_FFFF).unwrap());
    sqlx::query_scalar(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
         AND classid::bigint = $1 AND objid::bigint = $2 \
         AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
    )
    .bind(high)
    .bind(low)
    .fetch_optional(&mut *probe)
    .await
    .unwrap()
}

/// Waits until `store` says it holds (or lost) its instance lock.
async fn wait_for_lock_state(store: &PgStore, held: bool) {
    let started = std::time::Instant::now();
    while store.holds_instance_lock() != held {
        assert!(
            started.elapsed() < HANG,
            "the store never noticed: holds_instance_lock stayed {}",
            !held
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// The backend holding a store's instance lock is terminated (`pg_terminate_backend`, as a
/// server restart or a cut network would): the store notices, refuses to record a `running`
/// call or an approval claim (`Unavailable`) while it does not hold the lock (here someone
/// else holds it), still records refusals and finishes the calls in flight, and takes the lock
/// again under the same key on a new connection as soon as it is free, then starts calls again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn losing_the_instance_lock_stops_new_calls_until_it_is_taken_again() {
    let db = seeded(Backend::Pg, 10).await;
    let store = db.pg_store();
    let key = store.instance();
    store
        .record_call(new_call("acme", "run-1", "call-1", None))
        .await
        .unwrap();
    store
        .record_call(waiting_call("acme", "call-p", None))
        .await
        .unwrap();
    let mut probe = db.pg_schema().raw().await;
    let first = instance_lock_holder(&mut probe, key)
        .await
        .expect("the store holds its lock");

    // Terminate that backend and take the key in its place as soon as it is gone, so the
    // store cannot take it back before this test lets it.
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(&mut probe)
        .await
        .unwrap();
    assert!(terminated);
    sqlx::query("SELECT pg_advisory_lock($1)")
        .bind(key)
        .execute(&mut probe)
        .await
        .unwrap();
    wait_for_lock_state(&store, false).await;

    let refused = store
        .record_call(new_call("acme", "run-1", "call-2", None))
        .await;
    match refused {
        Err(LedgerError::NotLive(message)) => {
            assert!(message.contains("starts no tool call"), "{message}");
        }
        other => panic!("a running call was recorded without the lock: {other:?}"),
    }
    let claim = store
        .resolve_pending(decide("call-p", 1, true, "approver"))
        .await;
    assert!(matches!(claim, Err(LedgerError::NotLive(_))), "{claim:?}");
    let mut blocked = new_call("acme", "run-1", "call-b", None);
    blocked.call.status = ToolCallStatus::Blocked;
    blocked.count_against_budget = false;
    store.record_call(blocked).await.unwrap();
    assert!(
        store.finish_call(finish("acme", "call-1")).await.unwrap(),
        "a call in flight still finishes"
    );
    assert!(
        store
            .get_tool_call(&tenant_id("acme"), &call_id("call-2"))
            .await
            .unwrap()
            .is_none(),
        "the refused call left nothing behind"
    );

    // The key is free again: the store takes it back, under the same key, on a new backend.
    sqlx::query("SELECT pg_advisory_unlock($1)")
        .bind(key)
        .execute(&mut probe)
        .await
        .unwrap();
    wait_for_lock_state(&store, true).await;
    let second = instance_lock_holder(&mut probe, key)
        .await
        .expect("the store holds its lock again");
    assert_ne!(second, first, "a new connection holds it");
    assert_eq!(store.instance(), key);
    store
        .record_call(new_call("acme", "run-1", "call-2", None))
        .await
        .unwrap();
    assert!(
        store
            .resolve_pending(decide("call-p", 1, true, "approver"))
            .await
            .unwrap()
    );
    let other = replica(&db).await;
    assert!(
        other.list_running_calls(10).await.unwrap().is_empty(),
        "the store's running calls count as alive again"
    );
    other.close().await;
    db.close().await;
    assert_eq!(
        instance_lock_holder(&mut probe, key).await,
        None,
        "close releases the lock taken again"
    );
}

/// The ids of the calls in flight, in id order.
async fn in_flight(db: &Db) -> Vec<String> {
    let mut conn = db.pg_schema().raw().await;
    sqlx::query_scalar("SELECT call_id FROM calls_in_flight ORDER BY call_id")
        .fetch_all(&mut conn)
        .await
        .unwrap()
}

/// A call's finish can be a HOT update (rewritten in place, no new index entry): no index of
/// `tool_calls` reads a column the finish changes, in its key, an expression or a partial
/// index's predicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finish_changes_no_indexed_column_of_the_call() {
    let db = seeded(Backend::Pg, 10).await;
    let mut conn = db.pg_schema().raw().await;
    let indexes: Vec<(String, String)> = sqlx::query_as(
        "SELECT i.relname::text, pg_get_indexdef(x.indexrelid) \
         FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid \
         WHERE x.indrelid = 'tool_calls'::regclass ORDER BY 1",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert!(indexes.len() >= 3, "{indexes:?}");
    let finished = [
        "status",
        "output_redacted",
        "error_code",
        "error_text",
        "duration_ms",
        "attempts",
        "updated_at",
    ];
    for (name, definition) in &indexes {
        for column in finished {
            assert!(
                !definition.contains(column),
                "index {name} reads {column}, which a finish changes: {definition}"
            );
        }
    }
}
