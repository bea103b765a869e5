//! The console's admin pages against the real gateway (`[console] enabled`), over real HTTP/1.1:
//! an admin session creates tenants and agents, grants tools, throws the kill switch behind a
//! confirmation, validates and stores policies (errors at their line), puts credentials that
//! never come back, issues tokens shown once and revokes them, and reads an audit trail with
//! the chains' verification. Every effect is checked from outside the page too: over gRPC as
//! the operator's CLI sees it, or by an agent calling a tool. Refused input changes nothing.

use toolgate_e2e::browser::Browser;
use toolgate_e2e::{Gateway, Tenant, authed};
use toolgate_proto::v1 as pb;

fn start() -> Gateway {
    Gateway::options()
        .envs(&[("TOOLGATE_CONSOLE_ENABLED", "true")])
        .start()
}

/// A browser signed in with the gateway's admin token.
async fn admin_browser(gateway: &Gateway) -> Browser {
    let mut browser = Browser::new(gateway);
    let page = browser.sign_in(&gateway.admin_token).await;
    assert_eq!(page.header("location"), Some("/console/admin"));
    browser
}

/// A POST of an admin form: the page's own CSRF token is added.
async fn submit(
    browser: &Browser,
    path: &str,
    csrf: &str,
    fields: &[(&str, &str)],
) -> (u16, String) {
    let mut all = vec![("csrf", csrf)];
    all.extend_from_slice(fields);
    let page = browser.post(path, &all).await;
    (page.status, page.body)
}

async fn csrf_of(browser: &Browser) -> String {
    let page = browser.get("/console/admin").await;
    assert_eq!(page.status, 200, "{}", page.body);
    page.csrf()
}

async fn tenants(gateway: &Gateway) -> Vec<String> {
    gateway
        .admin()
        .await
        .list_tenants(authed(pb::ListTenantsRequest {}, &gateway.admin_token))
        .await
        .unwrap()
        .into_inner()
        .tenants
        .into_iter()
        .map(|t| t.tenant_id)
        .collect()
}

