//! The `shopify` connector: arguments checked, the tenant's credential resolved, then one or
//! two Admin GraphQL queries and the normalized result.

use std::sync::Arc;

use serde_json::{Value, json};
use toolgate_core::{
    Connector, ErrorCode, InvocationContext, ToolError, ToolName, ToolOutput, ToolSpec,
};
use toolgate_http::{HttpClient, HttpObserver, NoHttpObserver, RetryPolicy, VendorConfig};

use crate::admin::Admin;
use crate::config::{ShopifyConfig, is_stable_version};
use crate::credentials::{Credentials, SECRET_NAME};
use crate::normalize;
use crate::queries;
use crate::throttle::CostLimiter;
use crate::tokens::TokenCache;
use crate::tools::{
    DEFAULT_SEARCH_PAGE_SIZE, MAX_CURSOR_CHARS, MAX_HANDLE_CHARS, MAX_SEARCH_PAGE_SIZE,
    MAX_SEARCH_QUERY_CHARS, specs,
};

/// Serves `shopify.*`. Build it once with [`ShopifyConnector::new`]: the cost buckets and the
/// token cache it keeps are shared by all its calls.
#[derive(Debug)]
pub struct ShopifyConnector {
    config: ShopifyConfig,
    admin: Admin,
}

/// Why the connector could not be built (an invalid configuration).
#[derive(Debug)]
pub struct ShopifyConfigError(String);

impl std::fmt::Display for ShopifyConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "invalid shopify connector configuration: {}", self.0)
    }
}

impl std::error::Error for ShopifyConfigError {}

/// Which order.
#[derive(Debug, PartialEq, Eq)]
enum OrderKey {
    /// `1001` (the digits of `#1001`).
    Number(String),
    /// `gid://shopify/Order/...`.
    Id(String),
}

/// Which product.
#[derive(Debug, PartialEq, Eq)]
enum ProductKey {
    Id(String),
    Handle(String),
}

/// One search, checked.
#[derive(Debug, PartialEq, Eq)]
struct Search {
    query: Option<String>,
    limit: u32,
    cursor: Option<String>,
}

impl ShopifyConnector {
    /// Builds the connector; fails on an API version that is not a stable release.
    pub fn new(config: ShopifyConfig) -> Result<ShopifyConnector, ShopifyConfigError> {
        ShopifyConnector::with_http_observer(config, Arc::new(NoHttpObserver))
    }

    /// Like [`ShopifyConnector::new`], telling `observer` of every request sent to Shopify
    /// (attempts, retries, rate-limit waits).
    pub fn with_http_observer(
        config: ShopifyConfig,
        observer: Arc<dyn HttpObserver>,
    ) -> Result<ShopifyConnector, ShopifyConfigError> {
        if !is_stable_version(&config.api_version) {
            return Err(ShopifyConfigError(format!(
                "api_version `{}` is not a stable Admin API release such as 2026-10 (YYYY-01, -04, -07 or -10)",
                config.api_version
            )));
        }
        if let Some(bad) = config
            .allow_hosts
            .iter()
            .find(|h| h.trim().is_empty() || h.contains('/') || h.contains(':'))
        {
            return Err(ShopifyConfigError(format!(
                "allow_hosts entry `{bad}` must be a bare host name or IP address"
            )));
        }
        // Requests name the store's absolute URL; the base is never used.
        let mut vendor = VendorConfig::new("https://myshopify.com/");
        vendor.allow_hosts = config.allow_hosts.clone();
        vendor.retry = RetryPolicy {
            // Throttling is paced from Shopify's query cost (throttle.rs), never blindly.
            retry_throttled: false,
            ..RetryPolicy::default()
        };
        vendor.observer = observer;
        let http = HttpClient::new(vendor).map_err(|e| ShopifyConfigError(e.to_string()))?;
        let admin = Admin {
            http,
            limiter: CostLimiter::new(),
            tokens: TokenCache::new(config.token_refresh_margin),
            api_version: config.api_version.clone(),
        };
        Ok(ShopifyConnector { config, admin })
    }

    fn credentials(&self, ctx: &InvocationContext) -> Result<Credentials, ToolError> {
        let Some(secret) = ctx.secrets.get(SECRET_NAME) else {
            return Err(ToolError::new(
                ErrorCode::CredentialsNotFound,
                format!(
                    "the tenant has no `{SECRET_NAME}` secret; an operator stores {{\"shop\": \"acme.myshopify.com\", \"access_token\": \"shpat_...\"}} with `toolgate secrets put TENANT {SECRET_NAME}`"
                ),
            ));
        };
        Credentials::parse(secret.expose(), &self.config)
    }

