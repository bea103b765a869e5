//! The admin pages' templates (maud: every interpolation is escaped). Plain forms, each with
//! the session's CSRF token; no page shows a credential's value or a token after the answer
//! that issued it.

use axum::http::StatusCode;
use axum::response::Response;
use maud::{Markup, html};
use toolgate_core::Timestamp;
use toolgate_ledger::{
    Agent, AuditEvent, CredentialKind, CredentialRecord, Permission, Tenant, TokenRecord,
    VerifyReport,
};

use super::Signed;
use super::pages::{Notice, notice_markup, page};
use crate::admin::PolicySetView;

/// What the tenant page shows.
#[derive(Debug)]
pub(crate) struct TenantView {
    pub(crate) tenant: Tenant,
    /// `tool_calling_enabled` (never set: off).
    pub(crate) calling_enabled: bool,
    pub(crate) agents: Vec<Agent>,
    /// Tenant-wide grants, then each agent's own.
    pub(crate) grants: Vec<Permission>,
    /// The tools this gateway serves.
    pub(crate) tools: Vec<String>,
}

/// What the policy page shows.
#[derive(Debug)]
pub(crate) struct PolicyView {
    pub(crate) tenant: Tenant,
    pub(crate) current: PolicySetView,
    /// The text the form sent, when it is not the current one.
    pub(crate) draft: Option<String>,
    /// What is wrong with the draft.
    pub(crate) errors: Vec<String>,
}

/// What the tokens page shows.
#[derive(Debug)]
pub(crate) struct TokensView {
    pub(crate) tenant_filter: String,
    pub(crate) tokens: Vec<TokenRecord>,
    pub(crate) tenants: Vec<Tenant>,
    /// A token just issued: its id and secret, shown this once.
    pub(crate) issued: Option<(String, String)>,
}

/// What the audit page shows.
#[derive(Debug)]
pub(crate) struct AuditView {
    pub(crate) tenant: Tenant,
    pub(crate) run: Option<String>,
    pub(crate) events: Vec<AuditEvent>,
    pub(crate) report: VerifyReport,
    /// The chain position to page on from, when there may be more.
    pub(crate) next: Option<i64>,
}

fn when(at: Timestamp) -> String {
    chrono::DateTime::from_timestamp_millis(at.0).map_or_else(
        || at.0.to_string(),
        |time| time.format("%Y-%m-%d %H:%M:%S UTC").to_string(),
    )
}

fn csrf_field(signed: &Signed) -> Markup {
    html! { input type="hidden" name="csrf" value=(signed.csrf); }
}

fn admin_page(
    signed: &Signed,
    status: StatusCode,
    title: &str,
    notice: Option<Notice>,
    body: Markup,
) -> Response {
    let mut response = page(
        status,
        title,
        Some((&signed.caller, &signed.csrf)),
        html! { (notice_markup(notice.as_ref())) (body) },
    );
    *response.status_mut() = status;
    response
}

/// The links between one tenant's pages.
fn tenant_nav(tenant: &Tenant) -> Markup {
    let base = format!("/console/admin/tenants/{}", tenant.id);
    html! {
        nav.tenant aria-label="Tenant" {
            a href=(base) { "Overview" } " · "
            a href=(format!("{base}/policy")) { "Policy" } " · "
            a href=(format!("{base}/credentials")) { "Credentials" } " · "
            a href=(format!("/console/admin/tokens?tenant={}", tenant.id)) { "Tokens" } " · "
            a href=(format!("{base}/audit")) { "Audit trail" }
        }
    }
}

pub(crate) fn tenants(
    signed: &Signed,
    tenants: &[Tenant],
    notice: Option<Notice>,
    status: StatusCode,
) -> Response {
    admin_page(
        signed,
        status,
        "Tenants",
        notice,
        html! {
            h1 { "Tenants" }
            @if tenants.is_empty() {
                p #no-tenants { "No tenant yet." }
            } @else {
                table #tenants {
                    thead { tr { th scope="col" { "Id" } th scope="col" { "Name" } th scope="col" { "Created" } } }
                    tbody {
                        @for tenant in tenants {
                            tr {
                                td { a href=(format!("/console/admin/tenants/{}", tenant.id)) { code { (tenant.id) } } }
                                td { (tenant.name) }
                                td { (when(tenant.created_at)) }
                            }
                        }
                    }
                }
            }
            h2 { "New tenant" }
            form #create-tenant method="post" action="/console/admin/tenants" {
                (csrf_field(signed))
                label for="tenant_id" { "Id (letters, digits, - and _)" }
                input #tenant_id name="tenant_id" required autocomplete="off";
                label for="tenant_name" { "Name" }
                input #tenant_name name="name" autocomplete="off";
                div.buttons { button type="submit" #create { "Create tenant" } }
            }
        },
    )
}

