//! The approval console: server-rendered pages on the gateway's own port, where approvers
//! sign in once with their token and decide the pending invocations of their tenant.
//!
//! - Sessions live in the ledger (only the SHA-256 of the random id the cookie carries), so
//!   every replica sharing it knows them; each request looks the session's token up again (a
//!   revoked token ends its sessions) and the tenant always comes from that token.
//! - Every form carries the session's CSRF token, and every POST must come from the console's
//!   own origin (`Origin`, or `Sec-Fetch-Site: same-origin` when a browser sends no `Origin`).
//! - Every answer carries the security headers (CSP without inline script or style, no
//!   framing, no referrer, no caching).
//! - Decisions go through the same engine call as the gRPC `ApprovalService.Resume`, with the
//!   same identity and audit; the page's row version must still be the row's, else the page
//!   says who decided instead of acting.
//! - Client approval links ([`links`]) decide exactly one invocation, once.
//! - Admin tokens open the admin pages ([`admin`]): tenants, agents, grants, the kill switch,
//!   policies, credentials, tokens and audit trails, through the same operations as the gRPC
//!   `AdminService` ([`crate::admin::Admin`]), each change audited with the session's token.
//!
//! [`router`] is the one entry point; the server merges it into its routes.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use base64::Engine as _;
use rand::RngCore;
use toolgate_core::{TenantId, Timestamp, ToolName};
use toolgate_engine::{ResumeDecision, ResumeOutcome, ResumeRequest};
use toolgate_ledger::{ConsoleSession, PendingFilter, PendingOrigin, PendingState, Role};

use crate::auth::{Caller, hash_token};
use crate::config::ConsoleSettings;
use crate::services::Shared;
use crate::status::ServiceError;

mod admin;
mod admin_pages;
pub(crate) mod links;
mod pages;

/// The vendored script (htmx 4.0.1, BSD-0-Clause), served from the binary.
const HTMX: &[u8] = include_bytes!("../../assets/htmx-4.0.1.min.js");
/// The console's style sheet.
const CSS: &[u8] = include_bytes!("../../assets/console.css");

/// The largest form body taken (a decision's reason, a token): anything larger is refused.
pub(crate) const MAX_FORM_BYTES: usize = 16 * 1024;

/// Sign-in attempts one client address may make per window.
const SIGN_IN_ATTEMPTS: u32 = 10;
/// The sign-in rate limit's window.
const SIGN_IN_WINDOW: Duration = Duration::from_secs(60);

/// The Content-Security-Policy of every answer.
pub(crate) const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
     img-src 'self'; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; \
     base-uri 'none'";

/// The console's state.
#[derive(Debug)]
pub(crate) struct Console {
    shared: Shared,
    settings: ConsoleSettings,
    /// Whether the listener speaks TLS (the cookie is then `__Host-` and `Secure`).
    secure: bool,
    attempts: Mutex<HashMap<Option<IpAddr>, (Instant, u32)>>,
}

type App = Arc<Console>;

/// The console's routes, under `/console`.
pub(crate) fn router(shared: Shared, settings: ConsoleSettings, tls: bool) -> Router {
    let secure = tls
        || settings
            .public_url
            .as_deref()
            .is_some_and(|url| url.starts_with("https://"));
    let app: App = Arc::new(Console {
        shared,
        settings,
        secure,
        attempts: Mutex::new(HashMap::new()),
    });
    Router::new()
        .route("/console", get(home))
        .route("/console/", get(home))
        .route("/console/sign-in", get(sign_in_page).post(sign_in))
        .route("/console/sign-out", axum::routing::post(sign_out))
        .route("/console/queue", get(queue))
        .route("/console/queue/rows", get(queue_rows))
        .route("/console/invocations/{id}", get(invocation).post(decide))
        .merge(admin::routes())
        .route(
            "/console/link/{secret}",
            get(links::show).post(links::decide),
        )
        .route("/console/assets/htmx.js", get(htmx))
        .route("/console/assets/console.css", get(css))
        // Not a fallback: the router is merged into the gRPC routes, whose fallback answers
        // everything else.
        .route("/console/{*rest}", get(not_found).post(not_found))
        .layer(DefaultBodyLimit::max(MAX_FORM_BYTES))
        .layer(middleware::from_fn(security_headers))
        .with_state(app)
}

