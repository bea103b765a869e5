//! The Shopify connector end to end, the product's first scenario: a customer asks for the
//! status of order #1001 and the agent looks it up through the real gateway binary over gRPC,
//! pointed at the fake Shopify store through `[connectors.shopify]` in its toolgate.toml, the
//! credential stored with `toolgate secrets put`. The agent gets the order whole; the ledger
//! (`GetToolCall`, and the database files themselves) keeps the customer's e-mail, phone, name
//! and street redacted with the postal code kept. A Cedar condition on an argument, a tenant
//! without the credential, and bad input are checked on the way.

use serde_json::Value;
use toolgate_e2e::{Gateway, SHOPIFY_CONFIG, Tenant};
use toolgate_proto::v1 as pb;
use toolgate_shopify::testkit::{
    CUSTOMER_EMAIL, CUSTOMER_NAME, CUSTOMER_PHONE, CUSTOMER_STREET, CUSTOMER_ZIP, FakeShopify,
    ORDER_SHIPPED, TRACKING_NUMBER,
};

const TOOLS: &[&str] = &[
    "shopify.order_lookup",
    "shopify.product_lookup",
    "shopify.product_search",
];

const POLICY: &str = r#"
@id("base") permit(principal, action, resource);
@id("orders-by-number-only")
forbid(principal, action == Toolgate::Action::"shopify.order_lookup", resource)
  when { context.args has order_id };
"#;

/// `toolgate secrets put TENANT shopify_default`, the value on standard input (no newline);
/// the CLI never prints it.
fn put_secret(gateway: &Gateway, tenant: &str, value: &str) {
    let printed = gateway.secrets_put(tenant, "shopify_default", &[], value);
    assert!(!printed.contains("shpat_"), "{printed}");
}

/// Every byte of the gateway's ledger files (the database and its write-ahead log).
fn ledger_bytes(dir: &std::path::Path) -> Vec<u8> {
    let mut bytes = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("toolgate.db") && !name.ends_with(".lock") {
            bytes.extend(std::fs::read(&path).unwrap());
        }
    }
    bytes
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack
        .windows(needle.len())
        .any(|w| w == needle.as_bytes())
}

