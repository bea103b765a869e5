//! The approval console's HTTP layer against the real gateway (`[console] enabled`), over real
//! HTTP/1.1 on the gRPC port: security headers, the session cookie and its expiry, sign-out,
//! CSRF and origin checks, the sign-in rate limit, tenancy, decisions carrying the row
//! version, client approval links, and bad input answered with a page and nothing changed.
//! Requests are written by hand (HTTP/1.1 over a socket), cookies too, so every header and
//! cookie attribute can be set and checked.

use std::time::Duration;

use toolgate_e2e::browser::{Browser, hidden};
use toolgate_e2e::{
    BIG_TRANSFER, BIG_TRANSFERS_NEED_APPROVAL, EXECUTION_LOG_ENV, ExecutionLog, Gateway, Tenant,
};
use toolgate_proto::v1 as pb;

const CLIENT_APPROVAL: &str = r#"
    @id("base") permit(principal, action, resource);
    @id("ask-the-customer") @decision("require_client_approval")
    permit(principal, action == Toolgate::Action::"testkit.transfer", resource)
        when { context.args.amount > 1000 };
"#;

fn start(env: &[(&str, &str)]) -> Gateway {
    let mut all = vec![("TOOLGATE_CONSOLE_ENABLED", "true")];
    all.extend_from_slice(env);
    Gateway::options().envs(&all).start()
}

async fn suspended(gateway: &Gateway, token: &str) -> pb::ToolCallResult {
    let run = gateway.open_run(token, "support", 0).await;
    let result = gateway
        .call(token, &run, "testkit.transfer", BIG_TRANSFER)
        .await;
    assert_eq!(result.status(), pb::ToolCallStatus::WaitingApproval);
    result
}

#[tokio::test]
async fn pages_carry_the_security_headers_and_the_session_cookie_is_strict() {
    let gateway = start(&[]);
    let acme = gateway.transfer_tenant("acme").await;
    let mut browser = Browser::new(&gateway);

    let page = browser.get("/console/sign-in").await;
    assert_eq!(page.status, 200);
    let header = |name: &str| page.header(name).unwrap().to_owned();
    assert_eq!(
        header("content-security-policy"),
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; \
         connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    );
    assert_eq!(header("x-content-type-options"), "nosniff");
    assert_eq!(header("referrer-policy"), "no-referrer");
    assert_eq!(header("cache-control"), "no-store");
    assert!(!page.body.contains("<script>"), "no inline script");
    let script = browser.get("/console/assets/htmx.js").await;
    assert_eq!(script.status, 200);
    assert!(
        script
            .header("content-type")
            .unwrap()
            .starts_with("text/javascript")
    );

    // Not signed in: the queue sends to the sign-in page.
    let queue = browser.get("/console/queue").await;
    assert_eq!(queue.status, 303);
    assert_eq!(queue.header("location"), Some("/console/sign-in"));

    let signed = browser.sign_in(acme.approver()).await;
    let cookie = signed.header("set-cookie").unwrap();
    // Plaintext listener: no `Secure`, so no `__Host-` prefix (it requires `Secure`).
    assert!(cookie.starts_with("tg_session="), "{cookie}");
    for attribute in ["HttpOnly", "SameSite=Strict", "Path=/", "Max-Age="] {
        assert!(cookie.contains(attribute), "{cookie} lacks {attribute}");
    }
    assert!(!cookie.contains("Secure"), "{cookie}");
    assert_eq!(signed.header("location"), Some("/console/queue"));
    let queue = browser.get("/console/queue").await;
    assert_eq!(queue.status, 200, "{}", queue.body);
    assert!(queue.body.contains("Nothing is waiting"), "{}", queue.body);

    // Sign-out needs the form token, ends the session and clears the cookie.
    let csrf = queue.csrf();
    let out = browser
        .post("/console/sign-out", &[("csrf", csrf.as_str())])
        .await;
    assert_eq!(out.status, 200, "{}", out.body);
    assert!(out.header("set-cookie").unwrap().contains("Max-Age=0"));
    let after = browser.get("/console/queue").await;
    assert_eq!(
        after.status, 303,
        "the old cookie names no session any more"
    );

    // A tampered cookie names no session.
    browser.sign_in(acme.approver()).await;
    let cookie = browser.cookie.clone().unwrap();
    browser.cookie = Some(format!("{}x", &cookie[..cookie.len() - 1]));
    assert_eq!(browser.get("/console/queue").await.status, 303);
}

