//! The OTLP/gRPC exporter: takes the recorder's closed spans in batches and sends them to the
//! collector's `TraceService/Export` (the official OpenTelemetry proto, over the gateway's own
//! tonic), on a schedule or as soon as a batch is full, as the standard batch span processor
//! does (`OTEL_BSP_*`). A collector that is away costs dropped spans, counted and logged, never
//! a caller's time: nothing on a call's path waits for an export.
//!
//! The request is written straight to protobuf (`put`), field by field from the records,
//! rather than built as a tree of generated messages first: a span's attribute keys, ids and
//! values are copied once into the request's bytes instead of into a dozen small allocations
//! each. The tests decode what it writes with the generated messages of the official proto.
//! The call is made on tonic's channel itself, with the batch's bytes as the request's body
//! as they were queued (see [`Batches::export`]), not through a codec that copies them.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{BufMut, Bytes};
use http_body::{Frame, SizeHint};
use tokio::sync::{Notify, oneshot, watch};
use tonic::codegen::http::{self, HeaderMap, HeaderValue, header};
use tonic::metadata::MetadataMap;
use tonic::transport::{Channel, Endpoint};
use tower_service::Service as _;

use toolgate_core::trace::SpanContext;

use super::recorder::{SpanQueue, SpanRecord, StatusCode};
use super::{TelemetryError, TraceExport};

/// The collector's method.
const EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// W3C trace flags, and whether the parent (or linked span) is remote (OTLP `SpanFlags`).
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// The running exporter: its own thread, with a single-threaded runtime of its own, as the
/// OpenTelemetry SDK's batch span processor runs on a thread of its own. Sending a batch (the
/// request's bytes, HTTP/2 framing, the socket writes) is then never work for the runtime that
/// serves calls, and takes no turn from them on its worker.
#[derive(Debug)]
pub(crate) struct Exporter {
    stop: watch::Sender<bool>,
    /// Resolves when the thread has exported what was queued and ended (or given up).
    done: oneshot::Receiver<()>,
    /// Tells the thread to stop at once: what it holds is lost.
    abort: Arc<Notify>,
    losses: Arc<Losses>,
    queue: Arc<SpanQueue>,
}

impl Exporter {
    /// Starts exporting what `queue` collects to `export.endpoint` (connecting on the first
    /// export), on a thread of its own.
    pub(crate) fn start(
        export: &TraceExport,
        queue: Arc<SpanQueue>,
    ) -> Result<Exporter, TelemetryError> {
        let endpoint = Endpoint::from_shared(export.endpoint.clone())
            .map_err(|e| {
                TelemetryError(format!(
                    "OTEL_EXPORTER_OTLP_ENDPOINT `{}` is not a usable URL: {e}",
                    export.endpoint
                ))
            })?
            .connect_timeout(export.timeout)
            .timeout(export.timeout);
        let headers = request_headers(metadata(&export.headers)?);
        let head = Arc::new(Head::new(export));
        let losses = Arc::new(Losses::default());
        let (stop, stopped) = watch::channel(false);
        let (finished, done) = oneshot::channel();
        let abort = Arc::new(Notify::new());
        let cannot = |e: std::io::Error| {
            TelemetryError(format!("cannot start the trace exporter's thread: {e}"))
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(cannot)?;
        let work = {
            let endpoint_text = export.endpoint.clone();
            let losses = Arc::clone(&losses);
            let queue = Arc::clone(&queue);
            let abort = Arc::clone(&abort);
            let delay = export.schedule_delay;
            async move {
                // The channel's connection task runs on this thread's runtime: made here.
                let batches = Batches {
                    head,
                    headers,
                    endpoint: endpoint_text,
                    client: endpoint.connect_lazy(),
                    failing: 0,
                    losses,
                };
                tokio::select! {
                    () = run(batches, queue, delay, stopped) => {}
                    () = abort.notified() => {}
                }
            }
        };
        std::thread::Builder::new()
            .name("otlp-exporter".to_owned())
            .spawn(move || {
                runtime.block_on(work);
                // Its connection tasks go with the runtime, before the end is reported.
                drop(runtime);
                let _ = finished.send(());
            })
            .map_err(cannot)?;
        Ok(Exporter {
            stop,
            done,
            abort,
            queue,
            losses,
        })
    }

    /// Exports what is queued and stops; waits at most `limit`. Returns the spans lost to
    /// failed exports (also logged).
    pub(crate) async fn shutdown(mut self, limit: Duration) -> u64 {
        let _ = self.stop.send(true);
        let ended = tokio::time::timeout(limit, &mut self.done).await;
        if !matches!(ended, Ok(Ok(()))) {
            // Not done in time (or its thread died): what it held and what is still queued is
            // lost.
            self.abort.notify_one();
            let held = self.losses.in_flight.swap(0, Ordering::Relaxed);
            let queued = u64::try_from(self.queue.take(usize::MAX).len()).unwrap_or(u64::MAX);
            self.losses
                .spans
                .fetch_add(held + queued, Ordering::Relaxed);
            tracing::warn!(
                unsent = held + queued,
                "the exporter did not finish exporting the last traces in time"
            );
        }
        let lost = self.losses.spans.load(Ordering::Relaxed);
        if lost > 0 {
            tracing::warn!(
                lost,
                "spans were lost because the collector did not accept their export"
            );
        }
        let dropped = self.queue.dropped();
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "spans were dropped because the export queue was full (raise OTEL_BSP_MAX_QUEUE_SIZE or check the collector)"
            );
        }
        lost
    }
}

/// Spans that never reached the collector.
#[derive(Debug, Default)]
struct Losses {
    /// In batches whose export failed, in all.
    spans: AtomicU64,
    /// In the batch being sent now (lost too if the exporter is stopped mid-send).
    in_flight: AtomicU64,
}

