//! A server span per gRPC request, whose parent is the caller's W3C trace context
//! (`traceparent` / `tracestate` metadata): the engine's `execute_tool` span, and everything
//! under it, joins the agent's trace.
//!
//! With traces on, the recorder makes the server span itself and it is entered as a scope
//! (`toolgate_core::trace::Span`); without them it is a `tracing` span at debug level, for the
//! text logs of a gateway logging at debug.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tonic::codegen::{Service, http};
use toolgate_core::trace::{Scope, Span, SpanContext, in_span};

use super::otlp::{Attributes, Value};
use super::recorder::{GRPC_REQUEST, HTTP_REQUEST, Recorder};

/// Wraps the whole gRPC server. The span is at debug level: with traces off and logs at info
/// nothing subscribes to it, and it costs nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct TraceLayer;

impl<S> tower_layer::Layer<S> for TraceLayer {
    type Service = Traced<S>;

    fn layer(&self, inner: S) -> Traced<S> {
        Traced { inner }
    }
}

/// A service behind [`TraceLayer`].
#[derive(Debug, Clone)]
pub struct Traced<S> {
    inner: S,
}

impl<S, B> Service<http::Request<B>> for Traced<S>
where
    S: Service<http::Request<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let span = match request_scope(&request) {
            Some(scope) => Span::Scope(scope),
            None => Span::Tracing(request_span(&request)),
        };
        let future = self.inner.call(request);
        Box::pin(in_span(span, future))
    }
}

/// The parts of a request its server span names.
enum Request<'a> {
    /// `/toolgate.v1.AgentService/ExecuteTool`: both parts are names from the contract (or
    /// whatever a client sent, which is not a secret's place and is cut short).
    Grpc {
        path: &'a str,
        service: &'a str,
        method: &'a str,
    },
    /// The HTTP routes beside gRPC (MCP): `POST /mcp`.
    Http { method: &'a str, path: &'a str },
}

impl<'a> Request<'a> {
    fn of<B>(request: &'a http::Request<B>) -> Request<'a> {
        let grpc = request
            .headers()
            .get(http::header::CONTENT_TYPE)
            .is_some_and(|value| value.as_bytes().starts_with(b"application/grpc"));
        let path = first_chars(request.uri().path(), 128);
        if grpc {
            let path = path.trim_start_matches('/');
            let (service, method) = path.split_once('/').unwrap_or((path, ""));
            Request::Grpc {
                path,
                service,
                method,
            }
        } else {
            Request::Http {
                method: request.method().as_str(),
                path,
            }
        }
    }
}

/// The server span of `request` as a scope, when the process's subscriber is a recorder.
fn request_scope<B>(request: &http::Request<B>) -> Option<Scope> {
    tracing::dispatcher::get_default(|dispatch| {
        let recorder = dispatch.downcast_ref::<Recorder>()?;
        // No or a malformed header makes the span a root.
        let parent = header_trace_context(request.headers());
        let scope = match Request::of(request) {
            Request::Grpc {
                path,
                service,
                method,
            } => recorder.server_span(
                &GRPC_REQUEST,
                parent,
                || path.to_owned(),
                |attributes: &mut Attributes| {
                    attributes.push("rpc.system", Value::Text("grpc"));
                    attributes.push("rpc.service", Value::Text(service));
                    attributes.push("rpc.method", Value::Text(method));
                },
            ),
            Request::Http { method, path } => recorder.server_span(
                &HTTP_REQUEST,
                parent,
                || format!("{method} {path}"),
                |attributes: &mut Attributes| {
                    attributes.push("http.request.method", Value::Text(method));
                    attributes.push("url.path", Value::Text(path));
                },
            ),
        };
        Some(scope)
    })
}

fn request_span<B>(request: &http::Request<B>) -> tracing::Span {
    let span = match Request::of(request) {
        Request::Grpc {
            path,
            service,
            method,
        } => tracing::debug_span!(
            target: "toolgate::grpc",
            "grpc.request",
            otel.name = path,
            otel.kind = "server",
            rpc.system = "grpc",
            rpc.service = service,
            rpc.method = method,
        ),
        Request::Http { method, path } => tracing::debug_span!(
            target: "toolgate::http",
            "http.request",
            otel.name = format!("{method} {path}"),
            otel.kind = "server",
            http.request.method = method,
            url.path = path,
        ),
    };
    if span.is_disabled() {
        return span;
    }
    // No or a malformed header makes this span a root.
    if let Some(parent) = header_trace_context(request.headers()) {
        toolgate_core::trace::set_parent(&span, parent);
    }
    span
}

/// The first `count` characters of `text`, without copying it.
fn first_chars(text: &str, count: usize) -> &str {
    // No more bytes than `count` are no more characters than `count`.
    if text.len() <= count {
        return text;
    }
    text.char_indices()
        .nth(count)
        .map_or(text, |(end, _)| &text[..end])
}

/// The W3C trace context of `headers` (`traceparent`, `tracestate`), when they hold a valid
/// one.
pub(crate) fn header_trace_context(headers: &http::HeaderMap) -> Option<SpanContext> {
    // Names made once: a name given as text is parsed and checked on every lookup, which cost
    // more than the lookup of a request that carries no `traceparent`.
    static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");
    static TRACESTATE: http::HeaderName = http::HeaderName::from_static("tracestate");
    let traceparent = headers.get(&TRACEPARENT)?.to_str().ok()?;
    // Several `tracestate` lines are one list (W3C), joined with commas.
    let states: Vec<&str> = headers
        .get_all(&TRACESTATE)
        .iter()
        .filter_map(|value| value.to_str().ok())
        .collect();
    let tracestate = (!states.is_empty()).then(|| states.join(","));
    SpanContext::from_w3c(traceparent, tracestate.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_path_is_cut_at_a_character_count_never_inside_one() {
        assert_eq!(first_chars("/a/b", 128), "/a/b");
        let long = "x".repeat(200);
        assert_eq!(first_chars(&long, 128), &long[..128]);
        // 100 two-byte characters: 200 bytes, all of them kept.
        let wide = "é".repeat(100);
        assert_eq!(first_chars(&wide, 128), wide);
        let wider = "é".repeat(130);
        assert_eq!(first_chars(&wider, 128), "é".repeat(128));
    }

    #[test]
    fn tracestate_lines_are_one_list() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        );
        headers.append(
            "tracestate",
            http::HeaderValue::from_static("rojo=00f067aa0ba902b7"),
        );
        headers.append(
            "tracestate",
            http::HeaderValue::from_static("congo=t61rcWkgMzE"),
        );
        let context = header_trace_context(&headers).unwrap();
        assert_eq!(
            context.trace_state.as_deref(),
            Some("rojo=00f067aa0ba902b7,congo=t61rcWkgMzE")
        );
        headers.remove("traceparent");
        assert_eq!(header_trace_context(&headers), None);
    }
}
