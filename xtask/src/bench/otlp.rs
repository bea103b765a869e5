//! A trace sink for the benchmark's "traces and metrics on" phase: an OTLP/gRPC receiver (the
//! collector's `TraceService`, from the official OpenTelemetry proto) that counts the spans it
//! is sent and keeps none. It runs in its own process (`xtask bench --otlp-sink`) so decoding
//! the spans costs neither the gateway nor the load client.

use std::io::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context as _;
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use tonic::transport::server::TcpIncoming;

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
            .add_service(TraceServiceServer::new(Sink { received }))
            .serve_with_incoming(incoming)
            .await
            .context("the trace sink failed")
    })
}

struct Sink {
    received: Arc<AtomicU64>,
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize = request
            .into_inner()
            .resource_spans
            .iter()
            .flat_map(|resource| &resource.scope_spans)
            .map(|scope| scope.spans.len())
            .sum();
        self.received
            .fetch_add(u64::try_from(spans).unwrap_or(u64::MAX), Ordering::Relaxed);
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}