async fn run(
    mut batches: Batches,
    queue: Arc<SpanQueue>,
    delay: Duration,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        // Woken by a full batch, only full batches go: what is left of the queue joins the
        // next one (it is first in line), rather than following as an export of its own
        // whose round trip costs what a full one does. The schedule (and a stop) sends
        // everything.
        let (stopping, everything) = tokio::select! {
            () = tokio::time::sleep(delay) => (false, true),
            () = queue.full() => (false, false),
            _ = stopped.changed() => (true, true),
        };
        loop {
            if !everything && queue.len() < queue.batch() {
                break;
            }
            let batch = queue.take(queue.batch());
            if batch.is_empty() {
                break;
            }
            batches.send(batch).await;
        }
        if stopping {
            return;
        }
    }
}

/// What every export shares, and the client.
#[derive(Debug)]
struct Batches {
    head: Arc<Head>,
    /// Every request's headers: gRPC's own and `OTEL_EXPORTER_OTLP_HEADERS`.
    headers: HeaderMap,
    endpoint: String,
    client: Channel,
    /// Batches failed in a row (the first failure is logged, and the recovery).
    failing: u64,
    losses: Arc<Losses>,
}

impl Batches {
    async fn send(&mut self, batch: Spans) {
        let spans = batch.len();
        let count = u64::try_from(spans).unwrap_or(u64::MAX);
        self.losses.in_flight.store(count, Ordering::Relaxed);
        let sent = self.export(batch).await;
        self.losses.in_flight.store(0, Ordering::Relaxed);
        match sent {
            Ok(()) => {
                if self.failing > 0 {
                    tracing::info!(
                        endpoint = %self.endpoint,
                        failed_batches = self.failing,
                        "exporting traces again"
                    );
                    self.failing = 0;
                }
            }
            Err(status) => {
                if self.failing == 0 {
                    tracing::warn!(
                        endpoint = %self.endpoint,
                        spans,
                        code = ?status.code(),
                        error = status.message(),
                        "exporting traces failed; spans are dropped until the collector answers"
                    );
                }
                self.failing += 1;
                self.losses.spans.fetch_add(count, Ordering::Relaxed);
            }
        }
    }

    /// One unary `Export` call, made on the channel itself: the request's body is the gRPC
    /// message's head and the batch's bytes as they were queued (no copy into a codec's
    /// buffer), and it ends with its last data frame rather than with an empty frame of its
    /// own (one write less a batch). The answer only reports spans the collector rejected,
    /// which this exporter would not send again anyway: only its status is read.
    async fn export(&mut self, batch: Spans) -> Result<(), tonic::Status> {
        let head = self.head.message_head(&batch)?;
        let body = ExportBody {
            chunks: [Some(Bytes::from(head)), Some(Bytes::from(batch.bytes))],
        };
        let mut request = http::Request::new(tonic::body::Body::new(body));
        *request.method_mut() = http::Method::POST;
        *request.uri_mut() = http::Uri::from_static(EXPORT);
        *request.headers_mut() = self.headers.clone();
        let unavailable = |error: &dyn fmt::Display| tonic::Status::unavailable(error.to_string());
        std::future::poll_fn(|cx| self.client.poll_ready(cx))
            .await
            .map_err(|error| unavailable(&error))?;
        let response = self
            .client
            .call(request)
            .await
            .map_err(|error| unavailable(&error))?;
        answer_status(response).await
    }
}

/// The gRPC status of an answer: in its headers (a trailers-only answer) or in the trailers
/// after its body; an HTTP error or an answer without a status is an error.
async fn answer_status(response: http::Response<tonic::body::Body>) -> Result<(), tonic::Status> {
    let (parts, body) = response.into_parts();
    if parts.status != http::StatusCode::OK {
        return Err(tonic::Status::unavailable(format!(
            "the collector answered HTTP {}",
            parts.status
        )));
    }
    let status = match tonic::Status::from_header_map(&parts.headers) {
        Some(status) => status,
        None => {
            let collected = http_body_util::BodyExt::collect(body).await?;
            collected
                .trailers()
                .and_then(tonic::Status::from_header_map)
                .ok_or_else(|| {
                    tonic::Status::internal("the collector's answer carried no gRPC status")
                })?
        }
    };
    match status.code() {
        tonic::Code::Ok => Ok(()),
        _ => Err(status),
    }
}

/// An export request's body: the message's head, then the batch; the last chunk ends the
/// stream ([`http_body::Body::is_end_stream`] turns true as it is taken, so the last data
/// frame carries END_STREAM).
#[derive(Debug)]
struct ExportBody {
    chunks: [Option<Bytes>; 2],
}

impl http_body::Body for ExportBody {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let next = self
            .chunks
            .iter_mut()
            .find_map(Option::take)
            .map(|chunk| Ok(Frame::data(chunk)));
        std::task::Poll::Ready(next)
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.iter().all(Option::is_none)
    }

    /// Unknown, as a gRPC client's body is: a known size would add a `content-length` header
    /// a gRPC request does not carry.
    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// The headers of every export: gRPC's own, then the configured ones.
fn request_headers(metadata: MetadataMap) -> HeaderMap {
    let mut headers = metadata.into_headers();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert(header::TE, HeaderValue::from_static("trailers"));
    headers
}

/// The parts of every request that do not change: the resource and the instrumentation scope,
/// encoded once.
#[derive(Debug)]
struct Head {
    resource: Vec<u8>,
    scope: Vec<u8>,
}

impl Head {
    fn new(export: &TraceExport) -> Head {
        let mut resource = Vec::new();
        for (key, value) in resource_attributes(export) {
            // `Resource.attributes`: field 1.
            key_value(&mut resource, 1, &key, Payload::Text(value.as_bytes()));
        }
        let mut scope = Vec::new();
        put::bytes(&mut scope, 1, b"toolgate");
        put::bytes(&mut scope, 2, env!("CARGO_PKG_VERSION").as_bytes());
        Head { resource, scope }
    }

