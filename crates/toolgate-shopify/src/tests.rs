//! The connector against the fake Shopify: each tool's happy and not-found paths, the
//! client-credentials token cache, every error status, `THROTTLED` with 200 and 429, the
//! proactive limiter under a burst (checked from the fake's own request log), and bad input
//! refused before anything is sent.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use toolgate_core::{
    AgentId, Connector, CorrelationId, ErrorCode, InvocationContext, RunId, SecretName,
    SecretValue, Secrets, TenantId, ToolCallId, ToolError, ToolName, ToolOutput, ToolRegistry,
};

use crate::testkit::{
    ACCESS_TOKEN, COST_PRODUCT, CUSTOMER_EMAIL, FakeShopify, ORDER_OLD, ORDER_SHIPPED,
    ORDER_SHIPPED_ID, PRODUCT_COUNT, PRODUCT_TEE_HANDLE, PRODUCT_TEE_ID, TRACKING_NUMBER,
};
use crate::{SECRET_NAME, ShopifyConfig, ShopifyConnector};

fn context(tool: &str, secret: Option<&str>, timeout: Duration) -> InvocationContext {
    let mut secrets = Secrets::empty();
    if let Some(value) = secret {
        secrets.insert(
            SecretName::new(SECRET_NAME).unwrap(),
            SecretValue::new(value),
        );
    }
    InvocationContext {
        tenant: TenantId::new("acme").unwrap(),
        agent: AgentId::new("support").unwrap(),
        run: RunId::new("run-1").unwrap(),
        tool_call_id: ToolCallId::new("call-1").unwrap(),
        correlation_id: CorrelationId::new("corr-1").unwrap(),
        tool: ToolName::new(tool).unwrap(),
        deadline: Instant::now() + timeout,
        secrets,
    }
}

struct Setup {
    fake: FakeShopify,
    connector: Arc<ShopifyConnector>,
}

impl Setup {
    async fn new() -> Setup {
        let fake = FakeShopify::start().await;
        let connector = Arc::new(ShopifyConnector::new(fake.config()).unwrap());
        Setup { fake, connector }
    }

    async fn with_config(config: impl FnOnce(ShopifyConfig) -> ShopifyConfig) -> Setup {
        let fake = FakeShopify::start().await;
        let connector = Arc::new(ShopifyConnector::new(config(fake.config())).unwrap());
        Setup { fake, connector }
    }

    async fn call_with(
        &self,
        secret: &str,
        tool: &str,
        arguments: Value,
        timeout: Duration,
    ) -> Result<ToolOutput, ToolError> {
        let ctx = context(tool, Some(secret), timeout);
        let name = ctx.tool.clone();
        self.connector.invoke(ctx, &name, arguments).await
    }

    async fn call(&self, tool: &str, arguments: Value) -> Result<ToolOutput, ToolError> {
        let secret = self.fake.token_secret();
        self.call_with(&secret, tool, arguments, Duration::from_secs(10))
            .await
    }
}

const ORDER: &str = "shopify.order_lookup";
const PRODUCT: &str = "shopify.product_lookup";
const SEARCH: &str = "shopify.product_search";

#[test]
fn tools_register_with_schemas_tags_and_risk() {
    let connector = ShopifyConnector::new(ShopifyConfig::default()).unwrap();
    let specs = connector.tools();
    let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, [ORDER, PRODUCT, SEARCH]);
    for spec in &specs {
        spec.validate().unwrap();
        assert_eq!(spec.required_secrets[0].as_str(), "shopify_default");
        assert!(
            spec.idempotent && spec.has_tag("read_only"),
            "{}",
            spec.name
        );
        assert!(!spec.has_tag("write"), "{}", spec.name);
        // A plain object at the root, as LLM tool APIs expect.
        assert_eq!(spec.input_schema["type"], "object");
        for combinator in ["oneOf", "anyOf", "allOf"] {
            assert!(spec.input_schema.get(combinator).is_none(), "{}", spec.name);
        }
    }
    let mut registry = ToolRegistry::new();
    registry.register(Arc::new(connector)).unwrap();
}

