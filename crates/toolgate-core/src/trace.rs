//! Trace context: W3C trace ids, the `traceparent` / `tracestate` headers, and a `tracing`
//! span's context as the application's recording subscriber keeps it.
//!
//! Libraries make plain `tracing` spans and use this module to carry a context across a
//! boundary (the HTTP client sends it to vendors, the engine keeps a suspended call's). The
//! application that records spans (the gateway, when it exports traces) installs a
//! [`ContextAccess`] once; without one every span has no context and nothing is sent.

use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

mod scope;

pub use scope::{InSpan, Scope, Site, Span, in_span, scope_of};
#[doc(hidden)]
pub use tracing as __tracing;

/// A 16-byte W3C trace id; never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct TraceId(pub [u8; 16]);

/// An 8-byte W3C span id; never all zeros.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct SpanId(pub [u8; 8]);

fn write_hex(f: &mut fmt::Formatter<'_>, bytes: &[u8]) -> fmt::Result {
    bytes.iter().try_for_each(|byte| write!(f, "{byte:02x}"))
}

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "TraceId({self})")
    }
}

impl fmt::Display for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write_hex(f, &self.0)
    }
}

impl fmt::Debug for SpanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SpanId({self})")
    }
}

/// Lower-case hex of exactly `N` bytes, not all zeros (the W3C rules for both ids).
fn parse_id<const N: usize>(text: &str) -> Option<[u8; N]> {
    let digits = text.as_bytes();
    if digits.len() != 2 * N {
        return None;
    }
    let mut bytes = [0u8; N];
    for (byte, pair) in bytes.iter_mut().zip(digits.chunks_exact(2)) {
        *byte = (lower_hex(pair[0])? << 4) | lower_hex(pair[1])?;
    }
    bytes.iter().any(|b| *b != 0).then_some(bytes)
}

/// Two lower-case hex digits (zero allowed: versions and flags).
fn hex_byte(text: &str) -> Option<u8> {
    match text.as_bytes() {
        [high, low] => Some((lower_hex(*high)? << 4) | lower_hex(*low)?),
        _ => None,
    }
}

fn lower_hex(digit: u8) -> Option<u8> {
    match digit {
        b'0'..=b'9' => Some(digit - b'0'),
        b'a'..=b'f' => Some(digit - b'a' + 10),
        _ => None,
    }
}

/// The most a `tracestate` may hold (W3C: 32 list members, and a propagator may drop a value
/// longer than 512 characters).
const TRACE_STATE_MEMBERS: usize = 32;
const TRACE_STATE_CHARS: usize = 512;

/// The context of one span: its trace, its own id, whether it is sampled, and the vendor
/// `tracestate` it carries on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpanContext {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    /// The W3C `sampled` flag: an unsampled span is propagated but not exported.
    pub sampled: bool,
    /// The caller's `tracestate`, passed on unchanged (`None` when absent or unusable).
    pub trace_state: Option<Arc<str>>,
    /// Whether the context came from another process (a header).
    pub remote: bool,
}

impl SpanContext {
    /// The remote context of a W3C `traceparent` header (and its `tracestate`), or `None` when
    /// the header is absent or malformed: the span then starts a trace of its own.
    ///
    /// Version `00` must be exactly `00-{32 hex}-{16 hex}-{2 hex}`; a later version may append
    /// fields, which are ignored; version `ff` and upper-case hex are invalid.
    pub fn from_w3c(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
        let traceparent = traceparent.trim();
        let mut parts = traceparent.split('-');
        let version = parts.next()?;
        let trace = parts.next()?;
        let span = parts.next()?;
        let flags = parts.next()?;
        let version = hex_byte(version)?;
        match version {
            0xff => return None,
            0 if parts.next().is_some() => return None,
            _ => {}
        }
        let flags = hex_byte(flags)?;
        let trace_state = tracestate
            .map(str::trim)
            .filter(|state| valid_trace_state(state))
            .map(Arc::from);
        Some(SpanContext {
            trace_id: TraceId(parse_id(trace)?),
            span_id: SpanId(parse_id(span)?),
            sampled: flags & 1 == 1,
            trace_state,
            remote: true,
        })
    }

    /// The W3C `traceparent` header of this span: `00-{trace}-{span}-{flags}`.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{}-{}-{:02x}",
            self.trace_id,
            self.span_id,
            u8::from(self.sampled)
        )
    }
}

