//! The console's admin pages, for sessions opened with an admin token: tenants and agents,
//! tool grants, the kill switch (behind a confirmation), policies (validated, errors shown at
//! their line), credentials (values go in, never come back), tokens (a new one is shown once)
//! and audit trails with the chains' verification.
//!
//! Every change goes through [`Admin`], the operations the gRPC `AdminService` performs, so
//! it is checked and audited the same way, with the session's admin token as the actor. Every
//! POST passes [`Console::signed_post`] (session, origin, CSRF token) before anything is read.
//! A refused change re-renders the page with what was wrong and the status saying so;
//! nothing was changed.

#![allow(
    clippy::result_large_err,
    reason = "a handler's refusal is the page it answers with, returned at once"
)]

use std::collections::HashMap;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use toolgate_core::RunId;
use toolgate_ledger::{Role, TOOL_CALLING_ENABLED};

use super::admin_pages::{self as views, AuditView, PolicyView, TenantView};
use super::pages::Notice;
use super::{App, Console, Signed, service_problem};
use crate::admin::{Admin, CredentialInput};
use crate::convert::parse_id;
use crate::status::ServiceError;

/// A handler's answer: the page, or the refusal page.
type Page = Result<Response, Response>;
type Body = Result<Bytes, axum::extract::rejection::BytesRejection>;
type Fields = HashMap<String, String>;

/// The largest admin form taken: a policy set can be long (the gRPC limit on a request is
/// larger still; a longer one goes through `toolgate admin`).
pub(super) const MAX_ADMIN_FORM_BYTES: usize = 256 * 1024;

/// Events shown per page of an audit trail.
const EVENTS_PER_PAGE: u32 = 200;

pub(super) fn routes() -> Router<App> {
    Router::new()
        .route("/console/admin", get(tenants))
        .route("/console/admin/tenants", post(create_tenant))
        .route("/console/admin/tenants/{tenant}", get(tenant))
        .route("/console/admin/tenants/{tenant}/agents", post(create_agent))
        .route("/console/admin/tenants/{tenant}/grants", post(set_grant))
        .route(
            "/console/admin/tenants/{tenant}/kill-switch",
            get(kill_switch).post(set_kill_switch),
        )
        .route(
            "/console/admin/tenants/{tenant}/policy",
            get(policy).post(post_policy),
        )
        .route(
            "/console/admin/tenants/{tenant}/credentials",
            get(credentials).post(put_credential),
        )
        .route(
            "/console/admin/tenants/{tenant}/credentials/delete",
            post(delete_credential),
        )
        .route("/console/admin/tenants/{tenant}/audit", get(audit))
        .route("/console/admin/tokens", get(tokens).post(issue_token))
        .route("/console/admin/tokens/revoke", post(revoke_token))
        // Closer to the handlers than the console's own limit, so it is the one that applies.
        .layer(DefaultBodyLimit::max(MAX_ADMIN_FORM_BYTES))
}

/// A query parameter as sent, or empty.
fn param(query: Option<&str>, name: &str) -> String {
    url::form_urlencoded::parse(query.unwrap_or_default().as_bytes())
        .find(|(key, _)| key == name)
        .map(|(_, value)| value.trim().to_owned())
        .unwrap_or_default()
}

/// A field as typed, or empty.
fn field<'f>(fields: &'f Fields, name: &str) -> &'f str {
    fields.get(name).map_or("", String::as_str)
}

/// A checkbox's state.
fn checked(fields: &Fields, name: &str) -> bool {
    matches!(field(fields, name), "on" | "true" | "yes")
}

/// A refused change as a notice on the page the form was on, with the status it deserves.
fn refused(error: ServiceError) -> (StatusCode, Option<Notice>) {
    let status = crate::status::status(error);
    (
        super::http_status(status.code()),
        Some(Notice::Problem(status.message().to_owned())),
    )
}

fn done(text: String) -> (StatusCode, Option<Notice>) {
    (StatusCode::OK, Some(Notice::Outcome(text)))
}

fn bad_input(text: &str) -> (StatusCode, Option<Notice>) {
    (
        StatusCode::BAD_REQUEST,
        Some(Notice::Problem(text.to_owned())),
    )
}

impl Console {
    async fn admin_session(&self, headers: &HeaderMap) -> Result<Signed, Response> {
        self.session_of(headers, Role::Admin).await
    }
}

// --- tenants -----------------------------------------------------------------------------

