//! The span recorder: a `tracing` layer that keeps what an exported span needs (ids, parent,
//! name, kind, status, times, attributes, links) in one small record per span, and queues the
//! record of each sampled span when it closes, for the exporter (`otlp.rs`) to encode in
//! batches.
//!
//! It replaces a general bridge to an OpenTelemetry SDK, whose per-span cost (a builder and
//! context per span, a context attached on every poll of an instrumented future, a second
//! conversion to the SDK's span data) was most of the gateway's added CPU with traces on. Here
//! a span costs one record in the registry's extensions, its fields and two clock reads.
//!
//! Special fields, as OpenTelemetry's `tracing` conventions name them: `otel.name` (the span's
//! name), `otel.kind` (`server`, `client`, `producer`, `consumer`, `internal`),
//! `otel.status_code` (`ok`, `error`) and `otel.status_message`. Every other field is an
//! attribute.

use std::borrow::Cow;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::SystemTime;

use toolgate_core::trace::{Access, ContextAccess, SpanContext, SpanId, TraceId};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Dispatch, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;

/// A span's kind (the OTLP enumeration's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Internal = 1,
    Server = 2,
    Client = 3,
    Producer = 4,
    Consumer = 5,
}

/// A span's status (the OTLP enumeration's values).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum StatusCode {
    Unset = 0,
    Ok = 1,
    Error = 2,
}

/// An attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Value {
    Text(String),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// One span, as recorded and, once closed, as exported.
