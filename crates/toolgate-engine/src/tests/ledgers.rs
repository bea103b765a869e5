//! The ledgers the engine tests run on: each test gets a fresh SQLite file in a temporary
//! directory ([`ledger_test!`]). The engine sees the ledger only through the `Store` trait,
//! whose contract the ledger's own tests hold both backends to, so the engine's tests run on
//! SQLite alone: fast, and without a server. What only PostgreSQL has (replicas sharing one
//! ledger) is tested in `postgres.rs`, behind the `postgres-tests` feature.

use std::future::Future;
use std::sync::{Arc, Mutex};

use toolgate_ledger::{SqliteStore, Store};

/// Generates, for an `async fn $name(backend: Backend)` test body, the test `$name::sqlite`.
/// The body is an ordinary function, so rustfmt and clippy see it; `macro_rules!` cannot
/// build the identifier `$name_sqlite` without a proc-macro crate, and a module and a
/// function may share a name.
macro_rules! ledger_test {
    ($name:ident) => {
        mod $name {
            #[tokio::test]
            async fn sqlite() {
                super::ledgers::run_on(super::ledgers::Kind::Sqlite, super::$name).await;
            }
        }
    };
}
pub(super) use ledger_test;

/// Which backend a test runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    Sqlite,
    #[cfg(feature = "postgres-tests")]
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
    #[cfg(feature = "postgres-tests")]
    Pg(super::postgres::Schema),
}

impl Place {
    /// Removes what the test left: a PostgreSQL schema is dropped; a SQLite directory goes
    /// with its last handle.
    async fn clean_up(self) {
        match self {
            Place::Sqlite(dir) => drop(dir),
            #[cfg(feature = "postgres-tests")]
            // The last handle drops the schema (stores are closed by then).
            Place::Pg(schema) => drop(schema),
        }
    }

    fn same_as(&self, other: &Place) -> bool {
        match (self, other) {
            (Place::Sqlite(a), Place::Sqlite(b)) => Arc::ptr_eq(a, b),
            #[cfg(feature = "postgres-tests")]
            (Place::Pg(a), Place::Pg(b)) => a.name() == b.name(),
            #[cfg(feature = "postgres-tests")]
            _ => false,
        }
    }
}

/// An open store, kept by its concrete type so it can be closed.
#[derive(Clone, Debug)]
pub(super) enum Opened {
    Sqlite(Arc<SqliteStore>),
    #[cfg(feature = "postgres-tests")]
    Pg(Arc<toolgate_ledger::PgStore>),
}

impl Opened {
    /// The store, as the engine sees it.
    pub(super) fn store(&self) -> Arc<dyn Store> {
        match self {
            Opened::Sqlite(store) => Arc::clone(store) as Arc<dyn Store>,
            #[cfg(feature = "postgres-tests")]
            Opened::Pg(store) => Arc::clone(store) as Arc<dyn Store>,
        }
    }

    /// Commits what is queued and closes every connection (PostgreSQL: also the one holding
    /// the instance's liveness lock, so its running calls count as interrupted).
    pub(super) async fn close(&self) {
        match self {
            Opened::Sqlite(store) => store.close().await,
            #[cfg(feature = "postgres-tests")]
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
    // A failing test unwinds past the clean-up: its PostgreSQL schemas are then kept, and
    // named, by their own drop.
    test(backend.clone()).await;
    backend.clean_up().await;
}

impl Backend {
    #[cfg(feature = "postgres-tests")]
    pub(super) fn kind(&self) -> Kind {
        self.kind
    }

    /// A new, empty ledger location: a temporary directory, or a schema name never used.
    pub(super) fn fresh_place(&self) -> Place {
        match self.kind {
            Kind::Sqlite => Place::Sqlite(Arc::new(tempfile::tempdir().expect("temp dir"))),
            #[cfg(feature = "postgres-tests")]
            Kind::Pg => Place::Pg(super::postgres::fresh_schema()),
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
            #[cfg(feature = "postgres-tests")]
            Place::Pg(schema) => Opened::Pg(Arc::new(schema.open().await)),
        };
        let mut resources = self.lock();
        resources.opened.push(opened.clone());
        if !resources.places.iter().any(|known| known.same_as(place)) {
            resources.places.push(place.clone());
        }
        opened
    }

    /// Closes every store the test opened (and drops its PostgreSQL schemas).
    async fn clean_up(&self) {
        let Resources { places, opened } = std::mem::take(&mut *self.lock());
        for store in &opened {
            store.close().await;
        }
        for place in places {
            place.clean_up().await;
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Resources> {
        self.resources
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}
