//! The client: one call is admission (rate and concurrency limits), an attempt (SSRF-checked
//! request, redirects, capped body read) under the deadline, and the retry policy deciding
//! whether another attempt follows.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use bytes::{Bytes, BytesMut};
use http::header::{AUTHORIZATION, COOKIE, LOCATION, PROXY_AUTHORIZATION};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use tokio::time::Instant;
use toolgate_core::Redactor;
use tracing::Instrument;
use url::Url;

use crate::config::VendorConfig;
use crate::error::{ErrorKind, HttpError};
use crate::limit::{HostLimits, RateLimit};
use crate::observe::{AttemptOutcome, HttpObserver};
use crate::retry::{
    BudgetState, Decision, Failure, GiveUp, Hint, RetryInput, RetryPolicy, server_hint,
};
use crate::ssrf::{AllowList, GuardedResolver, Refusal, check_url};

/// An outbound HTTP client for one vendor. Cheap to clone; clones share the connection pool,
/// rate limiters and retry budget.
#[derive(Clone)]
pub struct HttpClient {
    inner: Arc<Inner>,
}

/// One logical request. Not idempotent unless marked: such requests are never retried.
#[derive(Clone)]
pub struct Request {
    method: Method,
    target: String,
    headers: HeaderMap,
    invalid_header: Option<String>,
    query: Vec<(String, String)>,
    body: Bytes,
    idempotent: bool,
}

/// A successful (1xx-3xx) response, or the vendor's final error response inside an
/// [`HttpError`].
#[derive(Clone)]
pub struct Response {
    /// The status.
    pub status: StatusCode,
    /// The headers as received (values may be non-UTF-8).
    pub headers: HeaderMap,
    /// The whole body, at most the configured cap.
    pub body: Bytes,
    /// Requests sent for this call, retries included, for the ledger.
    pub attempts: u32,
}

struct Inner {
    http: reqwest::Client,
    base: Url,
    default_headers: HeaderMap,
    max_body_bytes: usize,
    retry: RetryPolicy,
    budget: BudgetState,
    limits: HostLimits,
    allow: Arc<AllowList>,
    max_redirects: u32,
    redactor: Redactor,
    observer: Arc<dyn HttpObserver>,
}

/// How one attempt ended, before the retry decision.
enum AttemptError {
    /// Final, never retried.
    Fatal(HttpError),
    /// A connection-level failure; `sent` says whether the request may have gone out.
    Connection { message: String, sent: bool },
}

