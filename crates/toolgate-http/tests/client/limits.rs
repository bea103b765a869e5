//! The retry budget under a total outage and the per-host rate limit's accuracy.

use std::time::Duration;

use toolgate_http::{ErrorKind, HttpClient, RateLimit, Request, RetryBudget};
use wiremock::matchers::any;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::{config, deadline_in};

#[tokio::test]
async fn the_retry_budget_caps_an_outage_at_twenty_percent() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(503))
        .mount(&server)
        .await;
    let mut config = config(&server);
    config.retry.max_attempts = 5;
    config.retry.base = Duration::from_millis(1);
    config.retry.cap = Duration::from_millis(2);
    // No per-second floor, so the bound is exactly the ratio.
    config.retry.budget = RetryBudget {
        ratio_percent: 20,
        min_per_second: 0,
        max_balance: 100,
    };
    let client = HttpClient::new(config).unwrap();
    let requests: u32 = 200;
    let mut attempts = 0;
    for chunk in 0..requests / 10 {
        let calls = (0..10).map(|i| {
            let request = Request::get(format!("item/{chunk}/{i}")).idempotent(true);
            client.send(request, deadline_in(Duration::from_secs(5)))
        });
        for result in futures::future::join_all(calls).await {
            let error = result.unwrap_err();
            assert_eq!(error.kind(), ErrorKind::Server);
            attempts += error.attempts();
        }
    }
    let upstream = u32::try_from(server.received_requests().await.unwrap().len()).unwrap();
    assert_eq!(upstream, attempts);
    // Without the budget this would be 5x; with it, at most 1.2x (and some retries happened).
    assert!(
        upstream * 10 <= requests * 12,
        "{upstream} upstream for {requests} requests"
    );
    assert!(upstream > requests, "no retries at all: {upstream}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_upstream_sees_at_most_rate_plus_burst() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let mut config = config(&server);
    let (per_second, burst) = (20, 5);
    config.rate_limit = RateLimit::per_second(per_second, burst);
    let client = HttpClient::new(config).unwrap();
    let window = Duration::from_millis(1000);
    let started = std::time::Instant::now();
    let deadline = deadline_in(window);
    let calls = (0..100).map(|i| client.send(Request::get(format!("r/{i}")), deadline));
    let results = futures::future::join_all(calls).await;
    let elapsed = started.elapsed();

    let ok = results.iter().filter(|r| r.is_ok()).count();
    for result in &results {
        if let Err(error) = result {
            assert_eq!(error.kind(), ErrorKind::Throttling, "{error}");
            assert_eq!(error.attempts(), 0);
        }
    }
    let upstream = server.received_requests().await.unwrap().len();
    assert_eq!(upstream, ok);
    // Over the window: the burst plus the rate, plus one for the window's edge.
    let allowed = usize::try_from(burst + per_second).unwrap() + 1;
    assert!(upstream <= allowed, "{upstream} > {allowed}");
    assert!(upstream >= 15, "the limiter admitted only {upstream}");
    // Throttled requests failed fast rather than waiting out the deadline one by one.
    assert!(elapsed < window + Duration::from_millis(300), "{elapsed:?}");
}

#[tokio::test]
async fn a_host_limit_lowered_from_vendor_headers_throttles_before_a_429() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let client = HttpClient::new(config(&server)).unwrap();
    let host = format!("127.0.0.1:{}", server.address().port());
    client.limit_host(&host, RateLimit::every(Duration::from_secs(60), 2).unwrap());
    let deadline = deadline_in(Duration::from_secs(1));
    assert!(client.send(Request::get("a"), deadline).await.is_ok());
    assert!(client.send(Request::get("b"), deadline).await.is_ok());
    let error = client.send(Request::get("c"), deadline).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Throttling);
    assert_eq!(error.error_code().as_str(), "VENDOR_RATE_LIMITED");
    assert_eq!(server.received_requests().await.unwrap().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_limit_bounds_in_flight_requests() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_millis(100)))
        .mount(&server)
        .await;
    let mut config = config(&server);
    config.max_concurrency = Some(2);
    let client = HttpClient::new(config).unwrap();
    let started = std::time::Instant::now();
    let calls = (0..4).map(|i| {
        client.send(
            Request::get(format!("c/{i}")),
            deadline_in(Duration::from_secs(5)),
        )
    });
    for result in futures::future::join_all(calls).await {
        result.unwrap();
    }
    // Four 100 ms requests two at a time take at least two rounds.
    assert!(
        started.elapsed() >= Duration::from_millis(200),
        "{:?}",
        started.elapsed()
    );
}
