//! Harness for end-to-end tests: starts the real `toolgate` binary (built with the `testkit`
//! feature) on a loopback port, on its own SQLite file or in a fresh schema of the test
//! PostgreSQL database, and hands out authenticated clients.
//!
//! PostgreSQL: the URL comes from `TOOLGATE_TEST_PG_URL` (default
//! `postgres://postgres@127.0.0.1:5432/test`, what `cargo xtask ci` finds or starts). Each test
//! takes a [`PgSchema`], a uniquely named schema dropped (`DROP SCHEMA ... CASCADE`) when the
//! value is dropped, and starts one or more gateways in it; replicas share the schema, the
//! master keys and the first gateway's admin token. An unreachable server fails the test with a
//! message naming the URL; nothing is skipped.
//!
//! Executions are counted outside the gateways with an [`ExecutionLog`]: the testkit
//! connector appends one line per invocation to the file named by `TESTKIT_EXECUTION_LOG`.
//!
//! The set-up tests repeat (a tenant, its agent, grants, the kill switch, tokens, a policy,
//! credentials, the connector fakes' configuration) is in [`setup`]; the gateways of a test
//! that runs on both backends (one on SQLite, two replicas on PostgreSQL) in [`cluster`];
//! reading a gateway's `/metrics` through the Prometheus parser in [`metrics`].

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sqlx::Connection as _;

use tonic::metadata::MetadataValue;
use tonic::transport::Channel;
use toolgate_proto::v1 as pb;
use toolgate_proto::v1::admin_service_client::AdminServiceClient;
use toolgate_proto::v1::agent_service_client::AgentServiceClient;

pub mod browser;
pub mod cluster;
pub mod metrics;
pub mod pki;
pub mod setup;
pub use cluster::{Backend, Cluster};
pub use setup::{
    BIG_TRANSFER, BIG_TRANSFERS_NEED_APPROVAL, SHOPIFY_CONFIG, Tenant, TenantSetup, slack_config,
};

/// The gateway binary under test: `TOOLGATE_BIN`, or `toolgate` next to the test executable's
/// target directory. It must be a `testkit` build.
pub fn gateway_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("TOOLGATE_BIN") {
        return PathBuf::from(path);
    }
    let exe = std::env::current_exe().expect("current test executable");
    // target/debug/deps/<test> -> target/debug/toolgate
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target profile directory");
    let binary = profile_dir.join("toolgate");
    assert!(
        binary.exists(),
        "the gateway binary {} does not exist; build it with `cargo build -p toolgate --features testkit` (the test command `cargo xtask ci` does this first)",
        binary.display()
    );
    binary
}

/// Where [`GatewayOptions::stderr_to_file`] puts the gateway's standard error.
const STDERR_FILE: &str = "gateway.stderr";

/// A running gateway; killed when dropped.
#[derive(Debug)]
pub struct Gateway {
    child: Child,
    /// The gateway's working directory (database, token file).
    pub dir: PathBuf,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// The bootstrap admin token.
    pub admin_token: String,
    /// `http://127.0.0.1:PORT/metrics`, when the gateway serves metrics
    /// (`TOOLGATE_METRICS_LISTEN`).
    pub metrics_url: Option<String>,
    _temp: Option<tempfile::TempDir>,
}

impl Gateway {
    /// Starts a gateway in a fresh temporary directory, on its own SQLite file.
    pub fn start() -> Gateway {
        GatewayOptions::new().start()
    }

    /// Starts a gateway in `dir` (reusing its database) with extra environment variables.
    pub fn start_in(dir: &Path, env: &[(&str, &str)]) -> Gateway {
        GatewayOptions::new().dir(dir).envs(env).start()
    }

    /// Options for a gateway started some other way (PostgreSQL, a replica, a restart).
    pub fn options() -> GatewayOptions {
        GatewayOptions::new()
    }

