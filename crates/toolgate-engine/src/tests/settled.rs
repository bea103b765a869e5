//! A call settled by someone else while it ran: the engine answers what the ledger recorded,
//! never what its connector said. And the PostgreSQL replica that loses the connection holding
//! its instance lock: it starts no call until it holds the lock again, while another replica
//! may take its running calls for interrupted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use sqlx::Connection as _;
use toolgate_core::{ErrorCode, ToolCallStatus};
use toolgate_ledger::{FinishCall, PgOptions, PgStore, Store, ToolCallRecord};

use super::ledgers::{self, Backend, Kind, Opened, Place, on_both_ledgers, pg_url};
use super::{Harness, harness};
use crate::testkit::TestkitConnector;
use crate::{Catalog, Engine, EngineError, ExecuteOutcome};

/// How long the slow write sleeps: long enough for the test to settle it meanwhile, on a busy
/// machine too.
const SLOW_MS: u64 = 5_000;

/// Starts `testkit.sleep_write` (a write that is not idempotent) sleeping `ms`, on its own task,
/// and returns the task and the call once its `running` row is committed.
async fn start_slow_write(
    h: &Arc<Harness>,
    run: &toolgate_core::RunId,
    ms: u64,
) -> (
    tokio::task::JoinHandle<Result<ExecuteOutcome, EngineError>>,
    ToolCallRecord,
) {
    let task = {
        let h = Arc::clone(h);
        let mut request = h.request(run, "testkit.sleep_write", &json!({"ms": ms}).to_string());
        request.timeout = Some(Duration::from_secs(120));
        tokio::spawn(async move { h.engine.execute(request).await })
    };
    let started = Instant::now();
    loop {
        let calls = h
            .store
            .list_tool_calls(&h.tenant, run, None, 1000)
            .await
            .unwrap();
        if let Some(call) = calls
            .into_iter()
            .find(|c| c.tool.as_str() == "testkit.sleep_write")
        {
            assert_eq!(call.status, ToolCallStatus::Running, "{call:?}");
            return (task, call);
        }
        assert!(!task.is_finished(), "the slow call ended: {task:?}");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the slow call never got its running row"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What recovery writes for a call it takes for interrupted.
fn settle(call: &ToolCallRecord) -> FinishCall {
    FinishCall {
        tenant: call.tenant.clone(),
        id: call.id.clone(),
        status: ToolCallStatus::OutcomeUnknown,
        output_redacted: None,
        error_code: Some(ErrorCode::OutcomeUnknown),
        error_text: Some("settled elsewhere while it ran".to_owned()),
        duration_ms: 0,
        attempts: call.attempts,
        at: toolgate_core::Timestamp(2),
        answer: None,
        events: Vec::new(),
    }
}

/// The connector succeeds, but by the time the engine records that, the call is no longer
/// `running` (settled as `outcome_unknown` meanwhile): the agent is told `outcome_unknown` with
/// the ledger's error, not `succeeded`, and the ledger row stays as it was.
async fn a_finish_that_finds_the_call_settled_answers_what_the_ledger_recorded(backend: Backend) {
    let h = Arc::new(harness(&backend).await);
    let run = h.run(None).await;
    let (task, running) = start_slow_write(&h, &run, SLOW_MS).await;
    assert!(h.store.finish_call(settle(&running)).await.unwrap());

    let outcome = task.await.unwrap().unwrap();
    assert_eq!(
        outcome.status,
        ToolCallStatus::OutcomeUnknown,
        "{outcome:?}"
    );
    assert_eq!(outcome.error_code(), Some(ErrorCode::OutcomeUnknown));
    assert_eq!(
        outcome.error.as_ref().map(|e| e.message.as_str()),
        Some("settled elsewhere while it ran")
    );
    assert_eq!(outcome.result, None, "no result the ledger does not have");
    assert_eq!(outcome.tool_call_id.as_ref(), Some(&running.id));
    let row = h.ledger_row(&outcome).await;
    assert_eq!(row.status, ToolCallStatus::OutcomeUnknown);
    assert_eq!(
        row.error_text.as_deref(),
        Some("settled elsewhere while it ran")
    );
}
on_both_ledgers!(a_finish_that_finds_the_call_settled_answers_what_the_ledger_recorded);

/// A superuser role of its own for the replica under test, so the test can stop it from
/// connecting again (`ALTER ROLE ... NOLOGIN`) while its other connections stay up: a replica
/// cut off from the database for a while. Dropped by [`TestRole::drop_role`].
struct TestRole {
    name: String,
    password: String,
    admin: sqlx::PgConnection,
}

impl TestRole {
    async fn create() -> TestRole {
        let mut admin = sqlx::PgConnection::connect(&pg_url())
            .await
            .expect("connect to the test PostgreSQL");
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let name = format!("tg_role_{}_{nanos}", std::process::id());
        let password = format!("pw{nanos}");
        let sql = format!("CREATE ROLE {name} LOGIN SUPERUSER PASSWORD '{password}'");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut admin)
            .await
            .expect("create a test role (the test user must be a superuser)");
        TestRole {
            name,
            password,
            admin,
        }
    }

    /// The test server's URL as this role.
    fn url(&self) -> String {
        let url = pg_url();
        let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
        let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        format!("{scheme}://{}:{}@{host}", self.name, self.password)
    }

    async fn allow_login(&mut self, allowed: bool) {
        let sql = format!(
            "ALTER ROLE {} {}",
            self.name,
            if allowed { "LOGIN" } else { "NOLOGIN" }
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut self.admin)
            .await
            .expect("alter the test role");
    }

    async fn drop_role(mut self) {
        let terminate = format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{}'",
            self.name
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(terminate))
            .execute(&mut self.admin)
            .await
            .expect("end the role's sessions");
        let sql = format!("DROP ROLE {}", self.name);
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
            .execute(&mut self.admin)
            .await
            .expect("drop the test role");
    }
}