pub(crate) fn tenant(
    signed: &Signed,
    view: &TenantView,
    notice: Option<Notice>,
    status: StatusCode,
) -> Response {
    let tenant = &view.tenant;
    let base = format!("/console/admin/tenants/{}", tenant.id);
    admin_page(
        signed,
        status,
        &format!("Tenant {}", tenant.id),
        notice,
        html! {
            p { a href="/console/admin" { "← Tenants" } }
            h1 { "Tenant " code { (tenant.id) } }
            (tenant_nav(tenant))
            h2 { "Kill switch" }
            @if view.calling_enabled {
                p #calling-state { "Tool calling is " strong { "on" } "." }
                p { a.danger #turn-off href=(format!("{base}/kill-switch?to=off")) { "Turn tool calling off…" } }
            } @else {
                p #calling-state { "Tool calling is " strong { "off" } ": every call is refused with FEATURE_DISABLED." }
                p { a #turn-on href=(format!("{base}/kill-switch?to=on")) { "Turn tool calling on…" } }
            }
            h2 { "Agents" }
            @if view.agents.is_empty() {
                p #no-agents { "No agent yet." }
            } @else {
                ul #agents { @for agent in &view.agents { li { code { (agent.id) } @if !agent.name.is_empty() { " — " (agent.name) } } } }
            }
            form #create-agent method="post" action=(format!("{base}/agents")) {
                (csrf_field(signed))
                label for="agent_id" { "New agent's id" }
                input #agent_id name="agent_id" required autocomplete="off";
                label for="agent_name" { "Name" }
                input #agent_name name="name" autocomplete="off";
                div.buttons { button type="submit" { "Create agent" } }
            }
            h2 { "Tool grants" }
            @if view.grants.is_empty() {
                p #no-grants { "No tool is granted: the tenant's runs can call nothing." }
            } @else {
                table #grants {
                    thead { tr { th scope="col" { "Tool" } th scope="col" { "To" } th scope="col" { "State" } th scope="col" { "Changed" } } }
                    tbody {
                        @for grant in &view.grants {
                            tr {
                                td { code { (grant.tool) } }
                                td { @match &grant.agent { Some(agent) => { "agent " code { (agent) } } None => { "every agent" } } }
                                td { @if grant.enabled { "granted" } @else { "withdrawn" } }
                                td { (when(grant.updated_at)) }
                            }
                        }
                    }
                }
            }
            form #set-grant method="post" action=(format!("{base}/grants")) {
                (csrf_field(signed))
                label for="grant_tool" { "Tool" }
                select #grant_tool name="tool" required {
                    @for tool in &view.tools { option value=(tool) { (tool) } }
                }
                label for="grant_agent" { "Agent (empty: every agent of the tenant)" }
                select #grant_agent name="agent_id" {
                    option value="" { "every agent" }
                    @for agent in &view.agents { option value=(agent.id) { (agent.id) } }
                }
                div.buttons {
                    button type="submit" name="enabled" value="true" #grant { "Grant" }
                    button.secondary type="submit" name="enabled" value="false" #withdraw { "Withdraw" }
                }
            }
        },
    )
}

pub(crate) fn kill_switch(
    signed: &Signed,
    tenant: &Tenant,
    currently_on: bool,
    turn_on: bool,
    notice: Option<Notice>,
    status: StatusCode,
) -> Response {
    let base = format!("/console/admin/tenants/{}", tenant.id);
    let (title, consequence) = if turn_on {
        (
            "Turn tool calling on",
            "The tenant's agents can call the tools granted to them, as policy allows.",
        )
    } else {
        (
            "Turn tool calling off",
            "Every tool call of this tenant is refused (FEATURE_DISABLED) from now on, on every replica; approved calls waiting to run are not executed either. Calls already running finish.",
        )
    };
    admin_page(
        signed,
        status,
        title,
        notice,
        html! {
            p { a href=(base) { "← Tenant " (tenant.id) } }
            h1 { (title) " for " code { (tenant.id) } "?" }
            p #calling-state { "Tool calling is " strong { @if currently_on { "on" } @else { "off" } } " now." }
            p.warning { (consequence) }
            form #kill-switch method="post" action=(format!("{base}/kill-switch")) {
                (csrf_field(signed))
                input type="hidden" name="enabled" value=(if turn_on { "true" } else { "false" });
                label for="confirm" { "Type the tenant's id (" code { (tenant.id) } ") to confirm" }
                input #confirm name="confirm" required autocomplete="off";
                div.buttons {
                    button.danger[!turn_on] type="submit" #confirm-switch { (title) }
                    a href=(base) { "Cancel" }
                }
            }
        },
    )
}

