//! A fake Shopify store on loopback (wiremock) answering the Admin API in its documented
//! shapes: the GraphQL endpoint with `extensions.cost` on every answer and a leaky bucket that
//! drains by query cost and restores over time (`THROTTLED` when a query's requested cost
//! exceeds what it holds, with HTTP 200 or 429), orders (one older than 60 days, hidden without
//! `read_all_orders`), products with variants and search with cursors, `ACCESS_DENIED` with
//! partial data when a scope is missing, injected HTTP failures (401, 402, 403, 404, 423, 5xx),
//! and the client-credentials token endpoint with expiring tokens. It keeps its own log of
//! every GraphQL request: when it arrived, what the bucket held, whether it was throttled.
//! Compiled for this crate's tests and with the `testkit` feature only.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};
use wiremock::matchers::{method, path, path_regex};
use wiremock::{Mock, MockServer, Request, Respond, ResponseTemplate};

use crate::config::{DEFAULT_API_VERSION, ShopifyConfig};

/// The legacy Admin API token the fake accepts.
pub const ACCESS_TOKEN: &str = "shpat_fake0000111122223333444455556666";
/// The app's client ID for the client-credentials grant.
pub const CLIENT_ID: &str = "fakeclientid0123456789";
/// The app's client secret for the client-credentials grant.
pub const CLIENT_SECRET: &str = "fakeclientsecret0123456789abcdef";

/// The scopes the app has unless a test changes them (no `read_all_orders`).
pub const DEFAULT_SCOPES: &[&str] = &[
    "read_orders",
    "read_customers",
    "read_products",
    "read_inventory",
];

/// An order placed 10 days ago, partly shipped with tracking, with the customer's personal data.
pub const ORDER_SHIPPED: &str = "#1001";
/// An order placed 2 days ago, not shipped yet.
pub const ORDER_UNFULFILLED: &str = "#1002";
/// An order placed 90 days ago: hidden unless the app has `read_all_orders`.
pub const ORDER_OLD: &str = "#1003";
/// An order whose name starts like [`ORDER_SHIPPED`]'s, which Shopify's name search also finds.
pub const ORDER_NEAR_MISS: &str = "#10010";
/// The Shopify ID of [`ORDER_SHIPPED`].
pub const ORDER_SHIPPED_ID: &str = "gid://shopify/Order/5001";

/// The customer's personal data in [`ORDER_SHIPPED`], which the ledger must not keep.
pub const CUSTOMER_EMAIL: &str = "jane.doe@example.com";
pub const CUSTOMER_PHONE: &str = "+16135550142";
pub const CUSTOMER_STREET: &str = "150 Elgin Street";
pub const CUSTOMER_NAME: &str = "Jane Doe";
pub const CUSTOMER_ZIP: &str = "K2P 1L4";
/// The tracking number of [`ORDER_SHIPPED`]'s fulfilment.
pub const TRACKING_NUMBER: &str = "7023210039414604";

/// A product with three variants.
pub const PRODUCT_TEE_ID: &str = "gid://shopify/Product/7001";
pub const PRODUCT_TEE_HANDLE: &str = "classic-tee";
/// How many products the store has (all searchable).
pub const PRODUCT_COUNT: usize = 12;

/// Requested and actual cost of each operation, as the fake charges them.
pub const COST_ORDER: (f64, f64) = (22.0, 14.0);
pub const COST_ORDER_BY_NAME: (f64, f64) = (7.0, 3.0);
pub const COST_PRODUCT: (f64, f64) = (13.0, 10.0);

/// One GraphQL request as the fake saw it.
#[derive(Clone, Debug, PartialEq)]
pub struct Served {
    /// Since the fake started, by its own clock.
    pub at: Duration,
    /// `OrderLookup`, `OrderByName`, `ProductLookup`, `ProductByHandle`, `ProductSearch`.
    pub operation: String,
    pub requested_cost: f64,
    /// What the bucket held when the request arrived (restored up to then).
    pub available_before: f64,
    pub throttled: bool,
    pub status: u16,
}

/// The running fake. Dropping it stops the server.
#[derive(Debug)]
pub struct FakeShopify {
    server: MockServer,
    state: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    started: Instant,
    api_version: String,
    maximum: f64,
    available: f64,
    restore_rate: f64,
    restored_at: Instant,
    throttle_status: u16,
    scopes: Vec<String>,
    token_lifetime: u64,
    issued: Vec<Issued>,
    token_requests: usize,
    served: Vec<Served>,
}

