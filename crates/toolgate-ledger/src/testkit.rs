//! Test support (feature `testkit`): a fresh PostgreSQL schema per test, for the tests of this
//! crate and of the crates above it, so none of them needs sqlx or a copy of this code.
//!
//! The server comes from `TOOLGATE_TEST_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`); the tests may create and drop schemas there.
//! Every [`PgSchema`] has a name no other test of this or a concurrent run uses, so tests run
//! in parallel. It is dropped (`DROP SCHEMA ... CASCADE`) when the value is dropped at the end
//! of a test that passed, and kept, named on stderr, when the test failed. Without a server a
//! test fails with [`unreachable_message`], saying how to provide one: never skipped.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, Connection, Executor};

use crate::pg::{PgOptions, PgStore};

/// The variable naming the test server.
pub const PG_URL_ENV: &str = "TOOLGATE_TEST_PG_URL";
/// The server used when the variable is unset.
pub const PG_DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// How long [`PgSchema::new`] waits for the server to answer.
const REACH_TIMEOUT: Duration = Duration::from_secs(15);

/// The URL of the test server: `TOOLGATE_TEST_PG_URL`, or [`PG_DEFAULT_URL`].
pub fn pg_url() -> String {
    std::env::var(PG_URL_ENV)
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| PG_DEFAULT_URL.to_owned())
}

/// One test's schema in the test server.
#[derive(Debug)]
pub struct PgSchema {
    url: String,
    name: String,
}

impl PgSchema {
    /// A schema name no other test uses (`tg_t_<pid>_<counter>_<nanos>`), on [`pg_url`].
    /// Nothing is created yet: the first store (or gateway) on it creates and migrates it.
    pub fn fresh() -> PgSchema {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos())
            .unwrap_or(0);
        let name = format!(
            "tg_t_{}_{}_{nanos}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        assert!(name.len() <= 63, "schema name too long: {name}");
        PgSchema {
            url: pg_url(),
            name,
        }
    }

    /// [`PgSchema::fresh`], after checking that the server answers: panics with
    /// [`unreachable_message`] when it does not, before a test starts gateways on it.
    pub async fn new() -> PgSchema {
        let schema = PgSchema::fresh();
        let connected = tokio::time::timeout(REACH_TIMEOUT, PgConnection::connect(&schema.url));
        let problem = match connected.await {
            Ok(Ok(connection)) => {
                let _ = connection.close().await;
                return schema;
            }
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {} s", REACH_TIMEOUT.as_secs()),
        };
        panic!("{}", unreachable_message(&schema.url, &problem));
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The server's URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Where a [`PgStore`] on this schema keeps its tables.
    pub fn options(&self) -> PgOptions {
        PgOptions {
            url: self.url.clone(),
            schema: Some(self.name.clone()),
        }
    }

    /// A store on this schema (creating and migrating it the first time): another process, or
    /// replica, when the schema already has one.
    pub async fn open(&self) -> PgStore {
        PgStore::connect(&self.options())
            .await
            .unwrap_or_else(|error| {
                panic!("{}", unreachable_message(&self.url, &error.to_string()))
            })
    }

    /// Like [`PgSchema::open`], MAC'ing audit events with `keys`.
    pub async fn open_keyed(&self, keys: Arc<dyn toolgate_core::AuditKeys>) -> PgStore {
        PgStore::connect_keyed(&self.options(), keys)
            .await
            .unwrap_or_else(|error| {
                panic!("{}", unreachable_message(&self.url, &error.to_string()))
            })
    }

    /// The tables in the schema, by name: a store or gateway really on it has migrated it.
    pub async fn tables(&self) -> Vec<String> {
        let mut conn = self.raw().await;
        let tables = sqlx::query_scalar(
            "SELECT table_name::text FROM information_schema.tables WHERE table_schema = $1 \
             ORDER BY 1",
        )
        .bind(&self.name)
        .fetch_all(&mut conn)
        .await
        .unwrap_or_else(|error| panic!("could not list the tables of {}: {error}", self.name));
        let _ = conn.close().await;
        tables
    }

    /// A plain connection to the schema, outside any store (an operator or an attacker).
    pub(crate) async fn raw(&self) -> PgConnection {
        let options: PgConnectOptions = self.url.parse().unwrap_or_else(|error| {
            panic!(
                "{}",
                unreachable_message(&self.url, &format!("invalid URL: {error}"))
            )
        });
        options
            .options([("search_path", self.name.as_str())])
            .connect()
            .await
            .unwrap_or_else(|error| {
                panic!("{}", unreachable_message(&self.url, &error.to_string()))
            })
    }
}

impl Drop for PgSchema {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "kept PostgreSQL schema `{}` of the failed test for inspection (at {}); \
                 remove it with DROP SCHEMA {} CASCADE",
                self.name,
                redact_url(&self.url),
                self.name
            );
            return;
        }
        // Drop may run inside the test's runtime, which cannot be blocked on: the schema is
        // dropped from a thread of its own, with its own runtime, and waited for.
        let (url, name) = (self.url.clone(), self.name.clone());
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|error| error.to_string())?;
            runtime.block_on(drop_schema(&url, &name))
        })
        .join();
        match dropped {
            Ok(Ok(())) => {}
            Ok(Err(error)) => eprintln!("could not drop test schema `{}`: {error}", self.name),
            Err(_) => eprintln!(
                "could not drop test schema `{}`: the thread panicked",
                self.name
            ),
        }
    }
}