#[derive(Debug)]
pub(crate) struct SpanRecord {
    pub(crate) context: SpanContext,
    /// The parent's span id (local or remote); `None` for a root.
    pub(crate) parent: Option<SpanId>,
    pub(crate) parent_remote: bool,
    pub(crate) name: Cow<'static, str>,
    pub(crate) kind: Kind,
    pub(crate) status: StatusCode,
    pub(crate) status_message: Option<String>,
    pub(crate) start: SystemTime,
    pub(crate) end: SystemTime,
    pub(crate) attributes: Vec<(&'static str, Value)>,
    pub(crate) links: Vec<SpanContext>,
}

impl SpanRecord {
    fn set(&mut self, key: &'static str, value: Value) {
        match key {
            "otel.name" => {
                self.name = Cow::Owned(match value {
                    Value::Text(text) => text,
                    other => format!("{other:?}"),
                });
            }
            "otel.kind" => {
                if let Value::Text(kind) = &value {
                    self.kind = match kind.to_ascii_lowercase().as_str() {
                        "server" => Kind::Server,
                        "client" => Kind::Client,
                        "producer" => Kind::Producer,
                        "consumer" => Kind::Consumer,
                        _ => Kind::Internal,
                    };
                }
            }
            "otel.status_code" => {
                if let Value::Text(code) = &value {
                    self.status = match code.to_ascii_lowercase().as_str() {
                        "ok" => StatusCode::Ok,
                        "error" => StatusCode::Error,
                        _ => StatusCode::Unset,
                    };
                }
            }
            "otel.status_message" => {
                if let Value::Text(message) = value {
                    self.status_message = Some(message);
                }
            }
            _ => match self.attributes.iter_mut().find(|(k, _)| *k == key) {
                Some((_, old)) => *old = value,
                None => self.attributes.push((key, value)),
            },
        }
    }
}

impl Visit for SpanRecord {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.set(field.name(), Value::Text(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field.name(), Value::Text(value.to_owned()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field.name(), Value::Int(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        let value =
            i64::try_from(value).map_or_else(|_| Value::Text(value.to_string()), Value::Int);
        self.set(field.name(), value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field.name(), Value::Bool(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(field.name(), Value::Float(value));
    }
}

/// The closed spans waiting for the exporter, bounded: past `capacity` a span is dropped and
/// counted rather than letting memory grow while the collector is away.
#[derive(Debug)]
pub(crate) struct SpanQueue {
    spans: Mutex<VecDeque<SpanRecord>>,
    capacity: usize,
    /// The queue's length at which the exporter is woken before its schedule.
    batch: usize,
    wake: tokio::sync::Notify,
    dropped: AtomicU64,
}

impl SpanQueue {
    pub(crate) fn new(capacity: usize, batch: usize) -> SpanQueue {
        SpanQueue {
            spans: Mutex::new(VecDeque::with_capacity(capacity.min(4096))),
            capacity,
            batch: batch.min(capacity).max(1),
            wake: tokio::sync::Notify::new(),
            dropped: AtomicU64::new(0),
        }
    }

    pub(crate) fn push(&self, span: SpanRecord) {
        let mut spans = self
            .spans
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        if spans.len() >= self.capacity {
            drop(spans);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        spans.push_back(span);
        let full = spans.len() == self.batch;
        drop(spans);
        if full {
            self.wake.notify_one();
        }
    }

    /// Takes up to `max` of the oldest spans.
    pub(crate) fn take(&self, max: usize) -> Vec<SpanRecord> {
        let mut spans = self
            .spans
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        let count = spans.len().min(max);
        spans.drain(..count).collect()
    }

    pub(crate) fn batch(&self) -> usize {
        self.batch
    }

    /// Resolves once a batch is waiting (or at once if one was signalled meanwhile).
    pub(crate) async fn full(&self) {
        self.wake.notified().await;
    }

    /// Spans dropped so far because the queue was full.
    pub(crate) fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// The recording layer.
#[derive(Debug, Clone)]
pub(crate) struct Recorder {
    queue: Arc<SpanQueue>,
}

impl Recorder {
    /// A recorder queueing closed spans on `queue`; installs the libraries' access to the
    /// records ([`toolgate_core::trace`]).
    pub(crate) fn new(queue: Arc<SpanQueue>) -> Recorder {
        toolgate_core::trace::install_access(ContextAccess(access));
        Recorder { queue }
    }
}

fn random_trace_id() -> TraceId {
    loop {
        let id: [u8; 16] = rand::random();
        if id != [0; 16] {
            return TraceId(id);
        }
    }
}

fn random_span_id() -> SpanId {
    loop {
        let id: [u8; 8] = rand::random();
        if id != [0; 8] {
            return SpanId(id);
        }
    }
}

impl<S> Layer<S> for Recorder
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        // The nearest recorded ancestor (the registry's parent, explicit or contextual).
        let parent = span.parent().and_then(|parent| {
            parent
                .extensions()
                .get::<SpanRecord>()
                .map(|record| record.context.clone())
        });
        let (trace_id, parent_id, sampled, trace_state) = match parent {
            Some(parent) => (
                parent.trace_id,
                Some(parent.span_id),
                parent.sampled,
                parent.trace_state,
            ),
            None => (random_trace_id(), None, true, None),
        };
        let now = SystemTime::now();
        let metadata = attrs.metadata();
        let mut record = SpanRecord {
            context: SpanContext {
                trace_id,
                span_id: random_span_id(),
                sampled,
                trace_state,
                remote: false,
            },
            parent: parent_id,
            parent_remote: false,
            name: Cow::Borrowed(metadata.name()),
            kind: Kind::Internal,
            status: StatusCode::Unset,
            status_message: None,
            start: now,
            end: now,
            attributes: Vec::with_capacity(metadata.fields().len()),
            links: Vec::new(),
        };
        attrs.record(&mut record);
        span.extensions_mut().insert(record);
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id)
            && let Some(record) = span.extensions_mut().get_mut::<SpanRecord>()
        {
            values.record(record);
        }
    }

    fn on_follows_from(&self, id: &Id, follows: &Id, ctx: Context<'_, S>) {
        let Some(other) = ctx.span(follows).and_then(|span| {
            span.extensions()
                .get::<SpanRecord>()
                .map(|r| r.context.clone())
        }) else {
            return;
        };
        if let Some(span) = ctx.span(id)
            && let Some(record) = span.extensions_mut().get_mut::<SpanRecord>()
        {
            record.links.push(other);
        }
    }

    fn on_close(&self, id: Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(&id) else {
            return;
        };
        let Some(mut record) = span.extensions_mut().remove::<SpanRecord>() else {
            return;
        };
        if record.context.sampled {
            record.end = SystemTime::now();
            self.queue.push(record);
        }
    }
}

/// The libraries' access to a span's record, through the registry of the dispatcher the span
/// belongs to (nothing when that subscriber is not a registry or does not record the span).
fn access(dispatch: &Dispatch, id: &Id, what: Access<'_>) {
    let Some(registry) = dispatch.downcast_ref::<tracing_subscriber::Registry>() else {
        return;
    };
    let Some(span) = registry.span(id) else {
        return;
    };
    if let Access::Read(context) = what {
        *context = span
            .extensions()
            .get::<SpanRecord>()
            .map(|record| record.context.clone());
        return;
    }
    let mut extensions = span.extensions_mut();
    let Some(record) = extensions.get_mut::<SpanRecord>() else {
        return;
    };
    match what {
        Access::Read(_) => {}
        Access::SetParent(parent) => {
            record.context.trace_id = parent.trace_id;
            record.context.sampled = parent.sampled;
            record.context.trace_state = parent.trace_state;
            record.parent = Some(parent.span_id);
            record.parent_remote = parent.remote;
        }
        Access::Link(other) => record.links.push(other),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt as _;

    fn recorded(queue: &Arc<SpanQueue>, work: impl FnOnce()) -> Vec<SpanRecord> {
        let subscriber = tracing_subscriber::registry().with(Recorder::new(Arc::clone(queue)));
        tracing::subscriber::with_default(subscriber, work);
        queue.take(usize::MAX)
    }

    fn attribute<'a>(span: &'a SpanRecord, key: &str) -> Option<&'a Value> {
        span.attributes
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v)
    }

    #[test]
    fn spans_keep_their_tree_fields_and_special_fields() {
        let queue = Arc::new(SpanQueue::new(16, 8));
        let spans = recorded(&queue, || {
            let outer = tracing::info_span!(
                "grpc.request",
                otel.name = "svc/Method",
                otel.kind = "server",
                rpc.system = "grpc",
                late = tracing::field::Empty,
            );
            let _entered = outer.enter();
            outer.record("late", 7_u64);
            let inner = tracing::info_span!("child", otel.status_code = tracing::field::Empty);
            inner.record("otel.status_code", "error");
            drop(inner);
        });
        assert_eq!(spans.len(), 2, "{spans:?}");
        let (inner, outer) = (&spans[0], &spans[1]);
        assert_eq!(outer.name, "svc/Method");
        assert_eq!(outer.kind, Kind::Server);
        assert_eq!(outer.parent, None);
        assert_eq!(
            attribute(outer, "rpc.system"),
            Some(&Value::Text("grpc".into()))
        );
        assert_eq!(attribute(outer, "late"), Some(&Value::Int(7)));
        assert_eq!(attribute(outer, "otel.kind"), None);
        assert_eq!(inner.name, "child");
        assert_eq!(inner.kind, Kind::Internal);
        assert_eq!(inner.status, StatusCode::Error);
        assert_eq!(inner.context.trace_id, outer.context.trace_id);
        assert_eq!(inner.parent, Some(outer.context.span_id));
        assert_ne!(inner.context.span_id, outer.context.span_id);
        assert!(inner.end >= inner.start && outer.end >= inner.end);
    }

    #[test]
    fn a_remote_parent_joins_its_trace_and_unsampled_traces_are_not_queued() {
        const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
        let queue = Arc::new(SpanQueue::new(16, 8));
        let spans = recorded(&queue, || {
            let sampled = SpanContext::from_w3c(
                &format!("00-{TRACE}-00f067aa0ba902b7-01"),
                Some("congo=t61"),
            )
            .unwrap();
            let root = tracing::info_span!("root");
            toolgate_core::trace::set_parent(&root, sampled);
            let child = root.in_scope(|| {
                let child = tracing::info_span!("child");
                let read = toolgate_core::trace::span_context(&child).unwrap();
                assert_eq!(read.trace_id.to_string(), TRACE);
                assert_eq!(read.trace_state.as_deref(), Some("congo=t61"));
                assert_eq!(
                    toolgate_core::trace::current().unwrap().span_id,
                    toolgate_core::trace::span_context(&root).unwrap().span_id
                );
                child
            });
            let linked = tracing::info_span!("decision");
            toolgate_core::trace::add_link(
                &linked,
                toolgate_core::trace::span_context(&child).unwrap(),
            );
            drop((child, root, linked));
            let unsampled =
                SpanContext::from_w3c(&format!("00-{TRACE}-00f067aa0ba902b7-00"), None).unwrap();
            let quiet = tracing::info_span!("quiet");
            toolgate_core::trace::set_parent(&quiet, unsampled);
            let read = toolgate_core::trace::span_context(&quiet).unwrap();
            assert!(!read.sampled);
            assert_eq!(read.traceparent().split('-').nth(1), Some(TRACE));
        });
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_ref()).collect();
        assert_eq!(names, ["child", "root", "decision"]);
        let (child, root, decision) = (&spans[0], &spans[1], &spans[2]);
        assert_eq!(
            root.parent.map(|id| id.to_string()).as_deref(),
            Some("00f067aa0ba902b7")
        );
        assert!(root.parent_remote);
        assert_eq!(child.parent, Some(root.context.span_id));
        assert_eq!(decision.links.len(), 1);
        assert_eq!(decision.links[0].span_id, child.context.span_id);
        assert_ne!(decision.context.trace_id, root.context.trace_id);
    }

    #[test]
    fn a_full_queue_drops_and_counts() {
        let queue = Arc::new(SpanQueue::new(2, 2));
        let spans = recorded(&queue, || {
            for _ in 0..5 {
                drop(tracing::info_span!("s"));
            }
        });
        assert_eq!(spans.len(), 2);
        assert_eq!(queue.dropped(), 3);
    }
}
