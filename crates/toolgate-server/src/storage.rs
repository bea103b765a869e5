//! Which ledger the gateway uses: a SQLite file (the embedded default) or a PostgreSQL
//! database shared by several replicas.

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use toolgate_core::AuditKeys;
use toolgate_ledger::{LedgerObserver, PgOptions, PgStore, SqliteStore, Store};

/// `storage.database` (and `storage.schema`), validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Database {
    /// A SQLite file, created if missing.
    Sqlite(PathBuf),
    /// A PostgreSQL URL and the schema to keep the tables in (`None`: the server's default).
    Postgres { url: String, schema: Option<String> },
}

impl Database {
    /// Reads `storage.database`: a `postgres://` or `postgresql://` URL, or a SQLite path
    /// (optionally `sqlite://path`). `schema` applies to PostgreSQL only.
    pub fn parse(text: &str, schema: Option<String>) -> Result<Database, String> {
        if text.starts_with("postgres://") || text.starts_with("postgresql://") {
            if let Some(schema) = &schema {
                check_schema(schema)?;
            }
            return Ok(Database::Postgres {
                url: text.to_owned(),
                schema,
            });
        }
        if schema.is_some() {
            return Err(
                "storage.schema applies to PostgreSQL only; storage.database names a SQLite file"
                    .to_owned(),
            );
        }
        let path = text.strip_prefix("sqlite://").unwrap_or(text);
        if path.is_empty() {
            return Err(
                "storage.database must name a SQLite file or be a postgres:// URL".to_owned(),
            );
        }
        Ok(Database::Sqlite(PathBuf::from(path)))
    }

    /// Opens (creating and migrating as needed) the store; its audit events are MAC'd with
    /// `keys`, and its writer's batches are told to `observer`.
    pub async fn open(
        &self,
        keys: Arc<dyn AuditKeys>,
        observer: Option<Arc<dyn LedgerObserver>>,
    ) -> anyhow::Result<Arc<dyn Store>> {
        match self {
            Database::Sqlite(path) => {
                let store = SqliteStore::open_keyed(path, keys)
                    .await
                    .with_context(|| format!("cannot open the ledger at {}", path.display()))?;
                if let Some(observer) = observer {
                    store.observe(observer);
                }
                Ok(Arc::new(store))
            }
            Database::Postgres { url, schema } => {
                let options = PgOptions {
                    url: url.clone(),
                    schema: schema.clone(),
                };
                let store = PgStore::connect_keyed(&options, keys)
                    .await
                    .with_context(|| format!("cannot open the ledger at {self}"))?;
                if let Some(observer) = observer {
                    store.observe(observer);
                }
                Ok(Arc::new(store))
            }
        }
    }

    /// Opens the store to read it beside a gateway that may be running on it: a SQLite file
    /// read-only (no lock, no migration, no writes); PostgreSQL as usual (it has no single
    /// owner). Verification checks event MACs with `keys` (`None`: it says what it could not
    /// check).
    pub async fn open_for_reading(
        &self,
        keys: Option<Arc<dyn AuditKeys>>,
    ) -> anyhow::Result<Arc<dyn Store>> {
        match self {
            Database::Sqlite(path) => {
                let store = SqliteStore::open_read_only_with(path, keys)
                    .await
                    .with_context(|| format!("cannot read the ledger at {}", path.display()))?;
                Ok(Arc::new(store))
            }
            Database::Postgres { url, schema } => {
                let options = PgOptions {
                    url: url.clone(),
                    schema: schema.clone(),
                };
                let store = match keys {
                    Some(keys) => PgStore::connect_keyed(&options, keys).await,
                    None => PgStore::connect(&options).await,
                }
                .with_context(|| format!("cannot open the ledger at {self}"))?;
                Ok(Arc::new(store))
            }
        }
    }
}

/// Where the ledger is, without credentials: safe for logs.
impl fmt::Display for Database {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Database::Sqlite(path) => write!(f, "{}", path.display()),
            Database::Postgres { url, schema } => {
                write!(f, "{}", without_secrets(url))?;
                if let Some(schema) = schema {
                    write!(f, " (schema {schema})")?;
                }
                Ok(())
            }
        }
    }
}

fn check_schema(schema: &str) -> Result<(), String> {
    let mut chars = schema.chars();
    let start = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_');
    if start
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
        && schema.len() <= 63
    {
        Ok(())
    } else {
        Err(format!(
            "storage.schema must be 1 to 63 lowercase letters, digits and underscores, not \
             starting with a digit; got `{schema}`"
        ))
    }
}

/// A PostgreSQL URL without its password or query (which may carry one), for display.
pub(crate) fn without_secrets(text: &str) -> String {
    let Ok(mut url) = url::Url::parse(text) else {
        return "postgres://(unparsable URL)".to_owned();
    };
    // Setting the password fails only for URLs that cannot have one (no host): nothing to hide.
    let _ = url.set_password(None);
    url.set_query(None);
    url.set_fragment(None);
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_both_backends() {
        assert_eq!(
            Database::parse("toolgate.db", None),
            Ok(Database::Sqlite(PathBuf::from("toolgate.db")))
        );
        assert_eq!(
            Database::parse("sqlite://x/y.db", None),
            Ok(Database::Sqlite(PathBuf::from("x/y.db")))
        );
        assert_eq!(
            Database::parse("postgres://u@127.0.0.1/test", Some("tg".into())),
            Ok(Database::Postgres {
                url: "postgres://u@127.0.0.1/test".into(),
                schema: Some("tg".into())
            })
        );
    }

    #[test]
    fn bad_input_is_named() {
        assert!(
            Database::parse("", None)
                .unwrap_err()
                .contains("storage.database")
        );
        assert!(
            Database::parse("x.db", Some("tg".into()))
                .unwrap_err()
                .contains("PostgreSQL only")
        );
        assert!(
            Database::parse("postgres://127.0.0.1/test", Some("Bad-Name".into()))
                .unwrap_err()
                .contains("storage.schema")
        );
    }

    #[test]
    fn display_hides_the_password() {
        let database = Database::parse(
            "postgres://user:hunter2@127.0.0.1:5432/test?password=hunter2",
            Some("tg".into()),
        )
        .unwrap();
        let shown = database.to_string();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert_eq!(shown, "postgres://user@127.0.0.1:5432/test (schema tg)");
    }

    #[test]
    fn display_keeps_where_and_drops_every_secret() {
        let cases = [
            ("postgres://127.0.0.1/test", "postgres://127.0.0.1/test"),
            ("postgresql://u:p@db:5433", "postgresql://u@db:5433"),
            (
                "postgres://:pw@[::1]/x?sslpassword=pw#pw",
                "postgres://[::1]/x",
            ),
            ("postgres://u%40x:p%3Aq@h/d", "postgres://u%40x@h/d"),
            ("postgres://u:p@@@", "postgres://(unparsable URL)"),
        ];
        for (url, shown) in cases {
            assert_eq!(without_secrets(url), shown, "{url}");
        }
    }
}
