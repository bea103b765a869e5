//! The OTLP/gRPC exporter: takes the recorder's closed spans in batches and sends them to the
//! collector's `TraceService/Export` (the official OpenTelemetry proto, over the gateway's own
//! tonic), on a schedule or as soon as a batch is full, as the standard batch span processor
//! does (`OTEL_BSP_*`). A collector that is away costs dropped spans, counted and logged, never
//! a caller's time: nothing on a call's path waits for an export.
//!
//! The request is written straight to protobuf (`wire`), field by field from the records,
//! rather than built as a tree of generated messages first: a span's attribute keys, ids and
//! values are copied once into the request's bytes instead of into a dozen small allocations
//! each. The tests decode what it writes with the generated messages of the official proto.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::sync::watch;
use tonic::codegen::http::uri::PathAndQuery;
use tonic::metadata::MetadataMap;
use tonic::transport::{Channel, Endpoint};

use toolgate_core::trace::SpanContext;
use toolgate_proto::raw::RawCodec;

use super::recorder::{SpanQueue, SpanRecord, StatusCode, Value};
use super::{TelemetryError, TraceExport};

/// The collector's method.
const EXPORT: &str = "/opentelemetry.proto.collector.trace.v1.TraceService/Export";

/// W3C trace flags, and whether the parent (or linked span) is remote (OTLP `SpanFlags`).
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// The running exporter.
#[derive(Debug)]
pub(crate) struct Exporter {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
    losses: Arc<Losses>,
    queue: Arc<SpanQueue>,
}

impl Exporter {
    /// Starts exporting what `queue` collects to `export.endpoint` (connecting on the first
    /// export). Must run inside the Tokio runtime.
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
        let batches = Batches {
            head: Head::new(export),
            headers: metadata(&export.headers)?,
            endpoint: export.endpoint.clone(),
            client: tonic::client::Grpc::new(endpoint.connect_lazy()),
            failing: 0,
            losses: Arc::new(Losses::default()),
        };
        let losses = Arc::clone(&batches.losses);
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(
            batches,
            Arc::clone(&queue),
            export.schedule_delay,
            stopped,
        ));
        Ok(Exporter {
            stop,
            task,
            queue,
            losses,
        })
    }

    /// Exports what is queued and stops; waits at most `limit`. Returns the spans lost to
    /// failed exports (also logged).
    pub(crate) async fn shutdown(self, limit: Duration) -> u64 {
        let _ = self.stop.send(true);
        let mut task = self.task;
        let ended = tokio::time::timeout(limit, &mut task).await;
        if !matches!(ended, Ok(Ok(()))) {
            // Not done in time (or it panicked): what it held and what is still queued is lost.
            task.abort();
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
        let stopping = tokio::select! {
            () = tokio::time::sleep(delay) => false,
            () = queue.full() => false,
            _ = stopped.changed() => true,
        };
        loop {
            let batch = queue.take(queue.batch());
            if batch.is_empty() {
                break;
            }
            batches.send(&batch).await;
        }
        if stopping {
            return;
        }
    }
}

/// What every export shares, and the client.
#[derive(Debug)]
struct Batches {
    head: Head,
    headers: MetadataMap,
    endpoint: String,
    client: tonic::client::Grpc<Channel>,
    /// Batches failed in a row (the first failure is logged, and the recovery).
    failing: u64,
    losses: Arc<Losses>,
}

