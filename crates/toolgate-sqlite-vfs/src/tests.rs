mod methods;

use std::cell::Cell;
use std::path::Path;

use rusqlite::{Connection, OpenFlags, params};

use super::{GATHER_LIMIT, NAME, register};

thread_local! {
    /// Writes handed to the platform's `-wal` files on this thread.
    static WAL_WRITES: Cell<u64> = const { Cell::new(0) };
}

thread_local! {
    /// A result code the next flush on this thread made by a read answers instead of the
    /// platform's.
    static FAIL_NEXT_READ_FLUSH: Cell<Option<std::ffi::c_int>> = const { Cell::new(None) };
    /// Whether this thread is in `xRead`.
    static READING: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread as in `xRead` while it lives.
pub(super) struct Reading;

impl Reading {
    pub(super) fn new() -> Reading {
        READING.with(|reading| reading.set(true));
        Reading
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        READING.with(|reading| reading.set(false));
    }
}

pub(super) fn injected_failure() -> Option<std::ffi::c_int> {
    if READING.with(Cell::get) {
        FAIL_NEXT_READ_FLUSH.with(Cell::take)
    } else {
        None
    }
}

pub(super) fn count_write() {
    WAL_WRITES.with(|writes| writes.set(writes.get() + 1));
}

fn wal_writes() -> u64 {
    WAL_WRITES.with(Cell::get)
}

const FLAGS: OpenFlags = OpenFlags::SQLITE_OPEN_READ_WRITE
    .union(OpenFlags::SQLITE_OPEN_CREATE)
    .union(OpenFlags::SQLITE_OPEN_NO_MUTEX);

/// A connection through this VFS, as the ledger's writer opens one.
fn gathered(path: &Path) -> Connection {
    register().unwrap();
    let conn = Connection::open_with_flags_and_vfs(path, FLAGS, NAME).unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;")
        .unwrap();
    conn
}

/// A connection through the platform's VFS.
fn plain(path: &Path) -> Connection {
    Connection::open_with_flags(path, FLAGS).unwrap()
}

fn blob(row: i64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|at| u8::try_from((row * 31 + i64::try_from(at).unwrap()) % 251).unwrap())
        .collect()
}

/// Rows `from..to` of `t`, each a blob of `len` bytes, in one transaction.
fn insert(conn: &mut Connection, from: i64, to: i64, len: usize) {
    let tx = conn.transaction().unwrap();
    for row in from..to {
        tx.execute(
            "INSERT INTO t (id, b) VALUES (?1, ?2)",
            params![row, blob(row, len)],
        )
        .unwrap();
    }
    tx.commit().unwrap();
}

/// Every row of `t` holds the blob it was given; answers how many rows there are.
fn check_rows(conn: &Connection, len: usize) -> i64 {
    let mut statement = conn.prepare("SELECT id, b FROM t ORDER BY id").unwrap();
    let mut rows = statement.query([]).unwrap();
    let mut count = 0;
    while let Some(row) = rows.next().unwrap() {
        let id: i64 = row.get(0).unwrap();
        let b: Vec<u8> = row.get(1).unwrap();
        assert_eq!(b, blob(id, len), "row {id}");
        count += 1;
    }
    let integrity: String = conn
        .query_row("PRAGMA integrity_check", [], |row| row.get(0))
        .unwrap();
    assert_eq!(integrity, "ok");
    count
}

fn create(conn: &Connection) {
    conn.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, b BLOB NOT NULL)")
        .unwrap();
}

#[test]
fn registering_again_answers_as_the_first_time_and_never_makes_it_the_default() {
    assert_eq!(register(), Ok(()));
    assert_eq!(register(), Ok(()));
    // SAFETY: `sqlite3_vfs_find` answers a registered VFS (or null); a VFS's name is a C
    // string that lives as long as it is registered.
    let (ours, default) = unsafe {
        let ours = rusqlite::ffi::sqlite3_vfs_find(super::NAME_C.as_ptr());
        let default = rusqlite::ffi::sqlite3_vfs_find(std::ptr::null());
        (ours, std::ffi::CStr::from_ptr((*default).zName))
    };
    assert!(!ours.is_null());
    assert_ne!(default.to_str().unwrap(), NAME);
}

/// The writes a commit of `frames` frames of 4 KiB pages takes: pieces of up to
/// [`GATHER_LIMIT`] bytes, each as many whole frames as fit (one more for a log header or a
/// frame written apart).
fn writes_for(frames: i64) -> std::ops::RangeInclusive<u64> {
    let frame = 24 + 4096;
    let bytes = u64::try_from(frames).unwrap() * frame;
    let limit = u64::try_from(GATHER_LIMIT).unwrap();
    bytes.div_ceil(limit)..=bytes.div_ceil(limit / frame * frame) + 1
}

#[test]
fn a_commit_hands_its_frames_to_the_file_in_few_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut conn = gathered(&path);
    create(&conn);
    conn.execute_batch("PRAGMA wal_checkpoint(TRUNCATE)")
        .unwrap();
    let before = wal_writes();
    // 25 rows of 3,000 bytes: 25 pages or more, each two writes on the platform's VFS.
    insert(&mut conn, 0, 25, 3000);
    let writes = wal_writes() - before;
    let (_, frames, _): (i64, i64, i64) = conn
        .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |row| {
            Ok((row.get(0)?, row.get(1)?, row.get(2)?))
        })
        .unwrap();
    assert!(frames >= 25, "{frames} frames in the log");
    assert!(
        writes_for(frames).contains(&writes),
        "{writes} writes for {frames} frames"
    );
    assert_eq!(check_rows(&plain(&path), 3000), 25);
}

