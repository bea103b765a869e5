//! The console's pages, as compile-time templates (maud: every interpolation is escaped).
//! Plain forms throughout: everything works without the script, which only refreshes the
//! queue in place.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use maud::{DOCTYPE, Markup, html};
use toolgate_core::Timestamp;
use toolgate_ledger::{PendingState, Role};

use super::{Filters, InvocationView, QueueRow};
use crate::auth::Caller;

/// Something to say above an invocation.
#[derive(Debug)]
pub(crate) enum Notice {
    /// A decision was taken: what it did.
    Outcome(String),
    /// Somebody else decided first.
    AlreadyDecided(String),
    /// The form was refused.
    Problem(String),
}

pub(crate) fn page(
    status: StatusCode,
    title: &str,
    caller: Option<(&Caller, &str)>,
    body: Markup,
) -> Response {
    let markup = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · toolgate" }
                link rel="stylesheet" href="/console/assets/console.css";
                script src="/console/assets/htmx.js" defer {}
            }
            body {
                header {
                    @match caller.map(|(caller, _)| caller.role) {
                        Some(Role::Admin) => {
                            a.brand href="/console/admin" { "toolgate admin" }
                            nav aria-label="Admin" {
                                a href="/console/admin" { "Tenants" }
                                " "
                                a href="/console/admin/tokens" { "Tokens" }
                            }
                        }
                        _ => { a.brand href="/console/queue" { "toolgate approvals" } }
                    }
                    @if let Some((caller, csrf)) = caller {
                        span.who { "Signed in as " (caller.label) " · " (caller.tenant.as_ref().map_or_else(|| "admin".to_owned(), |t| format!("tenant {t}"))) }
                        form.inline method="post" action="/console/sign-out" {
                            input type="hidden" name="csrf" value=(csrf);
                            button type="submit" { "Sign out" }
                        }
                    }
                }
                main id="main" { (body) }
            }
        }
    };
    html_response(status, markup)
}

pub(crate) fn html_response(status: StatusCode, markup: Markup) -> Response {
    (
        status,
        [(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/html; charset=utf-8"),
        )],
        markup.into_string(),
    )
        .into_response()
}

/// A page that says what went wrong.
pub(crate) fn problem(status: StatusCode, title: &str, message: &str) -> Response {
    page(
        status,
        title,
        None,
        html! {
            h1 { (title) }
            p.problem role="alert" { (message) }
            p { a href="/console/" { "Back to the console" } }
        },
    )
}

pub(crate) fn sign_in(message: Option<&str>, status: StatusCode) -> Response {
    page(
        status,
        "Sign in",
        None,
        html! {
            h1 { "Sign in" }
            @if let Some(message) = message {
                p.notice role="status" id="sign-in-message" { (message) }
            }
            form method="post" action="/console/sign-in" {
                label for="token" { "Approver or admin token" }
                input id="token" name="token" type="password" autocomplete="off" required;
                button type="submit" id="sign-in" { "Sign in" }
            }
            p.hint { "The token is checked once; the session then lasts until you sign out or it expires." }
        },
    )
}

/// "in 4 min 10 s" / "expired".
fn countdown(expires_at: Timestamp, now: Timestamp) -> String {
    let left = (expires_at.0 - now.0) / 1000;
    if left <= 0 {
        return "expired".to_owned();
    }
    let (h, m, s) = (left / 3600, (left / 60) % 60, left % 60);
    if h > 0 {
        format!("in {h} h {m} min")
    } else if m > 0 {
        format!("in {m} min {s} s")
    } else {
        format!("in {s} s")
    }
}

fn age(created_at: Timestamp, now: Timestamp) -> String {
    let secs = ((now.0 - created_at.0) / 1000).max(0);
    if secs >= 3600 {
        format!("{} h {} min", secs / 3600, (secs / 60) % 60)
    } else if secs >= 60 {
        format!("{} min", secs / 60)
    } else {
        format!("{secs} s")
    }
}

