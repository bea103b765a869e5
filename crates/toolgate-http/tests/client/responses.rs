//! Response handling: the body cap, deadlines against hanging and trickling upstreams, and bad
//! input from the vendor (non-UTF-8 and oversize headers).

use std::time::Duration;

use tokio::io::AsyncWriteExt;
use toolgate_http::{ErrorKind, HttpClient, Request, VendorConfig};
use wiremock::matchers::{any, header_exists, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::{config, deadline_in, raw_server, read_head};

fn loopback_config(base: String) -> VendorConfig {
    let mut config = VendorConfig::new(base);
    config.allow_hosts = vec!["127.0.0.1".into()];
    config.retry.base = Duration::from_millis(5);
    config.retry.cap = Duration::from_millis(20);
    config
}

#[tokio::test]
async fn bodies_over_the_cap_fail_clearly() {
    let server = MockServer::start().await;
    Mock::given(path("/big"))
        .respond_with(ResponseTemplate::new(200).set_body_bytes(vec![b'x'; 4096]))
        .mount(&server)
        .await;
    Mock::given(path("/small"))
        .respond_with(ResponseTemplate::new(200).set_body_bytes(vec![b'x'; 1024]))
        .mount(&server)
        .await;
    let mut config = config(&server);
    config.max_body_bytes = 1024;
    let client = HttpClient::new(config).unwrap();
    let deadline = || deadline_in(Duration::from_secs(5));
    let error = client
        .send(Request::get("big"), deadline())
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BodyTooLarge);
    assert!(error.to_string().contains("1024-byte limit"), "{error}");
    let response = client
        .send(Request::get("small"), deadline())
        .await
        .unwrap();
    assert_eq!(response.body.len(), 1024);
    assert_eq!(toolgate_http::DEFAULT_MAX_BODY_BYTES, 10 * 1024 * 1024);
}

#[tokio::test]
async fn chunked_bodies_without_a_length_are_capped_while_streaming() {
    let base = raw_server(|mut stream| async move {
        read_head(&mut stream).await;
        let head = "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n";
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let chunk = format!("400\r\n{}\r\n", "y".repeat(1024));
        for _ in 0..64 {
            if stream.write_all(chunk.as_bytes()).await.is_err() {
                return;
            }
        }
        let _ = stream.write_all(b"0\r\n\r\n").await;
    })
    .await;
    let mut config = loopback_config(base);
    config.max_body_bytes = 10_000;
    let client = HttpClient::new(config).unwrap();
    let error = client
        .send(Request::get("stream"), deadline_in(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::BodyTooLarge, "{error}");
}

#[tokio::test]
async fn a_hanging_upstream_ends_at_the_deadline() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200).set_delay(Duration::from_secs(30)))
        .mount(&server)
        .await;
    let client = HttpClient::new(config(&server)).unwrap();
    for idempotent in [false, true] {
        let started = std::time::Instant::now();
        let error = client
            .send(
                Request::get("hang").idempotent(idempotent),
                deadline_in(Duration::from_millis(300)),
            )
            .await
            .unwrap_err();
        let elapsed = started.elapsed();
        assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
        assert_eq!(error.error_code().as_str(), "TIMEOUT");
        assert!(error.may_have_reached_vendor());
        assert!(elapsed >= Duration::from_millis(290), "{elapsed:?}");
        assert!(elapsed < Duration::from_millis(600), "{elapsed:?}");
    }
}