impl Batches {
    async fn send(&mut self, batch: &[SpanRecord]) {
        let count = u64::try_from(batch.len()).unwrap_or(u64::MAX);
        self.losses.in_flight.store(count, Ordering::Relaxed);
        let mut request = tonic::Request::new(self.head.request(batch));
        *request.metadata_mut() = self.headers.clone();
        let sent = match self.client.ready().await {
            Ok(()) => self
                .client
                // The answer only reports spans the collector rejected, which this exporter
                // would not send again anyway: it is not read.
                .unary::<_, Vec<u8>, _>(request, PathAndQuery::from_static(EXPORT), RawCodec)
                .await
                .map(drop),
            Err(error) => Err(tonic::Status::unavailable(error.to_string())),
        };
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
                        spans = batch.len(),
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
            wire::message(&mut resource, 1, |kv| {
                key_value(kv, &key, &Value::Text(value));
            });
        }
        let mut scope = Vec::new();
        wire::string(&mut scope, 1, "toolgate");
        wire::string(&mut scope, 2, env!("CARGO_PKG_VERSION"));
        Head { resource, scope }
    }

    /// `ExportTraceServiceRequest { resource_spans: [{ resource, scope_spans: [{ scope,
    /// spans }] }] }`.
    fn request(&self, batch: &[SpanRecord]) -> Vec<u8> {
        let mut out = Vec::with_capacity(256 + batch.len() * 512);
        wire::message(&mut out, 1, |resource_spans| {
            wire::bytes_always(resource_spans, 1, &self.resource);
            wire::message(resource_spans, 2, |scope_spans| {
                wire::bytes_always(scope_spans, 1, &self.scope);
                for span in batch {
                    wire::message(scope_spans, 2, |out| encode_span(out, span));
                }
            });
        });
        out
    }
}

fn unix_nanos(time: SystemTime) -> u64 {
    time.duration_since(UNIX_EPOCH).map_or(0, |since| {
        u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
    })
}

fn flags(sampled: bool, remote: bool) -> u32 {
    u32::from(sampled) | HAS_IS_REMOTE | if remote { IS_REMOTE } else { 0 }
}

/// One `Span` message's fields.
fn encode_span(out: &mut Vec<u8>, span: &SpanRecord) {
    let context = &span.context;
    wire::bytes(out, 1, &context.trace_id.0);
    wire::bytes(out, 2, &context.span_id.0);
    wire::string(out, 3, context.trace_state.as_deref().unwrap_or(""));
    if let Some(parent) = &span.parent {
        wire::bytes(out, 4, &parent.0);
    }
    wire::string(out, 5, &span.name);
    wire::uint(out, 6, span.kind as u64);
    wire::fixed64(out, 7, unix_nanos(span.start));
    wire::fixed64(out, 8, unix_nanos(span.end));
    for (key, value) in &span.attributes {
        wire::message(out, 9, |kv| key_value(kv, key, value));
    }
    for link in &span.links {
        wire::message(out, 13, |out| encode_link(out, link));
    }
    if span.status != StatusCode::Unset {
        wire::message(out, 15, |status| {
            wire::string(status, 2, span.status_message.as_deref().unwrap_or(""));
            wire::uint(status, 3, span.status as u64);
        });
    }
    wire::fixed32(out, 16, flags(context.sampled, span.parent_remote));
}

/// One `Span.Link` message's fields.
fn encode_link(out: &mut Vec<u8>, link: &SpanContext) {
    wire::bytes(out, 1, &link.trace_id.0);
    wire::bytes(out, 2, &link.span_id.0);
    wire::string(out, 3, link.trace_state.as_deref().unwrap_or(""));
    wire::fixed32(out, 6, flags(link.sampled, link.remote));
}

/// One `KeyValue` message's fields: the key and an `AnyValue` whose one field is always
/// written (a oneof member is present even at its default).
fn key_value(out: &mut Vec<u8>, key: &str, value: &Value) {
    wire::string(out, 1, key);
    wire::message(out, 2, |any| match value {
        Value::Text(text) => wire::bytes_always(any, 1, text.as_bytes()),
        Value::Bool(bool) => {
            wire::tag(any, 2, wire::VARINT);
            wire::varint(any, u64::from(*bool));
        }
        Value::Int(int) => {
            wire::tag(any, 3, wire::VARINT);
            wire::varint(any, u64::from_ne_bytes(int.to_ne_bytes()));
        }
        Value::Float(float) => {
            wire::tag(any, 4, wire::FIXED64);
            any.extend_from_slice(&float.to_bits().to_le_bytes());
        }
    });
}

/// Protobuf's wire format, as much as the OTLP trace messages use.
mod wire {
    pub(super) const VARINT: u8 = 0;
    pub(super) const FIXED64: u8 = 1;
    const LEN: u8 = 2;
    const FIXED32: u8 = 5;

