//! What `toolgate config show` prints: the effective configuration, the file and the
//! environment applied and every gateway default filled in, in the file's own layout, with
//! secrets elided (inline master keys, the database password). Connector options left unset
//! are left out: each connector applies its own default.

use std::path::Path;
use std::time::Duration;

use toml::{Table, Value};

use super::Config;
use crate::storage::{Database, without_secrets};

/// What a secret shows as.
const ELIDED: &str = "[REDACTED]";

impl Config {
    /// The effective configuration as a TOML table (printable as TOML or JSON).
    pub fn effective(&self) -> Table {
        let mut root = Table::new();

        let mut server = Table::new();
        server.insert("listen".into(), text(self.listen.to_string()));
        server.insert("drain_timeout_ms".into(), millis(self.drain_timeout));
        server.insert(
            "max_concurrent_calls".into(),
            count(self.limits.max_concurrent),
        );
        server.insert("max_queued_calls".into(), count(self.limits.max_queued));
        server.insert(
            "worker_threads".into(),
            count(self.worker_threads(super::available_cores())),
        );
        if let Some(tls) = &self.tls {
            let mut table = Table::new();
            table.insert("cert_file".into(), path(&tls.paths.cert_file));
            table.insert("key_file".into(), path(&tls.paths.key_file));
            if let Some(ca) = &tls.paths.client_ca_file {
                table.insert("client_ca_file".into(), path(ca));
            }
            server.insert("tls".into(), Value::Table(table));
        }
        root.insert("server".into(), Value::Table(server));

        let mut storage = Table::new();
        match &self.database {
            Database::Sqlite(file) => {
                storage.insert("database".into(), path(file));
            }
            Database::Postgres { url, schema } => {
                storage.insert("database".into(), text(without_secrets(url)));
                if let Some(schema) = schema {
                    storage.insert("schema".into(), text(schema.clone()));
                }
            }
        }
        root.insert("storage".into(), Value::Table(storage));

        let mut auth = Table::new();
        auth.insert("admin_token_file".into(), path(&self.admin_token_file));
        root.insert("auth".into(), Value::Table(auth));

        let engine = &self.engine;
        let mut table = Table::new();
        table.insert("max_timeout_ms".into(), millis(engine.max_timeout));
        table.insert(
            "default_max_calls".into(),
            Value::Integer(engine.default_max_calls.into()),
        );
        table.insert(
            "max_calls_limit".into(),
            Value::Integer(engine.max_calls_limit.into()),
        );
        table.insert(
            "max_argument_bytes".into(),
            count(engine.max_argument_bytes),
        );
        table.insert("cache_ttl_ms".into(), millis(engine.cache_ttl));
        table.insert("pending_expiry_ms".into(), millis(engine.pending_expiry));
        table.insert(
            "answer_retention_ms".into(),
            millis(engine.answer_retention),
        );
        root.insert("engine".into(), Value::Table(table));

        let mut connectors = Table::new();
        connectors.insert("disabled".into(), texts(&self.disabled_connectors));
        let mut slack = Table::new();
        optional(
            &mut slack,
            "api_base_url",
            self.slack.api_base_url.as_deref(),
        );
        slack.insert("allow_hosts".into(), texts(&self.slack.allow_hosts));
        if let Some(hosts) = &self.slack.webhook_hosts {
            slack.insert("webhook_hosts".into(), texts(hosts));
        }
        connectors.insert("slack".into(), Value::Table(slack));
        let mut shopify = Table::new();
        optional(
            &mut shopify,
            "api_version",
            self.shopify.api_version.as_deref(),
        );
        shopify.insert("allow_hosts".into(), texts(&self.shopify.allow_hosts));
        connectors.insert("shopify".into(), Value::Table(shopify));
        let mut aws = Table::new();
        optional(&mut aws, "endpoint_url", self.aws.endpoint_url.as_deref());
        optional(
            &mut aws,
            "default_region",
            self.aws.default_region.as_deref(),
        );
        if let Some(n) = self.aws.max_concurrency {
            aws.insert("max_concurrency".into(), count(n));
        }
        if let Some(n) = self.aws.max_attempts {
            aws.insert("max_attempts".into(), Value::Integer(n.into()));
        }
        if let Some(n) = self.aws.page_size {
            aws.insert("page_size".into(), Value::Integer(n.into()));
        }
        connectors.insert("aws".into(), Value::Table(aws));
        root.insert("connectors".into(), Value::Table(connectors));

        let mut mcp = Table::new();
        mcp.insert("enabled".into(), Value::Boolean(self.mcp.enabled));
        mcp.insert("allowed_hosts".into(), texts(&self.mcp.allowed_hosts));
        mcp.insert("allowed_origins".into(), texts(&self.mcp.allowed_origins));
        root.insert("mcp".into(), Value::Table(mcp));

        let mut metrics = Table::new();
        let listen = self.metrics.listen.map(|address| address.to_string());
        optional(&mut metrics, "listen", listen.as_deref());
        root.insert("metrics".into(), Value::Table(metrics));

        let mut secrets = Table::new();
        secrets.insert("key_file".into(), path(&self.key_file));
        if self.master_keys.is_some() {
            // Not a file key: the keys came from TOOLGATE_MASTER_KEYS and the key file is unused.
            secrets.insert("master_keys".into(), text(ELIDED.to_owned()));
        }
        root.insert("secrets".into(), Value::Table(secrets));

        let console = &self.console;
        let mut table = Table::new();
        table.insert("enabled".into(), Value::Boolean(console.enabled));
        optional(&mut table, "public_url", console.public_url.as_deref());
        table.insert("allowed_origins".into(), texts(&console.allowed_origins));
        table.insert("session_idle_ms".into(), millis(console.session_idle));
        table.insert("session_max_ms".into(), millis(console.session_max));
        table.insert("client_link_ttl_ms".into(), millis(console.client_link_ttl));
        root.insert("console".into(), Value::Table(table));
        root
    }

    /// What an operator should know about this configuration before serving with it.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.tls.is_none() && !self.listen.ip().is_loopback() {
            warnings.push(format!(
                "server.listen is {} (not loopback) without [server.tls]: bearer tokens, arguments and results travel in clear text on the network; configure server.tls.cert_file and server.tls.key_file",
                self.listen
            ));
        }
        if self.mcp.enabled
            && !self.listen.ip().is_loopback()
            && self.mcp.configured_hosts().next().is_none()
        {
            warnings.push(format!(
                "server.listen is {} (not loopback) but mcp.allowed_hosts lists no host name: /mcp answers only requests addressed to localhost, 127.0.0.1 or ::1; list the names MCP clients use (e.g. mcp.allowed_hosts = [\"toolgate.example.com\"]) or set mcp.enabled = false",
                self.listen
            ));
        }
        warnings
    }
}

fn text(value: String) -> Value {
    Value::String(value)
}

fn path(value: &Path) -> Value {
    Value::String(value.display().to_string())
}

fn texts(values: &[String]) -> Value {
    Value::Array(values.iter().cloned().map(Value::String).collect())
}

fn optional(table: &mut Table, key: &str, value: Option<&str>) {
    if let Some(value) = value {
        table.insert(key.into(), Value::String(value.to_owned()));
    }
}

/// A count as TOML's integer (saturating: no configured count comes near `i64::MAX`).
fn count(value: usize) -> Value {
    Value::Integer(i64::try_from(value).unwrap_or(i64::MAX))
}

fn millis(value: Duration) -> Value {
    Value::Integer(i64::try_from(value.as_millis()).unwrap_or(i64::MAX))
}
