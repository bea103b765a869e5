//! The tenant's `slack_default` secret: a bot token, an incoming-webhook URL, or both (with an
//! optional Web API base override), validated before anything is sent.
//!
//! Accepted values:
//! - a bare bot token `xoxb-...`;
//! - a bare incoming-webhook URL `https://hooks.slack.com/services/...`;
//! - a JSON object `{"bot_token": "...", "webhook_url": "...", "base_url": "..."}`, every key
//!   optional but at least one of the first two present.
//!
//! User tokens (`xoxp-`) are refused on purpose: they act as a person with that person's whole
//! reach, while the audit trail would record a bot. App-level (`xapp-`) and legacy tokens
//! cannot call `chat.postMessage` at all.

use serde_json::Value;
use toolgate_core::{ErrorCode, SecretValue, ToolError};
use url::Url;

use crate::config::SlackConfig;

/// The secret every Slack tool declares.
pub const SECRET_NAME: &str = "slack_default";

/// A validated credential set. `Debug` never shows the token or the webhook URL.
#[derive(Clone)]
pub(crate) struct Credentials {
    /// A bot token for the Web API; wins over the webhook when both are present.
    pub(crate) bot_token: Option<SecretValue>,
    /// An incoming-webhook URL (post-only delivery to the webhook's own channel).
    pub(crate) webhook_url: Option<SecretValue>,
    /// The Web API base for this tenant, when it overrides the connector's.
    pub(crate) api_base_url: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("bot_token", &self.bot_token.is_some())
            .field("webhook_url", &self.webhook_url.is_some())
            .field("api_base_url", &self.api_base_url)
            .finish()
    }
}

impl Credentials {
    /// Parses and validates the secret's value. Messages never repeat the value.
    pub(crate) fn parse(value: &str, config: &SlackConfig) -> Result<Credentials, ToolError> {
        let value = value.trim();
        if value.starts_with('{') {
            return Credentials::parse_json(value, config);
        }
        if value.starts_with("https://") || value.starts_with("http://") {
            let webhook = check_webhook_url(value, config)?;
            return Ok(Credentials {
                bot_token: None,
                webhook_url: Some(webhook),
                api_base_url: None,
            });
        }
        Ok(Credentials {
            bot_token: Some(check_bot_token(value)?),
            webhook_url: None,
            api_base_url: None,
        })
    }

    fn parse_json(text: &str, config: &SlackConfig) -> Result<Credentials, ToolError> {
        let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(text) else {
            return Err(bad_secret(
                "it starts with `{` but is not a JSON object; expected {\"bot_token\": \"xoxb-...\", \"webhook_url\": \"https://hooks.slack.com/services/...\", \"base_url\": \"...\"}",
            ));
        };
        let mut credentials = Credentials {
            bot_token: None,
            webhook_url: None,
            api_base_url: None,
        };
        for (key, value) in &fields {
            let Some(text) = value.as_str() else {
                return Err(bad_secret(&format!("`{key}` must be a string")));
            };
            match key.as_str() {
                "bot_token" => credentials.bot_token = Some(check_bot_token(text)?),
                "webhook_url" => {
                    credentials.webhook_url = Some(check_webhook_url(text, config)?);
                }
                "base_url" => {
                    credentials.api_base_url = Some(check_base_url(text, config)?);
                }
                other => {
                    let key: String = other.chars().take(40).collect();
                    return Err(bad_secret(&format!(
                        "unknown key `{key}`; the keys are bot_token, webhook_url and base_url"
                    )));
                }
            }
        }
        if credentials.bot_token.is_none() && credentials.webhook_url.is_none() {
            return Err(bad_secret("it holds neither a bot_token nor a webhook_url"));
        }
        Ok(credentials)
    }
}

/// Why a stored credential is unusable; the operator fixes it with `toolgate secrets put`.
fn bad_secret(reason: &str) -> ToolError {
    ToolError::new(
        ErrorCode::CredentialsNotFound,
        format!(
            "the tenant's `{SECRET_NAME}` secret is not a usable Slack credential: {reason}; nothing was sent to Slack"
        ),
    )
}

fn check_bot_token(token: &str) -> Result<SecretValue, ToolError> {
    let token = token.trim();
    let well_formed = token.len() > 10
        && token
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
    if token.starts_with("xoxb-") && well_formed {
        return Ok(SecretValue::new(token));
    }
    let reason = if token.starts_with("xoxp-") {
        "it is a user token (xoxp-), which acts as a person; store a bot token (xoxb-) instead"
    } else if token.starts_with("xapp-") {
        "it is an app-level token (xapp-), which cannot post or read messages; store a bot token (xoxb-)"
    } else if token.starts_with("xox") {
        "it is a Slack token of a kind this connector does not use; store a bot token (xoxb-)"
    } else if token.starts_with("xoxb-") {
        "the bot token is malformed"
    } else {
        "expected a bot token (xoxb-...), an incoming-webhook URL (https://hooks.slack.com/services/...) or a JSON object with bot_token / webhook_url"
    };
    Err(bad_secret(reason))
}

