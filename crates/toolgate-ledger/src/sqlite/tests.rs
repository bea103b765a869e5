//! Tests of what only the SQLite store has: its writer's batching (a paused writer, so a batch
//! is exactly what the test queued), the triggers as seen through the file, and tampering with
//! the file. The `Store` contract itself is tested on both backends in `crate::tests::store`.

use std::path::Path;
use std::sync::Arc;

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{ConnectOptions, Connection, Executor};
use toolgate_core::{ToolCallId, ToolCallStatus};

use super::SqliteStore;
use crate::error::LedgerError;
use crate::model::*;
use crate::ops::WriterStats;
use crate::store::Store;
use crate::tests::*;

async fn raw_connection(path: &Path) -> SqliteConnection {
    SqliteConnectOptions::new()
        .filename(path)
        .connect()
        .await
        .expect("raw connection")
}

// --- group commit ------------------------------------------------------------------------------

/// Reopens `db` with a paused writer, queues `writes` in order, then lets the writer run: they
/// are committed as one batch. Returns the answers in order and the writer's counters.
async fn one_batch(db: Db, writes: Vec<Write>) -> (Db, Vec<Answer>, WriterStats) {
    db.close().await;
    let (store, start) = SqliteStore::open_paused(&db.sqlite_path()).await.unwrap();
    let store = Arc::new(store);
    let mut tasks = Vec::new();
    for (queued, write) in writes.into_iter().enumerate() {
        tasks.push(write(Arc::clone(&store) as Arc<dyn Store>));
        // Wait until this write is queued, so the batch keeps the given order.
        wait_until("the write is queued", || store.queued() > queued).await;
    }
    start.send(()).unwrap();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let stats = store.stats();
    let store = Arc::into_inner(store).expect("no other owner");
    (db.with_sqlite_store(store), answers, stats)
}

/// A write while the writer is idle is committed by its caller, on the caller's own thread
/// (no hop to the writer thread and back), and is as durable as a queued one: committed before
/// it is answered, in the file when it is opened again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_at_idle_commits_on_the_callers_thread() {
    let db = seeded(Backend::Sqlite, 100).await;
    let before = db.stats();
    call_and_finish(db.shared(), 1).await;
    let after = db.stats();
    assert_eq!(
        (
            after.inline - before.inline,
            after.commits - before.commits,
            after.ops - before.ops
        ),
        (2, 2, 2),
        "{after:?}"
    );

    let db = db.reopen_without_close().await;
    let call = db
        .store()
        .get_tool_call(&tenant_id("acme"), &call_id("call-1"))
        .await
        .unwrap()
        .expect("the call");
    assert_eq!(call.status, ToolCallStatus::Succeeded);
    assert_eq!(
        db.store().verify_chains().await.unwrap().first_problem,
        None
    );
}

/// Writes a call and finishes it, as the engine does.
async fn call_and_finish(store: Arc<dyn Store>, i: usize) {
    let id = format!("call-{i}");
    let recorded = store
        .record_call(new_call("acme", "run-1", &id, Some(&format!("use-{i}"))))
        .await
        .unwrap();
    assert_eq!(recorded, RecordOutcome::Recorded);
    assert!(store.finish_call(finish("acme", &id)).await.unwrap());
}