#[test]
fn a_commit_is_in_the_file_when_it_returns() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut conn = gathered(&path);
    create(&conn);
    insert(&mut conn, 0, 25, 1000);
    insert(&mut conn, 25, 50, 1000);
    // The process "dies" here: the connection is never closed, so nothing gathered would be
    // written by a close.
    std::mem::forget(conn);
    assert_eq!(check_rows(&plain(&path), 1000), 50);
}

#[test]
fn readers_on_the_platform_vfs_see_every_commit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut writer = gathered(&path);
    create(&writer);
    let reader = plain(&path);
    for round in 0..30 {
        insert(&mut writer, round * 7, round * 7 + 7, 700);
        let count: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .unwrap();
        assert_eq!(count, round * 7 + 7);
    }
    assert_eq!(check_rows(&reader, 700), 210);
}

#[test]
fn pages_spilled_before_the_commit_are_read_back_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut conn = gathered(&path);
    // A page cache of 10 pages: a large transaction spills its pages into the log before it
    // commits, and reads them back from there.
    conn.execute_batch("PRAGMA cache_size = 10").unwrap();
    create(&conn);
    let tx = conn.transaction().unwrap();
    for row in 0..400 {
        tx.execute(
            "INSERT INTO t (id, b) VALUES (?1, ?2)",
            params![row, blob(row, 900)],
        )
        .unwrap();
    }
    // Rewrite the earliest rows (read back from the log) and read everything in the
    // transaction.
    for row in 0..50 {
        tx.execute(
            "UPDATE t SET b = ?2 WHERE id = ?1",
            params![row, blob(row, 900)],
        )
        .unwrap();
    }
    let total: i64 = tx
        .query_row("SELECT sum(length(b)) FROM t", [], |row| row.get(0))
        .unwrap();
    assert_eq!(total, 400 * 900);
    tx.commit().unwrap();
    assert_eq!(check_rows(&conn, 900), 400);
    drop(conn);
    assert_eq!(check_rows(&plain(&path), 900), 400);
}

#[test]
fn the_log_restarts_and_truncates_and_stays_readable() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut conn = gathered(&path);
    conn.execute_batch("PRAGMA journal_size_limit = 65536")
        .unwrap();
    create(&conn);
    for round in 0..6 {
        insert(&mut conn, round * 20, round * 20 + 20, 2500);
        let mode = if round % 2 == 0 {
            "RESTART"
        } else {
            "TRUNCATE"
        };
        let busy: i64 = conn
            .query_row(&format!("PRAGMA wal_checkpoint({mode})"), [], |row| {
                row.get(0)
            })
            .unwrap();
        assert_eq!(busy, 0);
        // Frames of the restarted log, after its new header.
        insert(&mut conn, 1000 + round * 5, 1000 + round * 5 + 5, 2500);
    }
    assert_eq!(check_rows(&conn, 2500), 150);
    drop(conn);
    let reopened = gathered(&path);
    assert_eq!(check_rows(&reopened, 2500), 150);
}

#[test]
fn a_database_without_power_safe_overwrite_has_its_log_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    register().unwrap();
    // `psow=0`: SQLite pads each commit to a sector and writes the end of its last frame
    // after the sync, so nothing may be gathered.
    let uri = format!("file:{}?psow=0", path.display());
    let mut conn =
        Connection::open_with_flags_and_vfs(&uri, FLAGS.union(OpenFlags::SQLITE_OPEN_URI), NAME)
            .unwrap();
    conn.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL;")
        .unwrap();
    create(&conn);
    let reader = plain(&path);
    let before = wal_writes();
    for round in 0..10 {
        insert(&mut conn, round * 5, round * 5 + 5, 1500);
        let count: i64 = reader
            .query_row("SELECT count(*) FROM t", [], |row| row.get(0))
            .unwrap();
        assert_eq!(count, round * 5 + 5);
    }
    assert_eq!(wal_writes(), before, "nothing gathered");
    assert_eq!(check_rows(&reader, 1500), 50);
}

#[test]
fn a_failed_write_rolls_the_whole_transaction_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let mut conn = gathered(&path);
    conn.execute_batch("PRAGMA cache_size = 10").unwrap();
    create(&conn);
    insert(&mut conn, 0, 20, 900);
    let tx = conn.transaction().unwrap();
    for row in 100..500 {
        tx.execute(
            "INSERT INTO t (id, b) VALUES (?1, ?2)",
            params![row, blob(row, 900)],
        )
        .unwrap();
    }
    // The platform's file is full when the spilled pages are read back: SQLite must not go
    // on as if the writes it was told had succeeded were in the file.
    FAIL_NEXT_READ_FLUSH.with(|fail| fail.set(Some(rusqlite::ffi::SQLITE_FULL)));
    let failed = tx.execute("UPDATE t SET b = zeroblob(900) WHERE id >= 100", []);
    assert!(failed.is_err(), "{failed:?}");
    assert_eq!(
        FAIL_NEXT_READ_FLUSH.with(Cell::take),
        None,
        "the failure was used"
    );
    // Whatever COMMIT answers, none of the transaction is in the database.
    let _ = tx.commit();
    assert!(conn.is_autocommit());
    assert_eq!(check_rows(&conn, 900), 20);
    drop(conn);
    assert_eq!(check_rows(&plain(&path), 900), 20);
}
