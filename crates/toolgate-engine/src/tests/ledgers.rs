//! The ledgers the engine tests run on. Every test runs twice, from one body (see
//! [`on_both_ledgers!`]): on SQLite (a fresh file in a temporary directory) and on PostgreSQL (a
//! fresh, uniquely named schema of the test database).
//!
//! PostgreSQL: the URL comes from `TOOLGATE_TEST_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`, what `cargo xtask ci` finds or starts). A server
//! that cannot be reached fails the test with a message naming the URL and the variable;
//! nothing is skipped. A test that passes closes its stores and drops its schemas
//! (`DROP SCHEMA ... CASCADE`); a failing one leaves them for inspection and says which.
//!
//! No test here pauses tokio's clock: under paused time tokio advances the clock whenever the
//! runtime is idle, which includes waiting for a PostgreSQL answer, so sqlx's connect and
//! acquire timeouts would fire at once.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use sqlx::Connection as _;
use toolgate_ledger::{PgOptions, PgStore, SqliteStore, Store};

/// The variable naming the test PostgreSQL server.
pub(super) const PG_URL_ENV: &str = "TOOLGATE_TEST_PG_URL";
/// The server used when the variable is unset.
pub(super) const PG_DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// Generates, for an `async fn $name(backend: Backend)` test body, the module `$name` with the
/// two tests `$name::sqlite` and `$name::pg` (`cargo test ::pg` runs the PostgreSQL half).
/// The body is an ordinary function, so rustfmt and clippy see it; `macro_rules!` cannot
/// build the identifiers `$name_sqlite` and `$name_pg` without a proc-macro crate, and a
/// module and a function may share a name.
macro_rules! on_both_ledgers {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::ledgers::run_on(super::ledgers::Kind::Sqlite, super::$name).await;
            }

            #[tokio::test]
            async fn pg() {
                super::ledgers::run_on(super::ledgers::Kind::Pg, super::$name).await;
            }
        }
    };
}
pub(super) use on_both_ledgers;

/// Which backend a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Sqlite,
    Pg,
}

/// One test's ledgers: its backend, and every place it opened and store it opened there, so a
/// test that passes leaves nothing behind.
#[derive(Clone, Debug)]
pub(super) struct Backend {
    kind: Kind,
    resources: Arc<Mutex<Resources>>,
}

#[derive(Debug, Default)]
struct Resources {
    places: Vec<Place>,
    opened: Vec<Opened>,
}

/// Where one ledger's data lives. Opening it again gives another store on the same data: a
/// restart (after closing the first) or, on PostgreSQL, a replica.
#[derive(Clone, Debug)]
pub(super) enum Place {
    Sqlite(Arc<tempfile::TempDir>),
    Pg { url: String, schema: String },
}

impl Place {
    fn same_as(&self, other: &Place) -> bool {
        match (self, other) {
            (Place::Sqlite(a), Place::Sqlite(b)) => Arc::ptr_eq(a, b),
            (Place::Pg { schema: a, .. }, Place::Pg { schema: b, .. }) => a == b,
            _ => false,
        }
    }
}

/// An open store, kept by its concrete type so it can be closed.
#[derive(Clone, Debug)]
pub(super) enum Opened {
    Sqlite(Arc<SqliteStore>),
    Pg(Arc<PgStore>),
}

impl Opened {
    /// The store, as the engine sees it.
    pub(super) fn store(&self) -> Arc<dyn Store> {
        match self {
            Opened::Sqlite(store) => Arc::clone(store) as Arc<dyn Store>,
            Opened::Pg(store) => Arc::clone(store) as Arc<dyn Store>,
        }
    }

    /// Commits what is queued and closes every connection (PostgreSQL: also the one holding
    /// the instance's liveness lock, so its running calls count as interrupted).
    pub(super) async fn close(&self) {
        match self {
            Opened::Sqlite(store) => store.close().await,
            Opened::Pg(store) => store.close().await,
        }
    }
}

/// Runs `test` on a fresh [`Backend`] of `kind`, then cleans up if it passed.
pub(super) async fn run_on<F, Fut>(kind: Kind, test: F)
where
    F: FnOnce(Backend) -> Fut,
    Fut: Future<Output = ()>,
{
    let backend = Backend {
        kind,
        resources: Arc::default(),
    };
    let report = KeptOnFailure(backend.clone());
    test(backend.clone()).await;
    drop(report);
    backend.clean_up().await;
}

impl Backend {
    pub(super) fn kind(&self) -> Kind {
        self.kind
    }

