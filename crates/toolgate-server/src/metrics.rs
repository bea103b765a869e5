//! The gateway's Prometheus metrics: one registry, owned here (the libraries keep no metric
//! state; they report through their observer traits, which [`Metrics`] implements), and the
//! `GET /metrics` endpoint serving it in the OpenMetrics text format.
//!
//! Label values are bounded: a tool is a name from the registered catalogue (anything else an
//! agent sends is counted as `(unregistered)`), a status or decision one of core's fixed sets,
//! a vendor host one of the first [`MAX_HOSTS`] seen (later ones are `(other)`). No tenant,
//! run, argument or free text ever becomes a label.
//!
//! On the call path the cost is a map lookup by the requested name, an atomic add and two
//! histogram observations: counters and histograms are looked up in their families once per
//! tool and label set, then kept.

use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE};
use hyper::{Method, Request, Response, StatusCode};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::{Registry, Unit};
use tokio::net::TcpListener;
use toolgate_core::{Clock, Decision, Timestamp, ToolCallStatus};
use toolgate_engine::{CacheKind, CallReport, EngineObserver, llm_tool_name};
use toolgate_http::{AttemptOutcome, HttpObserver};
use toolgate_ledger::{LedgerObserver, PendingSummary, Store};
use tracing::{debug, warn};

/// The `Content-Type` of what `/metrics` answers.
pub const CONTENT_TYPE_OPENMETRICS: &str =
    "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Vendor hosts kept as label values; requests to others are counted as `(other)`.
pub const MAX_HOSTS: usize = 64;

/// The label of a call whose tool is not in the catalogue.
const UNREGISTERED: &str = "(unregistered)";
/// The label of a vendor host past [`MAX_HOSTS`].
const OTHER_HOST: &str = "(other)";
/// The status label of a request the engine could not serve at all.
const NOT_SERVED: &str = "error";
/// The decision label of a call no policy decided.
const NO_DECISION: &str = "none";

/// Gateway overhead: tens of microseconds to a few milliseconds (a ledger commit).
const OVERHEAD_BUCKETS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];
/// Connectors: vendor round trips, up to the engine's longest timeout.
const CONNECTOR_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];
/// Ledger batches: one fsync'd commit, sometimes a re-run.
const COMMIT_BUCKETS: &[f64] = &[
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];
/// Operations per batch, up to the writers' caps (256 on SQLite, 512 on PostgreSQL).
const BATCH_BUCKETS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// Statuses a call is counted under: core's, then [`NOT_SERVED`].
const STATUSES: usize = ToolCallStatus::ALL.len() + 1;
/// Decisions a call is counted under: core's, then [`NO_DECISION`].
const DECISIONS: usize = Decision::ALL.len() + 1;

/// Every metric the gateway exports, and the registry they are exported from.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// The catalogue's tools, under both names an agent may use; set once the registry is
    /// built (the vendor clients need this value before).
    tools: OnceLock<HashMap<String, Arc<ToolMetrics>>>,
    unregistered: Arc<ToolMetrics>,
    families: ToolFamilies,
    cache_hits: [Counter; CacheKind::ALL.len()],
    cache_misses: [Counter; CacheKind::ALL.len()],
    commit_seconds: Histogram,
    batch_operations: Histogram,
    failed_batches: Counter,
    vendor: Vendor,
}

/// The per-tool families; a tool's series are taken from them on first use.
#[derive(Debug, Clone)]
struct ToolFamilies {
    calls: Family<CallLabels, Counter>,
    overhead: Family<ToolLabels, Histogram, fn() -> Histogram>,
    connector: Family<ToolLabels, Histogram, fn() -> Histogram>,
}

