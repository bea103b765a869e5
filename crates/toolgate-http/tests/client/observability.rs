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
