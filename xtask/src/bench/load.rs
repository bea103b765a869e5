//! The load client: a closed loop (a fixed number of calls in flight, each worker sending the
//! next call as soon as its last one is answered) for throughput, and an open loop (calls sent
//! on a fixed timetable whatever the answers do) for latency at a fixed offered rate. Both
//! drive a [`Transport`]: gRPC `ExecuteTool` over a few HTTP/2 connections, or MCP
//! `tools/call` over HTTP/1.1 ([`McpClient`]).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tonic::metadata::{Ascii, MetadataValue};
use tonic::transport::{Channel, Endpoint};
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::agent_service_client::AgentServiceClient;

use crate::bench::mcp::McpClient;
use crate::bench::process::{CpuSnapshot, CpuUsage};

/// Longest any single call may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the load client calls: the same request shape for both targets, so both receive the
/// same bytes.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) url: String,
    authorization: MetadataValue<Ascii>,
    /// Every run the load is spread over: a worker, or an open-loop call, takes the run of its
    /// index ([`Target::for_caller`]).
    runs: Arc<[String]>,
    /// The run of `runs` this target's requests name.
    run: usize,
    tool: String,
}

impl Target {
    /// A target calling `tool` on the first of `runs`, or, through [`Target::for_caller`], on
    /// each of them in turn.
    pub(crate) fn new(
        url: &str,
        token: &str,
        runs: Vec<String>,
        tool: &str,
    ) -> anyhow::Result<Target> {
        if runs.is_empty() {
            bail!("a target needs at least one run");
        }
        Ok(Target {
            url: url.to_owned(),
            authorization: bearer(token)?,
            run: 0,
            runs: runs.into(),
            tool: tool.to_owned(),
        })
    }

    /// The target of worker or open-loop call `index`: the same, on run `index` modulo the
    /// number of runs.
    fn for_caller(&self, index: usize) -> Target {
        Target {
            run: index % self.runs.len(),
            ..self.clone()
        }
    }

    /// Every run the load is spread over.
    pub(crate) fn runs(&self) -> Arc<[String]> {
        Arc::clone(&self.runs)
    }

    /// The echo server ignores the request; it gets one the size of the gateway's.
    pub(crate) fn echo(url: &str) -> Target {
        Target {
            url: url.to_owned(),
            authorization: MetadataValue::from_static(
                "Bearer tg_agent_0000000000000000000000000000000000000000000000000000",
            ),
            runs: Arc::from(["run_0192f0c4e5a77c3a9b1d2e3f40516273".to_owned()]),
            run: 0,
            tool: "testkit.noop".to_owned(),
        }
    }

    /// The `Authorization` header's value.
    pub(crate) fn authorization(&self) -> anyhow::Result<String> {
        Ok(self
            .authorization
            .to_str()
            .context("the authorization is not text")?
            .to_owned())
    }

    pub(crate) fn tool(&self) -> &str {
        &self.tool
    }

    /// An `ExecuteTool` request for `testkit.noop` with `{}` arguments.
    pub(crate) fn request(&self, tool_use_id: String) -> tonic::Request<pb::ExecuteToolRequest> {
        let mut request = tonic::Request::new(pb::ExecuteToolRequest {
            run_id: self.runs[self.run].clone(),
            tool_use_id,
            tool_name: self.tool.clone(),
            arguments_json: "{}".to_owned(),
            correlation_id: String::new(),
            timeout_ms: 0,
        });
        request
            .metadata_mut()
            .insert("authorization", self.authorization.clone());
        request
    }
}

/// Wraps a message with `authorization: Bearer <token>`.
pub(crate) fn authed<T>(message: T, token: &str) -> anyhow::Result<tonic::Request<T>> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", bearer(token)?);
    Ok(request)
}

fn bearer(token: &str) -> anyhow::Result<MetadataValue<Ascii>> {
    format!("Bearer {token}")
        .parse()
        .context("the token is not printable ASCII")
}

/// Opens `count` separate HTTP/2 connections to `url`.
pub(crate) async fn connect(url: &str, count: usize) -> anyhow::Result<Vec<Channel>> {
    let endpoint = Endpoint::from_shared(url.to_owned())?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .timeout(CALL_TIMEOUT);
    let mut channels = Vec::with_capacity(count);
    for _ in 0..count {
        channels.push(
            endpoint
                .connect()
                .await
                .with_context(|| format!("cannot connect to {url}"))?,
        );
    }
    Ok(channels)
}