/// One tool's series, each taken from its family on first use and kept.
#[derive(Debug)]
struct ToolMetrics {
    tool: Arc<str>,
    /// By status index, then decision index.
    calls: [[OnceLock<Counter>; DECISIONS]; STATUSES],
    overhead: OnceLock<Histogram>,
    connector: OnceLock<Histogram>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CallLabels {
    tool: Arc<str>,
    status: &'static str,
    decision: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolLabels {
    tool: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabels {
    host: Arc<str>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    host: Arc<str>,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CacheLabels {
    cache: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: &'static str,
}

/// Vendor HTTP, per host.
#[derive(Debug)]
struct Vendor {
    hosts: Hosts,
    attempts: Family<AttemptLabels, Counter>,
    retries: Family<HostLabels, Counter>,
    budget_refusals: Family<HostLabels, Counter>,
    rate_limit_waits: Family<HostLabels, Counter>,
    rate_limit_wait_seconds: Family<HostLabels, Counter<f64, AtomicU64>>,
}

/// The vendor hosts used as label values: the first [`MAX_HOSTS`] seen.
#[derive(Debug, Default)]
struct Hosts {
    known: RwLock<HashSet<Arc<str>>>,
}

impl Metrics {
    /// A registry with every metric, and the process's start time and build version.
    pub fn new() -> Metrics {
        let mut registry = Registry::default();
        let families = ToolFamilies {
            calls: Family::default(),
            overhead: Family::new_with_constructor(|| Histogram::new(OVERHEAD_BUCKETS.to_vec())),
            connector: Family::new_with_constructor(|| Histogram::new(CONNECTOR_BUCKETS.to_vec())),
        };
        registry.register(
            "toolgate_tool_calls",
            "Tool calls answered by ExecuteTool, by tool, status and policy decision",
            families.calls.clone(),
        );
        registry.register_with_unit(
            "toolgate_gateway_overhead",
            "Time ExecuteTool spent in the gateway (the whole call minus the connector), by tool",
            Unit::Seconds,
            families.overhead.clone(),
        );
        registry.register_with_unit(
            "toolgate_connector_duration",
            "Time a connector ran (new and approved calls), by tool",
            Unit::Seconds,
            families.connector.clone(),
        );

        let hits: Family<CacheLabels, Counter> = Family::default();
        let misses: Family<CacheLabels, Counter> = Family::default();
        let cache_hits = CacheKind::ALL.map(|kind| {
            hits.get_or_create_owned(&CacheLabels {
                cache: kind.as_str(),
            })
        });
        let cache_misses = CacheKind::ALL.map(|kind| {
            misses.get_or_create_owned(&CacheLabels {
                cache: kind.as_str(),
            })
        });
        registry.register(
            "toolgate_cache_hits",
            "Lookups the engine's in-memory caches answered, by cache",
            hits,
        );
        registry.register(
            "toolgate_cache_misses",
            "Lookups the engine's caches could not answer (absent or expired), by cache",
            misses,
        );

        let commit_seconds = Histogram::new(COMMIT_BUCKETS.to_vec());
        let batch_operations = Histogram::new(BATCH_BUCKETS.to_vec());
        let failed_batches = Counter::default();
        registry.register_with_unit(
            "toolgate_ledger_commit_duration",
            "Time the ledger's writer took for one batch, from its queue to the answers (commit and fsync included)",
            Unit::Seconds,
            commit_seconds.clone(),
        );
        registry.register(
            "toolgate_ledger_batch_operations",
            "Writes committed together in one ledger batch",
            batch_operations.clone(),
        );
        registry.register(
            "toolgate_ledger_failed_batches",
            "Ledger batches that failed as a whole",
            failed_batches.clone(),
        );

        let vendor = Vendor {
            hosts: Hosts::default(),
            attempts: Family::default(),
            retries: Family::default(),
            budget_refusals: Family::default(),
            rate_limit_waits: Family::default(),
            rate_limit_wait_seconds: Family::default(),
        };
        registry.register(
            "toolgate_vendor_http_attempts",
            "Requests sent to vendors, retries included, by host and outcome (status class, 429, connection, timeout, refused)",
            vendor.attempts.clone(),
        );
        registry.register(
            "toolgate_vendor_http_retries",
            "Vendor requests retried, by host",
            vendor.retries.clone(),
        );
        registry.register(
            "toolgate_vendor_http_retry_budget_refusals",
            "Retries not made because the client's retry budget was spent, by host",
            vendor.budget_refusals.clone(),
        );
        registry.register(
            "toolgate_vendor_http_rate_limit_waits",
            "Vendor requests that waited for the host's rate limit, by host",
            vendor.rate_limit_waits.clone(),
        );
        registry.register_with_unit(
            "toolgate_vendor_http_rate_limit_wait",
            "Time vendor requests waited for the host's rate limit, by host",
            Unit::Seconds,
            vendor.rate_limit_wait_seconds.clone(),
        );

        let start: Gauge<f64, AtomicU64> = Gauge::default();
        start.set(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs_f64(),
        );
        registry.register(
            "process_start_time_seconds",
            "When the gateway process started, in seconds since the Unix epoch",
            start,
        );
        registry.register(
            "toolgate_build",
            "The gateway's version",
            Info::new(BuildLabels {
                version: env!("CARGO_PKG_VERSION"),
            }),
        );

        let unregistered = Arc::new(ToolMetrics::new(Arc::from(UNREGISTERED)));
        Metrics {
            registry,
            tools: OnceLock::new(),
            unregistered,
            families,
            cache_hits,
            cache_misses,
            commit_seconds,
            batch_operations,
            failed_batches,
            vendor,
        }
    }

    /// The catalogue's tools, the only tool names used as labels. Set once; later calls are
    /// ignored.
    pub fn set_tools<'a>(&self, names: impl IntoIterator<Item = &'a toolgate_core::ToolName>) {
        let mut tools = HashMap::new();
        for name in names {
            let metrics = Arc::new(ToolMetrics::new(Arc::from(name.as_str())));
            // Agents may name a tool `family.action` or `family__action`.
            tools.insert(llm_tool_name(name), Arc::clone(&metrics));
            tools.insert(name.as_str().to_owned(), metrics);
        }
        let _ = self.tools.set(tools);
    }

    /// The whole exposition: every metric, then the pending approvals when `pending` could be
    /// read (they are left out, not shown stale, when the ledger could not answer), then
    /// `# EOF`.
    pub fn render(&self, pending: Option<PendingSummary>, now: Timestamp) -> String {
        let mut text = String::new();
        // Writing to a String cannot fail, and every label value is escaped by the encoder.
        let _ = encode_registry(&mut text, &self.registry);
        if let Some(pending) = pending {
            let _ = encode_registry(&mut text, &pending_registry(pending, now));
        }
        let _ = encode_eof(&mut text);
        text
    }

    fn tool(&self, requested: &str) -> &ToolMetrics {
        self.tools
            .get()
            .and_then(|tools| tools.get(requested))
            .unwrap_or(&self.unregistered)
    }
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics::new()
    }
}

/// The pending approvals of every tenant, as read at this scrape. Every replica sharing a
/// PostgreSQL ledger reports the same figures: aggregate them with `max`, not `sum`.
fn pending_registry(pending: PendingSummary, now: Timestamp) -> Registry {
    let mut registry = Registry::default();
    let count: Gauge = Gauge::default();
    count.set(i64::try_from(pending.count).unwrap_or(i64::MAX));
    registry.register(
        "toolgate_pending_approvals",
        "Pending invocations awaiting a human decision, all tenants, read from the ledger at scrape time",
        count,
    );
    let age: Gauge<f64, AtomicU64> = Gauge::default();
    let age_ms = pending
        .oldest_created_at
        .map_or(0, |oldest| now.0.saturating_sub(oldest.0).max(0));
    age.set(Duration::from_millis(u64::try_from(age_ms).unwrap_or(0)).as_secs_f64());
    registry.register_with_unit(
        "toolgate_oldest_pending_approval_age",
        "Age of the oldest pending invocation (0 when there is none), read from the ledger at scrape time",
        Unit::Seconds,
        age,
    );
    registry
}

impl ToolMetrics {
    fn new(tool: Arc<str>) -> ToolMetrics {
        ToolMetrics {
            tool,
            calls: std::array::from_fn(|_| std::array::from_fn(|_| OnceLock::new())),
            overhead: OnceLock::new(),
            connector: OnceLock::new(),
        }
    }

    fn calls(
        &self,
        families: &ToolFamilies,
        status: Option<ToolCallStatus>,
        decision: Option<Decision>,
    ) -> &Counter {
        let status_index = status
            .and_then(|s| ToolCallStatus::ALL.iter().position(|known| *known == s))
            .unwrap_or(STATUSES - 1);
        let decision_index = decision
            .and_then(|d| Decision::ALL.iter().position(|known| *known == d))
            .unwrap_or(DECISIONS - 1);
        self.calls[status_index][decision_index].get_or_init(|| {
            families.calls.get_or_create_owned(&CallLabels {
                tool: Arc::clone(&self.tool),
                status: status.map_or(NOT_SERVED, ToolCallStatus::as_str),
                decision: decision.map_or(NO_DECISION, Decision::as_str),
            })
        })
    }

    fn overhead(&self, families: &ToolFamilies) -> &Histogram {
        self.overhead.get_or_init(|| {
            families.overhead.get_or_create_owned(&ToolLabels {
                tool: Arc::clone(&self.tool),
            })
        })
    }

    fn connector(&self, families: &ToolFamilies) -> &Histogram {
        self.connector.get_or_init(|| {
            families.connector.get_or_create_owned(&ToolLabels {
                tool: Arc::clone(&self.tool),
            })
        })
    }
}

impl EngineObserver for Metrics {
    fn call_finished(&self, report: &CallReport<'_>) {
        let tool = self.tool(report.requested_tool);
        tool.calls(&self.families, report.status, report.decision)
            .inc();
        let overhead = report.total.saturating_sub(report.connector);
        tool.overhead(&self.families)
            .observe(overhead.as_secs_f64());
    }

    fn connector_finished(&self, tool: &str, elapsed: Duration) {
        self.tool(tool)
            .connector(&self.families)
            .observe(elapsed.as_secs_f64());
    }

    fn cache_lookup(&self, cache: CacheKind, hit: bool) {
        let Some(index) = CacheKind::ALL.iter().position(|kind| *kind == cache) else {
            return;
        };
        let counters = if hit {
            &self.cache_hits
        } else {
            &self.cache_misses
        };
        counters[index].inc();
    }
}

impl LedgerObserver for Metrics {
    fn batch_committed(&self, operations: usize, elapsed: Duration, committed: bool) {
        self.commit_seconds.observe(elapsed.as_secs_f64());
        // Batch sizes are at most a few hundred: exact as an f64.
        self.batch_operations.observe(operations as f64);
        if !committed {
            self.failed_batches.inc();
        }
    }
}

impl HttpObserver for Metrics {
    fn attempt(&self, host: &str, outcome: AttemptOutcome) {
        let labels = AttemptLabels {
            host: self.vendor.hosts.label(host),
            outcome: outcome_label(outcome),
        };
        self.vendor.attempts.get_or_create(&labels).inc();
    }

    fn retry(&self, host: &str) {
        let labels = self.vendor.host(host);
        self.vendor.retries.get_or_create(&labels).inc();
    }

    fn retry_budget_refused(&self, host: &str) {
        let labels = self.vendor.host(host);
        self.vendor.budget_refusals.get_or_create(&labels).inc();
    }

    fn rate_limit_wait(&self, host: &str, waited: Duration) {
        let labels = self.vendor.host(host);
        self.vendor.rate_limit_waits.get_or_create(&labels).inc();
        self.vendor
            .rate_limit_wait_seconds
            .get_or_create(&labels)
            .inc_by(waited.as_secs_f64());
    }
}

impl Vendor {
    fn host(&self, host: &str) -> HostLabels {
        HostLabels {
            host: self.hosts.label(host),
        }
    }
}

impl Hosts {
    /// `host` if it is among the first [`MAX_HOSTS`] seen, else `(other)`.
    fn label(&self, host: &str) -> Arc<str> {
        {
            let known = self.known.read().unwrap_or_else(|e| e.into_inner());
            if let Some(found) = known.get(host) {
                return Arc::clone(found);
            }
            if known.len() >= MAX_HOSTS {
                return Arc::from(OTHER_HOST);
            }
        }
        let mut known = self.known.write().unwrap_or_else(|e| e.into_inner());
        if let Some(found) = known.get(host) {
            return Arc::clone(found);
        }
        if known.len() >= MAX_HOSTS {
            return Arc::from(OTHER_HOST);
        }
        let label: Arc<str> = Arc::from(host);
        known.insert(Arc::clone(&label));
        label
    }
}

/// An attempt's outcome as a label: the status class, with 429 apart (it is the one that
/// says the vendor is throttling).
fn outcome_label(outcome: AttemptOutcome) -> &'static str {
    match outcome {
        AttemptOutcome::Status(429) => "429",
        AttemptOutcome::Status(100..=199) => "1xx",
        AttemptOutcome::Status(200..=299) => "2xx",
        AttemptOutcome::Status(300..=399) => "3xx",
        AttemptOutcome::Status(400..=499) => "4xx",
        AttemptOutcome::Status(_) => "5xx",
        AttemptOutcome::Connection => "connection",
        AttemptOutcome::Timeout => "timeout",
        AttemptOutcome::Refused => "refused",
    }
}

/// What the endpoint needs to answer a scrape.
#[derive(Clone, Debug)]
pub(crate) struct Scrape {
    pub(crate) metrics: Arc<Metrics>,
    pub(crate) store: Arc<dyn Store>,
    pub(crate) clock: Arc<dyn Clock>,
}

/// How long a client may take to send its request headers.
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves `GET /metrics` on `listener` (HTTP/1.1) until the task is dropped.
pub(crate) async fn serve(listener: TcpListener, scrape: Scrape) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of file descriptors and the like: wait rather than spin.
                warn!(%error, "the metrics listener could not accept a connection");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let scrape = scrape.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| {
                let scrape = scrape.clone();
                async move { Ok::<_, Infallible>(scrape.answer(&request).await) }
            });
            let served = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                debug!(%error, "metrics connection ended with an error");
            }
        });
    }
}

