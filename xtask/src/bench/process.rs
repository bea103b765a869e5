//! The benchmark's child processes (echo server, gateway), killed when their guard drops, and
//! what `/proc` says about them: CPU time and peak RSS.

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader, Read as _};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::admin_service_client::AdminServiceClient;
use toolgate_proto::v1::agent_service_client::AgentServiceClient;

use crate::bench::load::{Target, authed};
use crate::bench::{echo, otlp};

/// How long a child may take to announce its address.
const ANNOUNCE_TIMEOUT: Duration = Duration::from_secs(30);

/// The line the gateway prints once it listens, followed by its address.
const GATEWAY_ANNOUNCEMENT: &str = "toolgate listening on ";

/// The line it prints before that one when it serves metrics, followed by their URL.
const METRICS_ANNOUNCEMENT: &str = "toolgate metrics on ";

/// The tenant, agent and tool the benchmark drives.
const TENANT: &str = "bench";
const AGENT: &str = "bench-agent";
const TOOL: &str = "testkit.noop";

/// The run budget: enough for every call of any run of the benchmark. The gateway's default
/// ceiling (`engine.max_calls_limit`) is lower, so the gateway's config file raises it.
const RUN_BUDGET: u32 = 4_000_000_000;

/// The health-checked service whose SERVING status means the gateway takes agent calls.
const HEALTH_SERVICE: &str = "toolgate.v1.AgentService";

/// A child process killed (and reaped) when dropped, so no exit path leaves it running.
#[derive(Debug)]
pub(crate) struct ChildGuard {
    child: Child,
}