    /// `ExportTraceServiceRequest { resource_spans: [{ resource, scope_spans: [{ scope,
    /// spans }] }] }`, as bytes: the gRPC message an export sends, its prefix checked and
    /// taken off.
    #[cfg(test)]
    fn request(&self, batch: &Spans) -> Vec<u8> {
        let mut message = self.message_head(batch).unwrap();
        message.extend_from_slice(&batch.bytes);
        assert_eq!(message[0], 0, "not compressed");
        let length = u32::from_be_bytes(message[1..5].try_into().unwrap());
        assert_eq!(
            usize::try_from(length).unwrap(),
            message.len() - 5,
            "the sizes computed are the sizes written"
        );
        message.split_off(5)
    }

    /// What comes before the batch's spans in the request's gRPC message: the message's
    /// prefix (not compressed, its length) and the request's fields up to its spans. A
    /// request past the prefix's 4 GiB is refused rather than framed wrong.
    fn message_head(&self, batch: &Spans) -> Result<Vec<u8>, tonic::Status> {
        let sizes = self.sizes(batch);
        let total = u32::try_from(sizes.total()).map_err(|_| {
            tonic::Status::resource_exhausted(format!(
                "a batch of {} spans makes a request of {} bytes, past gRPC's 4 GiB",
                batch.len(),
                sizes.total()
            ))
        })?;
        let head = sizes.total() - batch.bytes.len();
        let mut out = Vec::with_capacity(5 + head);
        out.put_u8(0);
        out.put_u32(total);
        self.write_head(&sizes, &mut out);
        // Every length was written before its message: one miscounted field would frame the
        // rest of the request wrong.
        debug_assert_eq!(
            out.len(),
            5 + head,
            "the head's computed size is the size written"
        );
        Ok(out)
    }

    /// Every length of the request, computed first, so each byte is written once, in place
    /// (a length written before its message would otherwise move what follows it).
    fn sizes(&self, batch: &Spans) -> Sizes {
        let scope_spans = field_len(self.scope.len()) + batch.bytes.len();
        let resource_spans = field_len(self.resource.len()) + field_len(scope_spans);
        Sizes {
            scope_spans,
            resource_spans,
        }
    }

    /// The request's fields before its spans (which are the batch's bytes as they are).
    fn write_head(&self, sizes: &Sizes, out: &mut impl BufMut) {
        put::len(out, 1, sizes.resource_spans);
        put::len(out, 1, self.resource.len());
        out.put_slice(&self.resource);
        put::len(out, 2, sizes.scope_spans);
        put::len(out, 1, self.scope.len());
        out.put_slice(&self.scope);
    }
}

/// The lengths of a request's enclosing messages (each span's is its body's).
struct Sizes {
    scope_spans: usize,
    resource_spans: usize,
}

impl Sizes {
    /// The whole request's size.
    fn total(&self) -> usize {
        field_len(self.resource_spans)
    }
}

/// A length-delimited field's size: its tag (fields below 16 take one byte), its length and
/// its body.
fn field_len(body: usize) -> usize {
    1 + put::varint_len(body as u64) + body
}

/// A string or bytes field's size; an empty one is not written.
fn optional_len(body: usize) -> usize {
    if body == 0 { 0 } else { field_len(body) }
}

/// `ScopeSpans.spans`: field 2.
const SPANS: u8 = 2;

/// Writes a closed span into `out` as one `ScopeSpans.spans` field (its tag, its length and
/// the `Span` message), so a batch of them is a request's spans as they are: its attributes
/// first, as they were recorded, then its other fields (protobuf's fields may come in any
/// order). Encoded as it closes, while its record is still in the cache, straight into the
/// export queue's buffer. Returns the field's size.
pub(crate) fn put_framed_span(out: &mut Vec<u8>, span: &SpanRecord) -> usize {
    let attributes = span.attributes.encoded();
    let times = Times {
        start: unix_nanos(span.start),
        end: unix_nanos(span.end),
    };
    let body = attributes.len() + span_len(span, times);
    let size = field_len(body);
    out.reserve(size);
    let at = out.len();
    put::len(out, SPANS, body);
    out.put_slice(attributes);
    put_span(out, span, times);
    debug_assert_eq!(out.len() - at, size, "span_len is what put_span writes");
    size
}

/// Closed spans, each one a `ScopeSpans.spans` field ([`put_framed_span`]), in the order they
/// closed: a batch taken from the export queue.
#[derive(Debug, Default)]
pub(crate) struct Spans {
    pub(crate) bytes: Vec<u8>,
    pub(crate) count: usize,
}

impl Spans {
    pub(crate) fn len(&self) -> usize {
        self.count
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Each span's `Span` message.
    #[cfg(test)]
    pub(crate) fn messages(&self) -> Vec<&[u8]> {
        let mut messages = Vec::with_capacity(self.count);
        let mut rest = &self.bytes[..];
        while let [tag, after @ ..] = rest {
            assert_eq!(*tag, SPANS << 3 | put::LEN, "a spans field");
            let (len, read) = put::read_varint(after).expect("a length");
            let len = usize::try_from(len).unwrap();
            messages.push(&after[read..read + len]);
            rest = &after[read + len..];
        }
        assert_eq!(messages.len(), self.count);
        messages
    }
}

/// A span's start and end, in nanoseconds since the Unix epoch: converted once, for both
/// [`span_len`] and [`put_span`].
#[derive(Clone, Copy)]
struct Times {
    start: u64,
    end: u64,
}

/// The size of a `Span` message's fields but its attributes, as [`put_span`] writes them.
fn span_len(span: &SpanRecord, times: Times) -> usize {
    let context = &span.context;
    let mut len = optional_len(context.trace_id.0.len())
        + optional_len(context.span_id.0.len())
        + optional_len(context.trace_state.as_deref().map_or(0, str::len))
        + span.parent.map_or(0, |parent| optional_len(parent.0.len()))
        + optional_len(span.name.len())
        // kind: a tag and a one-byte enumeration value
        + 2
        // start and end: a tag and eight bytes each, when not zero
        + fixed64_len(times.start)
        + fixed64_len(times.end)
        + span.links.iter().map(|link| field_len(link_len(link))).sum::<usize>()
        // flags: a tag (field 16 takes two bytes) and four bytes
        + 6;
    if span.status != StatusCode::Unset {
        len += field_len(status_len(span));
    }
    len
}

fn fixed64_len(value: u64) -> usize {
    if value == 0 { 0 } else { 9 }
}

fn status_len(span: &SpanRecord) -> usize {
    optional_len(span.status_message.as_deref().map_or(0, str::len)) + 2
}

fn link_len(link: &SpanContext) -> usize {
    optional_len(link.trace_id.0.len())
        + optional_len(link.span_id.0.len())
        + optional_len(link.trace_state.as_deref().map_or(0, str::len))
        // flags: a tag and four bytes
        + 5
}

fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        since
            .as_secs()
            .saturating_mul(1_000_000_000)
            .saturating_add(u64::from(since.subsec_nanos()))
    })
}