/// The security headers on every answer.
async fn security_headers(request: Request, next: Next) -> Response {
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CSP),
    );
    headers.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    headers.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    response
}

async fn htmx() -> Response {
    asset(HTMX, "text/javascript; charset=utf-8")
}

async fn css() -> Response {
    asset(CSS, "text/css; charset=utf-8")
}

fn asset(bytes: &'static [u8], kind: &'static str) -> Response {
    ([(header::CONTENT_TYPE, kind)], bytes).into_response()
}

async fn not_found() -> Response {
    pages::problem(StatusCode::NOT_FOUND, "Not found", "There is no such page.")
}

// --- sessions ----------------------------------------------------------------------------

/// A signed-in approver.
#[derive(Clone, Debug)]
pub(crate) struct Signed {
    id_hash: String,
    csrf: String,
    caller: Caller,
}

impl Signed {
    /// The approver's tenant (admin sessions never reach the approver pages).
    fn tenant(&self) -> &TenantId {
        self.caller
            .tenant
            .as_ref()
            .expect("approver sessions belong to approver tokens, which have a tenant")
    }

    /// How decisions made in this session are recorded: the same identity as the gRPC
    /// approval service records for the same token.
    fn approver(&self) -> String {
        approver_identity(&self.caller)
    }
}

/// The identity a decision is recorded with: the token's label and id.
pub(crate) fn approver_identity(caller: &Caller) -> String {
    if caller.label.is_empty() {
        caller.token_id.clone()
    } else {
        format!("{} ({})", caller.label, caller.token_id)
    }
}

/// Why a request has no session.
enum NoSession {
    /// No cookie, or one naming no session.
    Missing,
    /// The session ended: idle, past its absolute expiry, or its token revoked.
    Ended(&'static str),
    /// The ledger failed.
    Failed(ServiceError),
}

impl Console {
    fn cookie_name(&self) -> &'static str {
        if self.secure {
            "__Host-tg_session"
        } else {
            "tg_session"
        }
    }

    fn session_cookie(&self, value: &str, max_age: Duration) -> HeaderValue {
        let secure = if self.secure { "; Secure" } else { "" };
        let text = format!(
            "{}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
            self.cookie_name(),
            max_age.as_secs()
        );
        HeaderValue::from_str(&text).expect("cookie text is ASCII")
    }

    fn cleared_cookie(&self) -> HeaderValue {
        self.session_cookie("", Duration::ZERO)
    }

    fn now(&self) -> Timestamp {
        self.shared.clock.now()
    }

    /// The session the request's cookie names, valid now and still held by a live approver
    /// token; the request counts as activity.
    async fn session(&self, headers: &HeaderMap) -> Result<Signed, NoSession> {
        let Some(id) = cookie(headers, self.cookie_name()) else {
            return Err(NoSession::Missing);
        };
        let id_hash = hash_token(&id);
        let store = self.shared.engine.store();
        let session = store
            .get_console_session(&id_hash)
            .await
            .map_err(|error| NoSession::Failed(error.into()))?
            .ok_or(NoSession::Missing)?;
        let now = self.now();
        let idle_ms = millis(self.settings.session_idle);
        if session.expires_at <= now {
            return Err(NoSession::Ended("The session reached its maximum age."));
        }
        if session.last_seen_at.0.saturating_add(idle_ms) <= now.0 {
            return Err(NoSession::Ended("The session was idle too long."));
        }
        // Activity moves the idle expiry; written at most every few seconds per session.
        let touch_every = (idle_ms / 4).min(15_000);
        if now.0 - session.last_seen_at.0 >= touch_every {
            let valid = store
                .touch_console_session(&id_hash, now, idle_ms)
                .await
                .map_err(|error| NoSession::Failed(error.into()))?;
            if !valid {
                return Err(NoSession::Ended("The session ended."));
            }
        }
        let record = store
            .find_token(&session.token_hash)
            .await
            .map_err(|error| NoSession::Failed(error.into()))?;
        let Some(record) = record.filter(|record| {
            !record.revoked && matches!(record.role, Role::Approver | Role::Admin)
        }) else {
            return Err(NoSession::Ended(
                "The token this session was opened with was revoked.",
            ));
        };
        Ok(Signed {
            id_hash,
            csrf: session.csrf,
            caller: Caller {
                token_id: record.id,
                role: record.role,
                tenant: record.tenant,
                agent: record.agent,
                label: record.label,
            },
        })
    }

