//! The writer's connection: SQLite called directly (rusqlite, linking the same SQLite as sqlx),
//! on the writer's own thread, with every statement prepared once and cached.
//!
//! sqlx's SQLite driver runs each statement on a worker thread of the connection's, so every
//! statement costs two thread switches; at a few microseconds of SQLite work per statement,
//! those switches were most of a write's cost. Here a statement is a function call.
//!
//! The shared write code ([`crate::steps`]) speaks [`Db`] with sqlx's error type, so this
//! connection answers in it too: a failed statement becomes a `sqlx::Error::Database` holding a
//! [`LiteError`] with SQLite's extended result code, which [`crate::rows`] classifies exactly as
//! it classifies sqlx's own SQLite errors (unique, foreign key, NOT NULL and CHECK violations;
//! busy, locked, I/O and full as transient).

use std::borrow::Cow;
use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rusqlite::types::Value;
use rusqlite::{Connection, OpenFlags, Statement, ffi};
use sqlx::error::{DatabaseError, ErrorKind};

use crate::chain::GENESIS_HASH;
use crate::error::LedgerError;
use crate::ops::PreparedCall;
use crate::rows::{Fail, SqlRow, int_flag, read_failure};
use crate::sql::{Db, Dialect, Param, Query, query};
use crate::steps::{Conn, FastHash, Head, Heads, SqlConn, bind_call_row, call_row_columns};

/// Prepared statements the connection keeps: every statement the writer runs has its own text,
/// and there are fewer than this many.
const STATEMENT_CACHE: usize = 256;

/// The call row, as every path of the writer inserts it.
const INSERT_CALL: &str = concat!(
    "INSERT INTO tool_calls (",
    call_row_columns!(),
    ", evaluation) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, \
     $16, $17, $18, $19, $20, $21)"
);

/// The write connection of a ledger file.
pub(super) struct LiteConn {
    conn: Connection,
    /// Which parameter each placeholder of a statement takes, learned at the statement's first
    /// run (asking SQLite for every placeholder's name at every run cost more than some
    /// statements' own work). Keyed by where the statement's text lives and its length: every
    /// text is `'static` (see [`Query`]), so the same key is always the same text. Hashed with
    /// foldhash: the key is two machine words of this process's, and SipHash over them cost
    /// more than a thousand instructions a call (six statements).
    positions: HashMap<(usize, usize), Box<[usize]>, FastHash>,
}

impl fmt::Debug for LiteConn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiteConn")
            .field("path", &self.conn.path())
            .finish()
    }
}

impl LiteConn {
    /// Opens the (already created and migrated) ledger at `path` for writing, with the
    /// writer's settings: see `SqliteStore` for why each.
    pub(super) fn open(path: &Path, busy_timeout: Duration) -> Result<LiteConn, LedgerError> {
        let display = path.display();
        let failed =
            |error: rusqlite::Error| LedgerError::Database(format!("ledger {display}: {error}"));
        // Through the VFS that writes a commit's log frames 16 KiB at a time, not two system
        // calls a page (it needs `synchronous = FULL`, checked below).
        toolgate_sqlite_vfs::register()
            .map_err(|error| LedgerError::Database(format!("ledger {display}: {error}")))?;
        let conn = Connection::open_with_flags_and_vfs(
            path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
            toolgate_sqlite_vfs::NAME,
        )
        .map_err(failed)?;
        conn.busy_timeout(busy_timeout).map_err(failed)?;
        conn.execute_batch(
            "PRAGMA journal_mode = WAL; \
             PRAGMA synchronous = FULL; \
             PRAGMA foreign_keys = ON; \
             PRAGMA cache_size = -4096; \
             PRAGMA temp_store = MEMORY; \
             PRAGMA secure_delete = ON;",
        )
        .map_err(failed)?;
        // Durability, and the gathering VFS's correctness, rest on every commit syncing the
        // log before it is published.
        let synchronous: i64 = conn
            .query_row("PRAGMA synchronous", [], |row| row.get(0))
            .map_err(failed)?;
        if synchronous < 2 {
            return Err(LedgerError::Database(format!(
                "ledger {display}: synchronous is {synchronous}, not FULL (2)"
            )));
        }
        conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        // Commits no longer checkpoint by themselves: the writer has that done beside it.
        super::backfill::watch_log(&conn);
        Ok(LiteConn {
            conn,
            positions: HashMap::default(),
        })
    }

    /// Runs one statement without parameters (transaction control).
    pub(super) fn control(&self, sql: &str) -> Result<(), sqlx::Error> {
        let mut statement = self.conn.prepare_cached(sql).map_err(to_sqlx)?;
        let mut rows = statement.raw_query();
        while rows.next().map_err(to_sqlx)?.is_some() {}
        Ok(())
    }

