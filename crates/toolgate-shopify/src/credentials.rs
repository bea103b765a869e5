//! The tenant's `shopify_default` secret: the shop and how to authenticate to it, validated
//! before anything is sent.
//!
//! Accepted values (JSON objects):
//! - `{"shop": "acme.myshopify.com", "access_token": "shpat_..."}`: an Admin API access token
//!   of a custom app created in the store's admin (no longer creatable since 2026-01-01, but
//!   existing ones keep working);
//! - `{"shop": "acme.myshopify.com", "client_id": "...", "client_secret": "..."}`: an app
//!   created in the Dev Dashboard and installed on the store; the connector obtains 24-hour
//!   tokens with the client-credentials grant (`tokens.rs`).
//!
//! `shop` is the store's `*.myshopify.com` domain (`acme`, `acme.myshopify.com` and
//! `https://acme.myshopify.com` are the same store). Other hosts only when the operator lists
//! them in `allow_hosts` (tests), and then `http://host:port` is accepted too.

use serde_json::Value;
use toolgate_core::{ErrorCode, SecretValue, ToolError};
use url::Url;

use crate::config::ShopifyConfig;

/// The secret every Shopify tool declares.
pub const SECRET_NAME: &str = "shopify_default";

/// A validated store address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Shop {
    /// `https://acme.myshopify.com` (or `http://127.0.0.1:PORT` for an allowed test host).
    pub(crate) origin: String,
    /// `acme.myshopify.com` or `127.0.0.1:PORT`.
    pub(crate) key: String,
}

/// How the connector authenticates.
#[derive(Clone)]
pub(crate) enum Auth {
    /// A static Admin API access token.
    Token(SecretValue),
    /// The client-credentials grant.
    Client {
        client_id: String,
        client_secret: SecretValue,
    },
}

/// A validated credential. `Debug` never shows the token or the client secret.
#[derive(Clone)]
pub(crate) struct Credentials {
    pub(crate) shop: Shop,
    pub(crate) auth: Auth,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let auth = match &self.auth {
            Auth::Token(_) => "access_token",
            Auth::Client { .. } => "client_credentials",
        };
        f.debug_struct("Credentials")
            .field("shop", &self.shop.key)
            .field("auth", &auth)
            .finish()
    }
}

impl Credentials {
    /// The key of the cost bucket this credential draws on: Shopify keeps one per app and
    /// store, so two tenants using the same app on the same store share one, and different
    /// apps on one store do not. A static token stands for its app by a fingerprint (kept in
    /// memory only, never shown).
    pub(crate) fn bucket_key(&self) -> String {
        let app = match &self.auth {
            Auth::Client { client_id, .. } => format!("client:{client_id}"),
            Auth::Token(token) => {
                use std::hash::{Hash as _, Hasher as _};
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                token.expose().hash(&mut hasher);
                format!("token:{:016x}", hasher.finish())
            }
        };
        format!("{} {app}", self.shop.key)
    }

    /// Parses and validates the secret's value. Messages never repeat a token or secret.
    pub(crate) fn parse(value: &str, config: &ShopifyConfig) -> Result<Credentials, ToolError> {
        let Ok(Value::Object(fields)) = serde_json::from_str::<Value>(value.trim()) else {
            return Err(bad_secret(
                "it is not a JSON object; expected {\"shop\": \"acme.myshopify.com\", \"access_token\": \"shpat_...\"} or {\"shop\": \"acme.myshopify.com\", \"client_id\": \"...\", \"client_secret\": \"...\"}",
            ));
        };
        let mut shop = None;
        let mut access_token = None;
        let mut client_id = None;
        let mut client_secret = None;
        for (key, field) in &fields {
            let Some(text) = field.as_str() else {
                return Err(bad_secret(&format!("`{key}` must be a string")));
            };
            match key.as_str() {
                "shop" => shop = Some(text),
                "access_token" => access_token = Some(text),
                "client_id" => client_id = Some(text),
                "client_secret" => client_secret = Some(text),
                other => {
                    let key: String = other.chars().take(40).collect();
                    return Err(bad_secret(&format!(
                        "unknown key `{key}`; the keys are shop, access_token, client_id and client_secret"
                    )));
                }
            }
        }
        let Some(shop) = shop else {
            return Err(bad_secret(
                "it has no `shop`; give the store's domain such as acme.myshopify.com",
            ));
        };
        let shop = parse_shop(shop, config)?;
        let auth = match (access_token, client_id, client_secret) {
            (Some(token), None, None) => Auth::Token(check_token(token)?),
            (None, Some(id), Some(secret)) => Auth::Client {
                client_id: check_client_id(id)?,
                client_secret: check_client_secret(secret)?,
            },
            (Some(_), _, _) => {
                return Err(bad_secret(
                    "give either access_token or client_id with client_secret, not both",
                ));
            }
            (None, Some(_), None) => return Err(bad_secret("client_id needs client_secret")),
            (None, None, Some(_)) => return Err(bad_secret("client_secret needs client_id")),
            (None, None, None) => {
                return Err(bad_secret(
                    "it has neither an access_token nor client_id and client_secret",
                ));
            }
        };
        Ok(Credentials { shop, auth })
    }
}