    /// A new, empty ledger location: a temporary directory, or a schema name never used.
    pub(super) fn fresh_place(&self) -> Place {
        match self.kind {
            Kind::Sqlite => Place::Sqlite(Arc::new(tempfile::tempdir().expect("temp dir"))),
            Kind::Pg => Place::Pg {
                url: pg_url(),
                schema: unique_schema(),
            },
        }
    }

    /// Opens a store on `place` (creating and migrating it the first time).
    pub(super) async fn open(&self, place: &Place) -> Opened {
        let opened = match place {
            Place::Sqlite(dir) => Opened::Sqlite(Arc::new(
                SqliteStore::open(&dir.path().join("ledger.db"))
                    .await
                    .expect("open the SQLite ledger"),
            )),
            Place::Pg { url, schema } => {
                let options = PgOptions {
                    url: url.clone(),
                    schema: Some(schema.clone()),
                };
                match PgStore::connect(&options).await {
                    Ok(store) => Opened::Pg(Arc::new(store)),
                    Err(error) => panic!("{}", unreachable_message(url, &error.to_string())),
                }
            }
        };
        let mut resources = self.lock();
        resources.opened.push(opened.clone());
        if !resources.places.iter().any(|known| known.same_as(place)) {
            resources.places.push(place.clone());
        }
        opened
    }

    /// Closes every store the test opened and drops its PostgreSQL schemas.
    async fn clean_up(&self) {
        let Resources { places, opened } = std::mem::take(&mut *self.lock());
        for store in &opened {
            store.close().await;
        }
        for place in places {
            if let Place::Pg { url, schema } = place {
                drop_schema(&url, &schema).await;
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Resources> {
        self.resources
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// Says, when a test fails, which PostgreSQL schemas it leaves behind for inspection.
struct KeptOnFailure(Backend);

impl Drop for KeptOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for place in &self.0.lock().places {
                if let Place::Pg { url, schema } = place {
                    eprintln!(
                        "test failed: PostgreSQL schema {schema} kept for inspection in {} \
                         (drop it with DROP SCHEMA {schema} CASCADE)",
                        redact_url(url)
                    );
                }
            }
        }
    }
}

/// The test server's URL: `TOOLGATE_TEST_PG_URL`, or the default.
pub(super) fn pg_url() -> String {
    std::env::var(PG_URL_ENV)
        .ok()
        .filter(|url| !url.trim().is_empty())
        .unwrap_or_else(|| PG_DEFAULT_URL.to_owned())
}

/// `tg_e_<pid>_<counter>_<nanos>`: unique across the tests of this process (counter) and across
/// processes and runs (pid, time), lowercase, well under PostgreSQL's 63 characters.
fn unique_schema() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or(0);
    format!(
        "tg_e_{}_{}_{nanos}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

async fn drop_schema(url: &str, schema: &str) {
    let mut conn = sqlx::PgConnection::connect(url)
        .await
        .unwrap_or_else(|error| panic!("{}", unreachable_message(url, &error.to_string())));
    let sql = format!("DROP SCHEMA IF EXISTS {schema} CASCADE");
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|error| panic!("could not drop the test schema {schema}: {error}"));
    let _ = conn.close().await;
}

fn unreachable_message(url: &str, error: &str) -> String {
    let origin = if std::env::var(PG_URL_ENV).is_ok_and(|url| !url.trim().is_empty()) {
        format!("from {PG_URL_ENV}")
    } else {
        format!("the default; {PG_URL_ENV} is not set")
    };
    format!(
        "\n\n==================== PostgreSQL NOT AVAILABLE ====================\n\
         The toolgate-engine tests run every test on PostgreSQL as well as SQLite, and\n\
         PostgreSQL could not be reached or set up. These tests are never skipped.\n\
         \n  URL:   {} ({origin})\n  error: {error}\n\n\
         Start a server there, or set {PG_URL_ENV}=postgres://USER@HOST:PORT/DATABASE to one\n\
         where USER may create and drop schemas (`cargo xtask ci` finds or starts one).\n\
         ==================================================================\n",
        redact_url(url)
    )
}

/// The URL without its password, for messages.
fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{scheme}://{user}:***@{host}{path}"),
            None => url.to_owned(),
        },
        None => url.to_owned(),
    }
}

#[test]
fn urls_are_shown_without_their_password() {
    assert_eq!(
        redact_url("postgres://u:secret@h:5432/db"),
        "postgres://u:***@h:5432/db"
    );
    assert_eq!(redact_url(PG_DEFAULT_URL), PG_DEFAULT_URL);
    assert_eq!(redact_url("not a url"), "not a url");
}