    /// Whether a transaction is open (SQLite rolls one back by itself on some errors).
    pub(super) fn in_transaction(&self) -> bool {
        !self.conn.is_autocommit()
    }

    /// Copies the write-ahead log into the database and empties it: the busy flag, the log's
    /// pages and the pages copied.
    pub(super) fn checkpoint(&self) -> Result<(i64, i64, i64), sqlx::Error> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |row| {
                Ok((row.get(0)?, row.get(1)?, row.get(2)?))
            })
            .map_err(to_sqlx)
    }

    /// Copies into the database what the write-ahead log holds beyond what is copied already,
    /// without waiting for any reader; once all of it is, the next transaction starts the log
    /// over.
    pub(super) fn backfill(&self) -> Result<(), sqlx::Error> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()))
            .map_err(to_sqlx)
    }

    /// Closes the connection, saying why it could not be closed cleanly.
    pub(super) fn close(self) -> Result<(), sqlx::Error> {
        self.conn.close().map_err(|(_, error)| to_sqlx(error))
    }

    /// Prepares (or takes from the cache) and binds `query`, then hands the statement to `run`.
    fn with_statement<T>(
        &mut self,
        query: &Query<'_>,
        run: impl FnOnce(&mut Statement<'_>) -> rusqlite::Result<T>,
    ) -> Result<T, sqlx::Error> {
        let (sql, params) = query.parts();
        let mut statement = self.conn.prepare_cached(sql).map_err(to_sqlx)?;
        let positions = self
            .positions
            .entry((sql.as_ptr() as usize, sql.len()))
            .or_insert_with(|| placeholders(&statement));
        bind(&mut statement, positions, params).map_err(to_sqlx)?;
        run(&mut statement).map_err(to_sqlx)
    }

    fn execute_now(&mut self, query: &Query<'_>) -> Result<u64, sqlx::Error> {
        self.with_statement(query, |statement| {
            let mut rows = statement.raw_query();
            while rows.next()?.is_some() {}
            Ok(())
        })?;
        Ok(self.conn.changes())
    }

    fn fetch_now(&mut self, query: &Query<'_>, limit: usize) -> Result<Vec<LiteRow>, sqlx::Error> {
        self.with_statement(query, |statement| {
            let columns: Arc<[String]> = statement
                .column_names()
                .into_iter()
                .map(str::to_owned)
                .collect();
            let count = columns.len();
            let mut rows = statement.raw_query();
            let mut found = Vec::new();
            while found.len() < limit
                && let Some(row) = rows.next()?
            {
                let values = (0..count)
                    .map(|index| row.get::<_, Value>(index))
                    .collect::<rusqlite::Result<Vec<Value>>>()?;
                found.push(LiteRow {
                    columns: Arc::clone(&columns),
                    values,
                });
            }
            Ok(found)
        })
    }
}

/// Which parameter each of the statement's placeholders takes, in SQLite's order of them (1 is
/// the first parameter). `$N` (or `?N`) takes the N-th parameter, wherever and however often it
/// appears, as in sqlx (SQLite gives all of a name's appearances one placeholder); a bare `?`
/// takes the next in order.
fn placeholders(statement: &Statement<'_>) -> Box<[usize]> {
    (1..=statement.parameter_count())
        .map(|index| {
            statement
                .parameter_name(index)
                .and_then(|name| name.strip_prefix(['$', '?']))
                .and_then(|number| number.parse::<usize>().ok())
                .unwrap_or(index)
        })
        .collect()
}