#[tokio::test]
async fn a_trickling_upstream_ends_at_the_deadline() {
    let base = raw_server(|mut stream| async move {
        read_head(&mut stream).await;
        let head = "HTTP/1.1 200 OK\r\ncontent-length: 100000\r\n\r\n";
        if stream.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        loop {
            if stream.write_all(b"z").await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    let client = HttpClient::new(loopback_config(base)).unwrap();
    let started = std::time::Instant::now();
    let error = client
        .send(
            Request::get("slow").idempotent(true),
            deadline_in(Duration::from_millis(400)),
        )
        .await
        .unwrap_err();
    let elapsed = started.elapsed();
    assert_eq!(error.kind(), ErrorKind::Timeout, "{error}");
    assert!(elapsed < Duration::from_millis(700), "{elapsed:?}");
}

#[tokio::test]
async fn non_utf8_retry_after_is_ignored_not_fatal() {
    let base = raw_server(|mut stream| async move {
        loop {
            read_head(&mut stream).await;
            let mut response = b"HTTP/1.1 429 Too Many Requests\r\nretry-after: ".to_vec();
            response.extend_from_slice(b"\xff\xfe soon");
            response.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
            if stream.write_all(&response).await.is_err() {
                return;
            }
        }
    })
    .await;
    let client = HttpClient::new(loopback_config(base)).unwrap();
    let error = client
        .send(
            Request::get("x").idempotent(true),
            deadline_in(Duration::from_secs(5)),
        )
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Throttling, "{error}");
    assert_eq!(error.attempts(), 3);
    assert_eq!(
        error.to_tool_error().attempts,
        Some(3),
        "the count reaches core's error, and from there the ledger"
    );
    let response = error.response().unwrap();
    assert!(
        response
            .headers
            .get("retry-after")
            .unwrap()
            .to_str()
            .is_err()
    );
}

#[tokio::test]
async fn oversize_vendor_headers_are_a_classified_error() {
    let base = raw_server(|mut stream| async move {
        read_head(&mut stream).await;
        let mut response = b"HTTP/1.1 200 OK\r\nx-huge: ".to_vec();
        response.extend(std::iter::repeat_n(b'h', 2 * 1024 * 1024));
        response.extend_from_slice(b"\r\ncontent-length: 0\r\n\r\n");
        let _ = stream.write_all(&response).await;
    })
    .await;
    let client = HttpClient::new(loopback_config(base)).unwrap();
    let error = client
        .send(Request::get("x"), deadline_in(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Transient, "{error}");
    assert_eq!(error.error_code().as_str(), "VENDOR_ERROR");
}

#[tokio::test]
async fn default_headers_go_to_the_vendor_only() {
    let vendor = MockServer::start().await;
    let other = MockServer::start().await;
    Mock::given(header_exists("authorization"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&vendor)
        .await;
    Mock::given(header_exists("authorization"))
        .respond_with(ResponseTemplate::new(401))
        .mount(&other)
        .await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(204))
        .mount(&other)
        .await;
    let mut config = config(&vendor);
    config.default_headers.insert(
        "authorization",
        "Bearer xoxb-not-a-real-token".parse().unwrap(),
    );
    assert!(!format!("{config:?}").contains("xoxb"));
    let client = HttpClient::new(config).unwrap();
    let deadline = || deadline_in(Duration::from_secs(5));
    let response = client.send(Request::get("me"), deadline()).await.unwrap();
    assert_eq!(response.status.as_u16(), 200);
    let elsewhere = format!("{}/me", other.uri());
    let response = client
        .send(Request::get(elsewhere), deadline())
        .await
        .unwrap();
    assert_eq!(response.status.as_u16(), 204);
}

#[tokio::test]
async fn errors_never_show_queries_or_header_values() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(403).set_body_string("token xoxb-123 is revoked"))
        .mount(&server)
        .await;
    let client = HttpClient::new(config(&server)).unwrap();
    let request = Request::post("charge?key=sk_live_SECRET")
        .query("token", "SECRET2")
        .header("authorization", "Bearer SECRET3")
        .body("card=SECRET4");
    let shown = format!("{request:?}");
    let error = client
        .send(request, deadline_in(Duration::from_secs(5)))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Client);
    for text in [
        error.to_string(),
        format!("{error:?}"),
        shown,
        error.to_tool_error().to_string(),
    ] {
        assert!(!text.contains("SECRET"), "{text}");
        assert!(!text.contains("xoxb"), "{text}");
    }
    // The connector can still read the vendor's explanation.
    assert_eq!(
        &error.response().unwrap().body[..],
        b"token xoxb-123 is revoked"
    );
}