fn flags(sampled: bool, remote: bool) -> u32 {
    u32::from(sampled) | HAS_IS_REMOTE | if remote { IS_REMOTE } else { 0 }
}

/// One `Span` message's fields but its attributes ([`span_len`] is their size). The fields of
/// a fixed size (ids, kind, times, flags; 64 bytes at most) are gathered on the stack and
/// written with one copy.
fn put_span(out: &mut impl BufMut, span: &SpanRecord, times: Times) {
    let context = &span.context;
    let mut fixed = put::Prefix::<64>::with_room();
    fixed
        .len(1, context.trace_id.0.len())
        .raw(&context.trace_id.0)
        .len(2, context.span_id.0.len())
        .raw(&context.span_id.0);
    if let Some(parent) = &span.parent {
        fixed.len(4, parent.0.len()).raw(&parent.0);
    }
    // Every kind is 1 to 5: one byte.
    fixed.tag(6, put::VARINT).varint(span.kind as u64);
    for (field, time) in [(7, times.start), (8, times.end)] {
        if time != 0 {
            fixed.tag(field, put::FIXED64).fixed64(time);
        }
    }
    // Field 16 takes a two-byte tag.
    fixed
        .raw(&[16 << 3 | 5 | 0x80, 1])
        .fixed32(flags(context.sampled, span.parent_remote));
    fixed.write(out);
    put::bytes(
        out,
        3,
        context.trace_state.as_deref().unwrap_or("").as_bytes(),
    );
    put::bytes(out, 5, span.name.as_bytes());
    for link in &span.links {
        put::len(out, 13, link_len(link));
        put::bytes(out, 1, &link.trace_id.0);
        put::bytes(out, 2, &link.span_id.0);
        put::bytes(out, 3, link.trace_state.as_deref().unwrap_or("").as_bytes());
        put::fixed32(out, 6, flags(link.sampled, link.remote));
    }
    if span.status != StatusCode::Unset {
        put::len(out, 15, status_len(span));
        put::bytes(
            out,
            2,
            span.status_message.as_deref().unwrap_or("").as_bytes(),
        );
        // Ok and Error are 1 and 2: one byte.
        out.put_u8(3 << 3);
        out.put_u8(span.status as u8);
    }
}

/// Protobuf's wire format, as much as the OTLP trace messages use: fields written to any
/// buffer (a `Vec<u8>` too), every length known before its message is written, so each byte
/// is written once, in place. Every field number is below 16 (a one-byte tag) but `Span`'s
/// flags, written by [`put_span`].
mod put {
    use bytes::BufMut;

    pub(super) const VARINT: u8 = 0;
    pub(super) const FIXED64: u8 = 1;
    pub(super) const LEN: u8 = 2;
    const FIXED32: u8 = 5;

    /// How many bytes `value` takes as a varint.
    pub(super) fn varint_len(value: u64) -> usize {
        // One byte per started 7 bits, and one for zero.
        (64 - (value | 1).leading_zeros() as usize).div_ceil(7)
    }

    /// A varint at the start of `bytes`, and how many bytes it took.
    pub(super) fn read_varint(bytes: &[u8]) -> Option<(u64, usize)> {
        let mut value = 0_u64;
        for (at, byte) in bytes.iter().enumerate().take(10) {
            value |= u64::from(byte & 0x7f) << (7 * at);
            if byte & 0x80 == 0 {
                return Some((value, at + 1));
            }
        }
        None
    }

    /// A few tags and lengths gathered on the stack and written with one `put_slice` (a
    /// byte at a time costs a capacity check and a call each); `N` bytes at most.
    pub(super) struct Prefix<const N: usize = 24> {
        bytes: [u8; N],
        len: usize,
    }

    impl Default for Prefix {
        fn default() -> Prefix {
            Prefix::with_room()
        }
    }

    impl<const N: usize> Prefix<N> {
        /// An empty prefix of `N` bytes at most.
        pub(super) fn with_room() -> Prefix<N> {
            Prefix {
                bytes: [0; N],
                len: 0,
            }
        }

        fn byte(&mut self, byte: u8) -> &mut Prefix<N> {
            self.bytes[self.len] = byte;
            self.len += 1;
            self
        }

        pub(super) fn varint(&mut self, mut value: u64) -> &mut Prefix<N> {
            while value >= 0x80 {
                self.byte((value & 0x7f).to_le_bytes()[0] | 0x80);
                value >>= 7;
            }
            self.byte(value.to_le_bytes()[0])
        }

        pub(super) fn tag(&mut self, field: u8, wire_type: u8) -> &mut Prefix<N> {
            debug_assert!(field < 16, "field {field} takes a longer tag");
            self.byte(field << 3 | wire_type)
        }

        /// The tag and length of a length-delimited field whose body follows.
        pub(super) fn len(&mut self, field: u8, len: usize) -> &mut Prefix<N> {
            self.tag(field, LEN).varint(len as u64)
        }

        /// Bytes as they are (a short field's body).
        pub(super) fn raw(&mut self, data: &[u8]) -> &mut Prefix<N> {
            self.bytes[self.len..self.len + data.len()].copy_from_slice(data);
            self.len += data.len();
            self
        }

        pub(super) fn fixed64(&mut self, value: u64) -> &mut Prefix<N> {
            self.raw(&value.to_le_bytes())
        }

