//! The GraphQL documents the tools send, with field names current for the pinned API version
//! (2026-10: `defaultEmailAddress` / `defaultPhoneNumber` on `Customer`, `productByIdentifier`
//! instead of the deprecated `productByHandle`), and a cost estimate for each, used until
//! Shopify has reported the real requested cost once. Arguments always travel as variables,
//! never spliced into a document.

/// One query: its document, the limiter's key for its learned cost, and the estimate.
#[derive(Clone, Debug)]
pub(crate) struct Query {
    pub(crate) document: &'static str,
    pub(crate) key: String,
    pub(crate) estimate: f64,
}

/// Line items fetched per order; more are reported as truncated.
pub(crate) const ORDER_LINE_ITEMS: u32 = 50;
/// Fulfilments fetched per order.
pub(crate) const ORDER_FULFILLMENTS: u32 = 10;
/// Variants fetched per product; more are reported as truncated.
pub(crate) const PRODUCT_VARIANTS: u32 = 100;
/// Orders a number search considers (an exact name match is picked among them).
pub(crate) const ORDER_NAME_CANDIDATES: u32 = 5;

const ORDER: &str = r"query OrderLookup($id: ID!) {
  order(id: $id) {
    id name createdAt processedAt closedAt cancelledAt cancelReason
    displayFinancialStatus displayFulfillmentStatus statusPageUrl
    email phone
    currentTotalPriceSet { shopMoney { amount currencyCode } }
    subtotalPriceSet { shopMoney { amount currencyCode } }
    totalShippingPriceSet { shopMoney { amount currencyCode } }
    customer {
      id displayName firstName lastName
      defaultEmailAddress { emailAddress }
      defaultPhoneNumber { phoneNumber }
    }
    shippingAddress {
      firstName lastName company address1 address2 city province provinceCode zip country
      countryCodeV2 phone
    }
    lineItems(first: 50) {
      nodes {
        title quantity currentQuantity unfulfilledQuantity sku variantTitle
        variant { id }
        originalUnitPriceSet { shopMoney { amount currencyCode } }
      }
      pageInfo { hasNextPage }
    }
    fulfillments(first: 10) {
      status displayStatus createdAt deliveredAt estimatedDeliveryAt
      trackingInfo(first: 5) { company number url }
    }
  }
  currentAppInstallation { accessScopes { handle } }
}";

const ORDER_BY_NAME: &str = r"query OrderByName($query: String!) {
  orders(first: 5, query: $query) { nodes { id name } }
  currentAppInstallation { accessScopes { handle } }
}";

const PRODUCT_FIELDS: &str = r"
fragment ProductFields on Product {
  id title handle status vendor productType tags totalInventory createdAt updatedAt
  onlineStoreUrl
  priceRangeV2 {
    minVariantPrice { amount currencyCode }
    maxVariantPrice { amount currencyCode }
  }
  variants(first: 100) {
    nodes {
      id title sku barcode price compareAtPrice availableForSale inventoryQuantity
      selectedOptions { name value }
    }
    pageInfo { hasNextPage }
  }
}";

const PRODUCT: &str = r"query ProductLookup($id: ID!) {
  product(id: $id) { ...ProductFields }
}";

const PRODUCT_BY_HANDLE: &str = r"query ProductByHandle($handle: String!) {
  productByIdentifier(identifier: {handle: $handle}) { ...ProductFields }
}";

const PRODUCT_SEARCH: &str = r"query ProductSearch($query: String, $first: Int!, $after: String) {
  products(first: $first, after: $after, query: $query) {
    nodes {
      id title handle status vendor productType totalInventory
      priceRangeV2 {
        minVariantPrice { amount currencyCode }
        maxVariantPrice { amount currencyCode }
      }
    }
    pageInfo { hasNextPage endCursor }
  }
}";

/// Shopify's calculated cost (<https://shopify.dev/docs/api/usage/limits#cost-calculation>):
/// 1 per object, 2 per connection plus its `first` times the cost of one node. These
/// estimates only matter before the first answer; afterwards the reported cost is used.
fn connection(first: u32, node: f64) -> f64 {
    2.0 + f64::from(first) * node
}

pub(crate) fn order() -> Query {
    let line_items = connection(ORDER_LINE_ITEMS, 3.0);
    let fulfillments = f64::from(ORDER_FULFILLMENTS) * 6.0;
    Query {
        document: ORDER,
        key: "order".to_owned(),
        estimate: 10.0 + line_items + fulfillments,
    }
}

pub(crate) fn order_by_name() -> Query {
    Query {
        document: ORDER_BY_NAME,
        key: "order_by_name".to_owned(),
        estimate: connection(ORDER_NAME_CANDIDATES, 1.0) + 2.0,
    }
}

pub(crate) fn product(by_handle: bool) -> Query {
    let document = if by_handle {
        PRODUCT_BY_HANDLE
    } else {
        PRODUCT
    };
    Query {
        document,
        key: if by_handle {
            "product_by_handle"
        } else {
            "product"
        }
        .to_owned(),
        estimate: 4.0 + connection(PRODUCT_VARIANTS, 2.0),
    }
}

/// The fragment is appended once to whichever product document is sent.
pub(crate) fn with_fragments(query: &Query) -> String {
    if query.document.contains("...ProductFields") {
        format!("{}\n{PRODUCT_FIELDS}", query.document)
    } else {
        query.document.to_owned()
    }
}

pub(crate) fn product_search(first: u32) -> Query {
    Query {
        document: PRODUCT_SEARCH,
        // Cost grows with the page size: each size learns its own.
        key: format!("product_search:{first}"),
        estimate: connection(first, 4.0),
    }
}