#[derive(Debug)]
struct Issued {
    token: String,
    expires: Instant,
    revoked: bool,
}

impl State {
    fn restore(&mut self) {
        let now = Instant::now();
        let elapsed = now.duration_since(self.restored_at).as_secs_f64();
        self.available = (self.available + elapsed * self.restore_rate).min(self.maximum);
        self.restored_at = now;
    }

    fn cost(&self, requested: f64, actual: Option<f64>) -> Value {
        json!({
            "requestedQueryCost": requested,
            "actualQueryCost": actual,
            "throttleStatus": {
                "maximumAvailable": self.maximum,
                "currentlyAvailable": self.available.floor(),
                "restoreRate": self.restore_rate,
            }
        })
    }

    fn token_valid(&self, token: &str) -> bool {
        if token == ACCESS_TOKEN {
            return true;
        }
        let now = Instant::now();
        self.issued
            .iter()
            .any(|i| i.token == token && !i.revoked && now < i.expires)
    }
}

impl FakeShopify {
    /// Starts the fake on 127.0.0.1: API version 2026-10, a bucket of 2000 points restoring
    /// 100 per second (Shopify's standard plan), the [`DEFAULT_SCOPES`].
    pub async fn start() -> FakeShopify {
        let server = MockServer::start().await;
        let now = Instant::now();
        let state = Arc::new(Mutex::new(State {
            started: now,
            api_version: DEFAULT_API_VERSION.to_owned(),
            maximum: 2000.0,
            available: 2000.0,
            restore_rate: 100.0,
            restored_at: now,
            throttle_status: 200,
            scopes: DEFAULT_SCOPES.iter().map(|s| (*s).to_owned()).collect(),
            token_lifetime: 86_399,
            issued: Vec::new(),
            token_requests: 0,
            served: Vec::new(),
        }));
        Mock::given(method("POST"))
            .and(path_regex(r"^/admin/api/[^/]+/graphql\.json$"))
            .respond_with(GraphQl {
                state: Arc::clone(&state),
            })
            .with_priority(5)
            .mount(&server)
            .await;
        Mock::given(method("POST"))
            .and(path("/admin/oauth/access_token"))
            .respond_with(TokenEndpoint {
                state: Arc::clone(&state),
            })
            .with_priority(5)
            .mount(&server)
            .await;
        FakeShopify { server, state }
    }

    /// `http://127.0.0.1:PORT`: the `shop` to put in a tenant's secret (with loopback allowed).
    pub fn shop(&self) -> String {
        self.server.uri()
    }

    /// A connector configuration that may reach this fake.
    pub fn config(&self) -> ShopifyConfig {
        ShopifyConfig {
            allow_hosts: vec!["127.0.0.1".to_owned()],
            ..ShopifyConfig::default()
        }
    }

    /// The `shopify_default` secret with the legacy access token.
    pub fn token_secret(&self) -> String {
        json!({"shop": self.shop(), "access_token": ACCESS_TOKEN}).to_string()
    }

    /// The `shopify_default` secret with the app's client credentials.
    pub fn client_secret(&self) -> String {
        json!({"shop": self.shop(), "client_id": CLIENT_ID, "client_secret": CLIENT_SECRET})
            .to_string()
    }

    /// Sets the bucket: its size, what it holds now and its restore rate per second.
    pub fn set_bucket(&self, maximum: f64, available: f64, restore_rate: f64) {
        let mut state = self.state.lock().unwrap();
        state.maximum = maximum;
        state.available = available;
        state.restore_rate = restore_rate;
        state.restored_at = Instant::now();
    }

    /// Empties the bucket, as another client of the app spending it would.
    pub fn drain(&self) {
        let mut state = self.state.lock().unwrap();
        state.available = 0.0;
        state.restored_at = Instant::now();
    }

    /// The HTTP status of `THROTTLED` answers: 200 (the default) or 429.
    pub fn throttle_with_status(&self, status: u16) {
        self.state.lock().unwrap().throttle_status = status;
    }

    /// The app's access scopes.
    pub fn set_scopes(&self, scopes: &[&str]) {
        self.state.lock().unwrap().scopes = scopes.iter().map(|s| (*s).to_owned()).collect();
    }

