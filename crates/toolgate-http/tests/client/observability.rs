//! The per-call span and per-attempt events: the fields are there, secrets are not.

use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use toolgate_http::{HttpClient, Request};
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::{config, deadline_in};

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Everything this test binary logs. A global subscriber, not a thread-local one per test:
/// with tests on several threads, thread-local dispatchers and tracing's per-callsite interest
/// cache can race and drop events (seen under load). Tests pick their own lines out of it.
fn capture() -> &'static Capture {
    static CAPTURE: OnceLock<Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture = Capture::default();
        let writer = capture.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        tracing::subscriber::set_global_default(subscriber)
            .expect("no other global subscriber in this test binary");
        capture
    })
}

#[tokio::test]
async fn each_attempt_is_logged_without_secrets() {
    let capture = capture();

    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(503))
        .mount(&server)
        .await;
    let client = HttpClient::new(config(&server)).unwrap();
    let request = Request::get("hooks/xoxb-1234567890-abcdef")
        .query("signature", "QUERYSECRET")
        .idempotent(true);
    let error = client
        .send(request, deadline_in(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert_eq!(error.attempts(), 3);

    // This test's lines: those naming its own server.
    let host = format!("host={}", server.address());
    let all = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
    let logs: String = all
        .lines()
        .filter(|line| line.contains(&host))
        .map(|line| format!("{line}\n"))
        .collect();
    assert_eq!(logs.matches("vendor attempt failed").count(), 3, "{logs}");
    assert_eq!(
        logs.matches("retry_reason=\"server error\"").count(),
        2,
        "{logs}"
    );
    for field in [
        "http.call",
        "method=GET",
        "host=127.0.0.1:",
        "status=503",
        "latency_ms=",
        "attempt=3",
    ] {
        assert!(logs.contains(field), "missing {field}: {logs}");
    }
    assert!(logs.contains("/hooks/[REDACTED]"), "{logs}");
    // No secret anywhere in what the binary logged, whichever test logged it.
    assert!(!all.contains("xoxb"), "{all}");
    assert!(!all.contains("QUERYSECRET"), "{all}");
}

/// Every observation, in order, as text.
#[derive(Debug, Default)]
struct Seen(Mutex<Vec<String>>);

impl toolgate_http::HttpObserver for Seen {
    fn attempt(&self, host: &str, outcome: toolgate_http::AttemptOutcome) {
        self.0
            .lock()
            .unwrap()
            .push(format!("attempt {host} {outcome:?}"));
    }

    fn retry(&self, host: &str) {
        self.0.lock().unwrap().push(format!("retry {host}"));
    }

    fn retry_budget_refused(&self, host: &str) {
        self.0.lock().unwrap().push(format!("budget {host}"));
    }

    fn rate_limit_wait(&self, host: &str, _waited: Duration) {
        self.0.lock().unwrap().push(format!("wait {host}"));
    }
}

#[tokio::test]
async fn the_observer_is_told_each_attempt_retry_spent_budget_and_wait() {
    let server = MockServer::start().await;
    // Two 503s, then a 200: the call retries twice and succeeds on its third attempt.
    Mock::given(any())
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let host = server.address().to_string();
    let seen = Arc::new(Seen::default());
    let mut vendor = config(&server);
    vendor.observer = Arc::clone(&seen) as Arc<dyn toolgate_http::HttpObserver>;
    // One request every 250 ms: each retry, after a backoff of at most 50 ms, waits for the
    // rate.
    vendor.rate_limit = toolgate_http::RateLimit::per_second(4, 1);
    let client = HttpClient::new(vendor).unwrap();
    let response = client
        .send(
            Request::get("ok").idempotent(true),
            deadline_in(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert_eq!(response.attempts, 3);
    assert_eq!(
        *seen.0.lock().unwrap(),
        [
            format!("attempt {host} Status(503)"),
            format!("retry {host}"),
            format!("wait {host}"),
            format!("attempt {host} Status(503)"),
            format!("retry {host}"),
            format!("wait {host}"),
            format!("attempt {host} Status(200)"),
        ]
    );

    // A budget with nothing in it: the first retry is refused, and the observer hears of it.
    let broke = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(503))
        .mount(&broke)
        .await;
    let host = broke.address().to_string();
    let seen = Arc::new(Seen::default());
    let mut vendor = config(&broke);
    vendor.retry.budget = toolgate_http::RetryBudget {
        ratio_percent: 0,
        min_per_second: 0,
        max_balance: 0,
    };
    vendor.observer = Arc::clone(&seen) as Arc<dyn toolgate_http::HttpObserver>;
    let client = HttpClient::new(vendor).unwrap();
    let error = client
        .send(
            Request::get("down").idempotent(true),
            deadline_in(Duration::from_secs(5)),
        )
        .await
        .unwrap_err();
    assert_eq!(error.attempts(), 1);
    assert_eq!(
        *seen.0.lock().unwrap(),
        [
            format!("attempt {host} Status(503)"),
            format!("budget {host}")
        ]
    );
}
