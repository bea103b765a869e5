//! Client approval links: for a call policy suspended with `require_client_approval`, the
//! gateway mints a link the agent runtime shows to its end user. The link's secret is random
//! (only its SHA-256 is stored), it expires with the invocation at the latest, decides that one
//! invocation and nothing else, once: the conditional update that marks it used and the
//! engine's claim on the row both have to succeed. Minting and use are audited on the
//! tenant's chain.

use std::collections::HashMap;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use serde_json::json;
use toolgate_core::{Decision, TenantId, Timestamp};
use toolgate_engine::{ResumeDecision, ResumeOutcome, ResumeRequest};
use toolgate_ledger::{ClientLink, NewAuditEvent, PendingState};

use super::{App, describe, form, load_view, pages, parse_decision, service_problem};
use crate::auth::hash_token;
use crate::services::Shared;
use crate::status::ServiceError;

/// Mints client approval links for the agent service.
#[derive(Debug)]
pub(crate) struct LinkMinter {
    /// Where links point: `{base}/console/link/{secret}`; empty (a path on the gateway) without
    /// `console.public_url`.
    base: String,
    /// How long a link lives at most (never past its invocation's expiry).
    ttl_ms: i64,
}

impl LinkMinter {
    pub(crate) fn new(base: Option<&str>, ttl: std::time::Duration) -> LinkMinter {
        LinkMinter {
            base: base.unwrap_or_default().trim_end_matches('/').to_owned(),
            ttl_ms: i64::try_from(ttl.as_millis()).unwrap_or(i64::MAX),
        }
    }

    /// A new link for the pending invocation `invocation` of `tenant`, if policy asked the
    /// client to decide it; `None` otherwise.
    pub(crate) async fn mint(
        &self,
        shared: &Shared,
        tenant: &TenantId,
        decision: Option<Decision>,
        invocation: Option<&str>,
    ) -> Result<Option<String>, ServiceError> {
        let (Some(Decision::RequireClientApproval), Some(invocation)) = (decision, invocation)
        else {
            return Ok(None);
        };
        let store = shared.engine.store();
        let Some(row) = store.get_pending(tenant, invocation).await? else {
            return Ok(None);
        };
        if row.state != PendingState::Pending {
            return Ok(None);
        }
        let now = shared.clock.now();
        let secret = super::secret();
        let link = ClientLink {
            hash: hash_token(&secret),
            id: format!("cl_{}", uuid::Uuid::now_v7().simple()),
            tenant: tenant.clone(),
            invocation_id: row.id.clone(),
            created_at: now,
            expires_at: Timestamp(now.plus_ms(self.ttl_ms).0.min(row.expires_at.0)),
            used_at: None,
            used_decision: None,
        };
        let event = NewAuditEvent {
            tenant: tenant.clone(),
            kind: "console.client_link_issued".to_owned(),
            run: Some(row.run.clone()),
            tool_call_id: Some(row.tool_call_id.clone()),
            payload: json!({
                "link_id": link.id,
                "invocation_id": row.id,
                "expires_at": link.expires_at.0,
            }),
            at: now,
        };
        store.create_client_link(link, vec![event]).await?;
        Ok(Some(format!("{}/console/link/{secret}", self.base)))
    }
}

/// The link's record if it is well formed and known.
async fn find(app: &App, secret: &str) -> Result<Option<ClientLink>, ServiceError> {
    if secret.len() != 43
        || !secret
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return Ok(None);
    }
    Ok(app
        .shared
        .engine
        .store()
        .get_client_link(&hash_token(secret))
        .await?)
}

const UNKNOWN: &str = "This approval link is not valid: it is mistyped, or was never issued.";

/// Why a known link cannot decide now, if it cannot.
fn unusable(link: &ClientLink, now: Timestamp) -> Option<String> {
    if let Some(used_at) = link.used_at {
        let _ = used_at;
        return Some(format!(
            "This link was already used (to {}); it cannot be used again.",
            link.used_decision.as_deref().unwrap_or("decide")
        ));
    }
    if link.expires_at <= now {
        return Some("This link has expired.".to_owned());
    }
    None
}

pub(crate) async fn show(State(app): State<App>, Path(secret): Path<String>) -> Response {
    let link = match find(&app, &secret).await {
        Ok(Some(link)) => link,
        Ok(None) => return pages::link_problem(StatusCode::NOT_FOUND, UNKNOWN),
        Err(error) => return service_problem(error),
    };
    let now = app.now();
    match load_view(&app.shared, &link.tenant, &link.invocation_id, false).await {
        Ok(Some(view)) => {
            let why = unusable(&link, now).or_else(|| {
                (view.row.state != PendingState::Pending)
                    .then(|| "This call was already decided.".to_owned())
            });
            pages::client_link(&view, None, why.as_deref(), now)
        }
        Ok(None) => pages::link_problem(StatusCode::NOT_FOUND, UNKNOWN),
        Err(error) => service_problem(error),
    }
}

