//! What the ledger's tests share: record builders, [`Db`] (a store of either backend with the
//! place its data lives), the tamper table, and the backend-neutral tests (`store`), each of
//! which runs on SQLite and on PostgreSQL. Backend-specific tests live next to their backend
//! (`sqlite/tests.rs`, `pg/tests.rs`).
//!
//! PostgreSQL: `TOOLGATE_TEST_PG_URL` (default `postgres://postgres@127.0.0.1:5432/test`) names
//! a server where the tests may create and drop schemas. Every PostgreSQL test gets a schema of
//! its own (`tg_t_<pid>_<counter>_<nanos>`), so they run in parallel; it is dropped when the
//! test passes and kept, named on stderr, when it fails. Without a server the PostgreSQL tests
//! fail loudly, saying how to provide one; they are never skipped.

mod admin;
mod console;
mod errors;
mod keyed;
mod replays;
mod store;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use sqlx::{ConnectOptions, Connection, Executor};
use tempfile::TempDir;
use toolgate_core::{
    AgentId, CorrelationId, Decision, RiskLevel, RunId, TenantId, Timestamp, ToolCallId,
    ToolCallStatus, ToolName, ToolUseId,
};

use crate::error::LedgerError;
use crate::model::*;
use crate::ops::WriterStats;
use crate::pg::PgStore;
use crate::sqlite::SqliteStore;
use crate::store::Store;

// --- running a test on both backends ---------------------------------------------------------