async fn tenants(State(app): State<App>, headers: HeaderMap) -> Page {
    let signed = app.admin_session(&headers).await?;
    tenants_page(&app, &signed, (StatusCode::OK, None)).await
}

async fn tenants_page(
    app: &Console,
    signed: &Signed,
    (status, notice): (StatusCode, Option<Notice>),
) -> Page {
    let list = Admin::new(&app.shared, &signed.caller)
        .list_tenants()
        .await
        .map_err(service_problem)?;
    Ok(views::tenants(signed, &list, notice, status))
}

async fn create_tenant(State(app): State<App>, headers: HeaderMap, body: Body) -> Page {
    let (signed, fields) = app.signed_post(&headers, Role::Admin, body).await?;
    let admin = Admin::new(&app.shared, &signed.caller);
    match admin
        .create_tenant(
            field(&fields, "tenant_id").trim(),
            field(&fields, "name").trim(),
        )
        .await
    {
        Ok(created) => {
            let outcome = done(format!(
                "Tenant {} created. Tool calling is off until you turn it on.",
                created.id
            ));
            tenant_page(&app, &signed, created.id.as_str(), outcome).await
        }
        Err(error) => tenants_page(&app, &signed, refused(error)).await,
    }
}

async fn tenant(State(app): State<App>, Path(tenant): Path<String>, headers: HeaderMap) -> Page {
    let signed = app.admin_session(&headers).await?;
    tenant_page(&app, &signed, &tenant, (StatusCode::OK, None)).await
}

/// The tenant's page: its kill switch, agents and grants.
async fn tenant_page(
    app: &Console,
    signed: &Signed,
    tenant: &str,
    (status, notice): (StatusCode, Option<Notice>),
) -> Page {
    let admin = Admin::new(&app.shared, &signed.caller);
    let tenant = admin.tenant(tenant).await.map_err(service_problem)?;
    let id = tenant.id.as_str();
    let (_, calling) = admin
        .get_flag(id, TOOL_CALLING_ENABLED)
        .await
        .map_err(service_problem)?;
    let agents = admin.list_agents(id).await.map_err(service_problem)?;
    // Tenant-wide grants, then each agent's own.
    let mut grants = admin
        .list_permissions(id, "")
        .await
        .map_err(service_problem)?;
    for agent in &agents {
        let own = admin
            .list_permissions(id, agent.id.as_str())
            .await
            .map_err(service_problem)?;
        grants.extend(own.into_iter().filter(|grant| grant.agent.is_some()));
    }
    let tools = app
        .shared
        .engine
        .catalog()
        .registry()
        .names()
        .map(ToString::to_string)
        .collect();
    let view = TenantView {
        tenant,
        calling_enabled: calling.unwrap_or(false),
        agents,
        grants,
        tools,
    };
    Ok(views::tenant(signed, &view, notice, status))
}