/// Makes `link`, used at `used_at` for the invocation `row`, usable again (audited
/// `console.client_link_released`); whether it did. The ledger gives it back only while the
/// invocation is still pending, in the same statement, so a decision made meanwhile keeps it
/// spent.
async fn release(
    app: &App,
    link: &ClientLink,
    row: &toolgate_ledger::PendingInvocation,
    used_at: Timestamp,
) -> bool {
    let event = NewAuditEvent {
        tenant: link.tenant.clone(),
        kind: "console.client_link_released".to_owned(),
        run: Some(row.run.clone()),
        tool_call_id: Some(row.tool_call_id.clone()),
        payload: json!({ "link_id": link.id, "invocation_id": link.invocation_id }),
        at: app.now(),
    };
    let store = app.shared.engine.store();
    match store
        .release_client_link(&link.hash, used_at, vec![event])
        .await
    {
        Ok(released) => released,
        Err(error) => {
            tracing::warn!(link_id = %link.id, %error, "releasing a client link that decided nothing failed");
            false
        }
    }
}

pub(crate) async fn decide(
    State(app): State<App>,
    Path(secret): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    // The secret in the path is what a forger would need; the origin check still applies.
    if let Err(why) = app.same_origin(&headers) {
        return pages::problem(StatusCode::FORBIDDEN, "Refused: cross-origin form", why);
    }
    let fields: HashMap<String, String> = match form(body) {
        Ok(fields) => fields,
        Err(page) => return page,
    };
    let link = match find(&app, &secret).await {
        Ok(Some(link)) => link,
        Ok(None) => return pages::link_problem(StatusCode::NOT_FOUND, UNKNOWN),
        Err(error) => return service_problem(error),
    };
    let now = app.now();
    let view = match load_view(&app.shared, &link.tenant, &link.invocation_id, false).await {
        Ok(Some(view)) => view,
        Ok(None) => return pages::link_problem(StatusCode::NOT_FOUND, UNKNOWN),
        Err(error) => return service_problem(error),
    };
    if let Some(why) = unusable(&link, now) {
        return pages::client_link(&view, None, Some(&why), now);
    }
    let (decision, reason) = match parse_decision(&fields, false) {
        Ok(decision) => decision,
        Err(why) => {
            return pages::client_link(
                &view,
                Some(pages::Notice::Problem(why.to_owned())),
                None,
                now,
            );
        }
    };
    let word = match decision {
        ResumeDecision::Approve => "approve",
        _ => "reject",
    };
    let event = NewAuditEvent {
        tenant: link.tenant.clone(),
        kind: "console.client_link_used".to_owned(),
        run: Some(view.row.run.clone()),
        tool_call_id: Some(view.row.tool_call_id.clone()),
        payload: json!({ "link_id": link.id, "invocation_id": link.invocation_id, "decision": word }),
        at: now,
    };
    // The link is spent first: a second use (another tab, a replay) finds it used.
    match app
        .shared
        .engine
        .store()
        .use_client_link(&link.hash, now, word, vec![event])
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            return pages::client_link(
                &view,
                None,
                Some("This link was already used or has expired; it cannot be used again."),
                now,
            );
        }
        Err(error) => return service_problem(error),
    }
    let outcome = app
        .shared
        .engine
        .resume(ResumeRequest {
            tenant: link.tenant.clone(),
            approver: format!("client link {}", link.id),
            run: view.row.run.to_string(),
            invocation: link.invocation_id.clone(),
            decision,
            reason,
        })
        .await;
    // A use that decided nothing (the kill switch is off, or the gateway failed before the
    // invocation was resolved) must not spend the end user's only link.
    let released = match &outcome {
        Ok(ResumeOutcome::FeatureDisabled { .. }) | Err(_) => {
            release(&app, &link, &view.row, now).await
        }
        Ok(_) => false,
    };
    let notice = match outcome {
        Ok(ResumeOutcome::ClaimLost) => pages::Notice::AlreadyDecided(
            match load_view(&app.shared, &link.tenant, &link.invocation_id, false).await {
                Ok(Some(view)) => view.decided_by.unwrap_or_else(|| "the gateway".to_owned()),
                _ => "someone else".to_owned(),
            },
        ),
        Ok(outcome) => pages::Notice::Outcome(describe(&outcome)),
        Err(error) if released => pages::Notice::Problem(format!(
            "{} Nothing was decided: this link can be used again.",
            crate::status::status(error).message()
        )),
        Err(error) => return service_problem(error),
    };
    let state = (!released).then_some("This link has been used.");
    match load_view(&app.shared, &link.tenant, &link.invocation_id, false).await {
        Ok(Some(view)) => pages::client_link(&view, Some(notice), state, app.now()),
        Ok(None) => pages::link_problem(StatusCode::NOT_FOUND, UNKNOWN),
        Err(error) => service_problem(error),
    }
}