/// A `tracestate` worth passing on: non-empty, at most 512 characters and 32 members, each
/// `key=value` with printable ASCII and no spaces in the key.
fn valid_trace_state(state: &str) -> bool {
    if state.is_empty() || state.len() > TRACE_STATE_CHARS {
        return false;
    }
    let members: Vec<&str> = state
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .collect();
    !members.is_empty()
        && members.len() <= TRACE_STATE_MEMBERS
        && members.iter().all(|member| {
            member.split_once('=').is_some_and(|(key, value)| {
                !key.is_empty()
                    && key.bytes().all(|b| b.is_ascii_graphic() && b != b'=')
                    && !value.is_empty()
                    && value
                        .bytes()
                        .all(|b| (b' '..=b'~').contains(&b) && b != b',')
            })
        })
}

/// What a caller asks of the recording subscriber about one span.
#[derive(Debug)]
pub enum Access<'a> {
    /// Read the span's context (left `None` when the subscriber does not record the span).
    Read(&'a mut Option<SpanContext>),
    /// Make a remote context the span's parent: the span, created as a root, joins that trace.
    /// Only before the span has children.
    SetParent(SpanContext),
    /// Link the span to another (for example the call an approval decides).
    Link(SpanContext),
    /// Write attributes straight into the span's record (`otel.name` and `otel.status_code`
    /// as the special fields they are); `written` is set when the subscriber took them (a span
    /// it does not sample takes them too, and drops them).
    Annotate {
        attributes: &'a [(&'static str, Attribute<'a>)],
        written: &'a mut bool,
    },
}

/// An attribute's value given to [`annotate`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Attribute<'a> {
    Text(&'a str),
    Int(i64),
    Bool(bool),
}

/// Opens a [`Span`] as a scope through the dispatcher: its call site and first attributes
/// given, `None` when the dispatcher records no spans.
pub type OpenScope = fn(
    &tracing::Dispatch,
    &'static tracing::Metadata<'static>,
    &[(&'static str, Attribute<'_>)],
) -> Option<Scope>;

