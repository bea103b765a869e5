//! The SSRF table: every payload is refused before any connection is made. Payloads that name
//! the loopback wiremock server in disguise would reach it if the guard let them through, so
//! the server must see no request at all; the others would be connection attempts (a transient
//! or timeout error), so the `Refused` kind shows no attempt was made.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use toolgate_http::{ErrorKind, HttpClient, Request, StaticResolver, VendorConfig};
use wiremock::matchers::{any, path};
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::{config, deadline_in};

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Names that resolve to refused addresses (and one mixed answer).
fn test_resolver() -> StaticResolver {
    StaticResolver::new()
        .with("loopback.test", &[ip("127.0.0.1")])
        .with("metadata.test", &[ip("169.254.169.254")])
        .with("mixed.test", &[ip("93.184.216.34"), ip("10.0.0.1")])
        .with("v6loop.test", &[ip("::1")])
        .with("mapped.test", &[ip("::ffff:127.0.0.1")])
        .with("translated.test", &[ip("::ffff:0:a9fe:a9fe")])
        .with("nat64.test", &[ip("64:ff9b:1::a9fe:a9fe")])
        .with("private.test", &[ip("192.168.0.10")])
        .with("ula.test", &[ip("fd00::1")])
        .with("linklocal6.test", &[ip("fe80::1")])
        .with("localhost", &[ip("127.0.0.1"), ip("::1")])
}

/// (payload, the host `url` normalizes it to, where that is the point of the case).
fn payloads(port: u16) -> Vec<(String, Option<&'static str>)> {
    let p = port;
    let mut cases: Vec<(String, Option<&'static str>)> = vec![
        // Loopback, in every spelling the WHATWG parser accepts.
        (format!("http://127.0.0.1:{p}/"), Some("127.0.0.1")),
        (format!("http://2130706433:{p}/"), Some("127.0.0.1")),
        (format!("http://0177.0.0.1:{p}/"), Some("127.0.0.1")),
        (format!("http://017700000001:{p}/"), Some("127.0.0.1")),
        (format!("http://0x7f.0.0.1:{p}/"), Some("127.0.0.1")),
        (format!("http://0x7f000001:{p}/"), Some("127.0.0.1")),
        (format!("http://0x7f.0x0.0x0.0x1:{p}/"), Some("127.0.0.1")),
        (format!("http://0x7f.1:{p}/"), Some("127.0.0.1")),
        (format!("http://127.1:{p}/"), Some("127.0.0.1")),
        (format!("http://127.0.1:{p}/"), Some("127.0.0.1")),
        (format!("http://127.000.000.001:{p}/"), Some("127.0.0.1")),
        (format!("http://127.0.0.1.:{p}/"), Some("127.0.0.1")),
        (format!("HTTP://127.0.0.1:{p}/"), Some("127.0.0.1")),
        (format!("https://127.0.0.1:{p}/"), Some("127.0.0.1")),
        (format!("http://127.0.0.2:{p}/"), Some("127.0.0.2")),
        (format!("http://[::1]:{p}/"), Some("[::1]")),
        (format!("http://[0:0:0:0:0:0:0:1]:{p}/"), Some("[::1]")),
        (
            format!("http://[::ffff:127.0.0.1]:{p}/"),
            Some("[::ffff:7f00:1]"),
        ),
        (format!("http://[::127.0.0.1]:{p}/"), Some("[::7f00:1]")),
        (format!("http://[2002:7f00:1::]:{p}/"), None),
        // Unspecified.
        (format!("http://0:{p}/"), Some("0.0.0.0")),
        (format!("http://0.0.0.0:{p}/"), Some("0.0.0.0")),
        (format!("http://[::]:{p}/"), Some("[::]")),
        // Cloud metadata and link-local.
        (
            "http://169.254.169.254/latest/meta-data/".into(),
            Some("169.254.169.254"),
        ),
        ("http://2852039166/".into(), Some("169.254.169.254")),
        ("http://0xa9fea9fe/".into(), Some("169.254.169.254")),
        (
            "http://0251.0376.0251.0376/".into(),
            Some("169.254.169.254"),
        ),
        ("http://169.254.43518/".into(), Some("169.254.169.254")),
        (
            "http://[::ffff:169.254.169.254]/".into(),
            Some("[::ffff:a9fe:a9fe]"),
        ),
        ("http://[64:ff9b::a9fe:a9fe]/".into(), None),
        (
            "http://[::ffff:0:a9fe:a9fe]/".into(),
            Some("[::ffff:0:a9fe:a9fe]"),
        ),
        (format!("http://[::ffff:0:7f00:1]:{p}/"), None),
        ("http://[64:ff9b:1::a9fe:a9fe]/".into(), None),
        ("http://[64:ff9b:1:a9fe:a9:fe00::]/".into(), None),
        ("http://[2001:db9::5efe:a9fe:a9fe]/".into(), None),
        ("http://[2002:a9fe:a9fe::]/".into(), None),
        ("http://[fe80::1]/".into(), None),
        ("http://[febf:ffff::1]/".into(), None),
        // Private, shared, unique-local, multicast, broadcast.
        ("http://10.0.0.1/".into(), Some("10.0.0.1")),
        ("http://10.1/".into(), Some("10.0.0.1")),
        ("http://172.16.0.1/".into(), None),
        ("http://192.168.1.1/".into(), None),
        ("http://100.100.100.200/".into(), None),
        ("http://[fc00::1]/".into(), None),
        ("http://[fd00:ec2::254]/".into(), None),
        ("http://[ff02::1]/".into(), None),
        ("http://224.0.0.1/".into(), None),
        ("http://255.255.255.255/".into(), None),
        // Names resolving to refused addresses (through the test resolver).
        (format!("http://loopback.test:{p}/"), None),
        ("http://metadata.test/".into(), None),
        ("http://mixed.test/".into(), None),
        (format!("http://v6loop.test:{p}/"), None),
        (format!("http://mapped.test:{p}/"), None),
        ("http://translated.test/".into(), None),
        ("http://nat64.test/".into(), None),
        ("http://private.test/".into(), None),
        ("http://ula.test/".into(), None),
        ("http://linklocal6.test/".into(), None),
        (format!("http://localhost:{p}/"), None),
        (format!("http://LOCALHOST:{p}/"), None),
        // Other schemes.
        ("file:///etc/passwd".into(), None),
        (format!("ftp://127.0.0.1:{p}/"), None),
        (format!("gopher://127.0.0.1:{p}/_GET"), None),
        ("javascript:alert(1)".into(), None),
        ("data:text/plain,hello".into(), None),
        (format!("ws://127.0.0.1:{p}/"), None),
        // Userinfo tricks.
        ("http://user:pass@vendor.test/".into(), None),
        (
            format!("http://vendor.test@127.0.0.1:{p}/"),
            Some("127.0.0.1"),
        ),
        (
            format!("http://vendor.test:x@127.0.0.1:{p}/"),
            Some("127.0.0.1"),
        ),
        (
            format!("http://127.0.0.1:{p}\\@vendor.test/"),
            Some("127.0.0.1"),
        ),
        // A scheme-relative target escapes the base URL's host.
        (format!("//127.0.0.1:{p}/x"), None),
    ];
    cases.dedup();
    cases
}

