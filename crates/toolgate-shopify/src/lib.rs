//! toolgate's Shopify connector: `shopify.order_lookup`, `shopify.product_lookup` and
//! `shopify.product_search` on the Admin GraphQL API.
//!
//! - **API**: `POST https://{shop}.myshopify.com/admin/api/{version}/graphql.json` with
//!   `X-Shopify-Access-Token`; the version is pinned in [`ShopifyConfig`] (default
//!   [`DEFAULT_API_VERSION`]); queries in `queries.rs`, results normalized in `normalize.rs`.
//! - **Credentials** (`credentials.rs`, `tokens.rs`): the tenant's `shopify_default` secret,
//!   `{shop, access_token}` or `{shop, client_id, client_secret}` (24-hour tokens from the
//!   client-credentials grant, cached per tenant and store, replaced once on a 401). The shop
//!   must be a `*.myshopify.com` domain unless the operator allows other hosts (tests).
//! - **Pacing** (`throttle.rs`): Shopify's cost-based leaky bucket, read from every answer's
//!   `extensions.cost`; a query waits until the bucket holds its cost, fails fast with
//!   `VENDOR_RATE_LIMITED` when that would pass the deadline, and a `THROTTLED` answer (200 or
//!   429) is retried once after the computed wait.
//! - **Errors** (`errors.rs`): 401/402/403/404/423/5xx and GraphQL `errors[]` codes become
//!   stable codes with sanitized messages; 402 and 423 are never retried.
//! - **Configuration**: [`ShopifyConfig`], passed by the gateway; nothing is read from the
//!   environment.
//!
//! The `testkit` feature adds [`testkit::FakeShopify`], a wiremock server answering in the
//! Admin API's documented shapes; it is never part of a production build.

mod admin;
mod config;
mod connector;
mod credentials;
mod errors;
mod normalize;
mod queries;
#[cfg(any(test, feature = "testkit"))]
pub mod testkit;
mod throttle;
mod tokens;
mod tools;

#[cfg(test)]
mod tests;

pub use config::{DEFAULT_API_VERSION, ShopifyConfig};
pub use connector::{ShopifyConfigError, ShopifyConnector};
pub use credentials::SECRET_NAME;
pub use tools::{DEFAULT_SEARCH_PAGE_SIZE, MAX_SEARCH_PAGE_SIZE, MAX_SEARCH_QUERY_CHARS};