    /// The API version the fake serves; others answer 404.
    pub fn set_api_version(&self, version: &str) {
        self.state.lock().unwrap().api_version = version.to_owned();
    }

    /// How long new client-credentials tokens last (`expires_in`), in seconds.
    pub fn set_token_lifetime(&self, seconds: u64) {
        self.state.lock().unwrap().token_lifetime = seconds;
    }

    /// Revokes every token issued so far (as uninstalling and reinstalling the app would).
    pub fn revoke_tokens(&self) {
        for issued in &mut self.state.lock().unwrap().issued {
            issued.revoked = true;
        }
    }

    /// The next GraphQL request answers `status` with the body Shopify documents for it: 401,
    /// 402 (frozen), 403 (missing scope), 404, 423 (locked), or a 5xx.
    pub async fn fail_next(&self, status: u16) {
        let body = match status {
            401 => {
                json!({"errors": "[API] Invalid API key or access token (unrecognized login or wrong password)"})
            }
            402 => json!({"errors": "Unavailable Shop"}),
            403 => {
                json!({"errors": "[API] This action requires merchant approval for read_orders scope."})
            }
            404 => json!({"errors": "Not Found"}),
            423 => json!({"errors": "This store is unavailable"}),
            _ => json!({"errors": "Internal Server Error"}),
        };
        Mock::given(path_regex(r"^/admin/api/[^/]+/graphql\.json$"))
            .respond_with(ResponseTemplate::new(status).set_body_json(body))
            .with_priority(1)
            .up_to_n_times(1)
            .mount(&self.server)
            .await;
    }

    /// The next GraphQL request answers 200 with `body` as is.
    pub async fn answer_next(&self, body: Value) {
        Mock::given(path_regex(r"^/admin/api/[^/]+/graphql\.json$"))
            .respond_with(ResponseTemplate::new(200).set_body_json(body))
            .with_priority(1)
            .up_to_n_times(1)
            .mount(&self.server)
            .await;
    }

    /// Every GraphQL request the fake's store answered, in arrival order (not those answered
    /// by [`FakeShopify::fail_next`] / [`FakeShopify::answer_next`]).
    pub fn served(&self) -> Vec<Served> {
        self.state.lock().unwrap().served.clone()
    }

    /// Token requests received.
    pub fn token_requests(&self) -> usize {
        self.state.lock().unwrap().token_requests
    }

    /// Every request the fake received (GraphQL, tokens, injected failures).
    pub async fn total_requests(&self) -> usize {
        self.server.received_requests().await.map_or(0, |r| r.len())
    }

    /// The headers of every GraphQL request (to check what was sent).
    pub async fn graphql_requests(&self) -> Vec<Request> {
        self.server
            .received_requests()
            .await
            .unwrap_or_default()
            .into_iter()
            .filter(|r| r.url.path().ends_with("/graphql.json"))
            .collect()
    }
}

/// The GraphQL endpoint.
struct GraphQl {
    state: Arc<Mutex<State>>,
}

