//! `cargo xtask ci`: the whole test suite, in the order a reviewer would want failures
//! reported (cheap checks first). It installs what it needs (the Python environment: the
//! contract tests' grpcio client, the AWS emulator moto and the Prometheus parser the metrics
//! test reads with, hatchling for the client package's wheel, and a fresh venv the wheel is
//! tested in) under `target/`, and the Debian packages of headless Chromium for the
//! console's browser test (apt-get, when missing), so a fresh clone
//! needs nothing but Rust and Python 3, and
//! PostgreSQL: a reachable server, or the server binaries to start one (see `pg.rs`); without
//! either it fails. The proto contract check (`contract.rs`) installs buf with npm under
//! `target/buf`, so it needs Node.js with npm, and a clone with the previous commit.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

use crate::contract;
use crate::pg;

/// Runs every check. `--no-lint` skips fmt and clippy (for quick local runs).
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let lint = !args.iter().any(|a| a == "--no-lint");
    let root = workspace_root()?;
    let mut totals = Totals::default();

    step("proto contract (buf lint, buf breaking against HEAD~1)");
    contract::check(&root, contract::DEFAULT_AGAINST)?;

    if lint {
        step("cargo fmt --check");
        cargo(&root, &["fmt", "--all", "--", "--check"])?;
        step("cargo clippy (default features)");
        cargo(
            &root,
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--locked",
                "--",
                "-D",
                "warnings",
            ],
        )?;
        step("cargo clippy (all features)");
        cargo(
            &root,
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--all-features",
                "--locked",
                "--",
                "-D",
                "warnings",
            ],
        )?;
    }

    // The end-to-end tests drive the real binary built with the test connectors. Building the
    // workspace with all features and all targets keeps one feature set for build and test
    // (dev-dependencies such as tokio's test-util and wiremock unify in both), so nothing is
    // compiled twice: the AWS SDK alone takes minutes.
    step("cargo build (all features, all targets)");
    cargo(
        &root,
        &[
            "build",
            "--workspace",
            "--all-features",
            "--all-targets",
            "--locked",
        ],
    )?;

    step("Python environment (grpcio client, moto, prometheus_client)");
    let venv = python_env(&root)?;
    let moto_server = venv.join("bin/moto_server");

    step("headless Chromium for the console's browser test");
    ensure_chromium()?;

    step("PostgreSQL for the tests");
    let postgres = pg::provide(&root)?;
    let postgres_summary = format!(
        "ci: PostgreSQL used: {} ({})",
        postgres.redacted_url(),
        postgres.origin
    );

    step("cargo test (all features)");
    let tested = cargo_test(&root, postgres.url_for_tests(), &moto_server, &venv);
    let tested = tested.and_then(|rust| {
        step("python contract tests (grpcio and MCP clients)");
        let python = python_tests(&root, &venv, postgres.url_for_tests())?;
        Ok((rust, python))
    });
    // Stops a server CI started, before anything else can fail.
    drop(postgres);
    let (rust, python) = tested?;
    totals.add(rust);
    totals.add(python);

    step("python client package (wheel, fresh venv, its tests)");
    totals.add(python_client_tests(&root, &venv)?);

    println!();
    println!("{postgres_summary}");
    println!("ci: {} passed, {} failed", totals.passed, totals.failed);
    if totals.failed > 0 {
        bail!("{} test(s) failed", totals.failed);
    }
    Ok(())
}

#[derive(Default, Debug)]
struct Totals {
    passed: u64,
    failed: u64,
}

impl Totals {
    fn add(&mut self, other: Totals) {
        self.passed += other.passed;
        self.failed += other.failed;
    }
}

fn step(name: &str) {
    println!("\n==> {name}");
}

fn workspace_root() -> anyhow::Result<PathBuf> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(Path::to_path_buf)
        .context("xtask lives one level below the workspace root")
}

fn cargo_bin() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned())
}

fn cargo(root: &Path, args: &[&str]) -> anyhow::Result<()> {
    let status = Command::new(cargo_bin())
        .args(args)
        .current_dir(root)
        .status()
        .with_context(|| format!("cannot run cargo {}", args.join(" ")))?;
    if !status.success() {
        bail!("cargo {} failed", args.join(" "));
    }
    Ok(())
}

/// The variable the AWS connector's tests read to find `moto_server`.
const MOTO_ENV: &str = "TOOLGATE_TEST_MOTO_SERVER";

/// The variable the end-to-end tests read to find the Python with the pinned packages (the
/// metrics test parses `/metrics` with `prometheus_client`).
const PYTHON_ENV: &str = "TOOLGATE_TEST_PYTHON";

