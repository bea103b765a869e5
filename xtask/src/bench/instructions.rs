//! What observing costs in instructions: the plain and the observed gateway (traces exported
//! to the sink, metrics on) each run under valgrind's callgrind, which counts the instructions
//! the gateway executes; with `--compare`, this tree's build and another's, both plain. A
//! count does not move with the machine's load, unlike time: the same build, calls and
//! settings give the same figure within a fraction of a percent, so a few percent of added
//! work shows, where throughput on a shared machine moves by tens of percent.
//! It counts user-space work only (system calls count as the instructions that make them).
//!
//! Each gateway starts under callgrind, is warmed up with calls of its own, then its counters
//! are zeroed, a fixed number of calls is made, and the counters are dumped
//! (`callgrind_control`). The dumps are kept (`callgrind-plain.out` and `callgrind-observed.out`,
//! or `callgrind-other-build.out` and `callgrind-this-build.out`) so that where the
//! instructions go can be read with `callgrind_annotate`.

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};

use crate::bench::load::{self, Transport};
use crate::bench::overhead::Pair;
use crate::bench::process::{self, Gateway};

/// Calls in flight while counting: few, so the gateway is never far behind under valgrind
/// (about 50 times slower) and no call's timeout comes near.
const IN_FLIGHT: usize = 8;

/// Instructions per call of the two gateways.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Instructions {
    pub(crate) calls: u64,
    /// The base gateway's (plain, or the other build's).
    pub(crate) base: f64,
    /// The measured gateway's (observed, or this build's).
    pub(crate) measured: f64,
    /// Their names.
    pub(crate) names: (&'static str, &'static str),
}

impl Instructions {
    /// Measured over base, minus one: the added work.
    pub(crate) fn added(&self) -> f64 {
        if self.base > 0.0 {
            self.measured / self.base - 1.0
        } else {
            0.0
        }
    }

    pub(crate) fn summary(&self) -> String {
        format!(
            "instructions per call (callgrind, {} calls each, {IN_FLIGHT} in flight): {} {:.0}, {} {:.0} ({:+.1}%)",
            self.calls,
            self.names.0,
            self.base,
            self.names.1,
            self.measured,
            self.added() * 100.0
        )
    }
}

/// What counting runs.
const TOOLS: [&str; 2] = ["valgrind", "callgrind_control"];

/// Whether valgrind's tools are installed.
pub(crate) fn available() -> bool {
    TOOLS.iter().all(|tool| installed(tool))
}

fn installed(tool: &str) -> bool {
    Command::new(tool)
        .arg("--version")
        .output()
        .is_ok_and(|out| out.status.success())
}

/// The file a gateway's profile is kept in: `callgrind-plain.out`, `callgrind-this-build.out`.
pub(crate) fn profile(name: &str) -> String {
    format!("callgrind-{}.out", name.replace(' ', "-"))
}

/// Counts `calls` calls on each gateway of `pair`; their profiles are copied into `keep`.
pub(crate) async fn measure(
    own_binary: &Path,
    pair: Pair<'_>,
    calls: u64,
    keep: &Path,
) -> anyhow::Result<Instructions> {
    for tool in TOOLS {
        if !installed(tool) {
            bail!("counting instructions needs `{tool}` (Debian's package valgrind)");
        }
    }
    std::fs::create_dir_all(keep).with_context(|| format!("cannot create {}", keep.display()))?;
    let names = pair.names();
    // The exporter's default schedule (batches of 512, or what waited 5 s), as a gateway runs
    // it: the counting waits out one schedule before zeroing and before dumping, so the
    // warm-up's spans are not counted and the counted calls' are.
    let sink = if pair.exports_traces() {
        Some(process::spawn_sink(own_binary)?)
    } else {
        None
    };
    let observed_env = sink.as_ref().map(process::observed_env);
    // Base first, then the measured gateway, each with its own profile.
    let mut counted = [0.0; 2];
    for ((binary, observed), (name, instructions)) in pair
        .gateways()
        .into_iter()
        .zip([names.0, names.1].into_iter().zip(&mut counted))
    {
        let env = match &observed_env {
            Some(env) if observed => &env[..],
            _ => &[],
        };
        *instructions = count(binary, observed, env, calls, &keep.join(profile(name))).await?;
    }
    let [base, measured] = counted;
    Ok(Instructions {
        calls,
        base,
        measured,
        names,
    })
}

