//! The retry matrix: idempotent or not x status x server wait hint, all cases run concurrently
//! against one wiremock server, each with its own client (so budgets don't interact).

use std::time::{Duration, SystemTime};

use toolgate_http::{ErrorKind, HttpClient, Request};
use wiremock::matchers::path;
use wiremock::{Mock, MockServer, ResponseTemplate};

use crate::{Recorder, config, deadline_in};

#[derive(Clone, Copy, Debug)]
enum HintForm {
    Seconds,
    HttpDate,
    Missing,
    Huge,
    Malformed,
    RateLimitReset,
}

const STATUSES: [u16; 7] = [400, 409, 429, 500, 502, 503, 504];
const FORMS: [HintForm; 6] = [
    HintForm::Seconds,
    HintForm::HttpDate,
    HintForm::Missing,
    HintForm::Huge,
    HintForm::Malformed,
    HintForm::RateLimitReset,
];
/// The retry cap for the matrix: above the 1-2 s hints, so they are honoured.
const CAP: Duration = Duration::from_secs(3);

struct Case {
    idempotent: bool,
    status: u16,
    form: HintForm,
    /// The wall-clock time the hint asks to wait until (date form), for the lower bound.
    until: Option<SystemTime>,
    recorder: Recorder,
}

fn template(status: u16, form: HintForm) -> (ResponseTemplate, Option<SystemTime>) {
    let template = ResponseTemplate::new(status);
    match form {
        HintForm::Seconds => (template.insert_header("retry-after", "1"), None),
        HintForm::HttpDate => {
            // Formatting truncates to whole seconds: +2 s is at least 1 s away.
            let until = SystemTime::now() + Duration::from_secs(2);
            let text = httpdate::fmt_http_date(until);
            let parsed = httpdate::parse_http_date(&text).unwrap();
            (
                template.insert_header("retry-after", text.as_str()),
                Some(parsed),
            )
        }
        HintForm::Missing => (template, None),
        HintForm::Huge => (
            template.insert_header("retry-after", "99999999999999999999"),
            None,
        ),
        HintForm::Malformed => (template.insert_header("retry-after", "in a moment"), None),
        HintForm::RateLimitReset => (template.insert_header("x-ratelimit-reset", "1"), None),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_matrix() {
    let server = MockServer::start().await;
    let mut cases = Vec::new();
    for idempotent in [false, true] {
        for status in STATUSES {
            for form in FORMS {
                let (template, until) = template(status, form);
                let recorder = Recorder::new(template);
                let route = format!("/case/{}/{status}/{form:?}", u8::from(idempotent));
                Mock::given(path(route.as_str()))
                    .respond_with(recorder.clone())
                    .mount(&server)
                    .await;
                cases.push((
                    route,
                    Case {
                        idempotent,
                        status,
                        form,
                        until,
                        recorder,
                    },
                ));
            }
        }
    }
    assert_eq!(cases.len(), 84);

    let runs = cases.iter().map(|(route, case)| {
        let mut config = config(&server);
        config.retry.max_attempts = 2;
        config.retry.cap = CAP;
        let client = HttpClient::new(config).unwrap();
        let request = Request::get(route.trim_start_matches('/'))
            .query("api_key", "SECRET-QUERY-VALUE")
            .idempotent(case.idempotent);
        async move {
            let started = std::time::Instant::now();
            let result = client
                .send(request, deadline_in(Duration::from_secs(10)))
                .await;
            (result, started.elapsed())
        }
    });
    let results = futures::future::join_all(runs).await;

    for ((route, case), (result, elapsed)) in cases.iter().zip(results) {
        let error = result.expect_err(route);
        let retryable_status = case.status == 429 || case.status >= 500;
        let huge = matches!(case.form, HintForm::Huge);
        let expect_retry = case.idempotent && retryable_status && !huge;
        let expected_attempts = if expect_retry { 2 } else { 1 };
        let arrivals = case.recorder.arrivals();
        assert_eq!(
            arrivals.len(),
            expected_attempts,
            "{route}: upstream requests"
        );
        assert_eq!(
            error.attempts(),
            u32::try_from(expected_attempts).unwrap(),
            "{route}"
        );
        assert!(!error.to_string().contains("SECRET"), "{route}: {error}");
        assert!(error.may_have_reached_vendor(), "{route}");
        assert_eq!(
            error.response().map(|r| r.status.as_u16()),
            Some(case.status),
            "{route}"
        );

        let expected_kind = match (case.status, case.idempotent && retryable_status && huge) {
            (_, true) | (429, _) => ErrorKind::Throttling,
            (500.., _) => ErrorKind::Server,
            _ => ErrorKind::Client,
        };
        assert_eq!(error.kind(), expected_kind, "{route}: {error}");

        if !expect_retry {
            // Refusing to retry (or to wait past the cap) happens at once.
            assert!(
                elapsed < Duration::from_millis(500),
                "{route}: took {elapsed:?}"
            );
            continue;
        }
        let gap = arrivals[1].0 - arrivals[0].0;
        assert!(
            gap <= CAP + Duration::from_millis(300),
            "{route}: waited {gap:?}, cap {CAP:?}"
        );
        let at_least = match case.form {
            HintForm::Seconds | HintForm::RateLimitReset => Duration::from_secs(1),
            HintForm::HttpDate => {
                let until = case.until.unwrap();
                until
                    .duration_since(arrivals[0].1)
                    .unwrap_or_default()
                    .saturating_sub(Duration::from_millis(10))
            }
            HintForm::Missing | HintForm::Malformed | HintForm::Huge => Duration::ZERO,
        };
        assert!(
            gap >= at_least,
            "{route}: waited {gap:?}, hint asked {at_least:?}"
        );
    }
}

#[tokio::test]
async fn a_wait_past_the_deadline_fails_at_once() {
    let server = MockServer::start().await;
    let cases = [
        (429, "5", ErrorKind::Throttling),
        (503, "5", ErrorKind::Throttling),
    ];
    for (status, retry_after, expected) in cases {
        Mock::given(path(format!("/wait/{status}")))
            .respond_with(ResponseTemplate::new(status).insert_header("retry-after", retry_after))
            .mount(&server)
            .await;
        let mut config = config(&server);
        config.retry.cap = Duration::from_secs(30);
        let client = HttpClient::new(config).unwrap();
        let started = std::time::Instant::now();
        let request = Request::get(format!("wait/{status}")).idempotent(true);
        let error = client
            .send(request, deadline_in(Duration::from_secs(1)))
            .await
            .unwrap_err();
        assert_eq!(error.kind(), expected, "{status}: {error}");
        assert_eq!(error.attempts(), 1);
        assert!(started.elapsed() < Duration::from_millis(500));
    }
}

#[tokio::test]
async fn a_backoff_past_the_deadline_is_a_timeout() {
    let server = MockServer::start().await;
    Mock::given(path("/down"))
        .respond_with(ResponseTemplate::new(502))
        .mount(&server)
        .await;
    let mut config = config(&server);
    // Full jitter below a 10 s step: the chance of fitting in 50 ms is 0.5%; assert either way
    // that no sleep ran past the deadline.
    config.retry.base = Duration::from_secs(10);
    config.retry.cap = Duration::from_secs(10);
    config.retry.max_attempts = 2;
    let client = HttpClient::new(config).unwrap();
    let started = std::time::Instant::now();
    let error = client
        .send(
            Request::get("down").idempotent(true),
            deadline_in(Duration::from_millis(50)),
        )
        .await
        .unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(300));
    assert!(
        matches!(error.kind(), ErrorKind::Timeout | ErrorKind::Server),
        "{error}"
    );
}

#[tokio::test]
async fn success_reports_attempts() {
    let server = MockServer::start().await;
    Mock::given(path("/flaky"))
        .respond_with(ResponseTemplate::new(503))
        .up_to_n_times(2)
        .mount(&server)
        .await;
    Mock::given(path("/flaky"))
        .respond_with(ResponseTemplate::new(200).set_body_string("ok"))
        .mount(&server)
        .await;
    let client = HttpClient::new(config(&server)).unwrap();
    let response = client
        .send(
            Request::get("flaky").idempotent(true),
            deadline_in(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    assert_eq!(response.status.as_u16(), 200);
    assert_eq!(response.attempts, 3);
    assert_eq!(&response.body[..], b"ok");
}

#[tokio::test]
async fn connection_errors_are_retried_only_when_idempotent() {
    // Bind then drop a listener so the port refuses connections.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let mut config = toolgate_http::VendorConfig::new(format!("http://127.0.0.1:{port}/"));
    config.allow_hosts = vec!["127.0.0.1".into()];
    config.retry.base = Duration::from_millis(1);
    config.retry.cap = Duration::from_millis(5);
    let client = HttpClient::new(config).unwrap();
    for (idempotent, attempts) in [(false, 1), (true, 3)] {
        let error = client
            .send(
                Request::get("x").idempotent(idempotent),
                deadline_in(Duration::from_secs(5)),
            )
            .await
            .unwrap_err();
        assert_eq!(error.kind(), ErrorKind::Transient, "{error}");
        assert_eq!(error.attempts(), attempts);
        assert!(!error.may_have_reached_vendor());
    }
}