#[tokio::test]
async fn ssrf_payloads_are_refused_before_connecting() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let port = server.address().port();
    // Nothing is allow-listed: the base is a name only the test resolver knows.
    let mut config = VendorConfig::new("http://vendor.test/");
    config.resolver = Arc::new(test_resolver());
    config.max_redirects = 5;
    let client = HttpClient::new(config).unwrap();

    let cases = payloads(port);
    assert!(cases.len() >= 60, "{} payloads", cases.len());
    for (payload, normalized) in &cases {
        if let Some(expected) = normalized {
            // Proof that checking the parsed host is enough: the parser normalized it.
            let parsed = url::Url::parse(payload).unwrap();
            assert_eq!(parsed.host_str(), Some(*expected), "{payload}");
        }
        let started = std::time::Instant::now();
        let result = client
            .send(
                Request::get(payload.as_str()).idempotent(true),
                deadline_in(Duration::from_secs(5)),
            )
            .await;
        let error = match result {
            Ok(response) => panic!("{payload}: not refused, got {}", response.status),
            Err(error) => error,
        };
        assert_eq!(error.kind(), ErrorKind::Refused, "{payload}: {error}");
        assert_eq!(error.error_code().as_str(), "POLICY_BLOCKED");
        // Literal hosts are refused before an attempt starts; names while connecting.
        assert!(error.attempts() <= 1, "{payload}");
        assert!(!error.may_have_reached_vendor(), "{payload}");
        assert!(started.elapsed() < Duration::from_millis(500), "{payload}");
    }
    let received = server.received_requests().await.unwrap();
    assert!(
        received.is_empty(),
        "{} requests reached the server",
        received.len()
    );
}