/// Writers arriving all at once queue and are committed in batches; a writer alone commits
/// inline; and both at the same time (one caller after another beside a crowd) interleave on
/// the one connection. Every write is answered once and stored once, and the audit chain the
/// two ways extend together stays whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inline_and_queued_writes_interleave_without_loss() {
    const CROWD: usize = 200;
    const ALONE: usize = 20;
    let db = seeded(Backend::Sqlite, 10_000).await;
    let crowd = |from: usize| {
        (from..from + CROWD)
            .map(|i| tokio::spawn(call_and_finish(db.shared(), i)))
            .collect::<Vec<_>>()
    };

    // A crowd: its writes are batched.
    let before = db.stats();
    for task in crowd(0) {
        task.await.unwrap();
    }
    let after = db.stats();
    assert_eq!(after.ops - before.ops, 2 * CROWD as u64, "{after:?}");
    assert!(
        after.commits - before.commits < 2 * CROWD as u64,
        "{after:?}"
    );

    // One caller alone: every write inline.
    let before = db.stats();
    for i in CROWD..CROWD + ALONE {
        call_and_finish(db.shared(), i).await;
    }
    let after = db.stats();
    assert_eq!(
        (after.inline - before.inline, after.commits - before.commits),
        (2 * ALONE as u64, 2 * ALONE as u64),
        "{after:?}"
    );

    // Both at once.
    let lone = CROWD + ALONE;
    let crowd = crowd(lone + ALONE);
    for i in lone..lone + ALONE {
        call_and_finish(db.shared(), i).await;
    }
    for task in crowd {
        task.await.unwrap();
    }

    let total = 2 * (CROWD + ALONE);
    let calls = db
        .store()
        .list_tool_calls(&tenant_id("acme"), &run_id("run-1"), None, 10_000)
        .await
        .unwrap();
    assert_eq!(calls.len(), total);
    assert!(
        calls
            .iter()
            .all(|call| call.status == ToolCallStatus::Succeeded)
    );
    // The setup's events, then a call's requested and succeeded events each.
    let events = events_of(db.store(), "acme").await;
    assert_eq!(events.len(), 2 + 2 * total);
    assert_eq!(
        db.store().verify_chains().await.unwrap().first_problem,
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_hot_writes_commits_once() {
    let db = seeded(Backend::Sqlite, 100).await;
    db.store()
        .create_tenant(tenant("beta"), &admin())
        .await
        .unwrap();
    for id in ["old-1", "old-2"] {
        db.store()
            .record_call(new_call("acme", "run-1", id, None))
            .await
            .unwrap();
    }
    assert!(
        db.store()
            .finish_call(finish("acme", "old-2"))
            .await
            .unwrap()
    );

    let mut waiting = new_call("acme", "run-1", "call-w", Some("use-w"));
    waiting.call.status = ToolCallStatus::WaitingApproval;
    waiting.pending = Some(PendingInvocation {
        timeout: Some(std::time::Duration::from_millis(1500)),
        ..pending("acme", "call-w")
    });
    waiting.events.push(event(
        "acme",
        "tool_call.approval_requested",
        "run-1",
        "call-w",
    ));
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
    writes.push(record(waiting));
    writes.push(finishing(finish("acme", "old-1")));
    writes.push(finishing(finish("acme", "old-1")));
    writes.push(finishing(finish("acme", "old-2")));
    writes.push(appending(vec![
        NewAuditEvent {
            run: None,
            tool_call_id: None,
            ..event("beta", "admin.note", "run-1", "x")
        };
        2
    ]));
    let (db, answers, stats) = one_batch(db, writes).await;

    let mut expected = vec![Answer::Recorded(Ok(RecordOutcome::Recorded)); 5];
    expected.extend([
        Answer::Finished(Ok(true)),
        Answer::Finished(Ok(false)),
        Answer::Finished(Ok(false)),
        Answer::Appended(Ok(())),
    ]);
    assert_eq!(answers, expected);
    assert_eq!(
        (
            stats.commits,
            stats.ops,
            stats.bulk_fallbacks,
            stats.step_by_step
        ),
        (1, 9, 0, 0)
    );

    let acme = tenant_id("acme");
    let run_now = db
        .store()
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((run_now.calls_used, run_now.pending_approvals), (7, 1));
    assert_eq!(run_now.status, RunStatus::WaitingApproval);
    let old = db
        .store()
        .get_tool_call(&acme, &call_id("old-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!((old.status, old.attempts), (ToolCallStatus::Succeeded, 1));
    let decision = db
        .store()
        .get_tool_call(&acme, &call_id("call-3"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(decision.policy_decision_id.as_deref(), Some("dec-call-3"));
    let waiting = db.store().get_pending(&acme, "pend-call-w").await.unwrap();
    assert_eq!(
        waiting.and_then(|p| p.timeout),
        Some(std::time::Duration::from_millis(1500)),
        "the multi-row insert keeps the timeout"
    );
    // 2 from the setup (tenant and agent created), 3 before (2 requested, 1 succeeded); then
    // 4 requested, 2 for the waiting call, 1 for the finish.
    let kinds: Vec<String> = events_of(db.store(), "acme")
        .await
        .into_iter()
        .skip(5)
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
    assert_eq!(events_of(db.store(), "beta").await.len(), 3);
    let report = db.store().verify_chains().await.unwrap();
    assert_eq!((report.events_checked, report.first_problem), (15, None));

    // The chain heads moved with the batch: a later append continues both chains.
    db.store()
        .append_events(vec![event("acme", "admin.note", "run-1", "x")])
        .await
        .unwrap();
    assert_eq!(
        db.store().verify_chains().await.unwrap().first_problem,
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_write_in_a_batch_is_undone_alone() {
    let db = seeded(Backend::Sqlite, 4).await;
    db.store()
        .record_call(new_call("acme", "run-1", "old-1", Some("use-old")))
        .await
        .unwrap();
    let old = db
        .store()
        .get_tool_call(&tenant_id("acme"), &call_id("old-1"))
        .await
        .unwrap()
        .unwrap();

    // Budget 4 with 1 used: calls 1 to 3 fit, call 4 does not; the retry is a duplicate.
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
    let (db, answers, stats) = one_batch(db, writes).await;

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
    assert_eq!(
        (
            stats.commits,
            stats.ops,
            stats.bulk_fallbacks,
            stats.step_by_step
        ),
        (1, 7, 1, 0)
    );

    let acme = tenant_id("acme");
    let run_now = db
        .store()
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run_now.calls_used, 4);
    let report = db.store().verify_chains().await.unwrap();
    assert_eq!(report.first_problem, None);
    // 2 from the setup, 1 before; 3 requested, requested + blocked for call 4, succeeded for
    // old-1.
    assert_eq!(report.events_checked, 9);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_refused_alone_in_its_batch_leaves_nothing_behind() {
    let db = seeded(Backend::Sqlite, 10).await;
    db.store()
        .record_call(new_call("acme", "run-1", "call-0", None))
        .await
        .unwrap();
    let before = db.store().verify_chains().await.unwrap();
    // The call row, the budget, the decision and the first event (moving the chain's head)
    // are written; then the second event, of a tenant that does not exist, is refused. Alone
    // in its batch, the write runs without a savepoint: the whole transaction is undone, the
    // writer's cached head with it.
    let mut refused = new_call("acme", "run-1", "call-1", None);
    refused
        .events
        .push(event("ghost", "tool_call.requested", "run-1", "call-1"));
    let (db, answers, stats) = one_batch(db, vec![record(refused)]).await;
    assert!(
        matches!(&answers[0], Answer::Recorded(Err(message)) if message.contains("tenant ghost")),
        "{:?}",
        answers[0]
    );
    assert_eq!((stats.commits, stats.ops), (0, 1));

    let acme = tenant_id("acme");
    assert_eq!(
        db.store()
            .get_tool_call(&acme, &call_id("call-1"))
            .await
            .unwrap(),
        None
    );
    let run = db
        .store()
        .get_run(&acme, &run_id("run-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(run.calls_used, 1);
    let after = db.store().verify_chains().await.unwrap();
    assert_eq!(after.first_problem, None);
    assert_eq!(after.events_checked, before.events_checked);

    // The next write chains from the head on disk, not from the undone one.
    db.store()
        .record_call(new_call("acme", "run-1", "call-2", None))
        .await
        .unwrap();
    let last = db.store().verify_chains().await.unwrap();
    assert_eq!(last.first_problem, None);
    assert_eq!(last.events_checked, before.events_checked + 1);
}

// --- triggers ----------------------------------------------------------------------------------

#[tokio::test]
async fn audit_events_are_append_only() {
    let db = two_chains(Backend::Sqlite).await;
    let mut conn = raw_connection(&db.sqlite_path()).await;
    for sql in [
        "UPDATE audit_events SET payload = '{}' WHERE chain_seq = 1",
        "DELETE FROM audit_events WHERE chain_seq = 5",
        "DELETE FROM audit_heads",
        "UPDATE audit_heads SET chain_seq = 1",
    ] {
        let error = conn.execute(sql).await.unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("append-only") || message.contains("audit chain heads"),
            "{sql}: {message}"
        );
    }
    conn.close().await.unwrap();
    assert_eq!(
        db.store().verify_chains().await.unwrap().first_problem,
        None
    );
}

// --- audit chain -------------------------------------------------------------------------------

/// Opens a fresh pair of chains, applies `tamper` to the file behind the store's back (with
/// the triggers dropped) and checks what `verify_chains` reports after reopening.
async fn check(tamper: &Tamper) {
    let db = two_chains(Backend::Sqlite).await;
    let statements = tamper_sql(db.store(), tamper).await;
    db.close().await;

    let mut conn = raw_connection(&db.sqlite_path()).await;
    for trigger in [
        "audit_events_no_update",
        "audit_events_no_delete",
        "audit_heads_forward_only",
        "audit_heads_no_delete",
    ] {
        conn.execute(sqlx::AssertSqlSafe(format!("DROP TRIGGER {trigger}")))
            .await
            .unwrap();
    }
    for sql in statements {
        conn.execute(sqlx::AssertSqlSafe(sql)).await.unwrap();
    }
    conn.close().await.unwrap();

    let db = db.reopen().await;
    let report = db.store().verify_chains().await.unwrap();
    assert_detected(tamper, &report);
    db.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tampering_is_detected() {
    // Each case on a file of its own, a few at a time.
    for group in TAMPERS.chunks(4) {
        join_all(group.iter().map(check).collect()).await;
    }
}

#[tokio::test]
async fn the_first_broken_chain_is_reported() {
    check(&BOTH_CHAINS).await;
}

#[tokio::test]
async fn sqlite_has_no_commit_feed() {
    // Only this process writes the file; its engine announces its own writes.
    let db = Db::sqlite().await;
    assert!(db.store().subscribe_commits().is_none());
}

// --- a run's calls --------------------------------------------------------------------------

/// One index serves both what a run's calls are looked up by, their `tool_use_id`, and listing
/// them in order (migration 0013): calls of two runs interleaved, with and without a
/// `tool_use_id`, are listed page by page in the order they were recorded, and the list is read
/// from that index (its `seq`s) and the table by rowid, never by scanning the table.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runs_calls_are_listed_in_order_from_its_one_index() {
    let db = seeded(Backend::Sqlite, 100).await;
    let store = db.store();
    store.create_run(run("acme", "run-2", 100)).await.unwrap();
    let mut expected = Vec::new();
    for i in 0..7 {
        // `tool_use_id`s out of their recording order, and every third call without one.
        let use_id = (i % 3 != 2).then(|| format!("use-{}", 9 - i));
        let id = format!("call-{i}");
        // The same `tool_use_id` in another run is another call, not a replay.
        for (run, id) in [("run-1", id.clone()), ("run-2", format!("other-{i}"))] {
            assert_eq!(
                store
                    .record_call(new_call("acme", run, &id, use_id.as_deref()))
                    .await
                    .unwrap(),
                RecordOutcome::Recorded
            );
        }
        expected.push(id);
    }
    let acme = tenant_id("acme");
    let mut listed = Vec::new();
    let mut after: Option<ToolCallId> = None;
    loop {
        let page = store
            .list_tool_calls(&acme, &run_id("run-1"), after.as_ref(), 3)
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        assert!(page.len() <= 3);
        after = page.last().map(|call| call.id.clone());
        listed.extend(page.into_iter().map(|call| call.id.to_string()));
    }
    assert_eq!(listed, expected);
    // A repeated `tool_use_id` in the run is still a replay of the call that has it.
    assert!(matches!(
        store
            .record_call(new_call("acme", "run-1", "call-again", Some("use-9")))
            .await
            .unwrap(),
        RecordOutcome::Duplicate(call) if call.id.as_str() == "call-0"
    ));

    let path = db.sqlite_path();
    db.close().await;
    let mut conn = raw_connection(&path).await;
    let led_by_run: Vec<String> = sqlx::query_scalar(
        "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'tool_calls' \
         AND sql LIKE '%(run,%' ORDER BY name",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(led_by_run, ["tool_calls_run_tool_use_id"]);
    let plan: Vec<String> = sqlx::query(sqlx::AssertSqlSafe(format!(
        "EXPLAIN QUERY PLAN {}",
        crate::backend::LIST_CALLS_SQLITE
    )))
    .bind("acme")
    .bind("run-1")
    .bind(Option::<String>::None)
    .bind(3_i64)
    .fetch_all(&mut conn)
    .await
    .unwrap_or_else(|error| panic!("no plan: {error}"))
    .iter()
    .map(|step| sqlx::Row::get::<String, _>(step, "detail"))
    .collect();
    assert!(
        plan.iter().any(|step| step
            .contains("USING COVERING INDEX tool_calls_run_tool_use_id (run=? AND tenant=?)")),
        "{plan:?}"
    );
    assert!(
        plan.iter().all(|step| !step.starts_with("SCAN")),
        "{plan:?}"
    );
}

/// Counting a usual call against its run's budget leaves the run's status alone, so SQLite
/// skips the status CHECK: checking `status IN (...)` builds a table of the allowed values
/// (`OpenEphemeral`) every time a statement sets the status, which the suspended call's update
/// still does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_a_call_builds_no_table_of_the_allowed_statuses() {
    let db = seeded(Backend::Sqlite, 100).await;
    let path = db.sqlite_path();
    db.close().await;
    let mut conn = raw_connection(&path).await;
    let mut opcodes = async |sql: &str, binds: &[&str]| -> Vec<String> {
        let explain = format!("EXPLAIN {sql}");
        let mut query = sqlx::query(sqlx::AssertSqlSafe(explain));
        for bind in binds {
            query = query.bind(*bind);
        }
        query
            .fetch_all(&mut conn)
            .await
            .unwrap_or_else(|error| panic!("no program for {sql}: {error}"))
            .iter()
            .map(|step| sqlx::Row::get::<String, _>(step, "opcode"))
            .collect()
    };
    let counted = opcodes(crate::steps::COUNT_CALL, &["acme", "run-1"]).await;
    assert!(!counted.is_empty());
    assert!(
        !counted.iter().any(|op| op == "OpenEphemeral"),
        "{counted:?}"
    );
    let suspended = opcodes(crate::steps::COUNT_PENDING_CALL, &["1", "acme", "run-1"]).await;
    assert!(
        suspended.iter().any(|op| op == "OpenEphemeral"),
        "setting the status checks it: {suspended:?}"
    );
}

// --- one owner per file ----------------------------------------------------------------------

/// A second store on a file another store owns is refused before it reads or writes anything,
/// naming the holder; the owner's running call stays its own (nobody took it for interrupted)
/// and finishes normally. Once the owner is closed, the file opens again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_owner_is_refused_and_leaves_the_first_ones_calls_alone() {
    let db = seeded(Backend::Sqlite, 10).await;
    db.store()
        .record_call(new_call("acme", "run-1", "call-1", None))
        .await
        .unwrap();

    let refused = SqliteStore::open(&db.sqlite_path()).await.unwrap_err();
    let message = refused.to_string();
    assert!(matches!(refused, LedgerError::InUse(_)), "{refused:?}");
    assert!(
        message.contains(&format!("pid {}", std::process::id())),
        "names the holder: {message}"
    );
    assert!(message.contains("ledger.db.lock"), "{message}");

    assert!(db.store().list_running_calls(10).await.unwrap().is_empty());
    assert!(
        db.store()
            .finish_call(finish("acme", "call-1"))
            .await
            .unwrap(),
        "the owner finishes its own call"
    );
    let db = db.reopen().await;
    let call = db
        .store()
        .get_tool_call(&tenant_id("acme"), &call_id("call-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(call.status, ToolCallStatus::Succeeded);
}

/// A read-only store works beside the owner: it sees what the owner commits, verifies the
/// chains, and refuses every write; it takes no lock, so the owner can reopen meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_read_only_store_reads_beside_the_owner_and_writes_nothing() {
    let db = seeded(Backend::Sqlite, 10).await;
    db.store()
        .record_call(new_call("acme", "run-1", "call-1", None))
        .await
        .unwrap();
    let reader = SqliteStore::open_read_only(&db.sqlite_path())
        .await
        .unwrap();
    let report = reader.verify_chains().await.unwrap();
    // The setup's 2 events (tenant and agent created) and the call's.
    assert_eq!((report.events_checked, report.first_problem), (3, None));

    assert!(
        db.store()
            .finish_call(finish("acme", "call-1"))
            .await
            .unwrap()
    );
    let seen = reader
        .get_tool_call(&tenant_id("acme"), &call_id("call-1"))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        seen.status,
        ToolCallStatus::Succeeded,
        "sees the owner's commit"
    );
    assert_eq!(reader.verify_chains().await.unwrap().events_checked, 4);

    let write = reader.create_tenant(tenant("beta"), &admin()).await;
    assert!(matches!(write, Err(LedgerError::ReadOnly)), "{write:?}");
    assert!(
        reader.list_running_calls(10).await.unwrap().is_empty(),
        "a reader settles nothing"
    );
    assert!(
        db.store()
            .get_tenant(&tenant_id("beta"))
            .await
            .unwrap()
            .is_none()
    );
    let db = db.reopen().await;
    assert_eq!(reader.verify_chains().await.unwrap().first_problem, None);
    reader.close().await;
    db.close().await;
}

/// Something that is not a migrated ledger is refused by a read-only open with a message
/// saying so, and left as it was.
#[tokio::test]
async fn a_read_only_open_of_an_unmigrated_file_says_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("empty.db");
    std::fs::write(&path, b"").unwrap();
    let refused = SqliteStore::open_read_only(&path).await.unwrap_err();
    assert!(
        refused.to_string().contains("is not a toolgate ledger"),
        "{refused}"
    );
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        0,
        "nothing written"
    );
}

// --- at rest -----------------------------------------------------------------------------------

/// Whether `needle` occurs in the raw bytes of the database or its write-ahead log.
fn on_disk(path: &Path, needle: &str) -> Vec<String> {
    let mut found = Vec::new();
    for suffix in ["", "-wal", "-shm"] {
        let file = format!("{}{suffix}", path.display());
        let Ok(bytes) = std::fs::read(&file) else {
            continue;
        };
        if bytes
            .windows(needle.len())
            .any(|window| window == needle.as_bytes())
        {
            found.push(file);
        }
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_a_decision_clears_is_gone_from_the_files_once_the_store_closes() {
    let db = seeded(Backend::Sqlite, 10).await;
    let path = db.sqlite_path();
    let marker = "clear-arguments-marker-7f3e9a";
    let mut call = waiting_call("acme", "call-p", Some("use-p"));
    call.pending.as_mut().unwrap().arguments =
        // Long, so the smaller row that replaces it leaves most of its bytes as free space,
        // and first (keys are sorted), so the new row, written at the end of that space,
        // does not cover it.
        PendingArguments::Clear(serde_json::json!({ "marker": marker, "pad": "p".repeat(600) }));
    db.store().record_call(call).await.unwrap();
    // A row written after it shares its page, so the page is not rebuilt when it shrinks.
    db.store()
        .record_call(waiting_call("acme", "call-q", Some("use-q")))
        .await
        .unwrap();
    assert!(
        !on_disk(&path, marker).is_empty(),
        "the test's marker is written where it can be seen"
    );
    assert!(
        db.store()
            .resolve_pending(decide("call-p", 1, false, "ops"))
            .await
            .unwrap()
    );
    // A reader holds a connection, as in a running gateway: the writer's is not the last to
    // close, so SQLite's own checkpoint on the last close does not run.
    db.store()
        .get_pending(&tenant_id("acme"), "pend-call-p")
        .await
        .unwrap();
    db.close().await;
    assert_eq!(
        on_disk(&path, marker),
        Vec::<String>::new(),
        "secure_delete zeroes what the decision cleared, and closing folds the log into the database and empties it"
    );
    let wal = std::fs::metadata(format!("{}-wal", path.display()));
    assert!(
        wal.as_ref().map_or(true, |meta| meta.len() == 0),
        "the write-ahead log is truncated at close: {wal:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_ledger_files_are_private() {
    use std::os::unix::fs::PermissionsExt as _;
    let db = seeded(Backend::Sqlite, 10).await;
    let path = db.sqlite_path();
    for suffix in ["", "-wal", "-shm", ".lock"] {
        let file = format!("{}{suffix}", path.display());
        let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{file} has mode {mode:04o}");
    }
    db.close().await;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let refused = SqliteStore::open(&path).await.unwrap_err().to_string();
    assert!(refused.contains("chmod 600"), "{refused}");
}