    /// Starts the first gateway of `schema` (which it creates and migrates) in a fresh
    /// temporary directory; its admin token is the one it bootstraps.
    pub fn start_pg(schema: &PgSchema) -> Gateway {
        schema.options().start()
    }

    /// Starts another gateway sharing this one's PostgreSQL schema, master keys and admin token,
    /// in a fresh temporary directory. `options` should come from the same [`PgSchema`].
    pub fn replica(&self, options: GatewayOptions) -> Gateway {
        options.admin_token(&self.admin_token).start()
    }

    /// What the gateway wrote on standard error so far, when started with
    /// [`GatewayOptions::stderr_to_file`].
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join(STDERR_FILE)).unwrap_or_default()
    }

    /// The gateway's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process outright (SIGKILL, as `kill -9`: no shutdown code runs) and waits for
    /// it. Returns the temporary working directory, if the gateway owned one, so a restart can
    /// reuse it.
    pub fn stop(mut self) -> Option<tempfile::TempDir> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self._temp.take()
    }

    /// A channel to the gateway.
    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url.clone())
            .expect("valid url")
            .connect()
            .await
            .expect("connect to gateway")
    }

    /// An admin client.
    pub async fn admin(&self) -> AdminServiceClient<Channel> {
        AdminServiceClient::new(self.channel().await)
    }

    /// An agent client.
    pub async fn agent(&self) -> AgentServiceClient<Channel> {
        AgentServiceClient::new(self.channel().await)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Gateway {
    /// Creates an approver token for `tenant`.
    pub async fn approver_token(&self, tenant: &str) -> String {
        self.admin()
            .await
            .create_token(authed(
                pb::CreateTokenRequest {
                    role: "approver".into(),
                    tenant_id: tenant.into(),
                    agent_id: String::new(),
                    label: "alice".into(),
                },
                &self.admin_token,
            ))
            .await
            .expect("create approver token")
            .into_inner()
            .token
    }

    /// Puts `text` as the tenant's Cedar policy.
    pub async fn put_policy(&self, tenant: &str, text: &str) {
        self.admin()
            .await
            .put_policy(authed(
                pb::PutPolicyRequest {
                    tenant_id: tenant.into(),
                    text: text.into(),
                },
                &self.admin_token,
            ))
            .await
            .expect("policy accepted");
    }

    /// Opens a run for `agent` with a call budget (0: the gateway's default).
    pub async fn open_run(&self, token: &str, agent: &str, max_calls: u32) -> String {
        self.agent()
            .await
            .create_run(authed(
                pb::CreateRunRequest {
                    agent_id: agent.into(),
                    run_id: String::new(),
                    max_calls,
                },
                token,
            ))
            .await
            .expect("create run")
            .into_inner()
            .run_id
    }

    /// Every call of `run`, all pages.
    pub async fn tool_calls(&self, token: &str, run: &str) -> Vec<pb::ToolCall> {
        let mut agent = self.agent().await;
        let mut calls = Vec::new();
        let mut page_token = String::new();
        loop {
            let page = agent
                .list_tool_calls(authed(
                    pb::ListToolCallsRequest {
                        run_id: run.into(),
                        page_token,
                        page_size: 1000,
                    },
                    token,
                ))
                .await
                .expect("list tool calls")
                .into_inner();
            calls.extend(page.tool_calls);
            if page.next_page_token.is_empty() {
                return calls;
            }
            page_token = page.next_page_token;
        }
    }

    /// The admin `VerifyLedger` answer.
    pub async fn verify_ledger(&self) -> pb::VerifyLedgerResponse {
        self.admin()
            .await
            .verify_ledger(authed(pb::VerifyLedgerRequest {}, &self.admin_token))
            .await
            .expect("verify ledger")
            .into_inner()
    }
}

/// How to start a gateway: working directory, database, environment, and (for a replica or a
/// restart that will not bootstrap one) the admin token to use.
///
/// The child gets none of the test process's `TOOLGATE_*` variables (the gateway refuses
/// unknown ones, and `TOOLGATE_BIN` / `TOOLGATE_TEST_PG_URL` are the harness's) and no
/// inherited `TESTKIT_EXECUTION_LOG`: only what the options say.
#[derive(Debug, Clone, Default)]
pub struct GatewayOptions {
    dir: Option<PathBuf>,
    database: Option<String>,
    schema: Option<String>,
    env: Vec<(String, String)>,
    admin_token: Option<String>,
    config: Option<String>,
    stderr_file: bool,
}

impl GatewayOptions {
    /// A gateway in a fresh temporary directory, on `toolgate.db` there.
    pub fn new() -> GatewayOptions {
        GatewayOptions::default()
    }

    /// Runs in `dir` (database file, token and key files) instead of a fresh temporary one.
    pub fn dir(mut self, dir: &Path) -> GatewayOptions {
        self.dir = Some(dir.to_path_buf());
        self
    }

    /// `storage.database`: a SQLite path or a `postgres://` URL.
    pub fn database(mut self, database: &str) -> GatewayOptions {
        self.database = Some(database.to_owned());
        self
    }

    /// `storage.schema`: the PostgreSQL schema.
    pub fn schema(mut self, schema: &str) -> GatewayOptions {
        self.schema = Some(schema.to_owned());
        self
    }

    /// One more environment variable.
    pub fn env(mut self, key: &str, value: &str) -> GatewayOptions {
        self.env.push((key.to_owned(), value.to_owned()));
        self
    }

    /// More environment variables.
    pub fn envs(mut self, env: &[(&str, &str)]) -> GatewayOptions {
        for (key, value) in env {
            self = self.env(key, value);
        }
        self
    }

    /// Uses this admin token instead of reading the bootstrap file (a gateway only writes the
    /// file when the database has no admin token yet).
    pub fn admin_token(mut self, token: &str) -> GatewayOptions {
        self.admin_token = Some(token.to_owned());
        self
    }

    /// Writes `toml` as the gateway's `toolgate.toml` (in its working directory) before it
    /// starts.
    pub fn config(mut self, toml: &str) -> GatewayOptions {
        self.config = Some(toml.to_owned());
        self
    }

    /// Writes the gateway's standard error to `gateway.stderr` in its directory (read it with
    /// [`Gateway::stderr`]) instead of the test's.
    pub fn stderr_to_file(mut self) -> GatewayOptions {
        self.stderr_file = true;
        self
    }

    /// The testkit connector appends its executions to `log`.
    pub fn execution_log(self, log: &ExecutionLog) -> GatewayOptions {
        let path = log.path().to_str().expect("UTF-8 temp path").to_owned();
        self.env(EXECUTION_LOG_ENV, &path)
    }

    /// Starts the gateway and waits until it listens.
    pub fn start(self) -> Gateway {
        let (dir, temp) = match &self.dir {
            Some(dir) => (dir.clone(), None),
            None => {
                let temp = tempfile::tempdir().expect("temp dir");
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        if let Some(toml) = &self.config {
            std::fs::write(dir.join("toolgate.toml"), toml).expect("write toolgate.toml");
        }
        let binary = gateway_binary();
        let mut command = serve_command(&dir);
        let stderr = if self.stderr_file {
            Stdio::from(
                std::fs::File::create(dir.join(STDERR_FILE)).expect("create gateway.stderr"),
            )
        } else {
            Stdio::inherit()
        };
        command.stdout(Stdio::piped()).stderr(stderr);
        if let Some(database) = &self.database {
            command.env("TOOLGATE_DATABASE", database);
        }
        if let Some(schema) = &self.schema {
            command.env("TOOLGATE_DATABASE_SCHEMA", schema);
        }
        for (key, value) in &self.env {
            command.env(key, value);
        }
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        let metrics_url = Arc::new(Mutex::new(None));
        let announced_metrics = Arc::clone(&metrics_url);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                // Announced before the gRPC address, so it is known once that arrives.
                if let Some(url) = line.strip_prefix("toolgate metrics on ") {
                    *announced_metrics.lock().unwrap() = Some(url.to_owned());
                }
                if let Some(address) = line.strip_prefix("toolgate listening on ") {
                    let _ = tx.send(address.to_owned());
                }
            }
        });
        let address = match rx.recv_timeout(Duration::from_secs(60)) {
            Ok(address) => address,
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "the gateway did not announce its address within 60 s (database {:?}, schema {:?}); its stderr is above",
                    self.database.as_deref().map(redact_url),
                    self.schema
                );
            }
        };
        let admin_token = match self.admin_token {
            Some(token) => token,
            None => std::fs::read_to_string(dir.join("toolgate-admin.token"))
                .expect(
                    "admin token file written on first start (a gateway joining a database that already has an admin token writes none: pass the first one's with GatewayOptions::admin_token)",
                )
                .trim()
                .to_owned(),
        };
        Gateway {
            child,
            dir,
            url: format!("http://{address}"),
            admin_token,
            metrics_url: metrics_url.lock().unwrap().clone(),
            _temp: temp,
        }
    }
}