async fn create_agent(
    State(app): State<App>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Page {
    let (signed, fields) = app.signed_post(&headers, Role::Admin, body).await?;
    let outcome = match Admin::new(&app.shared, &signed.caller)
        .create_agent(
            &tenant,
            field(&fields, "agent_id").trim(),
            field(&fields, "name").trim().to_owned(),
        )
        .await
    {
        Ok(agent) => done(format!("Agent {} created.", agent.id)),
        Err(error) => refused(error),
    };
    tenant_page(&app, &signed, &tenant, outcome).await
}

async fn set_grant(
    State(app): State<App>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Page {
    let (signed, fields) = app.signed_post(&headers, Role::Admin, body).await?;
    let enabled = match field(&fields, "enabled") {
        "true" => true,
        "false" => false,
        _ => {
            let outcome = bad_input("The form says neither grant nor withdraw.");
            return tenant_page(&app, &signed, &tenant, outcome).await;
        }
    };
    let agent = field(&fields, "agent_id").trim();
    let outcome = match Admin::new(&app.shared, &signed.caller)
        .set_permission(&tenant, agent, field(&fields, "tool").trim(), enabled)
        .await
    {
        Ok(grant) => {
            let to = grant
                .agent
                .as_ref()
                .map_or_else(|| "every agent".to_owned(), |a| format!("agent {a}"));
            let verb = if enabled {
                "granted to"
            } else {
                "withdrawn from"
            };
            done(format!("{} {verb} {to}.", grant.tool))
        }
        Err(error) => refused(error),
    };
    tenant_page(&app, &signed, &tenant, outcome).await
}

// --- the kill switch ---------------------------------------------------------------------

/// The confirmation page; `?to=on|off` is the state it asks for.
async fn kill_switch(
    State(app): State<App>,
    Path(tenant): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Page {
    let signed = app.admin_session(&headers).await?;
    let turn_on = match param(query.as_deref(), "to").as_str() {
        "on" => true,
        "off" | "" => false,
        other => {
            return Err(super::pages::problem(
                StatusCode::BAD_REQUEST,
                "Unknown state",
                &format!("`{other}` is not on or off."),
            ));
        }
    };
    confirm_page(&app, &signed, &tenant, turn_on, (StatusCode::OK, None)).await
}

async fn confirm_page(
    app: &Console,
    signed: &Signed,
    tenant: &str,
    turn_on: bool,
    (status, notice): (StatusCode, Option<Notice>),
) -> Page {
    let admin = Admin::new(&app.shared, &signed.caller);
    let tenant = admin.tenant(tenant).await.map_err(service_problem)?;
    let (_, calling) = admin
        .get_flag(tenant.id.as_str(), TOOL_CALLING_ENABLED)
        .await
        .map_err(service_problem)?;
    Ok(views::kill_switch(
        signed,
        &tenant,
        calling.unwrap_or(false),
        turn_on,
        notice,
        status,
    ))
}

/// Sets `tool_calling_enabled` once the form carries the tenant's id typed again.
async fn set_kill_switch(
    State(app): State<App>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Page {
    let (signed, fields) = app.signed_post(&headers, Role::Admin, body).await?;
    let turn_on = match field(&fields, "enabled") {
        "true" => true,
        "false" => false,
        _ => {
            let outcome = bad_input("The form says neither on nor off; nothing was changed.");
            return confirm_page(&app, &signed, &tenant, false, outcome).await;
        }
    };
    if field(&fields, "confirm").trim() != tenant {
        let outcome =
            bad_input("Type the tenant's id exactly to confirm; the switch was not changed.");
        return confirm_page(&app, &signed, &tenant, turn_on, outcome).await;
    }
    let outcome = match Admin::new(&app.shared, &signed.caller)
        .set_flag(&tenant, TOOL_CALLING_ENABLED, turn_on)
        .await
    {
        Ok(_) if turn_on => done("Tool calling is on: the tenant's agents can call their granted tools.".to_owned()),
        Ok(_) => done("Tool calling is off: every call of this tenant is refused (FEATURE_DISABLED), approved ones included.".to_owned()),
        Err(error) => return confirm_page(&app, &signed, &tenant, turn_on, refused(error)).await,
    };
    tenant_page(&app, &signed, &tenant, outcome).await
}

// --- policies ----------------------------------------------------------------------------

async fn policy(State(app): State<App>, Path(tenant): Path<String>, headers: HeaderMap) -> Page {
    let signed = app.admin_session(&headers).await?;
    policy_page(
        &app,
        &signed,
        &tenant,
        None,
        Vec::new(),
        (StatusCode::OK, None),
    )
    .await
}

/// The policy page: the current set, and the draft the form sent with its errors.
async fn policy_page(
    app: &Console,
    signed: &Signed,
    tenant: &str,
    draft: Option<String>,
    errors: Vec<String>,
    (status, notice): (StatusCode, Option<Notice>),
) -> Page {
    let admin = Admin::new(&app.shared, &signed.caller);
    let tenant = admin.tenant(tenant).await.map_err(service_problem)?;
    let current = admin
        .get_policy(tenant.id.as_str())
        .await
        .map_err(service_problem)?;
    let view = PolicyView {
        tenant,
        current,
        draft,
        errors,
    };
    Ok(views::policy(signed, &view, notice, status))
}

/// Validates the text (`action=validate`) or validates and stores it (`action=save`).
async fn post_policy(
    State(app): State<App>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Page {
    let (signed, fields) = app.signed_post(&headers, Role::Admin, body).await?;
    let admin = Admin::new(&app.shared, &signed.caller);
    let text = field(&fields, "text").replace("\r\n", "\n");
    let save = match field(&fields, "action") {
        "save" => true,
        "validate" => false,
        _ => {
            let outcome = bad_input("The form asks neither to validate nor to save.");
            return policy_page(&app, &signed, &tenant, Some(text), Vec::new(), outcome).await;
        }
    };
    let errors = admin.validate_policy(&text).map_err(service_problem)?;
    if !errors.is_empty() {
        let count = errors.len();
        let outcome = (
            StatusCode::UNPROCESSABLE_ENTITY,
            Some(Notice::Problem(format!(
                "The policy does not validate ({count} problem{}); {}",
                if count == 1 { "" } else { "s" },
                if save {
                    "nothing was stored, the current version still applies."
                } else {
                    "see the marked lines."
                }
            ))),
        );
        return policy_page(&app, &signed, &tenant, Some(text), errors, outcome).await;
    }
    if !save {
        let outcome = done(
            "The policy validates against the registered tools. It is not stored yet.".to_owned(),
        );
        return policy_page(&app, &signed, &tenant, Some(text), Vec::new(), outcome).await;
    }
    match admin.put_policy(&tenant, &text).await {
        Ok(version) => {
            let outcome = done(format!("Stored as version {version}; it applies now."));
            policy_page(&app, &signed, &tenant, None, Vec::new(), outcome).await
        }
        Err(error) => {
            policy_page(
                &app,
                &signed,
                &tenant,
                Some(text),
                Vec::new(),
                refused(error),
            )
            .await
        }
    }
}

// --- credentials -------------------------------------------------------------------------

async fn credentials(
    State(app): State<App>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
) -> Page {
    let signed = app.admin_session(&headers).await?;
    credentials_page(&app, &signed, &tenant, (StatusCode::OK, None)).await
}

async fn credentials_page(
    app: &Console,
    signed: &Signed,
    tenant: &str,
    (status, notice): (StatusCode, Option<Notice>),
) -> Page {
    let admin = Admin::new(&app.shared, &signed.caller);
    let tenant = admin.tenant(tenant).await.map_err(service_problem)?;
    let records = admin
        .list_credentials(tenant.id.as_str())
        .await
        .map_err(service_problem)?;
    Ok(views::credentials(
        signed, &tenant, &records, notice, status,
    ))
}

/// Puts a sealed value (`kind=sealed`, `value`) or a reference (`kind=reference`,
/// `reference`). The value is never echoed, not even when the form is refused.
async fn put_credential(
    State(app): State<App>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Page {
    let (signed, fields) = app.signed_post(&headers, Role::Admin, body).await?;
    let admin = Admin::new(&app.shared, &signed.caller);
    let input = CredentialInput {
        tenant: &tenant,
        name: field(&fields, "name").trim(),
        metadata_json: field(&fields, "metadata_json"),
        notes: field(&fields, "notes").trim().to_owned(),
    };
    let stored = match field(&fields, "kind") {
        "sealed" => admin.put_sealed(input, field(&fields, "value")).await,
        "reference" => {
            admin
                .put_reference(input, field(&fields, "reference").trim())
                .await
        }
        _ => {
            let outcome = bad_input("The form says neither a sealed value nor a reference.");
            return credentials_page(&app, &signed, &tenant, outcome).await;
        }
    };
    let outcome = match stored {
        Ok(record) => done(format!(
            "Credential {} stored ({}{}).",
            record.name,
            record.kind.as_str(),
            record
                .key_id
                .as_deref()
                .map(|key| format!(" under key {key}"))
                .unwrap_or_default()
        )),
        Err(error) => refused(error),
    };
    credentials_page(&app, &signed, &tenant, outcome).await
}

async fn delete_credential(
    State(app): State<App>,
    Path(tenant): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> Page {
    let (signed, fields) = app.signed_post(&headers, Role::Admin, body).await?;
    let name = field(&fields, "name").trim();
    if !checked(&fields, "confirm") {
        let outcome = bad_input("Tick the box to confirm the deletion; nothing was deleted.");
        return credentials_page(&app, &signed, &tenant, outcome).await;
    }
    let outcome = match Admin::new(&app.shared, &signed.caller)
        .delete_credential(&tenant, name)
        .await
    {
        Ok(()) => done(format!("Credential {name} deleted.")),
        Err(error) => refused(error),
    };
    credentials_page(&app, &signed, &tenant, outcome).await
}

// --- tokens ------------------------------------------------------------------------------

/// Every token, or `?tenant=`'s only.
async fn tokens(State(app): State<App>, RawQuery(query): RawQuery, headers: HeaderMap) -> Page {
    let signed = app.admin_session(&headers).await?;
    let tenant = param(query.as_deref(), "tenant");
    tokens_page(&app, &signed, &tenant, None, (StatusCode::OK, None)).await
}

async fn tokens_page(
    app: &Console,
    signed: &Signed,
    tenant: &str,
    issued: Option<(String, String)>,
    (status, notice): (StatusCode, Option<Notice>),
) -> Page {
    let admin = Admin::new(&app.shared, &signed.caller);
    let tenants = admin.list_tenants().await.map_err(service_problem)?;
    // One tenant's tokens, or every token: the admin tokens (no tenant), then each tenant's.
    let mut list = admin.list_tokens(tenant).await.map_err(service_problem)?;
    if tenant.is_empty() {
        for each in &tenants {
            let theirs = admin
                .list_tokens(each.id.as_str())
                .await
                .map_err(service_problem)?;
            list.extend(theirs);
        }
    }
    Ok(views::tokens(
        signed,
        &views::TokensView {
            tenant_filter: tenant.to_owned(),
            tokens: list,
            tenants,
            issued,
        },
        notice,
        status,
    ))
}

/// Issues a token and shows it this once.
async fn issue_token(State(app): State<App>, headers: HeaderMap, body: Body) -> Page {
    let (signed, fields) = app.signed_post(&headers, Role::Admin, body).await?;
    let tenant = field(&fields, "tenant_id").trim();
    let issued = Admin::new(&app.shared, &signed.caller)
        .create_token(
            field(&fields, "role"),
            tenant,
            field(&fields, "agent_id").trim(),
            field(&fields, "label").trim().to_owned(),
        )
        .await;
    match issued {
        Ok(issued) => {
            let outcome = done(format!(
                "Issued {} token {}.",
                issued.record.role.as_str(),
                issued.record.id
            ));
            let shown = Some((issued.record.id, issued.secret));
            tokens_page(&app, &signed, "", shown, outcome).await
        }
        Err(error) => tokens_page(&app, &signed, "", None, refused(error)).await,
    }
}

async fn revoke_token(State(app): State<App>, headers: HeaderMap, body: Body) -> Page {
    let (signed, fields) = app.signed_post(&headers, Role::Admin, body).await?;
    let id = field(&fields, "token_id").trim();
    let outcome = if !checked(&fields, "confirm") {
        bad_input("Tick the box to confirm the revocation; the token still works.")
    } else if id == signed.caller.token_id {
        bad_input("This session's own token cannot be revoked from it; use another admin token.")
    } else {
        match Admin::new(&app.shared, &signed.caller)
            .revoke_token(id)
            .await
        {
            Ok(()) => done(format!(
                "Token {id} revoked: it is refused from now on, and its console sessions are over."
            )),
            Err(error) => refused(error),
        }
    };
    tokens_page(&app, &signed, "", None, outcome).await
}

// --- audit trails ------------------------------------------------------------------------

/// A tenant's audit events (or one run's: `?run=`), in chain order from `?after=`, with the
/// verification of every chain and the rows they bind.
async fn audit(
    State(app): State<App>,
    Path(tenant): Path<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Page {
    let signed = app.admin_session(&headers).await?;
    let admin = Admin::new(&app.shared, &signed.caller);
    let tenant = admin.tenant(&tenant).await.map_err(service_problem)?;
    let bad =
        |message: String| super::pages::problem(StatusCode::BAD_REQUEST, "Bad query", &message);
    let after_text = param(query.as_deref(), "after");
    let after = match after_text.as_str() {
        "" => 0,
        text => text
            .parse::<i64>()
            .ok()
            .filter(|after| *after >= 0)
            .ok_or_else(|| bad(format!("after: `{text}` is not a chain position")))?,
    };
    let run_param = param(query.as_deref(), "run");
    let run_text = run_param.as_str();
    let run = if run_text.is_empty() {
        None
    } else {
        Some(parse_id("run", run_text, RunId::new).map_err(|e| bad(e.to_string()))?)
    };
    let store = app.shared.engine.store();
    let events = match &run {
        Some(run) => {
            store
                .list_run_events(&tenant.id, run, after, EVENTS_PER_PAGE)
                .await
        }
        None => store.list_events(&tenant.id, after, EVENTS_PER_PAGE).await,
    }
    .map_err(service_problem)?;
    let report = store.verify_chains().await.map_err(service_problem)?;
    let next = (events.len() == EVENTS_PER_PAGE as usize)
        .then(|| events.last().map(|event| event.chain_seq))
        .flatten();
    let view = AuditView {
        tenant,
        run: run.map(|run| run.to_string()),
        events,
        report,
        next,
    };
    Ok(views::audit(&signed, &view))
}
