//! The span recorder: the process's `tracing` subscriber while traces are on. It keeps what
//! an exported span needs (ids, parent, name, kind, status, times, attributes, links) in one
//! small record per span, encodes each sampled span into the export queue when it closes,
//! for the exporter (`otlp.rs`) to send in batches, and hands every event to the log
//! subscriber.
//!
//! It replaces a general bridge to an OpenTelemetry SDK (a builder and context per span, a
//! context attached on every poll, a second conversion to the SDK's span data) and then a
//! layer over `tracing-subscriber`'s registry (a registry lookup and a per-layer filter check
//! for each layer on every enter and exit): each was most of what traces added to a call. Here
//! a span costs one slot, its fields and two clock reads; entering it, a push on a stack.
//!
//! Special fields, as OpenTelemetry's `tracing` conventions name them: `otel.name` (the span's
//! name), `otel.kind` (`server`, `client`, `producer`, `consumer`, `internal`),
//! `otel.status_code` (`ok`, `error`) and `otel.status_message`. Every other field is an
//! attribute.

use std::borrow::Cow;
use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::SystemTime;

use slab::Slab;
use toolgate_core::trace::{
    Access, Attribute, ContextAccess, Leaf, LeafValue, Scope, SpanContext, SpanId, TraceId,
};
use tracing::field::{Field, Visit};
use tracing::level_filters::LevelFilter;
use tracing::span::{Attributes, Id, Record};
use tracing_core::span::Current;

use super::Sampler;
use super::otlp::{Attributes as OtlpAttributes, Spans, Value, put_framed_span};
use tracing::subscriber::Interest;
use tracing::{Dispatch, Event, Metadata, Subscriber};

/// The room a span's record makes for `count` attributes at once: the usual one (a name and a
/// short value) each, and as much again as `Attributes::push` reserves for one before writing
/// it, so a span with the attributes it declares never grows its record (a longer one does).
fn attribute_room(count: usize) -> usize {
    count * 48 + 96
}

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
    pub(crate) attributes: OtlpAttributes,
    pub(crate) links: Vec<SpanContext>,
}

impl SpanRecord {
    /// The record of a span of this process starting at `start` in the trace `trace_id`, with
    /// a span id of its own, its parent's (and whether that one is remote), no status and no
    /// links yet; it ends when it starts until it closes.
    fn open(
        trace: (TraceId, bool, Option<Arc<str>>),
        parent: Option<(SpanId, bool)>,
        name: Cow<'static, str>,
        kind: Kind,
        start: SystemTime,
        attributes: OtlpAttributes,
    ) -> SpanRecord {
        let (trace_id, sampled, trace_state) = trace;
        SpanRecord {
            context: SpanContext {
                trace_id,
                span_id: random_span_id(),
                sampled,
                trace_state,
                remote: false,
            },
            parent: parent.map(|(id, _)| id),
            parent_remote: parent.is_some_and(|(_, remote)| remote),
            name,
            kind,
            status: StatusCode::Unset,
            status_message: None,
            start,
            end: start,
            attributes,
            links: Vec::new(),
        }
    }

    /// Writes attributes given by [`toolgate_core::trace::annotate`] (keys new to the span).
    fn annotate(&mut self, attributes: &[(&'static str, Attribute<'_>)]) {
        for (key, value) in attributes {
            let value = match *value {
                Attribute::Text(text) => Value::Text(text),
                Attribute::Int(int) => Value::Int(int),
                Attribute::Bool(bool) => Value::Bool(bool),
            };
            if !self.set_special(key, value) {
                self.attributes.push(key, value);
            }
        }
    }

    /// Sets one of the special `otel.*` fields named `key`; false for any other name, which is
    /// then an attribute.
    fn set_special(&mut self, key: &str, value: Value<'_>) -> bool {
        let Some(special) = key.strip_prefix("otel.") else {
            return false;
        };
        let text = || match value {
            Value::Text(text) => Cow::Borrowed(text),
            Value::Debug(value) => Cow::Owned(format!("{value:?}")),
            Value::Int(int) => Cow::Owned(int.to_string()),
            Value::Float(float) => Cow::Owned(float.to_string()),
            Value::Bool(bool) => Cow::Owned(bool.to_string()),
        };
        match special {
            "name" => self.name = Cow::Owned(text().into_owned()),
            "kind" => {
                let kind = text();
                let is = |name: &str| kind.eq_ignore_ascii_case(name);
                self.kind = if is("server") {
                    Kind::Server
                } else if is("client") {
                    Kind::Client
                } else if is("producer") {
                    Kind::Producer
                } else if is("consumer") {
                    Kind::Consumer
                } else {
                    Kind::Internal
                };
            }
            "status_code" => {
                let code = text();
                self.status = if code.eq_ignore_ascii_case("ok") {
                    StatusCode::Ok
                } else if code.eq_ignore_ascii_case("error") {
                    StatusCode::Error
                } else {
                    StatusCode::Unset
                };
            }
            "status_message" => self.status_message = Some(text().into_owned()),
            _ => return false,
        }
        true
    }
}

/// Writes a span's fields into its record, as it is created (`fresh`) or later; a later
/// field's `Debug` comes formatted (`formatted`, by field index).
struct Fields<'a> {
    record: &'a mut SpanRecord,
    /// The indexes (below 64) of the span's fields its attributes hold.
    recorded: &'a mut u64,
    fresh: bool,
    formatted: &'a [(usize, String)],
}

/// The fields of a record that [`Fields`] writes through `Debug`, formatted; the others are
/// left alone.
#[derive(Default)]
struct Formatted(Vec<(usize, String)>);

impl Visit for Formatted {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.push((field.index(), format!("{value:?}")));
    }

    fn record_str(&mut self, _: &Field, _: &str) {}

    fn record_i64(&mut self, _: &Field, _: i64) {}

    fn record_u64(&mut self, _: &Field, _: u64) {}

    fn record_bool(&mut self, _: &Field, _: bool) {}

    fn record_f64(&mut self, _: &Field, _: f64) {}
}

