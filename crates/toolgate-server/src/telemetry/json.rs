//! `TOOLGATE_LOG_FORMAT=json`: one JSON object per line, for log pipelines.
//!
//! `{"timestamp":"2026-12-01T19:22:14.123456Z","level":"INFO","target":"toolgate_server::server",
//! "message":"toolgate listening","fields":{"address":"127.0.0.1:50051"},"span":"execute_tool",
//! "trace_id":"4bf92f3577b34da6a3ce929d0e0e4736","span_id":"00f067aa0ba902b7"}`: the trace and
//! span ids are those of the span the line was written in, present when traces are on.

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::FormatTime as _;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The JSON line format.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct JsonLines;

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut timestamp = String::new();
        tracing_subscriber::fmt::time::SystemTime.format_time(&mut Writer::new(&mut timestamp))?;
        let metadata = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);

        let mut line = Map::new();
        line.insert("timestamp".into(), Value::String(timestamp));
        line.insert("level".into(), Value::String(metadata.level().to_string()));
        line.insert("target".into(), Value::String(metadata.target().to_owned()));
        line.insert(
            "message".into(),
            Value::String(fields.message.unwrap_or_default()),
        );
        if !fields.values.is_empty() {
            line.insert("fields".into(), Value::Object(fields.values));
        }
        // The span the event was written in: the registry's (the log layer's own filter may
        // not have enabled the trace spans, which are at debug level), or with traces on the
        // recorder's, which keeps toolgate's spans itself.
        let name = ctx
            .current_span()
            .metadata()
            .or_else(|| {
                tracing::dispatcher::get_default(|dispatch| dispatch.current_span().metadata())
            })
            .map(tracing::Metadata::name);
        if let Some(name) = name {
            line.insert("span".into(), Value::String(name.to_owned()));
        }
        if let Some((trace_id, span_id)) = trace_ids() {
            line.insert("trace_id".into(), Value::String(trace_id));
            line.insert("span_id".into(), Value::String(span_id));
        }
        writeln!(writer, "{}", Value::Object(line))
    }
}

/// The trace and span ids of the span the event was written in, as the trace recorder keeps
/// them (none when traces are off).
fn trace_ids() -> Option<(String, String)> {
    toolgate_core::trace::current()
        .map(|context| (context.trace_id.to_string(), context.span_id.to_string()))
}

#[derive(Default)]
struct Fields {
    message: Option<String>,
    values: Map<String, Value>,
}

impl Fields {
    fn put(&mut self, field: &Field, value: Value) {
        if field.name() == "message" {
            self.message = Some(match value {
                Value::String(text) => text,
                other => other.to_string(),
            });
        } else {
            self.values.insert(field.name().to_owned(), value);
        }
    }
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_owned()));
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::layer::SubscriberExt as _;

    use super::*;

    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }

        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn each_event_is_one_json_object_with_its_fields() {
        let captured = Captured::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::registry().with(
            tracing_subscriber::fmt::layer()
                .with_writer(move || writer.clone())
                .event_format(JsonLines),
        );
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("execute_tool");
            let _entered = span.enter();
            tracing::info!(calls = 3_u64, address = %"127.0.0.1:1", ok = true, "toolgate listening");
            tracing::warn!("second \"line\"\nwith a break");
        });
        let text = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<Value> = text
            .lines()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line}: {e}")))
            .collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert_eq!(lines[0]["message"], "toolgate listening");
        assert_eq!(lines[0]["level"], "INFO");
        assert_eq!(lines[0]["fields"]["calls"], 3);
        assert_eq!(lines[0]["fields"]["address"], "127.0.0.1:1");
        assert_eq!(lines[0]["fields"]["ok"], true);
        assert_eq!(lines[0]["span"], "execute_tool");
        // Without an OpenTelemetry layer there is no trace to name.
        assert!(lines[0].get("trace_id").is_none(), "{}", lines[0]);
        assert_eq!(lines[1]["message"], "second \"line\"\nwith a break");
        assert!(lines[1]["timestamp"].as_str().unwrap().ends_with('Z'));
    }
}