    pub(super) fn varint(out: &mut Vec<u8>, mut value: u64) {
        while value >= 0x80 {
            out.push((value & 0x7f).to_le_bytes()[0] | 0x80);
            value >>= 7;
        }
        out.push(value.to_le_bytes()[0]);
    }

    pub(super) fn tag(out: &mut Vec<u8>, field: u32, wire_type: u8) {
        varint(out, u64::from(field) << 3 | u64::from(wire_type));
    }

    /// A length-delimited field, written even when empty.
    pub(super) fn bytes_always(out: &mut Vec<u8>, field: u32, data: &[u8]) {
        tag(out, field, LEN);
        varint(out, data.len() as u64);
        out.extend_from_slice(data);
    }

    /// A `bytes` field; an empty one is the default and is not written.
    pub(super) fn bytes(out: &mut Vec<u8>, field: u32, data: &[u8]) {
        if !data.is_empty() {
            bytes_always(out, field, data);
        }
    }

    /// A `string` field; an empty one is not written.
    pub(super) fn string(out: &mut Vec<u8>, field: u32, text: &str) {
        bytes(out, field, text.as_bytes());
    }

    /// A `uint32`/`uint64`/enum field; zero is not written.
    pub(super) fn uint(out: &mut Vec<u8>, field: u32, value: u64) {
        if value != 0 {
            tag(out, field, VARINT);
            varint(out, value);
        }
    }

    pub(super) fn fixed64(out: &mut Vec<u8>, field: u32, value: u64) {
        if value != 0 {
            tag(out, field, FIXED64);
            out.extend_from_slice(&value.to_le_bytes());
        }
    }

    pub(super) fn fixed32(out: &mut Vec<u8>, field: u32, value: u32) {
        if value != 0 {
            tag(out, field, FIXED32);
            out.extend_from_slice(&value.to_le_bytes());
        }
    }

    /// An embedded message: `body` writes its fields after the tag and one byte kept for the
    /// length, which most of these messages fit (under 128 bytes: an attribute, its value, a
    /// link); a longer one moves its body up to make room for the longer length.
    pub(super) fn message(out: &mut Vec<u8>, field: u32, body: impl FnOnce(&mut Vec<u8>)) {
        tag(out, field, LEN);
        let at = out.len();
        out.push(0);
        body(out);
        let length = out.len() - at - 1;
        if length < 0x80 {
            out[at] = length.to_le_bytes()[0];
            return;
        }
        let mut head = [0_u8; 10];
        let mut size = 0;
        let mut value = length as u64;
        while value >= 0x80 {
            head[size] = (value & 0x7f).to_le_bytes()[0] | 0x80;
            value >>= 7;
            size += 1;
        }
        head[size] = value.to_le_bytes()[0];
        size += 1;
        // One byte is already there; make room for the rest and write the length.
        out.splice(at + 1..at + 1, head[1..size].iter().copied());
        out[at..at + size].copy_from_slice(&head[..size]);
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
        }
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
            status_message: None,
            start,
            end: start + Duration::from_micros(250),
            attributes: vec![
                ("gen_ai.tool.name", Value::Text("slack.post_message".into())),
                ("empty", Value::Text(String::new())),
                ("toolgate.attempts", Value::Int(1)),
                ("negative", Value::Int(-3)),
                ("toolgate.replayed", Value::Bool(false)),
                ("ratio", Value::Float(0.5)),
            ],
        }
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
            attributes: Vec::new(),
            ..record(start)
        };
        let bytes = Head::new(&export()).request(&[record(start), root]);
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
        let export = TraceExport {
            endpoint: format!("http://127.0.0.1:{port}"),
            timeout,
            ..export()
        };
        let queue = Arc::new(SpanQueue::new(16, 8));
        let exporter = Exporter::start(&export, Arc::clone(&queue)).unwrap();
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
        let span = SpanRecord {
            attributes: vec![("long", Value::Text(long.clone()))],
            ..record(start)
        };
        let spans: Vec<SpanRecord> = (0..3)
            .map(|_| SpanRecord {
                attributes: vec![("long", Value::Text(long.clone()))],
                ..record(start)
            })
            .chain([span])
            .collect();
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
}
