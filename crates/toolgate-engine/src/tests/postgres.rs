//! The engine tests that need PostgreSQL, because they test what only a shared database has:
//! replicas (several stores, as several gateway processes, on one ledger) and a replica that
//! loses the connection holding its instance lock. Compiled with the `postgres-tests`
//! feature (`cargo xtask ci` turns on every feature and provides the server); every other
//! engine test runs on SQLite alone.
//!
//! The URL comes from `TOOLGATE_TEST_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`, what `cargo xtask ci` finds or starts). A server
//! that cannot be reached fails the test with a message naming the URL and the variable;
//! nothing is skipped. Each test gets a fresh, uniquely named schema; a test that passes closes
//! its stores and drops its schemas (`DROP SCHEMA ... CASCADE`); a failing one leaves them for
//! inspection and says which.
//!
//! No test here pauses tokio's clock: under paused time tokio advances the clock whenever the
//! runtime is idle, which includes waiting for a PostgreSQL answer, so sqlx's connect and
//! acquire timeouts would fire at once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::Connection as _;
use toolgate_core::{ErrorCode, ToolCallStatus};
use toolgate_ledger::{PendingState, PgOptions, PgStore, Store, TOOL_CALLING_ENABLED};

use super::ledgers::{self, Backend, Kind, Opened, Place};
use super::resume_promises::{TRANSFER, approving, decide, suspend};
use super::settled::{SLOW_MS, start_slow_write};
use super::{ADMIN_TOKEN, Harness, harness, open_harness};
use crate::testkit::TestkitConnector;
use crate::{Catalog, Engine, EngineError, ResumeDecision, ResumeOutcome};

/// One test ledger on the test server: a schema of its own (the ledger's test support:
/// a unique name, dropped when the last handle goes, kept and named when the test failed).
pub(super) type Schema = Arc<toolgate_ledger::testkit::PgSchema>;

/// A schema name never used, on the test server.
pub(super) fn fresh_schema() -> Schema {
    Arc::new(toolgate_ledger::testkit::PgSchema::fresh())
}

impl Harness {
    /// Another process on the same ledger, this one still running (PostgreSQL only: a SQLite
    /// file has one store).
    async fn replica(&self) -> Harness {
        assert_eq!(self.backend.kind(), Kind::Pg, "replicas share PostgreSQL");
        open_harness(
            &self.backend,
            self.place.clone(),
            self.config.clone(),
            self.secrets.clone(),
        )
        .await
    }
}

/// Replicas sharing one PostgreSQL schema: recovery on one replica never settles a call another
/// live replica is running, and settles it once that replica is gone (its store closed, which
/// releases its liveness lock, as its death would).
async fn recovery_on_a_replica_spares_live_replicas_calls(backend: Backend) {
    let a = Arc::new(harness(&backend).await);
    let b = a.replica().await;
    let run = a.run(None).await;
    let (in_flight, running) = a.start_slow_call(&run).await;

    assert_eq!(
        b.engine.recover_interrupted_calls().await.unwrap(),
        0,
        "replica A is alive: its running call is not B's to settle"
    );
    assert_eq!(b.call_status(&running.id).await, ToolCallStatus::Running);
    assert!(
        !b.event_kinds()
            .await
            .contains(&"tool_call.outcome_unknown".to_owned())
    );

    // Replica A dies: its call never finishes and its store's connections go away.
    in_flight.abort();
    assert!(in_flight.await.unwrap_err().is_cancelled());
    a.opened.close().await;

    // KNOWN LEDGER BUG (intermittent, about 1 run in 50 on a loopback server): this can see 0.
    // `PgStore::close` promises to release the instance's advisory lock, but it only closes the
    // connection holding it (sqlx sends Terminate and shuts the socket without waiting), so the
    // server may still hold the lock when `close` returns and B's `pg_try_advisory_lock` finds
    // A alive. Fix in the ledger: `SELECT pg_advisory_unlock($1)` (the instance key) on the
    // liveness connection before closing it. Left strict on purpose: `close` returning means
    // the lock is free.
    assert_eq!(
        b.engine.recover_interrupted_calls().await.unwrap(),
        1,
        "A's store is closed: its running call is interrupted"
    );
    let row = b
        .store
        .get_tool_call(&b.tenant, &running.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (row.status, row.error_code),
        (
            ToolCallStatus::OutcomeUnknown,
            Some(ErrorCode::OutcomeUnknown)
        )
    );
    assert_eq!(
        b.event_kinds()
            .await
            .iter()
            .filter(|kind| *kind == "tool_call.outcome_unknown")
            .count(),
        1
    );
    assert_eq!(
        b.engine.recover_interrupted_calls().await.unwrap(),
        0,
        "idempotent"
    );
    assert!(
        b.store
            .verify_chains()
            .await
            .unwrap()
            .first_problem
            .is_none()
    );
}

#[tokio::test]
async fn recovery_on_a_replica_spares_live_replicas_calls_pg() {
    ledgers::run_on(Kind::Pg, recovery_on_a_replica_spares_live_replicas_calls).await;
}

