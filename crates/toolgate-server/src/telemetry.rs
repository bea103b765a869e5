//! What the gateway tells its operators: log lines (plain text, coloured only on a terminal, or
//! one JSON object per line with the trace and span ids) and OpenTelemetry traces exported over
//! OTLP/gRPC when the standard `OTEL_*` variables ask for them.
//!
//! The libraries only make `tracing` spans (the engine's `execute_tool` and its children, the
//! HTTP client's attempts); this module installs the subscriber that formats them and, with
//! traces on, the recorder (`recorder.rs`) that keeps each span's ids, fields and times and
//! the exporter (`otlp.rs`) that sends them in batches. `grpc.rs` reads incoming W3C
//! `traceparent` headers; the HTTP client writes outgoing ones from the recorded context
//! (`toolgate_core::trace`). The exporter is shut down, flushing what is queued, when the
//! gateway stops.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;
use std::sync::Arc;
use std::time::Duration;

use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

mod grpc;
mod json;
mod otlp;
mod recorder;
mod scope;

pub use grpc::TraceLayer;
pub(crate) use grpc::header_trace_context;
pub(crate) use scope::in_current_span;

/// The log filter unless `TOOLGATE_LOG` sets one: info, but the MCP library's lines only from
/// warnings up (at info it writes three lines per MCP request, each stateless request being a
/// service of its own that starts and ends).
pub const DEFAULT_LOG_FILTER: &str = "info,rmcp=warn";

/// How log lines are written (`TOOLGATE_LOG_FORMAT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines; colour only when standard error is a terminal (and `NO_COLOR` is
    /// unset).
    Text,
    /// One JSON object per line: timestamp, level, target, message, fields, and the trace and
    /// span ids of the span the line was written in (when traces are on).
    Json,
}