/// `toolgate serve` on a free loopback port in `dir`, logging warnings only, with none of the
/// test process's `TOOLGATE_*` variables (the gateway refuses unknown ones, and
/// `TOOLGATE_BIN` / `TOOLGATE_TEST_PG_URL` are the harness's) and no inherited
/// `TESTKIT_EXECUTION_LOG`.
fn serve_command(dir: &Path) -> Command {
    let mut command = Command::new(gateway_binary());
    command
        .args(["serve", "--listen", "127.0.0.1:0"])
        .current_dir(dir)
        .stdin(Stdio::null());
    for (key, _) in std::env::vars_os() {
        let strip = key
            .to_str()
            .is_some_and(|k| k.starts_with("TOOLGATE_") || k == EXECUTION_LOG_ENV);
        if strip {
            command.env_remove(&key);
        }
    }
    command.env("TOOLGATE_LOG", "warn");
    command
}

/// Runs `toolgate serve` in `dir` until it exits by itself, for a start-up the test expects
/// to be refused: its output (the refusal is on stderr). Hangs if the gateway serves instead.
pub fn serve_until_exit(dir: &Path) -> std::process::Output {
    serve_command(dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", gateway_binary().display()))
}

/// The variable the testkit connector reads (`toolgate_engine::testkit::EXECUTION_LOG_ENV`).
pub const EXECUTION_LOG_ENV: &str = "TESTKIT_EXECUTION_LOG";

/// A file the testkit connectors of one or more gateways append `<tool> <tool_call_id>` to,
/// once per invocation: executions counted outside the gateway processes, surviving their
/// deaths.
#[derive(Debug)]
pub struct ExecutionLog {
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl ExecutionLog {
    /// A fresh, empty log in its own temporary directory.
    pub fn new() -> ExecutionLog {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("executions.log");
        ExecutionLog { path, _dir: dir }
    }

    /// The file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Every execution so far, `(tool, tool_call_id)`, in append order.
    pub fn entries(&self) -> Vec<(String, String)> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(e) => panic!("cannot read {}: {e}", self.path.display()),
        };
        // Only whole lines: a writer may be mid-append (appends are single writes, but a
        // reader can still see the file between two of them, never inside one).
        let whole = text.rfind('\n').map_or("", |end| &text[..=end]);
        whole
            .lines()
            .map(|line| {
                let (tool, id) = line
                    .split_once(' ')
                    .unwrap_or_else(|| panic!("malformed execution log line `{line}`"));
                (tool.to_owned(), id.to_owned())
            })
            .collect()
    }

    /// How many times each tool call was executed.
    pub fn counts(&self) -> BTreeMap<String, usize> {
        let mut counts = BTreeMap::new();
        for (_, id) in self.entries() {
            *counts.entry(id).or_insert(0) += 1;
        }
        counts
    }

    /// Waits until at least `n` executions are logged; panics (listing what it saw) if that
    /// takes longer than `limit`. A liveness bound, not a speed assertion.
    pub async fn wait_for(&self, n: usize, limit: Duration) -> Vec<(String, String)> {
        let started = Instant::now();
        loop {
            let entries = self.entries();
            if entries.len() >= n {
                return entries;
            }
            assert!(
                started.elapsed() < limit,
                "waited {limit:?} for {n} executions; the log has {}: {entries:?}",
                entries.len()
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Default for ExecutionLog {
    fn default() -> ExecutionLog {
        ExecutionLog::new()
    }
}

/// The PostgreSQL server the tests use: `TOOLGATE_TEST_PG_URL`, or the default.
pub fn pg_url() -> String {
    toolgate_ledger::testkit::pg_url()
}

/// The URL used when `TOOLGATE_TEST_PG_URL` is unset.
pub const DEFAULT_PG_URL: &str = toolgate_ledger::testkit::PG_DEFAULT_URL;

/// The master key every gateway of one [`PgSchema`] gets: replicas must share their master
/// keys, or credentials sealed by one are unreadable by the other. Test-only.
pub const TEST_MASTER_KEY: &str = "k1=BwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyAhIiMkJSY=";

/// A schema name no other test (in this or a concurrent process) uses:
/// `tg_e2e_<pid>_<counter>_<nanos>`.
pub fn unique_schema_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    format!("tg_e2e_{}_{n}_{nanos}", std::process::id())
}

/// A fresh schema in the test PostgreSQL database, for the gateways of one test. The gateways
/// create and migrate it; dropping this value drops it (`DROP SCHEMA ... CASCADE`), so declare
/// it before the gateways (locals drop in reverse order: the gateways stop first).
#[derive(Debug)]
pub struct PgSchema {
    /// The ledger's test schema: a unique name, dropped with this value (kept, and named,
    /// when the test failed).
    schema: toolgate_ledger::testkit::PgSchema,
    /// Holds the key file the gateways share.
    keys: tempfile::TempDir,
}

impl PgSchema {
    /// Checks that the server answers (panicking with instructions when it does not) and picks
    /// a unique schema name.
    pub async fn new() -> PgSchema {
        let schema = toolgate_ledger::testkit::PgSchema::new().await;
        let keys = tempfile::tempdir().expect("temp dir");
        std::fs::write(
            keys.path().join("toolgate-keys"),
            format!("{TEST_MASTER_KEY}\n"),
        )
        .expect("write the shared key file");
        {
            // The gateway refuses a key file others can read.
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(
                keys.path().join("toolgate-keys"),
                std::fs::Permissions::from_mode(0o600),
            )
            .expect("make the shared key file private");
        }
        PgSchema { schema, keys }
    }

    /// The schema's name.
    pub fn name(&self) -> &str {
        self.schema.name()
    }

    /// The master key file the gateways share.
    pub fn key_file(&self) -> PathBuf {
        self.keys.path().join("toolgate-keys")
    }

    /// The database URL.
    pub fn url(&self) -> &str {
        self.schema.url()
    }

    /// Options for a gateway in this schema: the database URL, the schema, the shared master
    /// keys. Add `.admin_token(..)` (or use [`Gateway::replica`]) for every gateway but the
    /// first, and `.dir(..)` to restart one in its old directory.
    ///
    /// The keys are shared through one key file (`TOOLGATE_KEY_FILE`), as a deployment would
    /// share them through `TOOLGATE_MASTER_KEYS`.
    pub fn options(&self) -> GatewayOptions {
        let key_file = self.keys.path().join("toolgate-keys");
        GatewayOptions::new()
            .database(self.url())
            .schema(self.name())
            .env(
                "TOOLGATE_KEY_FILE",
                key_file.to_str().expect("UTF-8 temp path"),
            )
    }

    /// The tables in the schema: a gateway really on this schema has migrated it.
    pub async fn tables(&self) -> Vec<String> {
        self.schema.tables().await
    }
}

/// `url` without a password, for messages.
fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.split_once(':') {
                Some((user, _)) => format!("{}{user}:***{}", &url[..scheme + 3], &url[at..]),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Wraps a message with `authorization: Bearer <token>`.
pub fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    let value: MetadataValue<_> = format!("Bearer {token}").parse().expect("ascii token");
    request.metadata_mut().insert("authorization", value);
    request
}

/// An `ExecuteToolRequest` with the usual defaults.
pub fn execute(run_id: &str, tool: &str, arguments: &str) -> pb::ExecuteToolRequest {
    pb::ExecuteToolRequest {
        run_id: run_id.into(),
        tool_use_id: String::new(),
        tool_name: tool.into(),
        arguments_json: arguments.into(),
        correlation_id: String::new(),
        timeout_ms: 0,
    }
}

/// A superuser role of its own in the test PostgreSQL server, for a gateway that the test
/// cuts off from the database for a while: [`PgRole::allow_login`]`(false)` stops new
/// connections of the role while its open ones keep working (`ALTER ROLE ... NOLOGIN`). The
/// role is dropped when this value is dropped (declare it before the [`PgSchema`] and the
/// gateways, so they go first). Needs a superuser in `TOOLGATE_TEST_PG_URL`.
#[derive(Debug)]
pub struct PgRole {
    name: String,
    password: String,
}

impl PgRole {
    /// Creates a uniquely named role that may log in, with a random password.
    pub async fn new() -> PgRole {
        let name = unique_schema_name().replacen("tg_e2e_", "tg_e2e_role_", 1);
        let password = format!("pw{}", unique_schema_name());
        PgRole::admin(&format!(
            "CREATE ROLE {name} LOGIN SUPERUSER PASSWORD '{password}'"
        ))
        .await;
        PgRole { name, password }
    }

    /// The role's name (`pg_stat_activity.usename` of its sessions).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The test server's URL, logging in as this role.
    pub fn url(&self) -> String {
        let url = pg_url();
        let (scheme, rest) = url.split_once("://").expect("a postgres:// URL");
        let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
        format!("{scheme}://{}:{}@{host}", self.name, self.password)
    }

    /// Lets the role open new connections, or not (open ones are not affected).
    pub async fn allow_login(&self, allowed: bool) {
        let login = if allowed { "LOGIN" } else { "NOLOGIN" };
        PgRole::admin(&format!("ALTER ROLE {} {login}", self.name)).await;
    }

    async fn admin(sql: &str) {
        // Names and passwords are ours (`unique_schema_name`): plain identifiers.
        let mut connection = sqlx::PgConnection::connect(&pg_url())
            .await
            .expect("connect to the test PostgreSQL");
        sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_owned()))
            .execute(&mut connection)
            .await
            .unwrap_or_else(|e| panic!("`{sql}` failed (the test user must be a superuser): {e}"));
        let _ = connection.close().await;
    }
}

impl Drop for PgRole {
    fn drop(&mut self) {
        let name = self.name.clone();
        let dropped = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime for the role cleanup");
            runtime.block_on(async {
                PgRole::admin(&format!(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = '{name}'"
                ))
                .await;
                PgRole::admin(&format!("DROP ROLE IF EXISTS {name}")).await;
            });
        })
        .join();
        if dropped.is_err() {
            eprintln!("warning: cannot drop test role {}", self.name);
        }
    }
}

impl Gateway {
    /// Sends `signal` (`TERM`, `INT`, ...) to the gateway process, as `kill -s` does.
    pub fn signal(&self, signal: &str) {
        let status = Command::new("kill")
            .args(["-s", signal, &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -s {signal} failed");
    }

    /// Waits up to `limit` for the process to exit by itself: its exit status, or `None` when
    /// it is still running then.
    pub async fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().expect("wait for the gateway") {
                return Some(status);
            }
            if started.elapsed() >= limit {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}