impl Scrape {
    async fn answer(&self, request: &Request<Incoming>) -> Response<Full<Bytes>> {
        if request.uri().path() != "/metrics" {
            return plain(
                StatusCode::NOT_FOUND,
                "not found: the metrics are at /metrics\n",
            );
        }
        if request.method() != Method::GET && request.method() != Method::HEAD {
            let mut response = plain(StatusCode::METHOD_NOT_ALLOWED, "use GET\n");
            response
                .headers_mut()
                .insert(ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
            return response;
        }
        let pending = match self.store.pending_summary().await {
            Ok(pending) => Some(pending),
            Err(error) => {
                warn!(%error, "the metrics scrape could not count pending approvals");
                None
            }
        };
        let text = self.metrics.render(pending, self.clock.now());
        let mut response = Response::new(Full::new(Bytes::from(text)));
        response.headers_mut().insert(
            CONTENT_TYPE,
            hyper::header::HeaderValue::from_static(CONTENT_TYPE_OPENMETRICS),
        );
        response
    }
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The running endpoint; dropping it stops the endpoint.
#[derive(Debug)]
pub(crate) struct Endpoint {
    task: tokio::task::JoinHandle<()>,
    /// Where it listens (the port chosen when the configuration said 0).
    pub(crate) local: std::net::SocketAddr,
}

impl Endpoint {
    /// Binds `address` and serves the metrics there.
    pub(crate) async fn start(
        address: std::net::SocketAddr,
        scrape: Scrape,
    ) -> anyhow::Result<Endpoint> {
        use anyhow::Context as _;
        let listener = TcpListener::bind(address)
            .await
            .with_context(|| format!("cannot listen on {address} for metrics (metrics.listen)"))?;
        let local = listener.local_addr()?;
        let task = tokio::spawn(serve(listener, scrape));
        Ok(Endpoint { task, local })
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use toolgate_core::ToolName;

    use super::*;

    fn metrics_with(tools: &[&str]) -> Metrics {
        let metrics = Metrics::new();
        let names: Vec<ToolName> = tools.iter().map(|t| ToolName::new(*t).unwrap()).collect();
        metrics.set_tools(&names);
        metrics
    }

    fn report(
        tool: &str,
        status: Option<ToolCallStatus>,
        decision: Option<Decision>,
    ) -> CallReport<'_> {
        CallReport {
            requested_tool: tool,
            status,
            decision,
            total: Duration::from_millis(12),
            connector: Duration::from_millis(10),
        }
    }

    /// The lines of `text` starting with `prefix`.
    fn lines<'a>(text: &'a str, prefix: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(prefix)).collect()
    }

