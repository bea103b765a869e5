//! `cargo xtask bench`: the gateway's overhead benchmark, as the design's performance budget
//! defines it. One run measures, with the same load client and concurrency for both targets:
//!
//! - the floor: a bare tonic echo server speaking the same proto (`ExecuteTool` answers a fixed
//!   result at once), in its own process;
//! - the gateway: `target/production/toolgate` (a `testkit` build in the `production` profile,
//!   as deployed: see [`PROFILE`]) in a temporary directory with a
//!   fresh SQLite ledger, calling `testkit.noop` with `{}` through the whole pipeline;
//! - the same gateway, ledger and run called over MCP: `tools/call` of `testkit__noop` at
//!   `/mcp` as a stateless (2026-07-28) MCP client sends it, over HTTP/1.1 keep-alive with one
//!   connection per call in flight (`bench/mcp.rs`); the closed and open loops again, against
//!   the throughput agentgateway served on this machine (10.3k-11.8k MCP tool calls/s, no
//!   ledger);
//! - the same gateway on a PostgreSQL ledger (a fresh schema in the test suite's server,
//!   `TOOLGATE_TEST_PG_URL` or 127.0.0.1:5432, dropped afterwards), when one answers: the
//!   closed and open loops again, against a target of 8,000 calls/s with durable commits
//!   (metrics on, for its ledger figures below);
//!
//! - the same SQLite gateway observed as in production: traces exported over OTLP to a sink in
//!   its own process (every span, none sampled away) and metrics on: its closed and open loops,
//!   and what observing costs, measured on two fresh gateways side by side (one plain, one
//!   observed) called in alternating windows, in two halves each led by the other gateway
//!   (`bench/overhead.rs`): the median ratio of their
//!   throughputs must stay at or above 0.95, and the CPU per call of each is shown.
//!
//! - the same gateway at offered rates from 500 to 20,000 calls/s (open loop, 3 s each):
//!   delivered throughput and p50/p99 against offered load, in the table, the JSON and a chart,
//!   `target/bench/rates.png` (past capacity the gateway refuses calls: counted, not failures);
//!
//! - the redactor alone, in-process: a typical call's input and output JSON redacted as the
//!   engine does (`bench/redaction.rs`), per call.
//!
//! Figures: closed-loop throughput of each (and the ratio gateway/echo), the server's CPU time,
//! context switches, storage bytes written and write system calls per answered call
//! (saturated and at the fixed rate), latency p50/p99 at a
//! fixed offered rate (open loop, measured from each call's scheduled send time so a slow answer
//! cannot hide the calls queued behind it), the gateway's peak RSS after the load, and the median
//! time from spawn to a SERVING health check on a fresh database; for each gateway serving
//! metrics, its ledger commits per call (SQLite: WAL fsyncs) and batch sizes in each loop
//! (`bench/scrape.rs`). They are printed as a table
//! with PASS/MISS against the budget and written to `target/bench/results.json`. A missed target
//! never fails the command; a broken setup or a failed call does.
//!
//! The command first builds the gateway (`cargo build --profile production -p toolgate
//! --no-default-features --features testkit,slack,shopify`: no AWS connector, see
//! [`GATEWAY_BUILD`])
//! and then this crate in the same profile, and re-executes that `xtask` binary to measure: the
//! load client must not be the bottleneck, and a debug client would be. The echo server runs
//! as `xtask bench --echo-server` from that same binary, so the floor is built as the gateway
//! is. Alongside each figure the
//! table shows the CPU used (from `/proc`) by the server, by the load client and by other
//! processes, and the gateway's CPU per thread, so a saturated client or a busy machine shows.
//!
//! Options:
//! - `--duration SECS`: measured seconds per target and per phase (default 10).
//! - `--concurrency N`: calls in flight in the closed loop (default 128: the gateway's best in a
//!   `--sweep`; 256 gave the same).
//! - `--connections N`: HTTP/2 connections the calls are spread over (default 4).
//! - `--rate N`: offered calls per second in the open loop (default 1000).
//! - `--client-threads N`: the load client's runtime worker threads (default 1: against the
//!   gateway it uses a fifth of a core; against the echo server two cores are saturated by
//!   server and client together, and a second client thread changed nothing).
//! - `--starts N`: fresh starts timed for start-up to healthy (default 5).
//! - `--sweep`: also measures the gateway's closed-loop throughput at several concurrencies
//!   (8 to 256), to pick `--concurrency`.
//! - `--quick`: a short smoke run (2 s phases, 3 starts).
//! - `--rounds N`: alternating rounds of the side-by-side comparisons (observing's cost,
//!   `--compare`; default 16, quick 3). The rounds of a shared machine scatter by about ±9%, so
//!   the summary gives the ratio's 95% confidence interval too: 6 rounds leave it about ±7%
//!   wide, more than the 5% observing may cost, 16 about ±4.3% and 24 about ±3.5%.
//! - `--redaction-only`: only the redactor's figure (no gateway is built or started).
//! - `--overhead-only`: only what observing costs (the alternating plain/observed windows).
//! - `--compare BINARY`: only a change's effect: this tree's gateway against `BINARY`, a
//!   gateway built from another commit (copy `target/production/toolgate` aside before the
//!   change), both plain, in the same alternating windows, then (unless `--no-instructions`)
//!   each one's instructions per call under callgrind. Throughput and CPU of separate runs
//!   minutes apart differ by tens of percent on a shared machine; side by side they do not.
//! - `--observed`: with `--compare`, both gateways export their traces (to the sink) and serve
//!   metrics: what a change does to an observed gateway, such as one to the span recorder.
//! - `--mcp`: with `--compare`, the windows call both gateways over MCP (`bench/mcp.rs`)
//!   instead of gRPC: what a change does to the MCP endpoint.
//! - `--postgres-only`: only the gateway on PostgreSQL, with what the server wrote for it.
//! - `--light-only`: only the light load: the disk's floor, then the echo server and the
//!   SQLite gateway at the fixed rate (open loops only), with CPU and switches per call, and
//!   the pages the gateway's last commits wrote, by table and index.
//! - `--mcp-only`: only the SQLite gateway over MCP, after the same gateway over gRPC (closed
//!   and open loops each), to see what the MCP transport costs against gRPC in one run.
//! - `--rates-only`: only the SQLite gateway's open loop at each offered rate (the sweep from
//!   light load to overload), printed and drawn as the chart.
//! - `--rates N,N,...`: the offered rates of the sweep (default 500 to 20,000 calls/s).
//! - `--no-instructions`: skip counting the instructions per call of a plain and an observed
//!   gateway under valgrind's callgrind (`bench/instructions.rs`; counted by default when
//!   valgrind is installed): what observing adds, independent of the machine's load (6,000
//!   calls each: the ledger's checkpoints, one every few hundred calls, land unevenly in the
//!   two counts, and over more calls they weigh less in the difference; `--quick`: 500;
//!   also without SHA-256's compression, which valgrind runs on the portable path for want
//!   of SHA-NI). `--instructions` insists (fails without valgrind).
//! - `--metrics`: the gateways serve Prometheus metrics (`[metrics] listen` on a free loopback
//!   port), to compare the throughput with metrics on and off.
//!
//! Internal: `--no-build` (the parent already built everything), `--echo-server` and
//! `--otlp-sink` (the trace receiver of the observed phase, `bench/otlp.rs`).