/// Two replicas serving one run: each sees the other's calls, and their audit events form one
/// intact chain.
async fn replicas_share_one_ledger_and_chain(backend: Backend) {
    let a = harness(&backend).await;
    let b = a.replica().await;
    let run = a.run(None).await;
    let from_a = a
        .call(&run, "testkit.echo", r#"{"message": "from a"}"#)
        .await;
    let from_b = b
        .call(&run, "testkit.echo", r#"{"message": "from b"}"#)
        .await;
    assert_eq!(from_a.status, ToolCallStatus::Succeeded, "{from_a:?}");
    assert_eq!(from_b.status, ToolCallStatus::Succeeded, "{from_b:?}");
    assert_eq!(
        b.ledger_row(&from_a).await.status,
        ToolCallStatus::Succeeded
    );
    assert_eq!(
        a.ledger_row(&from_b).await.status,
        ToolCallStatus::Succeeded
    );
    let calls = a
        .store
        .list_tool_calls(&a.tenant, &run, None, 100)
        .await
        .unwrap();
    assert_eq!(calls.len(), 2);
    assert!(
        a.store
            .verify_chains()
            .await
            .unwrap()
            .first_problem
            .is_none()
    );
}

#[tokio::test]
async fn replicas_share_one_ledger_and_chain_pg() {
    ledgers::run_on(Kind::Pg, replicas_share_one_ledger_and_chain).await;
}

/// A kill switch thrown through one replica stops calls on another as soon as that one drops
/// its cached configuration (which the gateway does on the store's configuration feed).
async fn a_kill_switch_on_one_replica_reaches_the_other(backend: Backend) {
    let a = harness(&backend).await;
    let b = a.replica().await;
    let run = a.run(None).await;
    let before = a.call(&run, "testkit.echo", r#"{"message": "on"}"#).await;
    assert_eq!(before.status, ToolCallStatus::Succeeded, "{before:?}");
    let mut changes = a
        .store
        .subscribe_config_changes()
        .expect("a PostgreSQL store has a configuration feed");
    changes.borrow_and_update();
    b.engine
        .set_flag(&b.tenant, TOOL_CALLING_ENABLED, false, ADMIN_TOKEN)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(120), changes.changed())
        .await
        .expect("replica A never heard of B's kill switch")
        .expect("configuration feed open");
    a.engine.forget_cached_configuration();
    let after = a.call(&run, "testkit.echo", r#"{"message": "off"}"#).await;
    assert_eq!(
        after.error_code(),
        Some(ErrorCode::FeatureDisabled),
        "{after:?}"
    );
}

#[tokio::test]
async fn a_kill_switch_on_one_replica_reaches_the_other_pg() {
    ledgers::run_on(Kind::Pg, a_kill_switch_on_one_replica_reaches_the_other).await;
}

/// A kill switch thrown through one replica stops an approval on another, which had the flag
/// cached as on, once it drops its cached configuration (as the gateway does when PostgreSQL
/// notifies it).
async fn a_kill_switch_on_one_replica_stops_approvals_on_the_other(backend: Backend) {
    let a = approving(&backend).await;
    let b = a.replica().await;
    let run = a.run(None).await;
    let pending = suspend(&a, &run, "testkit.transfer", TRANSFER, None).await;
    let warm = b.call(&run, "testkit.noop", "{}").await;
    assert_eq!(
        warm.status,
        ToolCallStatus::Succeeded,
        "B caches the flag as on"
    );
    a.engine
        .set_flag(&a.tenant, TOOL_CALLING_ENABLED, false, ADMIN_TOKEN)
        .await
        .unwrap();
    b.engine.forget_cached_configuration();
    let refused = decide(&b, &run, &pending, ResumeDecision::Approve).await;
    assert!(
        matches!(refused, ResumeOutcome::FeatureDisabled { .. }),
        "{refused:?}"
    );
    let row = a.store.get_pending(&a.tenant, &pending).await.unwrap();
    assert_eq!(row.unwrap().state, PendingState::Pending);
}

#[tokio::test]
async fn a_kill_switch_on_one_replica_stops_approvals_on_the_other_pg() {
    ledgers::run_on(
        Kind::Pg,
        a_kill_switch_on_one_replica_stops_approvals_on_the_other,
    )
    .await;
}

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
        let mut admin = sqlx::PgConnection::connect(&toolgate_ledger::testkit::pg_url())
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
        let url = toolgate_ledger::testkit::pg_url();
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
    let Place::Pg(schema) = &b.place else {
        panic!("PostgreSQL only");
    };
    let mut role = TestRole::create().await;
    let options = PgOptions {
        url: role.url(),
        schema: Some(schema.name().to_owned()),
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
    ledgers::run_on(
        Kind::Pg,
        a_replica_that_loses_its_lock_starts_no_calls_and_never_contradicts_the_ledger,
    )
    .await;
}