impl Respond for GraphQl {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let mut state = self.state.lock().unwrap();
        let version_path = format!("/admin/api/{}/graphql.json", state.api_version);
        if request.url.path() != version_path {
            return ResponseTemplate::new(404).set_body_json(json!({"errors": "Not Found"}));
        }
        let token = request
            .headers
            .get("x-shopify-access-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !state.token_valid(token) {
            return ResponseTemplate::new(401).set_body_json(json!({
                "errors": "[API] Invalid API key or access token (unrecognized login or wrong password)"
            }));
        }
        let Ok(body) = serde_json::from_slice::<Value>(&request.body) else {
            return ResponseTemplate::new(400).set_body_json(json!({"errors": "Bad Request"}));
        };
        let document = body["query"].as_str().unwrap_or("");
        let variables = &body["variables"];
        let operation = [
            "OrderLookup",
            "OrderByName",
            "ProductLookup",
            "ProductByHandle",
            "ProductSearch",
        ]
        .into_iter()
        .find(|op| document.contains(&format!("query {op}(")))
        .unwrap_or("");
        let first = variables["first"].as_u64().unwrap_or(10);
        let (requested, actual) = match operation {
            "OrderLookup" => COST_ORDER,
            "OrderByName" => COST_ORDER_BY_NAME,
            "ProductLookup" | "ProductByHandle" => COST_PRODUCT,
            "ProductSearch" => {
                let first = f64::from(u32::try_from(first).unwrap_or(250));
                (2.0 + first * 3.0, 2.0 + first)
            }
            _ => {
                return ResponseTemplate::new(200).set_body_json(json!({
                    "errors": [{"message": "Parse error", "extensions": {"code": "GRAPHQL_PARSE_FAILED"}}]
                }));
            }
        };
        state.restore();
        let at = state.started.elapsed();
        let available_before = state.available;
        if requested > 1000.0 {
            let answer = json!({
                "errors": [{"message": format!("Query cost is {requested}, which exceeds the single query max cost limit (1000)."),
                    "extensions": {"code": "MAX_COST_EXCEEDED", "cost": requested, "maxCost": 1000}}],
                "extensions": {"cost": state.cost(requested, None)},
            });
            return ResponseTemplate::new(200).set_body_json(answer);
        }
        if requested > state.available {
            let status = state.throttle_status;
            state.served.push(Served {
                at,
                operation: operation.to_owned(),
                requested_cost: requested,
                available_before,
                throttled: true,
                status,
            });
            let answer = json!({
                "errors": [{"message": "Throttled", "extensions": {
                    "code": "THROTTLED",
                    "documentation": "https://shopify.dev/api/usage/rate-limits"
                }}],
                "extensions": {"cost": state.cost(requested, None)},
            });
            return ResponseTemplate::new(status).set_body_json(answer);
        }
        state.available -= requested;
        let scopes = state.scopes.clone();
        let (data, errors) = resolve(operation, variables, &scopes);
        // Shopify refunds the difference between the requested and the actual cost.
        state.available = (state.available + requested - actual).min(state.maximum);
        state.served.push(Served {
            at,
            operation: operation.to_owned(),
            requested_cost: requested,
            available_before,
            throttled: false,
            status: 200,
        });
        let mut answer =
            json!({"data": data, "extensions": {"cost": state.cost(requested, Some(actual))}});
        if !errors.is_empty() {
            answer["errors"] = Value::Array(errors);
        }
        ResponseTemplate::new(200).set_body_json(answer)
    }
}

/// The client-credentials grant.
struct TokenEndpoint {
    state: Arc<Mutex<State>>,
}

impl Respond for TokenEndpoint {
    fn respond(&self, request: &Request) -> ResponseTemplate {
        let mut state = self.state.lock().unwrap();
        state.token_requests += 1;
        let form: HashMap<String, String> = url::form_urlencoded::parse(&request.body)
            .into_owned()
            .collect();
        let field = |name: &str| form.get(name).map_or("", String::as_str);
        if field("grant_type") != "client_credentials" {
            return ResponseTemplate::new(400).set_body_json(json!({
                "error": "unsupported_grant_type",
                "error_description": "grant_type must be client_credentials"
            }));
        }
        if field("client_id") != CLIENT_ID || field("client_secret") != CLIENT_SECRET {
            return ResponseTemplate::new(400).set_body_json(json!({
                "error": "invalid_client",
                "error_description": "Client authentication failed"
            }));
        }
        let token = format!("shpat_cc{:032}", state.issued.len() + 1);
        let lifetime = state.token_lifetime;
        state.issued.push(Issued {
            token: token.clone(),
            expires: Instant::now() + Duration::from_secs(lifetime),
            revoked: false,
        });
        ResponseTemplate::new(200).set_body_json(json!({
            "access_token": token,
            "scope": state.scopes.join(","),
            "expires_in": lifetime,
        }))
    }
}