    /// The session of a request for a page of `role`; the answer to give otherwise (the
    /// sign-in page, or a page saying the page is the other role's).
    #[allow(
        clippy::result_large_err,
        reason = "the refusal is the handler's answer, returned at once"
    )]
    async fn session_of(&self, headers: &HeaderMap, role: Role) -> Result<Signed, Response> {
        let signed = self
            .session(headers)
            .await
            .map_err(|why| signed_out(self, why))?;
        if signed.caller.role == role {
            return Ok(signed);
        }
        Err(match signed.caller.role {
            Role::Admin => pages::problem(
                StatusCode::FORBIDDEN,
                "Not an approver",
                "This page is for the approvers of a tenant; an admin session manages the gateway from the admin pages.",
            ),
            _ => pages::problem(
                StatusCode::FORBIDDEN,
                "Admins only",
                "This page needs an admin session: sign in with an admin token.",
            ),
        })
    }

    /// A POST of a signed-in `role`: the session, the form, the origin and the session's CSRF
    /// token, all checked before the handler acts; the refusal page otherwise.
    #[allow(
        clippy::result_large_err,
        reason = "the refusal is the handler's answer, returned at once"
    )]
    async fn signed_post(
        &self,
        headers: &HeaderMap,
        role: Role,
        body: Result<Bytes, axum::extract::rejection::BytesRejection>,
    ) -> Result<(Signed, HashMap<String, String>), Response> {
        let signed = self.session_of(headers, role).await?;
        let fields = form(body)?;
        check_post(self, headers, &signed, &fields)?;
        Ok((signed, fields))
    }

    /// Whether the POST comes from the console's own origin.
    fn same_origin(&self, headers: &HeaderMap) -> Result<(), &'static str> {
        if let Some(site) = headers.get("sec-fetch-site")
            && site.as_bytes() != b"same-origin"
        {
            return Err("The form was sent from another site.");
        }
        // Under `Referrer-Policy: no-referrer` browsers send `Origin: null` with form POSTs:
        // then `Sec-Fetch-Site` (which no page script can set) must vouch for the request.
        let origin = headers
            .get(header::ORIGIN)
            .filter(|origin| origin.as_bytes() != b"null");
        match origin {
            Some(origin) => {
                let origin = origin
                    .to_str()
                    .map_err(|_| "The request's origin is not text.")?;
                if self.origin_allowed(origin, headers) {
                    Ok(())
                } else {
                    Err("The form was sent from another origin.")
                }
            }
            None if headers.contains_key("sec-fetch-site") => Ok(()),
            None => Err(
                "The request names no origin; forms are only taken from the console's own pages.",
            ),
        }
    }

    fn origin_allowed(&self, origin: &str, headers: &HeaderMap) -> bool {
        if self
            .settings
            .allowed_origins
            .iter()
            .any(|allowed| allowed.trim_end_matches('/') == origin)
        {
            return true;
        }
        if let Some(public) = &self.settings.public_url {
            return public_origin(public).is_some_and(|public| public == origin);
        }
        // No public URL configured: the origin must name the host the request was sent to.
        let Some(host) = headers.get(header::HOST).and_then(|h| h.to_str().ok()) else {
            return false;
        };
        let scheme = if self.secure { "https" } else { "http" };
        origin == format!("{scheme}://{host}")
    }

    /// Counts a sign-in attempt of `client`; `false` once it has made too many.
    fn allow_attempt(&self, client: Option<IpAddr>) -> bool {
        let mut attempts = self.attempts.lock().expect("sign-in attempts lock");
        let now = Instant::now();
        if attempts.len() > 10_000 {
            attempts.retain(|_, (since, _)| now.duration_since(*since) < SIGN_IN_WINDOW);
        }
        let entry = attempts.entry(client).or_insert((now, 0));
        if now.duration_since(entry.0) >= SIGN_IN_WINDOW {
            *entry = (now, 0);
        }
        entry.1 += 1;
        entry.1 <= SIGN_IN_ATTEMPTS
    }
}

/// The origin (`scheme://host[:port]`) of a URL.
pub(crate) fn public_origin(url: &str) -> Option<String> {
    let url = url::Url::parse(url).ok()?;
    match url.origin() {
        url::Origin::Tuple(..) => Some(url.origin().ascii_serialization()),
        url::Origin::Opaque(_) => None,
    }
}

