//! The outbound HTTP client every toolgate connector uses, and that internal services can use
//! on its own: retries that never duplicate a write, per-host rate limits, the call's deadline,
//! and an SSRF guard.
//!
//! - **Deadline**: [`HttpClient::send`] takes the call's deadline (a `tokio::time::Instant`)
//!   and never outlives it: admission, every attempt, body reads and backoff sleeps are bounded
//!   by it.
//! - **Retries** ([`RetryPolicy`]): only for requests marked idempotent, only on 429, the
//!   configured 5xx statuses and connection errors; full-jitter exponential backoff between a
//!   base and a cap; `Retry-After` (seconds or HTTP date) and `X-RateLimit-Reset` honoured; a
//!   wait the cap or the deadline cannot fit fails at once (`VENDOR_RATE_LIMITED` or
//!   `TIMEOUT`); a per-client [`RetryBudget`] keeps an outage from becoming a retry storm.
//!   [`Response::attempts`] and [`HttpError::attempts`] report requests sent, for the ledger.
//! - **Limits** ([`RateLimit`]): a `governor` limiter and an optional concurrency limit per
//!   host; a request waits only while its deadline allows. [`HttpClient::limit_host`] lowers a
//!   host's rate from what the vendor reports.
//! - **SSRF guard**: http and https only, no userinfo; every address a name resolves to (via a
//!   [`DnsResolver`]) is checked, and the connection goes to exactly the checked addresses;
//!   loopback, private, link-local (cloud metadata), unique-local, multicast, unspecified and
//!   IPv4-embedding IPv6 forms of those are refused unless the host is in
//!   [`VendorConfig::allow_hosts`]. Redirects are off by default; when on, each hop is checked.
//! - **Errors** ([`HttpError`], [`ErrorKind`]): classified and mapped to core's
//!   [`ErrorCode`](toolgate_core::ErrorCode); messages never contain query strings, header
//!   values or bodies. Bodies are capped (default 10 MiB).
//! - **Observability**: a `http.call` span per call and an `http.attempt` span (OpenTelemetry
//!   kind client) and event per attempt (method, host, path without query passed through core's
//!   `Redactor`, status, latency, attempt, retry reason). Each attempt carries the W3C
//!   `traceparent` of its span when the application installed a propagator and an
//!   OpenTelemetry layer (see `trace.rs`); nothing otherwise. An [`HttpObserver`] given in
//!   [`VendorConfig::observer`] is told of each attempt, retry, spent retry budget and
//!   rate-limit wait, per host (this crate keeps no metrics).
//!
//! Public signatures use the `http` crate's `Method`, `StatusCode` and `HeaderMap` (the
//! ecosystem's shared vocabulary, also what reqwest re-exports) and `bytes::Bytes`; reqwest
//! and governor stay private.
//!
//! # Example
//!
//! ```no_run
//! use std::time::Duration;
//! use toolgate_http::{HttpClient, RateLimit, Request, VendorConfig};
//!
//! # async fn example() -> Result<(), toolgate_http::HttpError> {
//! let mut config = VendorConfig::new("https://api.example.com/v1/");
//! config.default_headers.insert("authorization", "Bearer not-a-real-token".parse().unwrap());
//! config.rate_limit = RateLimit::per_second(10, 20);
//! let client = HttpClient::new(config)?;
//!
//! let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
//! let request = Request::get("orders").query("status", "open").idempotent(true);
//! match client.send(request, deadline).await {
//!     Ok(response) => println!("{} after {} attempt(s)", response.status, response.attempts),
//!     Err(error) => println!("{}: {error}", error.error_code()),
//! }
//! # Ok(())
//! # }
//! ```

mod client;
mod config;
mod error;
mod limit;
mod observe;
mod retry;
mod ssrf;
mod trace;

pub use client::{HttpClient, Request, Response};
pub use config::{DEFAULT_MAX_BODY_BYTES, VendorConfig};
pub use error::{ErrorKind, HttpError};
pub use limit::RateLimit;
pub use observe::{AttemptOutcome, HttpObserver, NoHttpObserver};
pub use retry::{RetryBudget, RetryPolicy, requested_wait};
pub use ssrf::{
    DnsResolver, Resolving, StaticResolver, SystemResolver, check_target, refused_range,
};
