//! Error classification: real failures of both databases sorted into the kinds the gateway
//! answers with (transient, constraint, internal), the detail kept for the log.

use sqlx::sqlite::{SqliteConnectOptions, SqliteConnection};
use sqlx::{ConnectOptions as _, Executor as _};

use super::*;
use crate::error::LedgerErrorKind;
use crate::rows::{Fail, database_error, is_transient_sqlstate, write_failure};

#[test]
fn sqlstates_sort_into_transient_and_not() {
    let cases: &[(&str, bool)] = &[
        ("08006", true),  // connection failure
        ("08P01", true),  // protocol violation
        ("53300", true),  // too many connections
        ("53100", true),  // disk full
        ("57P01", true),  // admin shutdown
        ("57014", true),  // statement timeout
        ("58030", true),  // I/O error
        ("40001", true),  // serialization failure
        ("40P01", true),  // deadlock
        ("55P03", true),  // lock not available
        ("42P01", false), // undefined table
        ("42703", false), // undefined column
        ("23505", false), // unique violation
        ("23514", false), // check violation
        ("22P02", false), // invalid text representation
        ("XX000", false), // internal error
    ];
    for (code, transient) in cases {
        assert_eq!(is_transient_sqlstate(code), *transient, "{code}");
    }
}

#[test]
fn kinds_follow_the_variant() {
    let cases = [
        (
            LedgerError::AlreadyExists("x".into()),
            LedgerErrorKind::AlreadyExists,
        ),
        (LedgerError::NotFound("x".into()), LedgerErrorKind::NotFound),
        (
            LedgerError::Constraint("x".into()),
            LedgerErrorKind::Constraint,
        ),
        (
            LedgerError::Unavailable("x".into()),
            LedgerErrorKind::Transient,
        ),
        (LedgerError::Closed, LedgerErrorKind::Transient),
        (LedgerError::Corrupt("x".into()), LedgerErrorKind::Internal),
        (LedgerError::Database("x".into()), LedgerErrorKind::Internal),
    ];
    for (error, kind) in cases {
        assert_eq!(error.kind(), kind, "{error}");
    }
}

async fn sqlite_connection(path: &std::path::Path, busy_timeout: Duration) -> SqliteConnection {
    SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .busy_timeout(busy_timeout)
        .connect()
        .await
        .expect("raw SQLite connection")
}

/// A database locked by another connection is busy: transient. A CHECK refusing a row is a
/// constraint, kept as the operation's own failure.
#[tokio::test]
async fn sqlite_busy_is_transient_and_check_is_a_constraint() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("raw.db");
    let mut holder = sqlite_connection(&path, Duration::from_secs(5)).await;
    holder
        .execute("CREATE TABLE t (x INTEGER NOT NULL CHECK (x > 0))")
        .await
        .unwrap();
    holder.execute("BEGIN EXCLUSIVE").await.unwrap();
    let mut other = sqlite_connection(&path, Duration::ZERO).await;
    let busy = other.execute("BEGIN IMMEDIATE").await.unwrap_err();
    let classified = database_error(&busy, busy.to_string());
    assert_eq!(
        classified.kind(),
        LedgerErrorKind::Transient,
        "{classified}"
    );
    holder.execute("ROLLBACK").await.unwrap();

    let refused = holder
        .execute("INSERT INTO t VALUES (0)")
        .await
        .unwrap_err();
    match write_failure(
        &refused,
        || "t".into(),
        || LedgerError::NotFound("t".into()),
    ) {
        Fail::Op(error) => assert_eq!(error.kind(), LedgerErrorKind::Constraint, "{error}"),
        Fail::Fatal(error) => panic!("a CHECK failure is the operation's, not fatal: {error}"),
    }
}

/// A lock wait that times out and a terminated backend are transient on PostgreSQL.
#[cfg(feature = "postgres-tests")]
#[tokio::test]
async fn pg_lock_timeout_and_termination_are_transient() {
    let db = Db::pg().await;
    let mut holder = db.pg_schema().raw().await;
    let mut waiter = db.pg_schema().raw().await;
    holder.execute("BEGIN").await.unwrap();
    holder
        .execute("LOCK TABLE tenants IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    waiter.execute("SET lock_timeout = '20ms'").await.unwrap();
    let timed_out = waiter.execute("SELECT * FROM tenants").await.unwrap_err();
    let classified = database_error(&timed_out, timed_out.to_string());
    assert_eq!(
        classified.kind(),
        LedgerErrorKind::Transient,
        "{classified}"
    );
    holder.execute("ROLLBACK").await.unwrap();

    let terminated = waiter
        .execute("SELECT pg_terminate_backend(pg_backend_pid())")
        .await
        .unwrap_err();
    let classified = database_error(&terminated, terminated.to_string());
    assert_eq!(
        classified.kind(),
        LedgerErrorKind::Transient,
        "{classified}"
    );
}

/// Reads of a table that is gone are internal failures (no retry helps), and the detail, which
/// the gateway logs, still says what happened.
async fn check_dropped_table(db: &Db, drop: impl std::future::Future<Output = ()>) {
    drop.await;
    let error = db
        .store()
        .find_token("0000")
        .await
        .expect_err("the token table is gone");
    assert_eq!(error.kind(), LedgerErrorKind::Internal, "{error}");
    assert!(error.to_string().contains("api_tokens"), "{error}");
}

#[tokio::test]
async fn sqlite_missing_table_is_internal() {
    let db = Db::sqlite().await;
    let path = db.sqlite_path();
    check_dropped_table(&db, async {
        let mut conn = sqlite_connection(&path, Duration::from_secs(5)).await;
        conn.execute("DROP TABLE api_tokens").await.unwrap();
    })
    .await;
}

#[cfg(feature = "postgres-tests")]
#[tokio::test]
async fn pg_missing_table_is_internal() {
    let db = Db::pg().await;
    let mut conn = db.pg_schema().raw().await;
    check_dropped_table(&db, async {
        conn.execute("DROP TABLE api_tokens CASCADE").await.unwrap();
    })
    .await;
}