#[tokio::test]
async fn order_status_through_the_gateway_with_redacted_ledger() {
    let fake = FakeShopify::start().await;
    let gateway = Gateway::options().config(SHOPIFY_CONFIG).start();
    let token = Tenant::setup("acme")
        .tools(TOOLS)
        .policy(POLICY)
        .create(&gateway)
        .await
        .token;
    put_secret(&gateway, "acme", &fake.token_secret());
    let run = gateway.open_run(&token, "support", 0).await;

    // "What's the status of my order #1001?"
    let looked_up = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_01",
            "shopify.order_lookup",
            r##"{"order_number": "#1001"}"##,
        )
        .await;
    assert_eq!(
        looked_up.status(),
        pb::ToolCallStatus::Succeeded,
        "{looked_up:?}"
    );
    let order: Value = serde_json::from_str(&looked_up.result_json).unwrap();
    assert_eq!(order["name"], ORDER_SHIPPED);
    assert_eq!(order["fulfillment_status"], "PARTIALLY_FULFILLED");
    assert_eq!(
        order["fulfillments"][0]["tracking"][0]["number"],
        TRACKING_NUMBER
    );
    assert_eq!(order["line_items"].as_array().unwrap().len(), 2);
    // The agent gets the customer's data whole.
    assert_eq!(order["customer"]["email"], CUSTOMER_EMAIL);
    assert_eq!(order["customer"]["phone"], CUSTOMER_PHONE);
    assert_eq!(order["shipping_address"]["address1"], CUSTOMER_STREET);

    // The ledger keeps it redacted, the postal code and the tracking kept.
    let stored = gateway.get_tool_call(&token, &looked_up.tool_call_id).await;
    assert_eq!(stored.status(), pb::ToolCallStatus::Succeeded);
    assert_eq!(stored.attempts, 2, "the number search and the order");
    let redacted: Value = serde_json::from_str(&stored.output_redacted_json).unwrap();
    let text = stored.output_redacted_json.clone();
    for personal in [
        CUSTOMER_EMAIL,
        CUSTOMER_PHONE,
        CUSTOMER_STREET,
        CUSTOMER_NAME,
        "Suite 800",
    ] {
        assert!(!text.contains(personal), "{personal} stored: {text}");
    }
    assert_eq!(redacted["customer"]["email"], "[REDACTED EMAIL]");
    assert_eq!(redacted["email"], "[REDACTED EMAIL]");
    assert_eq!(redacted["customer"]["phone"], "[REDACTED PHONE]");
    assert_eq!(redacted["shipping_address"]["zip"], CUSTOMER_ZIP);
    assert_eq!(
        redacted["fulfillments"][0]["tracking"][0]["number"],
        TRACKING_NUMBER
    );
    assert_eq!(redacted["fulfillment_status"], "PARTIALLY_FULFILLED");
    // Nor is any of it in the database files, nor the access token.
    let bytes = ledger_bytes(&gateway.dir);
    assert!(!bytes.is_empty());
    for personal in [CUSTOMER_EMAIL, CUSTOMER_PHONE, CUSTOMER_STREET, "shpat_"] {
        assert!(
            !contains(&bytes, personal),
            "{personal} in the ledger files"
        );
    }
    let served = fake.served().len();

    // The policy allows lookups by the number the customer gives, never by raw id.
    let blocked = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_02",
            "shopify.order_lookup",
            r#"{"order_id": "5001"}"#,
        )
        .await;
    assert_eq!(blocked.status(), pb::ToolCallStatus::Blocked, "{blocked:?}");
    assert_eq!(blocked.error_code, "POLICY_BLOCKED");
    assert_eq!(fake.served().len(), served, "nothing sent");

    // Bad input stops at the gateway.
    for (id, arguments) in [
        ("toolu_03", r#"{"order_number": "ten-oh-one"}"#.to_owned()),
        ("toolu_04", format!(r#"{{"query": "{}"}}"#, "x".repeat(501))),
        ("toolu_05", r#"{"limit": 500}"#.to_owned()),
    ] {
        let tool = if arguments.contains("order") {
            "shopify.order_lookup"
        } else {
            "shopify.product_search"
        };
        let refused = gateway
            .call_with_id(&token, &run, id, tool, &arguments)
            .await;
        assert_eq!(refused.error_code, "INVALID_ARGUMENTS", "{refused:?}");
    }
    assert_eq!(fake.served().len(), served, "nothing sent");

    // An order the store does not have is a failure the LLM can relay.
    let missing = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_06",
            "shopify.order_lookup",
            r##"{"order_number": "#4242"}"##,
        )
        .await;
    assert_eq!(missing.status(), pb::ToolCallStatus::Failed);
    assert!(
        missing.error_message.starts_with("ORDER_NOT_FOUND"),
        "{missing:?}"
    );

    // Products and search work through the same credential.
    let product = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_07",
            "shopify.product_lookup",
            r#"{"handle": "classic-tee"}"#,
        )
        .await;
    assert_eq!(
        product.status(),
        pb::ToolCallStatus::Succeeded,
        "{product:?}"
    );
    let product: Value = serde_json::from_str(&product.result_json).unwrap();
    assert_eq!(product["variants"][0]["sku"], "TEE-BLK-M");
    let search = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_08",
            "shopify.product_search",
            r#"{"query": "product_type:Shirts", "limit": 3}"#,
        )
        .await;
    let page: Value = serde_json::from_str(&search.result_json).unwrap();
    assert_eq!(page["products"].as_array().unwrap().len(), 3);
    assert_eq!(page["has_next_page"], true);
}

#[tokio::test]
async fn a_tenant_without_the_credential_gets_credentials_not_found() {
    let fake = FakeShopify::start().await;
    let gateway = Gateway::options().config(SHOPIFY_CONFIG).start();
    let token = gateway.tenant("globex", "support", TOOLS).await;
    let run = gateway.open_run(&token, "support", 0).await;
    let outcome = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_01",
            "shopify.order_lookup",
            r##"{"order_number": "#1001"}"##,
        )
        .await;
    assert_eq!(outcome.status(), pb::ToolCallStatus::Failed, "{outcome:?}");
    assert_eq!(outcome.error_code, "CREDENTIALS_NOT_FOUND");
    assert_eq!(fake.total_requests().await, 0);

    // With client credentials stored, the same call runs, the token fetched by the grant.
    put_secret(&gateway, "globex", &fake.client_secret());
    let outcome = gateway
        .call_with_id(
            &token,
            &run,
            "toolu_02",
            "shopify.order_lookup",
            r##"{"order_number": "#1001"}"##,
        )
        .await;
    assert_eq!(
        outcome.status(),
        pb::ToolCallStatus::Succeeded,
        "{outcome:?}"
    );
    assert_eq!(fake.token_requests(), 1);
}