/// Defines a test body run on both backends: `mod <name>` with the tests `sqlite` and `pg`
/// (so `cargo test -p toolgate-ledger ::pg` selects every PostgreSQL run). The body gets the
/// [`Backend`] and builds its store with [`Db::new`] (or a fixture like [`seeded`]).
macro_rules! on_both_backends {
    ($(#[doc = $doc:literal])* async fn $name:ident($backend:ident: Backend) $body:block) => {
        $(#[doc = $doc])*
        mod $name {
            #[allow(unused_imports)]
            use super::*;

            async fn test_body($backend: Backend) $body

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sqlite() {
                test_body(Backend::Sqlite).await;
            }

            #[cfg(feature = "postgres-tests")]
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn pg() {
                test_body(Backend::Pg).await;
            }
        }
    };
}
pub(crate) use on_both_backends;

/// Which store a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Backend {
    Sqlite,
    Pg,
}

/// A store under test and the place its data lives (a temporary directory or a PostgreSQL
/// schema), so it can be closed and opened again on the same data.
pub(crate) struct Db {
    // Declared before `place`: the store goes first, then its directory or schema.
    handle: Handle,
    place: Place,
}

#[derive(Clone)]
enum Handle {
    Sqlite(Arc<SqliteStore>),
    Pg(Arc<PgStore>),
}

enum Place {
    Sqlite(TempDir),
    Pg(PgSchema),
}

impl Db {
    /// A fresh, empty store.
    pub(crate) async fn new(backend: Backend) -> Db {
        match backend {
            Backend::Sqlite => Db::sqlite().await,
            Backend::Pg => Db::pg().await,
        }
    }

    /// A fresh store whose audit events are MAC'd with `keys`.
    pub(crate) async fn keyed(backend: Backend, keys: Arc<dyn toolgate_core::AuditKeys>) -> Db {
        match backend {
            Backend::Sqlite => {
                let dir = tempfile::tempdir().expect("temp dir");
                let store = SqliteStore::open_keyed(&dir.path().join("ledger.db"), keys)
                    .await
                    .expect("open store");
                Db {
                    handle: Handle::Sqlite(Arc::new(store)),
                    place: Place::Sqlite(dir),
                }
            }
            Backend::Pg => {
                let schema = PgSchema::fresh();
                let store = schema.open_keyed(keys).await;
                Db {
                    handle: Handle::Pg(Arc::new(store)),
                    place: Place::Pg(schema),
                }
            }
        }
    }

    /// Which backend holds the data.
    pub(crate) fn backend(&self) -> Backend {
        match &self.place {
            Place::Sqlite(_) => Backend::Sqlite,
            Place::Pg(_) => Backend::Pg,
        }
    }

    /// Closes the store and opens the same data again with `keys`.
    pub(crate) async fn reopen_keyed(self, keys: Arc<dyn toolgate_core::AuditKeys>) -> Db {
        self.close().await;
        let Db { handle, place } = self;
        drop(handle);
        let handle = match &place {
            Place::Sqlite(dir) => {
                let path = dir.path().join("ledger.db");
                let started = std::time::Instant::now();
                let store = loop {
                    match SqliteStore::open_keyed(&path, Arc::clone(&keys)).await {
                        Ok(store) => break store,
                        Err(LedgerError::InUse(_)) if started.elapsed() < HANG => {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        Err(error) => panic!("reopen store: {error}"),
                    }
                };
                Handle::Sqlite(Arc::new(store))
            }
            Place::Pg(schema) => Handle::Pg(Arc::new(schema.open_keyed(keys).await)),
        };
        Db { handle, place }
    }

    /// Runs `statements` in order on one plain connection to the data (the store must be
    /// closed for SQLite), as an operator or an attacker would.
    pub(crate) async fn raw_statements(&self, statements: &[String]) {
        match &self.place {
            Place::Sqlite(dir) => {
                let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(dir.path().join("ledger.db"))
                    .connect()
                    .await
                    .expect("raw connection");
                for sql in statements {
                    conn.execute(sqlx::AssertSqlSafe(sql.clone()))
                        .await
                        .unwrap_or_else(|error| panic!("`{sql}`: {error}"));
                }
                conn.close().await.expect("close raw connection");
            }
            Place::Pg(schema) => {
                let mut conn = schema.raw().await;
                for sql in statements {
                    conn.execute(sqlx::AssertSqlSafe(sql.clone()))
                        .await
                        .unwrap_or_else(|error| panic!("`{sql}`: {error}"));
                }
                conn.close().await.expect("close raw connection");
            }
        }
    }

    /// A fresh SQLite store in a temporary directory.
    pub(crate) async fn sqlite() -> Db {
        let dir = tempfile::tempdir().expect("temp dir");
        let store = SqliteStore::open(&dir.path().join("ledger.db"))
            .await
            .expect("open store");
        Db {
            handle: Handle::Sqlite(Arc::new(store)),
            place: Place::Sqlite(dir),
        }
    }

    /// A fresh PostgreSQL store in a schema of its own.
    pub(crate) async fn pg() -> Db {
        let schema = PgSchema::fresh();
        let store = schema.open().await;
        Db {
            handle: Handle::Pg(Arc::new(store)),
            place: Place::Pg(schema),
        }
    }

    pub(crate) fn store(&self) -> &dyn Store {
        match &self.handle {
            Handle::Sqlite(store) => store.as_ref(),
            Handle::Pg(store) => store.as_ref(),
        }
    }

    /// The store, for tasks.
    pub(crate) fn shared(&self) -> Arc<dyn Store> {
        match &self.handle {
            Handle::Sqlite(store) => Arc::clone(store) as Arc<dyn Store>,
            Handle::Pg(store) => Arc::clone(store) as Arc<dyn Store>,
        }
    }

    pub(crate) fn stats(&self) -> WriterStats {
        match &self.handle {
            Handle::Sqlite(store) => store.stats(),
            Handle::Pg(store) => store.stats(),
        }
    }

    pub(crate) async fn close(&self) {
        match &self.handle {
            Handle::Sqlite(store) => store.close().await,
            Handle::Pg(store) => store.close().await,
        }
    }

    /// Closes the store and opens the same data again (PostgreSQL: a new connection to the same
    /// schema, i.e. a restarted process).
    pub(crate) async fn reopen(self) -> Db {
        self.close().await;
        self.open_again().await
    }

    /// Drops the store without closing it (a process that stopped without shutting down) and
    /// opens the same data again.
    pub(crate) async fn reopen_without_close(self) -> Db {
        self.open_again().await
    }

    async fn open_again(self) -> Db {
        let Db { handle, place } = self;
        assert_eq!(
            match &handle {
                Handle::Sqlite(store) => Arc::strong_count(store),
                Handle::Pg(store) => Arc::strong_count(store),
            },
            1,
            "a task still holds the store"
        );
        drop(handle);
        let handle = match &place {
            Place::Sqlite(dir) => Handle::Sqlite(Arc::new(
                open_once_released(&dir.path().join("ledger.db")).await,
            )),
            Place::Pg(schema) => Handle::Pg(Arc::new(schema.open().await)),
        };
        Db { handle, place }
    }

    /// Runs `sql` outside the store (which must be closed for SQLite), as an operator would.
    pub(crate) async fn raw_execute(&self, sql: &'static str) {
        match &self.place {
            Place::Sqlite(dir) => {
                let mut conn = sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(dir.path().join("ledger.db"))
                    .connect()
                    .await
                    .expect("raw connection");
                sqlx::raw_sql(sql).execute(&mut conn).await.expect(sql);
                conn.close().await.expect("close raw connection");
            }
            Place::Pg(schema) => {
                let mut conn = schema.raw().await;
                sqlx::raw_sql(sql).execute(&mut conn).await.expect(sql);
                conn.close().await.expect("close raw connection");
            }
        }
    }

    /// The SQLite file (SQLite only).
    pub(crate) fn sqlite_path(&self) -> PathBuf {
        match &self.place {
            Place::Sqlite(dir) => dir.path().join("ledger.db"),
            Place::Pg(_) => panic!("not a SQLite store"),
        }
    }

    /// Replaces the (closed) SQLite store by `store`, opened on the same file (SQLite only).
    pub(crate) fn with_sqlite_store(self, store: SqliteStore) -> Db {
        assert!(matches!(self.place, Place::Sqlite(_)), "not a SQLite store");
        Db {
            handle: Handle::Sqlite(Arc::new(store)),
            place: self.place,
        }
    }

    /// The PostgreSQL store (PostgreSQL only).
    pub(crate) fn pg_store(&self) -> Arc<PgStore> {
        match &self.handle {
            Handle::Pg(store) => Arc::clone(store),
            Handle::Sqlite(_) => panic!("not a PostgreSQL store"),
        }
    }

    /// The schema (PostgreSQL only).
    pub(crate) fn pg_schema(&self) -> &PgSchema {
        match &self.place {
            Place::Pg(schema) => schema,
            Place::Sqlite(_) => panic!("not a PostgreSQL store"),
        }
    }
}

/// Opens the SQLite store at `path` as soon as the previous store on it is gone: a store
/// dropped without `close` keeps the file's lock until its writer has committed what was
/// queued, a moment later (a process that dies releases it at once).
async fn open_once_released(path: &std::path::Path) -> SqliteStore {
    let started = std::time::Instant::now();
    loop {
        match SqliteStore::open(path).await {
            Ok(store) => return store,
            Err(LedgerError::InUse(_)) if started.elapsed() < HANG => {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            Err(error) => panic!("reopen store: {error}"),
        }
    }
}

// --- PostgreSQL schemas -----------------------------------------------------------------------

pub(crate) use crate::testkit::{PgSchema, pg_url};

/// How long a test waits for something before failing: not a timing assertion, only a bound
/// that turns a hang into a failure naming what never happened.
pub(crate) const HANG: Duration = Duration::from_secs(120);

/// Waits for `condition`, checking every few milliseconds (see [`HANG`]).
pub(crate) async fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let started = std::time::Instant::now();
    while !condition() {
        assert!(started.elapsed() < HANG, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Runs `futures` concurrently on the current task (they need not be `Send`) until all are done.
pub(crate) async fn join_all<F: std::future::Future<Output = ()>>(futures: Vec<F>) {
    let mut futures: Vec<Option<std::pin::Pin<Box<F>>>> =
        futures.into_iter().map(|f| Some(Box::pin(f))).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for slot in &mut futures {
            if let Some(future) = slot {
                if future.as_mut().poll(cx).is_ready() {
                    *slot = None;
                } else {
                    pending = true;
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
}

// --- records ----------------------------------------------------------------------------------

pub(crate) const T0: Timestamp = Timestamp(1_700_000_000_000);

/// The admin token id the tests make their administrative changes with.
pub(crate) const ADMIN_TOKEN: &str = "tok_admin";

/// The actor of the tests' administrative changes.
pub(crate) fn admin() -> Actor {
    Actor::token(ADMIN_TOKEN, T0)
}

pub(crate) fn tenant_id(id: &str) -> TenantId {
    TenantId::new(id).unwrap()
}

pub(crate) fn agent_id(id: &str) -> AgentId {
    AgentId::new(id).unwrap()
}

pub(crate) fn run_id(id: &str) -> RunId {
    RunId::new(id).unwrap()
}

pub(crate) fn call_id(id: &str) -> ToolCallId {
    ToolCallId::new(id).unwrap()
}

pub(crate) fn tool(name: &str) -> ToolName {
    ToolName::new(name).unwrap()
}

pub(crate) fn tenant(id: &str) -> Tenant {
    Tenant {
        id: tenant_id(id),
        name: format!("{id} inc"),
        created_at: T0,
    }
}

pub(crate) fn agent(tenant: &str, id: &str) -> Agent {
    Agent {
        tenant: tenant_id(tenant),
        id: agent_id(id),
        name: format!("agent {id}"),
        created_at: T0,
    }
}

pub(crate) fn run(tenant: &str, id: &str, max_calls: i64) -> RunRecord {
    RunRecord {
        tenant: tenant_id(tenant),
        id: run_id(id),
        agent: agent_id("bot"),
        manifest: vec![tool("slack.post_message"), tool("aws.ec2_inventory")],
        status: RunStatus::Active,
        calls_used: 0,
        max_calls,
        pending_approvals: 0,
        created_at: T0,
    }
}

pub(crate) fn event(tenant: &str, kind: &str, run: &str, call: &str) -> NewAuditEvent {
    NewAuditEvent {
        tenant: tenant_id(tenant),
        kind: kind.to_owned(),
        run: Some(run_id(run)),
        tool_call_id: Some(call_id(call)),
        payload: json!({ "tool": "slack.post_message", "call": call }),
        at: T0,
    }
}

/// An event outside any run or call.
pub(crate) fn note(tenant: &str, n: i64) -> NewAuditEvent {
    NewAuditEvent {
        tenant: tenant_id(tenant),
        kind: "admin.note".to_owned(),
        run: None,
        tool_call_id: None,
        payload: json!({ "n": n }),
        at: T0,
    }
}

/// A `running` call with one `tool_call.requested` event, counted against the budget.
pub(crate) fn new_call(tenant: &str, run: &str, id: &str, tool_use_id: Option<&str>) -> NewCall {
    NewCall {
        call: ToolCallRecord {
            id: call_id(id),
            tenant: tenant_id(tenant),
            run: run_id(run),
            agent: agent_id("bot"),
            tool: "slack.post_message".to_owned(),
            action: Some("post_message".to_owned()),
            tool_use_id: tool_use_id.map(|id| ToolUseId::new(id).unwrap()),
            correlation_id: CorrelationId::new("corr-1").unwrap(),
            status: ToolCallStatus::Running,
            args_hash: "ab".repeat(32),
            input_redacted: json!({ "channel": "#ops", "text": "[REDACTED]" }),
            output_redacted: None,
            error_code: None,
            error_text: None,
            policy_decision_id: Some(format!("dec-{id}")),
            risk_level: Some(RiskLevel::Medium),
            duration_ms: None,
            attempts: 0,
            evaluation: 1,
            created_at: T0,
            updated_at: T0,
        },
        count_against_budget: true,
        decision: Some(PolicyDecisionRecord {
            id: format!("dec-{id}"),
            tenant: tenant_id(tenant),
            tool_call_id: call_id(id),
            tool: tool("slack.post_message"),
            decision: Decision::Allow,
            risk: RiskLevel::Medium,
            policy_ids: vec!["p1".to_owned()],
            policy_version: 1,
            created_at: T0,
        }),
        pending: None,
        events: vec![event(tenant, "tool_call.requested", run, id)],
    }
}

/// A call of `run-1` suspended for approval, with its pending invocation `pend-<id>`.
pub(crate) fn waiting_call(tenant: &str, id: &str, tool_use_id: Option<&str>) -> NewCall {
    let mut call = new_call(tenant, "run-1", id, tool_use_id);
    call.call.status = ToolCallStatus::WaitingApproval;
    call.decision.as_mut().unwrap().decision = Decision::RequireExpertApproval;
    call.pending = Some(pending(tenant, id));
    call.events
        .push(event(tenant, "tool_call.approval_requested", "run-1", id));
    call
}

pub(crate) fn finish(tenant: &str, id: &str) -> FinishCall {
    FinishCall {
        tenant: tenant_id(tenant),
        id: call_id(id),
        status: ToolCallStatus::Succeeded,
        output_redacted: Some(json!({ "ok": true, "ts": "1.2" })),
        error_code: None,
        error_text: None,
        duration_ms: 12,
        attempts: 1,
        at: T0.plus_ms(12),
        answer: None,
        events: vec![event(tenant, "tool_call.succeeded", "run-1", id)],
    }
}

pub(crate) fn pending(tenant: &str, call: &str) -> PendingInvocation {
    PendingInvocation {
        id: format!("pend-{call}"),
        tenant: tenant_id(tenant),
        run: run_id("run-1"),
        tool_call_id: call_id(call),
        tool: tool("slack.post_message"),
        arguments: PendingArguments::Sealed {
            key_id: "k1".to_owned(),
            sealed: "tgs1.k1.sealed-arguments".to_owned(),
        },
        args_hash: "cd".repeat(32),
        manifest: vec![tool("slack.post_message")],
        policy_version: 1,
        origin: PendingOrigin::ApprovalRequired,
        decision: Decision::RequireExpertApproval,
        state: PendingState::Pending,
        version: 1,
        expires_at: T0.plus_ms(3_600_000),
        created_at: T0,
        timeout: None,
        trace_parent: Some("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_owned()),
    }
}

/// A decision on `pend-<call>` of `acme`, observed at `version`: approve (the call runs) or
/// reject (the call is blocked).
pub(crate) fn decide(call: &str, version: i64, approve: bool, by: &str) -> ResolvePending {
    ResolvePending {
        tenant: tenant_id("acme"),
        id: format!("pend-{call}"),
        observed_version: version,
        state: if approve {
            PendingState::Approved
        } else {
            PendingState::Rejected
        },
        decided_by: by.to_owned(),
        reason: "looks fine".into(),
        at: T0,
        call_status: if approve {
            ToolCallStatus::Running
        } else {
            ToolCallStatus::Blocked
        },
        error_code: None,
        error_text: None,
        events: vec![event(
            "acme",
            if approve {
                "tool_call.approved"
            } else {
                "tool_call.rejected"
            },
            "run-1",
            call,
        )],
    }
}

/// A store with tenant `acme`, its agent `bot` and run `run-1` (budget `max_calls`).
pub(crate) async fn seeded(backend: Backend, max_calls: i64) -> Db {
    let db = Db::new(backend).await;
    let store = db.store();
    store.create_tenant(tenant("acme"), &admin()).await.unwrap();
    store
        .create_agent(agent("acme", "bot"), &admin())
        .await
        .unwrap();
    store
        .create_run(run("acme", "run-1", max_calls))
        .await
        .unwrap();
    db
}

/// `acme` gets 5 notes and `beta` 3, interleaved, after their creation events (acme's and its
/// agent's: 2; beta's: 1).
pub(crate) async fn two_chains(backend: Backend) -> Db {
    let db = seeded(backend, 100).await;
    let store = db.store();
    store.create_tenant(tenant("beta"), &admin()).await.unwrap();
    for i in 1..=5 {
        let call = format!("a-{i}");
        store
            .append_events(vec![NewAuditEvent {
                payload: json!({ "n": i }),
                at: T0.plus_ms(i),
                ..event("acme", "admin.note", "run-1", &call)
            }])
            .await
            .unwrap();
        if i <= 3 {
            store
                .append_events(vec![NewAuditEvent {
                    run: None,
                    tool_call_id: None,
                    payload: json!({ "n": i }),
                    ..event("beta", "admin.note", "run-1", "x")
                }])
                .await
                .unwrap();
        }
    }
    db
}

pub(crate) async fn events_of(store: &dyn Store, tenant: &str) -> Vec<AuditEvent> {
    store
        .list_events(&tenant_id(tenant), 0, 10_000)
        .await
        .unwrap()
}

/// The ids of some calls, for comparing lists.
pub(crate) fn ids(calls: &[ToolCallRecord]) -> Vec<String> {
    calls.iter().map(|call| call.id.to_string()).collect()
}

pub(crate) fn assert_not_found(result: Result<(), LedgerError>, what: &str) {
    match result {
        Err(LedgerError::NotFound(message)) => {
            assert!(message.contains(what), "`{message}` should name {what}");
        }
        other => panic!("expected NotFound({what}), got {other:?}"),
    }
}

pub(crate) fn assert_exists(result: Result<(), LedgerError>, what: &str) {
    match result {
        Err(LedgerError::AlreadyExists(message)) => {
            assert!(message.contains(what), "`{message}` should name {what}");
        }
        other => panic!("expected AlreadyExists({what}), got {other:?}"),
    }
}

// --- batches ----------------------------------------------------------------------------------

/// One write of a batch a backend's tests queue up in a given order.
pub(crate) type Write = Box<dyn FnOnce(Arc<dyn Store>) -> tokio::task::JoinHandle<Answer> + Send>;

/// What a queued write answered.
#[allow(clippy::large_enum_variant)] // A handful of test values; boxing would obscure the tables.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Answer {
    Recorded(Result<RecordOutcome, String>),
    Finished(Result<bool, String>),
    Appended(Result<(), String>),
}

pub(crate) fn record(call: NewCall) -> Write {
    Box::new(move |store| {
        tokio::spawn(async move {
            Answer::Recorded(store.record_call(call).await.map_err(|e| e.to_string()))
        })
    })
}

pub(crate) fn finishing(call: FinishCall) -> Write {
    Box::new(move |store| {
        tokio::spawn(async move {
            Answer::Finished(store.finish_call(call).await.map_err(|e| e.to_string()))
        })
    })
}

pub(crate) fn appending(events: Vec<NewAuditEvent>) -> Write {
    Box::new(move |store| {
        tokio::spawn(async move {
            Answer::Appended(store.append_events(events).await.map_err(|e| e.to_string()))
        })
    })
}

// --- tampering --------------------------------------------------------------------------------

/// SQL an attacker with direct database access runs once the protections (SQLite: the
/// triggers; PostgreSQL: the triggers, and `seq` being generated always) are out of the way,
/// on the chains of [`two_chains`]: `acme` holds its creation and its agent's (1, 2), then
/// notes 1 to 5 (positions 3 to 7); `beta` its creation (1), then notes 1 to 3 (2 to 4).
/// `{hash5}` and `{hash7}` stand for hashes recomputed the way the ledger computes them, for
/// rewrites that keep an event self-consistent.
pub(crate) struct Tamper {
    pub(crate) name: &'static str,
    pub(crate) sql: &'static [&'static str],
    pub(crate) tenant: &'static str,
    pub(crate) kind: ChainProblemKind,
    pub(crate) chain_seq: i64,
    /// A phrase the problem's detail must contain.
    pub(crate) detail: &'static str,
}

/// Tampering both backends detect (the SQL is valid on both).
pub(crate) const TAMPERS: &[Tamper] = &[
    Tamper {
        name: "edit a payload",
        sql: &[
            "UPDATE audit_events SET payload = '{\"n\":33}' WHERE tenant = 'acme' AND chain_seq = 5",
        ],
        tenant: "acme",
        kind: ChainProblemKind::Edited,
        chain_seq: 5,
        detail: "event 5 does not match its hash",
    },
    Tamper {
        name: "edit a timestamp",
        sql: &["UPDATE audit_events SET at = at + 1 WHERE tenant = 'acme' AND chain_seq = 1"],
        tenant: "acme",
        kind: ChainProblemKind::Edited,
        chain_seq: 1,
        detail: "event 1 does not match its hash",
    },
    Tamper {
        name: "edit an administrative event",
        sql: &[
            "UPDATE audit_events SET payload = '{\"actor\":\"someone else\"}' \
             WHERE tenant = 'beta' AND chain_seq = 1",
        ],
        tenant: "beta",
        kind: ChainProblemKind::Edited,
        chain_seq: 1,
        detail: "event 1 does not match its hash",
    },
    Tamper {
        name: "delete a middle event",
        sql: &["DELETE FROM audit_events WHERE tenant = 'acme' AND chain_seq = 5"],
        tenant: "acme",
        kind: ChainProblemKind::Deleted,
        chain_seq: 5,
        detail: "event 5 is missing: the chain goes from event 4 to 6",
    },
    Tamper {
        name: "delete the first event",
        sql: &["DELETE FROM audit_events WHERE tenant = 'beta' AND chain_seq = 1"],
        tenant: "beta",
        kind: ChainProblemKind::Deleted,
        chain_seq: 1,
        detail: "event 1 is missing: the chain starts at event 2",
    },
    Tamper {
        name: "delete the newest event",
        sql: &["DELETE FROM audit_events WHERE tenant = 'acme' AND chain_seq = 7"],
        tenant: "acme",
        kind: ChainProblemKind::Deleted,
        chain_seq: 7,
        detail: "the head records 7 events but the chain ends at 6",
    },
    Tamper {
        name: "delete a whole chain",
        sql: &["DELETE FROM audit_events WHERE tenant = 'beta'"],
        tenant: "beta",
        kind: ChainProblemKind::Deleted,
        chain_seq: 1,
        detail: "the head records 4 events but the chain ends at 0",
    },
    Tamper {
        name: "delete the newest events and the head",
        sql: &[
            "DELETE FROM audit_events WHERE tenant = 'beta' AND chain_seq = 4",
            "DELETE FROM audit_heads WHERE tenant = 'beta'",
        ],
        tenant: "beta",
        kind: ChainProblemKind::Deleted,
        chain_seq: 4,
        detail: "no head record",
    },
    Tamper {
        name: "swap two events' positions",
        sql: &[
            "UPDATE audit_events SET chain_seq = 1000 WHERE tenant = 'acme' AND chain_seq = 5",
            "UPDATE audit_events SET chain_seq = 5 WHERE tenant = 'acme' AND chain_seq = 6",
            "UPDATE audit_events SET chain_seq = 6 WHERE tenant = 'acme' AND chain_seq = 1000",
        ],
        tenant: "acme",
        kind: ChainProblemKind::Reordered,
        chain_seq: 5,
        detail: "belongs at position 6",
    },
    Tamper {
        name: "swap two events' insertion order",
        sql: &[
            "CREATE TEMP TABLE original AS SELECT chain_seq, seq FROM audit_events \
             WHERE tenant = 'acme' AND chain_seq IN (5, 6)",
            "UPDATE audit_events SET seq = -seq WHERE tenant = 'acme' AND chain_seq IN (5, 6)",
            "UPDATE audit_events SET seq = (SELECT seq FROM original \
             WHERE original.chain_seq = 11 - audit_events.chain_seq) \
             WHERE tenant = 'acme' AND chain_seq IN (5, 6)",
        ],
        tenant: "acme",
        kind: ChainProblemKind::Reordered,
        chain_seq: 6,
        detail: "rows were shuffled",
    },
    Tamper {
        name: "rewrite a middle event with a recomputed hash",
        sql: &[
            "UPDATE audit_events SET payload = '{\"n\":33}', hash = '{hash5}' WHERE tenant = 'acme' AND chain_seq = 5",
        ],
        tenant: "acme",
        kind: ChainProblemKind::Edited,
        chain_seq: 5,
        detail: "event 5 is not the event that event 6 was chained to",
    },
    Tamper {
        name: "rewrite the newest event with a recomputed hash",
        sql: &[
            "UPDATE audit_events SET payload = '{\"n\":55}', hash = '{hash7}' WHERE tenant = 'acme' AND chain_seq = 7",
        ],
        tenant: "acme",
        kind: ChainProblemKind::Edited,
        chain_seq: 7,
        detail: "event 7 is not the event the head records",
    },
    Tamper {
        name: "roll the head back",
        sql: &["UPDATE audit_heads SET chain_seq = 2 WHERE tenant = 'beta'"],
        tenant: "beta",
        kind: ChainProblemKind::Edited,
        chain_seq: 3,
        detail: "beyond the head",
    },
];

/// Both chains broken: the lower tenant id wins.
pub(crate) const BOTH_CHAINS: Tamper = Tamper {
    name: "both chains",
    sql: &[
        "DELETE FROM audit_events WHERE tenant = 'beta' AND chain_seq = 2",
        "UPDATE audit_events SET kind = 'x' WHERE tenant = 'acme' AND chain_seq = 4",
    ],
    tenant: "acme",
    kind: ChainProblemKind::Edited,
    chain_seq: 4,
    detail: "event 4 does not match its hash",
};

/// `tamper`'s statements with `{hash5}` and `{hash7}` filled in from `store`'s `acme` chain.
pub(crate) async fn tamper_sql(store: &dyn Store, tamper: &Tamper) -> Vec<String> {
    let acme = events_of(store, "acme").await;
    let rehash = |event: &AuditEvent, payload: &str| {
        crate::chain::event_hash(
            &event.prev_hash,
            &crate::EventFields {
                tenant: event.tenant.as_str(),
                chain_seq: event.chain_seq,
                kind: &event.kind,
                run: event.run.as_ref().map(|r| r.as_str()),
                tool_call_id: event.tool_call_id.as_ref().map(|c| c.as_str()),
                payload,
                at: event.at.0,
                binding: None,
            },
        )
    };
    let hash5 = rehash(&acme[4], "{\"n\":33}");
    let hash7 = rehash(&acme[6], "{\"n\":55}");
    tamper
        .sql
        .iter()
        .map(|sql| sql.replace("{hash5}", &hash5).replace("{hash7}", &hash7))
        .collect()
}

/// Checks what `verify_chains` reports after `tamper`.
pub(crate) fn assert_detected(tamper: &Tamper, report: &VerifyReport) {
    let problem = report
        .first_problem
        .as_ref()
        .unwrap_or_else(|| panic!("{}: tampering went unnoticed", tamper.name));
    assert_eq!(
        (problem.chain.as_str(), problem.kind, problem.chain_seq),
        (tamper.tenant, tamper.kind, tamper.chain_seq),
        "{}: {}",
        tamper.name,
        problem.detail
    );
    assert!(
        problem.detail.contains(tamper.detail),
        "{}: `{}` should say `{}`",
        tamper.name,
        problem.detail,
        tamper.detail
    );
    assert_eq!(report.chains_checked, 2, "{}", tamper.name);
}