#[test]
fn configuration_is_checked() {
    for (version, ok) in [
        ("2026-10", true),
        ("2026-07", true),
        ("unstable", false),
        ("2026-11", false),
    ] {
        let config = ShopifyConfig {
            api_version: version.into(),
            ..ShopifyConfig::default()
        };
        match ShopifyConnector::new(config) {
            Ok(_) => assert!(ok, "{version} accepted"),
            Err(e) => {
                assert!(!ok, "{version}: {e}");
                assert!(e.to_string().contains("api_version"), "{e}");
            }
        }
    }
    let config = ShopifyConfig {
        allow_hosts: vec!["http://127.0.0.1".into()],
        ..ShopifyConfig::default()
    };
    assert!(ShopifyConnector::new(config).is_err());
}

#[tokio::test]
async fn an_order_by_number_comes_back_whole() {
    let setup = Setup::new().await;
    let output = setup
        .call(ORDER, json!({"order_number": ORDER_SHIPPED}))
        .await
        .unwrap();
    let order = &output.result;
    assert_eq!(order["id"], ORDER_SHIPPED_ID, "the exact name, not #10010");
    assert_eq!(order["name"], ORDER_SHIPPED);
    assert_eq!(order["status"], "open");
    assert_eq!(order["financial_status"], "PAID");
    assert_eq!(order["fulfillment_status"], "PARTIALLY_FULFILLED");
    assert_eq!(
        order["total"],
        json!({"amount": "59.00", "currency": "CAD"})
    );
    assert_eq!(order["line_items"].as_array().unwrap().len(), 2);
    assert_eq!(order["line_items"][0]["sku"], "TEE-BLK-M");
    assert_eq!(order["line_items"][1]["unfulfilled_quantity"], 1);
    let tracking = &order["fulfillments"][0]["tracking"][0];
    assert_eq!(tracking["company"], "Canada Post");
    assert_eq!(tracking["number"], TRACKING_NUMBER);
    assert!(tracking["url"].as_str().unwrap().contains(TRACKING_NUMBER));
    assert_eq!(order["customer"]["email"], CUSTOMER_EMAIL);
    assert_eq!(order["shipping_address"]["zip"], "K2P 1L4");
    // Two queries: the number search, then the order.
    assert_eq!(output.attempts, 2);
    let served = setup.fake.served();
    let operations: Vec<&str> = served.iter().map(|s| s.operation.as_str()).collect();
    assert_eq!(operations, ["OrderByName", "OrderLookup"]);
    // The pinned version and the token header went out.
    let requests = setup.fake.graphql_requests().await;
    assert!(requests[0].url.path().starts_with("/admin/api/2026-10/"));
    assert_eq!(
        requests[0].headers.get("x-shopify-access-token").unwrap(),
        ACCESS_TOKEN
    );
}

#[tokio::test]
async fn orders_that_are_missing_or_hidden_fail_clearly() {
    let setup = Setup::new().await;
    let by_id = setup
        .call(ORDER, json!({"order_id": "5001"}))
        .await
        .unwrap();
    assert_eq!(by_id.result["name"], ORDER_SHIPPED);

    let missing = setup
        .call(ORDER, json!({"order_number": "#4242"}))
        .await
        .unwrap_err();
    assert_eq!(missing.code, ErrorCode::InvalidArguments);
    assert!(
        missing.message.starts_with("ORDER_NOT_FOUND"),
        "{}",
        missing.message
    );
    assert!(missing.message.contains("#4242"), "{}", missing.message);
    assert!(
        missing.message.contains("read_all_orders"),
        "{}",
        missing.message
    );

    // Older than 60 days: hidden without read_all_orders, found with it.
    let hidden = setup
        .call(ORDER, json!({"order_number": ORDER_OLD}))
        .await
        .unwrap_err();
    assert!(
        hidden.message.contains("older than 60 days"),
        "{}",
        hidden.message
    );
    setup.fake.set_scopes(&[
        "read_orders",
        "read_all_orders",
        "read_customers",
        "read_products",
    ]);
    let found = setup
        .call(ORDER, json!({"order_number": ORDER_OLD}))
        .await
        .unwrap();
    assert_eq!(found.result["name"], ORDER_OLD);
    let missing = setup
        .call(ORDER, json!({"order_id": "gid://shopify/Order/999"}))
        .await
        .unwrap_err();
    assert!(
        !missing.message.contains("older than 60 days"),
        "{}",
        missing.message
    );
}