mod chart;
mod echo;
mod floor;
mod instructions;
mod load;
mod mcp;
mod otlp;
mod overhead;
mod postgres;
mod process;
mod redaction;
mod report;
mod scrape;
mod wal;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::bench::load::{ClosedLoop, OpenLoop, Target, Transport};
use crate::bench::mcp::McpClient;
use crate::bench::overhead::Pair;
use crate::bench::process::{Gateway, StartupSample};
use crate::bench::report::{LedgerPhases, Report, TargetFigures, per_call};

/// The Cargo profile the benchmark builds and measures: the one the gateway is deployed with
/// (release with link-time optimization, see the workspace's `Cargo.toml`). Its binaries are
/// in `target/production/`.
pub(crate) const PROFILE: &str = "production";

/// Builds the gateway measured: the [`PROFILE`], with the `testkit` connectors, and without
/// the AWS connector, which the benchmark never calls: the AWS SDK alone takes about 40
/// minutes to build in release on a 2-core machine and changes nothing on the measured path
/// (the `testkit.noop` call). Slack and Shopify stay, as in the default build.
const GATEWAY_BUILD: &[&str] = &[
    "build",
    "--profile",
    PROFILE,
    "-p",
    "toolgate",
    "--no-default-features",
    "--features",
    "testkit,slack,shopify",
];

/// Runs the benchmark (or, internally, the echo server).
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let options = Options::parse(args)?;
    if options.echo_server {
        return echo::serve();
    }
    if options.otlp_sink {
        return otlp::serve();
    }
    let root = workspace_root()?;
    let target_dir = target_dir(&root);
    if options.redaction_only {
        if cfg!(debug_assertions) {
            return reexec_built(&root, &target_dir, args);
        }
        return measure_redaction_only(&options);
    }
    if !options.no_build {
        cargo(&root, GATEWAY_BUILD)?;
        if cfg!(debug_assertions) {
            return reexec_built(&root, &target_dir, args);
        }
    }
    measure(&options, &target_dir)
}

/// Parsed command-line options.
#[derive(Debug, Clone)]
struct Options {
    duration: Duration,
    closed_warmup: Duration,
    open_warmup: Duration,
    concurrency: usize,
    connections: usize,
    rate: u32,
    client_threads: usize,
    starts: usize,
    sweep: bool,
    quick: bool,
    /// Alternating rounds of the side-by-side comparisons (`--rounds`); `None`: 16, quick 3.
    rounds: Option<usize>,
    no_build: bool,
    echo_server: bool,
    otlp_sink: bool,
    redaction_only: bool,
    overhead_only: bool,
    /// `--compare`: the other build's gateway binary.
    compare: Option<PathBuf>,
    /// `--observed`: with `--compare`, both gateways export traces and serve metrics.
    observed: bool,
    /// `--mcp`: with `--compare`, both gateways are called over MCP.
    mcp: bool,
    postgres_only: bool,
    light_only: bool,
    rates_only: bool,
    mcp_only: bool,
    /// The offered rates of the rate sweep (default [`RATES`]).
    rates: Vec<u32>,
    instructions: Count,
    metrics: bool,
    /// `--runs`: the runs the load is spread over (each worker, or open-loop call, on run
    /// `index % runs`); 1, as the benchmark always had, by default.
    runs: usize,
}

/// Concurrencies tried by `--sweep`.
const SWEEP: &[usize] = &[8, 16, 32, 64, 128, 256];

/// The offered rates (calls/s) of the rate sweep: from light load to far past capacity.
const RATES: &[u32] = &[500, 1_000, 2_000, 5_000, 10_000, 15_000, 20_000];

