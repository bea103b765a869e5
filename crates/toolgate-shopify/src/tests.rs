//! The connector against the fake Shopify.
