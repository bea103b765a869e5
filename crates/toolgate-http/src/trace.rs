//! Trace context on outbound requests: each attempt carries the W3C `traceparent` (and
//! `tracestate`) of its own span, so a vendor's logs join the agent's trace.
//!
//! The crate uses only the OpenTelemetry API: the propagator is the process's global one, which
//! does nothing until the application installs one (the gateway does when it exports traces),
//! and the span's context comes from the `tracing` bridge, empty when no OpenTelemetry layer is
//! installed. With neither, no header is added.

use http::{HeaderMap, HeaderName, HeaderValue};
use opentelemetry::propagation::Injector;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The trace headers of the current span (empty when tracing is off).
pub(crate) fn current_trace_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    let context = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|propagator| {
        propagator.inject_context(&context, &mut HeaderInjector(&mut headers));
    });
    headers
}

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        // A propagator's keys and values are header-safe; anything else is dropped rather
        // than sent malformed.
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(key.as_bytes()),
            HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}