/// The backend holding the advisory lock on `key` (`classid` = high 32 bits, `objid` = low).
async fn lock_holder(conn: &mut sqlx::PgConnection, key: i64) -> Option<i32> {
    let bits = key.cast_unsigned();
    let high = i64::from(u32::try_from(bits >> 32).unwrap());
    let low = i64::from(u32::try_from(bits & 0xFFFF_FFFF).unwrap());
    sqlx::query_scalar(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 \
         AND classid::bigint = $1 AND objid::bigint = $2",
    )
    .bind(high)
    .bind(low)
    .fetch_optional(&mut *conn)
    .await
    .unwrap()
}

async fn wait_for_lock_state(store: &PgStore, held: bool) {
    let started = Instant::now();
    while store.holds_instance_lock() != held {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the replica never noticed: holds_instance_lock stayed {}",
            !held
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Replica A runs a slow write when the backend holding its instance lock is terminated, and A
/// cannot connect again for a while. A then refuses new calls (`Unavailable`); replica B takes
/// A's running call for interrupted and settles it `outcome_unknown`; the write then succeeds
/// in A's connector, but A tells its agent `outcome_unknown`, as the ledger says. Once A can
/// connect again it takes its lock back and starts calls again.
async fn a_replica_that_loses_its_lock_starts_no_calls_and_never_contradicts_the_ledger(
    backend: Backend,
) {
    let b = harness(&backend).await;
    let Place::Pg { schema, .. } = &b.place else {
        panic!("PostgreSQL only");
    };
    let mut role = TestRole::create().await;
    let options = PgOptions {
        url: role.url(),
        schema: Some(schema.clone()),
    };
    let a_store = Arc::new(PgStore::connect(&options).await.unwrap());
    let mut registry = toolgate_core::ToolRegistry::new();
    registry
        .register(Arc::new(TestkitConnector) as Arc<dyn toolgate_core::Connector>)
        .unwrap();
    let engine = Engine::new(
        Arc::clone(&a_store) as Arc<dyn Store>,
        Arc::new(Catalog::new(registry).unwrap()),
        Arc::new(toolgate_core::SystemClock),
        b.config.clone(),
    )
    .unwrap();
    let a = Arc::new(Harness {
        engine,
        store: Arc::clone(&a_store) as Arc<dyn Store>,
        tenant: b.tenant.clone(),
        agent: b.agent.clone(),
        opened: Opened::Pg(Arc::clone(&a_store)),
        place: b.place.clone(),
        backend: backend.clone(),
        config: b.config.clone(),
        secrets: None,
    });
    let run = a.run(None).await;
    let (task, running) = start_slow_write(&a, &run, 2 * SLOW_MS).await;

    role.allow_login(false).await;
    let first = lock_holder(&mut role.admin, a_store.instance())
        .await
        .expect("A holds its lock");
    let terminated: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first)
        .fetch_one(&mut role.admin)
        .await
        .unwrap();
    assert!(terminated);
    wait_for_lock_state(&a_store, false).await;

    let refused = a
        .engine
        .execute(a.request(&run, "testkit.noop", "{}"))
        .await;
    match refused {
        Err(EngineError::Unavailable(message)) => {
            assert!(message.contains("starts no tool call"), "{message}");
        }
        other => panic!("A started a call without its lock: {other:?}"),
    }
    assert_eq!(
        b.engine.recover_interrupted_calls().await.unwrap(),
        1,
        "B takes A's running call for interrupted while A's lock is free"
    );

    let outcome = task.await.unwrap().unwrap();
    assert_eq!(
        outcome.status,
        ToolCallStatus::OutcomeUnknown,
        "A's agent is told what the ledger says: {outcome:?}"
    );
    assert_eq!(outcome.error_code(), Some(ErrorCode::OutcomeUnknown));
    assert_eq!(
        b.call_status(&running.id).await,
        ToolCallStatus::OutcomeUnknown
    );

    role.allow_login(true).await;
    wait_for_lock_state(&a_store, true).await;
    let again = a.call(&run, "testkit.noop", "{}").await;
    assert_eq!(again.status, ToolCallStatus::Succeeded, "{again:?}");
    assert!(
        b.engine.recover_interrupted_calls().await.unwrap() == 0,
        "A counts as alive again"
    );
    a_store.close().await;
    drop(a);
    role.drop_role().await;
}

/// Runs the PostgreSQL-only test above through the same harness as the others.
#[tokio::test]
async fn a_replica_that_loses_its_lock_starts_no_calls_and_never_contradicts_the_ledger_pg() {
    super::ledgers::run_on(
        Kind::Pg,
        a_replica_that_loses_its_lock_starts_no_calls_and_never_contradicts_the_ledger,
    )
    .await;
}
