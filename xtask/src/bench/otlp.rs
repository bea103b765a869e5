//! A trace sink for the benchmark's "traces and metrics on" phase: an OTLP/gRPC receiver (the
//! collector's `TraceService/Export`) that counts the spans it is sent and keeps none. It runs
//! in its own process (`xtask bench --otlp-sink`) so receiving the spans costs neither the
//! gateway nor the load client; and since that process still shares the machine's cores, it
//! reads only as much of each request as counting needs: it walks the protobuf framing down to
//! the spans (`ExportTraceServiceRequest.resource_spans[].scope_spans[].spans[]`) without
//! decoding them. Its tests check the count against requests the official proto's generated
//! messages encode.

use std::convert::Infallible;
use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::{NamedService, UnaryService};
use tonic::transport::server::TcpIncoming;
use toolgate_proto::raw::RawCodec;

/// The line the sink prints once it accepts connections, followed by its address.
pub(crate) const ANNOUNCEMENT: &str = "otlp sink listening on ";

/// Serves on a free loopback port until its standard input closes; prints the spans received
/// so far on standard error when it ends.
pub(crate) fn serve() -> anyhow::Result<()> {
    let received = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&received);
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        eprintln!(
            "otlp sink: {} spans received",
            counted.load(Ordering::Relaxed)
        );
        std::process::exit(0);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .context("cannot start the trace sink's runtime")?;
    runtime.block_on(async {
        let address: SocketAddr = "127.0.0.1:0".parse()?;
        let incoming = TcpIncoming::bind(address).context("cannot listen on a loopback port")?;
        let local = incoming.local_addr()?;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{ANNOUNCEMENT}{local}")?;
        stdout.flush()?;
        drop(stdout);
        tonic::transport::Server::builder()
            .add_service(Sink { received })
            .serve_with_incoming(incoming)
            .await
            .context("the trace sink failed")
    })
}

/// The `TraceService`, by hand: one method, whose request is counted from its bytes.
#[derive(Debug, Clone)]
struct Sink {
    received: Arc<AtomicU64>,
}

impl NamedService for Sink {
    const NAME: &'static str = "opentelemetry.proto.collector.trace.v1.TraceService";
}

impl Service<http::Request<tonic::body::Body>> for Sink {
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Infallible>;

    fn poll_ready(
        &mut self,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let received = Arc::clone(&self.received);
        Box::pin(async move {
            if request.uri().path() != "/opentelemetry.proto.collector.trace.v1.TraceService/Export"
            {
                return Ok(tonic::Status::unimplemented("only Export is served").into_http());
            }
            let mut grpc = tonic::server::Grpc::new(RawCodec);
            Ok(grpc.unary(Count(received), request).await)
        })
    }
}

struct Count(Arc<AtomicU64>);

impl UnaryService<Vec<u8>> for Count {
    type Response = Vec<u8>;
    type Future = std::future::Ready<Result<tonic::Response<Vec<u8>>, tonic::Status>>;

    fn call(&mut self, request: tonic::Request<Vec<u8>>) -> Self::Future {
        std::future::ready(match count_spans(request.get_ref()) {
            Some(spans) => {
                self.0.fetch_add(spans, Ordering::Relaxed);
                // An empty `ExportTraceServiceResponse`: everything accepted.
                Ok(tonic::Response::new(Vec::new()))
            }
            None => Err(tonic::Status::invalid_argument(
                "not an ExportTraceServiceRequest",
            )),
        })
    }
}

/// A field of a protobuf message: its number, and its payload when length-delimited (`None`
/// for a scalar).
type Field<'a> = (u64, Option<&'a [u8]>);

/// The fields of one protobuf message; `None` when the bytes are not a protobuf message.
fn fields(mut bytes: &[u8]) -> Option<Vec<Field<'_>>> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        let key = varint(&mut bytes)?;
        let skip = match key & 7 {
            0 => {
                varint(&mut bytes)?;
                0
            }
            1 => 8,
            2 => {
                let length = usize::try_from(varint(&mut bytes)?).ok()?;
                let (payload, rest) = bytes.split_at_checked(length)?;
                out.push((key >> 3, Some(payload)));
                bytes = rest;
                continue;
            }
            5 => 4,
            _ => return None,
        };
        bytes = bytes.get(skip..)?;
        out.push((key >> 3, None));
    }
    Some(out)
}

fn varint(bytes: &mut &[u8]) -> Option<u64> {
    let mut value = 0_u64;
    for shift in (0..64).step_by(7) {
        let (&byte, rest) = bytes.split_first()?;
        *bytes = rest;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The payloads of field `number` of a message.
fn embedded(bytes: &[u8], number: u64) -> Option<Vec<&[u8]>> {
    Some(
        fields(bytes)?
            .into_iter()
            .filter(|(field, _)| *field == number)
            .filter_map(|(_, payload)| payload)
            .collect(),
    )
}

/// The spans of an `ExportTraceServiceRequest`: field 1 (`resource_spans`), its field 2
/// (`scope_spans`), its field 2 (`spans`).
fn count_spans(request: &[u8]) -> Option<u64> {
    let mut spans = 0_u64;
    for resource_spans in embedded(request, 1)? {
        for scope_spans in embedded(resource_spans, 2)? {
            spans += u64::try_from(embedded(scope_spans, 2)?.len()).ok()?;
        }
    }
    Some(spans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
    use opentelemetry_proto::tonic::resource::v1::Resource;
    use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
    use prost::Message as _;

    fn span(name: &str) -> Span {
        Span {
            trace_id: vec![1; 16],
            span_id: vec![2; 8],
            name: name.to_owned(),
            kind: 1,
            start_time_unix_nano: 1_700_000_000_000_000_000,
            end_time_unix_nano: 1_700_000_000_000_250_000,
            attributes: vec![KeyValue {
                key: "gen_ai.tool.name".to_owned(),
                value: Some(AnyValue {
                    value: Some(any_value::Value::StringValue("x".repeat(300))),
                }),
                key_strindex: 0,
            }],
            ..Span::default()
        }
    }

    #[test]
    fn spans_are_counted_from_the_framing_alone() {
        let request = ExportTraceServiceRequest {
            resource_spans: vec![
                ResourceSpans {
                    resource: Some(Resource::default()),
                    scope_spans: vec![
                        ScopeSpans {
                            spans: (0..3).map(|i| span(&format!("s{i}"))).collect(),
                            ..ScopeSpans::default()
                        },
                        ScopeSpans {
                            spans: vec![span("t")],
                            ..ScopeSpans::default()
                        },
                    ],
                    schema_url: "https://opentelemetry.io/schemas/1.0.0".to_owned(),
                },
                ResourceSpans {
                    scope_spans: vec![ScopeSpans {
                        spans: (0..200).map(|i| span(&format!("u{i}"))).collect(),
                        ..ScopeSpans::default()
                    }],
                    ..ResourceSpans::default()
                },
            ],
        };
        assert_eq!(count_spans(&request.encode_to_vec()), Some(204));
        assert_eq!(count_spans(&[]), Some(0));
        // Truncated or garbage bytes are refused, not miscounted.
        let bytes = request.encode_to_vec();
        assert_eq!(count_spans(&bytes[..bytes.len() - 1]), None);
        assert_eq!(count_spans(&[0xff; 12]), None);
    }
}
