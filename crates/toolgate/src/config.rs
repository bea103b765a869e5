//! Configuration: a TOML file plus `TOOLGATE_*` environment overrides, parsed into a private
//! builder that refuses unknown keys, then validated into [`Config`] before any port is bound.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toolgate_engine::EngineConfig;

use crate::storage::Database;

/// The file read when `--config` is not given, if it exists.
pub(crate) const DEFAULT_CONFIG_FILE: &str = "toolgate.toml";

/// Validated gateway configuration.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    /// Where the gRPC server listens.
    pub(crate) listen: SocketAddr,
    /// The ledger: a SQLite file or a PostgreSQL database.
    pub(crate) database: Database,
    /// Where the first admin token is written on first start.
    pub(crate) admin_token_file: PathBuf,
    /// Connector families not to register.
    pub(crate) disabled_connectors: Vec<String>,
    /// Where the master keys are kept (created on first start).
    pub(crate) key_file: PathBuf,
    /// Master keys given inline (`TOOLGATE_MASTER_KEYS`: `id=base64,id=base64`, last active);
    /// when set, the key file is not used and keys cannot be rotated online.
    pub(crate) master_keys: Option<String>,
    /// Engine settings.
    pub(crate) engine: EngineConfig,
    /// The Slack connector's settings (`[connectors.slack]`).
    pub(crate) slack: SlackSettings,
}