impl Fields<'_> {
    fn put(&mut self, field: &Field, value: Value<'_>) {
        let key = field.name();
        if self.record.set_special(key, value) {
            return;
        }
        let bit = u32::try_from(field.index())
            .ok()
            .and_then(|index| 1_u64.checked_shl(index));
        let attributes = &mut self.record.attributes;
        match bit {
            // A callsite names each field once: one being created, or not written yet, is new.
            Some(bit) if self.fresh || *self.recorded & bit == 0 => {
                attributes.push(key, value);
                *self.recorded |= bit;
            }
            _ if self.fresh => attributes.push(key, value),
            _ => attributes.set(key, value),
        }
    }
}

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let formatted = self.formatted;
        match formatted.iter().find(|(index, _)| *index == field.index()) {
            Some((_, text)) => self.put(field, Value::Text(text)),
            None => self.put(field, Value::Debug(value)),
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Text(value));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::Int(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        match i64::try_from(value) {
            Ok(value) => self.put(field, Value::Int(value)),
            Err(_) => self.put(field, Value::Text(&value.to_string())),
        }
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::Float(value));
    }
}

/// The closed spans waiting for the exporter, bounded: past `capacity` a span is dropped and
/// counted rather than letting memory grow while the collector is away.
///
/// The spans are kept as the bytes a request carries ([`put_framed_span`]), encoded straight
/// into one buffer as they are pushed: a batch is taken as a whole, without an allocation per
/// span made on a worker thread and freed on the exporter's (jemalloc sends each such free
/// back to the arena it came from, under the arena's lock).
#[derive(Debug)]
pub(crate) struct SpanQueue {
    waiting: Mutex<Waiting>,
    capacity: usize,
    /// The queue's length at which the exporter is woken before its schedule.
    batch: usize,
    wake: tokio::sync::Notify,
    dropped: AtomicU64,
}

/// The queue's spans: their bytes, and each one's size there, oldest first.
#[derive(Debug, Default)]
struct Waiting {
    bytes: Vec<u8>,
    sizes: VecDeque<usize>,
}

impl SpanQueue {
    pub(crate) fn new(capacity: usize, batch: usize) -> SpanQueue {
        SpanQueue {
            waiting: Mutex::new(Waiting {
                bytes: Vec::new(),
                sizes: VecDeque::with_capacity(capacity.min(4096)),
            }),
            capacity,
            batch: batch.min(capacity).max(1),
            wake: tokio::sync::Notify::new(),
            dropped: AtomicU64::new(0),
        }
    }

    fn waiting(&self) -> std::sync::MutexGuard<'_, Waiting> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues a closed span (its record is dropped once the queue's lock is let go).
    pub(crate) fn push(&self, span: SpanRecord) {
        let mut waiting = self.waiting();
        if waiting.sizes.len() >= self.capacity {
            drop(waiting);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let size = put_framed_span(&mut waiting.bytes, &span);
        waiting.sizes.push_back(size);
        let full = waiting.sizes.len() == self.batch;
        drop(waiting);
        drop(span);
        if full {
            self.wake.notify_one();
        }
    }

    /// Takes up to `max` of the oldest spans.
    pub(crate) fn take(&self, max: usize) -> Spans {
        let mut waiting = self.waiting();
        let count = waiting.sizes.len().min(max);
        if count == 0 {
            return Spans::default();
        }
        // The buffer goes with the batch; the spans left, if any, move to a new one as large.
        let cut: usize = waiting.sizes.drain(..count).sum();
        let mut left = Vec::with_capacity(waiting.bytes.capacity());
        left.extend_from_slice(&waiting.bytes[cut..]);
        let mut bytes = std::mem::replace(&mut waiting.bytes, left);
        drop(waiting);
        bytes.truncate(cut);
        Spans { bytes, count }
    }

    pub(crate) fn batch(&self) -> usize {
        self.batch
    }

    /// The spans waiting.
    pub(crate) fn len(&self) -> usize {
        self.waiting().sizes.len()
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

/// The recording subscriber: toolgate's spans, kept in its own tables, and every event passed
/// to the log subscriber.
///
/// A span is one slot in one of [`SHARDS`] locked tables (picked by its random span id, so
/// two threads rarely want the same lock, and each held only to read or write one record), and
/// entering it is a push on the thread's own stack: no registry lookup, no per-layer filter
/// check and no reference count on every poll of an instrumented future, which was most of
/// what traces cost a call through a `tracing-subscriber` registry. No code outside the
/// recorder runs while a table is locked (a field's `Debug` is formatted before), so a span
/// made while formatting one cannot deadlock.
///
/// Spans recorded: those of toolgate's own crates (target `toolgate*`), at debug level and
/// above (toolgate writes no span at trace level), so a library's span can carry nothing
/// toolgate's do not. Other spans are disabled while traces are on: log lines then carry the
/// trace and span ids (JSON) rather than the names and fields of library spans around them.
pub(crate) struct Recorder {
    tables: [Mutex<Slab<Node>>; SHARDS],
    /// Tells this recorder's entries on the threads' stacks from another's (tests make
    /// several).
    instance: u64,
    queue: Arc<SpanQueue>,
    /// Which traces are sampled; an unsampled span keeps its ids only.
    sampler: Sampler,
    /// Writes the log lines: its own filter decides which events, and it never sees a span.
    logs: Box<dyn Subscriber + Send + Sync>,
}

/// How many tables the open spans are spread over.
const SHARDS: usize = 16;
/// The bits of a span's `Id` naming its table (the rest is its slot, plus one).
const SHARD_BITS: u32 = 4;

thread_local! {
    /// The thread's entered spans, the current one last, each with its recorder's instance
    /// and the scope it was entered in (`toolgate_core::trace::scope_of`): a span made as a
    /// scope (the server span, the call's) is entered by setting a thread-local cell for each
    /// poll of its work, rather than by a push here through `tracing`.
    static ENTERED: RefCell<Vec<Entered>> = const { RefCell::new(Vec::new()) };
}

/// A span entered on a thread.
struct Entered {
    instance: u64,
    id: Id,
    /// The raw id of the scope the thread was in then, or 0.
    scope: u64,
}

toolgate_core::span_site!(pub(crate) GRPC_REQUEST, "grpc.request", "toolgate::grpc");
toolgate_core::span_site!(pub(crate) HTTP_REQUEST, "http.request", "toolgate::http");

static INSTANCES: AtomicU64 = AtomicU64::new(0);

impl fmt::Debug for Recorder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recorder")
            .field("queue", &self.queue)
            .finish_non_exhaustive()
    }
}