/// How the load reaches the target.
#[derive(Debug, Clone)]
pub(crate) enum Transport {
    /// `ExecuteTool` over these HTTP/2 connections, spread round-robin.
    Grpc(Target, Vec<Channel>),
    /// `tools/call` over MCP.
    Mcp(Arc<McpClient>),
}

/// What one worker (or one open-loop call) calls with.
#[allow(
    clippy::large_enum_variant,
    reason = "one per worker, made once; boxing would add an allocation per open-loop call"
)]
enum Caller {
    Grpc(AgentServiceClient<Channel>, Target),
    Mcp(Arc<McpClient>),
}

impl Transport {
    /// The caller of worker or call `index`.
    fn caller(&self, index: usize) -> Caller {
        match self {
            Transport::Grpc(target, channels) => Caller::Grpc(
                AgentServiceClient::new(channels[index % channels.len()].clone()),
                target.for_caller(index),
            ),
            Transport::Mcp(client) => Caller::Mcp(Arc::clone(client)),
        }
    }
}

impl Caller {
    async fn call(&mut self, tool_use_id: String) -> Result<(), String> {
        match self {
            Caller::Grpc(client, target) => call(client, target.request(tool_use_id)).await,
            Caller::Mcp(client) => client.call(&tool_use_id).await,
        }
    }
}

/// Calls answered, and how the target and the client used the CPU meanwhile.
#[derive(Debug, Clone)]
pub(crate) struct ClosedLoop {
    pub(crate) concurrency: usize,
    /// Successful calls in the measured window.
    pub(crate) calls: u64,
    pub(crate) failed: u64,
    pub(crate) first_failure: Option<String>,
    pub(crate) elapsed: Duration,
    pub(crate) cpu: CpuUsage,
}

impl ClosedLoop {
    /// Successful calls per second.
    pub(crate) fn throughput(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.calls as f64 / secs
        } else {
            0.0
        }
    }
}

/// Counters shared by the workers of one loop.
#[derive(Debug, Default)]
struct Tally {
    succeeded: AtomicU64,
    failed: AtomicU64,
    first_failure: Mutex<Option<String>>,
}

impl Tally {
    fn record(&self, outcome: Result<(), String>) {
        match outcome {
            Ok(()) => {
                self.succeeded.fetch_add(1, Ordering::Relaxed);
            }
            Err(message) => {
                self.failed.fetch_add(1, Ordering::Relaxed);
                let mut first = self
                    .first_failure
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                first.get_or_insert(message);
            }
        }
    }