async fn tool_calling(gateway: &Gateway, tenant: &str) -> pb::FeatureFlag {
    gateway
        .admin()
        .await
        .get_feature_flag(authed(
            pb::GetFeatureFlagRequest {
                tenant_id: tenant.into(),
                flag: "tool_calling_enabled".into(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap()
        .into_inner()
}

/// The tokens of `tenant` (empty: the admin tokens), as `AdminService.ListTokens` lists them.
async fn tokens_of(gateway: &Gateway, tenant: &str) -> Vec<pb::TokenInfo> {
    gateway
        .admin()
        .await
        .list_tokens(authed(
            pb::ListTokensRequest {
                tenant_id: tenant.into(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap()
        .into_inner()
        .tokens
}

/// The admin tokens and acme's.
async fn token_count(gateway: &Gateway) -> usize {
    tokens_of(gateway, "").await.len() + tokens_of(gateway, "acme").await.len()
}

async fn admin_token_id(gateway: &Gateway) -> String {
    let tokens = tokens_of(gateway, "").await;
    tokens
        .into_iter()
        .find(|t| t.role == "admin")
        .unwrap()
        .token_id
}

async fn policy(gateway: &Gateway) -> pb::PolicySet {
    gateway
        .admin()
        .await
        .get_policy(authed(
            pb::GetPolicyRequest {
                tenant_id: "acme".into(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap()
        .into_inner()
}

async fn list(gateway: &Gateway) -> Vec<pb::SecretInfo> {
    gateway
        .admin()
        .await
        .list_secrets(authed(
            pb::ListSecretsRequest {
                tenant_id: "acme".into(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap()
        .into_inner()
        .secrets
}

/// The text of the element with `id` (its first text run).
fn text_of(body: &str, id: &str) -> String {
    let marker = format!("id=\"{id}\"");
    let start = body
        .find(&marker)
        .unwrap_or_else(|| panic!("no #{id} in {body}"));
    let after = &body[start..];
    let open = after.find('>').unwrap() + 1;
    after[open..][..after[open..].find('<').unwrap()].to_owned()
}

#[tokio::test]
async fn an_admin_session_sets_up_a_tenant_that_an_agent_can_then_use() {
    let gateway = start();
    let browser = admin_browser(&gateway).await;
    let csrf = csrf_of(&browser).await;

    // A tenant, refused first for a malformed id (nothing created), then created.
    let (status, body) = submit(
        &browser,
        "/console/admin/tenants",
        &csrf,
        &[("tenant_id", "bad id!"), ("name", "x")],
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.contains("tenant_id"), "{body}");
    assert!(tenants(&gateway).await.is_empty());
    let (status, body) = submit(
        &browser,
        "/console/admin/tenants",
        &csrf,
        &[("tenant_id", "acme"), ("name", "Acme Corp")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Tenant acme created"), "{body}");
    assert_eq!(tenants(&gateway).await, ["acme"]);
    let (status, body) = submit(
        &browser,
        "/console/admin/tenants",
        &csrf,
        &[("tenant_id", "acme")],
    )
    .await;
    assert_eq!(status, 409, "a second tenant acme: {body}");

    // An agent and a grant; a tool this gateway does not serve is refused, naming those it does.
    let (status, body) = submit(
        &browser,
        "/console/admin/tenants/acme/agents",
        &csrf,
        &[("agent_id", "support"), ("name", "Support bot")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, body) = submit(
        &browser,
        "/console/admin/tenants/acme/grants",
        &csrf,
        &[
            ("tool", "testkit.nope"),
            ("agent_id", ""),
            ("enabled", "true"),
        ],
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body.contains("registered tools") && body.contains("testkit.echo"),
        "{body}"
    );
    let (status, body) = submit(
        &browser,
        "/console/admin/tenants/acme/grants",
        &csrf,
        &[
            ("tool", "testkit.echo"),
            ("agent_id", "support"),
            ("enabled", "true"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("testkit.echo granted to agent support"),
        "{body}"
    );
    let grants = gateway
        .admin()
        .await
        .list_permissions(authed(
            pb::ListPermissionsRequest {
                tenant_id: "acme".into(),
                agent_id: "support".into(),
            },
            &gateway.admin_token,
        ))
        .await
        .unwrap()
        .into_inner()
        .permissions;
    assert_eq!(grants.len(), 1);
    assert_eq!(
        (
            grants[0].tool_name.as_str(),
            grants[0].agent_id.as_str(),
            grants[0].enabled
        ),
        ("testkit.echo", "support", true)
    );

    // The kill switch turns on only with the tenant's id typed again.
    let confirm = browser
        .get("/console/admin/tenants/acme/kill-switch?to=on")
        .await;
    assert_eq!(confirm.status, 200, "{}", confirm.body);
    assert!(confirm.body.contains("Type the tenant"), "{}", confirm.body);
    let (status, body) = submit(
        &browser,
        "/console/admin/tenants/acme/kill-switch",
        &csrf,
        &[("enabled", "true"), ("confirm", "acm")],
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        !tool_calling(&gateway, "acme").await.explicitly_set,
        "a wrong confirmation changed the switch"
    );
    let (status, body) = submit(
        &browser,
        "/console/admin/tenants/acme/kill-switch",
        &csrf,
        &[("enabled", "true"), ("confirm", "acme")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(tool_calling(&gateway, "acme").await.enabled);

    // An agent token issued on the tokens page, shown once, works for the agent.
    let (status, body) = submit(
        &browser,
        "/console/admin/tokens",
        &csrf,
        &[
            ("role", "agent"),
            ("tenant_id", "acme"),
            ("agent_id", "support"),
            ("label", "support bot"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let token = text_of(&body, "new-token");
    assert!(token.starts_with("tg_agent_"), "{token}");
    let issued = tokens_of(&gateway, "acme").await;
    let issued = issued.iter().find(|t| t.label == "support bot").unwrap();
    let listing = browser.get("/console/admin/tokens").await;
    assert!(
        listing
            .body
            .contains(&format!("data-token=\"{}\"", issued.token_id)),
        "every tenant's tokens are listed: {}",
        listing.body
    );
    assert!(!listing.body.contains(&token), "a token is shown once only");
    let run = gateway.open_run(&token, "support", 0).await;
    let result = gateway
        .call(&token, &run, "testkit.echo", r#"{"message":"hi"}"#)
        .await;
    assert_eq!(result.status(), pb::ToolCallStatus::Succeeded, "{result:?}");

    // Off again, confirmed: the agent's next call is refused.
    let (status, body) = submit(
        &browser,
        "/console/admin/tenants/acme/kill-switch",
        &csrf,
        &[("enabled", "false"), ("confirm", "acme")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Tool calling is off"), "{body}");
    let result = gateway
        .call(&token, &run, "testkit.echo", r#"{"message":"again"}"#)
        .await;
    assert_eq!(result.error_code, "FEATURE_DISABLED", "{result:?}");

    // The audit trail names every change with the session's admin token, and the chains verify.
    let admin_id = admin_token_id(&gateway).await;
    let audit = browser.get("/console/admin/tenants/acme/audit").await;
    assert_eq!(audit.status, 200, "{}", audit.body);
    assert!(audit.body.contains("Verified:"), "{}", audit.body);
    for kind in [
        "admin.tenant_created",
        "admin.agent_created",
        "admin.grant_set",
        "admin.flag_set",
        "admin.token_issued",
        "tool_call.succeeded",
    ] {
        assert!(
            audit.body.contains(&format!("data-kind=\"{kind}\"")),
            "{kind} missing: {}",
            audit.body
        );
    }
    assert!(
        audit.body.contains(&admin_id),
        "the actor's token id: {}",
        audit.body
    );
    let run_trail = browser
        .get(&format!("/console/admin/tenants/acme/audit?run={run}"))
        .await;
    assert!(
        run_trail.body.contains("data-kind=\"tool_call.succeeded\""),
        "{}",
        run_trail.body
    );
    assert!(
        !run_trail
            .body
            .contains("data-kind=\"admin.tenant_created\""),
        "{}",
        run_trail.body
    );
    assert!(gateway.verify_ledger().await.ok);
}

#[tokio::test]
async fn a_policy_is_validated_with_errors_at_their_line_and_a_bad_one_changes_nothing() {
    let gateway = start();
    Tenant::setup("acme")
        .tools(&["testkit.transfer"])
        .create(&gateway)
        .await;
    let browser = admin_browser(&gateway).await;
    let csrf = csrf_of(&browser).await;
    let current = browser.get("/console/admin/tenants/acme/policy").await;
    assert_eq!(current.status, 200, "{}", current.body);
    assert!(
        current.body.contains("built-in default applies"),
        "{}",
        current.body
    );

    let broken = "@id(\"base\") permit(principal, action, resource);\n\n@id(\"typo\") permit(principal, action == Toolgate::Action::\"testkit.nope\", resource);\n";
    let (status, body) = submit(
        &browser,
        "/console/admin/tenants/acme/policy",
        &csrf,
        &[("text", broken), ("action", "save")],
    )
    .await;
    assert_eq!(status, 422, "{body}");
    assert!(
        body.contains("id=\"line-3\" class=\"error-line\""),
        "the error sits at line 3: {body}"
    );
    assert!(
        !body.contains("id=\"line-1\" class=\"error-line\""),
        "{body}"
    );
    assert!(body.contains("nothing was stored"), "{body}");
    assert_eq!(
        policy(&gateway).await.version,
        0,
        "a policy that does not validate was stored"
    );

    let good = "@id(\"base\") permit(principal, action, resource);\n@id(\"big\") @decision(\"require_expert_approval\") @risk(\"high\")\npermit(principal, action == Toolgate::Action::\"testkit.transfer\", resource) when { context.args.amount > 1000 };\n";
    let (status, body) = submit(
        &browser,
        "/console/admin/tenants/acme/policy",
        &csrf,
        &[("text", good), ("action", "validate")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("validates"), "{body}");
    assert_eq!(
        policy(&gateway).await.version,
        0,
        "validating stores nothing"
    );
    let (status, body) = submit(
        &browser,
        "/console/admin/tenants/acme/policy",
        &csrf,
        &[("text", good), ("action", "save")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("Stored as version 1"), "{body}");
    let stored = policy(&gateway).await;
    assert_eq!((stored.version, stored.text.as_str()), (1, good));
}

#[tokio::test]
async fn credentials_go_in_sealed_and_their_values_never_come_back() {
    let gateway = start();
    Tenant::setup("acme").create(&gateway).await;
    let browser = admin_browser(&gateway).await;
    let csrf = csrf_of(&browser).await;
    let path = "/console/admin/tenants/acme/credentials";
    let value = "xoxb-1111-2222-console-secret-value";

    // Refused: an empty value, metadata that is not a JSON object, an unknown reference scheme.
    for (fields, names) in [
        (
            vec![("kind", "sealed"), ("name", "slack_default"), ("value", "")],
            "value",
        ),
        (
            vec![
                ("kind", "sealed"),
                ("name", "slack_default"),
                ("value", value),
                ("metadata_json", "[1]"),
            ],
            "metadata_json",
        ),
        (
            vec![
                ("kind", "reference"),
                ("name", "other"),
                ("reference", "vault:kv/x"),
            ],
            "reference",
        ),
        (
            vec![("kind", "sealed"), ("name", "bad name!"), ("value", value)],
            "name",
        ),
    ] {
        let (status, body) = submit(&browser, path, &csrf, &fields).await;
        assert_eq!(status, 400, "{fields:?}: {body}");
        assert!(body.contains(names), "{fields:?}: {body}");
        assert!(!body.contains(value), "a refused form echoed the value");
    }
    assert!(
        list(&gateway).await.is_empty(),
        "a refused form stored something"
    );

    let (status, body) = submit(
        &browser,
        path,
        &csrf,
        &[
            ("kind", "sealed"),
            ("name", "slack_default"),
            ("value", value),
            ("notes", "bot token"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("Credential slack_default stored (sealed under key"),
        "{body}"
    );
    assert!(!body.contains(value));
    let (status, body) = submit(
        &browser,
        path,
        &csrf,
        &[
            ("kind", "reference"),
            ("name", "shopify_default"),
            ("reference", "env:SHOPIFY_SECRET"),
        ],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let page = browser.get(path).await;
    assert!(!page.body.contains(value), "the page showed a value");
    assert!(page.body.contains("env:SHOPIFY_SECRET"), "{}", page.body);
    let stored = list(&gateway).await;
    assert_eq!(stored.len(), 2);
    let sealed = stored.iter().find(|s| s.name == "slack_default").unwrap();
    assert_eq!(sealed.kind, "sealed");
    assert!(!sealed.key_id.is_empty());

    // Deleting needs the box ticked.
    let (status, _) = submit(
        &browser,
        &format!("{path}/delete"),
        &csrf,
        &[("name", "slack_default")],
    )
    .await;
    assert_eq!(status, 400);
    assert_eq!(list(&gateway).await.len(), 2);
    let (status, body) = submit(
        &browser,
        &format!("{path}/delete"),
        &csrf,
        &[("name", "slack_default"), ("confirm", "on")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let names: Vec<String> = list(&gateway).await.into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["shopify_default"]);
}

#[tokio::test]
async fn a_revoked_token_stops_working_everywhere_and_bad_token_forms_change_nothing() {
    let gateway = start();
    let acme = Tenant::setup("acme").approver().create(&gateway).await;
    let browser = admin_browser(&gateway).await;
    let csrf = csrf_of(&browser).await;
    let before = token_count(&gateway).await;
    for (fields, says) in [
        (
            vec![("role", "admin"), ("tenant_id", "acme")],
            "admin tokens belong to no tenant",
        ),
        (
            vec![
                ("role", "approver"),
                ("tenant_id", "acme"),
                ("agent_id", "support"),
            ],
            "approver tokens are not bound to an agent",
        ),
        (
            vec![("role", "root"), ("tenant_id", "")],
            "not one of agent, approver, admin",
        ),
    ] {
        let (status, body) = submit(&browser, "/console/admin/tokens", &csrf, &fields).await;
        assert_eq!(status, 400, "{fields:?}: {body}");
        assert!(body.contains(says), "{fields:?}: {body}");
    }
    assert_eq!(
        token_count(&gateway).await,
        before,
        "a refused form issued a token"
    );

    // The approver signed in elsewhere; the admin revokes the approver's token.
    let mut approver = Browser::new(&gateway);
    approver.sign_in(acme.approver()).await;
    let tokens = browser.get("/console/admin/tokens?tenant=acme").await;
    let id = tokens_of(&gateway, "acme")
        .await
        .into_iter()
        .find(|t| t.role == "approver" && t.tenant_id == "acme")
        .unwrap()
        .token_id;
    assert!(
        tokens.body.contains(&format!("data-token=\"{id}\"")),
        "{}",
        tokens.body
    );
    let (status, _) = submit(
        &browser,
        "/console/admin/tokens/revoke",
        &csrf,
        &[("token_id", &id)],
    )
    .await;
    assert_eq!(status, 400, "revoking needs the box ticked");
    assert_eq!(approver.get("/console/queue").await.status, 200);
    let (status, body) = submit(
        &browser,
        "/console/admin/tokens/revoke",
        &csrf,
        &[("token_id", &id), ("confirm", "on")],
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let ended = approver.get("/console/queue").await;
    assert_eq!(ended.status, 401, "{}", ended.body);
    let mut approvals = toolgate_proto::v1::approval_service_client::ApprovalServiceClient::new(
        gateway.channel().await,
    );
    let refused = approvals
        .list_pending(authed(pb::ListPendingRequest::default(), acme.approver()))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated);

    // The session's own token is not revocable from the session.
    let own = admin_token_id(&gateway).await;
    let (status, body) = submit(
        &browser,
        "/console/admin/tokens/revoke",
        &csrf,
        &[("token_id", &own), ("confirm", "on")],
    )
    .await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(browser.get("/console/admin").await.status, 200);
}

#[tokio::test]
async fn admin_pages_need_an_admin_session_the_form_token_and_the_consoles_origin() {
    let gateway = start();
    let acme = Tenant::setup("acme").approver().create(&gateway).await;

    // No session: to the sign-in page. An approver: not theirs. An admin: not the queue.
    let stranger = Browser::new(&gateway);
    let page = stranger.get("/console/admin/tenants/acme").await;
    assert_eq!(
        (page.status, page.header("location")),
        (303, Some("/console/sign-in"))
    );
    let mut approver = Browser::new(&gateway);
    approver.sign_in(acme.approver()).await;
    for path in [
        "/console/admin",
        "/console/admin/tokens",
        "/console/admin/tenants/acme/audit",
    ] {
        let page = approver.get(path).await;
        assert_eq!(page.status, 403, "{path}: {}", page.body);
        assert!(page.body.contains("admin session"), "{}", page.body);
    }
    let approver_csrf = approver.get("/console/queue").await.csrf();
    let (status, _) = submit(
        &approver,
        "/console/admin/tenants",
        &approver_csrf,
        &[("tenant_id", "evil")],
    )
    .await;
    assert_eq!(status, 403);
    let admin = admin_browser(&gateway).await;
    assert_eq!(admin.get("/console/queue").await.status, 403);
    assert_eq!(
        admin.get("/console/").await.header("location"),
        Some("/console/admin")
    );

    // Forged (no or another session's token) and cross-origin POSTs change nothing.
    let csrf = csrf_of(&admin).await;
    let forged = admin
        .post("/console/admin/tenants", &[("tenant_id", "forged")])
        .await;
    assert_eq!(forged.status, 403, "{}", forged.body);
    let (status, _) = submit(
        &admin,
        "/console/admin/tenants",
        &approver_csrf,
        &[("tenant_id", "forged")],
    )
    .await;
    assert_eq!(status, 403);
    let cross = admin
        .post_from(
            "/console/admin/tenants/acme/kill-switch",
            &[
                ("csrf", csrf.as_str()),
                ("enabled", "false"),
                ("confirm", "acme"),
            ],
            Some("http://evil.example"),
            Some("cross-site"),
        )
        .await;
    assert_eq!(cross.status, 403, "{}", cross.body);
    assert_eq!(tenants(&gateway).await, ["acme"]);
    assert!(
        tool_calling(&gateway, "acme").await.enabled,
        "a cross-origin form threw the kill switch"
    );

    // Another tenant's pages: a tenant that does not exist is 404, as on gRPC.
    let missing = admin.get("/console/admin/tenants/globex/policy").await;
    assert_eq!(missing.status, 404, "{}", missing.body);
    let bad = admin
        .get("/console/admin/tenants/acme/audit?after=-3")
        .await;
    assert_eq!(bad.status, 400, "{}", bad.body);
}
