//! The MCP endpoint: Model Context Protocol over Streamable HTTP at `/mcp`, on the gRPC port.
//!
//! Every `tools/call` goes through the same engine pipeline as `ExecuteTool` (kill switch,
//! manifest, schema, policy, approvals, ledger, credentials, timeout, redaction) under the same
//! call limits, and is recorded the same way. The endpoint is stateless (no `Mcp-Session-Id`,
//! JSON answers), so any replica answers any request: nothing of a client is kept in memory.
//!
//! - **Auth**: `Authorization: Bearer` with an agent token, checked before rmcp sees the
//!   request; the tenant and agent come from the token (401 without one, 403 for another
//!   role's). rmcp then checks `Host` against `mcp.allowed_hosts` and any `Origin` against
//!   `mcp.allowed_origins` (403), so a web page cannot drive a local gateway.
//! - **Runs**: the run is the `Toolgate-Run-Id` header, else `_meta["toolgate/run_id"]` of the
//!   request, else the token's standing run ([`standing_run_id`]), opened on first use with the
//!   agent's manifest.
//! - **Calls**: `_meta["toolgate/tool_use_id"]` is the idempotency key (the `tool_use_id` of
//!   `ExecuteTool`; generated when absent), `_meta["toolgate/correlation_id"]` the correlation
//!   id, `_meta.traceparent` (or the `traceparent` header) joins the caller's trace. Refusals
//!   and tool failures are results with `isError: true` whose structured content carries the
//!   stable error code; protocol errors only for requests rmcp cannot parse.
//! - **Approvals**: a call that waits for a human answers `isError: true` with status
//!   `waiting_approval`, its `tool_call_id` and pending invocation id; the tool
//!   `toolgate__call_status` answers the call's outcome once decided (optionally waiting).

mod handler;

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse as _, Response};
use rmcp::transport::streamable_http_server::session::never::NeverSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use tonic::codegen::http::{self, HeaderValue, StatusCode, header};
use tower_service::Service as _;

use crate::auth::Caller;
use crate::config::McpSettings;
use crate::overload::Admission;
use crate::services::Shared;
use crate::status::ServiceError;
use toolgate_ledger::Role;

use handler::Gate;

/// The path the endpoint is served at.
pub(crate) const MCP_PATH: &str = "/mcp";

/// The header naming the run a request acts in.
pub(crate) const RUN_HEADER: &str = "toolgate-run-id";

/// Who sent an MCP request and which run it named, put in the request's extensions by
/// [`enter`] for the handler.
#[derive(Clone, Debug)]
struct McpCaller {
    caller: Caller,
    run_header: Option<String>,
    /// The caller's W3C trace context from the `traceparent` header, if it sent one: rmcp may
    /// run the handler on a task of its own, outside the request's span.
    trace_parent: Option<toolgate_core::trace::SpanContext>,
}

struct Entry {
    shared: Shared,
    service: StreamableHttpService<Gate, NeverSessionManager>,
}

/// The `/mcp` route, ready to merge into the router that serves gRPC.
pub(crate) fn router(
    shared: Shared,
    admission: Arc<Admission>,
    settings: &McpSettings,
    max_request_bytes: usize,
    standing_budget: u32,
) -> axum::Router {
    let gate = Gate::new(shared.clone(), admission, standing_budget);
    let mut config = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(false)
        .with_json_response(true)
        .with_sse_keep_alive(None)
        .with_allowed_hosts(settings.allowed_hosts.iter().cloned())
        .with_max_request_body_bytes(max_request_bytes);
    config = if settings.allowed_origins.is_empty() {
        // Agents do not send `Origin`; browsers always do. With no origin configured, none is
        // accepted: a web page the operator's browser opens cannot call tools.
        config.enforce_origin_validation()
    } else {
        config.with_allowed_origins(settings.allowed_origins.iter().cloned())
    };
    let service = StreamableHttpService::new(
        move || Ok(gate.clone()),
        Arc::new(NeverSessionManager::default()),
        config,
    );
    let entry = Arc::new(Entry { shared, service });
    axum::Router::new().route(MCP_PATH, axum::routing::any(enter).with_state(entry))
}

/// Authenticates the request, counts it in the drain, and hands it to rmcp.
async fn enter(State(entry): State<Arc<Entry>>, mut request: Request) -> Response {
    let Some(_in_flight) = entry.shared.drain.enter() else {
        return refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway is shutting down; retry on another replica or after it restarts",
        );
    };
    let authorization = request.headers().get(header::AUTHORIZATION);
    let caller = match entry.shared.auth.require(authorization, Role::Agent).await {
        Ok(caller) => caller,
        Err(error) => return auth_refusal(&error),
    };
    let run_header = match request.headers().get(RUN_HEADER).map(HeaderValue::to_str) {
        None => None,
        Some(Ok(run)) => Some(run.trim().to_owned()),
        Some(Err(_)) => {
            return refusal(
                StatusCode::BAD_REQUEST,
                "the Toolgate-Run-Id header must be visible ASCII",
            );
        }
    };
    let trace_parent = crate::telemetry::header_trace_context(request.headers());
    request.extensions_mut().insert(McpCaller {
        caller,
        run_header,
        trace_parent,
    });
    let mut service = entry.service.clone();
    let answered: Result<_, Infallible> = service.call(request).await;
    match answered {
        Ok(response) => response.map(Body::new),
        Err(never) => match never {},
    }
}

fn auth_refusal(error: &ServiceError) -> Response {
    match error {
        ServiceError::MissingToken
        | ServiceError::TokenNotText
        | ServiceError::NotBearer
        | ServiceError::UnknownToken => {
            let mut response = refusal(StatusCode::UNAUTHORIZED, &error.to_string());
            response.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"toolgate\""),
            );
            response
        }
        ServiceError::WrongRole { .. } | ServiceError::NoTenant => {
            refusal(StatusCode::FORBIDDEN, &error.to_string())
        }
        // The store could not be asked: the caller may retry.
        _ => refusal(
            StatusCode::SERVICE_UNAVAILABLE,
            "the gateway cannot check tokens right now; retry",
        ),
    }
}

/// A plain-text refusal before any MCP processing.
fn refusal(status: StatusCode, message: &str) -> Response {
    let mut response = (status, format!("{message}\n")).into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The caller [`enter`] found, from the request parts rmcp hands the handler.
fn mcp_caller(parts: Option<&http::request::Parts>) -> Option<&McpCaller> {
    parts.and_then(|parts| parts.extensions.get::<McpCaller>())
}
