//! The Prometheus endpoint end to end: the real gateway with `TOOLGATE_METRICS_LISTEN`, a
//! known mix of calls over gRPC, then `/metrics` scraped over HTTP and read with the official
//! Python client's OpenMetrics parser. The counters equal what was sent; a retried 429 from
//! the fake Slack shows as attempts and a retry for its host.

use std::time::{SystemTime, UNIX_EPOCH};

use toolgate_e2e::metrics::{Scrape, scrape};
use toolgate_e2e::{BIG_TRANSFER, Gateway, Tenant, slack_config};
use toolgate_proto::v1 as pb;
use toolgate_slack::testkit::{BOT_TOKEN, FakeSlack, HISTORY_CHANNEL};

const POLICY: &str = r#"
    @id("base") permit(principal, action, resource);
    @id("no-paris") forbid(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.region == "eu-west-3" };
    @id("big") @decision("require_expert_approval")
    permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.amount > 1000 };
"#;

const CALLS: &str = "toolgate_tool_calls_total";

fn metrics_gateway(config: Option<&str>) -> Gateway {
    let options = Gateway::options().env("TOOLGATE_METRICS_LISTEN", "127.0.0.1:0");
    match config {
        Some(toml) => options.config(toml),
        None => options,
    }
    .start()
}

fn scrape_of(gateway: &Gateway) -> Scrape {
    let url = gateway
        .metrics_url
        .as_deref()
        .expect("the gateway announced its metrics address");
    scrape(url)
}

fn calls(scrape: &Scrape, tool: &str, status: &str, decision: &str) -> f64 {
    scrape
        .value(
            CALLS,
            &[("tool", tool), ("status", status), ("decision", decision)],
        )
        .unwrap_or(0.0)
}

#[tokio::test]
async fn the_counters_equal_the_calls_sent() {
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let gateway = metrics_gateway(None);
    let acme = Tenant::setup("acme")
        .tools(&["testkit.echo", "testkit.fail", "testkit.transfer"])
        .policy(POLICY)
        .create(&gateway)
        .await;
    let token = acme.token.clone();
    let run = gateway.open_run(&token, "support", 0).await;
    let echo = r#"{"message": "hello"}"#;
    let small = r#"{"amount": 10, "region": "us-east-1", "account": "a"}"#;
    let paris = r#"{"amount": 10, "region": "eu-west-3", "account": "a"}"#;
    // (tool, arguments, the status the call must end with); the mix the counters must show.
    let mix: &[(&str, &str, pb::ToolCallStatus)] = &[
        ("testkit.echo", echo, pb::ToolCallStatus::Succeeded),
        ("testkit.echo", echo, pb::ToolCallStatus::Succeeded),
        ("testkit.echo", echo, pb::ToolCallStatus::Succeeded),
        ("testkit.transfer", small, pb::ToolCallStatus::Succeeded),
        // Refused by the run's manifest: registered, not granted.
        ("testkit.noop", "{}", pb::ToolCallStatus::Blocked),
        // A name no connector serves: counted under `(unregistered)`, never as sent.
        ("nosuch.tool_zq9", "{}", pb::ToolCallStatus::Blocked),
        // Denied by policy.
        ("testkit.transfer", paris, pb::ToolCallStatus::Blocked),
        // Held for an approver.
        (
            "testkit.transfer",
            BIG_TRANSFER,
            pb::ToolCallStatus::WaitingApproval,
        ),
        // The vendor fails.
        (
            "testkit.fail",
            r#"{"code": "VENDOR_ERROR"}"#,
            pb::ToolCallStatus::Failed,
        ),
        // Invalid arguments: failed before any connector runs.
        (
            "testkit.echo",
            r#"{"message": 1}"#,
            pb::ToolCallStatus::Failed,
        ),
    ];
    for (tool, arguments, status) in mix {
        let answer = gateway.call(&token, &run, tool, arguments).await;
        assert_eq!(answer.status(), *status, "{tool} {arguments}: {answer:?}");
    }

    let scraped = scrape_of(&gateway);
    assert_eq!(
        scraped.content_type,
        "application/openmetrics-text; version=1.0.0; charset=utf-8"
    );
    assert_eq!(scraped.family_type("toolgate_tool_calls"), Some("counter"));
    let expected = [
        ("testkit.echo", "succeeded", "allow", 3.0),
        ("testkit.transfer", "succeeded", "allow", 1.0),
        ("testkit.noop", "blocked", "none", 1.0),
        ("(unregistered)", "blocked", "none", 1.0),
        ("testkit.transfer", "blocked", "block", 1.0),
        (
            "testkit.transfer",
            "waiting_approval",
            "require_expert_approval",
            1.0,
        ),
        ("testkit.fail", "failed", "allow", 1.0),
        ("testkit.echo", "failed", "none", 1.0),
    ];
    for (tool, status, decision, count) in expected {
        assert_eq!(
            calls(&scraped, tool, status, decision),
            count,
            "{tool} {status} {decision}: {:#?}",
            scraped
                .samples
                .iter()
                .filter(|s| s.name == CALLS)
                .collect::<Vec<_>>()
        );
    }
    let sent = mix.len() as f64;
    assert_eq!(scraped.sum(CALLS, &[]), sent, "no call counted twice");
    assert!(
        !scraped
            .label_values(CALLS, "tool")
            .iter()
            .any(|tool| tool.contains("nosuch")),
        "a name the agent made up never becomes a label"
    );

    // Every call's overhead is observed; the connector ran for the five that reached it.
    assert_eq!(
        scraped.sum("toolgate_gateway_overhead_seconds_count", &[]),
        sent
    );
    assert_eq!(
        scraped.value(
            "toolgate_connector_duration_seconds_count",
            &[("tool", "testkit.echo")]
        ),
        Some(3.0)
    );
    assert_eq!(
        scraped.sum("toolgate_connector_duration_seconds_count", &[]),
        5.0
    );
    let buckets = scraped.value(
        "toolgate_connector_duration_seconds_bucket",
        &[("tool", "testkit.echo"), ("le", "+Inf")],
    );
    assert_eq!(buckets, Some(3.0));

    // Two pending invocations: the call held for an approver, and the policy denial's (which
    // only a reject resolves). The ledger wrote in batches; the caches were asked.
    assert_eq!(scraped.value("toolgate_pending_approvals", &[]), Some(2.0));
    let age = scraped
        .value("toolgate_oldest_pending_approval_age_seconds", &[])
        .expect("the oldest pending age");
    assert!((0.0..60.0).contains(&age), "{age}");
    let batches = scraped
        .value("toolgate_ledger_commit_duration_seconds_count", &[])
        .unwrap();
    let operations = scraped
        .value("toolgate_ledger_batch_operations_sum", &[])
        .unwrap();
    assert!(batches >= 1.0, "{batches}");
    // Each call is at least one write (refusals one, executions two), set-up writes besides.
    assert!(operations >= sent, "{operations}");
    assert_eq!(
        scraped.value("toolgate_ledger_failed_batches_total", &[]),
        Some(0.0)
    );
    let run_lookups = scraped
        .value("toolgate_cache_hits_total", &[("cache", "runs")])
        .unwrap()
        + scraped
            .value("toolgate_cache_misses_total", &[("cache", "runs")])
            .unwrap();
    assert_eq!(run_lookups, sent, "one run lookup per call");
    assert!(
        scraped
            .value("toolgate_cache_hits_total", &[("cache", "runs")])
            .unwrap()
            >= sent - 1.0
    );

    // Who is answering, since when.
    assert_eq!(scraped.family_type("toolgate_build"), Some("info"));
    assert_eq!(
        scraped.value("toolgate_build_info", &[("version", "0.0.0")]),
        Some(1.0)
    );
    let start = scraped.value("process_start_time_seconds", &[]).unwrap();
    assert!(
        start >= started - 5.0 && start <= started + 60.0,
        "{start} vs {started}"
    );
}