    async fn order_lookup(
        &self,
        ctx: &InvocationContext,
        key: OrderKey,
    ) -> Result<ToolOutput, ToolError> {
        let credentials = self.credentials(ctx)?;
        let mut attempts = 0;
        let id = match &key {
            OrderKey::Id(id) => id.clone(),
            OrderKey::Number(number) => {
                let answer = self
                    .admin
                    .query(
                        ctx,
                        &credentials,
                        &queries::order_by_name(),
                        json!({"query": format!("name:#{number}")}),
                        attempts,
                    )
                    .await?;
                attempts = answer.attempts;
                let candidates = normalize::nodes(&answer.data["orders"]);
                match pick_order(&candidates, number) {
                    Some(id) => id,
                    None => {
                        let error = order_not_found(&format!("#{number}"), &answer.data);
                        return Err(error.with_attempts(attempts));
                    }
                }
            }
        };
        let answer = self
            .admin
            .query(
                ctx,
                &credentials,
                &queries::order(),
                json!({"id": id}),
                attempts,
            )
            .await?;
        let order = &answer.data["order"];
        if !order.is_object() {
            let shown = match &key {
                OrderKey::Number(number) => format!("#{number}"),
                OrderKey::Id(id) => id.clone(),
            };
            return Err(order_not_found(&shown, &answer.data).with_attempts(answer.attempts));
        }
        Ok(ToolOutput {
            result: normalize::order(order),
            attempts: answer.attempts,
        })
    }

    async fn product_lookup(
        &self,
        ctx: &InvocationContext,
        key: ProductKey,
    ) -> Result<ToolOutput, ToolError> {
        let credentials = self.credentials(ctx)?;
        let (query, variables, field, shown) = match &key {
            ProductKey::Id(id) => (
                queries::product(false),
                json!({"id": id}),
                "product",
                format!("with ID {id}"),
            ),
            ProductKey::Handle(handle) => (
                queries::product(true),
                json!({"handle": handle}),
                "productByIdentifier",
                format!("with handle `{handle}`"),
            ),
        };
        let answer = self
            .admin
            .query(ctx, &credentials, &query, variables, 0)
            .await?;
        let product = &answer.data[field];
        if !product.is_object() {
            return Err(ToolError::new(
                ErrorCode::InvalidArguments,
                format!(
                    "PRODUCT_NOT_FOUND: the store has no product {shown}; search with shopify.product_search"
                ),
            )
            .with_attempts(answer.attempts));
        }
        Ok(ToolOutput {
            result: normalize::product(product),
            attempts: answer.attempts,
        })
    }

    async fn product_search(
        &self,
        ctx: &InvocationContext,
        search: Search,
    ) -> Result<ToolOutput, ToolError> {
        let credentials = self.credentials(ctx)?;
        let variables = json!({
            "query": search.query,
            "first": search.limit,
            "after": search.cursor,
        });
        let answer = self
            .admin
            .query(
                ctx,
                &credentials,
                &queries::product_search(search.limit),
                variables,
                0,
            )
            .await?;
        let products = &answer.data["products"];
        let hits: Vec<Value> = normalize::nodes(products)
            .iter()
            .map(normalize::product_summary)
            .collect();
        let has_next_page = normalize::has_next_page(products);
        let next_cursor = if has_next_page {
            products.pointer("/pageInfo/endCursor").cloned()
        } else {
            None
        };
        Ok(ToolOutput {
            result: json!({
                "products": hits,
                "has_next_page": has_next_page && next_cursor.is_some(),
                "next_cursor": next_cursor,
            }),
            attempts: answer.attempts,
        })
    }
}

#[async_trait::async_trait]
impl Connector for ShopifyConnector {
    fn family(&self) -> &str {
        "shopify"
    }

    fn tools(&self) -> Vec<ToolSpec> {
        specs()
    }

    async fn invoke(
        &self,
        ctx: InvocationContext,
        tool: &ToolName,
        arguments: Value,
    ) -> Result<ToolOutput, ToolError> {
        match tool.action() {
            "order_lookup" => {
                let key = order_key(&arguments)?;
                self.order_lookup(&ctx, key).await
            }
            "product_lookup" => {
                let key = product_key(&arguments)?;
                self.product_lookup(&ctx, key).await
            }
            "product_search" => {
                let search = search(&arguments)?;
                self.product_search(&ctx, search).await
            }
            other => Err(ToolError::new(
                ErrorCode::UnknownTool,
                format!("the shopify connector has no tool `{other}`"),
            )),
        }
    }
}