        pub(super) fn fixed32(&mut self, value: u32) -> &mut Prefix<N> {
            self.raw(&value.to_le_bytes())
        }

        pub(super) fn write(&self, out: &mut impl BufMut) {
            out.put_slice(&self.bytes[..self.len]);
        }
    }

    #[cfg(test)]
    pub(super) fn varint(out: &mut impl BufMut, value: u64) {
        Prefix::default().varint(value).write(out);
    }

    /// The tag and length of a length-delimited field whose body follows.
    pub(super) fn len(out: &mut impl BufMut, field: u8, len: usize) {
        Prefix::default().len(field, len).write(out);
    }

    /// A bytes or string field; an empty one is not written.
    pub(super) fn bytes(out: &mut impl BufMut, field: u8, data: &[u8]) {
        if !data.is_empty() {
            len(out, field, data.len());
            out.put_slice(data);
        }
    }

    pub(super) fn fixed32(out: &mut impl BufMut, field: u8, value: u32) {
        Prefix::default()
            .tag(field, FIXED32)
            .fixed32(value)
            .write(out);
    }
}

/// An attribute's value, as a span's field gives it.
#[derive(Clone, Copy)]
pub(crate) enum Value<'a> {
    Text(&'a str),
    /// Written as text, formatted straight into the message.
    Debug(&'a dyn fmt::Debug),
    Int(i64),
    Float(f64),
    Bool(bool),
}

/// An `AnyValue`'s one field, always written (a oneof member is present even at its
/// default).
#[derive(Clone, Copy)]
enum Payload<'a> {
    /// `string_value`, field 1.
    Text(&'a [u8]),
    /// `bool_value`, field 2.
    Bool(bool),
    /// `int_value`, field 3.
    Int(i64),
    /// `double_value`, field 4.
    Float(f64),
}

impl Payload<'_> {
    /// The size of the `AnyValue` message.
    fn len(self) -> usize {
        match self {
            Payload::Text(text) => field_len(text.len()),
            Payload::Bool(bool) => 1 + put::varint_len(u64::from(bool)),
            Payload::Int(int) => 1 + put::varint_len(u64::from_ne_bytes(int.to_ne_bytes())),
            Payload::Float(_) => 9,
        }
    }

    /// Writes the `AnyValue` field (`head` holds what comes before it).
    fn write(self, head: &mut put::Prefix, out: &mut impl BufMut) {
        match self {
            Payload::Text(text) => {
                head.len(1, text.len()).write(out);
                out.put_slice(text);
            }
            Payload::Bool(bool) => head.tag(2, put::VARINT).varint(u64::from(bool)).write(out),
            Payload::Int(int) => head
                .tag(3, put::VARINT)
                .varint(u64::from_ne_bytes(int.to_ne_bytes()))
                .write(out),
            Payload::Float(float) => head
                .tag(4, put::FIXED64)
                .fixed64(float.to_bits())
                .write(out),
        }
    }
}

/// One `KeyValue` as field `field` of its message (the key is always written).
#[inline]
fn key_value(out: &mut impl BufMut, field: u8, key: &str, value: Payload<'_>) {
    if let Payload::Text(text) = value {
        // The usual attribute, a short name and a short text: below 128 bytes in all, each
        // length is its one byte, and it is written in four pieces with no varint to work out.
        let any = 2 + text.len();
        let kv = 2 + key.len() + 2 + any;
        if let (Ok(kv @ 0..0x80), Ok(any), Ok(key_len), Ok(text_len)) = (
            u8::try_from(kv),
            u8::try_from(any),
            u8::try_from(key.len()),
            u8::try_from(text.len()),
        ) {
            out.put_slice(&[field << 3 | put::LEN, kv, 1 << 3 | put::LEN, key_len]);
            out.put_slice(key.as_bytes());
            out.put_slice(&[2 << 3 | put::LEN, any, 1 << 3 | put::LEN, text_len]);
            out.put_slice(text);
            return;
        }
    }
    let any = value.len();
    let kv = field_len(key.len()) + field_len(any);
    put::Prefix::default()
        .len(field, kv)
        .len(1, key.len())
        .write(out);
    out.put_slice(key.as_bytes());
    value.write(put::Prefix::default().len(2, any), out);
}

/// A span's attributes, kept as they are exported: each one a `KeyValue` written as field 9
/// of `Span` when it is recorded, so recording one allocates nothing of its own and exporting
/// the span copies them as they are.
#[derive(Debug, Default)]
pub(crate) struct Attributes {
    encoded: Vec<u8>,
}

/// `Span.attributes`: field 9.
const ATTRIBUTES: u8 = 9;
const ATTRIBUTE_TAG: u8 = ATTRIBUTES << 3 | put::LEN;

impl Attributes {
    pub(crate) fn with_capacity(bytes: usize) -> Attributes {
        Attributes {
            encoded: Vec::with_capacity(bytes),
        }
    }

    /// Adds an attribute (the caller knows `key` is not there yet), in one pass: its lengths
    /// are computed first. A `Debug` value is formatted first, as text.
    pub(crate) fn push(&mut self, key: &str, value: Value<'_>) {
        let formatted;
        let payload = match value {
            Value::Text(text) => Payload::Text(text.as_bytes()),
            Value::Debug(value) => {
                formatted = format!("{value:?}");
                Payload::Text(formatted.as_bytes())
            }
            Value::Bool(bool) => Payload::Bool(bool),
            Value::Int(int) => Payload::Int(int),
            Value::Float(float) => Payload::Float(float),
        };
        // The tags and lengths take at most 24 bytes, the value's own at most 11 more.
        let text = match payload {
            Payload::Text(text) => text.len(),
            _ => 0,
        };
        self.encoded.reserve(key.len() + text + 36);
        key_value(&mut self.encoded, ATTRIBUTES, key, payload);
    }

    /// Sets an attribute, replacing the value `key` had.
    pub(crate) fn set(&mut self, key: &str, value: Value<'_>) {
        if let Some(at) = self.find(key) {
            self.encoded.drain(at);
        }
        self.push(key, value);
    }