async fn drop_schema(url: &str, name: &str) -> Result<(), String> {
    // The name is ours (`PgSchema::fresh`); checked anyway before it goes into SQL.
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(format!("unexpected schema name {name:?}"));
    }
    let mut conn = PgConnection::connect(url)
        .await
        .map_err(|error| error.to_string())?;
    // Never wait forever on a store that was left in the middle of a write.
    conn.execute("SET lock_timeout = '30s'")
        .await
        .map_err(|error| error.to_string())?;
    conn.execute(sqlx::AssertSqlSafe(format!(
        "DROP SCHEMA IF EXISTS {name} CASCADE"
    )))
    .await
    .map_err(|error| error.to_string())?;
    conn.close().await.map_err(|error| error.to_string())
}

/// The message of a test that found no usable PostgreSQL at `url`: what failed and how to
/// provide a server.
pub fn unreachable_message(url: &str, error: &str) -> String {
    let origin = if std::env::var(PG_URL_ENV).is_ok_and(|url| !url.trim().is_empty()) {
        format!("from {PG_URL_ENV}")
    } else {
        format!("the default; {PG_URL_ENV} is not set")
    };
    let rule = "=".repeat(78);
    format!(
        "\n{rule}\n\
         NO PostgreSQL FOR THE TESTS: could not use the server at\n  {} ({origin})\n  \
         error: {error}\n\
         The PostgreSQL tests are never skipped. Provide a server where the tests may create \
         and drop schemas, either\n  \
         {PG_URL_ENV}=postgres://USER[:PASSWORD]@HOST:PORT/DATABASE cargo test ...\n\
         or a server on 127.0.0.1:5432 with a database `test` that user `postgres` may use \
         without a password (`cargo xtask ci` finds or starts one).\n{rule}\n",
        redact_url(url)
    )
}

/// The URL without its password.
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let Some(at) = rest[..authority_end].rfind('@') else {
        return url.to_owned();
    };
    match rest[..at].split_once(':') {
        Some((user, _)) => format!("{scheme}://{user}:***{}", &rest[at..]),
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn urls_are_shown_without_their_password() {
        let cases = [
            (
                "postgres://u:secret@h:5432/db",
                "postgres://u:***@h:5432/db",
            ),
            ("postgres://u@h/db", "postgres://u@h/db"),
            ("postgres://h/db", "postgres://h/db"),
            ("not a url", "not a url"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
        }
    }
}