/// The line an error message names, if any: the first `at line L, column C` in it (the
/// policy's id comes before it and may hold any text, so nothing looser is taken).
fn error_line(message: &str) -> Option<usize> {
    message.match_indices("at line ").find_map(|(at, marker)| {
        let rest = &message[at + marker.len()..];
        let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
        let after = &rest[digits.len()..];
        let column = after.strip_prefix(", column ")?;
        column
            .starts_with(|c: char| c.is_ascii_digit())
            .then(|| digits.parse().ok())
            .flatten()
    })
}

/// The text with numbered lines, each error under the line it names.
fn listing(text: &str, errors: &[String]) -> Markup {
    let unplaced: Vec<&String> = errors
        .iter()
        .filter(|error| error_line(error).is_none_or(|line| line > text.lines().count().max(1)))
        .collect();
    html! {
        @if !unplaced.is_empty() {
            ul.problems #policy-errors { @for error in &unplaced { li { (error) } } }
        }
        table.listing #policy-listing {
            tbody {
                @for (index, line) in text.lines().enumerate() {
                    @let number = index + 1;
                    @let here: Vec<&String> = errors.iter().filter(|error| error_line(error) == Some(number)).collect();
                    tr id=(format!("line-{number}")) class=[(!here.is_empty()).then_some("error-line")] {
                        td.number { (number) }
                        td { code { (line) } }
                    }
                    @for error in here {
                        tr.error-note { td.number { "↑" } td role="alert" { (error) } }
                    }
                }
            }
        }
    }
}

pub(crate) fn policy(
    signed: &Signed,
    view: &PolicyView,
    notice: Option<Notice>,
    status: StatusCode,
) -> Response {
    let tenant = &view.tenant;
    let current = &view.current;
    let text = view.draft.as_deref().unwrap_or(&current.text);
    admin_page(
        signed,
        status,
        &format!("Policy of {}", tenant.id),
        notice,
        html! {
            p { a href="/console/admin" { "← Tenants" } }
            h1 { "Policy of " code { (tenant.id) } }
            (tenant_nav(tenant))
            p #policy-version {
                @if current.version == 0 { "No policy stored: the built-in default applies (version 0)." }
                @else { "Version " (current.version) ", stored " (when(current.created_at)) "." }
            }
            @if !view.errors.is_empty() {
                h2 { "Problems, at their lines" }
                (listing(text, &view.errors))
            }
            form #policy-form method="post" action=(format!("/console/admin/tenants/{}/policy", tenant.id)) {
                (csrf_field(signed))
                label for="policy-text" { "Cedar policy set" }
                // The parser drops a newline right after the tag: this one, not the text's own.
                textarea #policy-text name="text" rows="18" spellcheck="false" { "\n" (text) }
                div.buttons {
                    button.secondary type="submit" name="action" value="validate" #validate { "Validate" }
                    button type="submit" name="action" value="save" #save { "Validate and store" }
                }
            }
        },
    )
}