/// `[connectors.slack]`: where the Slack connector sends requests. Kept here, independent of
/// the connector crate, so the table parses the same in builds without the `slack` feature.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct SlackSettings {
    /// The Web API base; `None` keeps the connector's default (`https://slack.com/api`).
    pub(crate) api_base_url: Option<String>,
    /// Hosts exempt from the SSRF guard's address check (e.g. `127.0.0.1` in tests).
    pub(crate) allow_hosts: Vec<String>,
    /// Hosts incoming-webhook URLs may point at; `None` keeps `hooks.slack.com`.
    pub(crate) webhook_hosts: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    storage: RawStorage,
    #[serde(default)]
    auth: RawAuth,
    #[serde(default)]
    engine: RawEngine,
    #[serde(default)]
    connectors: RawConnectors,
    #[serde(default)]
    secrets: RawSecrets,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSecrets {
    key_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawServer {
    listen: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStorage {
    database: Option<String>,
    schema: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAuth {
    admin_token_file: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEngine {
    max_timeout_ms: Option<u64>,
    default_max_calls: Option<u32>,
    max_calls_limit: Option<u32>,
    max_argument_bytes: Option<usize>,
    cache_ttl_ms: Option<u64>,
    pending_expiry_ms: Option<u64>,
    answer_retention_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConnectors {
    disabled: Option<Vec<String>>,
    #[serde(default)]
    slack: RawSlack,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlack {
    api_base_url: Option<String>,
    allow_hosts: Option<Vec<String>>,
    webhook_hosts: Option<Vec<String>>,
}

/// The environment variables read, each naming the config key it overrides.
const ENV_KEYS: &[(&str, &str)] = &[
    ("TOOLGATE_LISTEN", "server.listen"),
    ("TOOLGATE_DATABASE", "storage.database"),
    ("TOOLGATE_DATABASE_SCHEMA", "storage.schema"),
    ("TOOLGATE_ADMIN_TOKEN_FILE", "auth.admin_token_file"),
    ("TOOLGATE_MAX_TIMEOUT_MS", "engine.max_timeout_ms"),
    ("TOOLGATE_DEFAULT_MAX_CALLS", "engine.default_max_calls"),
    ("TOOLGATE_MAX_ARGUMENT_BYTES", "engine.max_argument_bytes"),
    ("TOOLGATE_ANSWER_RETENTION_MS", "engine.answer_retention_ms"),
    ("TOOLGATE_DISABLED_CONNECTORS", "connectors.disabled"),
    ("TOOLGATE_KEY_FILE", "secrets.key_file"),
];

/// Variables that are ours but are not config overrides.
const ENV_OTHER: &[&str] = &[
    "TOOLGATE_CONFIG",
    "TOOLGATE_LOG",
    "TOOLGATE_TOKEN",
    "TOOLGATE_ADDR",
    // Read by the key loader, not a config key (keys never go in the config file).
    "TOOLGATE_MASTER_KEYS",
    // The PostgreSQL server of the test suite; gateways the tests start inherit it.
    "TOOLGATE_TEST_PG_URL",
];

impl Config {
    /// Loads `file` (or `toolgate.toml` when present), applies `env`, validates.
    pub(crate) fn load(
        file: Option<&Path>,
        env: &BTreeMap<String, String>,
        listen_override: Option<&str>,
        database_override: Option<&str>,
    ) -> Result<Config, String> {
        let raw = match file {
            Some(path) => read_file(path)?,
            None if Path::new(DEFAULT_CONFIG_FILE).exists() => {
                read_file(Path::new(DEFAULT_CONFIG_FILE))?
            }
            None => RawConfig::default(),
        };
        Config::from_raw(raw, env, listen_override, database_override)
    }

    fn from_raw(
        mut raw: RawConfig,
        env: &BTreeMap<String, String>,
        listen_override: Option<&str>,
        database_override: Option<&str>,
    ) -> Result<Config, String> {
        for (name, value) in env.iter().filter(|(k, _)| k.starts_with("TOOLGATE_")) {
            let Some((_, key)) = ENV_KEYS.iter().find(|(n, _)| n == name) else {
                if ENV_OTHER.contains(&name.as_str()) {
                    continue;
                }
                let known: Vec<&str> = ENV_KEYS
                    .iter()
                    .map(|(n, _)| *n)
                    .chain(ENV_OTHER.iter().copied())
                    .collect();
                return Err(format!(
                    "unknown environment variable {name}; known ones: {}",
                    known.join(", ")
                ));
            };
            let number = |v: &str| -> Result<u64, String> {
                v.parse::<u64>().map_err(|_| {
                    format!("{name} (config key {key}) must be a whole number, got `{v}`")
                })
            };
            match *key {
                "server.listen" => raw.server.listen = Some(value.clone()),
                "storage.database" => raw.storage.database = Some(value.clone()),
                "storage.schema" => raw.storage.schema = Some(value.clone()),
                "auth.admin_token_file" => raw.auth.admin_token_file = Some(value.clone()),
                "secrets.key_file" => raw.secrets.key_file = Some(value.clone()),
                "engine.max_timeout_ms" => raw.engine.max_timeout_ms = Some(number(value)?),
                "engine.answer_retention_ms" => {
                    raw.engine.answer_retention_ms = Some(number(value)?);
                }
                "engine.default_max_calls" => {
                    raw.engine.default_max_calls = Some(
                        u32::try_from(number(value)?)
                            .map_err(|_| format!("{name} is too large"))?,
                    );
                }
                "engine.max_argument_bytes" => {
                    raw.engine.max_argument_bytes = Some(
                        usize::try_from(number(value)?)
                            .map_err(|_| format!("{name} is too large"))?,
                    );
                }
                "connectors.disabled" => {
                    raw.connectors.disabled = Some(
                        value
                            .split(',')
                            .map(str::trim)
                            .filter(|s| !s.is_empty())
                            .map(str::to_owned)
                            .collect(),
                    );
                }
                _ => {}
            }
        }
        if let Some(listen) = listen_override {
            raw.server.listen = Some(listen.to_owned());
        }
        if let Some(database) = database_override {
            raw.storage.database = Some(database.to_owned());
        }

        let listen_text = raw
            .server
            .listen
            .unwrap_or_else(|| "127.0.0.1:50051".to_owned());
        let listen: SocketAddr = listen_text.parse().map_err(|_| {
            format!("server.listen must be an address like 127.0.0.1:50051, got `{listen_text}`")
        })?;
        let database = raw
            .storage
            .database
            .unwrap_or_else(|| "toolgate.db".to_owned());
        let database = Database::parse(&database, raw.storage.schema)?;
        let defaults = EngineConfig::default();
        let engine = EngineConfig {
            max_timeout: raw
                .engine
                .max_timeout_ms
                .map_or(defaults.max_timeout, Duration::from_millis),
            default_max_calls: raw
                .engine
                .default_max_calls
                .unwrap_or(defaults.default_max_calls),
            max_calls_limit: raw
                .engine
                .max_calls_limit
                .unwrap_or(defaults.max_calls_limit),
            max_argument_bytes: raw
                .engine
                .max_argument_bytes
                .unwrap_or(defaults.max_argument_bytes),
            cache_ttl: raw
                .engine
                .cache_ttl_ms
                .map_or(defaults.cache_ttl, Duration::from_millis),
            pending_expiry: raw
                .engine
                .pending_expiry_ms
                .map_or(defaults.pending_expiry, Duration::from_millis),
            answer_retention: raw
                .engine
                .answer_retention_ms
                .map_or(defaults.answer_retention, Duration::from_millis),
        };
        if engine.max_timeout.is_zero() {
            return Err("engine.max_timeout_ms must be greater than 0".to_owned());
        }
        if engine.default_max_calls == 0 {
            return Err("engine.default_max_calls must be greater than 0".to_owned());
        }
        if engine.default_max_calls > engine.max_calls_limit {
            return Err(format!(
                "engine.default_max_calls ({}) is above engine.max_calls_limit ({})",
                engine.default_max_calls, engine.max_calls_limit
            ));
        }
        if engine.max_argument_bytes == 0 || engine.max_argument_bytes > 64 * 1024 * 1024 {
            return Err("engine.max_argument_bytes must be between 1 and 67108864".to_owned());
        }
        let slack = SlackSettings {
            api_base_url: raw.connectors.slack.api_base_url,
            allow_hosts: raw.connectors.slack.allow_hosts.unwrap_or_default(),
            webhook_hosts: raw.connectors.slack.webhook_hosts,
        };
        if let Some(base) = &slack.api_base_url
            && !(base.starts_with("https://") || base.starts_with("http://"))
        {
            return Err(format!(
                "connectors.slack.api_base_url must be an http(s) URL such as https://slack.com/api, got `{base}`"
            ));
        }
        if slack.webhook_hosts.as_ref().is_some_and(Vec::is_empty) {
            return Err(
                "connectors.slack.webhook_hosts is empty; leave it out for hooks.slack.com"
                    .to_owned(),
            );
        }
        Ok(Config {
            listen,
            database,
            admin_token_file: PathBuf::from(
                raw.auth
                    .admin_token_file
                    .unwrap_or_else(|| "toolgate-admin.token".to_owned()),
            ),
            disabled_connectors: raw.connectors.disabled.unwrap_or_default(),
            key_file: PathBuf::from(
                raw.secrets
                    .key_file
                    .unwrap_or_else(|| "toolgate-keys".to_owned()),
            ),
            master_keys: env.get("TOOLGATE_MASTER_KEYS").cloned(),
            engine,
            slack,
        })
    }
}

fn read_file(path: &Path) -> Result<RawConfig, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read config file {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("config file {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn load(toml_text: &str, pairs: &[(&str, &str)]) -> Result<Config, String> {
        let raw: RawConfig = toml::from_str(toml_text).map_err(|e| e.to_string())?;
        Config::from_raw(raw, &env(pairs), None, None)
    }

    #[test]
    fn defaults_need_no_configuration() {
        let config = load("", &[]).unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:50051");
        assert_eq!(
            config.database,
            Database::Sqlite(PathBuf::from("toolgate.db"))
        );
    }

    #[test]
    fn bad_input_names_the_key() {
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case<'_>] = &[
            ("[server]\nlisten = \"nope\"", &[], "server.listen"),
            ("[server]\nlisen = \"x\"", &[], "lisen"),
            ("[engin]\n", &[], "engin"),
            ("", &[("TOOLGATE_LISTN", "x")], "TOOLGATE_LISTN"),
            (
                "",
                &[("TOOLGATE_MAX_TIMEOUT_MS", "soon")],
                "engine.max_timeout_ms",
            ),
            ("[engine]\nmax_timeout_ms = 0", &[], "engine.max_timeout_ms"),
            (
                "[engine]\ndefault_max_calls = 0",
                &[],
                "engine.default_max_calls",
            ),
            (
                "[storage]\ndatabase = \"ledger.db\"\nschema = \"tg\"",
                &[],
                "storage.schema",
            ),
            ("[connectors.slack]\ntoken = \"x\"", &[], "token"),
            (
                "[connectors.slack]\napi_base_url = \"slack.com\"",
                &[],
                "connectors.slack.api_base_url",
            ),
            (
                "[connectors.slack]\nwebhook_hosts = []",
                &[],
                "connectors.slack.webhook_hosts",
            ),
        ];
        for (text, pairs, key) in cases {
            let err = load(text, pairs).unwrap_err();
            assert!(err.contains(key), "{text:?} {pairs:?}: {err}");
        }
    }

    #[test]
    fn slack_settings_are_read() {
        let config = load(
            "[connectors.slack]\napi_base_url = \"http://127.0.0.1:9/api\"\nallow_hosts = [\"127.0.0.1\"]\nwebhook_hosts = [\"127.0.0.1\"]",
            &[],
        )
        .unwrap();
        assert_eq!(
            config.slack,
            SlackSettings {
                api_base_url: Some("http://127.0.0.1:9/api".into()),
                allow_hosts: vec!["127.0.0.1".into()],
                webhook_hosts: Some(vec!["127.0.0.1".into()]),
            }
        );
        assert_eq!(load("", &[]).unwrap().slack, SlackSettings::default());
    }

    #[test]
    fn environment_overrides_the_file() {
        let config = load(
            "[server]\nlisten = \"127.0.0.1:1\"",
            &[
                ("TOOLGATE_LISTEN", "127.0.0.1:2"),
                ("TOOLGATE_DISABLED_CONNECTORS", "a, b"),
            ],
        )
        .unwrap();
        assert_eq!(config.listen.port(), 2);
        assert_eq!(config.disabled_connectors, vec!["a", "b"]);
    }

    #[test]
    fn storage_and_keys_come_from_the_environment() {
        let config = load(
            "",
            &[
                (
                    "TOOLGATE_DATABASE",
                    "postgres://toolgate@127.0.0.1:5432/toolgate",
                ),
                ("TOOLGATE_DATABASE_SCHEMA", "replicas"),
                ("TOOLGATE_MASTER_KEYS", "k1=AAAA"),
                (
                    "TOOLGATE_TEST_PG_URL",
                    "postgres://postgres@127.0.0.1:5432/test",
                ),
            ],
        )
        .unwrap();
        assert_eq!(
            config.database,
            Database::Postgres {
                url: "postgres://toolgate@127.0.0.1:5432/toolgate".into(),
                schema: Some("replicas".into()),
            }
        );
        assert_eq!(config.master_keys.as_deref(), Some("k1=AAAA"));
    }
}