impl HttpClient {
    /// Builds a client; fails with [`ErrorKind::Config`] on an invalid base URL or limits.
    pub fn new(config: VendorConfig) -> Result<HttpClient, HttpError> {
        let base = Url::parse(&config.base_url)
            .map_err(|e| HttpError::new(ErrorKind::Config, format!("invalid base url: {e}")))?;
        let allow = Arc::new(AllowList::new(&config.allow_hosts));
        check_url(&base, &allow)
            .map_err(|r| HttpError::new(ErrorKind::Config, format!("base url refused: {r}")))?;
        if config.retry.max_attempts == 0 {
            return Err(HttpError::new(
                ErrorKind::Config,
                "max_attempts must be at least 1",
            ));
        }
        if config.max_concurrency == Some(0) {
            return Err(HttpError::new(
                ErrorKind::Config,
                "max_concurrency must be at least 1",
            ));
        }
        let resolver = GuardedResolver {
            inner: Arc::clone(&config.resolver),
            allow: Arc::clone(&allow),
        };
        let http = reqwest::Client::builder()
            .dns_resolver(resolver)
            // Redirects are followed here, hop by hop, so each target is checked again.
            .redirect(reqwest::redirect::Policy::none())
            // A proxy would connect on our behalf to addresses the guard never saw.
            .no_proxy()
            // Retrying is this crate's decision alone.
            .retry(reqwest::retry::never())
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| HttpError::new(ErrorKind::Config, format!("http client: {e}")))?;
        Ok(HttpClient {
            inner: Arc::new(Inner {
                http,
                base,
                default_headers: config.default_headers,
                max_body_bytes: config.max_body_bytes,
                budget: BudgetState::new(config.retry.budget, Instant::now()),
                retry: config.retry,
                limits: HostLimits::new(config.rate_limit, config.max_concurrency),
                allow,
                max_redirects: config.max_redirects,
                redactor: Redactor::new(),
                observer: config.observer,
            }),
        })
    }

    /// Lowers `host`'s rate limit to what the vendor reports (e.g. from rate-limit headers),
    /// never above the configured rate. A later call replaces the earlier one.
    pub fn limit_host(&self, host: &str, reported: RateLimit) {
        self.inner
            .limits
            .limit_host(&host.to_ascii_lowercase(), reported);
    }

    /// Sends `request`, retrying per the policy, and never running past `deadline`.
    pub async fn send(&self, request: Request, deadline: Instant) -> Result<Response, HttpError> {
        let url = self.target_url(&request)?;
        let host = host_label(&url);
        let span = tracing::info_span!(
            "http.call",
            method = %request.method,
            host = %host,
            idempotent = request.idempotent,
        );
        self.run(&request, url, &host, deadline)
            .instrument(span)
            .await
    }

    fn target_url(&self, request: &Request) -> Result<Url, HttpError> {
        if let Some(name) = &request.invalid_header {
            return Err(HttpError::new(
                ErrorKind::InvalidRequest,
                format!("invalid request header `{name}`"),
            ));
        }
        // Absolute URLs stand alone; anything else is relative to the base.
        let parsed = match Url::parse(&request.target) {
            Ok(url) => Ok(url),
            Err(url::ParseError::RelativeUrlWithoutBase) => self.inner.base.join(&request.target),
            Err(e) => Err(e),
        };
        let mut url = parsed.map_err(|e| {
            HttpError::new(
                ErrorKind::InvalidRequest,
                format!("invalid request url: {e}"),
            )
        })?;
        check_url(&url, &self.inner.allow).map_err(refused)?;
        if !request.query.is_empty() {
            url.query_pairs_mut().extend_pairs(&request.query);
        }
        url.set_fragment(None);
        Ok(url)
    }

    async fn run(
        &self,
        request: &Request,
        url: Url,
        host: &str,
        deadline: Instant,
    ) -> Result<Response, HttpError> {
        let inner = &self.inner;
        inner.budget.deposit();
        let mut attempts: u32 = 0;
        let mut reached = false;
        loop {
            let admission = inner.limits.admit(host, deadline).await;
            let admission =
                admission.map_err(|e| e.with_attempts(attempts).reached_vendor(reached))?;
            if !admission.rate_waited.is_zero() {
                inner.observer.rate_limit_wait(host, admission.rate_waited);
            }
            attempts += 1;
            let started = Instant::now();
            // The attempt's span is an OpenTelemetry client span, and its context is what the
            // request carries as `traceparent`.
            let attempt_span = tracing::debug_span!(
                "http.attempt",
                otel.name = %request.method,
                otel.kind = "client",
                http.request.method = %request.method,
                server.address = %host,
                http.request.resend_count = attempts - 1,
                http.response.status_code = tracing::field::Empty,
                "error.type" = tracing::field::Empty,
            );
            let outcome = tokio::time::timeout_at(
                deadline,
                self.attempt(request, &url, deadline)
                    .instrument(attempt_span.clone()),
            )
            .await;
            drop(admission);
            record_attempt(&attempt_span, &outcome);
            let latency_ms = started.elapsed().as_millis();
            let path = inner.redactor.redact_text(url.path()).into_owned();
            inner.observer.attempt(host, attempt_outcome(&outcome));

            let (failure, hint, final_error) = match outcome {
                Err(_elapsed) => {
                    tracing::info!(method = %request.method, host, path, latency_ms, attempt = attempts, "vendor attempt timed out");
                    return Err(HttpError::new(
                        ErrorKind::Timeout,
                        format!(
                            "{} {host} did not finish before the deadline",
                            request.method
                        ),
                    )
                    .with_attempts(attempts)
                    .reached_vendor(true));
                }
                Ok(Err(AttemptError::Fatal(error))) => {
                    tracing::info!(method = %request.method, host, path, latency_ms, attempt = attempts, error = %error, "vendor attempt failed");
                    let reached_now = reached || error.may_have_reached_vendor();
                    return Err(error.with_attempts(attempts).reached_vendor(reached_now));
                }
                Ok(Err(AttemptError::Connection { message, sent })) => {
                    reached |= sent;
                    let error = HttpError::new(
                        ErrorKind::Transient,
                        format!("{} {host} failed: {message}", request.method),
                    );
                    (Failure::Connection, Hint::None, error)
                }
                Ok(Ok(response)) if response.status.as_u16() < 400 => {
                    tracing::info!(method = %request.method, host, path, status = response.status.as_u16(), latency_ms, attempt = attempts, "vendor attempt");
                    return Ok(Response {
                        attempts,
                        ..response
                    });
                }
                Ok(Ok(response)) => {
                    reached = true;
                    let code = response.status.as_u16();
                    let hint = server_hint(&response.headers, SystemTime::now());
                    let kind = match code {
                        429 => ErrorKind::Throttling,
                        500.. => ErrorKind::Server,
                        _ => ErrorKind::Client,
                    };
                    let error = HttpError::new(
                        kind,
                        format!("{} {host} answered {}", request.method, response.status),
                    )
                    .with_response(Response {
                        attempts,
                        ..response
                    });
                    (Failure::Status(code), hint, error)
                }
            };

            let input = RetryInput {
                attempts,
                idempotent: request.idempotent,
                failure,
                hint,
                remaining: deadline.saturating_duration_since(Instant::now()),
                jitter: rand::random::<f64>(),
            };
            let status = match failure {
                Failure::Status(code) => Some(code),
                Failure::Connection => None,
            };
            let decision = inner.retry.decide(&input);
            let decision = match decision {
                Decision::Retry { .. } if !inner.budget.try_withdraw(Instant::now()) => {
                    inner.observer.retry_budget_refused(host);
                    Decision::GiveUp(GiveUp::AttemptsExhausted)
                }
                other => other,
            };
            match decision {
                Decision::Retry { delay, reason } => {
                    inner.observer.retry(host);
                    tracing::info!(
                        method = %request.method, host, path, status, latency_ms,
                        attempt = attempts, retry_reason = reason.as_str(),
                        delay_ms = delay.as_millis(), malformed_hint = hint == Hint::Malformed,
                        "vendor attempt failed, retrying"
                    );
                    tokio::time::sleep(delay).await;
                }
                Decision::GiveUp(why) => {
                    tracing::info!(
                        method = %request.method, host, path, status, latency_ms,
                        attempt = attempts, give_up = ?why, "vendor attempt failed"
                    );
                    return Err(give_up(final_error, why, host)
                        .with_attempts(attempts)
                        .reached_vendor(reached));
                }
            }
        }
    }

    /// One attempt: the request, any redirects, and the capped body read.
    async fn attempt(
        &self,
        request: &Request,
        url: &Url,
        deadline: Instant,
    ) -> Result<Response, AttemptError> {
        let inner = &self.inner;
        let mut method = request.method.clone();
        let mut body = request.body.clone();
        let mut current = url.clone();
        let mut headers = request.headers.clone();
        let mut hops: u32 = 0;
        loop {
            let mut builder = inner.http.request(method.clone(), current.clone());
            if current.origin() == inner.base.origin() {
                builder = builder.headers(inner.default_headers.clone());
            }
            builder = builder.headers(crate::trace::current_trace_headers());
            let remaining = deadline.saturating_duration_since(Instant::now());
            let sent = builder
                .headers(headers.clone())
                .body(body.clone())
                .timeout(remaining.max(Duration::from_millis(1)))
                .send()
                .await;
            let response = sent.map_err(classify_send_error)?;
            let status = response.status();
            let is_redirect = matches!(status.as_u16(), 301 | 302 | 303 | 307 | 308);
            if !is_redirect || inner.max_redirects == 0 {
                let headers = response.headers().clone();
                let body = read_capped(response, inner.max_body_bytes).await?;
                return Ok(Response {
                    status,
                    headers,
                    body,
                    attempts: 0,
                });
            }
            hops += 1;
            if hops > inner.max_redirects {
                return Err(AttemptError::Fatal(vendor_fault(format!(
                    "the vendor redirected more than {} times",
                    inner.max_redirects
                ))));
            }
            let next = response
                .headers()
                .get(LOCATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|location| current.join(location).ok())
                .ok_or_else(|| {
                    AttemptError::Fatal(vendor_fault("the vendor sent an unusable redirect".into()))
                })?;
            check_url(&next, &inner.allow)
                .map_err(|r| AttemptError::Fatal(refused(r).reached_vendor(true)))?;
            if next.origin() != current.origin() {
                // Credentials meant for one origin never follow a redirect to another.
                for name in [AUTHORIZATION, COOKIE, PROXY_AUTHORIZATION] {
                    headers.remove(name);
                }
            }
            let becomes_get = status == StatusCode::SEE_OTHER
                || (matches!(status.as_u16(), 301 | 302) && method == Method::POST);
            if becomes_get && method != Method::HEAD {
                method = Method::GET;
                body = Bytes::new();
            }
            current = next;
        }
    }
}

