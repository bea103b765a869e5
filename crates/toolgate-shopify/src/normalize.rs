//! Shopify's GraphQL shapes turned into the tools' results: snake_case names, money as
//! `{amount, currency}`, connections flattened with a `*_truncated` flag. Personal fields are
//! named so the ledger's output redaction recognises them (`email`, `phone`, `first_name`,
//! `last_name`, `full_name`, `shipping_address` with `address1`/`address2`, the postal code in
//! `zip`); the agent gets them whole.

use serde_json::{Map, Value, json};

/// An order, for `shopify.order_lookup`.
pub(crate) fn order(order: &Value) -> Value {
    let status = if !order["cancelledAt"].is_null() {
        "cancelled"
    } else if !order["closedAt"].is_null() {
        "closed"
    } else {
        "open"
    };
    let line_items: Vec<Value> = nodes(&order["lineItems"])
        .iter()
        .map(|item| {
            json!({
                "title": item["title"],
                "variant_title": item["variantTitle"],
                "sku": item["sku"],
                "quantity": item["quantity"],
                "current_quantity": item["currentQuantity"],
                "unfulfilled_quantity": item["unfulfilledQuantity"],
                "variant_id": item.pointer("/variant/id").cloned().unwrap_or(Value::Null),
                "unit_price": money(&item["originalUnitPriceSet"]),
            })
        })
        .collect();
    let fulfillments: Vec<Value> = order["fulfillments"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|f| {
            let tracking: Vec<Value> = f["trackingInfo"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|t| json!({"company": t["company"], "number": t["number"], "url": t["url"]}))
                .collect();
            json!({
                "status": f["status"],
                "display_status": f["displayStatus"],
                "created_at": f["createdAt"],
                "delivered_at": f["deliveredAt"],
                "estimated_delivery_at": f["estimatedDeliveryAt"],
                "tracking": tracking,
            })
        })
        .collect();
    let customer = match &order["customer"] {
        Value::Object(c) => json!({
            "id": c.get("id"),
            "full_name": c.get("displayName"),
            "first_name": c.get("firstName"),
            "last_name": c.get("lastName"),
            "email": order_pointer(&order["customer"], "/defaultEmailAddress/emailAddress"),
            "phone": order_pointer(&order["customer"], "/defaultPhoneNumber/phoneNumber"),
        }),
        _ => Value::Null,
    };
    let shipping_address = match &order["shippingAddress"] {
        Value::Object(a) => {
            let field = |name: &str| a.get(name).cloned().unwrap_or(Value::Null);
            json!({
                "first_name": field("firstName"),
                "last_name": field("lastName"),
                "company": field("company"),
                "address1": field("address1"),
                "address2": field("address2"),
                "city": field("city"),
                "province": field("province"),
                "province_code": field("provinceCode"),
                "zip": field("zip"),
                "country": field("country"),
                "country_code": field("countryCodeV2"),
                "phone": field("phone"),
            })
        }
        _ => Value::Null,
    };
    json!({
        "id": order["id"],
        "name": order["name"],
        "status": status,
        "financial_status": order["displayFinancialStatus"],
        "fulfillment_status": order["displayFulfillmentStatus"],
        "created_at": order["createdAt"],
        "processed_at": order["processedAt"],
        "closed_at": order["closedAt"],
        "cancelled_at": order["cancelledAt"],
        "cancel_reason": order["cancelReason"],
        "status_page_url": order["statusPageUrl"],
        "total": money(&order["currentTotalPriceSet"]),
        "subtotal": money(&order["subtotalPriceSet"]),
        "shipping": money(&order["totalShippingPriceSet"]),
        "line_items": line_items,
        "line_items_truncated": has_next_page(&order["lineItems"]),
        "fulfillments": fulfillments,
        "email": order["email"],
        "phone": order["phone"],
        "customer": customer,
        "shipping_address": shipping_address,
    })
}

/// A product with its variants, for `shopify.product_lookup`.
pub(crate) fn product(product: &Value) -> Value {
    let variants: Vec<Value> = nodes(&product["variants"])
        .iter()
        .map(|v| {
            let options: Map<String, Value> = v["selectedOptions"]
                .as_array()
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .filter_map(|o| Some((o["name"].as_str()?.to_owned(), o["value"].clone())))
                .collect();
            json!({
                "id": v["id"],
                "title": v["title"],
                "sku": v["sku"],
                "barcode": v["barcode"],
                "price": v["price"],
                "compare_at_price": v["compareAtPrice"],
                "available_for_sale": v["availableForSale"],
                "inventory_quantity": v["inventoryQuantity"],
                "options": options,
            })
        })
        .collect();
    let mut summary = product_summary(product);
    summary["tags"] = product["tags"].clone();
    summary["created_at"] = product["createdAt"].clone();
    summary["updated_at"] = product["updatedAt"].clone();
    summary["online_store_url"] = product["onlineStoreUrl"].clone();
    summary["variants"] = Value::Array(variants);
    summary["variants_truncated"] = Value::Bool(has_next_page(&product["variants"]));
    summary
}

/// A search hit, for `shopify.product_search`.
pub(crate) fn product_summary(product: &Value) -> Value {
    json!({
        "id": product["id"],
        "title": product["title"],
        "handle": product["handle"],
        "status": product["status"],
        "vendor": product["vendor"],
        "product_type": product["productType"],
        "total_inventory": product["totalInventory"],
        "price_min": money_v2(product.pointer("/priceRangeV2/minVariantPrice")),
        "price_max": money_v2(product.pointer("/priceRangeV2/maxVariantPrice")),
    })
}

/// The nodes of a connection (`{nodes: [...]}`), or of `{edges: [{node}]}`.
pub(crate) fn nodes(connection: &Value) -> Vec<Value> {
    if let Some(nodes) = connection["nodes"].as_array() {
        return nodes.clone();
    }
    connection["edges"]
        .as_array()
        .map(|edges| edges.iter().map(|e| e["node"].clone()).collect())
        .unwrap_or_default()
}

pub(crate) fn has_next_page(connection: &Value) -> bool {
    connection
        .pointer("/pageInfo/hasNextPage")
        .and_then(Value::as_bool)
        .unwrap_or(false)
}

fn order_pointer(value: &Value, pointer: &str) -> Value {
    value.pointer(pointer).cloned().unwrap_or(Value::Null)
}

/// A `MoneyBag` (`{shopMoney {amount currencyCode}}`) in the shop's currency.
fn money(bag: &Value) -> Value {
    money_v2(bag.get("shopMoney"))
}

fn money_v2(money: Option<&Value>) -> Value {
    match money {
        Some(Value::Object(m)) => {
            json!({"amount": m.get("amount"), "currency": m.get("currencyCode")})
        }
        _ => Value::Null,
    }
}