fn millis(duration: Duration) -> i64 {
    i64::try_from(duration.as_millis()).unwrap_or(i64::MAX)
}

/// A cookie's value from the request's `Cookie` headers.
fn cookie(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(key, _)| *key == name)
        .map(|(_, value)| value.to_owned())
        .filter(|value| !value.is_empty())
}

/// A random secret: 32 bytes, base64url.
pub(crate) fn secret() -> String {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// Compares two secrets in time independent of where they differ.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// A parsed form body; a body that is too large or not a form is refused with a page.
#[allow(
    clippy::result_large_err,
    reason = "the refusal is the handler's answer, returned at once"
)]
pub(crate) fn form(
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Result<HashMap<String, String>, Response> {
    let body = body.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            pages::problem(
                StatusCode::PAYLOAD_TOO_LARGE,
                "Form too large",
                &format!(
                    "Forms are at most {} KiB ({} KiB on the admin pages, for policies); nothing was changed.",
                    MAX_FORM_BYTES / 1024,
                    admin::MAX_ADMIN_FORM_BYTES / 1024
                ),
            )
        } else {
            pages::problem(
                StatusCode::BAD_REQUEST,
                "Unreadable form",
                "The form could not be read; nothing was changed.",
            )
        }
    })?;
    if std::str::from_utf8(&body).is_err() {
        return Err(pages::problem(
            StatusCode::BAD_REQUEST,
            "Malformed form",
            "The form is not text; nothing was changed.",
        ));
    }
    let mut fields = HashMap::new();
    for (key, value) in url::form_urlencoded::parse(&body) {
        if fields
            .insert(key.into_owned(), value.into_owned())
            .is_some()
        {
            return Err(pages::problem(
                StatusCode::BAD_REQUEST,
                "Malformed form",
                "A field of the form was sent twice; nothing was changed.",
            ));
        }
    }
    Ok(fields)
}

fn redirect(to: &str) -> Response {
    (
        StatusCode::SEE_OTHER,
        [(
            header::LOCATION,
            HeaderValue::from_str(to).expect("redirect target is ASCII"),
        )],
    )
        .into_response()
}

/// The answer to a request without a valid session.
fn signed_out(app: &Console, why: NoSession) -> Response {
    match why {
        NoSession::Missing => redirect("/console/sign-in"),
        NoSession::Ended(reason) => {
            let mut page = pages::sign_in(Some(reason), StatusCode::UNAUTHORIZED);
            page.headers_mut()
                .insert(header::SET_COOKIE, app.cleared_cookie());
            page
        }
        NoSession::Failed(error) => service_problem(error),
    }
}

/// A refusal of the engine or the store as a page (the same wording the gRPC status has).
pub(crate) fn service_problem(error: impl Into<ServiceError>) -> Response {
    let status = crate::status::status(error);
    pages::problem(
        http_status(status.code()),
        "The gateway refused",
        status.message(),
    )
}

/// The HTTP status of a refusal's gRPC code.
fn http_status(code: tonic::Code) -> StatusCode {
    match code {
        tonic::Code::NotFound => StatusCode::NOT_FOUND,
        tonic::Code::InvalidArgument => StatusCode::BAD_REQUEST,
        tonic::Code::PermissionDenied => StatusCode::FORBIDDEN,
        tonic::Code::FailedPrecondition | tonic::Code::AlreadyExists => StatusCode::CONFLICT,
        tonic::Code::Unavailable | tonic::Code::ResourceExhausted => {
            StatusCode::SERVICE_UNAVAILABLE
        }
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// Checks the POST's origin and the session's CSRF token; the page to answer otherwise.
#[allow(
    clippy::result_large_err,
    reason = "the refusal is the handler's answer, returned at once"
)]
fn check_post(
    app: &Console,
    headers: &HeaderMap,
    signed: &Signed,
    fields: &HashMap<String, String>,
) -> Result<(), Response> {
    app.same_origin(headers)
        .map_err(|why| pages::problem(StatusCode::FORBIDDEN, "Refused: cross-origin form", why))?;
    let sent = fields.get("csrf").map(String::as_str).unwrap_or_default();
    if !same_secret(sent, &signed.csrf) {
        return Err(pages::problem(
            StatusCode::FORBIDDEN,
            "Refused: missing or wrong form token",
            "The form did not carry this session's token (a page from an older session, or a forged form). Nothing was changed.",
        ));
    }
    Ok(())
}

