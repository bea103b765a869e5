//! The connector's configuration, given by the gateway from its `[connectors.slack]` table.

use std::time::Duration;

/// Slack's Web API, used unless the gateway or a tenant's secret says otherwise.
pub const DEFAULT_API_BASE_URL: &str = "https://slack.com/api";

/// The host Slack issues incoming-webhook URLs on.
pub const DEFAULT_WEBHOOK_HOST: &str = "hooks.slack.com";

/// How the connector reaches Slack. Passed in explicitly; nothing is read from the environment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SlackConfig {
    /// The Web API base (`https://slack.com/api`); a tenant's secret may override it (Enterprise
    /// Grid, tests).
    pub api_base_url: String,
    /// Hosts an incoming-webhook URL may point at. Default `hooks.slack.com` only.
    pub webhook_hosts: Vec<String>,
    /// Hosts exempt from the SSRF guard's address check (tests add `127.0.0.1`). Empty by
    /// default: loopback and private addresses are refused. Plain `http` is accepted only for
    /// these hosts.
    pub allow_hosts: Vec<String>,
    /// The most `conversations.history` pages one call follows. Default 10.
    pub max_history_pages: u32,
    /// The longest `Retry-After` honoured when retrying channel history; Slack asking for more
    /// fails the call at once as rate limited. Default 10 s.
    pub max_retry_wait: Duration,
}

impl Default for SlackConfig {
    fn default() -> SlackConfig {
        SlackConfig {
            api_base_url: DEFAULT_API_BASE_URL.to_owned(),
            webhook_hosts: vec![DEFAULT_WEBHOOK_HOST.to_owned()],
            allow_hosts: Vec::new(),
            max_history_pages: 10,
            max_retry_wait: Duration::from_secs(10),
        }
    }
}