/// Why a stored credential is unusable; the operator fixes it with `toolgate secrets put`.
fn bad_secret(reason: &str) -> ToolError {
    ToolError::new(
        ErrorCode::CredentialsNotFound,
        format!(
            "the tenant's `{SECRET_NAME}` secret is not a usable Shopify credential: {reason}; nothing was sent to Shopify"
        ),
    )
}

/// The shop: a `*.myshopify.com` domain, or an allowed test host.
pub(crate) fn parse_shop(text: &str, config: &ShopifyConfig) -> Result<Shop, ToolError> {
    let text = text.trim().trim_end_matches('/');
    let with_scheme = if text.contains("://") {
        text.to_owned()
    } else if text.contains('.') || text.contains(':') {
        format!("https://{text}")
    } else {
        format!("https://{text}.myshopify.com")
    };
    let shown: String = text.chars().take(80).collect();
    let outside = || {
        ToolError::new(
            ErrorCode::InvalidArguments,
            format!(
                "the tenant's `{SECRET_NAME}` secret names the shop `{shown}`, which is not a store domain such as acme.myshopify.com; an operator must correct the secret; nothing was sent to Shopify"
            ),
        )
    };
    let Ok(url) = Url::parse(&with_scheme) else {
        return Err(outside());
    };
    let host = url.host_str().unwrap_or("").to_ascii_lowercase();
    let allowed = config
        .allow_hosts
        .iter()
        .any(|h| h.eq_ignore_ascii_case(&host));
    let plain = url.username().is_empty()
        && url.password().is_none()
        && url.query().is_none()
        && url.fragment().is_none()
        && matches!(url.path(), "" | "/");
    if !plain {
        return Err(outside());
    }
    if allowed {
        if !matches!(url.scheme(), "http" | "https") {
            return Err(outside());
        }
        let key = match url.port() {
            Some(port) => format!("{host}:{port}"),
            None => host.clone(),
        };
        return Ok(Shop {
            origin: format!("{}://{key}", url.scheme()),
            key,
        });
    }
    let is_store = host.strip_suffix(".myshopify.com").is_some_and(|name| {
        !name.is_empty()
            && name.len() <= 60
            && !name.starts_with('-')
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
    });
    if !is_store || url.scheme() != "https" || url.port().is_some() {
        return Err(outside());
    }
    Ok(Shop {
        origin: format!("https://{host}"),
        key: host,
    })
}

fn check_token(token: &str) -> Result<SecretValue, ToolError> {
    let token = token.trim();
    if token.starts_with("shpss_") {
        return Err(bad_secret(
            "access_token is an app's shared secret (shpss_), not an access token; store the Admin API access token (shpat_...) or use client_id and client_secret",
        ));
    }
    let well_formed = token.len() >= 20
        && token.len() <= 512
        && token
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !well_formed {
        return Err(bad_secret(
            "access_token is not an Admin API access token (shpat_...)",
        ));
    }
    Ok(SecretValue::new(token))
}

fn check_client_id(id: &str) -> Result<String, ToolError> {
    let id = id.trim();
    let well_formed = !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !well_formed {
        return Err(bad_secret(
            "client_id is not an app's client ID (letters and digits, from the Dev Dashboard)",
        ));
    }
    Ok(id.to_owned())
}