impl Request {
    /// A request for `target`: a path relative to the vendor's base URL or an absolute URL.
    pub fn new(method: Method, target: impl Into<String>) -> Request {
        Request {
            method,
            target: target.into(),
            headers: HeaderMap::new(),
            invalid_header: None,
            query: Vec::new(),
            body: Bytes::new(),
            idempotent: false,
        }
    }

    /// A GET request.
    pub fn get(target: impl Into<String>) -> Request {
        Request::new(Method::GET, target)
    }

    /// A POST request.
    pub fn post(target: impl Into<String>) -> Request {
        Request::new(Method::POST, target)
    }

    /// Adds a header; an invalid name or value makes `send` fail with
    /// [`ErrorKind::InvalidRequest`].
    pub fn header(mut self, name: &str, value: &str) -> Request {
        let parsed = (HeaderName::try_from(name), HeaderValue::try_from(value));
        match parsed {
            (Ok(name), Ok(value)) => {
                self.headers.append(name, value);
            }
            _ => self.invalid_header = Some(name.chars().take(64).collect()),
        }
        self
    }

    /// Adds a query parameter (percent-encoded; never logged or shown in errors).
    pub fn query(mut self, key: impl Into<String>, value: impl Into<String>) -> Request {
        self.query.push((key.into(), value.into()));
        self
    }