impl ChildGuard {
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Fails when the process has already exited.
    fn check_running(&mut self, what: &str) -> anyhow::Result<()> {
        match self.child.try_wait()? {
            Some(status) => bail!("{what} exited early ({status})"),
            None => Ok(()),
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The echo server, running.
#[derive(Debug)]
pub(crate) struct EchoServer {
    guard: ChildGuard,
    /// `http://127.0.0.1:PORT`.
    pub(crate) url: String,
}

impl EchoServer {
    pub(crate) fn pid(&self) -> u32 {
        self.guard.pid()
    }
}

/// Starts `binary bench --echo-server` and waits for its address.
pub(crate) fn spawn_echo(binary: &Path) -> anyhow::Result<EchoServer> {
    let child = Command::new(binary)
        .args(["bench", "--echo-server"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start the echo server {}", binary.display()))?;
    let mut guard = ChildGuard { child };
    let address = wait_for_announcement(&mut guard, echo::ANNOUNCEMENT, "the echo server")?;
    Ok(EchoServer {
        guard,
        url: format!("http://{address}"),
    })
}

/// The environment of a gateway exporting its traces to `sink`.
pub(crate) fn observed_env(sink: &EchoServer) -> [(&'static str, &str); 2] {
    [
        ("OTEL_EXPORTER_OTLP_ENDPOINT", sink.url.as_str()),
        ("OTEL_SERVICE_NAME", "toolgate-bench"),
    ]
}

/// Starts `binary bench --otlp-sink` and waits for its address; it reports the spans it
/// received on standard error when it stops.
pub(crate) fn spawn_sink(binary: &Path) -> anyhow::Result<EchoServer> {
    let child = Command::new(binary)
        .args(["bench", "--otlp-sink"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("cannot start the trace sink {}", binary.display()))?;
    let mut guard = ChildGuard { child };
    let address = wait_for_announcement(&mut guard, otlp::ANNOUNCEMENT, "the trace sink")?;
    Ok(EchoServer {
        guard,
        url: format!("http://{address}"),
    })
}

/// A gateway started for the load phases, in its own temporary directory.
#[derive(Debug)]
pub(crate) struct Gateway {
    guard: ChildGuard,
    url: String,
    /// `http://127.0.0.1:PORT/metrics` when it serves metrics.
    metrics_url: Option<String>,
    /// Its ledger's file, when it keeps its ledger in SQLite (in `dir`).
    sqlite_ledger: Option<PathBuf>,
    dir: tempfile::TempDir,
}

/// The SQLite ledger's file name in a gateway's directory.
const SQLITE_LEDGER: &str = "toolgate.db";

impl Gateway {
    /// Starts the gateway on a fresh database with a run budget large enough for the benchmark:
    /// a SQLite file in its directory, or `database` (a PostgreSQL URL and a fresh schema);
    /// with `metrics`, serving Prometheus metrics on a free loopback port; with `env` added to
    /// its environment.
    pub(crate) fn start(
        binary: &Path,
        database: Option<(&str, &str)>,
        metrics: bool,
        env: &[(&str, &str)],
    ) -> anyhow::Result<Gateway> {
        let dir = tempfile::Builder::new()
            .prefix("toolgate-bench-")
            .tempdir()
            .context("cannot create a temporary directory")?;
        let mut guard = spawn_gateway(binary, dir.path(), "127.0.0.1:0", database, metrics, env)?;
        let (address, earlier) = wait_for_announcements(
            &mut guard,
            &[METRICS_ANNOUNCEMENT],
            GATEWAY_ANNOUNCEMENT,
            "the gateway",
        )?;
        let metrics_url = earlier.into_iter().next().map(|(_, url)| url);
        if metrics && metrics_url.is_none() {
            bail!("the gateway was asked to serve metrics but did not say where");
        }
        Ok(Gateway {
            guard,
            url: format!("http://{address}"),
            metrics_url,
            sqlite_ledger: database.is_none().then(|| dir.path().join(SQLITE_LEDGER)),
            dir,
        })
    }

    /// Its SQLite ledger's file, when it keeps its ledger in SQLite.
    pub(crate) fn sqlite_ledger(&self) -> Option<&Path> {
        self.sqlite_ledger.as_deref()
    }

    /// Where it serves its metrics, when started with them.
    pub(crate) fn metrics_url(&self) -> Option<&str> {
        self.metrics_url.as_deref()
    }

    pub(crate) fn pid(&self) -> u32 {
        self.guard.pid()
    }

    /// Creates the tenant, agent, grant, flag, agent token and `runs` runs through the admin
    /// API, checks one call succeeds, and returns the target the load client drives (its
    /// workers spread over the runs).
    pub(crate) async fn prepare(&self, runs: usize) -> anyhow::Result<Target> {
        let admin_token = std::fs::read_to_string(self.dir.path().join("toolgate-admin.token"))
            .context("the gateway did not write its bootstrap admin token")?
            .trim()
            .to_owned();
        let channel = Endpoint::from_shared(self.url.clone())?
            .timeout(Duration::from_secs(10))
            .connect()
            .await
            .with_context(|| format!("cannot connect to the gateway at {}", self.url))?;
        let mut admin = AdminServiceClient::new(channel.clone());
        let token = admin_token.as_str();
        admin
            .create_tenant(authed(
                pb::CreateTenantRequest {
                    tenant_id: TENANT.into(),
                    name: TENANT.into(),
                },
                token,
            )?)
            .await
            .context("create the tenant")?;
        admin
            .create_agent(authed(
                pb::CreateAgentRequest {
                    tenant_id: TENANT.into(),
                    agent_id: AGENT.into(),
                    name: AGENT.into(),
                },
                token,
            )?)
            .await
            .context("create the agent")?;
        admin
            .set_permission(authed(
                pb::SetPermissionRequest {
                    tenant_id: TENANT.into(),
                    agent_id: String::new(),
                    tool_name: TOOL.into(),
                    enabled: true,
                },
                token,
            )?)
            .await
            .context("grant the tool")?;
        admin
            .set_feature_flag(authed(
                pb::SetFeatureFlagRequest {
                    tenant_id: TENANT.into(),
                    flag: "tool_calling_enabled".into(),
                    enabled: true,
                },
                token,
            )?)
            .await
            .context("enable tool calling")?;
        let agent_token = admin
            .create_token(authed(
                pb::CreateTokenRequest {
                    role: "agent".into(),
                    tenant_id: TENANT.into(),
                    agent_id: AGENT.into(),
                    label: "bench".into(),
                },
                token,
            )?)
            .await
            .context("create the agent token")?
            .into_inner()
            .token;

        let mut agent = AgentServiceClient::new(channel);
        let mut run_ids = Vec::with_capacity(runs);
        for _ in 0..runs {
            let run = agent
                .create_run(authed(
                    pb::CreateRunRequest {
                        agent_id: AGENT.into(),
                        run_id: String::new(),
                        max_calls: RUN_BUDGET,
                    },
                    &agent_token,
                )?)
                .await
                .context("open a run")?
                .into_inner();
            run_ids.push(run.run_id);
        }
        let target = Target::new(&self.url, &agent_token, run_ids, TOOL)?;
        let check = agent
            .execute_tool(target.request("setup".to_owned()))
            .await
            .context("the first ExecuteTool call failed")?
            .into_inner();
        if check.status != i32::from(pb::ToolCallStatus::Succeeded) {
            bail!(
                "the first ExecuteTool call did not succeed: status {}, {} {}",
                check.status,
                check.error_code,
                check.error_message
            );
        }
        Ok(target)
    }

    /// What the gateway wrote on stderr, if anything: its line count and first line.
    pub(crate) fn stderr_summary(&self) -> Option<String> {
        stderr_summary(&self.dir.path().join("gateway.stderr"))
    }
}

/// Starts the gateway in `dir` (fresh SQLite file `toolgate.db` there, unless `database` names
/// a PostgreSQL URL and schema), stderr to a file; with `metrics`, serving them on a free
/// loopback port.
fn spawn_gateway(
    binary: &Path,
    dir: &Path,
    listen: &str,
    database: Option<(&str, &str)>,
    metrics: bool,
    env: &[(&str, &str)],
) -> anyhow::Result<ChildGuard> {
    let metrics_table = if metrics {
        "[metrics]\nlisten = \"127.0.0.1:0\"\n"
    } else {
        ""
    };
    std::fs::write(
        dir.join("toolgate.toml"),
        format!(
            "# Written by cargo xtask bench.\n[engine]\nmax_calls_limit = {RUN_BUDGET}\n{metrics_table}"
        ),
    )
    .context("cannot write the gateway's config file")?;
    let stderr = std::fs::File::create(dir.join("gateway.stderr"))
        .context("cannot create the gateway's log file")?;
    let mut command = Command::new(binary);
    match database {
        Some((url, schema)) => command
            .args(["serve", "--listen", listen, "--database", url])
            .env("TOOLGATE_DATABASE_SCHEMA", schema),
        None => command.args(["serve", "--listen", listen, "--database", SQLITE_LEDGER]),
    };
    // Only what `env` says: an `OTEL_*` variable of the bench's own environment would make
    // a plain gateway export traces.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("OTEL_") {
            command.env_remove(name);
        }
    }
    let child = command
        .current_dir(dir)
        .env("TOOLGATE_LOG", "warn")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(stderr)
        .spawn()
        .with_context(|| format!("cannot start {}", binary.display()))?;
    Ok(ChildGuard { child })
}

fn stderr_summary(path: &Path) -> Option<String> {
    let mut text = String::new();
    std::fs::File::open(path)
        .ok()?
        .read_to_string(&mut text)
        .ok()?;
    let first = text.lines().next()?;
    Some(format!("{} line(s); first: {first}", text.lines().count()))
}

/// Reads the child's stdout until `prefix` appears and returns what follows it. The reader
/// thread then keeps draining stdout so the child never blocks on a full pipe.
fn wait_for_announcement(
    guard: &mut ChildGuard,
    prefix: &'static str,
    what: &str,
) -> anyhow::Result<String> {
    wait_for_announcements(guard, &[], prefix, what).map(|(address, _)| address)
}

/// Waits for the line starting with `last`, collecting the lines starting with one of
/// `earlier` that come before it: the text after `last`, and each earlier prefix with its text.
fn wait_for_announcements(
    guard: &mut ChildGuard,
    earlier: &[&'static str],
    last: &'static str,
    what: &str,
) -> anyhow::Result<(String, Vec<(&'static str, String)>)> {
    let stdout = guard
        .child
        .stdout
        .take()
        .context("the child's stdout is not piped")?;
    let mut prefixes = earlier.to_vec();
    prefixes.push(last);
    let announced = watch_stdout(stdout, &prefixes);
    let deadline = Instant::now() + ANNOUNCE_TIMEOUT;
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match announced.recv_timeout(left) {
            Ok((prefix, text, _)) if prefix == last => return Ok((text, seen)),
            Ok((prefix, text, _)) => seen.push((prefix, text)),
            Err(_) => {
                guard.check_running(what)?;
                bail!(
                    "{what} did not announce its address within {} s",
                    ANNOUNCE_TIMEOUT.as_secs()
                )
            }
        }
    }
}

/// An announcement: its prefix, the text after it, and when it was read.
type Announcement = (&'static str, String, Instant);

/// Sends each line starting with one of `prefixes` (which prefix, the text after it, when it
/// was read), in the order they appear.
fn watch_stdout(stdout: ChildStdout, prefixes: &[&'static str]) -> mpsc::Receiver<Announcement> {
    let prefixes = prefixes.to_vec();
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            for &prefix in &prefixes {
                if let Some(rest) = line.strip_prefix(prefix) {
                    let _ = sender.send((prefix, rest.trim().to_owned(), Instant::now()));
                }
            }
        }
    });
    receiver
}

/// One timed start of the gateway.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StartupSample {
    /// From spawn to the health check answering SERVING.
    pub(crate) healthy: Duration,
    /// From spawn to the `toolgate listening on` line.
    pub(crate) announced: Option<Duration>,
}

/// Spawns the gateway on a fresh database and a free port, polls the health service every
/// ~2 ms, and returns how long it took to answer SERVING.
pub(crate) async fn time_startup(binary: &Path, metrics: bool) -> anyhow::Result<StartupSample> {
    const POLL: Duration = Duration::from_millis(2);
    const LIMIT: Duration = Duration::from_secs(20);
    let dir = tempfile::Builder::new()
        .prefix("toolgate-bench-start-")
        .tempdir()
        .context("cannot create a temporary directory")?;
    // The port must be known before the gateway announces it, so health polling can start at
    // once: take a free one from the kernel and hand it over (loopback, so nothing else races
    // for it in practice).
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let listen = format!("127.0.0.1:{port}");
    let endpoint = Endpoint::from_shared(format!("http://{listen}"))?
        .connect_timeout(Duration::from_millis(100))
        .timeout(Duration::from_millis(500));

    let spawned = Instant::now();
    let mut guard = spawn_gateway(binary, dir.path(), &listen, None, metrics, &[])?;
    let stdout = guard
        .child
        .stdout
        .take()
        .context("the gateway's stdout is not piped")?;
    let announced = watch_stdout(stdout, &[GATEWAY_ANNOUNCEMENT]);
    let mut client: Option<HealthClient<Channel>> = None;
    let healthy = loop {
        if spawned.elapsed() > LIMIT {
            bail!("the gateway was not healthy within {} s", LIMIT.as_secs());
        }
        if client.is_none() {
            client = endpoint.connect().await.ok().map(HealthClient::new);
        }
        if let Some(health) = client.as_mut() {
            let request = HealthCheckRequest {
                service: HEALTH_SERVICE.to_owned(),
            };
            if let Ok(response) = health.check(request).await
                && response.get_ref().status == i32::from(ServingStatus::Serving)
            {
                break spawned.elapsed();
            }
        }
        guard.check_running("the gateway").map_err(|err| {
            let log = stderr_summary(&dir.path().join("gateway.stderr")).unwrap_or_default();
            err.context(log)
        })?;
        tokio::time::sleep(POLL).await;
    };
    let announced = announced
        .try_recv()
        .ok()
        .map(|(_, _, at)| at.duration_since(spawned));
    drop(guard);
    println!(
        "  healthy after {:.1} ms (announced after {})",
        healthy.as_secs_f64() * 1000.0,
        announced.map_or_else(
            || "-".to_owned(),
            |d| format!("{:.1} ms", d.as_secs_f64() * 1000.0)
        )
    );
    Ok(StartupSample { healthy, announced })
}

/// The peak resident set (`VmHWM`) of a process, in KiB.
pub(crate) fn peak_rss_kib(pid: u32) -> anyhow::Result<u64> {
    let path = PathBuf::from(format!("/proc/{pid}/status"));
    let status = std::fs::read_to_string(&path)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .with_context(|| format!("no VmHWM in {}", path.display()))?;
    let kib = line.trim().trim_end_matches("kB").trim();
    kib.parse()
        .with_context(|| format!("unexpected VmHWM `{line}`"))
}

/// CPU time used so far by the server process (in total and per thread), this process, and
/// the whole machine.
#[derive(Debug, Clone)]
pub(crate) struct CpuSnapshot {
    at: Instant,
    server: Duration,
    server_threads: BTreeMap<String, (String, Duration)>,
    /// Context switches of each live server thread, by thread id.
    server_switches: BTreeMap<String, u64>,
    client: Duration,
    machine_busy: Duration,
    /// The server's I/O accounting, when `/proc/PID/io` is readable.
    server_io: Option<IoCounters>,
}

/// From `/proc/PID/io`: bytes the process caused to be written to storage (`write_bytes`:
/// every page it dirtied, counted again when rewritten) and its write system calls (`syscw`:
/// files and sockets alike). The process's own, its exited threads included.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct IoCounters {
    pub(crate) storage_bytes: u64,
    pub(crate) write_calls: u64,
}

/// CPU use between two snapshots, in percent of one core.
#[derive(Debug, Clone, Default)]
pub(crate) struct CpuUsage {
    pub(crate) server_percent: f64,
    /// The server's threads grouped by name (as the kernel keeps it: 15 characters), busiest
    /// first.
    pub(crate) server_threads: Vec<(String, f64)>,
    pub(crate) client_percent: f64,
    /// All processes, in percent of one core (200% is a saturated 2-core machine).
    pub(crate) machine_percent: f64,
    /// The server's context switches (voluntary and not), summed over its threads; a thread
    /// that ended between the snapshots is not counted (tokio's blocking threads come and go).
    pub(crate) server_switches: u64,
    /// Server CPU time, in total.
    pub(crate) server_time: Duration,
    /// The time between the snapshots (what the percentages are of).
    pub(crate) wall: Duration,
    /// What the server wrote between the snapshots, when `/proc/PID/io` was readable.
    pub(crate) server_io: Option<IoCounters>,
}

impl CpuUsage {
    /// What neither the server nor the load client used: other processes on the machine.
    pub(crate) fn others_percent(&self) -> f64 {
        (self.machine_percent - self.server_percent - self.client_percent).max(0.0)
    }
}

/// `USER_HZ`: the unit of the CPU times in `/proc`, 100 on every Linux platform we run on.
const TICKS_PER_SECOND: u64 = 100;

impl CpuSnapshot {
    pub(crate) fn take(server_pid: u32) -> anyhow::Result<CpuSnapshot> {
        Ok(CpuSnapshot {
            at: Instant::now(),
            server: process_cpu(&format!("/proc/{server_pid}/stat"))?,
            server_threads: thread_cpu(server_pid),
            server_switches: thread_switches(server_pid),
            client: process_cpu("/proc/self/stat")?,
            machine_busy: machine_busy()?,
            server_io: process_io(server_pid),
        })
    }

    /// Wall-clock time between two snapshots.
    pub(crate) fn elapsed_since(&self, earlier: &CpuSnapshot) -> Duration {
        self.at.duration_since(earlier.at)
    }

    pub(crate) fn usage_since(&self, earlier: &CpuSnapshot) -> CpuUsage {
        let wall = self.at.duration_since(earlier.at).as_secs_f64();
        if wall <= 0.0 {
            return CpuUsage::default();
        }
        let percent = |later: Duration, before: Duration| {
            100.0 * later.saturating_sub(before).as_secs_f64() / wall
        };
        let mut by_name: BTreeMap<&str, f64> = BTreeMap::new();
        for (tid, (name, later)) in &self.server_threads {
            let before = earlier
                .server_threads
                .get(tid)
                .map_or(Duration::ZERO, |(_, before)| *before);
            *by_name.entry(name.as_str()).or_default() += percent(*later, before);
        }
        let mut server_threads: Vec<(String, f64)> = by_name
            .into_iter()
            .map(|(name, used)| (name.to_owned(), used))
            .collect();
        server_threads.sort_by(|a, b| b.1.total_cmp(&a.1));
        let server_switches = self
            .server_switches
            .iter()
            .map(|(tid, later)| {
                later.saturating_sub(*earlier.server_switches.get(tid).unwrap_or(&0))
            })
            .sum();
        CpuUsage {
            server_switches,
            server_time: self.server.saturating_sub(earlier.server),
            wall: self.at.duration_since(earlier.at),
            server_percent: percent(self.server, earlier.server),
            server_threads,
            client_percent: percent(self.client, earlier.client),
            machine_percent: percent(self.machine_busy, earlier.machine_busy),
            server_io: match (self.server_io, earlier.server_io) {
                (Some(later), Some(before)) => Some(IoCounters {
                    storage_bytes: later.storage_bytes.saturating_sub(before.storage_bytes),
                    write_calls: later.write_calls.saturating_sub(before.write_calls),
                }),
                _ => None,
            },
        }
    }
}

/// The I/O accounting of a process; `None` when the kernel does not offer it to this user.
fn process_io(pid: u32) -> Option<IoCounters> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    parse_io(&text)
}

fn parse_io(text: &str) -> Option<IoCounters> {
    let field = |name: &str| {
        text.lines()
            .find_map(|line| line.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|value| value.trim().parse::<u64>().ok())
    };
    Some(IoCounters {
        storage_bytes: field("write_bytes")?,
        write_calls: field("syscw")?,
    })
}

/// Each live thread's name and CPU time, by thread id. Best effort: a thread may exit between
/// listing and reading.
fn thread_cpu(pid: u32) -> BTreeMap<String, (String, Duration)> {
    let mut threads = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return threads;
    };
    for entry in entries.flatten() {
        let tid = entry.file_name().to_string_lossy().into_owned();
        let Ok(name) = std::fs::read_to_string(entry.path().join("comm")) else {
            continue;
        };
        let Ok(cpu) = process_cpu(&entry.path().join("stat").to_string_lossy()) else {
            continue;
        };
        threads.insert(tid, (name.trim().to_owned(), cpu));
    }
    threads
}

/// Each live thread's context switches (voluntary and involuntary), by thread id, from
/// `/proc/PID/task/TID/status`. Best effort, as [`thread_cpu`].
fn thread_switches(pid: u32) -> BTreeMap<String, u64> {
    let mut threads = BTreeMap::new();
    let Ok(entries) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return threads;
    };
    for entry in entries.flatten() {
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let switches = switches_in(&status);
        threads.insert(entry.file_name().to_string_lossy().into_owned(), switches);
    }
    threads
}