#[tokio::test]
async fn sessions_end_when_idle_and_at_their_maximum_age() {
    let gateway = start(&[
        ("TOOLGATE_CONSOLE_SESSION_IDLE_MS", "1200"),
        ("TOOLGATE_CONSOLE_SESSION_MAX_MS", "3000"),
    ]);
    let acme = gateway.transfer_tenant("acme").await;

    let mut idle = Browser::new(&gateway);
    idle.sign_in(acme.approver()).await;
    assert_eq!(idle.get("/console/queue").await.status, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let ended = idle.get("/console/queue").await;
    assert_eq!(ended.status, 401, "{}", ended.body);
    assert!(ended.body.contains("idle too long"), "{}", ended.body);

    // Active all along, it still ends at its maximum age.
    let mut busy = Browser::new(&gateway);
    busy.sign_in(acme.approver()).await;
    let mut last = 200;
    for _ in 0..9 {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let page = busy.get("/console/queue").await;
        last = page.status;
        if last == 401 {
            assert!(page.body.contains("maximum age"), "{}", page.body);
            break;
        }
    }
    assert_eq!(last, 401, "the session outlived its maximum age");
}

#[tokio::test]
async fn a_revoked_token_ends_its_sessions_and_agent_tokens_do_not_sign_in() {
    let gateway = start(&[]);
    let acme = gateway.transfer_tenant("acme").await;
    let mut browser = Browser::new(&gateway);
    browser.sign_in(acme.approver()).await;
    let mut admin = gateway.admin().await;
    let tokens = admin
        .list_tokens(toolgate_e2e::authed(
            pb::ListTokensRequest {
                tenant_id: "acme".into(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap()
        .into_inner()
        .tokens;
    let approver = tokens.iter().find(|t| t.role == "approver").unwrap();
    admin
        .revoke_token(toolgate_e2e::authed(
            pb::RevokeTokenRequest {
                token_id: approver.token_id.clone(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap();
    let page = browser.get("/console/queue").await;
    assert_eq!(page.status, 401, "{}", page.body);
    assert!(page.body.contains("revoked"), "{}", page.body);

    // An agent token calls tools; it opens no console session.
    let refused = Browser::new(&gateway)
        .post("/console/sign-in", &[("token", acme.token.as_str())])
        .await;
    assert_eq!(refused.status, 403, "{}", refused.body);
    assert!(refused.header("set-cookie").is_none());
}

#[tokio::test]
async fn sign_in_attempts_are_rate_limited() {
    let gateway = start(&[]);
    let acme = gateway.transfer_tenant("acme").await;
    let browser = Browser::new(&gateway);
    for attempt in 0..10 {
        let page = browser
            .post("/console/sign-in", &[("token", "tg_approver_guess")])
            .await;
        assert_eq!(page.status, 401, "attempt {attempt}: {}", page.body);
        assert!(page.body.contains("not valid"));
    }
    // Over the limit even the right token is refused, and no session is made.
    let page = browser
        .post("/console/sign-in", &[("token", acme.approver())])
        .await;
    assert_eq!(page.status, 429, "{}", page.body);
    assert!(page.body.contains("Too many sign-in attempts"));
    assert!(page.header("set-cookie").is_none());
}

#[tokio::test]
async fn forged_and_cross_origin_posts_are_refused_and_change_nothing() {
    let log = ExecutionLog::new();
    let gateway = Gateway::options()
        .envs(&[
            ("TOOLGATE_CONSOLE_ENABLED", "true"),
            (EXECUTION_LOG_ENV, log.path().to_str().unwrap()),
        ])
        .start();
    let acme = gateway.transfer_tenant("acme").await;
    let call = suspended(&gateway, &acme.token).await;
    let mut browser = Browser::new(&gateway);
    browser.sign_in(acme.approver()).await;
    let path = format!("/console/invocations/{}", call.pending_invocation_id);
    let page = browser.get(&path).await;
    assert_eq!(page.status, 200, "{}", page.body);
    assert!(page.body.contains("testkit.transfer"));
    let csrf = page.csrf();
    let version = hidden(&page.body, "version");

    let no_token = browser
        .post(&path, &[("version", &version), ("decision", "approve")])
        .await;
    assert_eq!(no_token.status, 403, "{}", no_token.body);
    assert!(no_token.body.contains("form token"), "{}", no_token.body);
    let wrong_token = browser
        .post(
            &path,
            &[
                ("csrf", "forged"),
                ("version", &version),
                ("decision", "approve"),
            ],
        )
        .await;
    assert_eq!(wrong_token.status, 403);
    let fields = [
        ("csrf", csrf.as_str()),
        ("version", version.as_str()),
        ("decision", "approve"),
    ];
    let cross_origin = browser
        .post_from(&path, &fields, Some("http://evil.example"), None)
        .await;
    assert_eq!(cross_origin.status, 403, "{}", cross_origin.body);
    assert!(cross_origin.body.contains("another origin"));
    let cross_site = browser
        .post_from(&path, &fields, None, Some("cross-site"))
        .await;
    assert_eq!(cross_site.status, 403, "{}", cross_site.body);
    let no_origin = browser.post_from(&path, &fields, None, None).await;
    assert_eq!(no_origin.status, 403, "{}", no_origin.body);
    // `Origin: null` (what browsers send under `Referrer-Policy: no-referrer`) counts only
    // with `Sec-Fetch-Site: same-origin`.
    for site in [None, Some("cross-site"), Some("same-site")] {
        let null = browser.post_from(&path, &fields, Some("null"), site).await;
        assert_eq!(null.status, 403, "{site:?}: {}", null.body);
    }
    // A sign-in form posted from elsewhere (login CSRF) is refused too.
    let sign_in = browser
        .post_from(
            "/console/sign-in",
            &[("token", acme.approver())],
            Some("http://evil.example"),
            Some("cross-site"),
        )
        .await;
    assert_eq!(sign_in.status, 403);

    let pending = gateway
        .get_pending(acme.approver(), &call.pending_invocation_id)
        .await;
    assert_eq!(pending.state, "pending", "nothing was decided");
    assert!(log.entries().is_empty(), "nothing ran");
}

#[tokio::test]
async fn a_decision_carries_the_row_version_and_a_stale_page_says_who_decided() {
    let log = ExecutionLog::new();
    let gateway = Gateway::options()
        .envs(&[
            ("TOOLGATE_CONSOLE_ENABLED", "true"),
            (EXECUTION_LOG_ENV, log.path().to_str().unwrap()),
        ])
        .start();
    let acme = gateway.transfer_tenant("acme").await;
    let call = suspended(&gateway, &acme.token).await;
    let mut first = Browser::new(&gateway);
    first.sign_in(acme.approver()).await;
    let mut second = Browser::new(&gateway);
    second.sign_in(acme.approver()).await;

    let queue = first.get("/console/queue").await;
    assert!(
        queue.body.contains(&call.pending_invocation_id),
        "{}",
        queue.body
    );
    let rows = first.get("/console/queue/rows").await;
    assert!(rows.body.contains(&call.pending_invocation_id));
    assert!(!rows.body.contains("<html"), "the poll answers a fragment");

    let path = format!("/console/invocations/{}", call.pending_invocation_id);
    let a = first.get(&path).await;
    let b = second.get(&path).await;
    assert!(
        a.body.contains("&quot;amount&quot;: 5000"),
        "pretty-printed arguments: {}",
        a.body
    );
    assert!(a.body.contains("big"), "the policy that fired: {}", a.body);

    // Reject needs a reason: refused, nothing changed.
    let no_reason = first
        .post(
            &path,
            &[
                ("csrf", &a.csrf()),
                ("version", &hidden(&a.body, "version")),
                ("decision", "reject"),
            ],
        )
        .await;
    assert_eq!(no_reason.status, 400, "{}", no_reason.body);
    assert!(no_reason.body.contains("needs a reason"));

    let approved = first
        .post(
            &path,
            &[
                ("csrf", &a.csrf()),
                ("version", &hidden(&a.body, "version")),
                ("decision", "approve"),
            ],
        )
        .await;
    assert_eq!(approved.status, 200, "{}", approved.body);
    assert!(
        approved
            .body
            .contains("Approved: the call ran and ended succeeded"),
        "{}",
        approved.body
    );
    assert!(
        approved.body.contains("id=\"output\""),
        "the outcome is shown"
    );

    let stale = second
        .post(
            &path,
            &[
                ("csrf", &b.csrf()),
                ("version", &hidden(&b.body, "version")),
                ("decision", "approve"),
            ],
        )
        .await;
    assert_eq!(stale.status, 409, "{}", stale.body);
    assert!(stale.body.contains("Already decided by"), "{}", stale.body);
    assert_eq!(log.entries().len(), 1, "executed exactly once");

    // The decision is recorded with the approver token's identity, as over gRPC.
    let pending = gateway
        .get_pending(acme.approver(), &call.pending_invocation_id)
        .await;
    assert_eq!(pending.state, "approved");
}

#[tokio::test]
async fn another_tenants_invocation_is_not_found() {
    let gateway = start(&[]);
    let acme = gateway.transfer_tenant("acme").await;
    let globex = gateway.transfer_tenant("globex").await;
    let call = suspended(&gateway, &acme.token).await;
    let mut browser = Browser::new(&gateway);
    browser.sign_in(globex.approver()).await;
    let path = format!("/console/invocations/{}", call.pending_invocation_id);
    let page = browser.get(&path).await;
    assert_eq!(page.status, 404, "{}", page.body);
    let queue = browser.get("/console/queue").await;
    assert!(!queue.body.contains(&call.pending_invocation_id));
    let csrf = queue.csrf();
    let post = browser
        .post(
            &path,
            &[("csrf", &csrf), ("version", "1"), ("decision", "approve")],
        )
        .await;
    assert_eq!(post.status, 404, "{}", post.body);
    let pending = gateway
        .get_pending(acme.approver(), &call.pending_invocation_id)
        .await;
    assert_eq!(pending.state, "pending");
}

#[tokio::test]
async fn oversized_malformed_and_bad_filter_input_gets_a_clear_page() {
    let gateway = start(&[]);
    let acme = gateway.transfer_tenant("acme").await;
    let call = suspended(&gateway, &acme.token).await;
    let mut browser = Browser::new(&gateway);
    browser.sign_in(acme.approver()).await;
    let path = format!("/console/invocations/{}", call.pending_invocation_id);
    let page = browser.get(&path).await;
    let csrf = page.csrf();

    let big = "x".repeat(20 * 1024);
    let oversized = browser
        .post(
            &path,
            &[
                ("csrf", &csrf),
                ("version", "1"),
                ("decision", "reject"),
                ("reason", &big),
            ],
        )
        .await;
    assert_eq!(oversized.status, 413, "{}", oversized.body);
    assert!(oversized.body.contains("Form too large"));
    let twice = browser
        .post(
            &path,
            &[
                ("csrf", &csrf),
                ("decision", "approve"),
                ("decision", "reject"),
            ],
        )
        .await;
    assert_eq!(twice.status, 400, "{}", twice.body);
    let unknown = browser
        .post(
            &path,
            &[("csrf", &csrf), ("version", "1"), ("decision", "delete")],
        )
        .await;
    assert_eq!(unknown.status, 400, "{}", unknown.body);
    let filter = browser
        .get("/console/queue?risk=extreme&origin=SOMETIMES")
        .await;
    assert_eq!(filter.status, 200);
    assert!(filter.body.contains("is not one of"), "{}", filter.body);
    let missing = browser.get("/console/nowhere").await;
    assert_eq!(missing.status, 404);

    let pending = gateway
        .get_pending(acme.approver(), &call.pending_invocation_id)
        .await;
    assert_eq!(pending.state, "pending", "nothing changed");
}

#[tokio::test]
async fn a_client_link_decides_exactly_its_call_once() {
    let log = ExecutionLog::new();
    let gateway = Gateway::options()
        .envs(&[
            ("TOOLGATE_CONSOLE_ENABLED", "true"),
            (EXECUTION_LOG_ENV, log.path().to_str().unwrap()),
        ])
        .start();
    let acme = Tenant::setup("acme")
        .tools(&["testkit.transfer"])
        .policy(CLIENT_APPROVAL)
        .approver()
        .create(&gateway)
        .await;
    let first = suspended(&gateway, &acme.token).await;
    let other = suspended(&gateway, &acme.token).await;
    assert!(
        first.client_approval_url.starts_with("/console/link/"),
        "{first:?}"
    );
    assert_ne!(first.client_approval_url, other.client_approval_url);
    // An expert-approval call gets no link.
    let expert = gateway.transfer_tenant("globex").await;
    let plain = suspended(&gateway, &expert.token).await;
    assert_eq!(plain.client_approval_url, "");
    let _ = BIG_TRANSFERS_NEED_APPROVAL;

    let client = Browser::new(&gateway);
    let link = first.client_approval_url.clone();
    let shown = client.get(&link).await;
    assert_eq!(shown.status, 200, "{}", shown.body);
    assert!(shown.body.contains("testkit.transfer"));
    assert!(
        !shown.body.contains("sign-out"),
        "the link page shows nothing else"
    );

    let approved = client.post(&link, &[("decision", "approve")]).await;
    assert_eq!(approved.status, 200, "{}", approved.body);
    assert!(
        approved
            .body
            .contains("Approved: the call ran and ended succeeded"),
        "{}",
        approved.body
    );
    let again = client.post(&link, &[("decision", "approve")]).await;
    assert!(again.body.contains("already used"), "{}", again.body);
    let reopened = client.get(&link).await;
    assert!(reopened.body.contains("already used"), "{}", reopened.body);
    assert_eq!(log.entries().len(), 1, "one execution");
    assert_eq!(log.entries()[0].1, first.tool_call_id);

    // The other call is untouched; a tampered link is unknown; the link opens no session.
    let pending = gateway
        .get_pending(acme.approver(), &other.pending_invocation_id)
        .await;
    assert_eq!(pending.state, "pending");
    let mut tampered = link.clone();
    tampered.pop();
    tampered.push(if link.ends_with('A') { 'B' } else { 'A' });
    let page = client.post(&tampered, &[("decision", "approve")]).await;
    assert_eq!(page.status, 404, "{}", page.body);
    assert_eq!(client.get("/console/queue").await.status, 303);
    let decided = gateway
        .get_pending(acme.approver(), &first.pending_invocation_id)
        .await;
    assert_eq!(decided.state, "approved");
}

#[tokio::test]
async fn a_client_link_whose_approval_did_not_run_can_be_used_again() {
    let log = ExecutionLog::new();
    let gateway = Gateway::options()
        .envs(&[
            ("TOOLGATE_CONSOLE_ENABLED", "true"),
            (EXECUTION_LOG_ENV, log.path().to_str().unwrap()),
        ])
        .start();
    let acme = Tenant::setup("acme")
        .tools(&["testkit.transfer"])
        .policy(CLIENT_APPROVAL)
        .create(&gateway)
        .await;
    let call = suspended(&gateway, &acme.token).await;
    let link = call.client_approval_url.clone();
    let client = Browser::new(&gateway);

    // The kill switch is thrown before the end user approves: nothing runs, the call waits,
    // and the link is not spent.
    gateway.set_tool_calling("acme", false).await;
    let refused = client.post(&link, &[("decision", "approve")]).await;
    assert_eq!(refused.status, 200, "{}", refused.body);
    assert!(refused.body.contains("still waiting"), "{}", refused.body);
    assert!(
        refused.body.contains("id=\"approve\""),
        "the form is offered again: {}",
        refused.body
    );
    assert!(log.entries().is_empty(), "nothing ran");

    // Switched on again, the same link approves, once.
    gateway.set_tool_calling("acme", true).await;
    let approved = client.post(&link, &[("decision", "approve")]).await;
    assert!(
        approved
            .body
            .contains("Approved: the call ran and ended succeeded"),
        "{}",
        approved.body
    );
    let again = client.post(&link, &[("decision", "approve")]).await;
    assert!(again.body.contains("already used"), "{}", again.body);
    assert_eq!(log.entries().len(), 1, "one execution");
    // The tenant's audit trail, as the admin pages show it, in chain order.
    let mut admin = Browser::new(&gateway);
    admin.sign_in(&gateway.admin_token).await;
    let trail = admin.get("/console/admin/tenants/acme/audit").await;
    let kinds: Vec<&str> = trail
        .body
        .split("data-kind=\"")
        .skip(1)
        .filter_map(|rest| rest.split('"').next())
        .filter(|kind| kind.starts_with("console."))
        .collect();
    assert_eq!(
        kinds,
        [
            "console.client_link_issued",
            "console.client_link_used",
            "console.client_link_released",
            "console.client_link_used"
        ],
        "{}",
        trail.body
    );
    assert!(gateway.verify_ledger().await.ok);
}