    /// Sets the body.
    pub fn body(mut self, body: impl Into<Bytes>) -> Request {
        self.body = body.into();
        self
    }

    /// Marks the request idempotent (from the tool spec's flag, or an explicit override), which
    /// allows retries.
    pub fn idempotent(mut self, idempotent: bool) -> Request {
        self.idempotent = idempotent;
        self
    }
}

impl fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpClient")
            .field("base", &host_label(&self.inner.base))
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // The target may carry a query and headers may carry credentials: print neither.
        f.debug_struct("Request")
            .field("method", &self.method)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("body_len", &self.body.len())
            .field("idempotent", &self.idempotent)
            .finish_non_exhaustive()
    }
}

impl fmt::Debug for Response {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Response")
            .field("status", &self.status)
            .field("headers", &self.headers.keys().collect::<Vec<_>>())
            .field("body_len", &self.body.len())
            .field("attempts", &self.attempts)
            .finish()
    }
}

/// `host` or `host:port` as shown in logs and errors (no userinfo, path or query).
fn host_label(url: &Url) -> String {
    let host = url.host_str().unwrap_or("").to_ascii_lowercase();
    match url.port() {
        Some(port) => format!("{host}:{port}"),
        None => host,
    }
}

/// How an attempt ended, for the observer.
fn attempt_outcome<E>(outcome: &Result<Result<Response, AttemptError>, E>) -> AttemptOutcome {
    match outcome {
        Err(_elapsed) => AttemptOutcome::Timeout,
        Ok(Ok(response)) => AttemptOutcome::Status(response.status.as_u16()),
        Ok(Err(AttemptError::Connection { .. })) => AttemptOutcome::Connection,
        Ok(Err(AttemptError::Fatal(error))) => match (error.kind(), error.response()) {
            (ErrorKind::Timeout, _) => AttemptOutcome::Timeout,
            (_, Some(response)) => AttemptOutcome::Status(response.status.as_u16()),
            (_, None) => AttemptOutcome::Refused,
        },
    }
}

fn refused(refusal: Refusal) -> HttpError {
    HttpError::new(ErrorKind::Refused, format!("request refused: {refusal}"))
}

fn vendor_fault(message: String) -> HttpError {
    HttpError::new(ErrorKind::Server, message).reached_vendor(true)
}