#[tokio::test]
async fn a_retried_429_shows_as_attempts_and_a_retry_for_the_vendor_host() {
    let fake = FakeSlack::start().await;
    let gateway = metrics_gateway(Some(&slack_config(&fake)));
    let acme = Tenant::setup("acme")
        .tools(&["slack.channel_history"])
        .create(&gateway)
        .await;
    let printed = gateway.secrets_put("acme", "slack_default", &[], &format!("{BOT_TOKEN}\n"));
    assert!(!printed.contains(BOT_TOKEN));
    let run = gateway.open_run(&acme.token, "support", 0).await;
    // Slack throttles the first request (Retry-After: 0); history reads are retried.
    fake.rate_limit_next("conversations.history", 0).await;
    let history = gateway
        .call(
            &acme.token,
            &run,
            "slack.channel_history",
            &format!(r#"{{"channel": "{HISTORY_CHANNEL}", "limit": 3}}"#),
        )
        .await;
    assert_eq!(
        history.status(),
        pb::ToolCallStatus::Succeeded,
        "{history:?}"
    );
    assert_eq!(history.attempts, 2, "{history:?}");

    let host = fake
        .uri()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let scraped = scrape_of(&gateway);
    let attempts = "toolgate_vendor_http_attempts_total";
    assert_eq!(
        scraped.value(attempts, &[("host", &host), ("outcome", "429")]),
        Some(1.0),
        "{:#?}",
        scraped
            .samples
            .iter()
            .filter(|s| s.name.starts_with("toolgate_vendor"))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        scraped.value(attempts, &[("host", &host), ("outcome", "2xx")]),
        Some(1.0)
    );
    assert_eq!(
        scraped.value("toolgate_vendor_http_retries_total", &[("host", &host)]),
        Some(1.0)
    );
    assert_eq!(
        scraped.sum("toolgate_vendor_http_retry_budget_refusals_total", &[]),
        0.0
    );
    assert_eq!(
        scraped.value(
            CALLS,
            &[
                ("tool", "slack.channel_history"),
                ("status", "succeeded"),
                ("decision", "allow")
            ]
        ),
        Some(1.0)
    );
}

#[tokio::test]
async fn without_configuration_no_metrics_are_served() {
    let gateway = Gateway::start();
    assert_eq!(gateway.metrics_url, None);
}
