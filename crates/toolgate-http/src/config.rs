//! Per-vendor client configuration, passed in explicitly (this crate never reads the
//! environment).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderMap;

use crate::limit::RateLimit;
use crate::observe::{HttpObserver, NoHttpObserver};
use crate::retry::RetryPolicy;
use crate::ssrf::{DnsResolver, SystemResolver};

/// The default response body cap: 10 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 10 * 1024 * 1024;

/// How one vendor is called. Start from [`VendorConfig::new`] and override fields.
#[derive(Clone)]
pub struct VendorConfig {
    /// The vendor's base URL (`https://api.example.com/v1/`); relative request targets are
    /// joined onto it.
    pub base_url: String,
    /// Headers sent with every request whose origin is the base URL's (never to other hosts,
    /// including redirect targets). Values are never logged or printed.
    pub default_headers: HeaderMap,
    /// The longest a TCP (and TLS) connect may take. Default 5 s.
    pub connect_timeout: Duration,
    /// The response body cap. Default [`DEFAULT_MAX_BODY_BYTES`].
    pub max_body_bytes: usize,
    /// Retries for idempotent requests.
    pub retry: RetryPolicy,
    /// Requests per host; `None` means unlimited.
    pub rate_limit: Option<RateLimit>,
    /// In-flight requests per host; `None` means unlimited.
    pub max_concurrency: Option<usize>,
    /// Hosts exempt from the SSRF address check: names (`localhost`) or IP literals
    /// (`127.0.0.1`, `[::1]`). Schemes and userinfo are checked regardless.
    pub allow_hosts: Vec<String>,
    /// Redirects followed per attempt; 0 (the default) returns 3xx responses as they are.
    /// Each hop is checked by the SSRF guard again.
    pub max_redirects: u32,
    /// How names are resolved before their addresses are checked. Default: the system's.
    pub resolver: Arc<dyn DnsResolver>,
    /// Told about attempts, retries, spent retry budgets and rate-limit waits. Default: nothing
    /// is told ([`NoHttpObserver`]).
    pub observer: Arc<dyn HttpObserver>,
}

impl VendorConfig {
    /// Defaults for a vendor at `base_url`.
    pub fn new(base_url: impl Into<String>) -> VendorConfig {
        VendorConfig {
            base_url: base_url.into(),
            default_headers: HeaderMap::new(),
            connect_timeout: Duration::from_secs(5),
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            retry: RetryPolicy::default(),
            rate_limit: None,
            max_concurrency: None,
            allow_hosts: Vec::new(),
            max_redirects: 0,
            resolver: Arc::new(SystemResolver),
            observer: Arc::new(NoHttpObserver),
        }
    }
}

impl fmt::Debug for VendorConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Header values are credentials more often than not: print names only.
        let header_names: Vec<&str> = self.default_headers.keys().map(|k| k.as_str()).collect();
        f.debug_struct("VendorConfig")
            .field("base_url", &self.base_url)
            .field("default_headers", &header_names)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_body_bytes", &self.max_body_bytes)
            .field("retry", &self.retry)
            .field("rate_limit", &self.rate_limit)
            .field("max_concurrency", &self.max_concurrency)
            .field("allow_hosts", &self.allow_hosts)
            .field("max_redirects", &self.max_redirects)
            .field("resolver", &self.resolver)
            .field("observer", &self.observer)
            .finish()
    }
}
