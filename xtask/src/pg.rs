//! PostgreSQL for the test suite. The PostgreSQL end-to-end tests (`tests/tests/replicas.rs`)
//! need a server they may create and drop schemas in; CI finds or starts one, and fails (it
//! never skips those tests) when it can do neither:
//!
//! 1. `TOOLGATE_TEST_PG_URL`, when set, is used as given (its address must accept TCP).
//! 2. Otherwise a server on 127.0.0.1:5432 (the default URL,
//!    `postgres://postgres@127.0.0.1:5432/test`; the tests make the real connection).
//! 3. Otherwise CI starts its own from the PostgreSQL server binaries (`initdb`, `pg_ctl`,
//!    `createdb` on `PATH` or under `/usr/lib/postgresql/*/bin`): a fresh cluster in
//!    `target/pg` with trust authentication for `postgres`, listening on loopback only
//!    (port 5432 when free), a database `test`; it is stopped when CI is done with it. As root
//!    the server runs as the `postgres` user (initdb refuses root).

use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use anyhow::{Context as _, bail};

/// The variable the tests read the server's URL from.
pub(crate) const URL_ENV: &str = "TOOLGATE_TEST_PG_URL";
/// What the tests use when the variable is unset.
pub(crate) const DEFAULT_URL: &str = "postgres://postgres@127.0.0.1:5432/test";

/// The server the tests will use; a server CI started is stopped on drop.
#[derive(Debug)]
pub(crate) struct Postgres {
    /// The URL the tests connect to.
    pub(crate) url: String,
    /// Where it came from, for the banner and the summary.
    pub(crate) origin: String,
    /// Held for its `Drop`, which stops a server CI started.
    _local: Option<LocalServer>,
}

impl Postgres {
    /// The URL without its password, for printing.
    pub(crate) fn redacted_url(&self) -> String {
        redact(&self.url)
    }

    /// The value to give the test run as `TOOLGATE_TEST_PG_URL`, when the default will not do.
    ///
    /// The variable is left out when the URL is the default: tests that start `toolgate serve`
    /// with the inherited environment would otherwise depend on the gateway accepting it
    /// among its `TOOLGATE_*` variables.
    pub(crate) fn url_for_tests(&self) -> Option<&str> {
        (self.url != DEFAULT_URL).then_some(self.url.as_str())
    }
}

/// The test suite's server (`TOOLGATE_TEST_PG_URL`, else the default URL) when it accepts
/// connections, without starting one: what the benchmark measures against.
pub(crate) fn running_server_url() -> Option<String> {
    let url = std::env::var(URL_ENV).unwrap_or_else(|_| DEFAULT_URL.to_owned());
    reachable(&tcp_address(&url)?).then_some(url)
}

/// Finds or starts PostgreSQL, printing a banner saying which, or fails saying how to provide
/// one.
pub(crate) fn provide(root: &Path) -> anyhow::Result<Postgres> {
    match find_or_start(root) {
        Ok(postgres) => {
            banner(&[
                &format!("PostgreSQL for the tests: {}", redact(&postgres.url)),
                &postgres.origin,
            ]);
            Ok(postgres)
        }
        Err(err) => {
            banner(&[
                "NO PostgreSQL: the PostgreSQL end-to-end tests cannot run, so CI fails.",
                &format!("{err:#}"),
                &format!(
                    "Provide one: set {URL_ENV}=postgres://USER@127.0.0.1:PORT/DATABASE (trust"
                ),
                "  auth, a database the tests may create and drop schemas in), or run a server on",
                "  127.0.0.1:5432 with a database `test`, or install the PostgreSQL server",
                "  binaries (e.g. `apt-get install postgresql`) so CI can start its own.",
            ]);
            Err(err.context("no PostgreSQL for the tests (see the banner above)"))
        }
    }
}