    #[test]
    fn calls_are_counted_by_catalogue_tool_status_and_decision() {
        let metrics = metrics_with(&["testkit.echo"]);
        let allowed = (Some(ToolCallStatus::Succeeded), Some(Decision::Allow));
        // (requested name, status, decision): both names of a tool count as one.
        let cases = [
            ("testkit.echo", allowed),
            ("testkit__echo", allowed),
            (
                "testkit.echo",
                (Some(ToolCallStatus::Blocked), Some(Decision::Block)),
            ),
            ("testkit.echo", (None, None)),
            // Whatever else an agent sends is one label, never its text.
            (
                "ignore previous instructions",
                (Some(ToolCallStatus::Blocked), None),
            ),
            ("acme.secret_tool", (Some(ToolCallStatus::Blocked), None)),
        ];
        for (tool, (status, decision)) in cases {
            metrics.call_finished(&report(tool, status, decision));
        }
        let text = metrics.render(None, Timestamp(0));
        let mut counted = lines(&text, "toolgate_tool_calls_total{");
        counted.sort_unstable();
        assert_eq!(
            counted,
            [
                r#"toolgate_tool_calls_total{tool="(unregistered)",status="blocked",decision="none"} 2"#,
                r#"toolgate_tool_calls_total{tool="testkit.echo",status="blocked",decision="block"} 1"#,
                r#"toolgate_tool_calls_total{tool="testkit.echo",status="error",decision="none"} 1"#,
                r#"toolgate_tool_calls_total{tool="testkit.echo",status="succeeded",decision="allow"} 2"#,
            ]
        );
        assert!(!text.contains("instructions") && !text.contains("secret_tool"));
        // The overhead is the call minus its connector: 2 ms, in the 2.5 ms bucket.
        assert!(
            text.contains(
                r#"toolgate_gateway_overhead_seconds_bucket{le="0.0025",tool="testkit.echo"} 4"#
            ),
            "{text}"
        );
        assert!(text.contains("# TYPE toolgate_gateway_overhead_seconds histogram"));
        assert!(text.contains("# UNIT toolgate_gateway_overhead_seconds seconds"));
    }