#[tokio::test]
async fn a_missing_scope_is_named_and_partial_data_withheld() {
    let setup = Setup::new().await;
    setup.fake.set_scopes(&["read_orders", "read_products"]);
    let err = setup
        .call(ORDER, json!({"order_number": ORDER_SHIPPED}))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::VendorError);
    assert!(err.message.starts_with("ACCESS_DENIED"), "{}", err.message);
    assert!(err.message.contains("`read_customers`"), "{}", err.message);
    assert!(err.message.contains("partial data"), "{}", err.message);
    assert!(!err.message.contains(CUSTOMER_EMAIL));
}

#[tokio::test]
async fn products_by_id_and_handle_and_search_with_cursors() {
    let setup = Setup::new().await;
    let by_id = setup
        .call(PRODUCT, json!({"product_id": "7001"}))
        .await
        .unwrap();
    let by_handle = setup
        .call(PRODUCT, json!({"handle": PRODUCT_TEE_HANDLE}))
        .await
        .unwrap();
    assert_eq!(by_id.result, by_handle.result);
    let product = &by_id.result;
    assert_eq!(product["id"], PRODUCT_TEE_ID);
    assert_eq!(product["status"], "ACTIVE");
    assert_eq!(product["vendor"], "Acme");
    assert_eq!(product["total_inventory"], 17);
    let variants = product["variants"].as_array().unwrap();
    assert_eq!(variants.len(), 3);
    assert_eq!(variants[0]["sku"], "TEE-BLK-M");
    assert_eq!(variants[0]["price"], "15.00");
    assert_eq!(variants[1]["inventory_quantity"], 0);
    assert_eq!(variants[2]["options"]["Color"], "White");
    assert_eq!(product["variants_truncated"], false);

    let missing = setup
        .call(PRODUCT, json!({"handle": "no-such-thing"}))
        .await
        .unwrap_err();
    assert_eq!(missing.code, ErrorCode::InvalidArguments);
    assert!(
        missing.message.starts_with("PRODUCT_NOT_FOUND"),
        "{}",
        missing.message
    );

    // Page through every product, 5 at a time.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        let mut arguments = json!({"limit": 5});
        if let Some(cursor) = &cursor {
            arguments["cursor"] = json!(cursor);
        }
        let page = setup.call(SEARCH, arguments).await.unwrap().result;
        for hit in page["products"].as_array().unwrap() {
            seen.push(hit["id"].as_str().unwrap().to_owned());
        }
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_owned()),
            None => {
                assert_eq!(page["has_next_page"], false);
                break;
            }
        }
    }
    assert_eq!(seen.len(), PRODUCT_COUNT);
    let tees = setup
        .call(SEARCH, json!({"query": "title:*tee* vendor:Acme"}))
        .await
        .unwrap()
        .result;
    assert_eq!(tees["products"].as_array().unwrap().len(), 1);
    assert_eq!(tees["products"][0]["price_min"]["amount"], "15.00");
}