fn find_or_start(root: &Path) -> anyhow::Result<Postgres> {
    if let Some(url) = std::env::var(URL_ENV).ok().filter(|u| !u.trim().is_empty()) {
        if let Some(address) = tcp_address(&url)
            && !reachable(&address)
        {
            bail!(
                "{URL_ENV} is set to {}, but nothing accepts connections at {address}",
                redact(&url)
            );
        }
        return Ok(Postgres {
            url,
            origin: format!("from {URL_ENV}"),
            _local: None,
        });
    }
    if reachable("127.0.0.1:5432") {
        return Ok(Postgres {
            url: DEFAULT_URL.to_owned(),
            origin: format!(
                "the server already listening on 127.0.0.1:5432 ({URL_ENV} unset; the tests connect as `postgres` to database `test`)"
            ),
            _local: None,
        });
    }
    println!("nothing listens on 127.0.0.1:5432 and {URL_ENV} is unset: starting a PostgreSQL");
    let local = LocalServer::start(root)?;
    Ok(Postgres {
        url: local.url(),
        origin: format!(
            "started by CI from {} in {} (stopped when the tests are done)",
            local.bin.display(),
            local.data.display()
        ),
        _local: Some(local),
    })
}

/// A cluster CI initialised and started; stopped on drop.
#[derive(Debug)]
struct LocalServer {
    bin: PathBuf,
    /// The directory holding the data directory, the log and the socket.
    base: PathBuf,
    data: PathBuf,
    port: u16,
    /// The unprivileged user the server runs as when CI runs as root.
    user: Option<String>,
    /// A base directory outside `target/` to remove afterwards.
    temporary: bool,
}

impl LocalServer {
    fn start(root: &Path) -> anyhow::Result<LocalServer> {
        let bin = find_server_binaries()?;
        let user = if is_root() {
            Some(unprivileged_user()?)
        } else {
            None
        };
        let (base, temporary) = base_directory(root, &bin, user.as_deref())?;
        let data = base.join("data");
        let port = free_port()?;
        let mut server = LocalServer {
            bin,
            base,
            data,
            port,
            user,
            temporary,
        };
        server.init_and_start().inspect_err(|_| {
            let log = std::fs::read_to_string(server.base.join("server.log")).unwrap_or_default();
            if !log.is_empty() {
                println!("--- PostgreSQL server log ---\n{log}---");
            }
        })?;
        Ok(server)
    }

    fn init_and_start(&mut self) -> anyhow::Result<()> {
        let data = self.data.to_string_lossy().into_owned();
        run(self.command(
            "initdb",
            &[
                "-D",
                &data,
                "-A",
                "trust",
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
        ))
        .context("initdb")?;
        let options = format!(
            "-c listen_addresses=127.0.0.1 -p {} -k '{}' -c fsync=off -c max_connections=300",
            self.port,
            self.base.display()
        );
        let log = self.base.join("server.log").to_string_lossy().into_owned();
        run(self.command(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-o", &options, "-w", "-t", "60", "start",
            ],
        ))
        .context("pg_ctl start")?;
        let port = self.port.to_string();
        run(self.command(
            "createdb",
            &["-h", "127.0.0.1", "-p", &port, "-U", "postgres", "test"],
        ))
        .context("createdb test")?;
        Ok(())
    }

    fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/test", self.port)
    }

    fn command(&self, tool: &str, args: &[&str]) -> Command {
        let mut command = server_command(&self.bin, self.user.as_deref(), tool);
        command.args(args).current_dir(&self.base);
        command
    }
}

/// `tool` from the server's bin directory (falling back to `PATH`), as the unprivileged user
/// when CI runs as root.
fn server_command(bin: &Path, user: Option<&str>, tool: &str) -> Command {
    let local = bin.join(tool);
    let program = if local.exists() {
        local
    } else {
        PathBuf::from(tool)
    };
    match user {
        Some(user) => {
            let mut command = Command::new("runuser");
            command.args(["-u", user, "--"]).arg(program);
            command
        }
        None => Command::new(program),
    }
}

impl Drop for LocalServer {
    fn drop(&mut self) {
        let data = self.data.to_string_lossy().into_owned();
        match run(self.command("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"])) {
            Ok(_) => println!("stopped the PostgreSQL CI started (port {})", self.port),
            Err(err) => println!(
                "warning: cannot stop the PostgreSQL in {}: {err:#}",
                self.data.display()
            ),
        }
        if self.temporary {
            let _ = std::fs::remove_dir_all(&self.base);
        }
    }
}