/// Answers one operation from the fixtures: `(data, errors)`.
fn resolve(operation: &str, variables: &Value, scopes: &[String]) -> (Value, Vec<Value>) {
    let has = |scope: &str| scopes.iter().any(|s| s == scope);
    let app =
        json!({"accessScopes": scopes.iter().map(|s| json!({"handle": s})).collect::<Vec<_>>()});
    let visible =
        |order: &Value| has("read_all_orders") || order["_ageDays"].as_u64().unwrap_or(0) <= 60;
    match operation {
        "OrderByName" => {
            let wanted = variables["query"]
                .as_str()
                .and_then(|q| q.strip_prefix("name:"))
                .unwrap_or("")
                .trim_matches('"');
            // Shopify's name search also finds names that start alike.
            let nodes: Vec<Value> = orders()
                .into_iter()
                .filter(|o| {
                    visible(o)
                        && o["name"]
                            .as_str()
                            .is_some_and(|n| !wanted.is_empty() && n.starts_with(wanted))
                })
                .rev()
                .take(5)
                .map(|o| json!({"id": o["id"], "name": o["name"]}))
                .collect();
            (
                json!({"orders": {"nodes": nodes}, "currentAppInstallation": app}),
                Vec::new(),
            )
        }
        "OrderLookup" => {
            let id = variables["id"].as_str().unwrap_or("");
            let found = orders().into_iter().find(|o| o["id"] == id && visible(o));
            let Some(mut order) = found else {
                return (
                    json!({"order": null, "currentAppInstallation": app}),
                    Vec::new(),
                );
            };
            let object = order.as_object_mut().expect("fixture object");
            object.remove("_ageDays");
            let mut errors = Vec::new();
            if !has("read_customers") {
                object.insert("customer".into(), Value::Null);
                errors.push(json!({
                    "message": "Access denied for customer field. Required access: `read_customers` access scope.",
                    "locations": [{"line": 9, "column": 5}],
                    "path": ["order", "customer"],
                    "extensions": {
                        "code": "ACCESS_DENIED",
                        "documentation": "https://shopify.dev/api/usage/access-scopes",
                        "requiredAccess": "`read_customers` access scope."
                    }
                }));
            }
            (
                json!({"order": order, "currentAppInstallation": app}),
                errors,
            )
        }
        "ProductLookup" | "ProductByHandle" => {
            let found = products().into_iter().find(|p| {
                if operation == "ProductLookup" {
                    p["id"] == variables["id"]
                } else {
                    p["handle"] == variables["handle"]
                }
            });
            let field = if operation == "ProductLookup" {
                "product"
            } else {
                "productByIdentifier"
            };
            (json!({ field: found }), Vec::new())
        }
        "ProductSearch" => {
            let query = variables["query"].as_str().unwrap_or("");
            let first = usize::try_from(variables["first"].as_u64().unwrap_or(10)).unwrap_or(250);
            let start = variables["after"]
                .as_str()
                .and_then(|c| c.strip_prefix("Y3Vyc29y"))
                .and_then(|n| n.parse::<usize>().ok())
                .unwrap_or(0);
            let hits: Vec<Value> = products()
                .into_iter()
                .filter(|p| matches_search(p, query))
                .collect();
            let end = (start + first).min(hits.len());
            let page: Vec<Value> = hits[start.min(end)..end]
                .iter()
                .map(|p| {
                    let mut p = p.clone();
                    p.as_object_mut()
                        .expect("fixture object")
                        .remove("variants");
                    p
                })
                .collect();
            let has_next = end < hits.len();
            let end_cursor = if page.is_empty() {
                Value::Null
            } else {
                json!(format!("Y3Vyc29y{end}"))
            };
            (
                json!({"products": {"nodes": page, "pageInfo": {"hasNextPage": has_next, "endCursor": end_cursor}}}),
                Vec::new(),
            )
        }
        _ => (Value::Null, Vec::new()),
    }
}

/// A small subset of Shopify's search syntax: `field:value` terms (`title`, `vendor`,
/// `product_type`, `status`, `sku`, `handle`, `*` wildcards) and bare words, all ANDed.
fn matches_search(product: &Value, query: &str) -> bool {
    query
        .split_whitespace()
        .filter(|t| *t != "AND")
        .all(|term| {
            let (field, value) = term.split_once(':').unwrap_or(("", term));
            let value = value
                .trim_matches('*')
                .trim_matches('"')
                .to_ascii_lowercase();
            let text = |name: &str| product[name].as_str().unwrap_or("").to_ascii_lowercase();
            match field {
                "title" => text("title").contains(&value),
                "vendor" => text("vendor") == value,
                "product_type" => text("productType") == value,
                "status" => text("status") == value,
                "handle" => text("handle") == value,
                "sku" => product["variants"]["nodes"].as_array().is_some_and(|v| {
                    v.iter()
                        .any(|v| v["sku"].as_str().unwrap_or("").eq_ignore_ascii_case(&value))
                }),
                _ => ["title", "vendor", "productType", "handle"]
                    .iter()
                    .any(|n| text(n).contains(&value)),
            }
        })
}

