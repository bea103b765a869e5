//! Integration tests of the client against wiremock (and a few raw sockets) on 127.0.0.1.

mod limits;
mod observability;
mod responses;
mod retry_matrix;
mod ssrf;

use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::time::Instant;
use toolgate_http::{RetryBudget, RetryPolicy, VendorConfig};
use wiremock::{MockServer, Request as MockRequest, Respond, ResponseTemplate};

/// A config for `server` with loopback allow-listed and millisecond backoff.
fn config(server: &MockServer) -> VendorConfig {
    let mut config = VendorConfig::new(format!("{}/", server.uri()));
    config.allow_hosts = vec!["127.0.0.1".into()];
    config.retry = RetryPolicy {
        max_attempts: 3,
        base: Duration::from_millis(5),
        cap: Duration::from_millis(50),
        retry_statuses: vec![500, 502, 503, 504],
        retry_throttled: true,
        budget: RetryBudget::default(),
    };
    config
}

fn deadline_in(duration: Duration) -> Instant {
    Instant::now() + duration
}

/// Responds with a fixed template and records when each request arrived.
#[derive(Clone)]
struct Recorder {
    template: ResponseTemplate,
    arrivals: Arc<Mutex<Vec<(std::time::Instant, SystemTime)>>>,
}

impl Recorder {
    fn new(template: ResponseTemplate) -> Recorder {
        Recorder {
            template,
            arrivals: Arc::new(Mutex::new(Vec::new())),
        }
    }

    fn arrivals(&self) -> Vec<(std::time::Instant, SystemTime)> {
        self.arrivals.lock().unwrap().clone()
    }
}

impl Respond for Recorder {
    fn respond(&self, _request: &MockRequest) -> ResponseTemplate {
        self.arrivals
            .lock()
            .unwrap()
            .push((std::time::Instant::now(), SystemTime::now()));
        self.template.clone()
    }
}

/// A raw TCP server on 127.0.0.1 answering every connection with `handler`.
async fn raw_server<F, Fut>(handler: F) -> String
where
    F: Fn(tokio::net::TcpStream) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            tokio::spawn(handler(stream));
        }
    });
    format!("http://{addr}/")
}

/// Reads a request head (up to the blank line) from `stream`.
async fn read_head(stream: &mut tokio::net::TcpStream) {
    use tokio::io::AsyncReadExt;
    let mut seen = Vec::new();
    let mut buf = [0u8; 1024];
    while !seen.windows(4).any(|w| w == b"\r\n\r\n") {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => seen.extend_from_slice(&buf[..n]),
        }
    }
}
