//! The per-call span and per-attempt events: the fields are there, secrets are not.

use std::io::Write;
use std::sync::{Arc, Mutex};
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

#[tokio::test]
async fn each_attempt_is_logged_without_secrets() {
    let capture = Capture::default();
    let writer = capture.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

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

    let logs = String::from_utf8(capture.0.lock().unwrap().clone()).unwrap();
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
    assert!(!logs.contains("xoxb"), "{logs}");
    assert!(!logs.contains("QUERYSECRET"), "{logs}");
}