fn money(amount: &str) -> Value {
    json!({"shopMoney": {"amount": amount, "currencyCode": "CAD"}})
}

/// An RFC 3339 UTC timestamp `days` before the fixtures' "now": the first time any fixture
/// was built in this process, so two answers describing one record agree to the second even
/// when they straddle a clock tick.
fn days_ago(days: u64) -> String {
    static FIXTURE_NOW: OnceLock<u64> = OnceLock::new();
    let now = *FIXTURE_NOW.get_or_init(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs())
    });
    let at = now.saturating_sub(days * 86_400);
    let (day_count, secs) = (at / 86_400, at % 86_400);
    // Days since 1970-01-01 to a civil date (Howard Hinnant's algorithm).
    let z = i64::try_from(day_count).unwrap_or(0) + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        (secs % 3600) / 60,
        secs % 60
    )
}

fn line_item(
    title: &str,
    variant: &str,
    sku: &str,
    variant_id: u64,
    quantity: u64,
    unfulfilled: u64,
    price: &str,
) -> Value {
    json!({
        "title": title,
        "quantity": quantity,
        "currentQuantity": quantity,
        "unfulfilledQuantity": unfulfilled,
        "sku": sku,
        "variantTitle": variant,
        "variant": {"id": format!("gid://shopify/ProductVariant/{variant_id}")},
        "originalUnitPriceSet": money(price),
    })
}

/// The store's orders (`_ageDays` is the fake's own bookkeeping, removed before answering).
fn orders() -> Vec<Value> {
    let customer = json!({
        "id": "gid://shopify/Customer/9001",
        "displayName": CUSTOMER_NAME,
        "firstName": "Jane",
        "lastName": "Doe",
        "defaultEmailAddress": {"emailAddress": CUSTOMER_EMAIL},
        "defaultPhoneNumber": {"phoneNumber": CUSTOMER_PHONE},
    });
    let address = json!({
        "firstName": "Jane", "lastName": "Doe", "company": null,
        "address1": CUSTOMER_STREET, "address2": "Suite 800", "city": "Ottawa",
        "province": "Ontario", "provinceCode": "ON", "zip": CUSTOMER_ZIP,
        "country": "Canada", "countryCodeV2": "CA", "phone": CUSTOMER_PHONE,
    });
    let order = |number: u64,
                 name: &str,
                 age: u64,
                 financial: &str,
                 fulfillment: &str,
                 items: Vec<Value>,
                 fulfillments: Value| {
        json!({
            "_ageDays": age,
            "id": format!("gid://shopify/Order/{number}"),
            "name": name,
            "createdAt": days_ago(age),
            "processedAt": days_ago(age),
            "closedAt": null,
            "cancelledAt": null,
            "cancelReason": null,
            "displayFinancialStatus": financial,
            "displayFulfillmentStatus": fulfillment,
            "statusPageUrl": format!("https://acme-outfitters.myshopify.com/70010/orders/{number}f3a9/authenticate"),
            "email": CUSTOMER_EMAIL,
            "phone": CUSTOMER_PHONE,
            "currentTotalPriceSet": money("59.00"),
            "subtotalPriceSet": money("49.00"),
            "totalShippingPriceSet": money("10.00"),
            "customer": customer,
            "shippingAddress": address,
            "lineItems": {"nodes": items, "pageInfo": {"hasNextPage": false}},
            "fulfillments": fulfillments,
        })
    };
    vec![
        order(
            5001,
            ORDER_SHIPPED,
            10,
            "PAID",
            "PARTIALLY_FULFILLED",
            vec![
                line_item("Classic Tee", "Black / M", "TEE-BLK-M", 8001, 2, 0, "15.00"),
                line_item(
                    "Enamel Mug",
                    "Default Title",
                    "MUG-ENM",
                    8101,
                    1,
                    1,
                    "19.00",
                ),
            ],
            json!([{
                "status": "SUCCESS",
                "displayStatus": "IN_TRANSIT",
                "createdAt": days_ago(8),
                "deliveredAt": null,
                "estimatedDeliveryAt": days_ago(0),
                "trackingInfo": [{
                    "company": "Canada Post",
                    "number": TRACKING_NUMBER,
                    "url": format!("https://www.canadapost-postescanada.ca/track-reperage/en#/details/{TRACKING_NUMBER}"),
                }],
            }]),
        ),
        order(
            5002,
            ORDER_UNFULFILLED,
            2,
            "PAID",
            "UNFULFILLED",
            vec![line_item(
                "Classic Tee",
                "White / S",
                "TEE-WHT-S",
                8003,
                1,
                1,
                "15.00",
            )],
            json!([]),
        ),
        order(
            5003,
            ORDER_OLD,
            90,
            "PAID",
            "FULFILLED",
            vec![line_item(
                "Enamel Mug",
                "Default Title",
                "MUG-ENM",
                8101,
                1,
                0,
                "19.00",
            )],
            json!([]),
        ),
        order(
            5010,
            ORDER_NEAR_MISS,
            1,
            "PENDING",
            "UNFULFILLED",
            vec![line_item(
                "Enamel Mug",
                "Default Title",
                "MUG-ENM",
                8101,
                3,
                3,
                "19.00",
            )],
            json!([]),
        ),
    ]
}