/// Runs `cargo test`, echoing its output and adding up its `test result:` lines. `pg_url`
/// is given to the tests as `TOOLGATE_TEST_PG_URL` (`None`: they use their default), and
/// `moto_server` as `TOOLGATE_TEST_MOTO_SERVER`, the venv's Python as `TOOLGATE_TEST_PYTHON`.
fn cargo_test(
    root: &Path,
    pg_url: Option<&str>,
    moto_server: &Path,
    venv: &Path,
) -> anyhow::Result<Totals> {
    let mut command = Command::new(cargo_bin());
    command
        // Every package's tests run even after one fails, so one failure hides nothing.
        .args([
            "test",
            "--workspace",
            "--all-features",
            "--locked",
            "--no-fail-fast",
        ])
        .current_dir(root)
        .stdout(Stdio::piped());
    if let Some(url) = pg_url {
        command.env(pg::URL_ENV, url);
    }
    command.env(MOTO_ENV, moto_server);
    command.env(PYTHON_ENV, venv.join("bin/python"));
    // The AWS tests use static credentials; nothing may fall back to the instance metadata
    // service.
    command.env("AWS_EC2_METADATA_DISABLED", "true");
    let mut child = command.spawn().context("cannot run cargo test")?;
    let stdout = child.stdout.take().context("piped stdout")?;
    let mut totals = Totals::default();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        if let Some(rest) = line.strip_prefix("test result: ") {
            totals.passed += count_before(rest, " passed");
            totals.failed += count_before(rest, " failed");
        }
    }
    let status = child.wait()?;
    if !status.success() && totals.failed == 0 {
        bail!("cargo test failed before running every test (see above)");
    }
    Ok(totals)
}

/// The number right before `label` in a summary line such as `ok. 3 passed; 0 failed; ...`.
fn count_before(text: &str, label: &str) -> u64 {
    let Some(end) = text.find(label) else {
        return 0;
    };
    let digits: String = text[..end]
        .chars()
        .rev()
        .take_while(char::is_ascii_digit)
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().unwrap_or(0)
}

/// Creates (or reuses) `target/py/venv` with the pinned requirements: the contract tests'
/// grpcio client and pytest, moto for the AWS connector's tests, and prometheus_client for the
/// metrics test. Answers the venv.
fn python_env(root: &Path) -> anyhow::Result<PathBuf> {
    let python = which_python()?;
    let venv = root.join("target/py/venv");
    let venv_python = venv.join("bin/python");
    let requirements = root.join("tests/python/requirements.txt");
    let stamp = venv.join(".requirements");
    let wanted = std::fs::read_to_string(&requirements).context("tests/python/requirements.txt")?;
    let installed = std::fs::read_to_string(&stamp).unwrap_or_default();
    if !venv_python.exists() || installed != wanted {
        println!(
            "installing the Python test environment into {}",
            venv.display()
        );
        run_command(
            Command::new(&python)
                .args(["-m", "venv", "--clear"])
                .arg(&venv),
        )?;
        run_command(
            Command::new(&venv_python)
                .args([
                    "-m",
                    "pip",
                    "install",
                    "--quiet",
                    "--disable-pip-version-check",
                    "-r",
                ])
                .arg(&requirements),
        )?;
        std::fs::write(&stamp, &wanted)?;
    }
    if !venv.join("bin/moto_server").exists() {
        bail!(
            "{} has no moto_server although moto is in tests/python/requirements.txt; delete the venv and run again",
            venv.display()
        );
    }
    Ok(venv)
}

/// Generates stubs from `proto/` and runs the Python contract tests against the testkit
/// gateway binary, in the environment [`python_env`] made.
fn python_tests(root: &Path, venv: &Path, pg_url: Option<&str>) -> anyhow::Result<Totals> {
    let py_dir = root.join("target/py");
    let venv_python = venv.join("bin/python");
    let stubs = py_dir.join("stubs");
    std::fs::create_dir_all(&stubs)?;
    run_command(
        Command::new(&venv_python)
            .args(["-m", "grpc_tools.protoc", "-Iproto", "--python_out"])
            .arg(&stubs)
            .arg("--grpc_python_out")
            .arg(&stubs)
            .arg("proto/toolgate/v1/toolgate.proto")
            .current_dir(root),
    )?;
    let binary = root.join("target/debug/toolgate");
    let mut pytest = Command::new(&venv_python);
    pytest
        .args([
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "tests/python",
        ])
        .env("PYTHONPATH", &stubs)
        .env("TOOLGATE_BIN", &binary);
    // The replica tests' PostgreSQL (the gateways they start tolerate the variable).
    match pg_url {
        Some(url) => pytest.env(pg::URL_ENV, url),
        None => pytest.env_remove(pg::URL_ENV),
    };
    run_pytest(pytest.current_dir(root))
}