/// Binds `params` to the statement's placeholders, as `positions` ([`placeholders`]) says.
fn bind(
    statement: &mut Statement<'_>,
    positions: &[usize],
    params: &[Param<'_>],
) -> rusqlite::Result<()> {
    for (index, &position) in (1..).zip(positions) {
        let Some(param) = position.checked_sub(1).and_then(|at| params.get(at)) else {
            return Err(rusqlite::Error::InvalidParameterCount(
                position,
                params.len(),
            ));
        };
        match *param {
            Param::Text(text) => statement.raw_bind_parameter(index, text)?,
            Param::Int(int) => statement.raw_bind_parameter(index, int)?,
            Param::Bool(flag) => statement.raw_bind_parameter(index, i64::from(flag))?,
        }
    }
    Ok(())
}

impl Db for &mut LiteConn {
    type Row = LiteRow;

    async fn execute(self, query: Query<'_>) -> Result<u64, sqlx::Error> {
        self.execute_now(&query)
    }

    async fn fetch_all(self, query: Query<'_>) -> Result<Vec<LiteRow>, sqlx::Error> {
        self.fetch_now(&query, usize::MAX)
    }

    async fn fetch_optional(self, query: Query<'_>) -> Result<Option<LiteRow>, sqlx::Error> {
        Ok(self.fetch_now(&query, 1)?.pop())
    }
}

impl SqlConn for LiteConn {
    type Row = LiteRow;
    type Db<'c> = &'c mut LiteConn;
    const DIALECT: Dialect = Dialect::Sqlite;

    fn db(&mut self) -> &mut LiteConn {
        self
    }
}

impl Conn for LiteConn {
    /// The writer is the file's only writer: its cached head is the chain's, loaded lazily.
    async fn head(&mut self, heads: &mut Heads, tenant: &str) -> Result<Head, Fail> {
        load_head(self, heads, tenant).await
    }

    /// A repeated key fails the statement, and SQLite undoes that statement only.
    async fn insert_call(
        &mut self,
        prepared: &PreparedCall,
        _owner: Option<i64>,
    ) -> Result<bool, sqlx::Error> {
        bind_call_row(query(INSERT_CALL), prepared)
            .bind(prepared.call.evaluation)
            .execute(&mut *self)
            .await
            .map(|_| true)
    }

    async fn recover(&mut self) -> Result<(), Fail> {
        Ok(())
    }
}

/// The cached head of a tenant's chain, loaded from `audit_heads` on first use.
async fn load_head(conn: &mut LiteConn, heads: &mut Heads, tenant: &str) -> Result<Head, Fail> {
    if let Some(head) = heads.get(tenant) {
        return Ok(head.clone());
    }
    let row = query("SELECT chain_seq, hash FROM audit_heads WHERE tenant = $1")
        .bind(tenant)
        .fetch_optional(&mut *conn)
        .await
        .map_err(read_failure)?;
    let head = match row {
        Some(row) => Head {
            chain_seq: row.int("chain_seq").map_err(Fail::Op)?,
            hash: row.text("hash").map_err(Fail::Op)?,
        },
        None => {
            let orphan = query("SELECT 1 AS found FROM audit_events WHERE tenant = $1 LIMIT 1")
                .bind(tenant)
                .fetch_optional(&mut *conn)
                .await
                .map_err(read_failure)?;
            if orphan.is_some() {
                // Appending would fork the chain; refuse until someone looks at it.
                return Err(Fail::Op(LedgerError::Corrupt(format!(
                    "the audit chain of tenant {tenant} has events but no head record; run verify"
                ))));
            }
            Head {
                chain_seq: 0,
                hash: GENESIS_HASH.to_owned(),
            }
        }
    };
    heads.insert(tenant.to_owned(), head.clone());
    Ok(head)
}

/// A row read through [`LiteConn`], its values copied out of SQLite.
#[derive(Debug)]
pub(crate) struct LiteRow {
    columns: Arc<[String]>,
    values: Vec<Value>,
}

impl LiteRow {
    fn value(&self, column: &str) -> Result<&Value, LedgerError> {
        self.columns
            .iter()
            .position(|name| name == column)
            .and_then(|index| self.values.get(index))
            .ok_or_else(|| LedgerError::Corrupt(format!("column {column}: not in the row")))
    }
}

/// What a value is, for an error saying it is not what the column should hold.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "NULL",
        Value::Integer(_) => "an integer",
        Value::Real(_) => "a real number",
        Value::Text(_) => "text",
        Value::Blob(_) => "a blob",
    }
}

fn mismatch(column: &str, value: &Value, wanted: &str) -> LedgerError {
    LedgerError::Corrupt(format!(
        "column {column}: {} where {wanted} was expected",
        kind(value)
    ))
}

impl SqlRow for LiteRow {
    fn text(&self, column: &str) -> Result<String, LedgerError> {
        self.text_opt(column)?
            .ok_or_else(|| mismatch(column, &Value::Null, "text"))
    }

    fn text_opt(&self, column: &str) -> Result<Option<String>, LedgerError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Text(text) => Ok(Some(text.clone())),
            other => Err(mismatch(column, other, "text")),
        }
    }

    fn int(&self, column: &str) -> Result<i64, LedgerError> {
        self.int_opt(column)?
            .ok_or_else(|| mismatch(column, &Value::Null, "an integer"))
    }

    fn int_opt(&self, column: &str) -> Result<Option<i64>, LedgerError> {
        match self.value(column)? {
            Value::Null => Ok(None),
            Value::Integer(int) => Ok(Some(*int)),
            other => Err(mismatch(column, other, "an integer")),
        }
    }

    /// Booleans are INTEGER 0/1.
    fn flag(&self, column: &str) -> Result<bool, LedgerError> {
        int_flag(column, self.int(column)?)
    }
}