/// One open span.
struct Node {
    metadata: &'static Metadata<'static>,
    /// Handles to the span (`Span` values and clones); the span closes when the last goes.
    handles: usize,
    record: SpanRecord,
    /// Which of the span's fields `record` holds (see [`Fields`]).
    recorded: u64,
}

impl Recorder {
    /// A recorder queueing closed spans on `queue` and passing events to `logs`; installs the
    /// libraries' access to the records ([`toolgate_core::trace`]).
    pub(crate) fn new(queue: Arc<SpanQueue>, logs: Box<dyn Subscriber + Send + Sync>) -> Recorder {
        toolgate_core::trace::install_access(ContextAccess {
            span: access,
            current: current_context,
            leaf: record_leaf,
            open: open_scope,
            scope: access_scope,
            close: close_scope,
        });
        Recorder {
            tables: std::array::from_fn(|_| Mutex::new(Slab::new())),
            instance: INSTANCES.fetch_add(1, Ordering::Relaxed),
            queue,
            sampler: Sampler::default(),
            logs,
        }
    }

    /// This recorder, sampling traces with `sampler` (`parentbased_always_on` otherwise).
    pub(crate) fn with_sampler(mut self, sampler: Sampler) -> Recorder {
        self.sampler = sampler;
        self
    }

    fn records(metadata: &Metadata<'_>) -> bool {
        metadata.is_span() && metadata.target().starts_with("toolgate")
    }

    /// The table and slot of span `id`.
    fn locate(id: &Id) -> Option<(usize, usize)> {
        let id = id.into_u64();
        let shard = usize::try_from(id & ((1 << SHARD_BITS) - 1)).ok()?;
        let slot = usize::try_from((id >> SHARD_BITS).checked_sub(1)?).ok()?;
        Some((shard, slot))
    }