    /// Where the attribute `key` is in `encoded`.
    fn find(&self, key: &str) -> Option<std::ops::Range<usize>> {
        let bytes = self.encoded.as_slice();
        let mut at = 0;
        while at < bytes.len() {
            if bytes[at] != ATTRIBUTE_TAG {
                return None;
            }
            let (length, head) = put::read_varint(bytes.get(at + 1..)?)?;
            let body = at + 1 + head;
            let end = body.checked_add(usize::try_from(length).ok()?)?;
            // The body starts with the key: field 1, its length, its bytes.
            let kv = bytes.get(body..end)?;
            if kv.first() == Some(&(1 << 3 | 2))
                && let Some((key_length, key_head)) = put::read_varint(&kv[1..])
                && let Ok(key_length) = usize::try_from(key_length)
                && kv
                    .get(1 + key_head..)
                    .and_then(|rest| rest.get(..key_length))
                    == Some(key.as_bytes())
            {
                return Some(at..end);
            }
            at = end;
        }
        None
    }

    /// The `Span.attributes` fields, to write the rest of the span after them.
    pub(crate) fn encoded(&self) -> &[u8] {
        &self.encoded
    }
}

/// The resource every span is exported under: the service name, the resource attributes of
/// `OTEL_RESOURCE_ATTRIBUTES`, and what sent them.
fn resource_attributes(export: &TraceExport) -> Vec<(String, String)> {
    let mut attributes: Vec<(String, String)> = vec![
        ("service.name".to_owned(), export.service_name.clone()),
        ("telemetry.sdk.name".to_owned(), "toolgate".to_owned()),
        ("telemetry.sdk.language".to_owned(), "rust".to_owned()),
        (
            "telemetry.sdk.version".to_owned(),
            env!("CARGO_PKG_VERSION").to_owned(),
        ),
    ];
    for (key, value) in &export.resource_attributes {
        if !attributes.iter().any(|(known, _)| known == key) {
            attributes.push((key.clone(), value.clone()));
        }
    }
    attributes
}