/// The order whose name is exactly `#number`; else the only candidate whose name carries the
/// number in a custom format (`ORD-1001`), so a near miss is never taken for the order.
fn pick_order(candidates: &[Value], number: &str) -> Option<String> {
    let exact = format!("#{number}");
    let id_of = |order: &Value| order["id"].as_str().map(str::to_owned);
    if let Some(order) = candidates.iter().find(|o| o["name"] == exact.as_str()) {
        return id_of(order);
    }
    let digits = |o: &&Value| {
        o["name"]
            .as_str()
            .map(|n| n.chars().filter(char::is_ascii_digit).collect::<String>())
            .is_some_and(|d| d == number)
    };
    let mut matching = candidates.iter().filter(digits);
    match (matching.next(), matching.next()) {
        (Some(order), None) => id_of(order),
        _ => None,
    }
}

/// Not found, saying when Shopify may be hiding the order: without `read_all_orders` an app
/// sees only the last 60 days of orders.
fn order_not_found(shown: &str, data: &Value) -> ToolError {
    let scopes: Vec<&str> = data
        .pointer("/currentAppInstallation/accessScopes")
        .and_then(Value::as_array)
        .map(|s| s.iter().filter_map(|s| s["handle"].as_str()).collect())
        .unwrap_or_default();
    let hint = if scopes.contains(&"read_all_orders") {
        "check the number with the customer"
    } else {
        "check the number with the customer; if the order is older than 60 days, Shopify hides it from this app, which lacks the read_all_orders scope (the merchant can grant it)"
    };
    ToolError::new(
        ErrorCode::InvalidArguments,
        format!("ORDER_NOT_FOUND: the store has no order {shown} visible to the app; {hint}"),
    )
}

fn invalid(message: impl Into<String>) -> ToolError {
    ToolError::new(
        ErrorCode::InvalidArguments,
        format!("{}; nothing was sent to Shopify", message.into()),
    )
}

fn string_argument<'a>(arguments: &'a Value, name: &str) -> Result<Option<&'a str>, ToolError> {
    match arguments.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(text)) => Ok(Some(text.trim())),
        Some(_) => Err(invalid(format!("`{name}` must be a string"))),
    }
}

fn order_key(arguments: &Value) -> Result<OrderKey, ToolError> {
    let number = string_argument(arguments, "order_number")?;
    let id = string_argument(arguments, "order_id")?;
    match (number, id) {
        (Some(number), None) => {
            let digits = number.strip_prefix('#').unwrap_or(number);
            let valid = !digits.is_empty()
                && digits.len() <= 12
                && digits.bytes().all(|b| b.is_ascii_digit());
            if !valid {
                return Err(invalid(
                    "`order_number` must be an order number such as #1001 (digits, optionally after #)",
                ));
            }
            Ok(OrderKey::Number(digits.to_owned()))
        }
        (None, Some(id)) => Ok(OrderKey::Id(gid("Order", id, "order_id")?)),
        (Some(_), Some(_)) => Err(invalid(
            "give either `order_number` or `order_id`, not both",
        )),
        (None, None) => Err(invalid("give `order_number` (such as #1001) or `order_id`")),
    }
}

fn product_key(arguments: &Value) -> Result<ProductKey, ToolError> {
    let id = string_argument(arguments, "product_id")?;
    let handle = string_argument(arguments, "handle")?;
    match (id, handle) {
        (Some(id), None) => Ok(ProductKey::Id(gid("Product", id, "product_id")?)),
        (None, Some(handle)) => {
            let valid = !handle.is_empty()
                && handle.chars().count() <= MAX_HANDLE_CHARS
                && !handle.chars().any(|c| c.is_whitespace() || c.is_control());
            if !valid {
                return Err(invalid(format!(
                    "`handle` must be a product handle such as classic-tee (no spaces, at most {MAX_HANDLE_CHARS} characters)"
                )));
            }
            Ok(ProductKey::Handle(handle.to_owned()))
        }
        (Some(_), Some(_)) => Err(invalid("give either `product_id` or `handle`, not both")),
        (None, None) => Err(invalid("give `product_id` or `handle`")),
    }
}

/// A Shopify global ID of `kind` from `gid://shopify/Kind/123` or `123`.
fn gid(kind: &str, text: &str, name: &str) -> Result<String, ToolError> {
    let prefix = format!("gid://shopify/{kind}/");
    let digits = text.strip_prefix(&prefix).unwrap_or(text);
    let valid =
        !digits.is_empty() && digits.len() <= 20 && digits.bytes().all(|b| b.is_ascii_digit());
    if !valid {
        return Err(invalid(format!(
            "`{name}` must be a {kind} ID such as {prefix}1234567890 or 1234567890"
        )));
    }
    Ok(format!("{prefix}{digits}"))
}