/// The error a call ends with when the policy stops retrying.
fn give_up(last: HttpError, why: GiveUp, host: &str) -> HttpError {
    match why {
        GiveUp::HintBeyondCap => HttpError::new(
            ErrorKind::Throttling,
            format!("{last}; {host} asked to wait longer than the retry cap"),
        )
        .carry_response(last),
        GiveUp::DeadlineTooClose { throttled: true } => HttpError::new(
            ErrorKind::Throttling,
            format!("{last}; the requested wait would pass the deadline"),
        )
        .carry_response(last),
        GiveUp::DeadlineTooClose { throttled: false } => HttpError::new(
            ErrorKind::Timeout,
            format!("{last}; the next retry would pass the deadline"),
        )
        .carry_response(last),
        GiveUp::NotIdempotent | GiveUp::NotRetryable | GiveUp::AttemptsExhausted => last,
    }
}

impl HttpError {
    fn carry_response(self, from: HttpError) -> HttpError {
        match from.response().cloned() {
            Some(response) => self.with_response(response),
            None => self,
        }
    }
}

/// Classifies a reqwest failure without ever echoing the URL (its query may hold secrets).
fn classify_send_error(error: reqwest::Error) -> AttemptError {
    if let Some(refusal) = find_refusal(&error) {
        return AttemptError::Fatal(refused(refusal.clone()));
    }
    if error.is_builder() {
        return AttemptError::Fatal(HttpError::new(
            ErrorKind::InvalidRequest,
            "the request could not be built",
        ));
    }
    if error.is_connect() {
        return AttemptError::Connection {
            message: "could not connect".into(),
            sent: false,
        };
    }
    if error.is_timeout() {
        return AttemptError::Fatal(
            HttpError::new(
                ErrorKind::Timeout,
                "the request did not finish before the deadline",
            )
            .reached_vendor(true),
        );
    }
    AttemptError::Connection {
        message: "the connection failed or the response was malformed".into(),
        sent: true,
    }
}

fn find_refusal(error: &reqwest::Error) -> Option<&Refusal> {
    let mut source: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(error);
    while let Some(current) = source {
        if let Some(refusal) = current.downcast_ref::<Refusal>() {
            return Some(refusal);
        }
        source = current.source();
    }
    None
}

/// Reads the whole body, failing as soon as it exceeds `cap` bytes.
async fn read_capped(mut response: reqwest::Response, cap: usize) -> Result<Bytes, AttemptError> {
    let too_large = || {
        AttemptError::Fatal(
            HttpError::new(
                ErrorKind::BodyTooLarge,
                format!("the vendor's response body exceeds the {cap}-byte limit"),
            )
            .reached_vendor(true),
        )
    };
    let declared = response
        .content_length()
        .and_then(|n| usize::try_from(n).ok());
    if declared.is_some_and(|n| n > cap) {
        return Err(too_large());
    }
    let mut body = BytesMut::with_capacity(declared.unwrap_or(0));
    loop {
        let chunk = response.chunk().await.map_err(|e| match e.is_timeout() {
            true => AttemptError::Fatal(
                HttpError::new(
                    ErrorKind::Timeout,
                    "the response body did not arrive before the deadline",
                )
                .reached_vendor(true),
            ),
            false => AttemptError::Connection {
                message: "the response body could not be read".into(),
                sent: true,
            },
        })?;
        let Some(chunk) = chunk else {
            return Ok(body.freeze());
        };
        if body.len() + chunk.len() > cap {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
}

/// Puts an attempt's outcome on its span: the status, and what failed (the status code, or the
/// kind of failure when no answer came).
fn record_attempt(
    span: &tracing::Span,
    outcome: &Result<Result<Response, AttemptError>, tokio::time::error::Elapsed>,
) {
    match outcome {
        Ok(Ok(response)) => {
            let code = response.status.as_u16();
            span.record("http.response.status_code", code);
            if code >= 400 {
                span.record("error.type", code);
            }
        }
        Ok(Err(AttemptError::Connection { .. })) => {
            span.record("error.type", "connection");
        }
        Ok(Err(AttemptError::Fatal(_))) => {
            span.record("error.type", "fatal");
        }
        Err(_elapsed) => {
            span.record("error.type", "timeout");
        }
    }
}