/// A statement SQLite refused, with its extended result code and message.
#[derive(Debug)]
pub(crate) struct LiteError {
    extended: i32,
    message: String,
}

impl fmt::Display for LiteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl StdError for LiteError {}

impl DatabaseError for LiteError {
    fn message(&self) -> &str {
        &self.message
    }

    fn code(&self) -> Option<Cow<'_, str>> {
        Some(Cow::Owned(self.extended.to_string()))
    }

    fn as_error(&self) -> &(dyn StdError + Send + Sync + 'static) {
        self
    }

    fn as_error_mut(&mut self) -> &mut (dyn StdError + Send + Sync + 'static) {
        self
    }

    fn into_error(self: Box<Self>) -> Box<dyn StdError + Send + Sync + 'static> {
        self
    }

    fn kind(&self) -> ErrorKind {
        match self.extended {
            ffi::SQLITE_CONSTRAINT_UNIQUE | ffi::SQLITE_CONSTRAINT_PRIMARYKEY => {
                ErrorKind::UniqueViolation
            }
            ffi::SQLITE_CONSTRAINT_FOREIGNKEY => ErrorKind::ForeignKeyViolation,
            ffi::SQLITE_CONSTRAINT_NOTNULL => ErrorKind::NotNullViolation,
            ffi::SQLITE_CONSTRAINT_CHECK => ErrorKind::CheckViolation,
            _ => ErrorKind::Other,
        }
    }
}