/// The calling thread's CPU time (user + system) and context switches (voluntary and not),
/// from `/proc/thread-self`.
pub(crate) fn thread_self_cpu() -> anyhow::Result<(Duration, u64)> {
    let cpu = process_cpu("/proc/thread-self/stat")?;
    let status = std::fs::read_to_string("/proc/thread-self/status")
        .context("cannot read /proc/thread-self/status")?;
    Ok((cpu, switches_in(&status)))
}

/// The context switches (voluntary and not) a `/proc` `status` text counts.
fn switches_in(status: &str) -> u64 {
    status
        .lines()
        .filter(|line| line.contains("ctxt_switches:"))
        .filter_map(|line| line.split_whitespace().nth(1)?.parse::<u64>().ok())
        .sum()
}

/// User + system time of a process (all its threads) from `/proc/PID/stat`.
fn process_cpu(path: &str) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(path).with_context(|| format!("cannot read {path}"))?;
    // The command name (field 2) may contain spaces; the fields after it are plain numbers.
    let after_name = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest)
        .context("unexpected /proc stat format")?;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 (utime, stime) are the 12th and 13th after the name.
    let ticks = |index: usize| -> anyhow::Result<u64> {
        let field = fields.get(index).context("short /proc stat line")?;
        field.parse().context("unexpected /proc stat field")
    };
    Ok(ticks_to_duration(ticks(11)? + ticks(12)?))
}