#[tokio::test]
async fn bad_input_is_refused_before_anything_is_sent() {
    let setup = Setup::new().await;
    let cases = [
        (ORDER, json!({"order_number": "ten-oh-one"})),
        (ORDER, json!({"order_number": "#1001", "order_id": "5001"})),
        (PRODUCT, json!({"product_id": "gid://shopify/Order/1"})),
        (SEARCH, json!({"query": "x".repeat(501)})),
        (SEARCH, json!({"limit": 0})),
        (SEARCH, json!({"limit": 51})),
    ];
    for (tool, arguments) in cases {
        let err = setup.call(tool, arguments.clone()).await.unwrap_err();
        assert_eq!(err.code, ErrorCode::InvalidArguments, "{arguments}");
    }
    // A shop outside myshopify.com.
    let outside = json!({"shop": "acme.example.com", "access_token": ACCESS_TOKEN}).to_string();
    let err = setup
        .call_with(
            &outside,
            ORDER,
            json!({"order_number": "#1001"}),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArguments);
    assert!(err.message.contains("acme.example.com"), "{}", err.message);
    // No credential at all.
    let ctx = context(ORDER, None, Duration::from_secs(5));
    let name = ctx.tool.clone();
    let err = setup
        .connector
        .invoke(ctx, &name, json!({"order_number": "#1001"}))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::CredentialsNotFound);
    assert_eq!(setup.fake.total_requests().await, 0);
}

#[tokio::test]
async fn http_failures_map_to_stable_codes_and_402_423_are_not_retried() {
    let setup = Setup::new().await;
    let product = json!({"product_id": "7001"});
    let cases: [(u16, ErrorCode, &str); 5] = [
        (401, ErrorCode::CredentialsNotFound, "UNAUTHORIZED"),
        (402, ErrorCode::VendorError, "PAYMENT_REQUIRED"),
        (403, ErrorCode::VendorError, "`read_orders`"),
        (404, ErrorCode::VendorError, "NOT_FOUND"),
        (423, ErrorCode::VendorError, "LOCKED"),
    ];
    for (status, code, contains) in cases {
        let before = setup.fake.total_requests().await;
        setup.fake.fail_next(status).await;
        let err = setup.call(PRODUCT, product.clone()).await.unwrap_err();
        assert_eq!(err.code, code, "{status}");
        assert!(err.message.contains(contains), "{status}: {}", err.message);
        assert_eq!(err.attempts, Some(1), "{status}");
        assert_eq!(setup.fake.total_requests().await, before + 1, "{status}");
    }
    // A 5xx is retried (the query only reads) and the retry succeeds.
    setup.fake.fail_next(503).await;
    let output = setup.call(PRODUCT, product.clone()).await.unwrap();
    assert_eq!(output.attempts, 2);
    // A wrong pinned version is a 404 from Shopify.
    setup.fake.set_api_version("2027-01");
    let err = setup.call(PRODUCT, product).await.unwrap_err();
    assert!(err.message.starts_with("NOT_FOUND"), "{}", err.message);
    // A bad legacy token.
    let wrong =
        json!({"shop": setup.fake.shop(), "access_token": "shpat_wrongwrongwrongwrongwrong"})
            .to_string();
    setup.fake.set_api_version("2026-10");
    let err = setup
        .call_with(
            &wrong,
            PRODUCT,
            json!({"product_id": "7001"}),
            Duration::from_secs(5),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::CredentialsNotFound);
    assert!(!err.message.contains("shpat_wrong"), "{}", err.message);
}

#[tokio::test]
async fn graphql_error_codes_come_through() {
    let setup = Setup::new().await;
    setup
        .fake
        .answer_next(json!({
            "errors": [{"message": "Query cost is 1172, which exceeds the single query max cost limit (1000).",
                "extensions": {"code": "MAX_COST_EXCEEDED", "cost": 1172, "maxCost": 1000}}],
            "extensions": {"cost": {"requestedQueryCost": 1172, "actualQueryCost": null,
                "throttleStatus": {"maximumAvailable": 2000.0, "currentlyAvailable": 2000, "restoreRate": 100.0}}}
        }))
        .await;
    let err = setup.call(SEARCH, json!({"limit": 50})).await.unwrap_err();
    assert_eq!(err.code, ErrorCode::InvalidArguments);
    assert!(
        err.message.starts_with("MAX_COST_EXCEEDED"),
        "{}",
        err.message
    );
}