fn search(arguments: &Value) -> Result<Search, ToolError> {
    let query = string_argument(arguments, "query")?;
    if let Some(query) = query {
        if query.chars().count() > MAX_SEARCH_QUERY_CHARS {
            return Err(invalid(format!(
                "`query` is longer than {MAX_SEARCH_QUERY_CHARS} characters"
            )));
        }
        if query.chars().any(char::is_control) {
            return Err(invalid("`query` must not contain control characters"));
        }
    }
    let limit = match arguments.get("limit") {
        None | Some(Value::Null) => DEFAULT_SEARCH_PAGE_SIZE,
        Some(value) => match value.as_u64() {
            Some(n) if (1..=MAX_SEARCH_PAGE_SIZE).contains(&n) => n,
            _ => {
                return Err(invalid(format!(
                    "`limit` must be an integer from 1 to {MAX_SEARCH_PAGE_SIZE}"
                )));
            }
        },
    };
    let cursor = string_argument(arguments, "cursor")?;
    if let Some(cursor) = cursor {
        let valid = !cursor.is_empty()
            && cursor.len() <= MAX_CURSOR_CHARS
            && cursor.bytes().all(|b| b.is_ascii_graphic());
        if !valid {
            return Err(invalid(
                "`cursor` must be the next_cursor a previous search returned",
            ));
        }
    }
    Ok(Search {
        query: query.filter(|q| !q.is_empty()).map(str::to_owned),
        limit: u32::try_from(limit).expect("limit is at most 50"),
        cursor: cursor.map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_keys() {
        let ok = [
            (
                json!({"order_number": "#1001"}),
                OrderKey::Number("1001".into()),
            ),
            (
                json!({"order_number": " 1001 "}),
                OrderKey::Number("1001".into()),
            ),
            (
                json!({"order_id": "5678"}),
                OrderKey::Id("gid://shopify/Order/5678".into()),
            ),
            (
                json!({"order_id": "gid://shopify/Order/5678"}),
                OrderKey::Id("gid://shopify/Order/5678".into()),
            ),
        ];
        for (arguments, expected) in ok {
            assert_eq!(order_key(&arguments).unwrap(), expected, "{arguments}");
        }
        let bad = [
            json!({"order_number": "abc"}),
            json!({"order_number": "#10a1"}),
            json!({"order_number": "#"}),
            json!({"order_number": "1234567890123"}),
            json!({"order_number": 1001}),
            json!({"order_id": "gid://shopify/Product/1"}),
            json!({"order_number": "#1", "order_id": "1"}),
            json!({}),
        ];
        for arguments in bad {
            let err = order_key(&arguments).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidArguments, "{arguments}");
            assert!(err.message.contains("nothing was sent"), "{}", err.message);
        }
    }

    #[test]
    fn searches() {
        let ok = search(
            &json!({"query": "title:*tee*", "limit": 50, "cursor": "eyJsYXN0X2lkIjo3MDA1fQ=="}),
        )
        .unwrap();
        assert_eq!(ok.limit, 50);
        assert_eq!(search(&json!({})).unwrap().limit, 10);
        assert_eq!(search(&json!({"query": "  "})).unwrap().query, None);
        for bad in [
            json!({"limit": 0}),
            json!({"limit": 51}),
            json!({"limit": 2.5}),
            json!({"query": "x".repeat(MAX_SEARCH_QUERY_CHARS + 1)}),
            json!({"query": "a\u{0007}b"}),
            json!({"cursor": "has space"}),
        ] {
            let err = search(&bad).unwrap_err();
            assert_eq!(err.code, ErrorCode::InvalidArguments, "{bad}");
        }
    }

    #[test]
    fn an_exact_order_name_wins_and_near_misses_are_not_taken() {
        let candidates = vec![
            json!({"id": "gid://shopify/Order/2", "name": "#10010"}),
            json!({"id": "gid://shopify/Order/1", "name": "#1001"}),
        ];
        assert_eq!(
            pick_order(&candidates, "1001").as_deref(),
            Some("gid://shopify/Order/1")
        );
        assert_eq!(pick_order(&candidates[..1], "1001"), None);
        let custom = vec![json!({"id": "gid://shopify/Order/3", "name": "ORD-1001"})];
        assert_eq!(
            pick_order(&custom, "1001").as_deref(),
            Some("gid://shopify/Order/3")
        );
    }
}