impl Options {
    fn parse(args: &[String]) -> anyhow::Result<Options> {
        let mut duration_secs: Option<u64> = None;
        let mut options = Options {
            duration: Duration::from_secs(10),
            closed_warmup: Duration::from_secs(2),
            open_warmup: Duration::from_secs(1),
            concurrency: 128,
            connections: 4,
            rate: 1000,
            client_threads: 1,
            starts: 5,
            sweep: false,
            quick: false,
            rounds: None,
            no_build: false,
            echo_server: false,
            otlp_sink: false,
            redaction_only: false,
            overhead_only: false,
            compare: None,
            observed: false,
            mcp: false,
            postgres_only: false,
            light_only: false,
            rates_only: false,
            mcp_only: false,
            rates: RATES.to_vec(),
            instructions: Count::WhenInstalled,
            metrics: false,
            runs: 1,
        };
        let mut starts: Option<usize> = None;
        let mut rest = args.iter();
        while let Some(arg) = rest.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (arg.as_str(), None),
            };
            let mut value = |what: &str| -> anyhow::Result<String> {
                match inline.clone().or_else(|| rest.next().cloned()) {
                    Some(value) => Ok(value),
                    None => bail!("{name} needs {what}\n{USAGE}"),
                }
            };
            match name {
                "--duration" => {
                    duration_secs = Some(positive(name, &value("a number of seconds")?)?)
                }
                "--concurrency" => options.concurrency = positive(name, &value("a number")?)?,
                "--connections" => options.connections = positive(name, &value("a number")?)?,
                "--rate" => options.rate = positive(name, &value("calls per second")?)?,
                "--client-threads" => options.client_threads = positive(name, &value("a number")?)?,
                "--starts" => starts = Some(positive(name, &value("a number")?)?),
                "--sweep" => options.sweep = true,
                "--quick" => options.quick = true,
                "--rounds" => options.rounds = Some(positive(name, &value("a number")?)?),
                "--no-build" => options.no_build = true,
                "--echo-server" => options.echo_server = true,
                "--otlp-sink" => options.otlp_sink = true,
                "--redaction-only" => options.redaction_only = true,
                "--overhead-only" => options.overhead_only = true,
                "--compare" => options.compare = Some(PathBuf::from(value("a gateway binary")?)),
                "--postgres-only" => options.postgres_only = true,
                "--light-only" => options.light_only = true,
                "--rates-only" => options.rates_only = true,
                "--mcp-only" => options.mcp_only = true,
                "--rates" => {
                    options.rates = rate_list(name, &value("calls per second, comma-separated")?)?
                }
                "--instructions" => options.instructions = Count::Always,
                "--no-instructions" => options.instructions = Count::Never,
                "--metrics" => options.metrics = true,
                "--runs" => options.runs = positive(name, &value("a number of runs")?)?,
                "--observed" => options.observed = true,
                "--mcp" => options.mcp = true,
                _ => bail!("unknown option `{arg}`\n{USAGE}"),
            }
        }
        if options.quick {
            options.duration = Duration::from_secs(2);
            options.closed_warmup = Duration::from_millis(500);
            options.open_warmup = Duration::from_millis(500);
            options.starts = 3;
        }
        if let Some(secs) = duration_secs {
            options.duration = Duration::from_secs(secs);
        }
        if let Some(starts) = starts {
            options.starts = starts;
        }
        if options.observed && options.compare.is_none() {
            bail!("--observed compares two builds: it needs --compare BINARY\n{USAGE}");
        }
        if options.mcp && options.compare.is_none() {
            bail!("--mcp compares two builds over MCP: it needs --compare BINARY\n{USAGE}");
        }
        Ok(options)
    }
}

const USAGE: &str = "usage: cargo xtask bench [--duration SECS] [--concurrency N] [--connections N] [--rate N] [--client-threads N] [--starts N] [--sweep] [--quick] [--rounds N] [--redaction-only] [--overhead-only] [--compare BINARY] [--postgres-only] [--light-only] [--mcp-only] [--rates-only] [--rates N,N,...] [--instructions | --no-instructions] [--metrics] [--observed] [--mcp] [--runs N]";

/// `--rates`: offered rates, comma-separated, each above 0.
fn rate_list(name: &str, text: &str) -> anyhow::Result<Vec<u32>> {
    text.split(',')
        .map(|rate| positive(name, rate.trim()))
        .collect()
}

fn positive<T>(name: &str, text: &str) -> anyhow::Result<T>
where
    T: std::str::FromStr + PartialOrd + Default,
{
    match text.parse::<T>() {
        Ok(value) if value > T::default() => Ok(value),
        _ => bail!("{name} must be a whole number above 0, got `{text}`"),
    }
}

/// `--redaction-only`: the redactor's figure against its budget, nothing else.
fn measure_redaction_only(options: &Options) -> anyhow::Result<()> {
    let figures = redaction::measure(options.duration.min(Duration::from_secs(3)));
    let per_call = figures.per_call.as_secs_f64() * 1e6;
    let verdict = if per_call <= 20.0 { "PASS" } else { "MISS" };
    println!(
        "redaction per typical call: {per_call:.1} µs (median {:.1} µs, batches {:.1}-{:.1} µs, {} calls), target at most 20 µs: {verdict}",
        figures.median.as_secs_f64() * 1e6,
        figures.fastest.as_secs_f64() * 1e6,
        figures.slowest.as_secs_f64() * 1e6,
        figures.calls
    );
    Ok(())
}