async fn count(
    gateway_binary: &Path,
    metrics: bool,
    env: &[(&str, &str)],
    calls: u64,
    keep: &Path,
) -> anyhow::Result<f64> {
    let dir = tempfile::Builder::new()
        .prefix("toolgate-callgrind-")
        .tempdir()
        .context("cannot create a directory for callgrind's files")?;
    let out = dir.path().join("callgrind.out");
    let wrapper = dir.path().join("toolgate-under-callgrind");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nexec valgrind --tool=callgrind --callgrind-out-file={} {} \"$@\"\n",
            shell_quoted(&out),
            shell_quoted(gateway_binary)
        ),
    )
    .context("cannot write the callgrind wrapper")?;
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755))?;
    let gateway = Gateway::start(&wrapper, None, metrics, env)?;
    let target = gateway.prepare().await?;
    let transport = Transport::Grpc(target.clone(), load::connect(&target.url, 1).await?);
    let (failed, first) = load::fixed_calls(&transport, "warm", IN_FLIGHT, calls / 4).await?;
    if failed > 0 {
        bail!("{failed} warm-up calls failed, the first: {first:?}");
    }
    tokio::time::sleep(EXPORT_WAIT).await;
    control(gateway.pid(), "-z").await?;
    let (failed, first) = load::fixed_calls(&transport, "counted", IN_FLIGHT, calls).await?;
    if failed > 0 {
        bail!("{failed} counted calls failed, the first: {first:?}");
    }
    tokio::time::sleep(EXPORT_WAIT).await;
    control(gateway.pid(), "-d").await?;
    let total = read_dump(dir.path()).await?;
    std::fs::copy(dir.path().join(DUMP), keep)
        .with_context(|| format!("cannot keep the profile at {}", keep.display()))?;
    drop(gateway);
    Ok(total as f64 / calls as f64)
}

/// Longer than the observed gateway's export delay (`OTEL_BSP_SCHEDULE_DELAY`, 5 s by
/// default), under valgrind.
const EXPORT_WAIT: Duration = Duration::from_secs(7);

/// `path` in single quotes for `sh`, a quote inside written as `'\''`.
fn shell_quoted(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', "'\\''"))
}

/// `callgrind_control COMMAND PID`, off the runtime's threads and given 60 s.
async fn control(pid: u32, command: &'static str) -> anyhow::Result<()> {
    let run = tokio::task::spawn_blocking(move || {
        Command::new("callgrind_control")
            .args([command, &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .status()
    });
    let status = tokio::time::timeout(Duration::from_secs(60), run)
        .await
        .with_context(|| format!("callgrind_control {command} {pid} did not answer in 60 s"))?
        .context("callgrind_control panicked")?
        .context("cannot run callgrind_control")?;
    if !status.success() {
        bail!("callgrind_control {command} {pid} failed: {status}");
    }
    Ok(())
}

/// The file of callgrind's first dump.
const DUMP: &str = "callgrind.out.1";

/// The instruction total of the dump, once it is complete.
async fn read_dump(dir: &Path) -> anyhow::Result<u64> {
    let dump: PathBuf = dir.join(DUMP);
    for _ in 0..100 {
        if let Ok(text) = std::fs::read_to_string(&dump)
            && let Some(total) = text
                .lines()
                .find_map(|line| line.strip_prefix("totals:"))
                .and_then(|total| total.trim().parse::<u64>().ok())
        {
            return Ok(total);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("callgrind wrote no complete dump at {}", dump.display())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_quoted_for_the_shell() {
        assert_eq!(shell_quoted(Path::new("/tmp/a b")), "'/tmp/a b'");
        assert_eq!(shell_quoted(Path::new("/tmp/it's")), "'/tmp/it'\\''s'");
        let quoted = shell_quoted(Path::new("/tmp/it's $HOME"));
        let echoed = Command::new("sh")
            .args(["-c", &format!("printf %s {quoted}")])
            .output()
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&echoed.stdout), "/tmp/it's $HOME");
    }
}