/// THROTTLED answers (another client spent the bucket) with either status: the connector
/// waits as long as the answer's bucket says and retries once.
#[tokio::test]
async fn throttled_answers_are_retried_once_after_the_computed_wait() {
    for status in [200, 429] {
        let setup = Setup::new().await;
        setup.fake.set_bucket(100.0, 100.0, 100.0);
        setup.fake.throttle_with_status(status);
        setup
            .call(PRODUCT, json!({"product_id": "7001"}))
            .await
            .unwrap();
        setup.fake.drain();
        let output = setup
            .call(PRODUCT, json!({"product_id": "7001"}))
            .await
            .unwrap();
        assert_eq!(output.attempts, 2, "{status}");
        let served = setup.fake.served();
        let throttled: Vec<bool> = served.iter().map(|s| s.throttled).collect();
        assert_eq!(throttled, [false, true, false], "{status}");
        assert_eq!(served[1].status, status);
        // The retry waited for the bucket to hold the query's cost, by the fake's own clock.
        let waited = served[2].at - served[1].at;
        let needed = Duration::from_secs_f64(COST_PRODUCT.0 / 100.0);
        assert!(waited >= needed, "{status}: retried after {waited:?}");
        assert!(served[2].available_before >= COST_PRODUCT.0);
    }
}

/// A THROTTLED retry that is throttled again fails as rate limited, never a third request.
#[tokio::test]
async fn a_second_throttle_fails_as_rate_limited() {
    let setup = Setup::new().await;
    setup.fake.set_bucket(100.0, 100.0, 100.0);
    setup
        .call(PRODUCT, json!({"product_id": "7001"}))
        .await
        .unwrap();
    let throttled = json!({
        "errors": [{"message": "Throttled", "extensions": {"code": "THROTTLED"}}],
        "extensions": {"cost": {"requestedQueryCost": 13, "actualQueryCost": null,
            "throttleStatus": {"maximumAvailable": 100.0, "currentlyAvailable": 10, "restoreRate": 100.0}}}
    });
    setup.fake.answer_next(throttled.clone()).await;
    setup.fake.answer_next(throttled).await;
    let err = setup
        .call(PRODUCT, json!({"product_id": "7001"}))
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::VendorRateLimited);
    assert_eq!(err.attempts, Some(2));
    assert_eq!(setup.fake.total_requests().await, 3);
}

/// A burst of concurrent lookups against a small bucket: the limiter spaces them so the fake
/// never has to refuse one, and, by the fake's own log, the burst took at least as long as the
/// restore rate demands (the load of the machine can only make it longer).
#[tokio::test]
async fn a_burst_against_a_small_bucket_is_never_throttled() {
    let setup = Setup::new().await;
    let (maximum, rate) = (40.0, 100.0);
    setup.fake.set_bucket(maximum, maximum, rate);
    let lookups = 12;
    let mut calls = Vec::new();
    for _ in 0..lookups {
        let connector = Arc::clone(&setup.connector);
        let secret = setup.fake.token_secret();
        calls.push(tokio::spawn(async move {
            let ctx = context(PRODUCT, Some(&secret), Duration::from_secs(30));
            let name = ctx.tool.clone();
            connector
                .invoke(ctx, &name, json!({"product_id": "7001"}))
                .await
        }));
    }
    for call in calls {
        let output = call.await.unwrap().unwrap();
        assert_eq!(output.attempts, 1, "a lookup was retried");
    }
    let served = setup.fake.served();
    assert_eq!(served.len(), lookups, "one request per lookup");
    assert!(served.iter().all(|s| !s.throttled), "{served:#?}");
    assert!(
        served
            .iter()
            .all(|s| s.available_before >= s.requested_cost),
        "{served:#?}"
    );
    // Every request but the last was charged its actual cost; the last needed its requested
    // cost in the bucket: the burst cannot have been faster than the restore rate allows.
    let (requested, actual) = COST_PRODUCT;
    let count = f64::from(u32::try_from(lookups).unwrap());
    let minimum = ((count - 1.0) * actual + requested - maximum) / rate;
    let span = served.last().unwrap().at - served[0].at;
    assert!(
        span.as_secs_f64() >= minimum,
        "{span:?} is faster than the bucket allows ({minimum} s)"
    );
}