// --- sign-in -----------------------------------------------------------------------------

async fn home(State(app): State<App>, headers: HeaderMap) -> Response {
    match app.session(&headers).await {
        Ok(signed) => redirect(home_of(signed.caller.role)),
        Err(why) => signed_out(&app, why),
    }
}

/// Where a session of `role` starts.
fn home_of(role: Role) -> &'static str {
    match role {
        Role::Admin => "/console/admin",
        _ => "/console/queue",
    }
}

async fn sign_in_page() -> Response {
    pages::sign_in(None, StatusCode::OK)
}

async fn sign_in(
    State(app): State<App>,
    headers: HeaderMap,
    connection: Option<axum::Extension<tonic::transport::server::TcpConnectInfo>>,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    // Sign-in has no session yet: the origin check stands in for the CSRF token.
    if let Err(why) = app.same_origin(&headers) {
        return pages::problem(StatusCode::FORBIDDEN, "Refused: cross-origin form", why);
    }
    let client = connection
        .and_then(|info| info.0.remote_addr())
        .map(|a| a.ip());
    if !app.allow_attempt(client) {
        return pages::sign_in(
            Some("Too many sign-in attempts from this address; wait a minute and try again."),
            StatusCode::TOO_MANY_REQUESTS,
        );
    }
    let fields = match form(body) {
        Ok(fields) => fields,
        Err(page) => return page,
    };
    let token = fields.get("token").map(|t| t.trim()).unwrap_or_default();
    if token.is_empty() {
        return pages::sign_in(
            Some("Enter your approver or admin token."),
            StatusCode::BAD_REQUEST,
        );
    }
    let store = app.shared.engine.store();
    let token_hash = hash_token(token);
    let record = match store.find_token(&token_hash).await {
        Ok(record) => record.filter(|record| !record.revoked),
        Err(error) => return service_problem(error),
    };
    let Some(record) = record else {
        return pages::sign_in(
            Some("That token is not valid (unknown or revoked)."),
            StatusCode::UNAUTHORIZED,
        );
    };
    if !matches!(record.role, Role::Approver | Role::Admin) {
        return pages::sign_in(
            Some("Only approver and admin tokens open a console session; agent tokens call tools."),
            StatusCode::FORBIDDEN,
        );
    }
    let id = secret();
    let now = app.now();
    let session = ConsoleSession {
        id_hash: hash_token(&id),
        token_hash,
        csrf: secret(),
        created_at: now,
        last_seen_at: now,
        expires_at: now.plus_ms(millis(app.settings.session_max)),
    };
    if let Err(error) = store.create_console_session(session).await {
        return service_problem(error);
    }
    tracing::info!(token_id = %record.id, role = record.role.as_str(), "console session opened");
    let mut response = redirect(home_of(record.role));
    response.headers_mut().insert(
        header::SET_COOKIE,
        app.session_cookie(&id, app.settings.session_max),
    );
    response
}

async fn sign_out(
    State(app): State<App>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let signed = match app.session(&headers).await {
        Ok(signed) => signed,
        Err(why) => return signed_out(&app, why),
    };
    let fields = match form(body) {
        Ok(fields) => fields,
        Err(page) => return page,
    };
    if let Err(page) = check_post(&app, &headers, &signed, &fields) {
        return page;
    }
    if let Err(error) = app
        .shared
        .engine
        .store()
        .delete_console_session(&signed.id_hash)
        .await
    {
        return service_problem(error);
    }
    let mut response = pages::sign_in(Some("Signed out."), StatusCode::OK);
    response
        .headers_mut()
        .insert(header::SET_COOKIE, app.cleared_cookie());
    response
}

// --- the queue ---------------------------------------------------------------------------

/// The queue's filters, from the query string.
#[derive(Clone, Debug, Default)]
pub(crate) struct Filters {
    pub(crate) tool: String,
    pub(crate) risk: String,
    pub(crate) origin: String,
    /// Only invocations waiting at least this many minutes.
    pub(crate) min_age_minutes: String,
}