/// How libraries reach the span records of the application's recording subscriber, given
/// the dispatcher. Installed once per process.
#[derive(Clone, Copy, Debug)]
pub struct ContextAccess {
    /// Carries out one [`Access`] on the span with this id.
    pub span: fn(&tracing::Dispatch, &tracing::span::Id, Access<'_>),
    /// The context of the span the caller is in (`None` when it records none).
    pub current: fn(&tracing::Dispatch) -> Option<SpanContext>,
    /// Records a [`Leaf`] that ended at the time given.
    pub leaf: fn(&tracing::Dispatch, &Leaf, SystemTime),
    /// Opens a [`Span`] as a scope: a child of the current span, of kind internal, with the
    /// call site and attributes given (`None` when the dispatcher records no spans).
    pub open: OpenScope,
    /// Carries out one [`Access`] on a scope's span (nothing when it is another's).
    pub scope: fn(&tracing::Dispatch, &Scope, Access<'_>),
    /// Lets go of one handle to a scope's span, which ends with the last.
    pub close: fn(&tracing::Dispatch, &Scope),
}

static ACCESS: OnceLock<ContextAccess> = OnceLock::new();

/// Installs the process's recording subscriber's access (the first installation wins; the same
/// functions installed again change nothing).
pub fn install_access(access: ContextAccess) {
    let _ = ACCESS.set(access);
}

fn access(span: &tracing::Span, what: Access<'_>) {
    let Some(access) = ACCESS.get() else {
        return;
    };
    span.with_subscriber(|(id, dispatch)| (access.span)(dispatch, id, what));
}

/// The context of `span`, when a recording subscriber records it.
pub fn span_context(span: &tracing::Span) -> Option<SpanContext> {
    let mut context = None;
    access(span, Access::Read(&mut context));
    context
}

/// The context of the span the caller is in.
pub fn current() -> Option<SpanContext> {
    let access = ACCESS.get()?;
    tracing::dispatcher::get_default(|dispatch| (access.current)(dispatch))
}

/// Makes `parent` (a caller's remote context) the parent of the new root `span`.
pub fn set_parent(span: &tracing::Span, parent: SpanContext) {
    access(span, Access::SetParent(parent));
}

/// Links `span` to `other`.
pub fn add_link(span: &tracing::Span, other: SpanContext) {
    access(span, Access::Link(other));
}

/// Records `attributes` on `span`, each key at most once in the span's life and declared
/// among its fields (`tracing::field::Empty`).
///
/// A recording subscriber takes them straight into the span's record: no look-up of each
/// field by name, no visit of a `tracing` value set, and one lock of the record for all of
/// them, which was most of what the late fields of a call's span cost. Any other subscriber
/// (logs at debug level, traces off) gets them as `tracing` records them, field by field.
pub fn annotate(span: &tracing::Span, attributes: &[(&'static str, Attribute<'_>)]) {
    if span.is_disabled() {
        return;
    }
    let mut written = false;
    access(
        span,
        Access::Annotate {
            attributes,
            written: &mut written,
        },
    );
    if written {
        return;
    }
    for (key, value) in attributes {
        match *value {
            Attribute::Text(text) => span.record(*key, text),
            Attribute::Int(int) => span.record(*key, int),
            Attribute::Bool(bool) => span.record(*key, bool),
        };
    }
}

/// A leaf span's attribute value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeafValue {
    Text(&'static str),
    /// Text made while the work ran (the ids of the policies that decided).
    Owned(String),
    Int(i64),
}

/// A span around one piece of work that makes no spans of its own (a ledger commit, a
/// credential lookup, a policy evaluation): a child of the span current when it starts, ended
/// when dropped, and handed as a whole then to the recording subscriber that is the default
/// dispatcher where it is dropped (the gateway has one for the process). It takes none of a
/// `tracing` span's trips through the subscriber (a slot in its tables, a clone of the
/// dispatcher, entering and leaving it, a lock for each record of a field): its attributes are
/// kept in the leaf itself, and the recorder encodes it once, as it ends.
#[derive(Debug)]
pub struct Leaf {
    /// The context of the span it is a child of (sampled: an unsampled one makes no leaf).
    pub parent: SpanContext,
    pub name: &'static str,
    pub start: SystemTime,
    /// The first attribute, kept in place: most leaves have that one only.
    first: Option<(&'static str, LeafValue)>,
    /// The others, in the order given.
    rest: Vec<(&'static str, LeafValue)>,
}

impl Leaf {
    /// Starts a leaf under the current span, with its first attribute; `None` (and nothing
    /// recorded) when no recording subscriber records the current span or its trace is not
    /// sampled, and when there is no current span: a leaf belongs to a traced operation.
    pub fn start(name: &'static str, attribute: (&'static str, LeafValue)) -> Option<Leaf> {
        let mut leaf = Leaf::begin(name)?;
        leaf.first = Some(attribute);
        Some(leaf)
    }

    /// Starts a leaf whose attributes are known only once its work is done ([`Leaf::set`]);
    /// `None` as [`Leaf::start`].
    pub fn begin(name: &'static str) -> Option<Leaf> {
        let parent = current()?;
        parent.sampled.then(|| Leaf {
            parent,
            name,
            start: SystemTime::now(),
            first: None,
            rest: Vec::new(),
        })
    }

    /// Adds an attribute (a key not given before).
    pub fn set(&mut self, key: &'static str, value: LeafValue) {
        if self.first.is_none() {
            self.first = Some((key, value));
        } else {
            self.rest.push((key, value));
        }
    }

    /// The attributes, in the order given.
    pub fn attributes(&self) -> impl Iterator<Item = &(&'static str, LeafValue)> {
        self.first.iter().chain(&self.rest)
    }
}

impl Drop for Leaf {
    fn drop(&mut self) {
        let end = SystemTime::now();
        if let Some(access) = ACCESS.get() {
            tracing::dispatcher::get_default(|dispatch| (access.leaf)(dispatch, self, end));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
    const SPAN: &str = "00f067aa0ba902b7";

    #[test]
    fn a_traceparent_round_trips() {
        let header = format!("00-{TRACE}-{SPAN}-01");
        let context = SpanContext::from_w3c(&header, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(context.trace_id.to_string(), TRACE);
        assert_eq!(context.span_id.to_string(), SPAN);
        assert!(context.sampled && context.remote);
        assert_eq!(context.trace_state.as_deref(), Some("congo=t61rcWkgMzE"));
        assert_eq!(context.traceparent(), header);
        let unsampled = SpanContext::from_w3c(&format!("00-{TRACE}-{SPAN}-00"), None).unwrap();
        assert!(!unsampled.sampled);
        assert_eq!(unsampled.traceparent(), format!("00-{TRACE}-{SPAN}-00"));
        // A later version may carry more fields; only the four known ones are read.
        let future = SpanContext::from_w3c(&format!("cc-{TRACE}-{SPAN}-01-what-ever"), None);
        assert_eq!(future.unwrap().span_id.to_string(), SPAN);
    }

    #[test]
    fn malformed_traceparents_start_no_trace() {
        for header in [
            String::new(),
            format!("ff-{TRACE}-{SPAN}-01"),
            format!("00-{TRACE}-{SPAN}-01-extra"),
            format!("00-{TRACE}-{SPAN}"),
            format!("0-{TRACE}-{SPAN}-01"),
            format!("00-{}-{SPAN}-01", TRACE.to_uppercase()),
            format!("00-{}-{SPAN}-01", "0".repeat(32)),
            format!("00-{TRACE}-{}-01", "0".repeat(16)),
            format!("00-{}-{SPAN}-01", &TRACE[..30]),
            format!("00-{TRACE}-{SPAN}-1"),
            format!("00-{TRACE}-{SPAN}-zz"),
            format!("00-{TRACE}-{}zz-01", &SPAN[..14]),
        ] {
            assert_eq!(SpanContext::from_w3c(&header, None), None, "{header}");
        }
    }

    #[test]
    fn an_unusable_tracestate_is_dropped_not_the_trace() {
        let header = format!("00-{TRACE}-{SPAN}-01");
        let too_many = (0..33).map(|i| format!("k{i}=v")).collect::<Vec<_>>();
        for state in [
            "",
            "novalue=",
            "=nokey",
            "a=b,c",
            &"k=v".repeat(200),
            &too_many.join(","),
        ] {
            let context = SpanContext::from_w3c(&header, Some(state)).unwrap();
            assert_eq!(context.trace_state, None, "{state}");
        }
        let kept = SpanContext::from_w3c(&header, Some("rojo=00f067aa0ba902b7,congo=t61"));
        assert_eq!(
            kept.unwrap().trace_state.as_deref(),
            Some("rojo=00f067aa0ba902b7,congo=t61")
        );
    }

    #[test]
    fn without_a_recording_layer_no_span_has_a_context() {
        let span = tracing::info_span!("anything");
        assert_eq!(span_context(&span), None);
        assert_eq!(current(), None);
        assert!(Leaf::start("leaf", ("key", LeafValue::Int(1))).is_none());
    }

    /// A subscriber other than the gateway's recorder: it keeps what `record` gives it.
    #[derive(Default)]
    struct Records(std::sync::Mutex<Vec<String>>);

    impl tracing::field::Visit for &Records {
        fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
            let mut records = self.0.lock().unwrap();
            records.push(format!("{}={value:?}", field.name()));
        }
    }

    impl tracing::Subscriber for &'static Records {
        fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
            tracing::span::Id::from_u64(1)
        }
        fn record(&self, _: &tracing::span::Id, values: &tracing::span::Record<'_>) {
            values.record(&mut &**self);
        }
        fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
        fn event(&self, _: &tracing::Event<'_>) {}
        fn enter(&self, _: &tracing::span::Id) {}
        fn exit(&self, _: &tracing::span::Id) {}
    }

    #[test]
    fn another_subscriber_gets_annotations_as_tracing_records() {
        let records: &'static Records = Box::leak(Box::default());
        tracing::subscriber::with_default(records, || {
            let span = tracing::info_span!(
                "call",
                text = tracing::field::Empty,
                int = tracing::field::Empty,
                flag = tracing::field::Empty,
            );
            annotate(
                &span,
                &[
                    ("text", Attribute::Text("value")),
                    ("int", Attribute::Int(7)),
                    ("flag", Attribute::Bool(false)),
                    ("undeclared", Attribute::Int(1)),
                ],
            );
        });
        let records = records.0.lock().unwrap();
        assert_eq!(*records, ["text=\"value\"", "int=7", "flag=false"]);
    }

    crate::span_site!(SITE, "site", "toolgate::test");
    crate::span_site!(LISTED, "listed", "toolgate::test", ["a", "b"]);

    #[test]
    fn without_a_recording_layer_a_span_is_the_callers_tracing_span() {
        assert_eq!((SITE.name(), SITE.target()), ("site", "toolgate::test"));
        assert!(SITE.is_span() && SITE.fields().is_empty());
        let listed: Vec<&str> = LISTED.fields().iter().map(|f| f.name()).collect();
        assert_eq!(listed, ["a", "b"]);
        let records: &'static Records = Box::leak(Box::default());
        tracing::subscriber::with_default(records, || {
            let span = Span::open(&SITE, &[("opened", Attribute::Int(1))], || {
                tracing::info_span!("fallback", late = tracing::field::Empty)
            });
            assert!(matches!(span, Span::Tracing(_)));
            assert!(!span.is_disabled());
            assert_eq!(span.context(), None);
            span.annotate(&[("late", Attribute::Int(2))]);
        });
        assert_eq!(*records.0.lock().unwrap(), ["late=2"]);
    }
}
