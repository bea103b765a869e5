//! Configuration: a TOML file plus `TOOLGATE_*` environment overrides, parsed into a private
//! builder that refuses unknown keys, then validated into [`Config`] before any port is bound.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use toolgate_engine::EngineConfig;

use crate::overload::CallLimits;
use crate::storage::Database;
use crate::tls::{ServerTls, TlsPaths};

/// The file read when `--config` is not given, if it exists.
pub const DEFAULT_CONFIG_FILE: &str = "toolgate.toml";

/// Validated gateway configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Where the gRPC server listens.
    pub listen: SocketAddr,
    /// TLS on the listener (`[server.tls]`), its files read and checked; `None`: plaintext.
    pub tls: Option<ServerTls>,
    /// How many tool calls execute at once and how many more may wait for a slot.
    pub limits: CallLimits,
    /// How long a shutdown waits for calls in flight before abandoning them.
    pub drain_timeout: Duration,
    /// The async runtime's worker threads (`server.worker_threads`); `None`: chosen by the
    /// ledger, see [`Config::worker_threads`].
    pub worker_threads: Option<usize>,
    /// The ledger: a SQLite file or a PostgreSQL database.
    pub database: Database,
    /// Where the first admin token is written on first start.
    pub admin_token_file: PathBuf,
    /// Connector families not to register.
    pub disabled_connectors: Vec<String>,
    /// Where the master keys are kept (created on first start).
    pub key_file: PathBuf,
    /// Master keys given inline (`TOOLGATE_MASTER_KEYS`: `id=base64,id=base64`, last active);
    /// when set, the key file is not used and keys cannot be rotated online.
    pub master_keys: Option<String>,
    /// Engine settings.
    pub engine: EngineConfig,
    /// The Slack connector's settings (`[connectors.slack]`).
    pub slack: SlackSettings,
    /// The Shopify connector's settings (`[connectors.shopify]`).
    pub shopify: ShopifySettings,
    /// The AWS connector's settings (`[connectors.aws]`).
    pub aws: AwsSettings,
    /// The Prometheus endpoint (`[metrics]`).
    pub metrics: MetricsSettings,
    /// The approval console (`[console]`).
    pub console: ConsoleSettings,
    /// The MCP endpoint (`[mcp]`).
    pub mcp: McpSettings,
}

/// `[mcp]`: the Model Context Protocol endpoint at `/mcp` on the gRPC port.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McpSettings {
    /// Whether `/mcp` is served (default: yes).
    pub enabled: bool,
    /// The `Host` values accepted: the loopback names, and the names configured in
    /// `mcp.allowed_hosts` (the DNS-rebinding guard; a public deployment lists its hostnames).
    pub allowed_hosts: Vec<String>,
    /// The browser origins accepted (`scheme://host[:port]`); a request with any other
    /// `Origin` is refused. Empty (the default): every request carrying an `Origin` is.
    pub allowed_origins: Vec<String>,
}

/// The `Host` names `/mcp` always accepts.
const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

impl Default for McpSettings {
    fn default() -> McpSettings {
        McpSettings {
            enabled: true,
            allowed_hosts: LOOPBACK_HOSTS.iter().map(|h| (*h).to_owned()).collect(),
            allowed_origins: Vec::new(),
        }
    }
}

impl McpSettings {
    /// The hosts configured beyond the loopback names.
    pub fn configured_hosts(&self) -> impl Iterator<Item = &String> {
        self.allowed_hosts
            .iter()
            .filter(|host| !LOOPBACK_HOSTS.contains(&host.as_str()))
    }
}

/// `[console]`: the approval console, served under `/console` on the gRPC port. Off unless
/// enabled.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConsoleSettings {
    /// Whether the console is served.
    pub enabled: bool,
    /// The URL people reach the gateway at (`https://gate.example.com`): client approval
    /// links point there, and forms are taken from its origin. `None`: links are paths on the
    /// gateway (`/console/link/...`), and forms are taken from the origin naming the request's
    /// own `Host`.
    pub public_url: Option<String>,
    /// Further origins forms are taken from (a proxy's other names).
    pub allowed_origins: Vec<String>,
    /// A session ends after this long without a request.
    pub session_idle: Duration,
    /// A session ends this long after sign-in, whatever happens.
    pub session_max: Duration,
    /// How long a client approval link lives at most (never past its call's expiry).
    pub client_link_ttl: Duration,
}

impl Default for ConsoleSettings {
    fn default() -> ConsoleSettings {
        ConsoleSettings {
            enabled: false,
            public_url: None,
            allowed_origins: Vec::new(),
            session_idle: Duration::from_millis(DEFAULT_SESSION_IDLE_MS),
            session_max: Duration::from_millis(DEFAULT_SESSION_MAX_MS),
            client_link_ttl: Duration::from_millis(DEFAULT_CLIENT_LINK_TTL_MS),
        }
    }
}

/// 30 minutes.
const DEFAULT_SESSION_IDLE_MS: u64 = 30 * 60 * 1000;
/// 12 hours.
const DEFAULT_SESSION_MAX_MS: u64 = 12 * 60 * 60 * 1000;
/// 24 hours.
const DEFAULT_CLIENT_LINK_TTL_MS: u64 = 24 * 60 * 60 * 1000;

/// `[metrics]`: where the Prometheus endpoint (`GET /metrics`) listens. Off unless configured.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MetricsSettings {
    /// The address served over plain HTTP; `None`: no metrics endpoint.
    pub listen: Option<SocketAddr>,
}

/// `[connectors.aws]`: the AWS connector's endpoint override, default region and limits. Kept
/// here, independent of the connector crate, so the table parses the same in builds without the
/// `aws` feature; the connector validates the values when it is built, before any port is bound.
/// The endpoint override exists only here: a tenant's secret can never set it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AwsSettings {
    /// One endpoint for every AWS service (an emulator, a private gateway); `None`: AWS itself.
    pub endpoint_url: Option<String>,
    /// The region for tenants whose secret names none; `None`: us-east-1.
    pub default_region: Option<String>,
    /// AWS requests one call runs at once; `None`: 4.
    pub max_concurrency: Option<usize>,
    /// Attempts per AWS request; `None`: 3.
    pub max_attempts: Option<u32>,
    /// Items asked for per AWS page; `None`: 100.
    pub page_size: Option<u32>,
}

/// `[connectors.shopify]`: which Admin API version the Shopify connector pins and which hosts
/// besides `*.myshopify.com` a tenant's shop may name. Kept here, independent of the connector
/// crate, so the table parses the same in builds without the `shopify` feature.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ShopifySettings {
    /// `YYYY-MM`; `None` keeps the connector's default (the newest stable release).
    pub api_version: Option<String>,
    /// Hosts a shop may name besides `*.myshopify.com`, exempt from the SSRF guard and allowed
    /// over plain http (e.g. `127.0.0.1` in tests).
    pub allow_hosts: Vec<String>,
}