/// Measures both targets and reports. Runs in the binary built in the [`PROFILE`].
fn measure(options: &Options, target_dir: &Path) -> anyhow::Result<()> {
    let gateway_binary = target_dir.join(PROFILE).join("toolgate");
    if !gateway_binary.exists() {
        bail!(
            "{} does not exist; build it with `cargo {}`",
            gateway_binary.display(),
            GATEWAY_BUILD.join(" ")
        );
    }
    if let Some(other) = options.compare.as_ref().filter(|other| !other.is_file()) {
        bail!("--compare {}: no such file", other.display());
    }
    let own_binary = std::env::current_exe().context("cannot find the running xtask binary")?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(options.client_threads)
        .enable_all()
        .build()
        .context("cannot start the load client's runtime")?;
    println!(
        "bench: closed loop {} in flight over {} connections, open loop {} calls/s; {} s measured per phase; the gateways' calls on {} run(s); client: {PROFILE} build, {} runtime thread(s)",
        options.concurrency,
        options.connections,
        options.rate,
        options.duration.as_secs_f64(),
        options.runs,
        options.client_threads
    );

    // Two gateways side by side: throughput and CPU in alternating windows, then
    // instructions. What observing costs, or with `--compare` what a change does.
    let side_by_side = |pair: Pair<'_>| {
        let overhead = runtime.block_on(measure_overhead(options, &own_binary, pair))?;
        let instructions =
            runtime.block_on(measure_instructions(options, &own_binary, pair, target_dir))?;
        Ok::<_, anyhow::Error>((overhead, instructions))
    };
    let observing = || side_by_side(Pair::Observing(&gateway_binary));
    if options.overhead_only || options.compare.is_some() {
        let (overhead, instructions) = match &options.compare {
            Some(other) => side_by_side(Pair::Builds {
                this: &gateway_binary,
                other,
                observed: options.observed,
            })?,
            None => observing()?,
        };
        println!("\n{}", overhead.summary());
        if let Some(instructions) = instructions {
            println!("{}", instructions.summary());
        }
        return Ok(());
    }

    if options.postgres_only {
        let url = crate::pg::running_server_url()
            .context("no PostgreSQL server at TOOLGATE_TEST_PG_URL or 127.0.0.1:5432")?;
        let (figures, _storage) =
            runtime.block_on(measure_postgres(options, &gateway_binary, &url))?;
        println!(
            "\ngateway on PostgreSQL: {:.0} calls/s closed loop ({} failed); at {} calls/s p50 {} µs, p99 {} µs ({} failed)",
            figures.closed.throughput(),
            figures.closed.failed,
            options.rate,
            figures.open.latency.p50.as_micros(),
            figures.open.latency.p99.as_micros(),
            figures.open.failed
        );
        return Ok(());
    }

    if options.light_only {
        return runtime.block_on(measure_light_only(options, &own_binary, &gateway_binary));
    }

    if options.rates_only {
        return runtime.block_on(measure_rates_only(options, &gateway_binary, target_dir));
    }

    if options.mcp_only {
        return runtime.block_on(measure_mcp_only(options, &gateway_binary));
    }

    println!("\n==> redaction of a typical call (in-process)");
    let redaction = redaction::measure(options.duration.min(Duration::from_secs(3)));
    println!(
        "  {:.1} µs per call (median {:.1} µs, batches {:.1}-{:.1} µs, {} calls)",
        redaction.per_call.as_secs_f64() * 1e6,
        redaction.median.as_secs_f64() * 1e6,
        redaction.fastest.as_secs_f64() * 1e6,
        redaction.slowest.as_secs_f64() * 1e6,
        redaction.calls
    );

    println!(
        "\n==> the disk's floor: durable SQLite commits, 2 a call, at {} calls/s (no gateway)",
        options.rate
    );
    let floor = measure_floor(options)?;
    println!("  {}", floor.summary());

    println!("\n==> echo server (the floor)");
    let echo = process::spawn_echo(&own_binary)?;
    let echo_target = Target::echo(&echo.url);
    let (echo_closed, echo_open, _) = runtime.block_on(measure_target(
        options,
        &echo_target,
        echo.pid(),
        None,
        None,
    ))?;
    let echo_rss = process::peak_rss_kib(echo.pid())?;
    drop(echo);

    println!("\n==> gateway ({})", gateway_binary.display());
    let gateway = Gateway::start(&gateway_binary, None, options.metrics, &[])?;
    let gateway_target = runtime.block_on(gateway.prepare(options.runs))?;
    let sweep = if options.sweep {
        runtime.block_on(sweep_concurrency(options, &gateway_target, gateway.pid()))?
    } else {
        Vec::new()
    };
    let (gateway_closed, gateway_open, gateway_ledger) = runtime.block_on(measure_target(
        options,
        &gateway_target,
        gateway.pid(),
        gateway.metrics_url(),
        gateway.sqlite_ledger(),
    ))?;
    let gateway_rss = process::peak_rss_kib(gateway.pid())?;

    // The same gateway, ledger and run, called as MCP clients call it.
    println!("\n==> gateway over MCP (tools/call at /mcp, the same gateway and run)");
    let mcp = Transport::Mcp(Arc::new(McpClient::new(&gateway_target)?));
    let (mcp_closed, mcp_open, _) = runtime.block_on(measure_transport(
        options,
        &mcp,
        "mcp-",
        gateway.pid(),
        None,
        None,
    ))?;
    let mcp_rss = process::peak_rss_kib(gateway.pid())?;

    // The same gateway, ledger and run again, at offered rates from light to overload.
    println!("\n==> gateway at offered rates (open loop, the same gateway and run)");
    let rates = runtime.block_on(sweep_rates(options, &gateway_target, gateway.pid()))?;
    let gateway_stderr = gateway.stderr_summary();
    drop(gateway);

    let observed = runtime.block_on(measure_observed(options, &own_binary, &gateway_binary))?;
    let (overhead, instructions) = observing()?;

    let (postgres, postgres_storage) = match crate::pg::running_server_url() {
        Some(url) => {
            let (figures, storage) =
                runtime.block_on(measure_postgres(options, &gateway_binary, &url))?;
            (Some(figures), storage)
        }
        None => {
            println!(
                "\n==> gateway on PostgreSQL: skipped, no server at TOOLGATE_TEST_PG_URL or 127.0.0.1:5432"
            );
            (None, None)
        }
    };

    println!(
        "\n==> start-up to healthy ({} fresh starts)",
        options.starts
    );
    let startups: Vec<StartupSample> = (0..options.starts)
        .map(|_| runtime.block_on(process::time_startup(&gateway_binary, options.metrics)))
        .collect::<anyhow::Result<_>>()?;

    let report = Report {
        options: report::OptionsSummary {
            duration: options.duration,
            concurrency: options.concurrency,
            connections: options.connections,
            rate: options.rate,
            client_threads: options.client_threads,
            quick: options.quick,
            metrics: options.metrics,
            runs: options.runs,
        },
        echo: TargetFigures {
            closed: echo_closed,
            open: echo_open,
            peak_rss_kib: echo_rss,
            ledger: None,
        },
        gateway: TargetFigures {
            closed: gateway_closed,
            open: gateway_open,
            peak_rss_kib: gateway_rss,
            ledger: gateway_ledger,
        },
        mcp: TargetFigures {
            closed: mcp_closed,
            open: mcp_open,
            peak_rss_kib: mcp_rss,
            ledger: None,
        },
        startups,
        sweep,
        rates,
        gateway_stderr,
        observed,
        overhead,
        instructions,
        postgres,
        postgres_storage,
        redaction,
        floor,
    };
    report.print();
    let path = target_dir.join("bench").join("results.json");
    report.write_json(&path)?;
    println!("\nwrote {}", path.display());
    write_rates_chart(&report.rates, target_dir);
    report.check_calls()
}