/// A wait longer than the call may take fails at once, nothing sent.
#[tokio::test]
async fn a_wait_past_the_deadline_fails_fast_with_nothing_sent() {
    let setup = Setup::new().await;
    // 20 points, restoring 1 per second: after one lookup (13 requested, 10 charged) the next
    // needs 3 more points, 3 seconds, and the call has 1.
    setup.fake.set_bucket(1000.0, 20.0, 1.0);
    setup
        .call(PRODUCT, json!({"product_id": "7001"}))
        .await
        .unwrap();
    let before = setup.fake.total_requests().await;
    let started = Instant::now();
    let secret = setup.fake.token_secret();
    let err = setup
        .call_with(
            &secret,
            PRODUCT,
            json!({"product_id": "7001"}),
            Duration::from_secs(1),
        )
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::VendorRateLimited);
    assert!(err.message.contains("nothing was sent"), "{}", err.message);
    assert_eq!(err.attempts, Some(0));
    assert_eq!(setup.fake.total_requests().await, before);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "it waited instead of failing"
    );
}

#[tokio::test]
async fn client_credentials_tokens_are_cached_and_refreshed_once_on_401() {
    let setup = Setup::new().await;
    let secret = setup.fake.client_secret();
    let product = json!({"product_id": "7001"});
    let timeout = Duration::from_secs(10);
    let first = setup
        .call_with(&secret, PRODUCT, product.clone(), timeout)
        .await
        .unwrap();
    // The token request and the query.
    assert_eq!(first.attempts, 2);
    setup
        .call_with(&secret, PRODUCT, product.clone(), timeout)
        .await
        .unwrap();
    assert_eq!(setup.fake.token_requests(), 1, "the token was reused");
    let requests = setup.fake.graphql_requests().await;
    let token = requests[0]
        .headers
        .get("x-shopify-access-token")
        .unwrap()
        .to_str()
        .unwrap()
        .to_owned();
    assert!(token.starts_with("shpat_cc"));

    // Revoked: the 401 gets one new token, and the query succeeds with it.
    setup.fake.revoke_tokens();
    let output = setup
        .call_with(&secret, PRODUCT, product.clone(), timeout)
        .await
        .unwrap();
    assert_eq!(setup.fake.token_requests(), 2);
    assert_eq!(output.attempts, 3, "401, token, query");
    assert!(!output.result.to_string().contains(&token));

    // Wrong client secret: refused, the secret never echoed.
    let wrong = json!({"shop": setup.fake.shop(), "client_id": crate::testkit::CLIENT_ID,
        "client_secret": "not-the-secret-0123456789"})
    .to_string();
    let err = setup
        .call_with(&wrong, PRODUCT, product, timeout)
        .await
        .unwrap_err();
    assert_eq!(err.code, ErrorCode::CredentialsNotFound);
    assert!(err.message.starts_with("invalid_client"), "{}", err.message);
    assert!(!err.message.contains("not-the-secret"), "{}", err.message);
}

#[tokio::test]
async fn client_credentials_tokens_are_replaced_before_they_expire() {
    let setup = Setup::with_config(|config| ShopifyConfig {
        token_refresh_margin: Duration::from_secs(1),
        ..config
    })
    .await;
    // Tokens live 2 s; with a 1 s margin each is used for at most 1 s.
    setup.fake.set_token_lifetime(2);
    let secret = setup.fake.client_secret();
    let product = json!({"product_id": "7001"});
    let timeout = Duration::from_secs(10);
    setup
        .call_with(&secret, PRODUCT, product.clone(), timeout)
        .await
        .unwrap();
    setup
        .call_with(&secret, PRODUCT, product.clone(), timeout)
        .await
        .unwrap();
    assert_eq!(setup.fake.token_requests(), 1);
    tokio::time::sleep(Duration::from_millis(1200)).await;
    setup
        .call_with(&secret, PRODUCT, product, timeout)
        .await
        .unwrap();
    assert_eq!(
        setup.fake.token_requests(),
        2,
        "the old token was not used past its margin"
    );
    assert!(setup.fake.served().iter().all(|s| s.status == 200));
}