impl Filters {
    fn parse(query: Option<&str>) -> Filters {
        let mut filters = Filters::default();
        for (key, value) in url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
            let value = value.trim().to_owned();
            match key.as_ref() {
                "tool" => filters.tool = value,
                "risk" => filters.risk = value,
                "origin" => filters.origin = value,
                "min_age" => filters.min_age_minutes = value,
                _ => {}
            }
        }
        filters
    }

    pub(crate) fn query(&self) -> String {
        url::form_urlencoded::Serializer::new(String::new())
            .append_pair("tool", &self.tool)
            .append_pair("risk", &self.risk)
            .append_pair("origin", &self.origin)
            .append_pair("min_age", &self.min_age_minutes)
            .finish()
    }
}

/// One row of the queue.
#[derive(Clone, Debug)]
pub(crate) struct QueueRow {
    pub(crate) id: String,
    pub(crate) tool: String,
    pub(crate) risk: String,
    pub(crate) origin: &'static str,
    pub(crate) created_at: Timestamp,
    pub(crate) expires_at: Timestamp,
}

async fn queue_rows_of(
    app: &Console,
    signed: &Signed,
    filters: &Filters,
) -> Result<Vec<QueueRow>, String> {
    let tool = if filters.tool.is_empty() {
        None
    } else {
        Some(ToolName::new(filters.tool.clone()).map_err(|e| format!("tool: {e}"))?)
    };
    let origin = if filters.origin.is_empty() {
        None
    } else {
        Some(PendingOrigin::parse(&filters.origin).ok_or_else(|| {
            format!(
                "origin: `{}` is not one of APPROVAL_REQUIRED, POLICY_DENIED, EXECUTION_FAILED",
                filters.origin
            )
        })?)
    };
    let min_age_ms = if filters.min_age_minutes.is_empty() {
        0
    } else {
        let minutes: i64 = filters
            .min_age_minutes
            .parse()
            .ok()
            .filter(|m| (0..=525_600).contains(m))
            .ok_or_else(|| {
                format!(
                    "age: `{}` is not a number of minutes (0 to 525600)",
                    filters.min_age_minutes
                )
            })?;
        minutes * 60_000
    };
    if !filters.risk.is_empty()
        && !["low", "medium", "high", "critical"].contains(&filters.risk.as_str())
    {
        return Err(format!(
            "risk: `{}` is not one of low, medium, high, critical",
            filters.risk
        ));
    }
    let store = app.shared.engine.store();
    let filter = PendingFilter {
        run: None,
        tool,
        origin,
    };
    let rows = store
        .list_pending(signed.tenant(), &filter, 200)
        .await
        .map_err(|error| crate::status::status(error).message().to_owned())?;
    let now = app.now();
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        if now.0 - row.created_at.0 < min_age_ms {
            continue;
        }
        let call = store
            .get_tool_call(signed.tenant(), &row.tool_call_id)
            .await
            .map_err(|error| crate::status::status(error).message().to_owned())?;
        let risk = call
            .and_then(|call| call.risk_level)
            .map(|risk| risk.as_str().to_owned())
            .unwrap_or_default();
        if !filters.risk.is_empty() && risk != filters.risk {
            continue;
        }
        out.push(QueueRow {
            id: row.id,
            tool: row.tool.to_string(),
            risk,
            origin: row.origin.as_str(),
            created_at: row.created_at,
            expires_at: row.expires_at,
        });
    }
    Ok(out)
}

async fn queue(State(app): State<App>, request: Request) -> Response {
    let signed = match app.session_of(request.headers(), Role::Approver).await {
        Ok(signed) => signed,
        Err(page) => return page,
    };
    let filters = Filters::parse(request.uri().query());
    let rows = queue_rows_of(&app, &signed, &filters).await;
    pages::queue(&signed.caller, &signed.csrf, &filters, rows, app.now())
}

async fn queue_rows(State(app): State<App>, request: Request) -> Response {
    let signed = match app.session(request.headers()).await {
        Ok(signed) if signed.caller.role == Role::Approver => signed,
        Ok(_) => return pages::rows_signed_out(),
        Err(NoSession::Failed(error)) => return service_problem(error),
        // The fragment replaces the table: it says so instead of redirecting the poll.
        Err(NoSession::Missing | NoSession::Ended(_)) => {
            return pages::rows_signed_out();
        }
    };
    let filters = Filters::parse(request.uri().query());
    let rows = queue_rows_of(&app, &signed, &filters).await;
    pages::rows(rows, app.now())
}

// --- one invocation ----------------------------------------------------------------------