/// The disk's floor at the fixed rate, in a temporary directory of its own.
fn measure_floor(options: &Options) -> anyhow::Result<floor::CommitFloor> {
    let floor_dir = tempfile::Builder::new()
        .prefix("toolgate-bench-floor-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    floor::measure(
        floor_dir.path(),
        options.rate,
        options.open_warmup,
        options.duration,
    )
}

/// `--light-only`: the disk's floor, then the echo server's and the SQLite gateway's open
/// loops at the fixed rate, each with its CPU and context switches per call.
async fn measure_light_only(
    options: &Options,
    own_binary: &Path,
    gateway_binary: &Path,
) -> anyhow::Result<()> {
    let floor = measure_floor(options)?;
    println!(
        "floor at {} calls/s of 2 commits: {}",
        options.rate,
        floor.summary()
    );
    let echo = process::spawn_echo(own_binary)?;
    let channels = load::connect(&echo.url, options.connections).await?;
    let transport = Transport::Grpc(Target::echo(&echo.url), channels);
    let echo_open = light_open_loop(options, &transport, echo.pid(), "echo").await?;
    drop(echo);
    let gateway = Gateway::start(gateway_binary, None, options.metrics, &[])?;
    let target = gateway.prepare(options.runs).await?;
    let channels = load::connect(&target.url, options.connections).await?;
    let transport = Transport::Grpc(target, channels);
    let gateway_open = light_open_loop(options, &transport, gateway.pid(), "gateway").await?;
    print_pages(gateway.sqlite_ledger(), "gateway ledger pages written", 12);
    println!(
        "gateway peak RSS {:.1} MiB",
        process::peak_rss_kib(gateway.pid())? as f64 / 1024.0
    );
    println!(
        "gateway added p50 {:.2} ms, p99 {:.2} ms over echo (floor: a call's 2 commits from when it was due, p50 {:.2} ms, p99 {:.2} ms)",
        (gateway_open.latency.p50.as_secs_f64() - echo_open.latency.p50.as_secs_f64()) * 1e3,
        (gateway_open.latency.p99.as_secs_f64() - echo_open.latency.p99.as_secs_f64()) * 1e3,
        floor.call_p50.as_secs_f64() * 1e3,
        floor.call_p99.as_secs_f64() * 1e3,
    );
    Ok(())
}

/// `--mcp-only`: the SQLite gateway called over gRPC, then the same gateway, ledger and run
/// called over MCP, closed and open loops each.
async fn measure_mcp_only(options: &Options, gateway_binary: &Path) -> anyhow::Result<()> {
    let gateway = Gateway::start(gateway_binary, None, options.metrics, &[])?;
    let target = gateway.prepare(options.runs).await?;
    println!("\n==> gateway over gRPC");
    let (grpc_closed, _, _) = measure_target(options, &target, gateway.pid(), None, None).await?;
    println!("\n==> the same gateway over MCP (pid {})", gateway.pid());
    let mcp = Transport::Mcp(Arc::new(McpClient::new(&target)?));
    let (mcp_closed, _, _) =
        measure_transport(options, &mcp, "mcp-", gateway.pid(), None, None).await?;
    println!(
        "\nMCP {:.0} calls/s against gRPC {:.0} ({:.3})",
        mcp_closed.throughput(),
        grpc_closed.throughput(),
        mcp_closed.throughput() / grpc_closed.throughput()
    );
    Ok(())
}

/// `--rates-only`: the SQLite gateway's open loop at each offered rate, and the chart.
async fn measure_rates_only(
    options: &Options,
    gateway_binary: &Path,
    target_dir: &Path,
) -> anyhow::Result<()> {
    let gateway = Gateway::start(gateway_binary, None, options.metrics, &[])?;
    let target = gateway.prepare(options.runs).await?;
    let rates = sweep_rates(options, &target, gateway.pid()).await?;
    write_rates_chart(&rates, target_dir);
    Ok(())
}