fn rows_markup(rows: &Result<Vec<QueueRow>, String>, now: Timestamp) -> Markup {
    html! {
        @match rows {
            Err(problem) => { p.problem role="alert" id="queue-problem" { (problem) } }
            Ok(rows) if rows.is_empty() => { p #queue-empty { "Nothing is waiting for a decision." } }
            Ok(rows) => {
                table #queue-table {
                    caption { (rows.len()) " waiting, oldest first" }
                    thead { tr { th scope="col" { "Tool" } th scope="col" { "Risk" } th scope="col" { "Why" } th scope="col" { "Waiting" } th scope="col" { "Expires" } } }
                    tbody {
                        @for row in rows {
                            tr.pending data-invocation=(row.id) {
                                td { a href=(format!("/console/invocations/{}", row.id)) { (row.tool) } }
                                td { (row.risk) }
                                td { (row.origin) }
                                td { (age(row.created_at, now)) }
                                td { time datetime=(row.expires_at.0) { (countdown(row.expires_at, now)) } }
                            }
                        }
                    }
                }
            }
        }
    }
}

pub(crate) fn queue(
    caller: &Caller,
    csrf: &str,
    filters: &Filters,
    rows: Result<Vec<QueueRow>, String>,
    now: Timestamp,
) -> Response {
    let origins = ["APPROVAL_REQUIRED", "POLICY_DENIED", "EXECUTION_FAILED"];
    let risks = ["low", "medium", "high", "critical"];
    page(
        StatusCode::OK,
        "Queue",
        Some((caller, csrf)),
        html! {
            h1 { "Waiting for a decision" }
            form.filters method="get" action="/console/queue" {
                label { "Tool " input name="tool" value=(filters.tool) placeholder="e.g. slack.post_message"; }
                label { "Risk "
                    select name="risk" {
                        option value="" { "any" }
                        @for risk in risks { option value=(risk) selected[filters.risk == risk] { (risk) } }
                    }
                }
                label { "Why "
                    select name="origin" {
                        option value="" { "any" }
                        @for origin in origins { option value=(origin) selected[filters.origin == origin] { (origin) } }
                    }
                }
                label { "Waiting at least (min) " input name="min_age" inputmode="numeric" value=(filters.min_age_minutes) size="4"; }
                button type="submit" { "Filter" }
            }
            // Refreshed in place every two seconds by the script; without it, reload the page.
            div #queue hx-get=(format!("/console/queue/rows?{}", filters.query())) hx-trigger="every 2s" hx-swap="innerHTML" aria-live="polite" {
                (rows_markup(&rows, now))
            }
            noscript { p.hint { "Without JavaScript the queue does not refresh by itself: reload the page." } }
        },
    )
}

pub(crate) fn rows(rows: Result<Vec<QueueRow>, String>, now: Timestamp) -> Response {
    html_response(StatusCode::OK, rows_markup(&rows, now))
}

pub(crate) fn rows_signed_out() -> Response {
    html_response(
        StatusCode::OK,
        html! { p.problem role="alert" { "Your session ended. " a href="/console/sign-in" { "Sign in again" } } },
    )
}