/// The store's products: a tee with three variants, a mug, and ten more to search through.
fn products() -> Vec<Value> {
    let variant = |id: u64, title: &str, sku: &str, price: &str, quantity: i64, options: Value| {
        json!({
            "id": format!("gid://shopify/ProductVariant/{id}"),
            "title": title, "sku": sku, "barcode": null, "price": price, "compareAtPrice": null,
            "availableForSale": quantity > 0, "inventoryQuantity": quantity,
            "selectedOptions": options,
        })
    };
    let product =
        |id: u64, title: &str, handle: &str, vendor: &str, kind: &str, variants: Vec<Value>| {
            let total: i64 = variants
                .iter()
                .filter_map(|v| v["inventoryQuantity"].as_i64())
                .sum();
            let prices: Vec<&str> = variants
                .iter()
                .filter_map(|v| v["price"].as_str())
                .collect();
            let min = prices.iter().min().copied().unwrap_or("0.00");
            let max = prices.iter().max().copied().unwrap_or("0.00");
            json!({
                "id": format!("gid://shopify/Product/{id}"),
                "title": title, "handle": handle, "status": "ACTIVE", "vendor": vendor,
                "productType": kind, "tags": ["summer"], "totalInventory": total,
                "createdAt": days_ago(200), "updatedAt": days_ago(3),
                "onlineStoreUrl": format!("https://acme-outfitters.example/products/{handle}"),
                "priceRangeV2": {
                    "minVariantPrice": {"amount": min, "currencyCode": "CAD"},
                    "maxVariantPrice": {"amount": max, "currencyCode": "CAD"},
                },
                "variants": {"nodes": variants, "pageInfo": {"hasNextPage": false}},
            })
        };
    let size = |color: &str, size: &str| json!([{"name": "Color", "value": color}, {"name": "Size", "value": size}]);
    let mut all = vec![
        product(
            7001,
            "Classic Tee",
            PRODUCT_TEE_HANDLE,
            "Acme",
            "Shirts",
            vec![
                variant(
                    8001,
                    "Black / M",
                    "TEE-BLK-M",
                    "15.00",
                    12,
                    size("Black", "M"),
                ),
                variant(
                    8002,
                    "Black / L",
                    "TEE-BLK-L",
                    "15.00",
                    0,
                    size("Black", "L"),
                ),
                variant(
                    8003,
                    "White / S",
                    "TEE-WHT-S",
                    "17.00",
                    5,
                    size("White", "S"),
                ),
            ],
        ),
        product(
            7002,
            "Enamel Mug",
            "enamel-mug",
            "Acme",
            "Mugs",
            vec![variant(
                8101,
                "Default Title",
                "MUG-ENM",
                "19.00",
                40,
                json!([{"name": "Title", "value": "Default Title"}]),
            )],
        ),
    ];
    for n in 3..=u64::try_from(PRODUCT_COUNT).unwrap_or(12) {
        all.push(product(
            7000 + n,
            &format!("Graphic Tee {n}"),
            &format!("graphic-tee-{n}"),
            "Northwind",
            "Shirts",
            vec![variant(
                8000 + n * 10,
                "Default Title",
                &format!("GTEE-{n}"),
                "22.00",
                3,
                json!([]),
            )],
        ));
    }
    all
}