/// rusqlite's error as sqlx's: SQLite's own failures keep their code (see [`LiteError`]);
/// anything else (a value of an unexpected type, a misuse) is a protocol error.
fn to_sqlx(error: rusqlite::Error) -> sqlx::Error {
    match error {
        rusqlite::Error::SqliteFailure(failure, message) => {
            sqlx::Error::Database(Box::new(LiteError {
                extended: failure.extended_code,
                message: message.unwrap_or_else(|| failure.to_string()),
            }))
        }
        other => sqlx::Error::Protocol(other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::LedgerErrorKind;
    use crate::rows::{SqlFailure, database_error};

    fn open(dir: &tempfile::TempDir, busy: Duration) -> LiteConn {
        let path = dir.path().join("direct.db");
        Connection::open(&path).expect("create the file");
        LiteConn::open(&path, busy).expect("open")
    }

    fn run(conn: &mut LiteConn, sql: &'static str) {
        conn.execute_now(&query(sql)).expect(sql);
    }

    /// The workspace builds SQLite without its process-wide page-cache and allocation locks
    /// (`LIBSQLITE3_FLAGS` in `.cargo/config.toml`): a build that lost the setting is slower,
    /// not wrong, so only this says it.
    #[test]
    fn sqlite_is_built_without_its_global_locks() {
        let dir = tempfile::tempdir().unwrap();
        let conn = open(&dir, Duration::from_secs(1));
        let options = conn
            .conn
            .prepare("PRAGMA compile_options")
            .unwrap()
            .query_map([], |row| row.get::<_, String>(0))
            .unwrap()
            .collect::<rusqlite::Result<Vec<String>>>()
            .unwrap();
        assert!(options.iter().any(|o| o == "THREADSAFE=1"), "{options:?}");
        assert!(
            !options.iter().any(|o| o == "ENABLE_MEMORY_MANAGEMENT"),
            "{options:?}"
        );
        assert!(
            options.iter().any(|o| o == "DEFAULT_MEMSTATUS=0"),
            "{options:?}"
        );
    }

    #[test]
    fn numbered_placeholders_take_their_parameter_wherever_they_appear() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir, Duration::from_secs(1));
        run(
            &mut conn,
            "CREATE TABLE t (a TEXT, b INTEGER, c INTEGER, d TEXT)",
        );
        // `$2` before `$1`, and `$1` twice; the second run binds by what the first learned.
        for (a, b) in [("x", 7_i64), ("w", 8)] {
            let insert = query("INSERT INTO t (b, a, c, d) VALUES ($2, $1, $3, $1 || '!')")
                .bind(a)
                .bind(b)
                .bind(true);
            assert_eq!(conn.execute_now(&insert).unwrap(), 1);
        }
        assert_eq!(conn.positions.len(), 2, "one entry per statement text");
        let missing = Option::<&str>::None;
        let insert = query("INSERT INTO t (a, b, c, d) VALUES (?, ?, ?, ?)")
            .bind(missing)
            .bind(Option::<i64>::None)
            .bind(false)
            .bind("y");
        assert_eq!(conn.execute_now(&insert).unwrap(), 1);

        let rows = conn
            .fetch_now(&query("SELECT a, b, c, d FROM t ORDER BY d"), usize::MAX)
            .unwrap();
        assert_eq!(rows.len(), 3);
        assert_eq!(rows[0].text("a").unwrap(), "w");
        assert_eq!(rows[0].int("b").unwrap(), 8);
        assert_eq!(rows[0].text("d").unwrap(), "w!");
        assert_eq!(rows[1].text("a").unwrap(), "x");
        assert_eq!(rows[1].int("b").unwrap(), 7);
        assert!(rows[1].flag("c").unwrap());
        assert_eq!(rows[1].text("d").unwrap(), "x!");
        assert_eq!(rows[2].text_opt("a").unwrap(), None);
        assert_eq!(rows[2].int_opt("b").unwrap(), None);
        assert!(!rows[2].flag("c").unwrap());

        // A value of the wrong type, a NULL where one is required and an absent column are
        // the file's fault, said as such.
        for error in [
            rows[1].int("a").unwrap_err(),
            rows[2].text("a").unwrap_err(),
            rows[0].text("nope").unwrap_err(),
        ] {
            assert!(matches!(error, LedgerError::Corrupt(_)), "{error}");
        }
        // Too few parameters is refused before anything runs.
        let short = query("INSERT INTO t (a, b) VALUES ($1, $2)").bind("z");
        assert!(conn.execute_now(&short).is_err());
        let one = conn
            .fetch_now(&query("SELECT count(*) AS n FROM t"), 1)
            .unwrap();
        assert_eq!(one[0].int("n").unwrap(), 3);
    }

    #[test]
    fn refusals_are_classified_as_sqlx_errors_of_sqlite_are() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir, Duration::ZERO);
        run(&mut conn, "CREATE TABLE p (id TEXT PRIMARY KEY)");
        run(
            &mut conn,
            "CREATE TABLE c (id TEXT UNIQUE, p TEXT REFERENCES p (id), \
             n INTEGER NOT NULL CHECK (n > 0))",
        );
        run(&mut conn, "INSERT INTO p VALUES ('p1')");
        run(&mut conn, "INSERT INTO c VALUES ('c1', 'p1', 1)");
        type Expected = fn(&SqlFailure) -> bool;
        let cases: [(&'static str, Expected); 5] = [
            ("INSERT INTO p VALUES ('p1')", |f| {
                matches!(f, SqlFailure::Unique)
            }),
            ("INSERT INTO c VALUES ('c1', 'p1', 2)", |f| {
                matches!(f, SqlFailure::Unique)
            }),
            ("INSERT INTO c VALUES ('c2', 'p404', 2)", |f| {
                matches!(f, SqlFailure::ForeignKey)
            }),
            (
                "INSERT INTO c VALUES ('c3', 'p1', NULL)",
                |f| matches!(f, SqlFailure::Constraint(m) if m.contains("NOT NULL")),
            ),
            (
                "INSERT INTO c VALUES ('c4', 'p1', 0)",
                |f| matches!(f, SqlFailure::Constraint(m) if m.contains("CHECK")),
            ),
        ];
        for (sql, expected) in cases {
            let error = conn.execute_now(&query(sql)).unwrap_err();
            let failure = SqlFailure::classify(&error);
            assert!(expected(&failure), "{sql}: {failure:?}");
            let kind = database_error(&error, error.to_string()).kind();
            assert_eq!(kind, LedgerErrorKind::Internal, "{sql}");
        }

        // Another connection holding the write lock makes this one busy: transient.
        let holder = Connection::open(dir.path().join("direct.db")).unwrap();
        holder.execute_batch("BEGIN EXCLUSIVE").unwrap();
        let busy = conn.control("BEGIN IMMEDIATE").unwrap_err();
        assert!(
            matches!(SqlFailure::classify(&busy), SqlFailure::Fatal(_)),
            "{busy}"
        );
        assert_eq!(
            database_error(&busy, busy.to_string()).kind(),
            LedgerErrorKind::Transient,
            "{busy}"
        );
        holder.execute_batch("ROLLBACK").unwrap();
        conn.control("BEGIN IMMEDIATE").unwrap();
        assert!(conn.in_transaction());
        conn.control("ROLLBACK").unwrap();
        assert!(!conn.in_transaction());
    }
}