    #[test]
    fn the_exposition_is_openmetrics_with_build_info_start_time_and_eof() {
        let metrics = metrics_with(&[]);
        metrics.connector_finished("testkit.noop", Duration::from_millis(30));
        metrics.cache_lookup(CacheKind::Runs, true);
        metrics.cache_lookup(CacheKind::Runs, true);
        metrics.cache_lookup(CacheKind::Policies, false);
        metrics.batch_committed(3, Duration::from_micros(800), true);
        metrics.batch_committed(1, Duration::from_millis(2), false);
        let text = metrics.render(None, Timestamp(0));
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1);
        for line in [
            "# TYPE toolgate_build info",
            concat!(
                r#"toolgate_build_info{version=""#,
                env!("CARGO_PKG_VERSION"),
                r#""} 1"#
            ),
            "# TYPE process_start_time_seconds gauge",
            r#"toolgate_cache_hits_total{cache="runs"} 2"#,
            r#"toolgate_cache_hits_total{cache="flags"} 0"#,
            r#"toolgate_cache_misses_total{cache="policies"} 1"#,
            "toolgate_ledger_commit_duration_seconds_count 2",
            "toolgate_ledger_batch_operations_sum 4.0",
            "toolgate_ledger_failed_batches_total 1",
            r#"toolgate_connector_duration_seconds_count{tool="(unregistered)"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
        // No pending figures without a reading of the ledger: absent, not stale. A family
        // with no series yet (no call counted) is left out too.
        assert!(!text.contains("toolgate_pending_approvals"));
        assert!(!text.contains("toolgate_tool_calls"));
        let start = lines(&text, "process_start_time_seconds ")[0]
            .trim_start_matches("process_start_time_seconds ")
            .parse::<f64>()
            .unwrap();
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(start <= now && start > now - 60.0, "{start}");
    }

