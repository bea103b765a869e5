//! One Admin GraphQL query, end to end: the token (static, or from the client-credentials
//! cache), admission by the cost limiter, the POST through `toolgate-http`, and the answer read
//! whatever its HTTP status: `THROTTLED` in the body (with 200 or 429) is paced and retried
//! once, a 401 to a client-credentials token fetches a new token once, everything else becomes
//! a stable error.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;
use toolgate_core::{ErrorCode, InvocationContext, SecretValue, ToolError};
use toolgate_http::{HttpClient, Request};

use crate::credentials::{Auth, Credentials};
use crate::errors::{graphql_error, status_error, transport_error};
use crate::queries::{Query, with_fragments};
use crate::throttle::{CostLimiter, CostReport, RateLimited};
use crate::tokens::TokenCache;

/// How long to wait before retrying a throttled query when Shopify said nothing about its
/// bucket (a bare 429): what Shopify's own clients wait.
const BLIND_THROTTLE_WAIT: Duration = Duration::from_secs(1);

/// The Admin API client shared by every call of the connector.
#[derive(Debug)]
pub(crate) struct Admin {
    pub(crate) http: HttpClient,
    pub(crate) limiter: Arc<CostLimiter>,
    pub(crate) tokens: TokenCache,
    pub(crate) api_version: String,
}

/// A successful answer's `data`, and the requests it took.
#[derive(Debug)]
pub(crate) struct Answer {
    pub(crate) data: Value,
    pub(crate) attempts: u32,
}

impl Admin {
    /// Runs `query` with `variables` against the tenant's store.
    pub(crate) async fn query(
        &self,
        ctx: &InvocationContext,
        credentials: &Credentials,
        query: &Query,
        variables: Value,
        attempts_before: u32,
    ) -> Result<Answer, ToolError> {
        let deadline = Instant::from_std(ctx.deadline);
        let url = format!(
            "{}/admin/api/{}/graphql.json",
            credentials.shop.origin, self.api_version
        );
        let body = json!({"query": with_fragments(query), "variables": variables}).to_string();
        let mut attempts = attempts_before;
        let bucket = credentials.bucket_key();
        let mut throttled_once = false;
        let mut refreshed = false;
        loop {
            let token = self
                .token(ctx, credentials, deadline, &mut attempts)
                .await?;
            let admitted = self
                .limiter
                .admit(&bucket, &query.key, query.estimate, deadline)
                .await;
            let permit = match admitted {
                Ok(permit) => permit,
                Err(limited) => return Err(rate_limited(limited).with_attempts(attempts)),
            };
            let request = Request::post(url.clone())
                .header("x-shopify-access-token", token.expose())
                .header("content-type", "application/json")
                .header("accept", "application/json")
                .body(body.clone())
                // Queries read only; the HTTP client may retry 5xx and connection failures.
                .idempotent(true);
            let (status, payload) = match self.http.send(request, deadline).await {
                Ok(response) => {
                    attempts += response.attempts;
                    (response.status.as_u16(), response.body)
                }
                Err(error) => match error.response() {
                    Some(response) => {
                        attempts += error.attempts();
                        (response.status.as_u16(), response.body.clone())
                    }
                    None => {
                        permit.settle(None);
                        let failed = transport_error(&error, "the query");
                        return Err(failed.with_attempts(attempts + error.attempts()));
                    }
                },
            };
            let answer: Option<Value> = serde_json::from_slice(&payload).ok();
            let report = answer.as_ref().and_then(CostReport::from_answer);
            permit.settle(report);

            let throttled = answer.as_ref().is_some_and(is_throttled);
            if throttled || status == 429 {
                if throttled_once {
                    return Err(ToolError::new(
                        ErrorCode::VendorRateLimited,
                        "THROTTLED: Shopify refused the query twice for the store's spent query-cost budget (another client of the app may be using it); try again shortly",
                    )
                    .with_attempts(attempts));
                }
                throttled_once = true;
                if report.is_none() {
                    // Nothing to compute the wait from: wait as Shopify's clients do, if the
                    // deadline allows.
                    if Instant::now() + BLIND_THROTTLE_WAIT > deadline {
                        let limited = RateLimited {
                            wait: BLIND_THROTTLE_WAIT,
                        };
                        return Err(rate_limited(limited).with_attempts(attempts));
                    }
                    tokio::time::sleep(BLIND_THROTTLE_WAIT).await;
                }
                // The limiter now knows the bucket from the refusal and waits just long enough.
                continue;
            }
            if status == 401
                && let Auth::Client { client_id, .. } = &credentials.auth
                && !refreshed
            {
                refreshed = true;
                self.tokens
                    .forget(&ctx.tenant, &credentials.shop, client_id, &token)
                    .await;
                continue;
            }
            if status >= 400 {
                return Err(status_error(status, &payload).with_attempts(attempts));
            }
            let Some(answer) = answer else {
                return Err(ToolError::new(
                    ErrorCode::VendorError,
                    "BAD_RESPONSE: Shopify answered with something that is not JSON",
                )
                .with_attempts(attempts));
            };
            let errors = answer
                .get("errors")
                .and_then(Value::as_array)
                .filter(|errors| !errors.is_empty());
            if let Some(errors) = errors {
                let partial = answer.get("data").is_some_and(|d| !d.is_null());
                return Err(graphql_error(errors, partial).with_attempts(attempts));
            }
            let data = answer.get("data").cloned().unwrap_or(Value::Null);
            if !data.is_object() {
                return Err(ToolError::new(
                    ErrorCode::VendorError,
                    "BAD_RESPONSE: Shopify answered without data",
                )
                .with_attempts(attempts));
            }
            return Ok(Answer { data, attempts });
        }
    }

    async fn token(
        &self,
        ctx: &InvocationContext,
        credentials: &Credentials,
        deadline: Instant,
        attempts: &mut u32,
    ) -> Result<SecretValue, ToolError> {
        match &credentials.auth {
            Auth::Token(token) => Ok(token.clone()),
            Auth::Client {
                client_id,
                client_secret,
            } => {
                let obtained = self
                    .tokens
                    .token(
                        &self.http,
                        &ctx.tenant,
                        &credentials.shop,
                        client_id,
                        client_secret,
                        deadline,
                    )
                    .await
                    .map_err(|e| {
                        let made = e.attempts.unwrap_or(0);
                        e.with_attempts(*attempts + made)
                    })?;
                *attempts += obtained.attempts;
                Ok(obtained.token)
            }
        }
    }
}

/// Whether an answer is Shopify's `THROTTLED` refusal.
fn is_throttled(answer: &Value) -> bool {
    answer
        .get("errors")
        .and_then(Value::as_array)
        .is_some_and(|errors| {
            errors
                .iter()
                .any(|e| e.pointer("/extensions/code").and_then(Value::as_str) == Some("THROTTLED"))
        })
}

/// The proactive refusal: the bucket cannot refill in time.
fn rate_limited(limited: RateLimited) -> ToolError {
    if limited.wait.is_zero() {
        return ToolError::new(
            ErrorCode::VendorRateLimited,
            "THROTTLED: the store's first answer, which tells its query-cost budget, did not come before this call's deadline; nothing was sent; try again",
        );
    }
    let seconds = limited.wait.as_secs_f64();
    ToolError::new(
        ErrorCode::VendorRateLimited,
        format!(
            "THROTTLED: the store's Shopify query-cost budget needs {seconds:.1} s to refill for this query, longer than this call may take; nothing was sent; try again in {} s",
            limited.wait.as_secs().max(1)
        ),
    )
}