/// Where traces go: an OTLP/gRPC endpoint, or nowhere.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceExport {
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`, else `OTEL_EXPORTER_OTLP_ENDPOINT`.
    pub endpoint: String,
    /// `OTEL_SERVICE_NAME` when set, else `toolgate`.
    pub service_name: String,
    /// `OTEL_RESOURCE_ATTRIBUTES`: `key=value` pairs describing this gateway.
    pub resource_attributes: Vec<(String, String)>,
    /// `OTEL_EXPORTER_OTLP_TRACES_HEADERS`, else `OTEL_EXPORTER_OTLP_HEADERS`: gRPC metadata on
    /// every export (a collector's API key, say).
    pub headers: Vec<(String, String)>,
    /// `OTEL_EXPORTER_OTLP_TRACES_TIMEOUT`, else `OTEL_EXPORTER_OTLP_TIMEOUT` (10 s), capped by
    /// `OTEL_BSP_EXPORT_TIMEOUT` (30 s): the most one export may take.
    pub timeout: Duration,
    /// `OTEL_BSP_SCHEDULE_DELAY` (5 s): how often queued spans are sent.
    pub schedule_delay: Duration,
    /// `OTEL_BSP_MAX_QUEUE_SIZE` (2,048): spans kept waiting at most; more are dropped.
    pub max_queue: usize,
    /// `OTEL_BSP_MAX_EXPORT_BATCH_SIZE` (512): spans per export, and the queue length that
    /// sends at once.
    pub max_batch: usize,
    /// `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` (`parentbased_always_on`): which
    /// traces are recorded and exported.
    pub sampler: Sampler,
}

/// Which traces are sampled (recorded and exported), as OpenTelemetry's standard samplers
/// decide: by the trace id for a trace this gateway starts, and for a `parentbased_*` sampler
/// by the caller's `traceparent` flag when there is one. An unsampled trace still has its ids
/// (log lines carry them, outbound requests propagate them, flagged unsampled), but its spans
/// keep no attributes and are never queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Sampler {
    /// Whether a remote parent's sampled flag decides (the `parentbased_*` samplers).
    parent_based: bool,
    /// A trace is sampled when the last 8 bytes of its id (big-endian), shifted right by one
    /// bit, are below this: the rule OpenTelemetry's SDKs apply for `traceidratio`. 0 samples
    /// none, 2^63 every one.
    threshold: u64,
}

impl Default for Sampler {
    /// `parentbased_always_on`, OpenTelemetry's default.
    fn default() -> Sampler {
        Sampler::new(true, 1.0)
    }
}

impl Sampler {
    /// A sampler keeping `ratio` (0 to 1) of the traces, deferring to a remote parent's flag
    /// when `parent_based`.
    pub fn new(parent_based: bool, ratio: f64) -> Sampler {
        Sampler {
            parent_based,
            threshold: ratio_threshold(ratio),
        }
    }

    /// Whether the trace `trace_id`, started here (or whose remote parent does not decide),
    /// is sampled.
    pub(crate) fn samples(&self, trace_id: &toolgate_core::trace::TraceId) -> bool {
        let mut low = [0; 8];
        low.copy_from_slice(&trace_id.0[8..]);
        (u64::from_be_bytes(low) >> 1) < self.threshold
    }

    /// Whether a span whose parent is the remote `parent` is sampled.
    pub(crate) fn follows(&self, parent: &toolgate_core::trace::SpanContext) -> bool {
        if self.parent_based {
            parent.sampled
        } else {
            self.samples(&parent.trace_id)
        }
    }
}

/// `ratio` (0 to 1) of 2^63, for [`Sampler::samples`].
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "the product is from 0 to 2^63, and a float-to-integer cast saturates"
)]
fn ratio_threshold(ratio: f64) -> u64 {
    if ratio >= 1.0 {
        1 << 63
    } else if ratio > 0.0 {
        (ratio * 9_223_372_036_854_775_808.0) as u64
    } else {
        0
    }
}

/// The telemetry settings, read from the environment once at start-up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TelemetrySettings {
    /// `TOOLGATE_LOG`: an `EnvFilter` directive such as `info` or `toolgate_engine=debug`.
    pub log_filter: String,
    /// `TOOLGATE_LOG_FORMAT`: `text` (default) or `json`.
    pub log_format: LogFormat,
    /// Whether text lines may carry colour codes (standard error is a terminal, no `NO_COLOR`).
    pub colour: bool,
    /// `None`: traces are off (no endpoint, `OTEL_SDK_DISABLED=true` or
    /// `OTEL_TRACES_EXPORTER=none`).
    pub traces: Option<TraceExport>,
}

/// A setting the environment gets wrong.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TelemetryError(String);

impl TelemetrySettings {
    /// Reads the settings from `env` (the process environment, passed in).
    pub fn from_env(env: &BTreeMap<String, String>) -> Result<TelemetrySettings, TelemetryError> {
        let get = |name: &str| env.get(name).map(|v| v.trim()).filter(|v| !v.is_empty());
        let log_format = match get("TOOLGATE_LOG_FORMAT") {
            None | Some("text") => LogFormat::Text,
            Some("json") => LogFormat::Json,
            Some(other) => {
                return Err(TelemetryError(format!(
                    "TOOLGATE_LOG_FORMAT must be `text` or `json`, got `{other}`"
                )));
            }
        };
        let log_filter = get("TOOLGATE_LOG").unwrap_or(DEFAULT_LOG_FILTER).to_owned();
        if let Err(error) = tracing_subscriber::EnvFilter::builder().parse(&log_filter) {
            return Err(TelemetryError(format!(
                "TOOLGATE_LOG `{log_filter}` is not a log filter: {error}"
            )));
        }
        Ok(TelemetrySettings {
            log_filter,
            log_format,
            colour: std::io::stderr().is_terminal() && get("NO_COLOR").is_none(),
            traces: trace_export(&get)?,
        })
    }
}

fn trace_export<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
) -> Result<Option<TraceExport>, TelemetryError> {
    if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
        return Ok(None);
    }
    match get("OTEL_TRACES_EXPORTER") {
        None | Some("otlp") => {}
        Some("none") => return Ok(None),
        Some(other) => {
            return Err(TelemetryError(format!(
                "OTEL_TRACES_EXPORTER `{other}` is not supported: toolgate exports `otlp` or `none`"
            )));
        }
    }
    let protocol = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL").or(get("OTEL_EXPORTER_OTLP_PROTOCOL"));
    if let Some(protocol) = protocol
        && protocol != "grpc"
    {
        return Err(TelemetryError(format!(
            "OTEL_EXPORTER_OTLP_PROTOCOL `{protocol}` is not supported: toolgate exports OTLP over `grpc`"
        )));
    }
    let Some(endpoint) =
        get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or(get("OTEL_EXPORTER_OTLP_ENDPOINT"))
    else {
        return Ok(None);
    };
    if endpoint.starts_with("https://") {
        return Err(TelemetryError(format!(
            "OTEL_EXPORTER_OTLP_ENDPOINT `{endpoint}`: this build exports over plain http:// only (no TLS to the collector); send to a collector on loopback or a private network"
        )));
    }
    if !endpoint.starts_with("http://") {
        return Err(TelemetryError(format!(
            "OTEL_EXPORTER_OTLP_ENDPOINT must be an http URL such as http://127.0.0.1:4317, got `{endpoint}`"
        )));
    }
    match get("OTEL_EXPORTER_OTLP_TRACES_COMPRESSION").or(get("OTEL_EXPORTER_OTLP_COMPRESSION")) {
        None | Some("none") => {}
        Some(other) => {
            return Err(TelemetryError(format!(
                "OTEL_EXPORTER_OTLP_COMPRESSION `{other}` is not supported: toolgate exports uncompressed (`none`)"
            )));
        }
    }
    let headers_variable = if get("OTEL_EXPORTER_OTLP_TRACES_HEADERS").is_some() {
        "OTEL_EXPORTER_OTLP_TRACES_HEADERS"
    } else {
        "OTEL_EXPORTER_OTLP_HEADERS"
    };
    let otlp_timeout = if get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT").is_some() {
        millis(get, "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 10_000)?
    } else {
        millis(get, "OTEL_EXPORTER_OTLP_TIMEOUT", 10_000)?
    };
    let export_timeout = millis(get, "OTEL_BSP_EXPORT_TIMEOUT", 30_000)?;
    let max_queue = count(get, "OTEL_BSP_MAX_QUEUE_SIZE", 2_048)?;
    let max_batch = count(get, "OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?;
    if max_batch > max_queue {
        return Err(TelemetryError(format!(
            "OTEL_BSP_MAX_EXPORT_BATCH_SIZE ({max_batch}) must not exceed OTEL_BSP_MAX_QUEUE_SIZE ({max_queue})"
        )));
    }
    Ok(Some(TraceExport {
        endpoint: endpoint.to_owned(),
        service_name: get("OTEL_SERVICE_NAME").unwrap_or("toolgate").to_owned(),
        resource_attributes: pairs(get, "OTEL_RESOURCE_ATTRIBUTES")?,
        headers: pairs(get, headers_variable)?,
        timeout: otlp_timeout.min(export_timeout),
        schedule_delay: millis(get, "OTEL_BSP_SCHEDULE_DELAY", 5_000)?,
        max_queue,
        max_batch,
        sampler: sampler(get)?,
    }))
}

/// `OTEL_TRACES_SAMPLER` and, for the ratio samplers, `OTEL_TRACES_SAMPLER_ARG` (default 1).
fn sampler<'a>(get: &impl Fn(&str) -> Option<&'a str>) -> Result<Sampler, TelemetryError> {
    let name = get("OTEL_TRACES_SAMPLER").unwrap_or("parentbased_always_on");
    let ratio = || match get("OTEL_TRACES_SAMPLER_ARG") {
        None => Ok(1.0),
        Some(text) => match text.parse::<f64>() {
            Ok(ratio) if (0.0..=1.0).contains(&ratio) => Ok(ratio),
            _ => Err(TelemetryError(format!(
                "OTEL_TRACES_SAMPLER_ARG must be a ratio from 0 to 1 for the `{name}` sampler, got `{text}`"
            ))),
        },
    };
    let (parent_based, ratio) = match name {
        "always_on" => (false, 1.0),
        "always_off" => (false, 0.0),
        "traceidratio" => (false, ratio()?),
        "parentbased_always_on" => (true, 1.0),
        "parentbased_always_off" => (true, 0.0),
        "parentbased_traceidratio" => (true, ratio()?),
        other => {
            return Err(TelemetryError(format!(
                "OTEL_TRACES_SAMPLER `{other}` is not supported: toolgate samples with always_on, always_off, traceidratio, parentbased_always_on (the default), parentbased_always_off or parentbased_traceidratio"
            )));
        }
    };
    Ok(Sampler::new(parent_based, ratio))
}

/// A duration in milliseconds, above zero.
fn millis<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    name: &str,
    default: u64,
) -> Result<Duration, TelemetryError> {
    Ok(Duration::from_millis(count(get, name, default)?))
}

/// A whole number above zero.
fn count<'a, T: std::str::FromStr + PartialOrd + Default>(
    get: &impl Fn(&str) -> Option<&'a str>,
    name: &str,
    default: T,
) -> Result<T, TelemetryError> {
    match get(name) {
        None => Ok(default),
        Some(text) => match text.parse::<T>() {
            Ok(value) if value > T::default() => Ok(value),
            _ => Err(TelemetryError(format!(
                "{name} must be a whole number above 0, got `{text}`"
            ))),
        },
    }
}

/// `key=value,key=value` with percent-encoded values (the W3C baggage form the OTLP
/// variables use).
fn pairs<'a>(
    get: &impl Fn(&str) -> Option<&'a str>,
    name: &str,
) -> Result<Vec<(String, String)>, TelemetryError> {
    let Some(text) = get(name) else {
        return Ok(Vec::new());
    };
    text.split(',')
        .map(str::trim)
        .filter(|pair| !pair.is_empty())
        .map(|pair| {
            let (key, value) = pair.split_once('=').ok_or_else(|| {
                TelemetryError(format!("{name}: `{pair}` is not a key=value pair"))
            })?;
            let value = percent_decode(value.trim()).ok_or_else(|| {
                TelemetryError(format!(
                    "{name}: the value of `{}` is not valid percent-encoded UTF-8",
                    key.trim()
                ))
            })?;
            let key = key.trim();
            if key.is_empty() {
                return Err(TelemetryError(format!("{name}: `{pair}` has an empty key")));
            }
            Ok((key.to_owned(), value))
        })
        .collect()
}

fn percent_decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        if bytes[at] == b'%' {
            let hex = text.get(at + 1..at + 3)?;
            if !hex.bytes().all(|digit| digit.is_ascii_hexdigit()) {
                return None;
            }
            out.push(u8::from_str_radix(hex, 16).ok()?);
            at += 3;
        } else {
            out.push(bytes[at]);
            at += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// The installed subscriber's exporter; [`Telemetry::shutdown`] flushes it.
#[derive(Debug)]
pub struct Telemetry {
    exporter: Option<(otlp::Exporter, Duration)>,
}

impl Telemetry {
    /// Installs the process's subscriber; with traces on, starts the exporter on its own
    /// thread.
    pub fn install(settings: &TelemetrySettings) -> Result<Telemetry, TelemetryError> {
        let filter = tracing_subscriber::EnvFilter::builder()
            .parse(&settings.log_filter)
            .map_err(|e| TelemetryError(format!("TOOLGATE_LOG: {e}")))?;
        let logs = match settings.log_format {
            LogFormat::Text => tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .with_ansi(settings.colour)
                .with_filter(filter)
                .boxed(),
            LogFormat::Json => tracing_subscriber::fmt::layer()
                .with_writer(std::io::stderr)
                .event_format(json::JsonLines)
                .with_filter(filter)
                .boxed(),
        };
        let Some(export) = &settings.traces else {
            tracing_subscriber::registry()
                .with(logs)
                .try_init()
                .map_err(|e| TelemetryError(format!("cannot install the log subscriber: {e}")))?;
            return Ok(Telemetry { exporter: None });
        };
        let queue = Arc::new(recorder::SpanQueue::new(export.max_queue, export.max_batch));
        let exporter = otlp::Exporter::start(export, Arc::clone(&queue))?;
        // The recorder keeps toolgate's spans itself and hands events to the log subscriber.
        let logs = Box::new(tracing_subscriber::registry().with(logs));
        recorder::Recorder::new(queue, logs)
            .with_sampler(export.sampler)
            .try_init()
            .map_err(|e| TelemetryError(format!("cannot install the trace subscriber: {e}")))?;
        Ok(Telemetry {
            exporter: Some((exporter, export.timeout)),
        })
    }

    /// Whether spans are exported.
    pub fn traces_on(&self) -> bool {
        self.exporter.is_some()
    }

    /// Exports what is queued and stops the exporter; waits at most twice the export timeout.
    pub async fn shutdown(self) {
        if let Some((exporter, timeout)) = self.exporter {
            // Room for the export under way and the last one; what was lost is logged there.
            let _ = exporter.shutdown(timeout.saturating_mul(2)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<TelemetrySettings, String> {
        let env = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        TelemetrySettings::from_env(&env).map_err(|e| e.to_string())
    }

    /// An environment, the log format and trace endpoint it gives, and the service name.
    type Case<'a> = (
        &'a [(&'a str, &'a str)],
        LogFormat,
        Option<&'a str>,
        &'a str,
    );

    #[test]
    fn the_environment_decides_logs_and_traces() {
        let endpoint = "http://127.0.0.1:4317";
        let cases: &[Case<'_>] = &[
            (&[], LogFormat::Text, None, ""),
            (
                &[("TOOLGATE_LOG_FORMAT", "json")],
                LogFormat::Json,
                None,
                "",
            ),
            (
                &[("TOOLGATE_LOG_FORMAT", "text")],
                LogFormat::Text,
                None,
                "",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)],
                LogFormat::Text,
                Some(endpoint),
                "toolgate",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1"),
                    ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint),
                    ("OTEL_SERVICE_NAME", "gateway-eu"),
                ],
                LogFormat::Text,
                Some(endpoint),
                "gateway-eu",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
                    ("OTEL_SDK_DISABLED", "true"),
                ],
                LogFormat::Text,
                None,
                "",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
                    ("OTEL_TRACES_EXPORTER", "none"),
                ],
                LogFormat::Text,
                None,
                "",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
                ],
                LogFormat::Text,
                Some(endpoint),
                "toolgate",
            ),
        ];
        for (env, format, traces, service) in cases {
            let read = settings(env).unwrap_or_else(|e| panic!("{env:?}: {e}"));
            assert_eq!(read.log_format, *format, "{env:?}");
            assert_eq!(
                read.traces.as_ref().map(|t| t.endpoint.as_str()),
                *traces,
                "{env:?}"
            );
            if let Some(export) = &read.traces {
                assert_eq!(export.service_name, *service, "{env:?}");
            }
        }
        assert_eq!(settings(&[]).unwrap().log_filter, "info,rmcp=warn");
        assert_eq!(
            settings(&[("TOOLGATE_LOG", "debug")]).unwrap().log_filter,
            "debug"
        );
    }

    #[test]
    fn the_export_settings_come_from_the_standard_variables() {
        let defaults = settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")])
            .unwrap()
            .traces
            .unwrap();
        assert_eq!(defaults.timeout, Duration::from_secs(10));
        assert_eq!(defaults.schedule_delay, Duration::from_secs(5));
        assert_eq!((defaults.max_queue, defaults.max_batch), (2_048, 512));
        assert!(defaults.headers.is_empty() && defaults.resource_attributes.is_empty());
        let set = settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "x-ignored=1"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
                "api-key=abc%3D%3D, x-team = blue%20team",
            ),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "60000"),
            ("OTEL_BSP_EXPORT_TIMEOUT", "2500"),
            ("OTEL_BSP_SCHEDULE_DELAY", "100"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
            ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "10"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment=prod,service.namespace=agents",
            ),
            ("OTEL_EXPORTER_OTLP_COMPRESSION", "none"),
        ])
        .unwrap()
        .traces
        .unwrap();
        assert_eq!(
            set.headers,
            [
                ("api-key".to_owned(), "abc==".to_owned()),
                ("x-team".to_owned(), "blue team".to_owned())
            ]
        );
        // The batch processor's limit caps the exporter's.
        assert_eq!(set.timeout, Duration::from_millis(2_500));
        assert_eq!(set.schedule_delay, Duration::from_millis(100));
        assert_eq!((set.max_queue, set.max_batch), (100, 10));
        assert_eq!(
            set.resource_attributes,
            [
                ("deployment.environment".to_owned(), "prod".to_owned()),
                ("service.namespace".to_owned(), "agents".to_owned())
            ]
        );
    }

    #[test]
    fn wrong_settings_are_refused_naming_the_variable() {
        let cases: &[(&[(&str, &str)], &str)] = &[
            (&[("TOOLGATE_LOG_FORMAT", "yaml")], "TOOLGATE_LOG_FORMAT"),
            (&[("TOOLGATE_LOG", "info,[[")], "TOOLGATE_LOG"),
            (
                &[("OTEL_TRACES_EXPORTER", "zipkin")],
                "OTEL_TRACES_EXPORTER",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
                    ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"),
                ],
                "OTEL_EXPORTER_OTLP_PROTOCOL",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "127.0.0.1:4317")],
                "OTEL_EXPORTER_OTLP_ENDPOINT",
            ),
            (
                &[("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4317")],
                "no TLS to the collector",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                    ("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip"),
                ],
                "OTEL_EXPORTER_OTLP_COMPRESSION",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                    ("OTEL_EXPORTER_OTLP_HEADERS", "api-key"),
                ],
                "OTEL_EXPORTER_OTLP_HEADERS",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                    ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "k=%+A"),
                ],
                "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                    ("OTEL_EXPORTER_OTLP_TIMEOUT", "soon"),
                ],
                "OTEL_EXPORTER_OTLP_TIMEOUT",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                    ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
                ],
                "OTEL_BSP_MAX_QUEUE_SIZE",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                    ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
                    ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "200"),
                ],
                "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                    ("OTEL_TRACES_SAMPLER", "jaeger_remote"),
                ],
                "OTEL_TRACES_SAMPLER `jaeger_remote` is not supported",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "1.5"),
                ],
                "OTEL_TRACES_SAMPLER_ARG must be a ratio from 0 to 1",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                    ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "ten percent"),
                ],
                "OTEL_TRACES_SAMPLER_ARG",
            ),
            (
                &[
                    ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317"),
                    ("OTEL_TRACES_SAMPLER", "traceidratio"),
                    ("OTEL_TRACES_SAMPLER_ARG", "NaN"),
                ],
                "OTEL_TRACES_SAMPLER_ARG",
            ),
        ];
        for (env, named) in cases {
            match settings(env) {
                Ok(read) => panic!("{env:?} was accepted: {read:?}"),
                Err(message) => assert!(message.contains(named), "{env:?}: {message}"),
            }
        }
    }

    #[test]
    fn the_samplers_decide_as_opentelemetrys_standard_ones() {
        use toolgate_core::trace::{SpanContext, TraceId};
        let sampler = |vars: &[(&str, &str)]| {
            let mut env = vec![("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")];
            env.extend_from_slice(vars);
            settings(&env).unwrap().traces.unwrap().sampler
        };
        // A trace id whose last 8 bytes, shifted right once, are `low`.
        let trace = |low: u64| {
            let mut id = [0x4b; 16];
            id[8..].copy_from_slice(&(low << 1).to_be_bytes());
            TraceId(id)
        };
        let remote = |id: TraceId, sampled: bool| {
            SpanContext::from_w3c(
                &format!("00-{id}-00f067aa0ba902b7-0{}", u8::from(sampled)),
                None,
            )
            .unwrap()
        };
        let half = 1_u64 << 62;
        let (low, high) = (trace(half - 1), trace(half));

        let default = sampler(&[]);
        assert_eq!(default, Sampler::default());
        assert!(default.samples(&low) && default.samples(&trace(u64::MAX >> 1)));
        assert!(default.follows(&remote(low, true)) && !default.follows(&remote(low, false)));

        let off = sampler(&[("OTEL_TRACES_SAMPLER", "always_off")]);
        assert!(!off.samples(&low) && !off.samples(&trace(0)));
        assert!(
            !off.follows(&remote(low, true)),
            "the parent's flag does not decide"
        );
        let on = sampler(&[("OTEL_TRACES_SAMPLER", "always_on")]);
        assert!(on.follows(&remote(high, false)));

        // traceidratio 0.5 keeps the ids below half the range, whatever the parent says.
        let ratio = sampler(&[
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
        ]);
        assert!(ratio.samples(&low) && !ratio.samples(&high));
        assert!(ratio.follows(&remote(low, false)) && !ratio.follows(&remote(high, true)));
        // Without an argument a ratio sampler keeps everything (the standard default, 1).
        let unset = sampler(&[("OTEL_TRACES_SAMPLER", "traceidratio")]);
        assert!(unset.samples(&trace(u64::MAX >> 1)));

        // parentbased_*: the remote parent's flag decides; the ratio decides for new traces.
        let based = sampler(&[
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.5"),
        ]);
        assert!(based.samples(&low) && !based.samples(&high));
        assert!(based.follows(&remote(high, true)) && !based.follows(&remote(low, false)));
        let based_off = sampler(&[("OTEL_TRACES_SAMPLER", "parentbased_always_off")]);
        assert!(!based_off.samples(&low) && based_off.follows(&remote(high, true)));

        // About the ratio asked of random ids.
        let tenth = Sampler::new(false, 0.1);
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let kept = (0..100_000)
            .filter(|_| {
                state = state
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let mut id = [0; 16];
                id[8..].copy_from_slice(&state.to_be_bytes());
                tenth.samples(&TraceId(id))
            })
            .count();
        assert!(
            (9_000..11_000).contains(&kept),
            "{kept} of 100,000 kept at 0.1"
        );
    }
}
