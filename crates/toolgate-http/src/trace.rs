//! Trace context on outbound requests: each attempt carries the W3C `traceparent` (and
//! `tracestate`) of its own span, so a vendor's logs join the agent's trace.
//!
//! The span's context comes from the application's trace recorder (`toolgate_core::trace`):
//! with none installed (traces off) no span has a context and no header is added.

use http::{HeaderMap, HeaderValue};

/// The trace headers of the current span (empty when tracing is off).
pub(crate) fn current_trace_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    let Some(context) = toolgate_core::trace::current() else {
        return headers;
    };
    if let Ok(value) = HeaderValue::from_str(&context.traceparent()) {
        headers.insert("traceparent", value);
    }
    // A kept `tracestate` is printable ASCII; anything else is dropped rather than sent
    // malformed.
    if let Some(state) = context.trace_state.as_deref()
        && let Ok(value) = HeaderValue::from_str(state)
    {
        headers.insert("tracestate", value);
    }
    headers
}