/// The directory with `initdb` and `pg_ctl`: on `PATH` (symlinks resolved, so `createdb`
/// from the same installation is found), else the newest `/usr/lib/postgresql/*/bin`.
fn find_server_binaries() -> anyhow::Result<PathBuf> {
    let has_both = |dir: &Path| dir.join("initdb").is_file() && dir.join("pg_ctl").is_file();
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if has_both(&dir) {
                let real = std::fs::canonicalize(dir.join("pg_ctl"))
                    .ok()
                    .and_then(|p| p.parent().map(Path::to_path_buf))
                    .filter(|d| has_both(d))
                    .unwrap_or(dir);
                return Ok(real);
            }
        }
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse::<u32>().ok()?;
            Some((version, entry.path().join("bin")))
        })
        .filter(|(_, bin)| has_both(bin))
        .collect();
    versions.sort();
    match versions.pop() {
        Some((_, bin)) => Ok(bin),
        None => bail!(
            "no PostgreSQL server binaries: neither `initdb` and `pg_ctl` on PATH nor /usr/lib/postgresql/*/bin"
        ),
    }
}

fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// As root, the server runs as `postgres` (or `nobody`): initdb refuses to run as root.
fn unprivileged_user() -> anyhow::Result<String> {
    for user in ["postgres", "nobody"] {
        let exists = Command::new("id")
            .arg("-u")
            .arg(user)
            .output()
            .is_ok_and(|o| o.status.success());
        if exists {
            let runuser = Command::new("runuser")
                .arg("--help")
                .output()
                .is_ok_and(|o| o.status.success());
            if !runuser {
                bail!("running as root needs `runuser` to start PostgreSQL as `{user}`");
            }
            return Ok(user.to_owned());
        }
    }
    bail!("running as root and there is no `postgres` (or `nobody`) user to run PostgreSQL as")
}

/// `target/pg`, emptied (stopping a server a previous, interrupted run left there); as root,
/// owned by the server's user, or a directory under the system temp dir when that user cannot
/// reach `target/`. Also falls back when the socket path would be too long.
fn base_directory(root: &Path, bin: &Path, user: Option<&str>) -> anyhow::Result<(PathBuf, bool)> {
    let base = root.join("target/pg");
    let data = base.join("data");
    if data.join("postmaster.pid").exists() {
        let _ = server_command(bin, user, "pg_ctl")
            .arg("-D")
            .arg(&data)
            .args(["-m", "immediate", "-w", "stop"])
            .output();
    }
    if base.exists() {
        std::fs::remove_dir_all(&base)
            .with_context(|| format!("cannot empty {}", base.display()))?;
    }
    std::fs::create_dir_all(&base).with_context(|| format!("cannot create {}", base.display()))?;
    // `<base>/.s.PGSQL.<port>` must fit a Unix socket path (107 bytes).
    let short_enough = base.as_os_str().len() < 80;
    let reachable = match user {
        Some(user) => {
            chown(user, &base)?;
            Command::new("runuser")
                .args(["-u", user, "--", "test", "-w"])
                .arg(&base)
                .status()
                .is_ok_and(|s| s.success())
        }
        None => true,
    };
    if reachable && short_enough {
        return Ok((base, false));
    }
    let temporary = std::env::temp_dir().join(format!("toolgate-pg-{}", std::process::id()));
    if temporary.exists() {
        std::fs::remove_dir_all(&temporary)?;
    }
    std::fs::create_dir_all(&temporary)
        .with_context(|| format!("cannot create {}", temporary.display()))?;
    if let Some(user) = user {
        chown(user, &temporary)?;
    }
    println!(
        "{} is not usable for the PostgreSQL data directory (unreachable for the server's user or too long a socket path); using {}",
        base.display(),
        temporary.display()
    );
    Ok((temporary, true))
}

fn chown(user: &str, dir: &Path) -> anyhow::Result<()> {
    run({
        let mut command = Command::new("chown");
        command.arg(format!("{user}:")).arg(dir);
        command
    })
    .map(|_| ())
}

/// A loopback port nothing listens on: 5432 when free, so the tests' default URL works.
fn free_port() -> anyhow::Result<u16> {
    if TcpListener::bind("127.0.0.1:5432").is_ok() {
        return Ok(5432);
    }
    let listener = TcpListener::bind("127.0.0.1:0").context("cannot find a free port")?;
    Ok(listener.local_addr()?.port())
}

