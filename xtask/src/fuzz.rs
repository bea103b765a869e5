//! `cargo xtask fuzz [--seconds N] [TARGET...]`: runs each cargo-fuzz target (`fuzz/`, its own
//! workspace) for a bounded time, every target unless some are named.
//!
//! The machine has a stable toolchain only; cargo-fuzz's instrumentation flags are nightly
//! ones, so the run sets `RUSTC_BOOTSTRAP=1` (the fuzz build is separate from the main build,
//! which never sees it). cargo-fuzz is installed from crates.io under `target/tools` when it is
//! not there yet. Each target reads its seed corpus (`fuzz/corpus/<target>/`, kept in the
//! repository) and writes what it discovers to `target/fuzz/corpus/<target>/`, so the
//! repository's corpus only grows by hand; a finding is saved under
//! `target/fuzz/artifacts/<target>/` and fails the command, naming the file.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

/// The targets, as `fuzz/Cargo.toml` names them.
const TARGETS: &[&str] = &["redact", "address", "retry_hints", "policy", "arguments"];

/// The cargo-fuzz release known to work here.
const CARGO_FUZZ_VERSION: &str = "0.13.2";

const USAGE: &str = "usage: cargo xtask fuzz [--seconds N] [TARGET...]\n  targets: redact, address, retry_hints, policy, arguments (default: all)\n  --seconds N  how long each target runs (default 60)";

/// Runs the fuzz targets.
pub(crate) fn run(args: &[String]) -> anyhow::Result<()> {
    let mut seconds: u64 = 60;
    let mut chosen: Vec<&str> = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        match arg.as_str() {
            "--seconds" => {
                let text = rest
                    .next()
                    .with_context(|| format!("--seconds needs a number\n{USAGE}"))?;
                seconds = match text.parse::<u64>() {
                    Ok(n) if n > 0 => n,
                    _ => bail!("--seconds must be a whole number above 0, got `{text}`"),
                };
            }
            name => match TARGETS.iter().find(|t| **t == name) {
                Some(target) => chosen.push(target),
                None => bail!("unknown fuzz target or option `{name}`\n{USAGE}"),
            },
        }
    }
    if chosen.is_empty() {
        chosen = TARGETS.to_vec();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .context("xtask lives one level below the workspace root")?
        .to_path_buf();
    let tools = root.join("target").join("tools");
    ensure_cargo_fuzz(&root, &tools)?;
    let path = match std::env::var_os("PATH") {
        Some(existing) => {
            let mut paths = vec![tools.join("bin")];
            paths.extend(std::env::split_paths(&existing));
            std::env::join_paths(paths).context("cannot build PATH")?
        }
        None => tools.join("bin").into_os_string(),
    };
    for target in &chosen {
        let found = root.join("target").join("fuzz").join("corpus").join(target);
        let artifacts = root
            .join("target")
            .join("fuzz")
            .join("artifacts")
            .join(target);
        for dir in [&found, &artifacts] {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
        let seeds = root.join("fuzz").join("corpus").join(target);
        println!("==> fuzz {target} for {seconds} s");
        let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
            .env("PATH", &path)
            .env("RUSTC_BOOTSTRAP", "1")
            .current_dir(root.join("fuzz"))
            .args(["fuzz", "run", "-O", target])
            .arg(&found)
            .arg(&seeds)
            .arg("--")
            .arg(format!("-max_total_time={seconds}"))
            .arg("-timeout=10")
            .arg("-rss_limit_mb=4096")
            .arg(format!("-artifact_prefix={}/", artifacts.display()))
            .status()
            .context("cannot run cargo fuzz")?;
        if !status.success() {
            bail!(
                "fuzz target `{target}` found a failure ({status}); the input is in {}",
                artifacts.display()
            );
        }
    }
    println!("fuzzed {} target(s), {seconds} s each", chosen.len());
    Ok(())
}

/// Installs cargo-fuzz under `tools` unless it is there.
fn ensure_cargo_fuzz(root: &Path, tools: &Path) -> anyhow::Result<()> {
    let binary: PathBuf = tools.join("bin").join("cargo-fuzz");
    if binary.exists() {
        return Ok(());
    }
    println!(
        "==> cargo install cargo-fuzz {CARGO_FUZZ_VERSION} (under {})",
        tools.display()
    );
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned()))
        .current_dir(root)
        .args([
            "install",
            "cargo-fuzz",
            "--locked",
            "--version",
            CARGO_FUZZ_VERSION,
            "--root",
        ])
        .arg(tools)
        .status()
        .context("cannot run cargo install")?;
    if !status.success() {
        bail!("cannot install cargo-fuzz ({status})");
    }
    Ok(())
}
