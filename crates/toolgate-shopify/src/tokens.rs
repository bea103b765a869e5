//! Access tokens from the client-credentials grant, cached per tenant and store.
//!
//! `POST https://{shop}/admin/oauth/access_token` with `grant_type=client_credentials`, the
//! app's `client_id` and `client_secret` answers `{access_token, scope, expires_in}`; the token
//! lasts 24 hours. It is kept in memory only (zeroized when dropped, never logged), reused
//! until `token_refresh_margin` before it expires (and only for the client secret it was
//! obtained with), fetched by one call at a time per key while
//! the others wait for it, and dropped when Shopify answers 401 to it (the caller then fetches
//! a new one once).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tokio::time::Instant;
use toolgate_core::{ErrorCode, SecretValue, TenantId, ToolError};
use toolgate_http::{HttpClient, Request};

use crate::credentials::{SECRET_NAME, Shop};
use crate::errors::transport_error;

/// Whose token: the tenant, the store and the app.
type Key = (String, String, String);

/// The cache. One per connector.
#[derive(Debug)]
pub(crate) struct TokenCache {
    margin: Duration,
    slots: Mutex<HashMap<Key, Arc<tokio::sync::Mutex<Option<Cached>>>>>,
}

#[derive(Debug)]
struct Cached {
    token: SecretValue,
    refresh_at: Instant,
    /// The client secret the token was obtained with: a different one (rotated, or wrong)
    /// never gets this token.
    client_secret: SecretValue,
}

/// A token and how many requests it took to get it (0 when cached).
#[derive(Debug)]
pub(crate) struct Obtained {
    pub(crate) token: SecretValue,
    pub(crate) attempts: u32,
}

impl TokenCache {
    pub(crate) fn new(margin: Duration) -> TokenCache {
        TokenCache {
            margin,
            slots: Mutex::new(HashMap::new()),
        }
    }

    /// A valid token for the app on the store: the cached one, or a new one from Shopify.
    pub(crate) async fn token(
        &self,
        http: &HttpClient,
        tenant: &TenantId,
        shop: &Shop,
        client_id: &str,
        client_secret: &SecretValue,
        deadline: Instant,
    ) -> Result<Obtained, ToolError> {
        let slot = self.slot(tenant, shop, client_id);
        let mut cached = slot.lock().await;
        if let Some(entry) = cached.as_ref()
            && Instant::now() < entry.refresh_at
            && entry.client_secret.expose() == client_secret.expose()
        {
            return Ok(Obtained {
                token: entry.token.clone(),
                attempts: 0,
            });
        }
        let (token, expires_in, attempts) =
            fetch(http, shop, client_id, client_secret, deadline).await?;
        let refresh_at = Instant::now() + expires_in.saturating_sub(self.margin);
        *cached = Some(Cached {
            token: token.clone(),
            refresh_at,
            client_secret: client_secret.clone(),
        });
        Ok(Obtained { token, attempts })
    }

    /// Forgets `token` (Shopify refused it) unless a newer one already replaced it.
    pub(crate) async fn forget(
        &self,
        tenant: &TenantId,
        shop: &Shop,
        client_id: &str,
        token: &SecretValue,
    ) {
        let slot = self.slot(tenant, shop, client_id);
        let mut cached = slot.lock().await;
        if cached
            .as_ref()
            .is_some_and(|entry| entry.token.expose() == token.expose())
        {
            *cached = None;
        }
    }

    fn slot(
        &self,
        tenant: &TenantId,
        shop: &Shop,
        client_id: &str,
    ) -> Arc<tokio::sync::Mutex<Option<Cached>>> {
        let key = (
            tenant.as_str().to_owned(),
            shop.key.clone(),
            client_id.to_owned(),
        );
        let mut slots = self.slots.lock().expect("token cache lock");
        Arc::clone(slots.entry(key).or_default())
    }
}

/// One client-credentials grant.
async fn fetch(
    http: &HttpClient,
    shop: &Shop,
    client_id: &str,
    client_secret: &SecretValue,
    deadline: Instant,
) -> Result<(SecretValue, Duration, u32), ToolError> {
    let body = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("grant_type", "client_credentials")
        .append_pair("client_id", client_id)
        .append_pair("client_secret", client_secret.expose())
        .finish();
    let request = Request::post(format!("{}/admin/oauth/access_token", shop.origin))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("accept", "application/json")
        .body(body)
        // Asking for a token twice only yields two tokens; retrying is safe.
        .idempotent(true);
    let response = match http.send(request, deadline).await {
        Ok(response) => response,
        Err(error) => {
            let refused = error
                .response()
                .filter(|r| matches!(r.status.as_u16(), 400 | 401 | 403 | 404))
                .map(|r| (r.status.as_u16(), oauth_error(&r.body)));
            return Err(match refused {
                Some((status, name)) => ToolError::new(
                    ErrorCode::CredentialsNotFound,
                    format!(
                        "{name}: Shopify refused the client credentials in the tenant's `{SECRET_NAME}` secret (HTTP {status}); the app must be installed on the store and its client_id and client_secret current; nothing else was sent"
                    ),
                )
                .with_attempts(error.attempts()),
                None => transport_error(&error, "the token request"),
            });
        }
    };
    let answer: Value = serde_json::from_slice(&response.body).unwrap_or(Value::Null);
    let token = answer
        .get("access_token")
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty());
    let Some(token) = token else {
        return Err(ToolError::new(
            ErrorCode::VendorError,
            "Shopify's token endpoint answered without an access_token",
        )
        .with_attempts(response.attempts));
    };
    // Shopify documents 24 hours; a missing or odd value is taken as that.
    let expires_in = answer
        .get("expires_in")
        .and_then(Value::as_u64)
        .map_or(Duration::from_secs(86_399), Duration::from_secs);
    Ok((SecretValue::new(token), expires_in, response.attempts))
}

/// The OAuth error name in a refusal body (`{"error": "invalid_client", ...}`), if it is one.
fn oauth_error(body: &[u8]) -> String {
    let answer: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let name = answer.get("error").and_then(Value::as_str).unwrap_or("");
    let plain = !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if plain {
        name.to_owned()
    } else {
        "invalid_client".to_owned()
    }
}