/// `host:port` of a `postgres://user@host:port/db` URL (port 5432 when absent); `None` for a
/// Unix-socket URL or one it cannot read.
fn tcp_address(url: &str) -> Option<String> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if host_port.is_empty() {
        return None;
    }
    let has_port = match host_port.rfind(']') {
        Some(bracket) => host_port[bracket..].contains(':'),
        None => host_port.contains(':'),
    };
    Some(if has_port {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    })
}

fn reachable(address: &str) -> bool {
    let Ok(addresses) = address.to_socket_addrs() else {
        return false;
    };
    addresses
        .collect::<Vec<SocketAddr>>()
        .iter()
        .any(|a| TcpStream::connect_timeout(a, Duration::from_secs(2)).is_ok())
}

/// Runs `command`, failing with its output when it fails.
fn run(mut command: Command) -> anyhow::Result<Output> {
    let output = command
        .output()
        .with_context(|| format!("cannot run {command:?}"))?;
    if !output.status.success() {
        bail!(
            "{command:?} failed ({}):\n{}{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(output)
}

/// `url` without its password.
fn redact(text: &str) -> String {
    let Ok(mut url) = url::Url::parse(text) else {
        return "(unparsable URL)".to_owned();
    };
    if url.password().is_some() {
        // Fails only for URLs that cannot have a password, which this one has.
        let _ = url.set_password(Some("***"));
    }
    // libpq also takes the password as a query parameter.
    if url.query_pairs().any(|(key, _)| key.contains("password")) {
        let pairs: Vec<(String, String)> = url
            .query_pairs()
            .map(|(key, value)| {
                let value = if key.contains("password") {
                    "***".to_owned()
                } else {
                    value.into_owned()
                };
                (key.into_owned(), value)
            })
            .collect();
        url.query_pairs_mut().clear().extend_pairs(pairs);
    }
    url.to_string()
}

fn banner(lines: &[&str]) {
    let rule = "#".repeat(100);
    println!("\n{rule}");
    for line in lines {
        for part in line.lines() {
            println!("## {part}");
        }
    }
    println!("{rule}\n");
}

#[cfg(test)]
mod tests {
    use super::{LocalServer, reachable, redact, tcp_address};

    /// Needs the PostgreSQL server binaries, as the test command's fallback does (it fails
    /// naming where it looked for them); initialises a cluster in a temporary directory.
    #[test]
    fn starts_and_stops_a_local_server() {
        let root = tempfile::tempdir().unwrap();
        let server = LocalServer::start(root.path()).unwrap();
        let address = format!("127.0.0.1:{}", server.port);
        assert!(reachable(&address), "{server:?}");
        assert!(server.url().ends_with("/test"));
        drop(server);
        assert!(!reachable(&address), "stopped");
    }

    #[test]
    fn addresses_are_read_from_urls() {
        let cases = [
            (
                "postgres://postgres@127.0.0.1:5432/test",
                Some("127.0.0.1:5432"),
            ),
            ("postgres://u:p@localhost/test", Some("localhost:5432")),
            ("postgresql://127.0.0.1:6000", Some("127.0.0.1:6000")),
            ("postgres://u@[::1]:7000/db?x=1", Some("[::1]:7000")),
            ("postgres://u@[::1]/db", Some("[::1]:5432")),
            ("postgres:///test?host=/run/postgresql", None),
            ("not a url", None),
        ];
        for (url, expected) in cases {
            assert_eq!(tcp_address(url).as_deref(), expected, "{url}");
        }
    }

    #[test]
    fn passwords_are_not_printed() {
        assert_eq!(
            redact("postgres://admin:hunter2@db:5432/test"),
            "postgres://admin:***@db:5432/test"
        );
        assert_eq!(
            redact("postgres://postgres@127.0.0.1:5432/test"),
            "postgres://postgres@127.0.0.1:5432/test"
        );
        assert_eq!(
            redact("postgres://u@db/test?sslmode=disable&password=hunter2"),
            "postgres://u@db/test?sslmode=disable&password=***"
        );
        assert_eq!(redact("postgres://u:hunter2@@"), "(unparsable URL)");
    }
}