fn check_client_secret(secret: &str) -> Result<SecretValue, ToolError> {
    let secret = secret.trim();
    let well_formed =
        secret.len() >= 16 && secret.len() <= 512 && secret.bytes().all(|b| b.is_ascii_graphic());
    if !well_formed {
        return Err(bad_secret(
            "client_secret is not an app's client secret (from the Dev Dashboard)",
        ));
    }
    Ok(SecretValue::new(secret))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "shpat_0123456789abcdef0123456789abcdef";

    fn config() -> ShopifyConfig {
        ShopifyConfig::default()
    }

    #[test]
    fn shops_are_normalized() {
        for (text, origin) in [
            ("acme", "https://acme.myshopify.com"),
            ("acme.myshopify.com", "https://acme.myshopify.com"),
            ("https://ACME.myshopify.com/", "https://acme.myshopify.com"),
            (
                "my-store-2.myshopify.com",
                "https://my-store-2.myshopify.com",
            ),
        ] {
            let shop = parse_shop(text, &config()).unwrap();
            assert_eq!(shop.origin, origin, "{text}");
        }
    }

    #[test]
    fn shops_outside_myshopify_are_refused() {
        for text in [
            "acme.example.com",
            "http://acme.myshopify.com",
            "https://acme.myshopify.com:8443",
            "https://acme.myshopify.com/admin",
            "https://user@acme.myshopify.com",
            "myshopify.com",
            ".myshopify.com",
            "-x.myshopify.com",
            "acme.myshopify.com.evil.net",
            "127.0.0.1:8080",
            "http://169.254.169.254",
            "",
        ] {
            let err = parse_shop(text, &config()).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidArguments, "{text}");
            assert!(err.message.contains("nothing was sent"), "{}", err.message);
        }
    }

    #[test]
    fn allowed_test_hosts_may_use_http_and_a_port() {
        let config = ShopifyConfig {
            allow_hosts: vec!["127.0.0.1".into()],
            ..ShopifyConfig::default()
        };
        let shop = parse_shop("http://127.0.0.1:4000", &config).unwrap();
        assert_eq!(shop.origin, "http://127.0.0.1:4000");
        assert_eq!(shop.key, "127.0.0.1:4000");
        assert!(parse_shop("http://127.0.0.2:4000", &config).is_err());
    }

    #[test]
    fn buckets_are_per_app_and_store() {
        let parse = |v: serde_json::Value| Credentials::parse(&v.to_string(), &config()).unwrap();
        let a = parse(serde_json::json!({"shop": "acme", "access_token": TOKEN}));
        let same = parse(serde_json::json!({"shop": "acme.myshopify.com", "access_token": TOKEN}));
        let other_app =
            parse(serde_json::json!({"shop": "acme", "access_token": format!("{TOKEN}x")}));
        let other_shop = parse(serde_json::json!({"shop": "globex", "access_token": TOKEN}));
        assert_eq!(a.bucket_key(), same.bucket_key());
        assert_ne!(a.bucket_key(), other_app.bucket_key());
        assert_ne!(a.bucket_key(), other_shop.bucket_key());
        assert!(!a.bucket_key().contains(TOKEN));
    }

    #[test]
    fn accepted_forms() {
        let token = Credentials::parse(
            &format!(r#"{{"shop": "acme", "access_token": "{TOKEN}"}}"#),
            &config(),
        )
        .unwrap();
        assert!(matches!(token.auth, Auth::Token(_)));
        let client = Credentials::parse(
            r#"{"shop": "acme.myshopify.com", "client_id": "3f1c2a9b8e7d", "client_secret": "0123456789abcdef0123"}"#,
            &config(),
        )
        .unwrap();
        assert!(matches!(client.auth, Auth::Client { .. }));
        assert!(!format!("{client:?}").contains("0123456789abcdef0123"));
    }

    #[test]
    fn refused_forms_say_why_and_never_echo_the_value() {
        let cases = [
            (TOKEN.to_owned(), "not a JSON object"),
            (format!(r#"{{"access_token": "{TOKEN}"}}"#), "has no `shop`"),
            (r#"{"shop": "acme"}"#.to_owned(), "neither an access_token"),
            (
                r#"{"shop": "acme", "access_token": "shpss_0123456789abcdef0123456789"}"#
                    .to_owned(),
                "shared secret",
            ),
            (
                r#"{"shop": "acme", "access_token": "short"}"#.to_owned(),
                "not an Admin API access token",
            ),
            (
                r#"{"shop": "acme", "client_id": "abc"}"#.to_owned(),
                "needs client_secret",
            ),
            (
                format!(
                    r#"{{"shop": "acme", "access_token": "{TOKEN}", "client_id": "a", "client_secret": "0123456789abcdef0"}}"#
                ),
                "not both",
            ),
            (
                format!(r#"{{"shop": "acme", "token": "{TOKEN}"}}"#),
                "unknown key `token`",
            ),
            (r#"{"shop": 5}"#.to_owned(), "must be a string"),
        ];
        for (value, expected) in cases {
            let err = Credentials::parse(&value, &config()).unwrap_err();
            assert_eq!(err.code, ErrorCode::CredentialsNotFound, "{value}");
            assert!(err.message.contains(expected), "{value}: {}", err.message);
            assert!(!err.message.contains(TOKEN), "{value} echoed");
        }
    }
}
