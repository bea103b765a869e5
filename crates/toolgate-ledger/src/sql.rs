//! One SQL text for both backends: a query built from the few kinds of values the ledger binds,
//! run on any connection or pool of either backend through [`Db`].
//!
//! sqlx's SQLite driver binds `$1`-style placeholders like PostgreSQL does, so the code that
//! reads the ledger and the step-by-step writes are written once, over [`Db`]. Binding goes
//! through [`Param`] rather than sqlx's generic `bind`: generic code would otherwise carry an
//! `Encode + Type` bound for every bound type on every function. Where the dialects truly
//! differ, the shared code picks its text by [`Dialect`] and says why.

use std::future::Future;

use crate::error::LedgerError;
use crate::rows::{SqlRow, read_error};

/// Which SQL dialect a [`Db`] speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
// A build with one backend never speaks the other's dialect.
#[cfg_attr(not(all(feature = "sqlite", feature = "postgres")), allow(dead_code))]
pub(crate) enum Dialect {
    Sqlite,
    Postgres,
}

/// A value bound to a placeholder. Texts and integers may be NULL.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Param<'a> {
    Text(Option<&'a str>),
    Int(Option<i64>),
    /// SQLite stores it as INTEGER 0/1, PostgreSQL as BOOLEAN; each driver encodes it so.
    Bool(bool),
}

impl<'a> From<&'a str> for Param<'a> {
    fn from(value: &'a str) -> Self {
        Param::Text(Some(value))
    }
}

impl<'a> From<&'a String> for Param<'a> {
    fn from(value: &'a String) -> Self {
        Param::Text(Some(value))
    }
}

impl<'a> From<Option<&'a str>> for Param<'a> {
    fn from(value: Option<&'a str>) -> Self {
        Param::Text(value)
    }
}

impl<'a> From<&'a Option<String>> for Param<'a> {
    fn from(value: &'a Option<String>) -> Self {
        Param::Text(value.as_deref())
    }
}

impl From<i64> for Param<'_> {
    fn from(value: i64) -> Self {
        Param::Int(Some(value))
    }
}

impl From<Option<i64>> for Param<'_> {
    fn from(value: Option<i64>) -> Self {
        Param::Int(value)
    }
}

impl From<bool> for Param<'_> {
    fn from(value: bool) -> Self {
        Param::Bool(value)
    }
}

/// A statement and its parameters, in placeholder order.
#[derive(Debug)]
pub(crate) struct Query<'a> {
    /// Always text of this crate's: a statement's identity as well as its text (the SQLite
    /// writer keys what it learns of a statement by where its text lives).
    sql: &'static str,
    params: Vec<Param<'a>>,
}

/// A statement written in this crate (every value is a bound parameter).
pub(crate) fn query<'a>(sql: &'static str) -> Query<'a> {
    Query {
        sql,
        // Room for the call row's parameters, the most a statement of the hot path binds, so
        // binding one never grows the vector.
        params: Vec::with_capacity(PARAMS),
    }
}

/// How many parameters a query has room for before it grows.
const PARAMS: usize = 24;

impl<'a> Query<'a> {
    /// Binds the next placeholder.
    pub(crate) fn bind(mut self, value: impl Into<Param<'a>>) -> Self {
        self.params.push(value.into());
        self
    }

    /// Runs a statement; returns the rows it changed.
    pub(crate) async fn execute<D: Db>(self, db: D) -> Result<u64, sqlx::Error> {
        db.execute(self).await
    }

    pub(crate) async fn fetch_all<D: Db>(self, db: D) -> Result<Vec<D::Row>, sqlx::Error> {
        db.fetch_all(self).await
    }

    pub(crate) async fn fetch_optional<D: Db>(self, db: D) -> Result<Option<D::Row>, sqlx::Error> {
        db.fetch_optional(self).await
    }

    /// The one row the statement returns; `sqlx::Error::RowNotFound` without one.
    pub(crate) async fn fetch_one<D: Db>(self, db: D) -> Result<D::Row, sqlx::Error> {
        db.fetch_optional(self)
            .await?
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// Every row, decoded: a failed read, or a row this version cannot read, is the error.
    pub(crate) async fn all<D: Db, T>(
        self,
        db: D,
        decode: impl Fn(&D::Row) -> Result<T, LedgerError> + Send,
    ) -> Result<Vec<T>, LedgerError> {
        let rows = self.fetch_all(db).await.map_err(read_error)?;
        rows.iter().map(decode).collect()
    }

    /// The row, if any, decoded, as [`Query::all`].
    pub(crate) async fn optional<D: Db, T>(
        self,
        db: D,
        decode: impl Fn(&D::Row) -> Result<T, LedgerError> + Send,
    ) -> Result<Option<T>, LedgerError> {
        let row = self.fetch_optional(db).await.map_err(read_error)?;
        row.as_ref().map(decode).transpose()
    }

    /// The statement's text and its parameters, for a driver other than sqlx's (the SQLite
    /// writer's direct connection).
    #[cfg(feature = "sqlite")]
    pub(crate) fn parts(&self) -> (&'static str, &[Param<'a>]) {
        (self.sql, &self.params)
    }

    /// The sqlx query of one backend.
    fn into_sqlx<DB>(self) -> sqlx::query::Query<'a, DB, DB::Arguments>
    where
        DB: sqlx::Database,
        for<'t> Option<&'t str>: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> Option<i64>: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
        for<'t> bool: sqlx::Encode<'t, DB> + sqlx::Type<DB>,
    {
        let mut bound = sqlx::query(self.sql);
        for param in self.params {
            bound = match param {
                Param::Text(text) => bound.bind(text),
                Param::Int(int) => bound.bind(int),
                Param::Bool(flag) => bound.bind(flag),
            };
        }
        bound
    }
}

/// A connection or pool of either backend, consumed by one statement (as sqlx's `Executor`).
pub(crate) trait Db: Send + Sized {
    type Row: SqlRow + Send;

    fn execute(self, query: Query<'_>) -> impl Future<Output = Result<u64, sqlx::Error>> + Send;
    fn fetch_all(
        self,
        query: Query<'_>,
    ) -> impl Future<Output = Result<Vec<Self::Row>, sqlx::Error>> + Send;
    fn fetch_optional(
        self,
        query: Query<'_>,
    ) -> impl Future<Output = Result<Option<Self::Row>, sqlx::Error>> + Send;
}

/// Implements [`Db`] for an executor type of one backend.
macro_rules! db_for {
    ($executor:ty, $database:ty) => {
        impl Db for $executor {
            type Row = <$database as sqlx::Database>::Row;

            async fn execute(self, query: Query<'_>) -> Result<u64, sqlx::Error> {
                let done = query.into_sqlx::<$database>().execute(self).await?;
                Ok(done.rows_affected())
            }

            async fn fetch_all(self, query: Query<'_>) -> Result<Vec<Self::Row>, sqlx::Error> {
                query.into_sqlx::<$database>().fetch_all(self).await
            }

            async fn fetch_optional(
                self,
                query: Query<'_>,
            ) -> Result<Option<Self::Row>, sqlx::Error> {
                query.into_sqlx::<$database>().fetch_optional(self).await
            }
        }
    };
}

#[cfg(feature = "sqlite")]
db_for!(&mut sqlx::SqliteConnection, sqlx::Sqlite);
#[cfg(feature = "sqlite")]
db_for!(&sqlx::SqlitePool, sqlx::Sqlite);
#[cfg(feature = "postgres")]
db_for!(&mut sqlx::PgConnection, sqlx::Postgres);
#[cfg(feature = "postgres")]
db_for!(&sqlx::PgPool, sqlx::Postgres);
