//! The three tool specs: names, JSON Schemas, descriptions written for an LLM, tags and risk.
//! All three only read, so all are idempotent and low risk; they carry the customer's personal
//! data in their results, which the ledger stores redacted.
//!
//! "Exactly one of these two arguments" is said in the descriptions and checked by the
//! connector, not written as a root-level `oneOf`: LLM tool APIs expect a plain object schema
//! at the root of a tool's input (OpenAI's strict mode refuses combinators there).

use std::time::Duration;

use serde_json::{Value, json};
use toolgate_core::{RiskLevel, SecretName, Tag, ToolName, ToolSpec};

use crate::credentials::SECRET_NAME;

/// The longest `query` `shopify.product_search` accepts, in characters.
pub const MAX_SEARCH_QUERY_CHARS: usize = 500;
/// The most products one `shopify.product_search` page returns.
pub const MAX_SEARCH_PAGE_SIZE: u64 = 50;
/// The page size when none is given.
pub const DEFAULT_SEARCH_PAGE_SIZE: u64 = 10;
/// The longest pagination cursor accepted.
pub(crate) const MAX_CURSOR_CHARS: usize = 1024;

/// `#1001` or `1001`.
pub(crate) const ORDER_NUMBER_PATTERN: &str = "^#?[0-9]{1,12}$";
/// `gid://shopify/Order/5678901234` or `5678901234`.
pub(crate) const ORDER_ID_PATTERN: &str = "^(gid://shopify/Order/)?[0-9]{1,20}$";
pub(crate) const PRODUCT_ID_PATTERN: &str = "^(gid://shopify/Product/)?[0-9]{1,20}$";
/// Shopify handles are lowercase letters, digits and hyphens (other scripts allowed too).
pub(crate) const MAX_HANDLE_CHARS: usize = 255;

fn name(action: &str) -> ToolName {
    ToolName::new(format!("shopify.{action}")).expect("static tool name")
}

fn secret() -> SecretName {
    SecretName::new(SECRET_NAME).expect("static secret name")
}

fn read(spec: ToolSpec, output: Value) -> ToolSpec {
    spec.tag(Tag::READ_ONLY)
        .tag("shopify")
        .tag("commerce")
        .risk(RiskLevel::Low)
        .idempotent(true)
        .secret(secret())
        .timeout(Duration::from_secs(20))
        .output_schema(output)
}

fn money() -> Value {
    json!({"type": ["object", "null"], "properties": {"amount": {"type": "string"}, "currency": {"type": "string"}}})
}

fn product_summary_properties() -> Value {
    json!({
        "id": {"type": "string"},
        "title": {"type": "string"},
        "handle": {"type": "string"},
        "status": {"type": "string"},
        "vendor": {"type": ["string", "null"]},
        "product_type": {"type": ["string", "null"]},
        "total_inventory": {"type": ["integer", "null"]},
        "price_min": money(),
        "price_max": money()
    })
}