/// Everything the invocation page shows.
#[derive(Debug)]
pub(crate) struct InvocationView {
    pub(crate) row: toolgate_ledger::PendingInvocation,
    pub(crate) description: String,
    pub(crate) arguments: String,
    pub(crate) risk: String,
    pub(crate) policy_ids: Vec<String>,
    pub(crate) decided_by: Option<String>,
    pub(crate) reason: Option<String>,
    pub(crate) call_status: String,
    pub(crate) error: Option<String>,
    pub(crate) output: Option<String>,
    /// The run's calls before this one: (tool, status).
    pub(crate) earlier: Vec<(String, String, String)>,
}

/// Loads what the page shows of invocation `id` of `tenant`; `None`: no such invocation
/// (another tenant's is none too).
pub(crate) async fn load_view(
    shared: &Shared,
    tenant: &TenantId,
    id: &str,
    with_run: bool,
) -> Result<Option<InvocationView>, ServiceError> {
    let store = shared.engine.store();
    let Some(row) = store.get_pending(tenant, id).await? else {
        return Ok(None);
    };
    let details = store.pending_details(tenant, id).await?;
    let call = store.get_tool_call(tenant, &row.tool_call_id).await?;
    let description = shared
        .engine
        .catalog()
        .registry()
        .get(row.tool.as_str())
        .map(|(spec, _)| spec.description.clone())
        .unwrap_or_default();
    let arguments = call
        .as_ref()
        .map(|call| serde_json::to_string_pretty(&call.input_redacted).unwrap_or_default())
        .unwrap_or_default();
    let mut earlier = Vec::new();
    if with_run {
        let calls = store.list_tool_calls(tenant, &row.run, None, 100).await?;
        for other in calls {
            if other.id == row.tool_call_id {
                break;
            }
            earlier.push((
                other.id.to_string(),
                other.tool.clone(),
                other.status.as_str().to_owned(),
            ));
        }
    }
    let details = details.unwrap_or(toolgate_ledger::PendingDetails {
        decided_by: None,
        reason: None,
        decided_at: None,
        policy_ids: Vec::new(),
    });
    Ok(Some(InvocationView {
        description,
        arguments,
        risk: call
            .as_ref()
            .and_then(|call| call.risk_level)
            .map(|risk| risk.as_str().to_owned())
            .unwrap_or_default(),
        policy_ids: details.policy_ids,
        decided_by: details.decided_by,
        reason: details.reason,
        call_status: call
            .as_ref()
            .map(|call| call.status.as_str().to_owned())
            .unwrap_or_default(),
        error: call.as_ref().and_then(|call| {
            call.error_code.map(|code| {
                format!(
                    "{}: {}",
                    code.as_str(),
                    call.error_text.clone().unwrap_or_default()
                )
            })
        }),
        output: call
            .as_ref()
            .and_then(|call| call.output_redacted.as_ref())
            .map(|output| serde_json::to_string_pretty(output).unwrap_or_default()),
        row,
        earlier,
    }))
}

async fn invocation(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Response {
    let signed = match app.session_of(&headers, Role::Approver).await {
        Ok(signed) => signed,
        Err(page) => return page,
    };
    match load_view(&app.shared, signed.tenant(), &id, true).await {
        Ok(Some(view)) => pages::invocation(&signed.caller, &signed.csrf, &view, None, app.now()),
        Ok(None) => pages::problem(
            StatusCode::NOT_FOUND,
            "Not found",
            &format!("There is no pending invocation `{id}` in your tenant."),
        ),
        Err(error) => service_problem(error),
    }
}

/// A decision a form asks for.
pub(crate) fn parse_decision(
    fields: &HashMap<String, String>,
    allow_continue: bool,
) -> Result<(ResumeDecision, String), &'static str> {
    let reason = fields
        .get("reason")
        .map(|r| r.trim().to_owned())
        .unwrap_or_default();
    let decision = match fields.get("decision").map(String::as_str) {
        Some("approve") => ResumeDecision::Approve,
        Some("reject") => {
            if reason.is_empty() {
                return Err("A rejection needs a reason: it goes back to the agent.");
            }
            ResumeDecision::Reject
        }
        Some("continue") if allow_continue => ResumeDecision::Continue,
        _ => return Err("The form asks for no known decision."),
    };
    if reason.len() > 2000 {
        return Err("The reason is longer than 2000 characters.");
    }
    Ok((decision, reason))
}