fn check_webhook_url(text: &str, config: &SlackConfig) -> Result<SecretValue, ToolError> {
    let Ok(url) = Url::parse(text.trim()) else {
        return Err(bad_secret("the webhook URL does not parse as a URL"));
    };
    let host = url.host_str().unwrap_or("").to_ascii_lowercase();
    let host_allowed = config
        .webhook_hosts
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(&host));
    if !host_allowed {
        return Err(bad_secret(&format!(
            "the webhook URL is not a Slack incoming webhook (its host must be {})",
            config.webhook_hosts.join(" or ")
        )));
    }
    check_scheme(&url, &host, config, "webhook URL")?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad_secret(
            "the webhook URL must not carry user information",
        ));
    }
    let segments: Vec<&str> = url
        .path_segments()
        .map(|s| s.filter(|p| !p.is_empty()).collect())
        .unwrap_or_default();
    if segments.first() != Some(&"services") || segments.len() < 4 {
        return Err(bad_secret(
            "the webhook URL is not a Slack incoming webhook (expected /services/T.../B.../...)",
        ));
    }
    Ok(SecretValue::new(url.as_str()))
}

fn check_base_url(text: &str, config: &SlackConfig) -> Result<String, ToolError> {
    let Ok(url) = Url::parse(text.trim()) else {
        return Err(bad_secret("base_url does not parse as a URL"));
    };
    let host = url.host_str().unwrap_or("").to_ascii_lowercase();
    check_scheme(&url, &host, config, "base_url")?;
    if url.query().is_some() || !url.username().is_empty() || url.password().is_some() {
        return Err(bad_secret(
            "base_url must be a plain https URL such as https://slack.com/api",
        ));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// `https` always; `http` only for hosts the SSRF guard is told to allow (tests, loopback).
fn check_scheme(url: &Url, host: &str, config: &SlackConfig, what: &str) -> Result<(), ToolError> {
    let allowed_plain = config
        .allow_hosts
        .iter()
        .any(|allowed| allowed.eq_ignore_ascii_case(host));
    match url.scheme() {
        "https" => Ok(()),
        "http" if allowed_plain => Ok(()),
        _ => Err(bad_secret(&format!("the {what} must use https"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> SlackConfig {
        SlackConfig::default()
    }

    #[test]
    fn accepted_forms() {
        let bot = Credentials::parse("xoxb-1111-2222-abcdefABCDEF", &config()).unwrap();
        assert!(bot.bot_token.is_some() && bot.webhook_url.is_none());
        let hook = Credentials::parse(
            "https://hooks.slack.com/services/T000/B000/XXXXXXXX\n",
            &config(),
        )
        .unwrap();
        assert!(hook.bot_token.is_none() && hook.webhook_url.is_some());
        let both = Credentials::parse(
            r#"{"bot_token": "xoxb-1111-2222-abcdef", "webhook_url": "https://hooks.slack.com/services/T/B/X", "base_url": "https://acme.enterprise.slack.com/api/"}"#,
            &config(),
        )
        .unwrap();
        assert!(both.bot_token.is_some() && both.webhook_url.is_some());
        assert_eq!(
            both.api_base_url.as_deref(),
            Some("https://acme.enterprise.slack.com/api")
        );
    }

    #[test]
    fn refused_forms_say_why_and_never_echo_the_value() {
        let cases = [
            ("xoxp-1111-2222-abcdef", "user token"),
            ("xapp-1-A111-2222-abcdef", "app-level token"),
            ("xoxa-2-1111-abcdef", "kind this connector does not use"),
            ("ghp_abcdefabcdefabcdef", "expected a bot token"),
            (
                "https://example.com/services/T/B/X",
                "not a Slack incoming webhook",
            ),
            ("http://hooks.slack.com/services/T/B/X", "must use https"),
            ("https://hooks.slack.com/api/x", "expected /services/"),
            ("{\"bot_token\": 5}", "must be a string"),
            ("{\"token\": \"xoxb-1111-2222\"}", "unknown key `token`"),
            (
                "{\"base_url\": \"https://slack.com/api\"}",
                "neither a bot_token",
            ),
            ("{nope", "not a JSON object"),
            (
                "{\"bot_token\": \"xoxb-1111-2222-x\", \"base_url\": \"http://10.0.0.1/api\"}",
                "must use https",
            ),
        ];
        for (value, expected) in cases {
            let err = Credentials::parse(value, &config()).unwrap_err();
            assert_eq!(err.code, ErrorCode::CredentialsNotFound, "{value}");
            assert!(err.message.contains(expected), "{value}: {}", err.message);
            assert!(err.message.contains("nothing was sent"), "{}", err.message);
            assert!(!err.message.contains(value), "{value} echoed");
        }
    }

    #[test]
    fn test_hosts_are_accepted_only_when_configured() {
        let url = "http://127.0.0.1:4000/services/T/B/X";
        assert!(Credentials::parse(url, &config()).is_err());
        let config = SlackConfig {
            webhook_hosts: vec!["127.0.0.1".into()],
            allow_hosts: vec!["127.0.0.1".into()],
            ..SlackConfig::default()
        };
        assert!(Credentials::parse(url, &config).is_ok());
    }

    #[test]
    fn debug_hides_secrets() {
        let both = Credentials::parse(
            r#"{"bot_token": "xoxb-1111-2222-abcdef", "webhook_url": "https://hooks.slack.com/services/T/B/SECRETPART"}"#,
            &config(),
        )
        .unwrap();
        let shown = format!("{both:?}");
        assert!(
            !shown.contains("xoxb") && !shown.contains("SECRETPART"),
            "{shown}"
        );
    }
}