/// Draws the rate sweep to `target/bench/rates.png`. Without it (no font, say) only the
/// picture is missing: the figures are printed (and in the JSON of a full run).
fn write_rates_chart(rates: &[OpenLoop], target_dir: &Path) {
    let chart = target_dir.join("bench").join("rates.png");
    match report::draw_rates(rates, &chart) {
        Ok(()) => println!("wrote {}", chart.display()),
        Err(error) => println!("no chart: {error:#}"),
    }
}

/// One open loop at the fixed rate for `--light-only`, printed with its CPU, switches and
/// busiest threads per call.
async fn light_open_loop(
    options: &Options,
    transport: &Transport,
    server_pid: u32,
    name: &str,
) -> anyhow::Result<OpenLoop> {
    let open = load::open_loop(
        transport,
        &format!("light-{name}"),
        options.rate,
        options.open_warmup,
        options.duration,
        server_pid,
    )
    .await?;
    let (cpu, switches) = per_call(&open.cpu, open.scheduled - open.failed);
    let threads: Vec<String> = open
        .cpu
        .server_threads
        .iter()
        .map(|(thread, percent)| format!("{thread} {percent:.1}%"))
        .collect();
    println!(
        "{name} at {} calls/s: p50 {} µs, p99 {} µs ({} failed); {:.1} µs CPU and {:.1} switches per call; threads: {}",
        options.rate,
        open.latency.p50.as_micros(),
        open.latency.p99.as_micros(),
        open.failed,
        cpu,
        switches,
        threads.join(", ")
    );
    Ok(open)
}

/// The SQLite gateway with traces exported to the sink and metrics on: the same closed and
/// open loops.
async fn measure_observed(
    options: &Options,
    own_binary: &Path,
    gateway_binary: &Path,
) -> anyhow::Result<TargetFigures> {
    println!("\n==> gateway, traces exported and metrics on");
    let sink = process::spawn_sink(own_binary)?;
    let env = [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", sink.url.as_str()),
        ("OTEL_SERVICE_NAME", "toolgate-bench"),
    ];
    let gateway = Gateway::start(gateway_binary, None, true, &env)?;
    let target = gateway.prepare(options.runs).await?;
    let (closed, open, ledger) =
        measure_target(options, &target, gateway.pid(), gateway.metrics_url(), None).await?;
    let peak_rss_kib = process::peak_rss_kib(gateway.pid())?;
    drop(gateway);
    drop(sink);
    Ok(TargetFigures {
        closed,
        open,
        peak_rss_kib,
        ledger,
    })
}

/// Two gateways side by side in alternating windows (quick: 3 rounds of 1 s; else 16 rounds
/// of 3 s, or `--rounds`, each window after its own warm-up): what observing costs, or a
/// change's effect.
async fn measure_overhead(
    options: &Options,
    own_binary: &Path,
    pair: Pair<'_>,
) -> anyhow::Result<overhead::Overhead> {
    let (rounds, window, warmup) = if options.quick {
        (3, Duration::from_secs(1), Duration::from_millis(500))
    } else {
        (16, Duration::from_secs(3), Duration::from_secs(1))
    };
    let rounds = options.rounds.unwrap_or(rounds);
    let (base, measured) = pair.names();
    println!(
        "\n==> {measured} against {base}: two gateways side by side, {rounds} alternating rounds of {} s{}",
        window.as_secs(),
        if options.mcp { ", called over MCP" } else { "" }
    );
    overhead::measure(
        own_binary,
        pair,
        rounds,
        window,
        warmup,
        overhead::Shape {
            concurrency: options.concurrency,
            connections: options.connections,
            runs: options.runs,
            mcp: options.mcp,
        },
    )
    .await
}

/// Whether the instructions per call are counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Count {
    /// When valgrind is installed (the default).
    WhenInstalled,
    Always,
    Never,
}

/// Instructions per call of the two gateways of `pair`; their callgrind profiles are kept
/// under `target/bench/` for `callgrind_annotate`.
async fn measure_instructions(
    options: &Options,
    own_binary: &Path,
    pair: Pair<'_>,
    target_dir: &Path,
) -> anyhow::Result<Option<instructions::Instructions>> {
    match options.instructions {
        Count::Never => return Ok(None),
        Count::WhenInstalled if !instructions::available() => {
            println!(
                "\n==> instructions per call: skipped, valgrind is not installed (Debian's package valgrind)"
            );
            return Ok(None);
        }
        Count::WhenInstalled | Count::Always => {}
    }
    if options.mcp {
        println!("\n==> instructions per call: not counted over MCP (the count calls over gRPC)");
        return Ok(None);
    }
    let calls = if options.quick { 500 } else { 6_000 };
    let (base, measured) = pair.names();
    println!(
        "\n==> instructions per call under callgrind, {base} and {measured} ({calls} calls each)"
    );
    let keep = target_dir.join("bench");
    let (counted, differences) = instructions::measure(own_binary, pair, calls, &keep, 15).await?;
    println!("  {}", counted.summary());
    let (base_profile, measured_profile) = (
        keep.join(instructions::profile(base)),
        keep.join(instructions::profile(measured)),
    );
    println!(
        "  profiles: {} and {}",
        base_profile.display(),
        measured_profile.display()
    );
    // Where the difference is: read from the profiles, so no session has to derive it by hand.
    if !differences.is_empty() {
        println!("  own instructions per call by function, {measured} minus {base}:");
        for difference in &differences {
            println!("    {:+8.0}  {}", difference.per_call, difference.function);
        }
    }
    Ok(Some(counted))
}