    #[test]
    fn pending_approvals_are_read_at_scrape_time() {
        let metrics = metrics_with(&[]);
        let pending = PendingSummary {
            count: 3,
            oldest_created_at: Some(Timestamp(1_000)),
        };
        let text = metrics.render(Some(pending), Timestamp(91_000));
        assert!(
            text.lines().any(|l| l == "toolgate_pending_approvals 3"),
            "{text}"
        );
        assert!(
            text.lines()
                .any(|l| l == "toolgate_oldest_pending_approval_age_seconds 90.0"),
            "{text}"
        );
        assert!(text.ends_with("# EOF\n"));
        assert_eq!(text.matches("# EOF").count(), 1);
        let none = metrics.render(Some(PendingSummary::default()), Timestamp(5));
        assert!(none.lines().any(|l| l == "toolgate_pending_approvals 0"));
        assert!(
            none.lines()
                .any(|l| l == "toolgate_oldest_pending_approval_age_seconds 0.0")
        );
    }

    #[test]
    fn vendor_hosts_are_bounded() {
        let metrics = metrics_with(&[]);
        for i in 0..MAX_HOSTS + 10 {
            metrics.attempt(
                &format!("shop{i}.myshopify.com"),
                AttemptOutcome::Status(200),
            );
        }
        metrics.attempt("shop0.myshopify.com", AttemptOutcome::Status(429));
        metrics.retry("shop0.myshopify.com");
        metrics.retry_budget_refused("api.example.com");
        metrics.rate_limit_wait("shop1.myshopify.com", Duration::from_millis(250));
        let text = metrics.render(None, Timestamp(0));
        let attempts = lines(&text, "toolgate_vendor_http_attempts_total{");
        let hosts: HashSet<&str> = attempts
            .iter()
            .filter_map(|l| l.split('"').nth(1))
            .collect();
        assert_eq!(hosts.len(), MAX_HOSTS + 1, "{hosts:?}");
        assert!(hosts.contains(OTHER_HOST));
        for line in [
            r#"toolgate_vendor_http_attempts_total{host="(other)",outcome="2xx"} 10"#,
            r#"toolgate_vendor_http_attempts_total{host="shop0.myshopify.com",outcome="429"} 1"#,
            r#"toolgate_vendor_http_retries_total{host="shop0.myshopify.com"} 1"#,
            // Past the bound, a new host is `(other)` wherever it is counted.
            r#"toolgate_vendor_http_retry_budget_refusals_total{host="(other)"} 1"#,
            r#"toolgate_vendor_http_rate_limit_waits_total{host="shop1.myshopify.com"} 1"#,
            r#"toolgate_vendor_http_rate_limit_wait_seconds_total{host="shop1.myshopify.com"} 0.25"#,
        ] {
            assert!(text.lines().any(|l| l == line), "no `{line}` in:\n{text}");
        }
    }

    #[test]
    fn attempt_outcomes_are_a_fixed_set() {
        let cases = [
            (AttemptOutcome::Status(200), "2xx"),
            (AttemptOutcome::Status(204), "2xx"),
            (AttemptOutcome::Status(302), "3xx"),
            (AttemptOutcome::Status(404), "4xx"),
            (AttemptOutcome::Status(429), "429"),
            (AttemptOutcome::Status(503), "5xx"),
            (AttemptOutcome::Status(999), "5xx"),
            (AttemptOutcome::Connection, "connection"),
            (AttemptOutcome::Timeout, "timeout"),
            (AttemptOutcome::Refused, "refused"),
        ];
        for (outcome, label) in cases {
            assert_eq!(outcome_label(outcome), label, "{outcome:?}");
        }
    }
}
