//! The OTLP/gRPC exporter: takes the recorder's closed spans in batches and sends them to the
//! collector's `TraceService/Export` (the official OpenTelemetry proto, over the gateway's own
//! tonic), on a schedule or as soon as a batch is full, as the standard batch span processor
//! does (`OTEL_BSP_*`). A collector that is away costs dropped spans, counted and logged, never
//! a caller's time: nothing on a call's path waits for an export.

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_client::TraceServiceClient;
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span, Status, span};
use tokio::sync::watch;
use tonic::metadata::MetadataMap;
use tonic::transport::{Channel, Endpoint};

use toolgate_core::trace::SpanContext;

use super::recorder::{SpanQueue, SpanRecord, StatusCode, Value};
use super::{TelemetryError, TraceExport};

/// W3C trace flags, and whether the parent (or linked span) is remote (OTLP `SpanFlags`).
const HAS_IS_REMOTE: u32 = 0x100;
const IS_REMOTE: u32 = 0x200;

/// The running exporter.
#[derive(Debug)]
pub(crate) struct Exporter {
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
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
        let client = TraceServiceClient::new(endpoint.connect_lazy());
        let batches = Batches {
            resource: resource(export),
            headers: metadata(&export.headers)?,
            endpoint: export.endpoint.clone(),
            client,
            failing: 0,
        };
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(
            batches,
            Arc::clone(&queue),
            export.schedule_delay,
            stopped,
        ));
        Ok(Exporter { stop, task, queue })
    }

    /// Exports what is queued and stops; waits at most `limit`.
    pub(crate) async fn shutdown(self, limit: Duration) {
        let _ = self.stop.send(true);
        let mut task = self.task;
        if tokio::time::timeout(limit, &mut task).await.is_err() {
            task.abort();
            tracing::warn!(
                queued = self.queue.len(),
                "the last traces were not all exported in time"
            );
        }
        let dropped = self.queue.dropped();
        if dropped > 0 {
            tracing::warn!(
                dropped,
                "spans were dropped because the export queue was full (raise OTEL_BSP_MAX_QUEUE_SIZE or check the collector)"
            );
        }
    }
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
    resource: Resource,
    headers: MetadataMap,
    endpoint: String,
    client: TraceServiceClient<Channel>,
    /// Batches failed in a row (the first failure is logged, and the recovery).
    failing: u64,
}