/// The gateway on a PostgreSQL ledger (a fresh schema, dropped afterwards when `psql` is
/// available): the same closed and open loops, and what the server wrote for them (when
/// `psql` is available).
async fn measure_postgres(
    options: &Options,
    gateway_binary: &Path,
    url: &str,
) -> anyhow::Result<(TargetFigures, Option<postgres::Storage>)> {
    let schema = format!("toolgate_bench_{}", std::process::id());
    println!("\n==> gateway on PostgreSQL (schema {schema})");
    let gateway = Gateway::start(gateway_binary, Some((url, &schema)), true, &[])?;
    let mut since = None;
    let result = async {
        let target = gateway.prepare(options.runs).await?;
        since = postgres::wal_position(url);
        let (closed, open, ledger) =
            measure_target(options, &target, gateway.pid(), gateway.metrics_url(), None).await?;
        let peak_rss_kib = process::peak_rss_kib(gateway.pid())?;
        Ok::<_, anyhow::Error>(TargetFigures {
            closed,
            open,
            peak_rss_kib,
            ledger,
        })
    }
    .await;
    drop(gateway);
    let storage = since.and_then(|since| postgres::storage(url, &schema, &since));
    if let Some(storage) = &storage {
        println!("  {}", storage.summary());
    }
    postgres::drop_schema(url, &schema);
    Ok((result?, storage))
}

/// The closed loop, then the open loop, against one target.
async fn measure_target(
    options: &Options,
    target: &Target,
    server_pid: u32,
    metrics_url: Option<&str>,
    sqlite_ledger: Option<&Path>,
) -> anyhow::Result<(ClosedLoop, OpenLoop, Option<LedgerPhases>)> {
    let channels = load::connect(&target.url, options.connections).await?;
    let transport = Transport::Grpc(target.clone(), channels);
    measure_transport(
        options,
        &transport,
        "",
        server_pid,
        metrics_url,
        sqlite_ledger,
    )
    .await
}

/// Prints, after `label`, the pages the last commits to the SQLite ledger `database` wrote, for
/// its `top` tables and indexes ([`wal`]); nothing without a SQLite ledger. A diagnostic: a log
/// that cannot be read is said so, and the figures measured beside it still stand.
fn print_pages(database: Option<&Path>, label: &str, top: usize) {
    if let Some(database) = database {
        match wal::read(database) {
            Ok(frames) => println!("{label}: {}", frames.summary(top)),
            Err(error) => println!("{label}: not read ({error:#})"),
        }
    }
}

/// The closed loop, then the open loop, over one transport; `phase` prefixes the calls'
/// tool_use_ids (distinct per transport on one run, so none is a replay). With the server's
/// `metrics_url`, also what each loop's calls cost its ledger (commits and batch sizes, from
/// scrapes before and after each, warm-up included). With the server's SQLite ledger file,
/// also which tables and indexes each loop's last commits wrote pages of ([`wal`]).
async fn measure_transport(
    options: &Options,
    transport: &Transport,
    phase: &str,
    server_pid: u32,
    metrics_url: Option<&str>,
    sqlite_ledger: Option<&Path>,
) -> anyhow::Result<(ClosedLoop, OpenLoop, Option<LedgerPhases>)> {
    let pages =
        |name: &str| print_pages(sqlite_ledger, &format!("  ledger pages written, {name}"), 8);
    let scrape = || metrics_url.map(scrape::scrape).transpose();
    let before_closed = scrape()?;
    let closed = load::closed_loop(
        transport,
        &format!("{phase}closed"),
        options.concurrency,
        options.closed_warmup,
        options.duration,
        server_pid,
    )
    .await?;
    println!(
        "  closed loop: {:.0} calls/s ({} failed), server CPU {:.0}%, client CPU {:.0}%",
        closed.throughput(),
        closed.failed,
        closed.cpu.server_percent,
        closed.cpu.client_percent
    );
    pages("closed loop");
    let before_open = scrape()?;
    let open = load::open_loop(
        transport,
        &format!("{phase}open"),
        options.rate,
        options.open_warmup,
        options.duration,
        server_pid,
    )
    .await?;
    println!(
        "  open loop at {} calls/s: p50 {} µs, p99 {} µs ({} failed)",
        options.rate,
        open.latency.p50.as_micros(),
        open.latency.p99.as_micros(),
        open.failed
    );
    pages("open loop");
    let after_open = scrape()?;
    let ledger = match (before_closed, before_open, after_open) {
        (Some(a), Some(b), Some(c)) => {
            let phases = LedgerPhases {
                closed: a.until(&b),
                open: b.until(&c),
            };
            for (name, writes) in [("closed loop", &phases.closed), ("open loop", &phases.open)] {
                println!(
                    "  ledger, {name}: {:.2} commits per call, {:.1} writes per commit ({})",
                    writes.commits_per_call(),
                    writes.mean_batch(),
                    writes.distribution()
                );
            }
            Some(phases)
        }
        _ => None,
    };
    Ok((closed, open, ledger))
}