fn details(view: &InvocationView, now: Timestamp) -> Markup {
    let row = &view.row;
    html! {
        dl.details {
            dt { "Tool" } dd #tool { code { (row.tool) } }
            @if !view.description.is_empty() { dt { "What it does" } dd { (view.description) } }
            dt { "Why it waits" } dd #origin { (row.origin.as_str()) }
            dt { "Risk" } dd #risk { @if view.risk.is_empty() { "-" } @else { (view.risk) } }
            dt { "Policies" } dd #policies { @if view.policy_ids.is_empty() { "none" } @else { (view.policy_ids.join(", ")) } " · policy version " (row.policy_version) }
            dt { "State" } dd #state { (row.state.as_str()) " (call " (view.call_status) ")" }
            @if let Some(error) = &view.error { dt { "Failure" } dd #failure { (error) } }
            dt { "Run" } dd { code { (row.run) } }
            dt { "Expires" } dd #expires { (countdown(row.expires_at, now)) }
        }
        h2 { "Arguments (redacted)" }
        pre #arguments { code { (view.arguments) } }
        @if let Some(output) = &view.output {
            h2 { "Result (redacted)" }
            pre #output { code { (output) } }
        }
    }
}

pub(crate) fn notice_markup(notice: Option<&Notice>) -> Markup {
    html! {
        @match notice {
            Some(Notice::Outcome(text)) => { p.notice #outcome role="status" { (text) } }
            Some(Notice::AlreadyDecided(by)) => { p.problem #already-decided role="alert" { "Already decided by " (by) ". Nothing was done." } }
            Some(Notice::Problem(text)) => { p.problem #form-problem role="alert" { (text) } }
            None => {}
        }
    }
}

pub(crate) fn invocation(
    caller: &Caller,
    csrf: &str,
    view: &InvocationView,
    notice: Option<Notice>,
    now: Timestamp,
) -> Response {
    let row = &view.row;
    let action = format!("/console/invocations/{}", row.id);
    page(
        StatusCode::OK,
        &format!("Invocation {}", row.id),
        Some((caller, csrf)),
        html! {
            p { a href="/console/queue" { "← Queue" } }
            h1 { "Call of " code { (row.tool) } }
            (notice_markup(notice.as_ref()))
            (details(view, now))
            @if !view.earlier.is_empty() {
                h2 { "Earlier calls of this run" }
                ol #earlier { @for (id, tool, status) in &view.earlier { li { code { (tool) } " — " (status) " " small { (id) } } } }
            }
            @if row.state == PendingState::Pending {
                @if let Some(by) = &view.decided_by { p { "Last touched by " (by) } }
                h2 { "Decide" }
                form.decide method="post" action=(action) {
                    input type="hidden" name="csrf" value=(csrf);
                    input type="hidden" name="version" value=(row.version);
                    label for="reason" { "Reason (required to reject; goes back to the agent)" }
                    textarea id="reason" name="reason" rows="3" maxlength="2000" {}
                    div.buttons {
                        button type="submit" name="decision" value="approve" id="approve" { "Approve" }
                        button type="submit" name="decision" value="reject" id="reject" { "Reject" }
                        button type="submit" name="decision" value="continue" id="continue" { "Continue without it" }
                    }
                }
            } @else {
                p #decided { "Decided by " (view.decided_by.as_deref().unwrap_or("the gateway")) @if let Some(reason) = &view.reason { @if !reason.is_empty() { ": " q { (reason) } } } }
            }
        },
    )
}

/// The page a client approval link opens: this one call, Approve and Reject, nothing else.
pub(crate) fn client_link(
    view: &InvocationView,
    notice: Option<Notice>,
    usable: Option<&str>,
    now: Timestamp,
) -> Response {
    let row = &view.row;
    page(
        StatusCode::OK,
        "Approve this action",
        None,
        html! {
            h1 { "Your approval is asked for" }
            (notice_markup(notice.as_ref()))
            (details(view, now))
            @match usable {
                None => {
                    form.decide method="post" {
                        label for="reason" { "Reason (required to reject)" }
                        textarea id="reason" name="reason" rows="3" maxlength="2000" {}
                        div.buttons {
                            button type="submit" name="decision" value="approve" id="approve" { "Approve" }
                            button type="submit" name="decision" value="reject" id="reject" { "Reject" }
                        }
                    }
                }
                Some(why) => { p #link-state { (why) } }
            }
            @if row.state != PendingState::Pending { p { "This call is " (row.state.as_str()) "." } }
        },
    )
}

pub(crate) fn link_problem(status: StatusCode, message: &str) -> Response {
    page(
        status,
        "Link not usable",
        None,
        html! { h1 { "This link cannot be used" } p.problem #link-state role="alert" { (message) } },
    )
}