/// Every tool the connector serves.
pub(crate) fn specs() -> Vec<ToolSpec> {
    vec![
        read(
            ToolSpec::new(
                name("order_lookup"),
                "Looks up one order in the store, by the order number the customer sees (such as \
                 #1001) or by its Shopify ID. Returns its status (open, closed, cancelled), \
                 financial status (e.g. PAID, REFUNDED), fulfilment status (e.g. UNFULFILLED, \
                 PARTIALLY_FULFILLED, FULFILLED), totals, every line item with quantity and SKU, \
                 the fulfilments with their tracking company, number and URL, the customer, and \
                 the order status page URL. Use it to answer \"where is my order?\". Give exactly \
                 one of order_number and order_id. An order that does not exist (or that the \
                 app may not see) is a failure saying so.",
                json!({
                    "type": "object",
                    "properties": {
                        "order_number": {
                            "type": "string",
                            "pattern": ORDER_NUMBER_PATTERN,
                            "description": "The order number as the customer has it, e.g. \"#1001\" (the # is optional)."
                        },
                        "order_id": {
                            "type": "string",
                            "pattern": ORDER_ID_PATTERN,
                            "description": "The order's Shopify ID, e.g. \"gid://shopify/Order/5678901234\" or \"5678901234\"."
                        }
                    },
                    "additionalProperties": false
                }),
            ),
            json!({
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "name": {"type": "string"},
                    "status": {"enum": ["open", "closed", "cancelled"]},
                    "financial_status": {"type": ["string", "null"]},
                    "fulfillment_status": {"type": "string"},
                    "total": money(),
                    "line_items": {"type": "array"},
                    "line_items_truncated": {"type": "boolean"},
                    "fulfillments": {"type": "array", "items": {"type": "object", "properties": {
                        "status": {"type": "string"},
                        "tracking": {"type": "array", "items": {"type": "object", "properties": {
                            "company": {"type": ["string", "null"]},
                            "number": {"type": ["string", "null"]},
                            "url": {"type": ["string", "null"]}
                        }}}
                    }}},
                    "customer": {"type": ["object", "null"]},
                    "shipping_address": {"type": ["object", "null"]}
                }
            }),
        ),
        read(
            ToolSpec::new(
                name("product_lookup"),
                "Looks up one product by its Shopify ID or its handle (the URL slug, e.g. \
                 \"classic-tee\"). Returns title, status (ACTIVE, DRAFT, ARCHIVED), vendor, type, \
                 tags, total inventory and price range, and up to 100 variants with SKU, price, \
                 options and inventory quantity. Give exactly one of product_id and handle. A \
                 product that does not exist is a failure saying so.",
                json!({
                    "type": "object",
                    "properties": {
                        "product_id": {
                            "type": "string",
                            "pattern": PRODUCT_ID_PATTERN,
                            "description": "The product's Shopify ID, e.g. \"gid://shopify/Product/7001\" or \"7001\"."
                        },
                        "handle": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": MAX_HANDLE_CHARS,
                            "description": "The product's handle, e.g. \"classic-tee\"."
                        }
                    },
                    "additionalProperties": false
                }),
            ),
            json!({
                "type": "object",
                "properties": {
                    "id": {"type": "string"},
                    "title": {"type": "string"},
                    "variants": {"type": "array", "items": {"type": "object", "properties": {
                        "id": {"type": "string"},
                        "sku": {"type": ["string", "null"]},
                        "price": {"type": "string"},
                        "inventory_quantity": {"type": ["integer", "null"]}
                    }}},
                    "variants_truncated": {"type": "boolean"}
                }
            }),
        ),
        read(
            ToolSpec::new(
                name("product_search"),
                "Searches the store's products with Shopify's search syntax, e.g. \"shirt\", \
                 \"title:*tee* status:active\", \"vendor:Acme product_type:Mugs\", \"sku:TEE-BLK-M\". \
                 Returns a page of products (id, title, handle, status, vendor, type, inventory, \
                 price range); use shopify.product_lookup for variants. Pass the returned \
                 next_cursor as `cursor` to get the next page.",
                json!({
                    "type": "object",
                    "properties": {
                        "query": {
                            "type": "string",
                            "maxLength": MAX_SEARCH_QUERY_CHARS,
                            "description": "Shopify search syntax; empty or absent lists all products."
                        },
                        "limit": {
                            "type": "integer",
                            "minimum": 1,
                            "maximum": MAX_SEARCH_PAGE_SIZE,
                            "description": "Products per page, 1 to 50. Default 10."
                        },
                        "cursor": {
                            "type": "string",
                            "minLength": 1,
                            "maxLength": MAX_CURSOR_CHARS,
                            "description": "next_cursor from a previous call, to continue."
                        }
                    },
                    "additionalProperties": false
                }),
            ),
            json!({
                "type": "object",
                "properties": {
                    "products": {"type": "array", "items": {"type": "object", "properties": product_summary_properties()}},
                    "has_next_page": {"type": "boolean"},
                    "next_cursor": {"type": ["string", "null"]}
                }
            }),
        ),
    ]
}