/// Builds the `toolgate-client` wheel from `clients/python` with the pinned environment's
/// hatchling (no build isolation: nothing is downloaded to build; the package's build hook
/// generates the stubs from `proto/` with its grpcio-tools), installs it into a fresh venv
/// with the package's test requirements (the package's dependencies constrained to the pins of
/// `tests/python/requirements.txt`), and runs `clients/python/tests` there against the testkit
/// gateway binary: the package is tested as a user installs it.
fn python_client_tests(root: &Path, venv: &Path) -> anyhow::Result<Totals> {
    let package = root.join("clients/python");
    let dist = root.join("target/py/dist");
    if dist.exists() {
        std::fs::remove_dir_all(&dist)
            .with_context(|| format!("cannot empty {}", dist.display()))?;
    }
    run_command(
        Command::new(venv.join("bin/python"))
            .args([
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--no-build-isolation",
                "--wheel-dir",
            ])
            .arg(&dist)
            .arg(&package),
    )?;
    let wheels: Vec<PathBuf> = std::fs::read_dir(&dist)?
        .map(|entry| entry.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    let [wheel] = wheels.as_slice() else {
        bail!("expected one wheel in {}, found {wheels:?}", dist.display());
    };

    let client_venv = root.join("target/py/client-venv");
    run_command(
        Command::new(which_python()?)
            .args(["-m", "venv", "--clear"])
            .arg(&client_venv),
    )?;
    let client_python = client_venv.join("bin/python");
    run_command(
        Command::new(&client_python)
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--disable-pip-version-check",
            ])
            .arg(wheel)
            .arg("-r")
            .arg(package.join("tests/requirements.txt"))
            .arg("-c")
            .arg(root.join("tests/python/requirements.txt")),
    )?;
    run_pytest(
        Command::new(&client_python)
            .args(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"])
            .env("TOOLGATE_BIN", root.join("target/debug/toolgate"))
            // The gateways pytest starts inherit this environment and refuse unknown
            // TOOLGATE_* variables; this one is the Rust tests'.
            .env_remove(pg::URL_ENV)
            .current_dir(&package),
    )
}

/// Runs a pytest command, echoing its output and adding up its summary line.
fn run_pytest(command: &mut Command) -> anyhow::Result<Totals> {
    let mut child = command
        .stdout(Stdio::piped())
        .spawn()
        .context("cannot run pytest")?;
    let stdout = child.stdout.take().context("piped stdout")?;
    let mut totals = Totals::default();
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        println!("{line}");
        let trimmed = line.trim_matches(|c| c == '=' || c == ' ');
        let summary = [" passed", " failed", " error"]
            .iter()
            .any(|w| trimmed.contains(w));
        if summary && trimmed.contains(" in ") {
            totals.passed += count_before(trimmed, " passed");
            totals.failed += count_before(trimmed, " failed") + count_before(trimmed, " error");
        }
    }
    let status = child.wait()?;
    if !status.success() && totals.failed == 0 {
        bail!("pytest failed (exit {status}) without reporting failed tests; see above");
    }
    if totals.passed == 0 && totals.failed == 0 {
        bail!("pytest ran no test");
    }
    Ok(totals)
}

/// The Debian packages the console's browser test drives (`tests/python/test_console.py`),
/// and the paths it finds them at.
const CHROMIUM_PACKAGES: &[&str] = &["chromium", "chromium-driver"];
const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Installs Chromium and its WebDriver with apt-get when either is missing (CI runs as root on
/// Debian); fails naming the packages when that is not possible.
fn ensure_chromium() -> anyhow::Result<()> {
    let present = || Path::new(CHROMIUM).exists() && Path::new(CHROMEDRIVER).exists();
    if present() {
        return Ok(());
    }
    let packages = CHROMIUM_PACKAGES.join(" ");
    let apt = |args: &[&str]| {
        Command::new("apt-get")
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|status| status.success())
    };
    let mut install = vec!["install", "-y", "--no-install-recommends"];
    install.extend_from_slice(CHROMIUM_PACKAGES);
    // The package lists may be missing on a fresh machine: update once and try again.
    if !(apt(&install) || (apt(&["update"]) && apt(&install))) || !present() {
        bail!(
            "the console's browser test needs the Debian packages {packages} ({CHROMIUM}, {CHROMEDRIVER}) and apt-get could not install them; install them (as root: `apt-get install {packages}`) and run again"
        );
    }
    Ok(())
}

fn which_python() -> anyhow::Result<PathBuf> {
    for candidate in ["python3", "python"] {
        let found = Command::new(candidate)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if found {
            return Ok(PathBuf::from(candidate));
        }
    }
    bail!(
        "the Python contract tests need Python 3 with venv: install python3 (e.g. `apt-get install python3 python3-venv`)"
    )
}

fn run_command(command: &mut Command) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("cannot run {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed with {status}");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::count_before;

    #[test]
    fn counts_are_read_from_summary_lines() {
        let cases = [
            ("ok. 14 passed; 0 failed; 0 ignored", " passed", 14),
            ("FAILED. 3 passed; 2 failed; 0 ignored", " failed", 2),
            ("5 passed in 2.31s", " passed", 5),
            ("1 failed, 4 passed in 2s", " failed", 1),
            ("no tests ran", " passed", 0),
        ];
        for (text, label, expected) in cases {
            assert_eq!(count_before(text, label), expected, "{text}");
        }
    }
}