pub(crate) fn credentials(
    signed: &Signed,
    tenant: &Tenant,
    records: &[CredentialRecord],
    notice: Option<Notice>,
    status: StatusCode,
) -> Response {
    let action = format!("/console/admin/tenants/{}/credentials", tenant.id);
    let describe = |kind: &str| {
        html! {
            label for=(format!("{kind}-metadata")) { "Metadata (a JSON object, optional; redacted before it is stored)" }
            textarea id=(format!("{kind}-metadata")) name="metadata_json" rows="2" {}
            label for=(format!("{kind}-notes")) { "Notes" }
            input id=(format!("{kind}-notes")) name="notes" autocomplete="off";
        }
    };
    admin_page(
        signed,
        status,
        &format!("Credentials of {}", tenant.id),
        notice,
        html! {
            p { a href="/console/admin" { "← Tenants" } }
            h1 { "Credentials of " code { (tenant.id) } }
            (tenant_nav(tenant))
            p.hint { "Values are sealed with AES-256-GCM under the active master key as they arrive; no page shows them again." }
            @if records.is_empty() {
                p #no-credentials { "No credential stored." }
            } @else {
                table #credentials {
                    thead { tr { th scope="col" { "Name" } th scope="col" { "Kind" } th scope="col" { "Key / reference" } th scope="col" { "Notes" } th scope="col" { "Updated" } th scope="col" { "Delete" } } }
                    tbody {
                        @for record in records {
                            tr data-credential=(record.name) {
                                td { code { (record.name) } }
                                td { (record.kind.as_str()) }
                                td {
                                    @match record.kind {
                                        CredentialKind::Sealed => { "key " code { (record.key_id.as_deref().unwrap_or("-")) } }
                                        CredentialKind::Reference => { code { (record.value) } }
                                    }
                                }
                                td { (record.notes) }
                                td { (when(record.updated_at)) " by " (record.created_by) }
                                td {
                                    form.inline method="post" action=(format!("{action}/delete")) {
                                        (csrf_field(signed))
                                        input type="hidden" name="name" value=(record.name);
                                        label.inline { input type="checkbox" name="confirm" required; " sure" }
                                        button.danger type="submit" { "Delete" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Put a sealed value" }
            form #put-sealed method="post" action=(action) {
                (csrf_field(signed))
                input type="hidden" name="kind" value="sealed";
                label for="sealed-name" { "Name (e.g. slack_default)" }
                input #sealed-name name="name" required autocomplete="off";
                label for="sealed-value" { "Value" }
                input #sealed-value name="value" type="password" required autocomplete="new-password";
                (describe("sealed"))
                div.buttons { button type="submit" #put-sealed-button { "Seal and store" } }
            }
            h2 { "Put a reference" }
            form #put-reference method="post" action=(action) {
                (csrf_field(signed))
                input type="hidden" name="kind" value="reference";
                label for="reference-name" { "Name" }
                input #reference-name name="name" required autocomplete="off";
                label for="reference-value" { "Reference (env:NAME or file:/path)" }
                input #reference-value name="reference" required autocomplete="off";
                (describe("reference"))
                div.buttons { button type="submit" { "Store reference" } }
            }
        },
    )
}

pub(crate) fn tokens(
    signed: &Signed,
    view: &TokensView,
    notice: Option<Notice>,
    status: StatusCode,
) -> Response {
    admin_page(
        signed,
        status,
        "Tokens",
        notice,
        html! {
            h1 { "Tokens" }
            @if let Some((id, secret)) = &view.issued {
                section.issued #issued aria-live="polite" {
                    h2 { "New token " code { (id) } }
                    p { "Copy it now: it is shown this once, and the gateway keeps only its hash." }
                    pre { code #new-token { (secret) } }
                }
            }
            form.filters method="get" action="/console/admin/tokens" {
                label { "Tenant "
                    select name="tenant" {
                        option value="" { "all" }
                        @for tenant in &view.tenants { option value=(tenant.id) selected[view.tenant_filter == tenant.id.as_str()] { (tenant.id) } }
                    }
                }
                button.secondary type="submit" { "Show" }
            }
            table #tokens {
                thead { tr { th scope="col" { "Id" } th scope="col" { "Role" } th scope="col" { "Tenant" } th scope="col" { "Agent" } th scope="col" { "Label" } th scope="col" { "Issued" } th scope="col" { "State" } } }
                tbody {
                    @for token in &view.tokens {
                        tr data-token=(token.id) {
                            td { code { (token.id) } }
                            td { (token.role.as_str()) }
                            td { (token.tenant.as_ref().map(ToString::to_string).unwrap_or_default()) }
                            td { (token.agent.as_ref().map(ToString::to_string).unwrap_or_default()) }
                            td { (token.label) }
                            td { (when(token.created_at)) }
                            td {
                                @if token.revoked { "revoked" }
                                @else if token.id == signed.caller.token_id { "this session's" }
                                @else {
                                    form.inline method="post" action="/console/admin/tokens/revoke" {
                                        (csrf_field(signed))
                                        input type="hidden" name="token_id" value=(token.id);
                                        label.inline { input type="checkbox" name="confirm" required; " sure" }
                                        button.danger type="submit" { "Revoke" }
                                    }
                                }
                            }
                        }
                    }
                }
            }
            h2 { "Issue a token" }
            form #issue-token method="post" action="/console/admin/tokens" {
                (csrf_field(signed))
                label for="token-role" { "Role" }
                select #token-role name="role" {
                    option value="agent" { "agent (calls tools)" }
                    option value="approver" { "approver (decides pending calls)" }
                    option value="admin" { "admin (manages the gateway; no tenant)" }
                }
                label for="token-tenant" { "Tenant" }
                select #token-tenant name="tenant_id" {
                    option value="" { "none (admin tokens)" }
                    @for tenant in &view.tenants { option value=(tenant.id) selected[view.tenant_filter == tenant.id.as_str()] { (tenant.id) } }
                }
                label for="token-agent" { "Agent (optional, agent tokens only)" }
                input #token-agent name="agent_id" autocomplete="off";
                label for="token-label" { "Label (who or what holds it)" }
                input #token-label name="label" autocomplete="off";
                div.buttons { button type="submit" #issue { "Issue token" } }
            }
        },
    )
}

fn verification(report: &VerifyReport) -> Markup {
    html! {
        @match &report.first_problem {
            None => {
                p.notice #chain-status role="status" {
                    "Verified: " (report.events_checked) " events in " (report.chains_checked) " chains, "
                    (report.authenticated_events) " authenticated with the master keys, "
                    (report.rows_checked) " bound rows compared."
                    @if !report.keys_loaded { " The MACs were not checked: no keys are loaded." }
                    @if !report.missing_keys.is_empty() { " Events of retired keys (" (report.missing_keys.join(", ")) ") were checked for their links only." }
                    @if report.unprotected_legacy_events > 0 { " " (report.unprotected_legacy_events) " legacy events are not covered by a keyed event." }
                }
            }
            Some(problem) => {
                p.problem #chain-status role="alert" {
                    "Verification FAILED: chain " code { (problem.chain.as_str()) } " at position " (problem.chain_seq) ": "
                    (problem.kind.as_str()) " — " (problem.detail)
                }
            }
        }
    }
}

pub(crate) fn audit(signed: &Signed, view: &AuditView) -> Response {
    let tenant = &view.tenant;
    let action = format!("/console/admin/tenants/{}/audit", tenant.id);
    let run = view.run.as_deref().unwrap_or_default();
    admin_page(
        signed,
        StatusCode::OK,
        &format!("Audit trail of {}", tenant.id),
        None,
        html! {
            p { a href="/console/admin" { "← Tenants" } }
            h1 { "Audit trail of " code { (tenant.id) } @if !run.is_empty() { ", run " code { (run) } } }
            (tenant_nav(tenant))
            (verification(&view.report))
            form.filters method="get" action=(action) {
                label { "Run " input name="run" value=(run) placeholder="all runs"; }
                button.secondary type="submit" { "Show" }
            }
            @if view.events.is_empty() {
                p #no-events { "No events." }
            } @else {
                table #events {
                    caption { "In chain order (redacted payloads)" }
                    thead { tr { th scope="col" { "#" } th scope="col" { "When" } th scope="col" { "Event" } th scope="col" { "Run / call" } th scope="col" { "Details" } } }
                    tbody {
                        @for event in &view.events {
                            tr data-kind=(event.kind) {
                                td { (event.chain_seq) }
                                td { (when(event.at)) }
                                td { code { (event.kind) } }
                                td {
                                    @if let Some(run) = &event.run { a href=(format!("{action}?run={run}")) { (run) } }
                                    @if let Some(call) = &event.tool_call_id { br; small { (call) } }
                                }
                                td { code.payload { (event.payload) } }
                            }
                        }
                    }
                }
            }
            @if let Some(next) = view.next {
                p { a #next-page href=(format!("{action}?run={run}&after={next}")) { "Later events →" } }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::error_line;

    #[test]
    fn errors_are_placed_at_the_line_their_location_names() {
        let check = |message: &str, expected: Option<usize>| {
            assert_eq!(error_line(message), expected, "{message}");
        };
        check("policy `p` at line 3, column 8: unexpected token", Some(3));
        check(
            "the policies do not validate: policy `typo` at line 12, column 41: unrecognized action",
            Some(12),
        );
        // The id is the author's text: a `line` in it is not the location.
        check("policy `pipeline 7` at line 2, column 1: x", Some(2));
        check("policy `at line 9` at line 4, column 1: x", Some(4));
        check(
            "policy `at line 9, column 1` at line 4, column 1: x",
            Some(9),
        );
        check("the policy set is empty", None);
        check("at line , column 3", None);
        check("at line 5 without a column", None);
    }
}