/// `[connectors.slack]`: where the Slack connector sends requests. Kept here, independent of
/// the connector crate, so the table parses the same in builds without the `slack` feature.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SlackSettings {
    /// The Web API base; `None` keeps the connector's default (`https://slack.com/api`).
    pub api_base_url: Option<String>,
    /// Hosts exempt from the SSRF guard's address check (e.g. `127.0.0.1` in tests).
    pub allow_hosts: Vec<String>,
    /// Hosts incoming-webhook URLs may point at; `None` keeps `hooks.slack.com`.
    pub webhook_hosts: Option<Vec<String>>,
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
    #[serde(default)]
    metrics: RawMetrics,
    #[serde(default)]
    console: RawConsole,
    #[serde(default)]
    mcp: RawMcp,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConsole {
    enabled: Option<bool>,
    public_url: Option<String>,
    allowed_origins: Option<Vec<String>>,
    session_idle_ms: Option<u64>,
    session_max_ms: Option<u64>,
    client_link_ttl_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMcp {
    enabled: Option<bool>,
    allowed_hosts: Option<Vec<String>>,
    allowed_origins: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMetrics {
    listen: Option<String>,
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
    drain_timeout_ms: Option<u64>,
    max_concurrent_calls: Option<usize>,
    max_queued_calls: Option<usize>,
    worker_threads: Option<usize>,
    #[serde(default)]
    tls: RawTls,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert_file: Option<String>,
    key_file: Option<String>,
    client_ca_file: Option<String>,
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
    #[serde(default)]
    shopify: RawShopify,
    #[serde(default)]
    aws: RawAws,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAws {
    endpoint_url: Option<String>,
    default_region: Option<String>,
    max_concurrency: Option<usize>,
    max_attempts: Option<u32>,
    page_size: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSlack {
    api_base_url: Option<String>,
    allow_hosts: Option<Vec<String>>,
    webhook_hosts: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawShopify {
    api_version: Option<String>,
    allow_hosts: Option<Vec<String>>,
}

/// The environment variables read, each naming the config key it overrides.
const ENV_KEYS: &[(&str, &str)] = &[
    ("TOOLGATE_LISTEN", "server.listen"),
    ("TOOLGATE_DRAIN_TIMEOUT_MS", "server.drain_timeout_ms"),
    (
        "TOOLGATE_MAX_CONCURRENT_CALLS",
        "server.max_concurrent_calls",
    ),
    ("TOOLGATE_MAX_QUEUED_CALLS", "server.max_queued_calls"),
    ("TOOLGATE_WORKER_THREADS", "server.worker_threads"),
    ("TOOLGATE_TLS_CERT_FILE", "server.tls.cert_file"),
    ("TOOLGATE_TLS_KEY_FILE", "server.tls.key_file"),
    ("TOOLGATE_TLS_CLIENT_CA_FILE", "server.tls.client_ca_file"),
    ("TOOLGATE_DATABASE", "storage.database"),
    ("TOOLGATE_DATABASE_SCHEMA", "storage.schema"),
    ("TOOLGATE_ADMIN_TOKEN_FILE", "auth.admin_token_file"),
    ("TOOLGATE_MAX_TIMEOUT_MS", "engine.max_timeout_ms"),
    ("TOOLGATE_DEFAULT_MAX_CALLS", "engine.default_max_calls"),
    ("TOOLGATE_MAX_ARGUMENT_BYTES", "engine.max_argument_bytes"),
    ("TOOLGATE_ANSWER_RETENTION_MS", "engine.answer_retention_ms"),
    ("TOOLGATE_DISABLED_CONNECTORS", "connectors.disabled"),
    ("TOOLGATE_KEY_FILE", "secrets.key_file"),
    ("TOOLGATE_METRICS_LISTEN", "metrics.listen"),
    ("TOOLGATE_CONSOLE_ENABLED", "console.enabled"),
    ("TOOLGATE_CONSOLE_PUBLIC_URL", "console.public_url"),
    (
        "TOOLGATE_CONSOLE_ALLOWED_ORIGINS",
        "console.allowed_origins",
    ),
    (
        "TOOLGATE_CONSOLE_SESSION_IDLE_MS",
        "console.session_idle_ms",
    ),
    ("TOOLGATE_CONSOLE_SESSION_MAX_MS", "console.session_max_ms"),
    (
        "TOOLGATE_CONSOLE_CLIENT_LINK_TTL_MS",
        "console.client_link_ttl_ms",
    ),
    ("TOOLGATE_MCP_ENABLED", "mcp.enabled"),
    ("TOOLGATE_MCP_ALLOWED_HOSTS", "mcp.allowed_hosts"),
    ("TOOLGATE_MCP_ALLOWED_ORIGINS", "mcp.allowed_origins"),
];

/// The longest drain a shutdown may be configured to wait (an hour).
const MAX_DRAIN_TIMEOUT_MS: u64 = 3_600_000;

/// The drain timeout unless configured.
const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 30_000;

/// The most calls `server.max_concurrent_calls` and `server.max_queued_calls` may each allow.
const MAX_CALL_LIMIT: usize = 1_000_000;

/// Variables that are ours but are not config overrides.
const ENV_OTHER: &[&str] = &[
    "TOOLGATE_CONFIG",
    "TOOLGATE_LOG",
    // Read with the other telemetry settings (`telemetry.rs`), before the configuration.
    "TOOLGATE_LOG_FORMAT",
    // The command-line client's: the gateway's address, its TLS files and one token per role.
    "TOOLGATE_ADDR",
    "TOOLGATE_CA_FILE",
    "TOOLGATE_CLIENT_CERT_FILE",
    "TOOLGATE_CLIENT_KEY_FILE",
    "TOOLGATE_AGENT_TOKEN",
    "TOOLGATE_APPROVER_TOKEN",
    "TOOLGATE_ADMIN_TOKEN",
    // Read by earlier versions of the client; tolerated so a shell that still exports it can
    // start the gateway (the client names it in its error instead).
    "TOOLGATE_TOKEN",
    // Read by the key loader, not a config key (keys never go in the config file).
    "TOOLGATE_MASTER_KEYS",
    // The PostgreSQL server of the test suite; gateways the tests start inherit it.
    "TOOLGATE_TEST_PG_URL",
    // The AWS emulator of the test suite (`moto_server`); gateways the tests start inherit it.
    "TOOLGATE_TEST_MOTO_SERVER",
    // The test suite's Python (with its pinned packages); gateways the tests start inherit it.
    "TOOLGATE_TEST_PYTHON",
];

impl Config {
    /// Loads `file` (or `toolgate.toml` when present), applies `env`, validates.
    pub fn load(
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
                // Kubernetes sets these for a Service named `toolgate` (or `toolgate-...`) in
                // every pod of the namespace; they are accepted only in its exact shapes.
                if is_kubernetes_service_link(name, value) {
                    continue;
                }
                return Err(unknown_variable(name));
            };
            let number = |v: &str| -> Result<u64, String> {
                v.parse::<u64>().map_err(|_| {
                    format!("{name} (config key {key}) must be a whole number, got `{v}`")
                })
            };
            match *key {
                "server.listen" => raw.server.listen = Some(value.clone()),
                "server.drain_timeout_ms" => raw.server.drain_timeout_ms = Some(number(value)?),
                "server.max_concurrent_calls" => {
                    raw.server.max_concurrent_calls = Some(
                        usize::try_from(number(value)?)
                            .map_err(|_| format!("{name} is too large"))?,
                    );
                }
                "server.max_queued_calls" => {
                    raw.server.max_queued_calls = Some(
                        usize::try_from(number(value)?)
                            .map_err(|_| format!("{name} is too large"))?,
                    );
                }
                "server.worker_threads" => {
                    raw.server.worker_threads = Some(
                        usize::try_from(number(value)?)
                            .map_err(|_| format!("{name} is too large"))?,
                    );
                }
                "server.tls.cert_file" => raw.server.tls.cert_file = Some(value.clone()),
                "server.tls.key_file" => raw.server.tls.key_file = Some(value.clone()),
                "server.tls.client_ca_file" => {
                    raw.server.tls.client_ca_file = Some(value.clone());
                }
                "storage.database" => raw.storage.database = Some(value.clone()),
                "storage.schema" => raw.storage.schema = Some(value.clone()),
                "auth.admin_token_file" => raw.auth.admin_token_file = Some(value.clone()),
                "secrets.key_file" => raw.secrets.key_file = Some(value.clone()),
                "metrics.listen" => raw.metrics.listen = Some(value.clone()),
                "console.enabled" => {
                    raw.console.enabled = Some(match value.as_str() {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        _ => return Err(format!("{name} must be true or false, got `{value}`")),
                    });
                }
                "console.public_url" => raw.console.public_url = Some(value.clone()),
                "console.allowed_origins" => {
                    raw.console.allowed_origins = Some(
                        value
                            .split(',')
                            .map(str::trim)
                            .filter(|origin| !origin.is_empty())
                            .map(str::to_owned)
                            .collect(),
                    );
                }
                "console.session_idle_ms" => raw.console.session_idle_ms = Some(number(value)?),
                "console.session_max_ms" => raw.console.session_max_ms = Some(number(value)?),
                "console.client_link_ttl_ms" => {
                    raw.console.client_link_ttl_ms = Some(number(value)?);
                }
                "mcp.enabled" => {
                    raw.mcp.enabled = Some(match value.as_str() {
                        "true" | "1" => true,
                        "false" | "0" => false,
                        other => {
                            return Err(format!(
                                "{name} (config key {key}) must be true or false, got `{other}`"
                            ));
                        }
                    });
                }
                "mcp.allowed_hosts" => raw.mcp.allowed_hosts = Some(comma_list(value)),
                "mcp.allowed_origins" => raw.mcp.allowed_origins = Some(comma_list(value)),
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
        let drain_timeout_ms = raw
            .server
            .drain_timeout_ms
            .unwrap_or(DEFAULT_DRAIN_TIMEOUT_MS);
        if drain_timeout_ms > MAX_DRAIN_TIMEOUT_MS {
            return Err(format!(
                "server.drain_timeout_ms must be at most {MAX_DRAIN_TIMEOUT_MS} (an hour), got {drain_timeout_ms}"
            ));
        }
        let limits = call_limits(raw.server.max_concurrent_calls, raw.server.max_queued_calls)?;
        let worker_threads = match raw.server.worker_threads {
            Some(threads) if threads == 0 || threads > MAX_WORKER_THREADS => {
                return Err(format!(
                    "server.worker_threads must be between 1 and {MAX_WORKER_THREADS}, got {threads}"
                ));
            }
            threads => threads,
        };
        let tls = match tls_paths(raw.server.tls)? {
            Some(paths) => Some(ServerTls::load(paths)?),
            None => None,
        };
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
        let shopify = ShopifySettings {
            api_version: raw.connectors.shopify.api_version,
            allow_hosts: raw.connectors.shopify.allow_hosts.unwrap_or_default(),
        };
        if let Some(version) = &shopify.api_version {
            let shaped = version.len() == 7
                && version.as_bytes()[4] == b'-'
                && version
                    .bytes()
                    .enumerate()
                    .all(|(i, b)| i == 4 || b.is_ascii_digit());
            if !shaped {
                return Err(format!(
                    "connectors.shopify.api_version must be a release such as \"2026-10\", got `{version}`"
                ));
            }
        }
        let metrics = MetricsSettings {
            listen: raw
                .metrics
                .listen
                .map(|text| parse_metrics_listen(&text, listen))
                .transpose()?,
        };
        let console = console_settings(raw.console)?;
        let mcp = mcp_settings(raw.mcp)?;
        let aws = AwsSettings {
            endpoint_url: raw.connectors.aws.endpoint_url,
            default_region: raw.connectors.aws.default_region,
            max_concurrency: raw.connectors.aws.max_concurrency,
            max_attempts: raw.connectors.aws.max_attempts,
            page_size: raw.connectors.aws.page_size,
        };
        Ok(Config {
            listen,
            tls,
            limits,
            drain_timeout: Duration::from_millis(drain_timeout_ms),
            worker_threads,
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
            shopify,
            aws,
            metrics,
            console,
            mcp,
        })
    }
}

/// `[console]`, checked: the public URL an http(s) URL without a path, the origins origins,
/// the durations positive and the idle expiry within the absolute one.
fn console_settings(raw: RawConsole) -> Result<ConsoleSettings, String> {
    let defaults = ConsoleSettings::default();
    if let Some(url) = &raw.public_url {
        let parsed = url::Url::parse(url)
            .map_err(|error| format!("console.public_url `{url}` is not a URL: {error}"))?;
        if !matches!(parsed.scheme(), "http" | "https")
            || parsed.host_str().is_none()
            || !parsed.path().trim_end_matches('/').is_empty()
            || parsed.query().is_some()
        {
            return Err(format!(
                "console.public_url must be an http or https URL without a path, like https://gate.example.com, got `{url}`"
            ));
        }
    }
    let allowed_origins = raw.allowed_origins.unwrap_or_default();
    for origin in &allowed_origins {
        let serialized = url::Url::parse(origin)
            .ok()
            .filter(|url| matches!(url.scheme(), "http" | "https"))
            .map(|url| url.origin().ascii_serialization());
        if serialized.as_deref() != Some(origin.trim_end_matches('/')) {
            return Err(format!(
                "console.allowed_origins: `{origin}` is not an origin like https://gate.example.com (scheme, host and port only)"
            ));
        }
    }
    let duration = |name: &str, value: Option<u64>, default: Duration| match value {
        None => Ok(default),
        Some(0) => Err(format!("console.{name} must be at least 1")),
        Some(ms) => Ok(Duration::from_millis(ms)),
    };
    let session_idle = duration(
        "session_idle_ms",
        raw.session_idle_ms,
        defaults.session_idle,
    )?;
    let session_max = duration("session_max_ms", raw.session_max_ms, defaults.session_max)?;
    if session_idle > session_max {
        return Err(format!(
            "console.session_idle_ms ({}) is longer than console.session_max_ms ({}): a session would never be idle long enough to end",
            session_idle.as_millis(),
            session_max.as_millis()
        ));
    }
    Ok(ConsoleSettings {
        enabled: raw.enabled.unwrap_or(false),
        public_url: raw
            .public_url
            .map(|url| url.trim_end_matches('/').to_owned()),
        allowed_origins: allowed_origins
            .into_iter()
            .map(|origin| origin.trim_end_matches('/').to_owned())
            .collect(),
        session_idle,
        session_max,
        client_link_ttl: duration(
            "client_link_ttl_ms",
            raw.client_link_ttl_ms,
            defaults.client_link_ttl,
        )?,
    })
}

/// A comma-separated list from the environment, blanks dropped.
fn comma_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

/// `[mcp]`, checked: hosts are names or `name:port` (no scheme, no path), origins are
/// `http(s)://host[:port]` (or `null`, what a browser sends from a sandboxed page).
fn mcp_settings(raw: RawMcp) -> Result<McpSettings, String> {
    let mut settings = McpSettings {
        enabled: raw.enabled.unwrap_or(true),
        ..McpSettings::default()
    };
    for host in raw.allowed_hosts.unwrap_or_default() {
        let host = host.trim().to_owned();
        let bad = host.is_empty()
            || host.contains("://")
            || host.contains('/')
            || host.chars().any(|c| c.is_whitespace() || c.is_control());
        if bad {
            return Err(format!(
                "mcp.allowed_hosts must list host names or host:port values such as \"toolgate.example.com\", got `{host}`"
            ));
        }
        if !settings.allowed_hosts.contains(&host) {
            settings.allowed_hosts.push(host);
        }
    }
    for origin in raw.allowed_origins.unwrap_or_default() {
        let origin = origin.trim().trim_end_matches('/').to_owned();
        let rest = origin
            .strip_prefix("https://")
            .or_else(|| origin.strip_prefix("http://"));
        let shaped = origin == "null"
            || rest.is_some_and(|rest| {
                !rest.is_empty()
                    && !rest.contains('/')
                    && !rest.chars().any(|c| c.is_whitespace() || c.is_control())
            });
        if !shaped {
            return Err(format!(
                "mcp.allowed_origins must list origins such as \"https://app.example.com\" (scheme, host and optional port, no path), got `{origin}`"
            ));
        }
        settings.allowed_origins.push(origin);
    }
    Ok(settings)
}

/// The most worker threads `server.worker_threads` may ask for.
const MAX_WORKER_THREADS: usize = 1024;

/// The cores this process may run on (1 when the system cannot tell).
pub fn available_cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

impl Config {
    /// The async runtime's worker threads on a machine of `cores` cores: `server.worker_threads`
    /// when set; otherwise every core on PostgreSQL, and every core but one (at least one) on
    /// SQLite, whose ledger writer is a thread of its own that keeps a core busy under load.
    /// With a worker on every core as well, the workers and the writer take turns on the same
    /// cores: measured on two cores, one worker instead of two used 7% less CPU per call at
    /// 1,000 calls/s (a fifth fewer thread switches) for the same latency and closed-loop
    /// throughput, while on PostgreSQL (no writer thread) one worker lost 8-10% of the
    /// closed loop (the README's "Configuration" has the figures).
    pub fn worker_threads(&self, cores: usize) -> usize {
        match (self.worker_threads, &self.database) {
            (Some(threads), _) => threads,
            (None, Database::Sqlite(_)) => cores.saturating_sub(1).max(1),
            (None, Database::Postgres { .. }) => cores.max(1),
        }
    }
}

/// `server.max_concurrent_calls` (at least 1) and `server.max_queued_calls` (0: no queue).
fn call_limits(
    max_concurrent: Option<usize>,
    max_queued: Option<usize>,
) -> Result<CallLimits, String> {
    let defaults = CallLimits::default();
    let limits = CallLimits {
        max_concurrent: max_concurrent.unwrap_or(defaults.max_concurrent),
        max_queued: max_queued.unwrap_or(defaults.max_queued),
    };
    if limits.max_concurrent == 0 || limits.max_concurrent > MAX_CALL_LIMIT {
        return Err(format!(
            "server.max_concurrent_calls must be between 1 and {MAX_CALL_LIMIT}, got {}",
            limits.max_concurrent
        ));
    }
    if limits.max_queued > MAX_CALL_LIMIT {
        return Err(format!(
            "server.max_queued_calls must be at most {MAX_CALL_LIMIT}, got {}",
            limits.max_queued
        ));
    }
    Ok(limits)
}

/// `[server.tls]`: nothing (plaintext), or a certificate and its key, and optionally the CAs
/// of client certificates (mTLS).
fn tls_paths(raw: RawTls) -> Result<Option<TlsPaths>, String> {
    let path = |key: &str, value: Option<String>| -> Result<Option<PathBuf>, String> {
        match value {
            Some(text) if text.trim().is_empty() => Err(format!(
                "server.tls.{key} is empty; name a PEM file or leave it out"
            )),
            Some(text) => Ok(Some(PathBuf::from(text))),
            None => Ok(None),
        }
    };
    let cert_file = path("cert_file", raw.cert_file)?;
    let key_file = path("key_file", raw.key_file)?;
    let client_ca_file = path("client_ca_file", raw.client_ca_file)?;
    match (cert_file, key_file) {
        (Some(cert_file), Some(key_file)) => Ok(Some(TlsPaths {
            cert_file,
            key_file,
            client_ca_file,
        })),
        (Some(_), None) => Err(
            "server.tls.cert_file is set but server.tls.key_file is not: TLS needs both".to_owned(),
        ),
        (None, Some(_)) => Err(
            "server.tls.key_file is set but server.tls.cert_file is not: TLS needs both".to_owned(),
        ),
        (None, None) if client_ca_file.is_some() => Err(
            "server.tls.client_ca_file needs server.tls.cert_file and server.tls.key_file: client certificates are checked only over TLS"
                .to_owned(),
        ),
        (None, None) => Ok(None),
    }
}

/// `metrics.listen`: an address, not the gRPC listener's (port 0, any free port, excepted).
fn parse_metrics_listen(text: &str, grpc: SocketAddr) -> Result<SocketAddr, String> {
    let address: SocketAddr = text.parse().map_err(|_| {
        format!("metrics.listen must be an address like 127.0.0.1:9464, got `{text}`")
    })?;
    if address == grpc && address.port() != 0 {
        return Err(format!(
            "metrics.listen ({address}) is the address server.listen serves gRPC on; give the metrics endpoint a port of its own"
        ));
    }
    Ok(address)
}

/// The error for a `TOOLGATE_*` variable that is neither ours nor a Kubernetes service link:
/// the closest known name when there is one (a typo), and the list of known names.
fn unknown_variable(name: &str) -> String {
    let known: Vec<&str> = ENV_KEYS
        .iter()
        .map(|(n, _)| *n)
        .chain(ENV_OTHER.iter().copied())
        .collect();
    let closest = known
        .iter()
        .map(|candidate| (edit_distance(name, candidate), *candidate))
        .min_by_key(|(distance, _)| *distance)
        .filter(|(distance, candidate)| *distance <= typo_allowance(candidate));
    // `TOOLGATE_LISTEN_ADDRESS` or `TOOLGATE_MAX_TIMEOUT`: a known name with a word added or
    // left out.
    let extended = known
        .iter()
        .filter(|candidate| {
            name.starts_with(&format!("{candidate}_")) || candidate.starts_with(&format!("{name}_"))
        })
        .max_by_key(|candidate| candidate.len());
    let hint = match (closest, extended) {
        (Some((_, candidate)), _) | (None, Some(&candidate)) => {
            format!(" (did you mean {candidate}?)")
        }
        (None, None) => String::new(),
    };
    format!(
        "unknown environment variable {name}{hint}; known ones: {}",
        known.join(", ")
    )
}

/// How many edits still count as a typo of `name`: two, three for long names.
fn typo_allowance(name: &str) -> usize {
    if name.len() > 24 { 3 } else { 2 }
}

/// The optimal string alignment distance: insertions, deletions, substitutions and
/// transpositions of neighbours each count one (`DATABSE` is one from `DATABASE`).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let width = b.len() + 1;
    let mut d = vec![0usize; (a.len() + 1) * width];
    for i in 0..=a.len() {
        d[i * width] = i;
    }
    for (j, cell) in d.iter_mut().enumerate().take(width) {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[(i - 1) * width + j] + 1)
                .min(d[i * width + j - 1] + 1)
                .min(d[(i - 1) * width + j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[(i - 2) * width + j - 2] + 1);
            }
            d[i * width + j] = best;
        }
    }
    d[a.len() * width + b.len()]
}

/// Whether `name=value` is one of the variables Kubernetes injects for a Service named
/// `toolgate` or `toolgate-<something>` (docker-link style): `<SVC>_SERVICE_HOST` (an IP),
/// `<SVC>_SERVICE_PORT` and `<SVC>_SERVICE_PORT_<PORTNAME>` (a port), `<SVC>_PORT`
/// (`<proto>://<ip>:<port>`), `<SVC>_PORT_<n>_<PROTO>` (the same, for port n),
/// `<SVC>_PORT_<n>_<PROTO>_PROTO` (`tcp`), `..._PORT` (n) and `..._ADDR` (an IP), where `<SVC>`
/// is the service name in upper case with `-` as `_`. Name and value must both have the
/// shape, so a misspelled setting is not taken for one.
fn is_kubernetes_service_link(name: &str, value: &str) -> bool {
    let Some(rest) = name.strip_prefix("TOOLGATE") else {
        return false;
    };
    let Some(rest) = rest.strip_prefix('_') else {
        return false;
    };
    let tokens: Vec<&str> = rest.split('_').collect();
    let word = |t: &str| {
        !t.is_empty()
            && t.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
    };
    if !tokens.iter().all(|t| word(t)) {
        return false;
    }
    let ip = |v: &str| v.parse::<std::net::IpAddr>().is_ok();
    let port = |v: &str| v.parse::<u16>().is_ok_and(|p| p > 0);
    let protocol = |t: &str| matches!(t, "TCP" | "UDP" | "SCTP");
    // `tcp://10.0.0.1:50051`, `tcp://[fd00::1]:50051`, optionally for one protocol and port.
    let url = |v: &str, proto: Option<&str>, number: Option<&str>| {
        let Some((scheme, address)) = v.split_once("://") else {
            return false;
        };
        let Ok(address) = address.parse::<SocketAddr>() else {
            return false;
        };
        protocol(&scheme.to_ascii_uppercase())
            && scheme.bytes().all(|b| b.is_ascii_lowercase())
            && proto.is_none_or(|p| p.eq_ignore_ascii_case(scheme))
            && number.is_none_or(|n| n.parse::<u16>().is_ok_and(|n| n == address.port()))
    };
    // Every split of the tokens into a service part (empty for `toolgate` itself) and a
    // suffix; one that fits is enough.
    (0..tokens.len()).any(|split| {
        let suffix = &tokens[split..];
        match suffix {
            ["SERVICE", "HOST"] => ip(value),
            ["SERVICE", "PORT"] | ["SERVICE", "PORT", _, ..] => port(value),
            ["PORT"] => url(value, None, None),
            ["PORT", n, proto] => port(n) && protocol(proto) && url(value, Some(proto), Some(n)),
            ["PORT", n, proto, "PROTO"] => {
                port(n) && protocol(proto) && value == proto.to_ascii_lowercase()
            }
            ["PORT", n, proto, "PORT"] => port(n) && protocol(proto) && value == *n,
            ["PORT", n, proto, "ADDR"] => port(n) && protocol(proto) && ip(value),
            _ => false,
        }
    })
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
    fn the_metrics_endpoint_is_off_unless_configured() {
        assert_eq!(load("", &[]).unwrap().metrics.listen, None);
        let from_file = load("[metrics]\nlisten = \"127.0.0.1:9464\"", &[]).unwrap();
        assert_eq!(
            from_file.metrics.listen,
            Some("127.0.0.1:9464".parse().unwrap())
        );
        // The environment overrides the file.
        let from_env = load(
            "[metrics]\nlisten = \"127.0.0.1:9464\"",
            &[("TOOLGATE_METRICS_LISTEN", "[::1]:9465")],
        )
        .unwrap();
        assert_eq!(from_env.metrics.listen, Some("[::1]:9465".parse().unwrap()));
        // Any free port, beside gRPC on any free port.
        let both_free = load(
            "[server]\nlisten = \"127.0.0.1:0\"\n[metrics]\nlisten = \"127.0.0.1:0\"",
            &[],
        )
        .unwrap();
        assert_eq!(
            both_free.metrics.listen,
            Some("127.0.0.1:0".parse().unwrap())
        );
    }

    #[test]
    fn the_console_is_off_unless_enabled_and_its_settings_load_from_file_and_environment() {
        let off = load("", &[]).unwrap().console;
        assert_eq!(off, ConsoleSettings::default());
        assert!(!off.enabled);
        let file = load(
            "[console]\nenabled = true\npublic_url = \"https://gate.example.com/\"\nallowed_origins = [\"https://other.example.com\"]\nsession_idle_ms = 1000\nsession_max_ms = 2000\nclient_link_ttl_ms = 3000",
            &[],
        )
        .unwrap()
        .console;
        assert!(file.enabled);
        assert_eq!(file.public_url.as_deref(), Some("https://gate.example.com"));
        assert_eq!(file.allowed_origins, ["https://other.example.com"]);
        assert_eq!(file.session_idle, Duration::from_millis(1000));
        assert_eq!(file.session_max, Duration::from_millis(2000));
        assert_eq!(file.client_link_ttl, Duration::from_millis(3000));
        let env = load(
            "",
            &[
                ("TOOLGATE_CONSOLE_ENABLED", "true"),
                (
                    "TOOLGATE_CONSOLE_ALLOWED_ORIGINS",
                    "http://a.test, http://b.test:8080",
                ),
                ("TOOLGATE_CONSOLE_SESSION_IDLE_MS", "500"),
            ],
        )
        .unwrap()
        .console;
        assert!(env.enabled);
        assert_eq!(env.allowed_origins, ["http://a.test", "http://b.test:8080"]);
        assert_eq!(env.session_idle, Duration::from_millis(500));
        let shown = load("[console]\nenabled = true", &[]).unwrap().effective();
        assert_eq!(shown["console"]["enabled"].as_bool(), Some(true));
        assert_eq!(
            shown["console"]["session_idle_ms"].as_integer(),
            Some(1_800_000)
        );
    }

    #[test]
    fn bad_console_settings_are_refused_at_load() {
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case<'_>] = &[
            (
                "[console]\npublic_url = \"gate.example.com\"",
                &[],
                "console.public_url",
            ),
            (
                "[console]\npublic_url = \"https://gate.example.com/app\"",
                &[],
                "without a path",
            ),
            (
                "[console]\npublic_url = \"ftp://gate.example.com\"",
                &[],
                "http or https",
            ),
            (
                "[console]\nallowed_origins = [\"https://a.test/x\"]",
                &[],
                "console.allowed_origins",
            ),
            (
                "[console]\nsession_idle_ms = 0",
                &[],
                "console.session_idle_ms must be at least 1",
            ),
            (
                "[console]\nsession_idle_ms = 5000\nsession_max_ms = 1000",
                &[],
                "longer than console.session_max_ms",
            ),
            (
                "",
                &[("TOOLGATE_CONSOLE_ENABLED", "yes")],
                "must be true or false",
            ),
            ("[console]\ncolor = \"blue\"", &[], "color"),
        ];
        for (toml_text, pairs, expected) in cases {
            let error = load(toml_text, pairs).unwrap_err();
            assert!(error.contains(expected), "{toml_text} {pairs:?}: {error}");
        }
    }

    #[test]
    fn a_bad_metrics_address_is_refused_at_load() {
        type Case<'a> = (&'a str, &'a [(&'a str, &'a str)], &'a str);
        let cases: &[Case<'_>] = &[
            (
                "[metrics]\nlisten = \"9464\"",
                &[],
                "metrics.listen must be an address",
            ),
            (
                "",
                &[("TOOLGATE_METRICS_LISTEN", "")],
                "metrics.listen must be an address",
            ),
            (
                "",
                &[("TOOLGATE_METRICS_LISTEN", "localhost:9464")],
                "metrics.listen must be an address",
            ),
            ("[metrics]\nport = 9464", &[], "port"),
            (
                "[metrics]\nlisten = \"127.0.0.1:50051\"",
                &[],
                "the address server.listen serves gRPC on",
            ),
            (
                "",
                &[("TOOLGATE_METRICS_LISTN", "x")],
                "TOOLGATE_METRICS_LISTEN",
            ),
        ];
        for (toml_text, pairs, expected) in cases {
            let error = load(toml_text, pairs).unwrap_err();
            assert!(error.contains(expected), "{toml_text:?} {pairs:?}: {error}");
        }
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
            ("[connectors.shopify]\ntoken = \"x\"", &[], "token"),
            (
                "[server]\nmax_concurrent_calls = 0",
                &[],
                "server.max_concurrent_calls",
            ),
            (
                "",
                &[("TOOLGATE_MAX_QUEUED_CALLS", "many")],
                "server.max_queued_calls",
            ),
            (
                "[server]\nmax_queued_calls = 1000001",
                &[],
                "server.max_queued_calls",
            ),
            ("[server.tls]\ncert = \"x\"", &[], "cert"),
            (
                "[server.tls]\ncert_file = \"server.pem\"",
                &[],
                "server.tls.key_file",
            ),
            (
                "",
                &[("TOOLGATE_TLS_KEY_FILE", "server.key")],
                "server.tls.cert_file",
            ),
            (
                "[server.tls]\nclient_ca_file = \"ca.pem\"",
                &[],
                "server.tls.client_ca_file",
            ),
            (
                "[server.tls]\ncert_file = \"\"\nkey_file = \"k\"",
                &[],
                "server.tls.cert_file",
            ),
            (
                "[server.tls]\ncert_file = \"/nonexistent/server.pem\"\nkey_file = \"/nonexistent/server.key\"",
                &[],
                "server.tls.cert_file",
            ),
            (
                "[connectors.shopify]\napi_version = \"latest\"",
                &[],
                "connectors.shopify.api_version",
            ),
        ];
        for (text, pairs, key) in cases {
            let err = load(text, pairs).unwrap_err();
            assert!(err.contains(key), "{text:?} {pairs:?}: {err}");
        }
    }

    /// The variables Kubernetes sets for Services named `toolgate` (ports `grpc` 50051/TCP and
    /// `metrics` 9090/TCP) and `toolgate-admin` (one unnamed port), as `kubectl exec env` shows.
    const KUBERNETES: &[(&str, &str)] = &[
        ("TOOLGATE_SERVICE_HOST", "10.96.12.34"),
        ("TOOLGATE_SERVICE_PORT", "50051"),
        ("TOOLGATE_SERVICE_PORT_GRPC", "50051"),
        ("TOOLGATE_SERVICE_PORT_METRICS", "9090"),
        ("TOOLGATE_PORT", "tcp://10.96.12.34:50051"),
        ("TOOLGATE_PORT_50051_TCP", "tcp://10.96.12.34:50051"),
        ("TOOLGATE_PORT_50051_TCP_PROTO", "tcp"),
        ("TOOLGATE_PORT_50051_TCP_PORT", "50051"),
        ("TOOLGATE_PORT_50051_TCP_ADDR", "10.96.12.34"),
        ("TOOLGATE_PORT_9090_TCP", "tcp://10.96.12.34:9090"),
        ("TOOLGATE_PORT_9090_TCP_PROTO", "tcp"),
        ("TOOLGATE_PORT_9090_TCP_PORT", "9090"),
        ("TOOLGATE_PORT_9090_TCP_ADDR", "10.96.12.34"),
        ("TOOLGATE_ADMIN_SERVICE_HOST", "fd00::1a"),
        ("TOOLGATE_ADMIN_SERVICE_PORT", "8080"),
        ("TOOLGATE_ADMIN_PORT", "tcp://[fd00::1a]:8080"),
        ("TOOLGATE_ADMIN_PORT_8080_TCP", "tcp://[fd00::1a]:8080"),
        ("TOOLGATE_ADMIN_PORT_8080_TCP_PROTO", "tcp"),
        ("TOOLGATE_ADMIN_PORT_8080_TCP_PORT", "8080"),
        ("TOOLGATE_ADMIN_PORT_8080_TCP_ADDR", "fd00::1a"),
        ("TOOLGATE_DNS_PORT_53_UDP", "udp://10.96.0.10:53"),
        ("TOOLGATE_DNS_PORT_53_UDP_PROTO", "udp"),
    ];

    #[test]
    fn kubernetes_service_links_are_accepted() {
        for pair in KUBERNETES {
            assert!(is_kubernetes_service_link(pair.0, pair.1), "{pair:?}");
        }
        let config = load("", KUBERNETES).unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:50051");
    }

    #[test]
    fn lookalikes_of_service_links_are_refused() {
        let cases: &[(&str, &str)] = &[
            ("TOOLGATE_LISTEN_PORT", "50051"),
            ("TOOLGATE_PORT", "50051"),
            ("TOOLGATE_PORT", "http://10.0.0.1:50051"),
            ("TOOLGATE_PORT", "TCP://10.0.0.1:50051"),
            ("TOOLGATE_SERVICE_HOST", "toolgate.default.svc"),
            ("TOOLGATE_SERVICE_PORT", "0"),
            ("TOOLGATE_SERVICE_PORT_GRPC", "grpc"),
            ("TOOLGATE_PORT_50051_TCP", "tcp://10.0.0.1:50052"),
            ("TOOLGATE_PORT_50051_TCP", "udp://10.0.0.1:50051"),
            ("TOOLGATE_PORT_50051_TCP_PROTO", "udp"),
            ("TOOLGATE_PORT_50051_TCP_PORT", "50052"),
            ("TOOLGATE_PORT_50051_HTTP_ADDR", "10.0.0.1"),
            ("TOOLGATE_PORT_50051_TCP_ADDR", "localhost"),
            ("TOOLGATE_PORT_X_TCP_ADDR", "10.0.0.1"),
            ("TOOLGATE__SERVICE_HOST", "10.0.0.1"),
            ("TOOLGATE_admin_SERVICE_HOST", "10.0.0.1"),
        ];
        // Not ours at all (and not read): a Service named `toolgatex`.
        assert!(!is_kubernetes_service_link(
            "TOOLGATEX_SERVICE_HOST",
            "10.0.0.1"
        ));
        for (name, value) in cases {
            assert!(!is_kubernetes_service_link(name, value), "{name}={value}");
            let err = load("", &[(name, value)]).unwrap_err();
            assert!(err.contains(name), "{name}: {err}");
        }
    }

    #[test]
    fn typos_are_refused_with_a_suggestion() {
        let cases: &[(&str, &str)] = &[
            ("TOOLGATE_DATABSE", "TOOLGATE_DATABASE"),
            ("TOOLGATE_LISTN", "TOOLGATE_LISTEN"),
            ("TOOLGATE_LISTNE", "TOOLGATE_LISTEN"),
            ("TOOLGATE_MAX_TIMEOUT", "TOOLGATE_MAX_TIMEOUT_MS"),
            ("TOOLGATE_DRAIN_TIMEOUT_SM", "TOOLGATE_DRAIN_TIMEOUT_MS"),
            ("TOOLGATE_MASTER_KEY", "TOOLGATE_MASTER_KEYS"),
            ("TOOLGATE_AGENT_TOKN", "TOOLGATE_AGENT_TOKEN"),
            ("TOOLGATE_LISTEN_PORT", "TOOLGATE_LISTEN"),
        ];
        for (typo, meant) in cases {
            let err = load("", &[(typo, "127.0.0.1:1")]).unwrap_err();
            assert!(
                err.contains(&format!(
                    "unknown environment variable {typo} (did you mean {meant}?)"
                )),
                "{typo}: {err}"
            );
        }
        let err = load("", &[("TOOLGATE_FROBNICATE", "1")]).unwrap_err();
        assert!(!err.contains("did you mean"), "{err}");
        assert!(err.contains("TOOLGATE_FROBNICATE"), "{err}");
    }

    #[test]
    fn aws_settings_are_read_and_a_tenant_key_is_refused() {
        let config = load(
            "[connectors.aws]\nendpoint_url = \"http://127.0.0.1:5000\"\ndefault_region = \"eu-west-1\"\nmax_concurrency = 2\nmax_attempts = 1\npage_size = 5",
            &[],
        )
        .unwrap();
        assert_eq!(
            config.aws,
            AwsSettings {
                endpoint_url: Some("http://127.0.0.1:5000".into()),
                default_region: Some("eu-west-1".into()),
                max_concurrency: Some(2),
                max_attempts: Some(1),
                page_size: Some(5),
            }
        );
        assert_eq!(load("", &[]).unwrap().aws, AwsSettings::default());
        let err = load("[connectors.aws]\nendpoint = \"http://x\"", &[]).unwrap_err();
        assert!(err.contains("endpoint"), "{err}");
    }

    /// A file, an environment, and the max_concurrent and max_queued they give.
    type LimitCase<'a> = (&'a str, &'a [(&'a str, &'a str)], usize, usize);

    #[test]
    fn call_limits_are_read_and_bounded() {
        assert_eq!(load("", &[]).unwrap().limits, CallLimits::default());
        let cases: &[LimitCase<'_>] = &[
            (
                "[server]\nmax_concurrent_calls = 8\nmax_queued_calls = 0",
                &[],
                8,
                0,
            ),
            ("", &[("TOOLGATE_MAX_CONCURRENT_CALLS", "3")], 3, 512),
            (
                "[server]\nmax_queued_calls = 5",
                &[("TOOLGATE_MAX_QUEUED_CALLS", "7")],
                256,
                7,
            ),
        ];
        for (text, pairs, max_concurrent, max_queued) in cases {
            let limits = load(text, pairs).unwrap().limits;
            assert_eq!(
                limits,
                CallLimits {
                    max_concurrent: *max_concurrent,
                    max_queued: *max_queued
                },
                "{text:?} {pairs:?}"
            );
        }
    }

    #[test]
    fn worker_threads_leave_the_sqlite_writer_a_core_unless_configured() {
        let sqlite = load("", &[]).unwrap();
        assert_eq!(sqlite.worker_threads, None);
        assert_eq!(
            [1, 2, 8].map(|cores| sqlite.worker_threads(cores)),
            [1, 1, 7]
        );
        let postgres = load(
            "[storage]\ndatabase = \"postgres://u@127.0.0.1:5432/test\"",
            &[],
        )
        .unwrap();
        assert_eq!(
            [1, 2, 8].map(|cores| postgres.worker_threads(cores)),
            [1, 2, 8]
        );
        let set = load("[server]\nworker_threads = 3", &[]).unwrap();
        assert_eq!(set.worker_threads(2), 3);
        let env = load(
            "[server]\nworker_threads = 3",
            &[("TOOLGATE_WORKER_THREADS", "5")],
        )
        .unwrap();
        assert_eq!(env.worker_threads(16), 5);
        for (text, pairs, expected) in [
            (
                "[server]\nworker_threads = 0",
                &[][..],
                "server.worker_threads must be between 1 and 1024, got 0",
            ),
            (
                "",
                &[("TOOLGATE_WORKER_THREADS", "1025")][..],
                "server.worker_threads must be between 1 and 1024, got 1025",
            ),
            (
                "",
                &[("TOOLGATE_WORKER_THREADS", "two")][..],
                "TOOLGATE_WORKER_THREADS (config key server.worker_threads) must be a whole number, got `two`",
            ),
        ] {
            let err = load(text, pairs).unwrap_err();
            assert_eq!(err, expected, "{text:?} {pairs:?}");
        }
    }

    #[test]
    fn tls_settings_are_read_from_the_file_and_the_environment() {
        use crate::tls::tests::{TestCa, files};
        let dir = tempfile::tempdir().unwrap();
        let ca = TestCa::new("test ca");
        let (cert, key) = ca.issue();
        files(
            dir.path(),
            &[
                ("cert.pem", &cert),
                ("key.pem", &key),
                ("ca.pem", &ca.cert_pem),
            ],
        );
        let path = |name: &str| dir.path().join(name).display().to_string();
        assert!(load("", &[]).unwrap().tls.is_none());
        let text = format!(
            "[server.tls]\ncert_file = {:?}\nkey_file = {:?}",
            path("cert.pem"),
            path("key.pem")
        );
        let tls = load(&text, &[]).unwrap().tls.expect("tls");
        assert_eq!(tls.paths.cert_file, dir.path().join("cert.pem"));
        assert!(!tls.requires_client_certificates());
        let ca_file = path("ca.pem");
        let tls = load(&text, &[("TOOLGATE_TLS_CLIENT_CA_FILE", &ca_file)])
            .unwrap()
            .tls
            .expect("tls");
        assert!(tls.requires_client_certificates());
        let (cert_file, key_file) = (path("cert.pem"), path("key.pem"));
        let from_env = load(
            "",
            &[
                ("TOOLGATE_TLS_CERT_FILE", &cert_file),
                ("TOOLGATE_TLS_KEY_FILE", &key_file),
            ],
        )
        .unwrap();
        assert_eq!(
            from_env.tls.expect("tls").paths.key_file,
            dir.path().join("key.pem")
        );
        // A bad file is refused when the configuration loads, naming the key.
        let missing = path("missing.pem");
        let err = load(&text, &[("TOOLGATE_TLS_KEY_FILE", &missing)]).unwrap_err();
        assert!(
            err.contains("server.tls.key_file") && err.contains("missing.pem"),
            "{err}"
        );
    }

    #[test]
    fn non_loopback_plaintext_is_warned_about() {
        assert!(load("", &[]).unwrap().warnings().is_empty());
        assert!(
            load("[server]\nlisten = \"[::1]:1\"", &[])
                .unwrap()
                .warnings()
                .is_empty()
        );
        let warnings = load(
            "[server]\nlisten = \"0.0.0.0:50051\"\n[mcp]\nallowed_hosts = [\"toolgate.example.com\"]",
            &[],
        )
        .unwrap()
        .warnings();
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("clear text"), "{warnings:?}");
        assert!(warnings[0].contains("server.tls"), "{warnings:?}");
    }

    #[test]
    fn mcp_settings_are_read_checked_and_warned_about() {
        let defaults = load("", &[]).unwrap().mcp;
        assert!(defaults.enabled);
        assert_eq!(defaults.allowed_hosts, ["localhost", "127.0.0.1", "::1"]);
        assert!(defaults.allowed_origins.is_empty());

        let configured = load(
            "[mcp]\nallowed_hosts = [\"toolgate.example.com\", \"localhost\"]\nallowed_origins = [\"https://app.example.com/\"]",
            &[],
        )
        .unwrap()
        .mcp;
        assert_eq!(
            configured.allowed_hosts,
            ["localhost", "127.0.0.1", "::1", "toolgate.example.com"]
        );
        assert_eq!(configured.allowed_origins, ["https://app.example.com"]);

        let from_env = load(
            "",
            &[
                ("TOOLGATE_MCP_ENABLED", "false"),
                ("TOOLGATE_MCP_ALLOWED_HOSTS", "a.example, b.example:8443"),
                ("TOOLGATE_MCP_ALLOWED_ORIGINS", "http://localhost:3000"),
            ],
        )
        .unwrap()
        .mcp;
        assert!(!from_env.enabled);
        assert!(from_env.allowed_hosts.iter().any(|h| h == "b.example:8443"));
        assert_eq!(from_env.allowed_origins, ["http://localhost:3000"]);

        for (text, env, named) in [
            (
                "[mcp]\nallowed_hosts = [\"https://x.example\"]",
                &[][..],
                "mcp.allowed_hosts",
            ),
            (
                "[mcp]\nallowed_hosts = [\"x.example/mcp\"]",
                &[][..],
                "mcp.allowed_hosts",
            ),
            (
                "[mcp]\nallowed_origins = [\"app.example.com\"]",
                &[][..],
                "mcp.allowed_origins",
            ),
            (
                "[mcp]\nallowed_origins = [\"https://a.example/path\"]",
                &[][..],
                "mcp.allowed_origins",
            ),
            (
                "",
                &[("TOOLGATE_MCP_ENABLED", "yes")][..],
                "TOOLGATE_MCP_ENABLED",
            ),
            ("[mcp]\nenable = true", &[][..], "enable"),
        ] {
            let error = load(text, env).unwrap_err();
            assert!(error.contains(named), "{text} {env:?}: {error}");
        }

        // Serving on every address: without a host name, /mcp would refuse every remote
        // client, so the operator is told; with TLS, only that.
        let warnings = load("[server]\nlisten = \"0.0.0.0:50051\"", &[])
            .unwrap()
            .warnings();
        assert_eq!(warnings.len(), 2, "{warnings:?}");
        assert!(warnings[1].contains("mcp.allowed_hosts"), "{warnings:?}");
        let off = load(
            "[server]\nlisten = \"0.0.0.0:50051\"\n[mcp]\nenabled = false",
            &[],
        )
        .unwrap()
        .warnings();
        assert_eq!(off.len(), 1, "{off:?}");

        let shown = load("[mcp]\nallowed_hosts = [\"toolgate.example.com\"]", &[])
            .unwrap()
            .effective();
        assert_eq!(shown["mcp"]["enabled"].as_bool(), Some(true));
        assert!(
            shown["mcp"]["allowed_hosts"]
                .as_array()
                .unwrap()
                .iter()
                .any(|h| h.as_str() == Some("toolgate.example.com"))
        );
    }

    #[test]
    fn the_effective_configuration_fills_defaults_and_elides_secrets() {
        let config = load(
            "[server]\nmax_queued_calls = 9\n[storage]\ndatabase = \"postgres://u:hunter2@127.0.0.1:5432/test?password=hunter2\"\nschema = \"tg\"",
            &[("TOOLGATE_MASTER_KEYS", "k1=c2VjcmV0LWtleS1ieXRlcw==")],
        )
        .unwrap();
        let shown = toml::to_string(&config.effective()).unwrap();
        assert!(!shown.contains("hunter2"), "{shown}");
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
        let effective = config.effective();
        let get = |section: &str, key: &str| effective[section][key].clone();
        assert_eq!(get("server", "listen").as_str(), Some("127.0.0.1:50051"));
        assert_eq!(get("server", "max_queued_calls").as_integer(), Some(9));
        assert_eq!(
            get("server", "max_concurrent_calls").as_integer(),
            Some(256)
        );
        assert_eq!(get("server", "drain_timeout_ms").as_integer(), Some(30_000));
        assert_eq!(get("engine", "max_timeout_ms").as_integer(), Some(300_000));
        assert_eq!(
            get("storage", "database").as_str(),
            Some("postgres://u@127.0.0.1:5432/test")
        );
        assert_eq!(get("secrets", "master_keys").as_str(), Some("[REDACTED]"));
        // What is shown (the inline keys aside) loads back as the same configuration.
        let mut again = effective.clone();
        again["secrets"]
            .as_table_mut()
            .unwrap()
            .remove("master_keys");
        let reloaded = load(&toml::to_string(&again).unwrap(), &[]).unwrap();
        assert_eq!(reloaded.effective()["engine"], effective["engine"]);
        assert_eq!(reloaded.effective()["server"], effective["server"]);

        // The metrics endpoint is shown as set (an empty table when off), and loads back.
        assert!(effective["metrics"].as_table().unwrap().is_empty());
        let with_metrics = load("[metrics]\nlisten = \"127.0.0.1:9464\"", &[]).unwrap();
        let shown = with_metrics.effective();
        assert_eq!(shown["metrics"]["listen"].as_str(), Some("127.0.0.1:9464"));
        let reloaded = load(&toml::to_string(&shown).unwrap(), &[]).unwrap();
        assert_eq!(reloaded.effective()["metrics"], shown["metrics"]);
    }

    #[test]
    fn the_drain_timeout_is_read_and_bounded() {
        assert_eq!(
            load("", &[]).unwrap().drain_timeout,
            Duration::from_secs(30)
        );
        let config = load("[server]\ndrain_timeout_ms = 1500", &[]).unwrap();
        assert_eq!(config.drain_timeout, Duration::from_millis(1500));
        let config = load("", &[("TOOLGATE_DRAIN_TIMEOUT_MS", "0")]).unwrap();
        assert_eq!(config.drain_timeout, Duration::ZERO);
        let err = load("[server]\ndrain_timeout_ms = 3600001", &[]).unwrap_err();
        assert!(err.contains("server.drain_timeout_ms"), "{err}");
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
    fn shopify_settings_are_read() {
        let config = load(
            "[connectors.shopify]\napi_version = \"2026-07\"\nallow_hosts = [\"127.0.0.1\"]",
            &[],
        )
        .unwrap();
        assert_eq!(
            config.shopify,
            ShopifySettings {
                api_version: Some("2026-07".into()),
                allow_hosts: vec!["127.0.0.1".into()],
            }
        );
        assert_eq!(load("", &[]).unwrap().shopify, ShopifySettings::default());
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

mod show;

#[cfg(test)]
mod proptests;
