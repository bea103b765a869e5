//! What the gateway tells its operators: log lines (plain text, coloured only on a terminal, or
//! one JSON object per line with the trace and span ids) and OpenTelemetry traces exported over
//! OTLP/gRPC when the standard `OTEL_*` variables ask for them.
//!
//! The libraries only make `tracing` spans (the engine's `execute_tool` and its children, the
//! HTTP client's attempts); this module installs the subscriber that formats and exports them,
//! the W3C trace-context propagator that `grpc.rs` reads incoming `traceparent` headers with
//! and the HTTP client writes outgoing ones with, and shuts the exporter down (flushing what is
//! queued) when the gateway stops.

use std::collections::BTreeMap;
use std::io::IsTerminal as _;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

mod grpc;
mod json;

pub use grpc::TraceLayer;
pub(crate) use grpc::header_trace_context;

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
    if !(endpoint.starts_with("http://") || endpoint.starts_with("https://")) {
        return Err(TelemetryError(format!(
            "OTEL_EXPORTER_OTLP_ENDPOINT must be an http(s) URL such as http://127.0.0.1:4317, got `{endpoint}`"
        )));
    }
    Ok(Some(TraceExport {
        endpoint: endpoint.to_owned(),
        service_name: get("OTEL_SERVICE_NAME").unwrap_or("toolgate").to_owned(),
    }))
}

/// The installed subscriber's exporter; [`Telemetry::shutdown`] flushes it.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Installs the process's subscriber. Must run inside the Tokio runtime when traces are on:
    /// the OTLP exporter's channel lives on it.
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
            return Ok(Telemetry { provider: None });
        };
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_tonic()
            .with_endpoint(export.endpoint.clone())
            .build()
            .map_err(|e| {
                TelemetryError(format!("cannot export traces to {}: {e}", export.endpoint))
            })?;
        let provider = SdkTracerProvider::builder()
            .with_resource(
                Resource::builder()
                    .with_service_name(export.service_name.clone())
                    .build(),
            )
            .with_batch_exporter(exporter)
            .build();
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        let traces = tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("toolgate"))
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_tracked_inactivity(false)
            // Spans only, of toolgate's own crates: events stay log lines, and no library's
            // span can carry what toolgate's do not.
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.is_span() && meta.target().starts_with("toolgate")
            }));
        tracing_subscriber::registry()
            .with(logs)
            .with(traces)
            .try_init()
            .map_err(|e| TelemetryError(format!("cannot install the trace subscriber: {e}")))?;
        Ok(Telemetry {
            provider: Some(provider),
        })
    }

    /// Whether spans are exported.
    pub fn traces_on(&self) -> bool {
        self.provider.is_some()
    }

    /// Exports what is queued and stops the exporter; waits at most the exporter's timeout.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        // The SDK's shutdown blocks until its export thread is done; that thread's requests
        // run on this runtime, so it must not hold one of the runtime's threads.
        let shut = tokio::task::spawn_blocking(move || provider.shutdown()).await;
        match shut {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "exporting the last traces failed"),
            Err(error) => tracing::warn!(%error, "stopping the trace exporter failed"),
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
        ];
        for (env, named) in cases {
            match settings(env) {
                Ok(read) => panic!("{env:?} was accepted: {read:?}"),
                Err(message) => assert!(message.contains(named), "{env:?}: {message}"),
            }
        }
    }
}