#[tokio::test]
async fn redirects_to_refused_targets_are_refused() {
    let server = MockServer::start().await;
    let port = server.address().port();
    let targets = [
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        format!("http://[::1]:{port}/"),
        format!("http://127.0.0.2:{port}/"),
        format!("http://2130706434:{port}/"),
        format!("http://localhost:{port}/landing"),
        "http://metadata.test/".to_owned(),
        "http://[::ffff:169.254.169.254]/".to_owned(),
        "http://10.0.0.1/".to_owned(),
        "file:///etc/passwd".to_owned(),
        format!("ftp://127.0.0.1:{port}/"),
        format!("http://user:pw@127.0.0.1:{port}/landing"),
    ];
    for (i, target) in targets.iter().enumerate() {
        Mock::given(path(format!("/hop/{i}")))
            .respond_with(ResponseTemplate::new(302).insert_header("location", target.as_str()))
            .mount(&server)
            .await;
    }
    Mock::given(path("/landing"))
        .respond_with(ResponseTemplate::new(200))
        .mount(&server)
        .await;
    let mut config = config(&server);
    config.resolver = Arc::new(test_resolver());
    config.max_redirects = 3;
    let client = HttpClient::new(config).unwrap();
    for (i, target) in targets.iter().enumerate() {
        let error = client
            .send(
                Request::get(format!("hop/{i}")),
                deadline_in(Duration::from_secs(5)),
            )
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Refused, "{target}: {error}");
    }
    // Only the redirecting hops reached the server; no landing request.
    let received = server.received_requests().await.unwrap();
    assert_eq!(received.len(), targets.len());
    assert!(received.iter().all(|r| r.url.path().starts_with("/hop/")));
}

#[tokio::test]
async fn redirects_are_off_by_default_and_followed_within_limits_when_on() {
    let server = MockServer::start().await;
    Mock::given(path("/start"))
        .respond_with(ResponseTemplate::new(302).insert_header("location", "/landing"))
        .mount(&server)
        .await;
    Mock::given(path("/loop"))
        .respond_with(ResponseTemplate::new(307).insert_header("location", "/loop"))
        .mount(&server)
        .await;
    Mock::given(path("/landing"))
        .respond_with(ResponseTemplate::new(200).set_body_string("landed"))
        .mount(&server)
        .await;
    let deadline = || deadline_in(Duration::from_secs(5));

    let off = HttpClient::new(config(&server)).unwrap();
    let response = off.send(Request::get("start"), deadline()).await.unwrap();
    assert_eq!(response.status.as_u16(), 302);

    let mut on = config(&server);
    on.max_redirects = 2;
    let on = HttpClient::new(on).unwrap();
    let response = on.send(Request::get("start"), deadline()).await.unwrap();
    assert_eq!(response.status.as_u16(), 200);
    assert_eq!(&response.body[..], b"landed");
    let error = on.send(Request::get("loop"), deadline()).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Server, "{error}");
}

#[tokio::test]
async fn allow_listed_names_may_resolve_to_loopback() {
    let server = MockServer::start().await;
    Mock::given(any())
        .respond_with(ResponseTemplate::new(204))
        .mount(&server)
        .await;
    let port = server.address().port();
    let mut config = VendorConfig::new(format!("http://loopback.test:{port}/"));
    config.resolver = Arc::new(test_resolver());
    config.allow_hosts = vec!["loopback.test".into()];
    let client = HttpClient::new(config).unwrap();
    let response = client
        .send(Request::get("ok"), deadline_in(Duration::from_secs(5)))
        .await
        .unwrap();
    assert_eq!(response.status.as_u16(), 204);
}

#[tokio::test]
async fn invalid_requests_are_classified() {
    let server = MockServer::start().await;
    let client = HttpClient::new(config(&server)).unwrap();
    let cases = [
        Request::get("http://[::1"),
        Request::get("http://exa mple.com/"),
        Request::get("x").header("x-bad", "line\nbreak"),
        Request::get("x").header("bad header", "v"),
    ];
    for request in cases {
        let shown = format!("{request:?}");
        let error = client
            .send(request, deadline_in(Duration::from_secs(1)))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::InvalidRequest, "{shown}: {error}");
        assert_eq!(error.attempts(), 0);
    }
    let bad_configs = [
        VendorConfig::new("not a url"),
        VendorConfig::new("ftp://vendor.test/"),
        VendorConfig::new("http://169.254.169.254/"),
    ];
    for config in bad_configs {
        let error = HttpClient::new(config).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Config, "{error}");
    }
}