    /// The table `shard`, locked.
    fn table(&self, shard: usize) -> std::sync::MutexGuard<'_, Slab<Node>> {
        self.tables[shard]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` on the open span `id`, its table locked.
    fn with_node<R>(&self, id: &Id, f: impl FnOnce(&mut Node) -> R) -> Option<R> {
        let (shard, slot) = Recorder::locate(id)?;
        self.table(shard).get_mut(slot).map(f)
    }

    fn context(&self, id: &Id) -> Option<SpanContext> {
        self.with_node(id, |node| node.record.context.clone())
    }

    /// Encodes and queues `leaf`, ended at `end`, as a span that closes does.
    fn leaf(&self, leaf: &Leaf, end: SystemTime) {
        let parent = &leaf.parent;
        // Room as `new_span` makes it for a span's fields (`push` reserves more for a longer one).
        let mut attributes =
            OtlpAttributes::with_capacity(attribute_room(leaf.attributes().count()));
        for (key, value) in leaf.attributes() {
            match value {
                LeafValue::Text(text) => attributes.push(key, Value::Text(text)),
                LeafValue::Owned(text) => attributes.push(key, Value::Text(text)),
                LeafValue::Int(int) => attributes.push(key, Value::Int(*int)),
            }
        }
        let mut record = SpanRecord::open(
            (parent.trace_id, true, parent.trace_state.clone()),
            Some((parent.span_id, parent.remote)),
            Cow::Borrowed(leaf.name),
            Kind::Internal,
            leaf.start,
            attributes,
        );
        record.end = end;
        self.queue.push(record);
    }

    /// The current span: the last this recorder's entered on the thread, unless the thread
    /// has entered a scope of this recorder's since.
    fn current(&self) -> Option<Id> {
        self.innermost().map(|(id, _)| id)
    }

    /// The current span when it is a scope's (no span entered since the thread entered the
    /// scope): a new handle to it, for a task to run in.
    pub(crate) fn current_scope(&self) -> Option<Scope> {
        match self.innermost()? {
            (id, true) => Some(Scope::adopt(self.instance, self.clone_span(&id).into_u64())),
            (_, false) => None,
        }
    }

    /// The current span, and whether it is a scope's.
    fn innermost(&self) -> Option<(Id, bool)> {
        // A thread's stack is gone only while the thread ends: nothing is current then.
        let scope = toolgate_core::trace::scope_of(self.instance);
        let entered = ENTERED
            .try_with(|entered| {
                entered
                    .borrow()
                    .iter()
                    .rev()
                    .find(|entered| entered.instance == self.instance)
                    .map(|entered| (entered.id.clone(), entered.scope))
            })
            .ok()
            .flatten();
        match (entered, scope) {
            // Entered in that scope, or with no scope around.
            (Some((id, at)), scope) if scope.is_none_or(|scope| scope == at) => Some((id, false)),
            // The scope was entered after the span.
            (_, scope) => scope.map(|scope| (Id::from_u64(scope), true)),
        }
    }

    /// Starts a server span whose `tracing` call site is `site` ([`GRPC_REQUEST`] or
    /// [`HTTP_REQUEST`]) without a trip through `tracing`: no fields visited, no special
    /// fields parsed, and entered per poll as a scope (`scope.rs`) rather than on the stack of
    /// entered spans. Its parent is the caller's `parent` (a remote context) or none; `name`
    /// and `attributes` are asked for only when its trace is sampled. It closes as any span
    /// does, when the last handle to it goes ([`Subscriber::try_close`]); the caller holds the
    /// first, the scope returned.
    pub(crate) fn server_span(
        &self,
        site: &'static Metadata<'static>,
        parent: Option<SpanContext>,
        name: impl FnOnce() -> String,
        attributes: impl FnOnce(&mut OtlpAttributes),
    ) -> Scope {
        let (trace_id, parent, sampled, trace_state) = match parent {
            Some(parent) => (
                parent.trace_id,
                Some((parent.span_id, parent.remote)),
                self.sampler.follows(&parent),
                parent.trace_state,
            ),
            None => {
                let trace_id = random_trace_id();
                (trace_id, None, self.sampler.samples(&trace_id), None)
            }
        };
        let now = SystemTime::now();
        let (name, fields) = if sampled {
            let name = name();
            // Room as `new_span` makes it, for the few attributes a server span has.
            let mut fields = OtlpAttributes::with_capacity(attribute_room(4));
            attributes(&mut fields);
            (Cow::Owned(name), fields)
        } else {
            (Cow::Borrowed(site.name()), OtlpAttributes::with_capacity(0))
        };
        self.insert_scope(
            site,
            SpanRecord::open(
                (trace_id, sampled, trace_state),
                parent,
                name,
                Kind::Server,
                now,
                fields,
            ),
        )
    }

    /// Opens a span whose `tracing` call site is `site` as a scope (`toolgate_core::trace::Span`):
    /// a child of the current span (a root when there is none), of kind internal, with
    /// `attributes` written straight into its record when its trace is sampled. It closes as
    /// any span does, when the last handle to it goes; the caller holds the first, the scope
    /// returned.
    fn child_scope(
        &self,
        site: &'static Metadata<'static>,
        attributes: &[(&'static str, Attribute<'_>)],
    ) -> Scope {
        let (trace_id, parent, sampled, trace_state) =
            match self.current().and_then(|parent| self.context(&parent)) {
                Some(parent) => (
                    parent.trace_id,
                    Some((parent.span_id, false)),
                    parent.sampled,
                    parent.trace_state,
                ),
                None => {
                    let trace_id = random_trace_id();
                    (trace_id, None, self.sampler.samples(&trace_id), None)
                }
            };
        // Room as `new_span` makes it, for the attributes the site lists (those given later
        // too: growing the record as they come costs more than the room).
        let capacity = if sampled {
            attribute_room(attributes.len().max(site.fields().len()))
        } else {
            0
        };
        let mut record = SpanRecord::open(
            (trace_id, sampled, trace_state),
            parent,
            Cow::Borrowed(site.name()),
            Kind::Internal,
            SystemTime::now(),
            OtlpAttributes::with_capacity(capacity),
        );
        // An unsampled span keeps no attributes (see `new_span`).
        if sampled {
            record.annotate(attributes);
        }
        self.insert_scope(site, record)
    }

    /// Keeps the `record` of a span made for a scope, whose call site is `site`; the first
    /// handle to it.
    fn insert_scope(&self, site: &'static Metadata<'static>, record: SpanRecord) -> Scope {
        let id = self.insert(Node {
            metadata: site,
            handles: 1,
            record,
            recorded: 0,
        });
        Scope::adopt(self.instance, id.into_u64())
    }

    /// Keeps an open span's `node`, in the table its span id picks; its `Id`.
    fn insert(&self, node: Node) -> Id {
        let shard = usize::from(node.record.context.span_id.0[0]) % SHARDS;
        let slot = self.table(shard).insert(node);
        let id = u64::try_from(slot)
            .ok()
            .and_then(|slot| slot.checked_add(1))
            .and_then(|slot| slot.checked_mul(1 << SHARD_BITS))
            .unwrap_or(u64::MAX);
        Id::from_u64(id | u64::try_from(shard).unwrap_or(0))
    }
}

thread_local! {
    /// The thread's id generator: SplitMix64, seeded from the operating system's randomness
    /// on first use. Ids need to be unique and unpredictable enough not to collide across
    /// processes, not secret; this costs a few instructions an id, where a cryptographic
    /// generator cost a hundred.
    static IDS: Cell<u64> = Cell::new(rand::random());
}

fn next_id() -> u64 {
    IDS.with(|state| {
        let next = state.get().wrapping_add(0x9e37_79b9_7f4a_7c15);
        state.set(next);
        let mut z = next;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    })
}

fn random_trace_id() -> TraceId {
    loop {
        let mut id = [0; 16];
        id[..8].copy_from_slice(&next_id().to_le_bytes());
        id[8..].copy_from_slice(&next_id().to_le_bytes());
        if id != [0; 16] {
            return TraceId(id);
        }
    }
}

fn random_span_id() -> SpanId {
    loop {
        let id = next_id().to_le_bytes();
        if id != [0; 8] {
            return SpanId(id);
        }
    }
}

impl Subscriber for Recorder {
    fn on_register_dispatch(&self, subscriber: &Dispatch) {
        self.logs.on_register_dispatch(subscriber);
    }

    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> Interest {
        if metadata.is_span() {
            if Recorder::records(metadata) {
                Interest::always()
            } else {
                Interest::never()
            }
        } else {
            self.logs.register_callsite(metadata)
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        if metadata.is_span() {
            Recorder::records(metadata)
        } else {
            self.logs.enabled(metadata)
        }
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        // toolgate's spans are at debug level or above.
        let logs = self.logs.max_level_hint().unwrap_or(LevelFilter::TRACE);
        Some(logs.max(LevelFilter::DEBUG))
    }

    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        // The parent: explicit, or the current span; a root otherwise (or when the parent is
        // not one of ours).
        let parent = if attrs.is_root() {
            None
        } else if let Some(parent) = attrs.parent() {
            self.context(parent)
        } else {
            self.current().and_then(|parent| self.context(&parent))
        };
        let (trace_id, parent_id, sampled, trace_state) = match parent {
            Some(parent) => (
                parent.trace_id,
                Some(parent.span_id),
                parent.sampled,
                parent.trace_state,
            ),
            None => {
                let trace_id = random_trace_id();
                (trace_id, None, self.sampler.samples(&trace_id), None)
            }
        };
        let metadata = attrs.metadata();
        let mut record = SpanRecord::open(
            (trace_id, sampled, trace_state),
            parent_id.map(|id| (id, false)),
            Cow::Borrowed(metadata.name()),
            Kind::Internal,
            SystemTime::now(),
            OtlpAttributes::with_capacity(attribute_room(metadata.fields().len())),
        );
        let mut recorded = 0;
        // Fields are written before any table is locked: a `Debug` may do anything. A span
        // of an unsampled trace is never exported: its fields are not kept. A root keeps its
        // fields either way, as a remote parent given next may still sample it.
        if sampled || parent_id.is_none() {
            attrs.record(&mut Fields {
                record: &mut record,
                recorded: &mut recorded,
                fresh: true,
                formatted: &[],
            });
        }
        self.insert(Node {
            metadata,
            handles: 1,
            record,
            recorded,
        })
    }

    fn record(&self, span: &Id, values: &Record<'_>) {
        // `Debug` values are formatted first, outside the table's lock.
        let mut formatted = Formatted::default();
        values.record(&mut formatted);
        self.with_node(span, |node| {
            // An unsampled span keeps no fields (see `new_span`).
            if !node.record.context.sampled {
                return;
            }
            values.record(&mut Fields {
                record: &mut node.record,
                recorded: &mut node.recorded,
                fresh: false,
                formatted: &formatted.0,
            });
        });
    }

    fn record_follows_from(&self, span: &Id, follows: &Id) {
        if let Some(other) = self.context(follows) {
            self.with_node(span, |node| node.record.links.push(other));
        }
    }

    fn event_enabled(&self, event: &Event<'_>) -> bool {
        self.logs.event_enabled(event)
    }

    fn event(&self, event: &Event<'_>) {
        self.logs.event(event);
    }

    fn enter(&self, span: &Id) {
        let scope = toolgate_core::trace::scope_of(self.instance).unwrap_or(0);
        let _ = ENTERED.try_with(|entered| {
            entered.borrow_mut().push(Entered {
                instance: self.instance,
                id: span.clone(),
                scope,
            });
        });
    }

    fn exit(&self, span: &Id) {
        let _ = ENTERED.try_with(|entered| {
            let mut entered = entered.borrow_mut();
            if let Some(at) = entered
                .iter()
                .rposition(|entered| entered.instance == self.instance && entered.id == *span)
            {
                // Spans exit in the reverse order of entering, all but always: the last entry
                // is taken off without a move of the others.
                if at + 1 == entered.len() {
                    entered.pop();
                } else {
                    entered.remove(at);
                }
            }
        });
    }

    fn current_span(&self) -> Current {
        match self
            .current()
            .and_then(|id| Some((self.with_node(&id, |node| node.metadata)?, id)))
        {
            Some((metadata, id)) => Current::new(id, metadata),
            None => Current::none(),
        }
    }

    fn clone_span(&self, span: &Id) -> Id {
        self.with_node(span, |node| node.handles += 1);
        span.clone()
    }

    fn try_close(&self, span: Id) -> bool {
        let Some((shard, slot)) = Recorder::locate(&span) else {
            return false;
        };
        let mut table = self.table(shard);
        let Some(node) = table.get_mut(slot) else {
            return false;
        };
        node.handles -= 1;
        if node.handles > 0 {
            return false;
        }
        let mut record = table.remove(slot).record;
        drop(table);
        if record.context.sampled {
            record.end = SystemTime::now();
            self.queue.push(record);
        }
        true
    }
}

/// The context of the current span of `dispatch`, when it is a recorder that records one.
fn current_context(dispatch: &Dispatch) -> Option<SpanContext> {
    let recorder = dispatch.downcast_ref::<Recorder>()?;
    recorder.context(&recorder.current()?)
}

/// Records a leaf span through the recorder `dispatch` is (nothing when it is not one).
fn record_leaf(dispatch: &Dispatch, leaf: &Leaf, end: SystemTime) {
    if let Some(recorder) = dispatch.downcast_ref::<Recorder>() {
        recorder.leaf(leaf, end);
    }
}

/// The libraries' access to a span's record, through the recorder the span belongs to
/// (nothing when the dispatcher is not a recorder or the span is not recorded).
fn access(dispatch: &Dispatch, id: &Id, what: Access<'_>) {
    if let Some(recorder) = dispatch.downcast_ref::<Recorder>() {
        recorder.apply(id, what);
    }
}

/// The recorder `dispatch` is, when the scope's span is its.
fn scope_recorder<'a>(dispatch: &'a Dispatch, scope: &Scope) -> Option<&'a Recorder> {
    dispatch
        .downcast_ref::<Recorder>()
        .filter(|recorder| recorder.instance == scope.instance())
}

/// Opens a scope's span through the recorder `dispatch` is (`None` when it is not one).
fn open_scope(
    dispatch: &Dispatch,
    site: &'static Metadata<'static>,
    attributes: &[(&'static str, Attribute<'_>)],
) -> Option<Scope> {
    Some(
        dispatch
            .downcast_ref::<Recorder>()?
            .child_scope(site, attributes),
    )
}

/// The libraries' access to a scope's span.
fn access_scope(dispatch: &Dispatch, scope: &Scope, what: Access<'_>) {
    if let Some(recorder) = scope_recorder(dispatch, scope) {
        recorder.apply(&Id::from_u64(scope.id()), what);
    }
}

/// One handle to a scope's span gone.
fn close_scope(dispatch: &Dispatch, scope: &Scope) {
    if let Some(recorder) = scope_recorder(dispatch, scope) {
        recorder.try_close(Id::from_u64(scope.id()));
    }
}

impl Recorder {
    /// Carries out `what` on the span `id`.
    fn apply(&self, id: &Id, what: Access<'_>) {
        match what {
            Access::Read(context) => *context = self.context(id),
            Access::SetParent(parent) => {
                self.with_node(id, |node| {
                    let record = &mut node.record;
                    record.context.trace_id = parent.trace_id;
                    record.context.sampled = self.sampler.follows(&parent);
                    record.context.trace_state = parent.trace_state;
                    record.parent = Some(parent.span_id);
                    record.parent_remote = parent.remote;
                });
            }
            Access::Link(other) => {
                self.with_node(id, |node| node.record.links.push(other));
            }
            Access::Annotate {
                attributes,
                written,
            } => {
                self.with_node(id, |node| {
                    // An unsampled span keeps no fields (see `new_span`).
                    if node.record.context.sampled {
                        node.record.annotate(attributes);
                    }
                });
                *written = true;
            }
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use opentelemetry_proto::tonic::common::v1::any_value;
    use opentelemetry_proto::tonic::trace::v1::{Span, span, status};
    use prost::Message as _;
    use std::sync::atomic::AtomicUsize;

    /// The spans queued, read back with the official proto's generated messages.
    pub(in crate::telemetry) fn decoded(queue: &SpanQueue) -> Vec<Span> {
        queue
            .take(usize::MAX)
            .messages()
            .into_iter()
            .map(|span| Span::decode(span).unwrap())
            .collect()
    }

    fn recorded(queue: &Arc<SpanQueue>, work: impl FnOnce()) -> Vec<Span> {
        let logs = Box::new(tracing::subscriber::NoSubscriber::default());
        let subscriber = Recorder::new(Arc::clone(queue), logs);
        tracing::subscriber::with_default(subscriber, work);
        decoded(queue)
    }

    fn attributes(span: &Span) -> Vec<(String, any_value::Value)> {
        span.attributes
            .iter()
            .map(|kv| {
                (
                    kv.key.clone(),
                    kv.value.clone().and_then(|v| v.value).unwrap(),
                )
            })
            .collect()
    }

    pub(in crate::telemetry) fn attribute(span: &Span, key: &str) -> Option<any_value::Value> {
        attributes(span)
            .into_iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v)
    }

    pub(in crate::telemetry) fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
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
                again = 1_u64,
            );
            let _entered = outer.enter();
            outer.record("late", 7_u64);
            outer.record("again", 2_u64);
            let inner = tracing::info_span!("child", otel.status_code = tracing::field::Empty);
            inner.record("otel.status_code", "error");
            drop(inner);
        });
        assert_eq!(spans.len(), 2, "{spans:?}");
        let (inner, outer) = (&spans[0], &spans[1]);
        assert_eq!(outer.name, "svc/Method");
        assert_eq!(outer.kind, span::SpanKind::Server as i32);
        assert!(outer.parent_span_id.is_empty());
        assert_eq!(
            attribute(outer, "rpc.system"),
            Some(any_value::Value::StringValue("grpc".into()))
        );
        assert_eq!(
            attribute(outer, "late"),
            Some(any_value::Value::IntValue(7))
        );
        assert_eq!(
            attribute(outer, "again"),
            Some(any_value::Value::IntValue(2))
        );
        let names: Vec<String> = attributes(outer).into_iter().map(|(k, _)| k).collect();
        assert_eq!(
            names,
            ["rpc.system", "late", "again"],
            "a field recorded again replaces its value"
        );
        assert_eq!(attribute(outer, "otel.kind"), None);
        assert_eq!(inner.name, "child");
        assert_eq!(inner.kind, span::SpanKind::Internal as i32);
        assert_eq!(
            inner.status.as_ref().map(|status| status.code),
            Some(status::StatusCode::Error as i32)
        );
        assert_eq!(outer.status, None);
        assert_eq!(inner.trace_id, outer.trace_id);
        assert_eq!(inner.trace_id.len(), 16);
        assert_eq!(inner.parent_span_id, outer.span_id);
        assert_ne!(inner.span_id, outer.span_id);
        assert!(
            inner.end_time_unix_nano >= inner.start_time_unix_nano
                && outer.end_time_unix_nano >= inner.end_time_unix_nano
        );
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
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["child", "root", "decision"]);
        let (child, root, decision) = (&spans[0], &spans[1], &spans[2]);
        assert_eq!(hex(&root.parent_span_id), "00f067aa0ba902b7");
        assert_eq!(hex(&root.trace_id), TRACE);
        assert_eq!(root.trace_state, "congo=t61");
        // The parent is remote (flags: the "is remote" bit is known, and set), and sampled.
        assert_eq!(root.flags & 0x301, 0x301);
        assert_eq!(child.flags & 0x301, 0x101);
        assert_eq!(child.parent_span_id, root.span_id);
        assert_eq!(decision.links.len(), 1);
        assert_eq!(decision.links[0].span_id, child.span_id);
        assert_ne!(decision.trace_id, root.trace_id);
    }

    #[test]
    fn a_leaf_is_a_child_of_the_current_span_and_needs_one() {
        const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
        let queue = Arc::new(SpanQueue::new(16, 8));
        let text = ("toolgate.ledger.operation", LeafValue::Text("running"));
        let spans = recorded(&queue, || {
            assert!(
                Leaf::start("alone", text.clone()).is_none(),
                "no current span"
            );
            let call = tracing::info_span!("call");
            call.in_scope(|| {
                let leaf = Leaf::start("ledger.commit", text.clone()).unwrap();
                let count = ("toolgate.credentials", LeafValue::Int(2));
                drop(Leaf::start("credentials.resolve", count).unwrap());
                drop(leaf);
            });
            drop(call);
            let unsampled =
                SpanContext::from_w3c(&format!("00-{TRACE}-00f067aa0ba902b7-00"), None).unwrap();
            let quiet = tracing::info_span!("quiet");
            toolgate_core::trace::set_parent(&quiet, unsampled);
            quiet.in_scope(|| assert!(Leaf::start("unsampled", text).is_none()));
        });
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["credentials.resolve", "ledger.commit", "call"]);
        let (credentials, ledger, call) = (&spans[0], &spans[1], &spans[2]);
        for leaf in [credentials, ledger] {
            assert_eq!(leaf.trace_id, call.trace_id);
            assert_eq!(leaf.parent_span_id, call.span_id);
            assert_eq!(leaf.span_id.len(), 8);
            assert_eq!(leaf.kind, span::SpanKind::Internal as i32);
            assert_eq!(leaf.flags & 0x301, 0x101, "sampled, local parent");
            assert!(leaf.end_time_unix_nano >= leaf.start_time_unix_nano);
            assert!(leaf.start_time_unix_nano >= call.start_time_unix_nano);
        }
        assert_ne!(ledger.span_id, credentials.span_id);
        assert!(ledger.end_time_unix_nano >= credentials.end_time_unix_nano);
        assert_eq!(
            attributes(ledger),
            [(
                "toolgate.ledger.operation".to_owned(),
                any_value::Value::StringValue("running".into())
            )]
        );
        assert_eq!(
            attributes(credentials),
            [(
                "toolgate.credentials".to_owned(),
                any_value::Value::IntValue(2)
            )]
        );
    }

    #[test]
    fn a_leaf_keeps_the_attributes_set_while_it_runs() {
        let queue = Arc::new(SpanQueue::new(16, 8));
        let spans = recorded(&queue, || {
            let call = tracing::info_span!("call");
            call.in_scope(|| {
                let mut policy = Leaf::begin("policy.evaluate").unwrap();
                assert_eq!(policy.attributes().count(), 0);
                policy.set("toolgate.decision", LeafValue::Text("allow"));
                policy.set(
                    "toolgate.policy_ids",
                    LeafValue::Owned("base,extra".to_owned()),
                );
                policy.set("toolgate.policy_version", LeafValue::Int(7));
                drop(policy);
                // Begun with nothing set: a span with no attributes.
                drop(Leaf::begin("bare").unwrap());
            });
        });
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["policy.evaluate", "bare", "call"]);
        assert_eq!(spans[0].parent_span_id, spans[2].span_id);
        assert_eq!(
            attributes(&spans[0]),
            [
                (
                    "toolgate.decision".to_owned(),
                    any_value::Value::StringValue("allow".into())
                ),
                (
                    "toolgate.policy_ids".to_owned(),
                    any_value::Value::StringValue("base,extra".into())
                ),
                (
                    "toolgate.policy_version".to_owned(),
                    any_value::Value::IntValue(7)
                ),
            ]
        );
        assert!(spans[1].attributes.is_empty());
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

    #[test]
    fn a_batch_takes_the_oldest_spans_and_leaves_the_rest_in_order() {
        let queue = Arc::new(SpanQueue::new(8, 3));
        let logs = Box::new(tracing::subscriber::NoSubscriber::default());
        tracing::subscriber::with_default(Recorder::new(Arc::clone(&queue), logs), || {
            for name in ["a", "b", "c", "d", "e"] {
                drop(tracing::info_span!("span", otel.name = name));
            }
        });
        let names = |spans: Spans| -> Vec<String> {
            spans
                .messages()
                .into_iter()
                .map(|span| Span::decode(span).unwrap().name)
                .collect()
        };
        assert_eq!(queue.len(), 5);
        assert_eq!(names(queue.take(2)), ["a", "b"]);
        assert_eq!(queue.len(), 3);
        // Spans queued after a batch was taken follow those left.
        tracing::subscriber::with_default(
            Recorder::new(
                Arc::clone(&queue),
                Box::new(tracing::subscriber::NoSubscriber::default()),
            ),
            || drop(tracing::info_span!("span", otel.name = "f")),
        );
        assert_eq!(names(queue.take(usize::MAX)), ["c", "d", "e", "f"]);
        assert!(queue.take(1).is_empty());
        assert_eq!(queue.len(), 0);
    }

    /// A log subscriber that counts the events it is given and refuses debug ones.
    struct CountingLogs(Arc<AtomicUsize>);

    impl Subscriber for CountingLogs {
        fn enabled(&self, metadata: &Metadata<'_>) -> bool {
            *metadata.level() <= tracing::Level::INFO
        }
        fn new_span(&self, _: &Attributes<'_>) -> Id {
            panic!("the log subscriber is never given a span")
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &Event<'_>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    #[test]
    fn events_go_to_the_logs_and_only_toolgate_spans_are_recorded() {
        let queue = Arc::new(SpanQueue::new(16, 8));
        let events = Arc::new(AtomicUsize::new(0));
        let logs = Box::new(CountingLogs(Arc::clone(&events)));
        tracing::subscriber::with_default(Recorder::new(Arc::clone(&queue), logs), || {
            let call = tracing::debug_span!("execute_tool");
            let _in_call = call.enter();
            let library = tracing::info_span!(target: "hyper::proto", "library");
            assert!(library.is_disabled());
            let _in_library = library.enter();
            tracing::info!("kept");
            tracing::debug!("refused by the log filter");
            let child = tracing::debug_span!("connector.invoke");
            assert_eq!(
                tracing::Span::current().metadata().map(|m| m.name()),
                Some("execute_tool")
            );
            let clone = child.clone();
            drop(child);
            assert!(queue.take(usize::MAX).is_empty(), "a clone keeps it open");
            drop(clone);
        });
        assert_eq!(events.load(Ordering::SeqCst), 1);
        let spans = decoded(&queue);
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["connector.invoke", "execute_tool"]);
        assert_eq!(spans[0].parent_span_id, spans[1].span_id);
    }

    #[test]
    fn spans_left_out_of_order_leave_the_right_current_span() {
        let queue = Arc::new(SpanQueue::new(16, 8));
        let spans = recorded(&queue, || {
            let a = tracing::info_span!("a");
            let b = tracing::info_span!("b");
            let in_a = a.enter();
            let in_b = b.enter();
            drop(in_a);
            assert_eq!(
                tracing::Span::current().metadata().map(|m| m.name()),
                Some("b")
            );
            drop(in_b);
            assert!(tracing::Span::current().is_none());
            let root = tracing::info_span!(parent: None, "root");
            let under_b = tracing::info_span!(parent: &b, "under_b");
            drop((root, under_b, a, b));
        });
        let by_name = |name: &str| spans.iter().find(|s| s.name == name).unwrap();
        assert!(by_name("root").parent_span_id.is_empty());
        assert_eq!(by_name("under_b").parent_span_id, by_name("b").span_id);
        assert!(by_name("b").parent_span_id.is_empty());
    }

    #[test]
    fn a_sampler_keeps_new_traces_out_and_a_sampled_caller_in() {
        const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
        let queue = Arc::new(SpanQueue::new(16, 8));
        let logs = Box::new(tracing::subscriber::NoSubscriber::default());
        // parentbased_always_off: nothing this gateway starts, all a sampled caller does.
        let recorder =
            Recorder::new(Arc::clone(&queue), logs).with_sampler(Sampler::new(true, 0.0));
        tracing::subscriber::with_default(recorder, || {
            let alone = tracing::info_span!("alone", otel.name = "GET /alone");
            let child = alone.in_scope(|| tracing::info_span!("alone.child", key = "value"));
            let read = toolgate_core::trace::span_context(&child).unwrap();
            assert!(!read.sampled, "a child of an unsampled trace is unsampled");
            assert!(read.traceparent().ends_with("-00"));
            child.record("key", "later");
            drop((child, alone));

            let called =
                tracing::info_span!("called", otel.name = "svc/Method", otel.kind = "server");
            let caller =
                SpanContext::from_w3c(&format!("00-{TRACE}-00f067aa0ba902b7-01"), None).unwrap();
            toolgate_core::trace::set_parent(&called, caller);
            called.in_scope(|| drop(tracing::info_span!("called.child", key = "value")));
        });
        let spans = decoded(&queue);
        let names: Vec<&str> = spans.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["called.child", "svc/Method"]);
        // The root was unsampled when it started and kept its fields for the caller's flag.
        assert_eq!(spans[1].kind, span::SpanKind::Server as i32);
        assert_eq!(hex(&spans[1].trace_id), TRACE);
        assert_eq!(
            attribute(&spans[0], "key"),
            Some(any_value::Value::StringValue("value".into()))
        );
    }

    #[test]
    fn annotated_attributes_and_special_fields_go_straight_into_the_record() {
        use toolgate_core::trace::annotate;
        let queue = Arc::new(SpanQueue::new(16, 8));
        let spans = recorded(&queue, || {
            let span = tracing::info_span!(
                "annotated",
                otel.name = tracing::field::Empty,
                otel.status_code = tracing::field::Empty,
                early = "first",
                text = tracing::field::Empty,
                int = tracing::field::Empty,
                flag = tracing::field::Empty,
            );
            annotate(
                &span,
                &[
                    ("otel.name", Attribute::Text("execute_tool noop")),
                    ("text", Attribute::Text("value")),
                    ("int", Attribute::Int(-3)),
                ],
            );
            annotate(
                &span,
                &[
                    ("flag", Attribute::Bool(true)),
                    ("otel.status_code", Attribute::Text("error")),
                ],
            );
        });
        assert_eq!(spans.len(), 1);
        let span = &spans[0];
        assert_eq!(span.name, "execute_tool noop");
        assert_eq!(
            span.status.as_ref().map(|status| status.code),
            Some(status::StatusCode::Error as i32)
        );
        let expected = [
            ("early", any_value::Value::StringValue("first".into())),
            ("text", any_value::Value::StringValue("value".into())),
            ("int", any_value::Value::IntValue(-3)),
            ("flag", any_value::Value::BoolValue(true)),
        ];
        let expected: Vec<(String, any_value::Value)> = expected
            .into_iter()
            .map(|(key, value)| (key.to_owned(), value))
            .collect();
        assert_eq!(
            attributes(span),
            expected,
            "no special field is an attribute"
        );
    }

    #[test]
    fn the_recorder_takes_the_annotations_of_its_spans_sampled_or_not() {
        // Taken (`written`), they are not recorded again through `tracing` as for another
        // subscriber; an unsampled span keeps none of them and is not exported.
        // parentbased_always_off: a root of its own is unsampled, a sampled caller's child not.
        let queue = Arc::new(SpanQueue::new(16, 8));
        let logs = Box::new(tracing::subscriber::NoSubscriber::default());
        let recorder =
            Recorder::new(Arc::clone(&queue), logs).with_sampler(Sampler::new(true, 0.0));
        let taken = |span: &tracing::Span| {
            let mut written = false;
            tracing::dispatcher::get_default(|dispatch| {
                access(
                    dispatch,
                    &span.id().unwrap(),
                    Access::Annotate {
                        attributes: &[("key", Attribute::Text("value"))],
                        written: &mut written,
                    },
                );
            });
            written
        };
        tracing::subscriber::with_default(recorder, || {
            let unsampled = tracing::info_span!("unsampled", key = tracing::field::Empty);
            assert!(
                taken(&unsampled),
                "an unsampled span's annotations are taken"
            );
            drop(unsampled);

            let sampled = tracing::info_span!("sampled", key = tracing::field::Empty);
            let caller = SpanContext::from_w3c(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                None,
            )
            .unwrap();
            toolgate_core::trace::set_parent(&sampled, caller);
            assert!(taken(&sampled), "a sampled span's annotations are taken");
        });
        let spans = decoded(&queue);
        let names: Vec<&str> = spans.iter().map(|span| span.name.as_str()).collect();
        assert_eq!(names, ["sampled"], "the unsampled span is not exported");
        assert_eq!(
            attributes(&spans[0]),
            [(
                "key".to_owned(),
                any_value::Value::StringValue("value".into())
            )],
            "taken once: not recorded again through tracing"
        );
    }
}