    fn counts(&self) -> (u64, u64) {
        (
            self.succeeded.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    fn first_failure(&self) -> Option<String> {
        self.first_failure
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

/// Runs `concurrency` workers over `transport` for `warmup + duration` and counts the calls
/// answered during `duration`. `phase` keeps tool_use_ids distinct across loops on one run.
pub(crate) async fn closed_loop(
    transport: &Transport,
    phase: &str,
    concurrency: usize,
    warmup: Duration,
    duration: Duration,
    server_pid: u32,
) -> anyhow::Result<ClosedLoop> {
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let mut caller = transport.caller(worker);
        let tally = Arc::clone(&tally);
        let stop = Arc::clone(&stop);
        let prefix = format!("{phase}-{worker}-");
        workers.push(tokio::spawn(async move {
            let mut sequence: u64 = 0;
            while !stop.load(Ordering::Relaxed) {
                sequence += 1;
                let outcome = caller.call(format!("{prefix}{sequence}")).await;
                tally.record(outcome);
            }
        }));
    }

    tokio::time::sleep(warmup).await;
    let (start_ok, start_failed) = tally.counts();
    let cpu_start = CpuSnapshot::take(server_pid)?;
    tokio::time::sleep(duration).await;
    let (end_ok, end_failed) = tally.counts();
    let cpu_end = CpuSnapshot::take(server_pid)?;
    stop.store(true, Ordering::Relaxed);
    let drained =
        tokio::time::timeout(CALL_TIMEOUT + Duration::from_secs(5), join_all(workers)).await;
    if drained.is_err() {
        bail!("the closed-loop workers did not stop");
    }
    Ok(ClosedLoop {
        concurrency,
        calls: end_ok - start_ok,
        failed: end_failed - start_failed,
        first_failure: tally.first_failure(),
        elapsed: cpu_end.elapsed_since(&cpu_start),
        cpu: cpu_end.usage_since(&cpu_start),
    })
}

/// Exactly `total` calls over `concurrency` workers, each worker taking the next call when its
/// last one is answered; returns the calls that failed (with the first failure's text).
pub(crate) async fn fixed_calls(
    transport: &Transport,
    phase: &str,
    concurrency: usize,
    total: u64,
) -> anyhow::Result<(u64, Option<String>)> {
    let tally = Arc::new(Tally::default());
    let next = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut workers = Vec::with_capacity(concurrency);
    for worker in 0..concurrency {
        let mut caller = transport.caller(worker);
        let tally = Arc::clone(&tally);
        let next = Arc::clone(&next);
        let prefix = format!("{phase}-{worker}-");
        workers.push(tokio::spawn(async move {
            loop {
                let sequence = next.fetch_add(1, Ordering::Relaxed);
                if sequence >= total {
                    break;
                }
                let outcome = caller.call(format!("{prefix}{sequence}")).await;
                tally.record(outcome);
            }
        }));
    }
    for worker in workers {
        worker.await.context("a load worker panicked")?;
    }
    let (_, failed) = tally.counts();
    Ok((failed, tally.first_failure()))
}

/// Latencies measured from each call's scheduled send time, over the measured window.
#[derive(Debug, Clone)]
pub(crate) struct OpenLoop {
    pub(crate) rate: u32,
    /// Calls scheduled in the measured window.
    pub(crate) scheduled: u64,
    pub(crate) failed: u64,
    pub(crate) first_failure: Option<String>,
    pub(crate) latency: Latency,
    pub(crate) cpu: CpuUsage,
    /// How late the pacer sent calls, at p99 (the client's own scheduling delay).
    pub(crate) send_lag_p99: Duration,
    /// From the first measured call's scheduled time to the last measured answer: past the
    /// server's capacity, answers drain long after the last send.
    pub(crate) elapsed: Duration,
}

impl OpenLoop {
    /// Successful calls per second actually delivered over the measured window.
    pub(crate) fn delivered(&self) -> f64 {
        let seconds = self.elapsed.as_secs_f64();
        if seconds > 0.0 {
            (self.scheduled - self.failed) as f64 / seconds
        } else {
            0.0
        }
    }
}

/// Percentiles of one latency sample.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Latency {
    pub(crate) p50: Duration,
    pub(crate) p90: Duration,
    pub(crate) p99: Duration,
    pub(crate) p999: Duration,
    pub(crate) max: Duration,
}

impl Latency {
    pub(crate) fn of(mut samples: Vec<Duration>) -> Latency {
        samples.sort_unstable();
        Latency {
            p50: percentile(&samples, 500_000),
            p90: percentile(&samples, 900_000),
            p99: percentile(&samples, 990_000),
            p999: percentile(&samples, 999_000),
            max: samples.last().copied().unwrap_or_default(),
        }
    }
}

/// The nearest-rank percentile of sorted samples, `ppm` in parts per million.
fn percentile(sorted: &[Duration], ppm: u64) -> Duration {
    let Ok(count) = u64::try_from(sorted.len()) else {
        return Duration::ZERO;
    };
    let rank = (count * ppm).div_ceil(1_000_000).max(1);
    usize::try_from(rank - 1)
        .ok()
        .and_then(|index| sorted.get(index))
        .copied()
        .unwrap_or_default()
}

/// One open-loop call: its slot in the timetable, how late it was sent, how long from its
/// scheduled time to the answer, and whether it succeeded.
struct Timed {
    index: u64,
    send_lag: Duration,
    latency: Duration,
    outcome: Result<(), String>,
}

/// Sends calls at `rate` per second for `warmup + duration` on a fixed timetable, spreading them
/// over `transport`'s connections, and measures each from its scheduled time. A dedicated thread paces the
/// sends (thread sleeps are precise to tens of microseconds; the runtime's timer works in
/// milliseconds); the calls themselves run on the runtime.
pub(crate) async fn open_loop(
    transport: &Transport,
    phase: &str,
    rate: u32,
    warmup: Duration,
    duration: Duration,
    server_pid: u32,
) -> anyhow::Result<OpenLoop> {
    let interval = Duration::from_secs(1) / rate;
    let warmup_calls = calls_in(warmup, rate);
    let total_calls = warmup_calls + calls_in(duration, rate);
    let runtime = tokio::runtime::Handle::current();
    let transport = transport.clone();
    let prefix = format!("{phase}-");
    let start = Instant::now() + Duration::from_millis(10);
    let pacer = std::thread::spawn(move || {
        let mut calls = Vec::new();
        for (slot, index) in (0..total_calls).enumerate() {
            let Ok(offset) = u32::try_from(index) else {
                break;
            };
            let scheduled = start + interval * offset;
            let now = Instant::now();
            if scheduled > now {
                std::thread::sleep(scheduled - now);
            }
            let send_lag = Instant::now().saturating_duration_since(scheduled);
            let mut caller = transport.caller(slot);
            let tool_use_id = format!("{prefix}{index}");
            calls.push(runtime.spawn(async move {
                let outcome = caller.call(tool_use_id).await;
                Timed {
                    index,
                    send_lag,
                    latency: scheduled.elapsed(),
                    outcome,
                }
            }));
        }
        calls
    });

    // The measured window starts when the warmup's last call is due.
    let measured_from = start + interval * u32::try_from(warmup_calls).unwrap_or(u32::MAX);
    tokio::time::sleep_until(measured_from.into()).await;
    let cpu_start = CpuSnapshot::take(server_pid)?;
    let calls = tokio::task::spawn_blocking(move || pacer.join())
        .await?
        .map_err(|_| anyhow::anyhow!("the open-loop pacer thread panicked"))?;
    let cpu_end = CpuSnapshot::take(server_pid)?;

    let mut latencies = Vec::with_capacity(calls.len());
    let mut send_lags = Vec::with_capacity(calls.len());
    let tally = Tally::default();
    let mut scheduled = 0;
    for handle in calls {
        let timed = handle.await.context("an open-loop call panicked")?;
        if timed.index < warmup_calls {
            continue;
        }
        scheduled += 1;
        send_lags.push(timed.send_lag);
        if timed.outcome.is_ok() {
            latencies.push(timed.latency);
        }
        tally.record(timed.outcome);
    }
    let elapsed = Instant::now().saturating_duration_since(measured_from);
    let (_, failed) = tally.counts();
    Ok(OpenLoop {
        rate,
        scheduled,
        failed,
        first_failure: tally.first_failure(),
        latency: Latency::of(latencies),
        cpu: cpu_end.usage_since(&cpu_start),
        send_lag_p99: Latency::of(send_lags).p99,
        elapsed,
    })
}

fn calls_in(period: Duration, rate: u32) -> u64 {
    period
        .as_millis()
        .saturating_mul(u128::from(rate))
        .div_euclid(1000)
        .try_into()
        .unwrap_or(u64::MAX)
}

/// One `ExecuteTool` call; anything but a SUCCEEDED answer is a failure.
async fn call(
    client: &mut AgentServiceClient<Channel>,
    request: tonic::Request<pb::ExecuteToolRequest>,
) -> Result<(), String> {
    match client.execute_tool(request).await {
        Ok(response) => {
            let result = response.into_inner();
            if result.status == i32::from(pb::ToolCallStatus::Succeeded) {
                Ok(())
            } else {
                Err(format!(
                    "status {}: {} {}",
                    result.status, result.error_code, result.error_message
                ))
            }
        }
        Err(status) => Err(format!("gRPC {:?}: {}", status.code(), status.message())),
    }
}

async fn join_all(handles: Vec<tokio::task::JoinHandle<()>>) {
    for handle in handles {
        let _ = handle.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callers_take_the_runs_in_turn() {
        let runs = vec!["run_a".to_owned(), "run_b".to_owned(), "run_c".to_owned()];
        let target = Target::new("http://127.0.0.1:1", "tg_token", runs, "testkit.noop").unwrap();
        let taken: Vec<String> = (0..7)
            .map(|index| {
                target
                    .for_caller(index)
                    .request(String::new())
                    .into_inner()
                    .run_id
            })
            .collect();
        assert_eq!(
            taken,
            [
                "run_a", "run_b", "run_c", "run_a", "run_b", "run_c", "run_a"
            ]
        );
        let request = target
            .for_caller(4)
            .request("use-1".to_owned())
            .into_inner();
        assert_eq!(request.run_id, "run_b");
        assert_eq!(request.tool_use_id, "use-1");

        let error = Target::new("http://127.0.0.1:1", "tg_token", Vec::new(), "testkit.noop")
            .unwrap_err()
            .to_string();
        assert!(error.contains("at least one run"), "{error}");
    }
}