/// CPU time spent on anything but idle and I/O wait, over all cores, from `/proc/stat`.
fn machine_busy() -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string("/proc/stat").context("cannot read /proc/stat")?;
    let line = stat
        .lines()
        .find_map(|l| l.strip_prefix("cpu "))
        .context("no cpu line in /proc/stat")?;
    let values: Vec<u64> = line
        .split_whitespace()
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    // user nice system idle iowait irq softirq steal ...; guest time is already in user.
    let busy: u64 = values
        .iter()
        .take(8)
        .enumerate()
        .filter(|(index, _)| *index != 3 && *index != 4)
        .map(|(_, value)| value)
        .sum();
    Ok(ticks_to_duration(busy))
}

fn ticks_to_duration(ticks: u64) -> Duration {
    Duration::from_millis(ticks * (1000 / TICKS_PER_SECOND))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_io_accounting_reads_storage_bytes_and_write_calls() {
        let text = "rchar: 4521\nwchar: 1233\nsyscr: 12\nsyscw: 7\nread_bytes: 0\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n";
        let io = parse_io(text).unwrap();
        assert_eq!((io.storage_bytes, io.write_calls), (8192, 7));
        assert!(parse_io("rchar: 1\n").is_none());
    }

    #[test]
    fn writing_a_file_shows_in_this_process_io() {
        let Some(before) = process_io(std::process::id()) else {
            // The kernel does not offer I/O accounting here; the report says so too.
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        for i in 0..5 {
            std::fs::write(dir.path().join(format!("f{i}")), vec![7u8; 64 * 1024]).unwrap();
        }
        let after = process_io(std::process::id()).unwrap();
        assert!(after.write_calls >= before.write_calls + 5);
        assert!(after.storage_bytes >= before.storage_bytes + 5 * 64 * 1024);
    }
}