impl Batches {
    async fn send(&mut self, batch: Vec<SpanRecord>) {
        let count = batch.len();
        let mut request = tonic::Request::new(self.encode(batch));
        *request.metadata_mut() = self.headers.clone();
        match self.client.export(request).await {
            Ok(_) => {
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
                        spans = count,
                        code = ?status.code(),
                        error = status.message(),
                        "exporting traces failed; spans are dropped until the collector answers"
                    );
                }
                self.failing += 1;
            }
        }
    }

    fn encode(&self, batch: Vec<SpanRecord>) -> ExportTraceServiceRequest {
        ExportTraceServiceRequest {
            resource_spans: vec![ResourceSpans {
                resource: Some(self.resource.clone()),
                scope_spans: vec![ScopeSpans {
                    scope: Some(InstrumentationScope {
                        name: "toolgate".to_owned(),
                        version: env!("CARGO_PKG_VERSION").to_owned(),
                        attributes: Vec::new(),
                        dropped_attributes_count: 0,
                    }),
                    spans: batch.into_iter().map(encode_span).collect(),
                    schema_url: String::new(),
                }],
                schema_url: String::new(),
            }],
        }
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

fn trace_state(context: &SpanContext) -> String {
    context
        .trace_state
        .as_deref()
        .map(str::to_owned)
        .unwrap_or_default()
}

fn encode_span(record: SpanRecord) -> Span {
    let status = match record.status {
        StatusCode::Unset => None,
        code => Some(Status {
            message: record.status_message.unwrap_or_default(),
            code: code as i32,
        }),
    };
    Span {
        trace_id: record.context.trace_id.0.to_vec(),
        span_id: record.context.span_id.0.to_vec(),
        trace_state: trace_state(&record.context),
        parent_span_id: record.parent.map(|id| id.0.to_vec()).unwrap_or_default(),
        flags: flags(record.context.sampled, record.parent_remote),
        name: record.name.into_owned(),
        kind: record.kind as i32,
        start_time_unix_nano: unix_nanos(record.start),
        end_time_unix_nano: unix_nanos(record.end),
        attributes: record
            .attributes
            .into_iter()
            .map(|(key, value)| key_value(key, value))
            .collect(),
        dropped_attributes_count: 0,
        events: Vec::new(),
        dropped_events_count: 0,
        links: record
            .links
            .iter()
            .map(|link| span::Link {
                trace_id: link.trace_id.0.to_vec(),
                span_id: link.span_id.0.to_vec(),
                trace_state: trace_state(link),
                attributes: Vec::new(),
                dropped_attributes_count: 0,
                flags: flags(link.sampled, link.remote),
            })
            .collect(),
        dropped_links_count: 0,
        status,
    }
}

fn key_value(key: &str, value: Value) -> KeyValue {
    let value = match value {
        Value::Text(text) => any_value::Value::StringValue(text),
        Value::Int(int) => any_value::Value::IntValue(int),
        Value::Float(float) => any_value::Value::DoubleValue(float),
        Value::Bool(bool) => any_value::Value::BoolValue(bool),
    };
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue { value: Some(value) }),
        key_strindex: 0,
    }
}

/// The resource every span is exported under: the service name, the resource attributes of
/// `OTEL_RESOURCE_ATTRIBUTES`, and what sent them.
fn resource(export: &TraceExport) -> Resource {
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
    Resource {
        attributes: attributes
            .into_iter()
            .map(|(key, value)| KeyValue {
                key,
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue(value)),
                }),
                key_strindex: 0,
            })
            .collect(),
        dropped_attributes_count: 0,
        entity_refs: Vec::new(),
    }
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
    use std::borrow::Cow;
    use toolgate_core::trace::{SpanId, TraceId};

    #[test]
    fn a_record_becomes_an_otlp_span() {
        let context = SpanContext {
            trace_id: TraceId([7; 16]),
            span_id: SpanId([8; 8]),
            sampled: true,
            trace_state: Some(Arc::from("congo=t61")),
            remote: false,
        };
        let start = UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let record = SpanRecord {
            links: vec![SpanContext {
                span_id: SpanId([9; 8]),
                remote: true,
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
                ("toolgate.attempts", Value::Int(1)),
                ("toolgate.replayed", Value::Bool(false)),
            ],
        };
        let span = encode_span(record);
        assert_eq!(span.trace_id, vec![7; 16]);
        assert_eq!(span.span_id, vec![8; 8]);
        assert_eq!(span.parent_span_id, vec![6; 8]);
        assert_eq!(span.trace_state, "congo=t61");
        assert_eq!(span.flags, 1 | HAS_IS_REMOTE | IS_REMOTE);
        assert_eq!(span.kind, 1);
        assert_eq!(span.start_time_unix_nano, 1_700_000_000_000_000_000);
        assert_eq!(span.end_time_unix_nano - span.start_time_unix_nano, 250_000);
        assert_eq!(span.status.as_ref().map(|s| s.code), Some(2));
        assert_eq!(span.attributes.len(), 3);
        assert_eq!(span.attributes[1].key, "toolgate.attempts");
        assert_eq!(
            span.attributes[1].value,
            Some(AnyValue {
                value: Some(any_value::Value::IntValue(1))
            })
        );
        assert_eq!(span.links.len(), 1);
        assert_eq!(span.links[0].span_id, vec![9; 8]);
        assert_eq!(span.links[0].flags, 1 | HAS_IS_REMOTE | IS_REMOTE);
    }
}