/// The gateway's open loop at each offered rate of `--rates` ([`RATES`]): what it delivers,
/// how fast, and how many calls it refuses once past its capacity (load shedding, not failures
/// of the benchmark).
async fn sweep_rates(
    options: &Options,
    target: &Target,
    server_pid: u32,
) -> anyhow::Result<Vec<OpenLoop>> {
    let channels = load::connect(&target.url, options.connections).await?;
    let transport = Transport::Grpc(target.clone(), channels);
    let (warmup, duration) = if options.quick {
        (Duration::from_millis(300), Duration::from_secs(1))
    } else {
        (Duration::from_secs(1), Duration::from_secs(3))
    };
    let mut results = Vec::new();
    // The phase's index keeps tool_use_ids distinct when a rate is given twice: a repeated
    // id would be a replay, not a call.
    for (index, &rate) in options.rates.iter().enumerate() {
        let open = load::open_loop(
            &transport,
            &format!("rate{index}x{rate}"),
            rate,
            warmup,
            duration,
            server_pid,
        )
        .await?;
        println!(
            "  offered {rate:>6}/s: delivered {:>7.0}/s, p50 {:>9.2} ms, p99 {:>9.2} ms, refused {}, gateway CPU {:.0}%, client CPU {:.0}%, send lag p99 {:.1} ms",
            open.delivered(),
            open.latency.p50.as_secs_f64() * 1e3,
            open.latency.p99.as_secs_f64() * 1e3,
            open.failed,
            open.cpu.server_percent,
            open.cpu.client_percent,
            open.send_lag_p99.as_secs_f64() * 1e3
        );
        results.push(open);
    }
    Ok(results)
}

/// The gateway's closed-loop throughput at each concurrency of [`SWEEP`].
async fn sweep_concurrency(
    options: &Options,
    target: &Target,
    server_pid: u32,
) -> anyhow::Result<Vec<(usize, ClosedLoop)>> {
    let channels = load::connect(&target.url, options.connections).await?;
    let transport = Transport::Grpc(target.clone(), channels);
    let duration = if options.quick {
        Duration::from_secs(1)
    } else {
        Duration::from_secs(3)
    };
    let mut results = Vec::new();
    for &concurrency in SWEEP {
        let phase = format!("sweep{concurrency}");
        let closed = load::closed_loop(
            &transport,
            &phase,
            concurrency,
            Duration::from_secs(1),
            duration,
            server_pid,
        )
        .await?;
        println!(
            "  sweep: {concurrency:>4} in flight: {:>8.0} calls/s, gateway CPU {:.0}%, client CPU {:.0}%",
            closed.throughput(),
            closed.cpu.server_percent,
            closed.cpu.client_percent
        );
        results.push((concurrency, closed));
    }
    Ok(results)
}

/// Builds this crate in the [`PROFILE`] and runs the benchmark there, passing the options on.
fn reexec_built(root: &Path, target_dir: &Path, args: &[String]) -> anyhow::Result<()> {
    cargo(root, &["build", "--profile", PROFILE, "-p", "xtask"])?;
    let binary = target_dir.join(PROFILE).join("xtask");
    let status = Command::new(&binary)
        .arg("bench")
        .arg("--no-build")
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    if !status.success() {
        bail!("the benchmark process failed ({status})");
    }
    Ok(())
}

fn cargo(root: &Path, args: &[&str]) -> anyhow::Result<()> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    println!("==> cargo {}", args.join(" "));
    let status = Command::new(&cargo)
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("cannot run {cargo}"))?;
    if !status.success() {
        bail!("`cargo {}` failed ({status})", args.join(" "));
    }
    Ok(())
}

fn workspace_root() -> anyhow::Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(Path::to_path_buf)
        .context("xtask lives one level below the workspace root")
}

fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => root.join(dir),
        None => root.join("target"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> anyhow::Result<Options> {
        Options::parse(&args.iter().map(|arg| (*arg).to_owned()).collect::<Vec<_>>())
    }

    /// `args` are refused with an error saying `words`.
    fn refused(args: &[&str], words: &str) {
        let error = match parse(args) {
            Ok(_) => panic!("{args:?} were taken"),
            Err(error) => error.to_string(),
        };
        assert!(error.contains(words), "{args:?}: {error}");
    }

    #[test]
    fn the_rate_sweep_takes_the_rates_it_is_given() {
        assert_eq!(parse(&[]).unwrap().rates, RATES);
        let options = parse(&["--rates-only", "--rates", "2000, 20000"]).unwrap();
        assert!(options.rates_only);
        assert_eq!(options.rates, [2_000, 20_000]);
        assert_eq!(parse(&["--rates=750"]).unwrap().rates, [750]);
        for bad in ["", "0", "1000,", "1000,x", "-5"] {
            refused(&["--rates", bad], "--rates must be a whole number above 0");
        }
        refused(&["--rates"], "--rates needs calls per second");
    }

    #[test]
    fn the_load_is_on_one_run_unless_told_otherwise() {
        assert_eq!(parse(&[]).unwrap().runs, 1);
        assert_eq!(parse(&["--runs", "128"]).unwrap().runs, 128);
        assert_eq!(parse(&["--runs=3"]).unwrap().runs, 3);
        for bad in ["0", "x", "-1"] {
            refused(&["--runs", bad], "--runs must be a whole number above 0");
        }
        refused(&["--runs"], "--runs needs a number of runs");
    }

    #[test]
    fn observed_builds_need_a_build_to_compare() {
        let options = parse(&["--compare", "/tmp/other", "--observed"]).unwrap();
        assert!(options.observed);
        assert_eq!(options.compare.as_deref(), Some(Path::new("/tmp/other")));
        assert!(!parse(&["--compare", "/tmp/other"]).unwrap().observed);
        refused(&["--observed"], "--observed compares two builds");
        assert!(parse(&["--compare", "/tmp/other", "--mcp"]).unwrap().mcp);
        refused(&["--mcp"], "--mcp compares two builds over MCP");
    }

    #[test]
    fn the_side_by_side_rounds_can_be_set() {
        assert_eq!(parse(&[]).unwrap().rounds, None);
        assert_eq!(parse(&["--rounds", "24"]).unwrap().rounds, Some(24));
        refused(
            &["--rounds", "0"],
            "--rounds must be a whole number above 0",
        );
    }
}