async fn decide(
    State(app): State<App>,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, axum::extract::rejection::BytesRejection>,
) -> Response {
    let (signed, fields) = match app.signed_post(&headers, Role::Approver, body).await {
        Ok(signed) => signed,
        Err(page) => return page,
    };
    let tenant = signed.tenant().clone();
    let view = match load_view(&app.shared, &tenant, &id, true).await {
        Ok(Some(view)) => view,
        Ok(None) => {
            return pages::problem(
                StatusCode::NOT_FOUND,
                "Not found",
                &format!("There is no pending invocation `{id}` in your tenant."),
            );
        }
        Err(error) => return service_problem(error),
    };
    let (decision, reason) = match parse_decision(&fields, true) {
        Ok(decision) => decision,
        Err(why) => {
            return pages::invocation(
                &signed.caller,
                &signed.csrf,
                &view,
                Some(pages::Notice::Problem(why.to_owned())),
                app.now(),
            )
            .map_status(StatusCode::BAD_REQUEST);
        }
    };
    let Some(version) = fields.get("version").and_then(|v| v.parse::<i64>().ok()) else {
        return pages::problem(
            StatusCode::BAD_REQUEST,
            "Malformed form",
            "The form carries no row version; nothing was changed.",
        );
    };
    // The page showed `version`: a decision made since then is shown, not overridden.
    if view.row.state != PendingState::Pending || view.row.version != version {
        return already_decided(&app, &signed, &tenant, &id).await;
    }
    let outcome = app
        .shared
        .engine
        .resume(ResumeRequest {
            tenant: tenant.clone(),
            approver: signed.approver(),
            run: view.row.run.to_string(),
            invocation: id.clone(),
            decision,
            reason,
        })
        .await;
    let notice = match outcome {
        Ok(ResumeOutcome::ClaimLost) => return already_decided(&app, &signed, &tenant, &id).await,
        Ok(outcome) => pages::Notice::Outcome(describe(&outcome)),
        Err(error) => return service_problem(error),
    };
    match load_view(&app.shared, &tenant, &id, true).await {
        Ok(Some(view)) => {
            pages::invocation(&signed.caller, &signed.csrf, &view, Some(notice), app.now())
        }
        Ok(None) => not_found().await,
        Err(error) => service_problem(error),
    }
}

async fn already_decided(app: &Console, signed: &Signed, tenant: &TenantId, id: &str) -> Response {
    match load_view(&app.shared, tenant, id, true).await {
        Ok(Some(view)) => {
            let by = view
                .decided_by
                .clone()
                .unwrap_or_else(|| "the gateway".to_owned());
            pages::invocation(
                &signed.caller,
                &signed.csrf,
                &view,
                Some(pages::Notice::AlreadyDecided(by)),
                app.now(),
            )
            .map_status(StatusCode::CONFLICT)
        }
        Ok(None) => not_found().await,
        Err(error) => service_problem(error),
    }
}

/// What a decision did, in words.
pub(crate) fn describe(outcome: &ResumeOutcome) -> String {
    match outcome {
        ResumeOutcome::Executed(outcome) => match &outcome.error {
            None => format!(
                "Approved: the call ran and ended {}.",
                outcome.status.as_str()
            ),
            Some(error) => format!(
                "Approved: the call ran and ended {} ({}: {}).",
                outcome.status.as_str(),
                error.code.as_str(),
                error.message
            ),
        },
        ResumeOutcome::Rejected { expired: true, .. } => {
            "The invocation had expired: it is rejected.".to_owned()
        }
        ResumeOutcome::Rejected { .. } => "Rejected: the agent is told why.".to_owned(),
        ResumeOutcome::Continued { .. } => {
            "Continued: the agent carries on without this call.".to_owned()
        }
        ResumeOutcome::ClaimLost => "Already decided elsewhere.".to_owned(),
        ResumeOutcome::PolicyDenialTerminal => {
            "A policy denial cannot be approved: reject it or let the agent continue.".to_owned()
        }
        ResumeOutcome::FeatureDisabled { error, .. } => format!(
            "Not executed: {} ({}); the call is still waiting.",
            error.message,
            error.code.as_str()
        ),
    }
}

/// Sets a response's status.
pub(crate) trait MapStatus {
    fn map_status(self, status: StatusCode) -> Response;
}

impl MapStatus for Response {
    fn map_status(mut self, status: StatusCode) -> Response {
        *self.status_mut() = status;
        self
    }
}