/// The `OTEL_EXPORTER_OTLP_HEADERS` pairs as gRPC metadata.
fn metadata(headers: &[(String, String)]) -> Result<MetadataMap, TelemetryError> {
    let mut map = MetadataMap::new();
    for (key, value) in headers {
        let name = tonic::metadata::MetadataKey::from_bytes(key.to_ascii_lowercase().as_bytes())
            .map_err(|_| {
                TelemetryError(format!(
                    "OTEL_EXPORTER_OTLP_HEADERS: `{key}` is not a gRPC metadata name"
                ))
            })?;
        let value = value.parse().map_err(|_| {
            TelemetryError(format!(
                "OTEL_EXPORTER_OTLP_HEADERS: the value of `{key}` is not a header value"
            ))
        })?;
        map.insert(name, value);
    }
    Ok(map)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::telemetry::recorder::Kind;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, any_value};
    use prost::Message as _;
    use std::borrow::Cow;
    use toolgate_core::trace::{SpanId, TraceId};

    fn export() -> TraceExport {
        TraceExport {
            endpoint: "http://127.0.0.1:4317".to_owned(),
            service_name: "toolgate-eu".to_owned(),
            resource_attributes: vec![
                ("deployment.environment".to_owned(), "prod".to_owned()),
                ("service.name".to_owned(), "ignored".to_owned()),
            ],
            headers: Vec::new(),
            timeout: Duration::from_secs(10),
            schedule_delay: Duration::from_secs(5),
            max_queue: 2_048,
            max_batch: 512,
            sampler: crate::telemetry::Sampler::default(),
        }
    }

    /// `records` as the exporter takes them from its queue.
    fn batch(records: Vec<SpanRecord>) -> Spans {
        let queue = SpanQueue::new(records.len().max(1), 1);
        let count = records.len();
        for record in records {
            queue.push(record);
        }
        let spans = queue.take(usize::MAX);
        assert_eq!(spans.len(), count);
        spans
    }

    fn record(start: SystemTime) -> SpanRecord {
        let context = SpanContext {
            trace_id: TraceId([7; 16]),
            span_id: SpanId([8; 8]),
            sampled: true,
            trace_state: Some(Arc::from("congo=t61")),
            remote: false,
        };
        SpanRecord {
            links: vec![SpanContext {
                span_id: SpanId([9; 8]),
                remote: true,
                trace_state: None,
                ..context.clone()
            }],
            context,
            parent: Some(SpanId([6; 8])),
            parent_remote: true,
            name: Cow::Borrowed("execute_tool slack.post_message"),
            kind: Kind::Internal,
            status: StatusCode::Error,
            status_message: Some("refused".to_owned()),
            start,
            end: start + Duration::from_micros(250),
            attributes: attributes(&[
                ("gen_ai.tool.name", Value::Text("slack.post_message")),
                ("empty", Value::Text("")),
                ("toolgate.attempts", Value::Int(1)),
                ("negative", Value::Int(-3)),
                ("toolgate.replayed", Value::Bool(false)),
                ("ratio", Value::Float(0.5)),
                ("shown", Value::Debug(&Some(7))),
            ]),
        }
    }

    fn attributes(pairs: &[(&str, Value<'_>)]) -> Attributes {
        let mut attributes = Attributes::default();
        for (key, value) in pairs {
            attributes.push(key, *value);
        }
        attributes
    }

    fn text(value: &str) -> Option<AnyValue> {
        Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        })
    }

    /// What the exporter writes is what the official proto's generated messages read.
    #[test]
    fn the_request_decodes_with_the_official_proto() {
        let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let root = SpanRecord {
            parent: None,
            parent_remote: false,
            links: Vec::new(),
            status: StatusCode::Unset,
            kind: Kind::Server,
            attributes: Attributes::default(),
            ..record(start)
        };
        let bytes = Head::new(&export()).request(&batch(vec![record(start), root]));
        let request = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        assert_eq!(request.resource_spans.len(), 1);
        let resource_spans = &request.resource_spans[0];
        let resource: Vec<(String, Option<AnyValue>)> = resource_spans
            .resource
            .as_ref()
            .unwrap()
            .attributes
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect();
        assert_eq!(
            resource[0],
            ("service.name".to_owned(), text("toolgate-eu"))
        );
        assert!(resource.contains(&("deployment.environment".to_owned(), text("prod"))));
        assert_eq!(resource.len(), 5, "{resource:?}");
        let scope_spans = &resource_spans.scope_spans[0];
        let scope = scope_spans.scope.as_ref().unwrap();
        assert_eq!(scope.name, "toolgate");
        assert_eq!(scope_spans.spans.len(), 2);

        let span = &scope_spans.spans[0];
        assert_eq!(span.trace_id, vec![7; 16]);
        assert_eq!(span.span_id, vec![8; 8]);
        assert_eq!(span.parent_span_id, vec![6; 8]);
        assert_eq!(span.trace_state, "congo=t61");
        assert_eq!(span.flags, 1 | HAS_IS_REMOTE | IS_REMOTE);
        assert_eq!(span.name, "execute_tool slack.post_message");
        assert_eq!(span.kind, 1);
        assert_eq!(span.start_time_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(span.end_time_unix_nano - span.start_time_unix_nano, 250_000);
        assert_eq!(span.status.as_ref().map(|s| s.code), Some(2));
        assert_eq!(span.status.as_ref().unwrap().message, "refused");
        let attributes: Vec<(&str, Option<any_value::Value>)> = span
            .attributes
            .iter()
            .map(|kv| {
                (
                    kv.key.as_str(),
                    kv.value.as_ref().and_then(|v| v.value.clone()),
                )
            })
            .collect();
        assert_eq!(
            attributes,
            [
                (
                    "gen_ai.tool.name",
                    Some(any_value::Value::StringValue("slack.post_message".into()))
                ),
                ("empty", Some(any_value::Value::StringValue(String::new()))),
                ("toolgate.attempts", Some(any_value::Value::IntValue(1))),
                ("negative", Some(any_value::Value::IntValue(-3))),
                (
                    "toolgate.replayed",
                    Some(any_value::Value::BoolValue(false))
                ),
                ("ratio", Some(any_value::Value::DoubleValue(0.5))),
                (
                    "shown",
                    Some(any_value::Value::StringValue("Some(7)".into()))
                ),
            ]
        );
        assert_eq!(span.links.len(), 1);
        assert_eq!(span.links[0].span_id, vec![9; 8]);
        assert_eq!(span.links[0].trace_state, "");
        assert_eq!(span.links[0].flags, 1 | HAS_IS_REMOTE | IS_REMOTE);

        let root = &scope_spans.spans[1];
        assert!(root.parent_span_id.is_empty());
        assert_eq!(root.kind, 2);
        assert_eq!(root.status, None);
        assert_eq!(root.flags, 1 | HAS_IS_REMOTE);
        assert!(root.attributes.is_empty() && root.links.is_empty());
    }

    /// An exporter to a collector on loopback `port`, with three spans queued.
    fn three_spans_for(port: u16, timeout: Duration) -> (Exporter, Arc<SpanQueue>) {
        three_spans_to(&TraceExport {
            endpoint: format!("http://127.0.0.1:{port}"),
            timeout,
            ..export()
        })
    }

    /// An exporter as `export` says, with three spans queued.
    fn three_spans_to(export: &TraceExport) -> (Exporter, Arc<SpanQueue>) {
        let queue = Arc::new(SpanQueue::new(16, 8));
        let exporter = Exporter::start(export, Arc::clone(&queue)).unwrap();
        let start = UNIX_EPOCH + Duration::from_secs(1);
        for _ in 0..3 {
            queue.push(record(start));
        }
        (exporter, queue)
    }

    /// A collector that is not there: the export fails, the spans are counted lost, and
    /// shutdown still ends.
    #[tokio::test]
    async fn spans_of_a_failed_export_are_counted_lost() {
        let port = {
            let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            listener.local_addr().unwrap().port()
        };
        let (exporter, queue) = three_spans_for(port, Duration::from_secs(2));
        let lost = exporter.shutdown(Duration::from_secs(10)).await;
        assert_eq!(lost, 3);
        assert!(queue.take(usize::MAX).is_empty());
    }

    /// An export a collector was sent: its `x-tenant` header and its spans.
    type Seen = (Option<String>, usize);

    /// A collector on loopback that keeps what each request it is sent carried, and answers
    /// with `refuse` when set.
    #[derive(Clone, Default)]
    struct Requests {
        seen: Arc<std::sync::Mutex<Vec<Seen>>>,
        refuse: Option<tonic::Code>,
    }

    #[tonic::async_trait]
    impl opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceService
        for Requests
    {
        async fn export(
            &self,
            request: tonic::Request<ExportTraceServiceRequest>,
        ) -> Result<
            tonic::Response<
                opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceResponse,
            >,
            tonic::Status,
        > {
            let tenant = request
                .metadata()
                .get("x-tenant")
                .and_then(|value| value.to_str().ok())
                .map(str::to_owned);
            let spans = request
                .into_inner()
                .resource_spans
                .iter()
                .flat_map(|resource| &resource.scope_spans)
                .map(|scope| scope.spans.len())
                .sum();
            self.seen.lock().unwrap().push((tenant, spans));
            match self.refuse {
                Some(code) => Err(tonic::Status::new(code, "the collector is full")),
                None => Ok(tonic::Response::new(Default::default())),
            }
        }
    }

    impl Requests {
        /// Serves on a free loopback port, returned.
        async fn serve(&self) -> u16 {
            use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::TraceServiceServer;
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let port = listener.local_addr().unwrap().port();
            let service = TraceServiceServer::new(self.clone());
            tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
            );
            port
        }

        fn sizes(&self) -> Vec<usize> {
            self.seen
                .lock()
                .unwrap()
                .iter()
                .map(|(_, spans)| *spans)
                .collect()
        }
    }

    /// A full batch wakes the exporter, and only full batches go then: the rest of the queue
    /// waits for the next batch or the schedule, rather than following at once as a small
    /// export that costs a round trip of its own. A stop sends it.
    #[tokio::test]
    async fn a_full_batch_goes_alone_and_the_rest_waits_for_the_schedule() {
        let collector = Requests::default();
        let port = collector.serve().await;
        let export = TraceExport {
            endpoint: format!("http://127.0.0.1:{port}"),
            schedule_delay: Duration::from_secs(600),
            ..export()
        };
        // Six spans, batches of four: the fourth signals a full batch.
        let queue = Arc::new(SpanQueue::new(16, 4));
        let start = UNIX_EPOCH + Duration::from_secs(1);
        for _ in 0..6 {
            queue.push(record(start));
        }
        let exporter = Exporter::start(&export, Arc::clone(&queue)).unwrap();
        let began = std::time::Instant::now();
        while collector.sizes().is_empty() {
            assert!(
                began.elapsed() < Duration::from_secs(20),
                "no export arrived"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Time for a second export, had the rest followed.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(collector.sizes(), [4]);
        assert_eq!(queue.len(), 2);
        // Two more make a full batch with the two waiting.
        for _ in 0..2 {
            queue.push(record(start));
        }
        while collector.sizes().len() < 2 {
            assert!(
                began.elapsed() < Duration::from_secs(20),
                "no second export"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // One left over, sent by the stop.
        queue.push(record(start));
        assert_eq!(exporter.shutdown(Duration::from_secs(10)).await, 0);
        assert_eq!(collector.sizes(), [4, 4, 1]);
    }

    /// A collector's refusal (a gRPC status, sent as a trailers-only answer) fails the
    /// export: its spans count as lost. The request carried the configured headers and every
    /// span.
    #[tokio::test]
    async fn a_refused_export_counts_its_spans_lost() {
        let collector = Requests {
            refuse: Some(tonic::Code::ResourceExhausted),
            ..Requests::default()
        };
        let port = collector.serve().await;
        let (exporter, _queue) = three_spans_to(&TraceExport {
            endpoint: format!("http://127.0.0.1:{port}"),
            headers: vec![("X-Tenant".to_owned(), "acme".to_owned())],
            ..export()
        });
        assert_eq!(exporter.shutdown(Duration::from_secs(10)).await, 3);
        assert_eq!(
            *collector.seen.lock().unwrap(),
            [(Some("acme".to_owned()), 3)]
        );
    }

    /// A collector that takes the connection and never answers: stopping does not wait past
    /// its limit, and the spans it held count as lost.
    #[tokio::test]
    async fn a_silent_collector_costs_the_spans_not_the_shutdown() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming().flatten() {
                held.push(stream);
            }
        });
        let (exporter, queue) = three_spans_for(port, Duration::from_secs(30));
        let began = std::time::Instant::now();
        let lost = exporter.shutdown(Duration::from_millis(500)).await;
        assert!(queue.take(usize::MAX).is_empty());
        assert!(
            began.elapsed() < Duration::from_secs(5),
            "{:?}",
            began.elapsed()
        );
        assert_eq!(lost, 3);
    }

    #[test]
    fn lengths_past_one_varint_byte_are_framed_right() {
        let start = UNIX_EPOCH + Duration::from_secs(1);
        let long = "x".repeat(70_000);
        let spans = batch(
            (0..4)
                .map(|_| SpanRecord {
                    attributes: attributes(&[("long", Value::Text(&long))]),
                    ..record(start)
                })
                .collect(),
        );
        let bytes = Head::new(&export()).request(&spans);
        let request = ExportTraceServiceRequest::decode(bytes.as_slice()).unwrap();
        let decoded = &request.resource_spans[0].scope_spans[0].spans;
        assert_eq!(decoded.len(), 4);
        assert!(
            decoded
                .iter()
                .all(|span| span.attributes[0].value == text(&long))
        );
    }

    #[test]
    fn attributes_of_every_length_near_one_length_byte_decode_with_the_official_proto() {
        use opentelemetry_proto::tonic::trace::v1::Span;
        // A `KeyValue` of key k and text t takes 6 + k + t bytes: one length byte each up to
        // 127, two past it, for the key, the text and the whole pair.
        for key_len in [1, 20, 60, 120, 121, 127, 128, 130] {
            for text_len in [
                0, 1, 59, 60, 61, 100, 117, 121, 122, 126, 127, 128, 129, 300,
            ] {
                let key = "k".repeat(key_len);
                let value = "v".repeat(text_len);
                let set = attributes(&[("first", Value::Int(1)), (&key, Value::Text(&value))]);
                let span = Span::decode(set.encoded()).unwrap();
                assert_eq!(span.attributes.len(), 2, "key {key_len}, text {text_len}");
                assert_eq!(span.attributes[1].key, key);
                assert_eq!(
                    span.attributes[1].value,
                    text(&value),
                    "key {key_len}, text {text_len}"
                );
            }
        }
    }

    #[test]
    fn an_attribute_set_again_replaces_its_value_wherever_it_is() {
        let long = "y".repeat(300);
        let mut set = attributes(&[
            ("a", Value::Text("first")),
            ("long", Value::Text(&long)),
            ("b", Value::Int(1)),
        ]);
        set.set("long", Value::Int(2));
        set.set("a", Value::Bool(true));
        set.set("new", Value::Text("n"));
        set.set("ab", Value::Int(3));
        let expected = attributes(&[
            ("b", Value::Int(1)),
            ("long", Value::Int(2)),
            ("a", Value::Bool(true)),
            ("new", Value::Text("n")),
            ("ab", Value::Int(3)),
        ]);
        assert_eq!(set.encoded(), expected.encoded());
    }

    #[test]
    fn varint_lengths_are_what_varint_writes() {
        for value in [0, 1, 127, 128, 16_383, 16_384, 1 << 35, u64::MAX] {
            let mut out = Vec::new();
            put::varint(&mut out, value);
            assert_eq!(put::varint_len(value), out.len(), "{value}");
            assert_eq!(put::read_varint(&out), Some((value, out.len())));
        }
    }
}
